-- Who wrote each history link, as the database knows it: the login of the session that inserted it
-- (`session_user`, which `SET ROLE` does not change). The link's `actor` is what the writer says
-- (a person's name on a decision, a worker's id); the login is what the database saw, so a link
-- whose actor is "alice" recorded by a worker's login, or an approval recorded through the API's
-- login, shows as such. A writer role cannot name it: it may insert every other column, and this
-- one takes its default. Links written before this migration have none (NULL). Not part of the
-- hash: the chain proves a link was not changed afterwards, this says who wrote it (and writer
-- roles cannot UPDATE history at all).
--
-- A later migration adding a column to operation_history must grant INSERT on it to the three
-- writer roles, as below.
ALTER TABLE operation_history ADD COLUMN recorded_by text;
ALTER TABLE operation_history ALTER COLUMN recorded_by SET DEFAULT session_user;

REVOKE INSERT ON operation_history FROM jobtrail_worker, jobtrail_operator, jobtrail_api;
GRANT INSERT (operation_id, seq, at, actor, from_state, to_state, event, cause, remote_job_id,
              call_id, detail, prev_hash, hash)
    ON operation_history TO jobtrail_worker, jobtrail_operator, jobtrail_api;

-- Auditors read history through their views: the login is shown there too (appended, so every
-- column before it is unchanged).
CREATE OR REPLACE VIEW audit_history AS
SELECT jobtrail_public_id(h.operation_id) AS operation_id, h.seq, h.at, h.actor, h.from_state,
       h.to_state, h.event, h.cause, h.remote_job_id, h.call_id, h.detail,
       encode(h.prev_hash, 'hex') AS prev_hash, encode(h.hash, 'hex') AS hash, h.recorded_by
FROM operation_history h;

CREATE OR REPLACE VIEW audit_decisions AS
SELECT operation_id, seq, at, actor, from_state, to_state, event,
       coalesce(detail -> 'decision' ->> 'reason', detail ->> 'reason') AS reason, cause, recorded_by
FROM audit_history
WHERE event IN ('adopt_remote_job', 'declare_not_created', 'confirm_cancellation', 'choose_remote_job',
                'resume', 'abandon', 'superseded', 'cancel_requested', 'withdraw');
