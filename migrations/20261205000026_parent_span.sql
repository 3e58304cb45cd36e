-- The caller's span (from its W3C `traceparent`), which an operation's root span is recorded under
-- so that a tracing backend shows the operation inside the agent's own trace tree. Trace metadata,
-- not evidence: no decision reads it and it is outside the record's hashes. No role but the owner
-- may update it (no column grant), like every column the submission writes once.
--
-- The check is added NOT VALID: every existing row holds NULL, which passes it, and a validating
-- scan would hold every write to `operations` for the length of a large table. New and updated
-- rows are checked as ever. Both statements need the table's exclusive lock for a moment: waiting
-- for it behind a long reader (a whole-database `audit verify`) would queue every step and submit
-- behind the wait, so the migration gives up after 5 s instead (nothing applied; run it again).
-- Never edit this file once landed: add a new migration instead.
SET LOCAL lock_timeout = '5s';

ALTER TABLE operations ADD COLUMN parent_span_id text;

ALTER TABLE operations ADD CONSTRAINT operations_parent_span_id_shape
    CHECK (parent_span_id ~ '^[0-9a-f]{16}$' AND parent_span_id <> repeat('0', 16)) NOT VALID;
