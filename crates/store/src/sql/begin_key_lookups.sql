-- Begins a transaction that writes evidence. Every row it reads, it reads by key: the fenced writes,
-- the evidence inserts and the foreign-key checks those inserts fire. Sequential scans are ruled out
-- for its statements, so that no plan made here (including the checks' plans, which each session
-- caches for its life) reads a table sequentially because the table was empty, or analysed empty,
-- when the plan was made. A planner setting rather than replanning every statement
-- (plan_cache_mode = force_custom_plan cost a quarter of the database's time per step): cached plans
-- stay cheap and stay index lookups. JIT is off: a ruled-out plan's notional cost must never make a
-- statement compile itself. SET LOCAL: this transaction only. Sent as one simple query with the
-- BEGIN (one round trip); it takes no parameters.
-- Its lock waits are bounded: a row held by a session that stopped mid-transaction (a psql left
-- in BEGIN, a stalled process) fails this write after 10 s, as unavailable, instead of holding it
-- (a whole group commit, a person's decision) for ever; every write here holds its locks for
-- milliseconds.
BEGIN;
SET LOCAL enable_seqscan = off;
SET LOCAL jit = off;
SET LOCAL lock_timeout = '10s'
