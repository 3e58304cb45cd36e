-- Begins a listing: a page of operations, then (for a page that came back short) where its scan
-- ended, read from one snapshot. Planned for the values given (a custom plan each time, not the
-- generic one a prepared statement falls back to): the filters left NULL then drop out of the plan,
-- and a caller's listing reads the (caller, id) index where a generic plan of `$4 IS NULL OR
-- caller = $4` could not. A listing is a person's or an agent's request, not the hot path: the
-- planning is cheap beside it. A page reads its index in order and stops: sequential scans and
-- sorts are ruled out, since for a caller that holds most rows the planner would otherwise read
-- and sort the whole table to take the first few. Sent as one simple query with the BEGIN; it
-- takes no parameters.
BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY;
SET LOCAL plan_cache_mode = force_custom_plan;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_sort = off;
SET LOCAL jit = off
