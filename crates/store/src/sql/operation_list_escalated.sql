-- The escalation queue, oldest first, optionally filtered by state, provider and caller, at most $3
-- rows. Without request bodies (null here), as a listing page: an agent can fill the queue
-- (deadlines too short for its jobs), and a person reads one operation at a time (and one caller's
-- at a time, $4, when one agent's fill the queue).
SELECT
    id, provider, target, 'null'::jsonb AS request_body, request_fingerprint, idempotency_token,
    idempotency_mode, at_most_once, caller, approved_by, approval_ref, trace_id, parent_span_id, parent_sampled, created_at,
    create_deadline, result_deadline, cancel_window_ms, cancel_deadline, state, state_changed_at,
    finished_at, escalated_at, escalation_reason, remote_job_id, conflicting_remote_job_id,
    remote_state, remote_updated_at, remote_progress, observed_at, status_url, provider_context,
    next_action_at, next_action_reason, create_attempts, create_sent_epoch, poll_count,
    poll_not_before, failure_count, cancel_attempts, result_attempts, reconcile_attempts,
    lease_owner, lease_expires_at, lease_epoch, takeovers, cancel_requested_at, cancel_requested_by,
    cancel_reason, result_location, result_size, result_sha256, result_content_type,
    result_summary, supersedes, superseded_by, edited_by, history_seq, history_head, calls_seq,
    calls_head
FROM operations
WHERE escalated_at IS NOT NULL
  AND ($1::text IS NULL OR state = $1)
  AND ($2::text IS NULL OR provider = $2)
  AND ($4::text IS NULL OR caller = $4)
ORDER BY escalated_at, id
LIMIT $3
