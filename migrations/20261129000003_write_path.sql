-- The write path: every step updates an operation row and (almost always) its next_action_at, so no
-- update is HOT and each one inserts an entry into every index of the table. Keep only the indexes a
-- query uses:
--  * operations_state served no query (counts by state scan the table; the due index serves the
--    unsettled count and the claim);
--  * operations_remote_job served no query yet (webhook routing, when it comes, brings its own).
DROP INDEX operations_state;
DROP INDEX operations_remote_job;
