-- no-transaction
-- Every job a worker records for an operation (a create's answer, a lookup's find) is now checked
-- against every other operation of the provider that holds it, as its job or as the other answer
-- of a contract violation: one remote job is never two live operations'. The check runs once per
-- job named, so both columns need an index (a scan per create would grow with the table). Hash,
-- as for remote_job_id (migration 0016): an id may be as long as a URL. Rarely written, so the step
-- updates that never touch it stay HOT.
--
-- Built CONCURRENTLY, outside a transaction (the first line tells the migrator), as migration 0024
-- is: writes go on while it is built. It is the file's only statement. If a build is interrupted,
-- PostgreSQL leaves the index INVALID and this migration unrecorded: drop it
-- (`DROP INDEX CONCURRENTLY operations_conflicting_remote_job;`) and run `jobtrail migrate` again.
-- Never edit this file once landed: add a new migration instead.
CREATE INDEX CONCURRENTLY operations_conflicting_remote_job ON operations
    USING hash (conflicting_remote_job_id) WHERE conflicting_remote_job_id IS NOT NULL;
