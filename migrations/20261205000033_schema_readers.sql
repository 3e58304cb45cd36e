-- The oldest binary that may still run against this database, by the newest migration it carries.
-- A release that migrates the database ahead of the binaries already running (a rolling upgrade:
-- the migration Job runs before the new pods) leaves old pods that restart in the meantime (a
-- crash, an eviction, a scale-up of the old ReplicaSet) unable to start, though an additive
-- migration (a new table, an index, a column with a default, a view) changes nothing they do. A
-- binary whose newest migration is at least `oldest_reader` starts against a database ahead of it
-- (with a warning); an older one is refused, as before.
--
-- A later migration that an older binary's statements would break (a column dropped or renamed, a
-- NOT NULL column without a default, a changed constraint, a state the old engine does not know)
-- must end with: UPDATE jobtrail_schema_readers SET oldest_reader = <its own version>;
-- An additive one leaves it. Never edit this file once landed.
CREATE TABLE jobtrail_schema_readers (
    one           boolean PRIMARY KEY DEFAULT true CHECK (one),
    oldest_reader bigint NOT NULL
);
INSERT INTO jobtrail_schema_readers (oldest_reader) VALUES (20261205000033);

GRANT SELECT ON jobtrail_schema_readers
    TO jobtrail_worker, jobtrail_operator, jobtrail_api, jobtrail_auditor;
