-- `audit verify` as an auditor also replays each operation's chain into the columns every step sets
-- beside the state (when it changed, finished, escalated and why, the job id not chosen, the
-- deadlines) and compares them with the row. Never edit this file once landed: add a new migration
-- instead.
GRANT SELECT (state_changed_at, finished_at, escalated_at, escalation_reason,
              conflicting_remote_job_id, create_deadline, result_deadline, cancel_deadline)
    ON operations TO jobtrail_auditor;
