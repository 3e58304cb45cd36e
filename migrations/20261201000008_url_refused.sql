-- A held state for a provider that points outside its contract: `url_refused`. The provider named a
-- URL (to poll, or to fetch the result from) at an origin the contract does not declare; nothing was
-- sent there, and a person decides (declare the origin and resume, cancel, or abandon).
-- Never edit this file once landed: add a new migration instead.

ALTER TABLE operations DROP CONSTRAINT operations_state_check;
ALTER TABLE operations ADD CONSTRAINT operations_state_check CHECK (state IN (
    'create_pending', 'create_unknown', 'reconciliation', 'create_unresolved',
    'accepted', 'observing', 'result_collecting', 'cancel_requested',
    'cancelling', 'contract_violation', 'cancellation_unconfirmed',
    'result_timed_out', 'url_refused', 'succeeded', 'failed', 'cancelled',
    'result_unavailable', 'result_validation_failed', 'withdrawn',
    'not_created', 'abandoned'));

ALTER TABLE operations DROP CONSTRAINT escalated_iff_held;
ALTER TABLE operations ADD CONSTRAINT escalated_iff_held CHECK (
    (state IN ('create_unresolved', 'contract_violation', 'cancellation_unconfirmed', 'result_timed_out',
               'url_refused'))
    = (escalated_at IS NOT NULL AND escalation_reason IS NOT NULL));

ALTER TABLE operations DROP CONSTRAINT remote_job_known;
ALTER TABLE operations ADD CONSTRAINT remote_job_known CHECK (
    state NOT IN ('accepted', 'observing', 'cancel_requested', 'cancelling', 'cancellation_unconfirmed',
                  'cancelled', 'result_timed_out', 'url_refused')
    OR remote_job_id IS NOT NULL);
