-- Begins a transaction that reads the schedule in due order (a claim, or the next-due read): the
-- first rows of each provider's due index, never the whole schedule sorted. Statistics are not
-- trusted to choose that: after a burst of submissions into a queue whose statistics describe it
-- drained, the planner takes the schedule for a handful of rows and would read and sort all of it
-- (and fetch every due operation) for every claim of ten, until autovacuum analyses it again;
-- pgbench at 10 000 due rows: 30 claims/s against 795 once analysed. With sorts and sequential
-- scans ruled out the only plan left is the ordered index scan the claim is written for. JIT off as
-- in begin_key_lookups.sql; the claim's own writes (the fenced update, the schedule trigger it
-- fires) are key lookups too. SET LOCAL: this transaction only; one round trip with the BEGIN.
BEGIN;
SET LOCAL enable_sort = off;
SET LOCAL enable_seqscan = off;
SET LOCAL jit = off
