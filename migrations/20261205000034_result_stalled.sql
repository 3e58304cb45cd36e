-- Lost holders are counted, and a result whose collection keeps losing them is held for a person:
-- `result_stalled`. A worker killed while collecting a result (by the memory limit, checking a
-- result that takes many times its size once parsed) records nothing, so nothing counted it as an
-- attempt: the next worker to claim the operation died the same way, and the next, for ever (a
-- collecting operation has no deadline).
--
-- `takeovers`: claims in a row that found the previous holder's lease run out, with no step written
-- since. The claim adds one when it takes over a lease; every step written sets it back to 0.
-- A constant default: no table rewrite.
ALTER TABLE operations ADD COLUMN takeovers integer NOT NULL DEFAULT 0;
GRANT UPDATE (takeovers) ON operations TO jobtrail_worker, jobtrail_operator, jobtrail_api;

-- The new held state. Both constraints are looser than the ones they replace for every row there is
-- (no row is in the new state yet), so they are added NOT VALID: validating would read the whole
-- table under this migration's exclusive lock, stopping every claim and step meanwhile. PostgreSQL
-- enforces a NOT VALID check on every row written from now on.
ALTER TABLE operations DROP CONSTRAINT operations_state_check;
ALTER TABLE operations ADD CONSTRAINT operations_state_check CHECK (state IN (
    'create_pending', 'create_unknown', 'reconciliation', 'create_unresolved',
    'accepted', 'observing', 'result_collecting', 'cancel_requested',
    'cancelling', 'contract_violation', 'cancellation_unconfirmed',
    'result_timed_out', 'url_refused', 'result_stalled', 'succeeded', 'failed', 'cancelled',
    'result_unavailable', 'result_validation_failed', 'withdrawn',
    'not_created', 'abandoned')) NOT VALID;

ALTER TABLE operations DROP CONSTRAINT escalated_iff_held;
ALTER TABLE operations ADD CONSTRAINT escalated_iff_held CHECK (
    (state IN ('create_unresolved', 'contract_violation', 'cancellation_unconfirmed', 'result_timed_out',
               'url_refused', 'result_stalled'))
    = (escalated_at IS NOT NULL AND escalation_reason IS NOT NULL)) NOT VALID;

-- A binary from before this migration does not know the state: it cannot read such an operation.
-- Never edit this file once landed: add a new migration instead.
UPDATE jobtrail_schema_readers SET oldest_reader = 20261205000034;
