-- Begins a worker's fenced write (a step, or a group commit of steps): as begin_key_lookups.sql
-- (key lookups only, no JIT), with a short lock wait. jobtrail's own writers hold a row for
-- milliseconds; a row held longer (a psql left in BEGIN, a stalled session) fails this write after
-- 1 s as unavailable, and the worker tries the step again within its lease, instead of holding its
-- writer lane (and every step queued behind it) for the 10 s other writes wait. Sent as one simple
-- query with the BEGIN (one round trip); it takes no parameters.
BEGIN;
SET LOCAL enable_seqscan = off;
SET LOCAL jit = off;
SET LOCAL lock_timeout = '1s'
