-- One operation by id.
-- Columns by name, never `*`: a column a later migration adds must not change what this
-- statement returns, or a running pod's prepared copy of it fails ("cached plan must not change
-- result type") until its connection is replaced.
SELECT
    id, provider, target, request_body, request_fingerprint, idempotency_token, idempotency_mode,
    at_most_once, caller, approved_by, approval_ref, trace_id, parent_span_id, parent_sampled,
    created_at, create_deadline, result_deadline, cancel_window_ms, cancel_deadline, state,
    state_changed_at, finished_at, escalated_at, escalation_reason, remote_job_id,
    conflicting_remote_job_id, remote_state, remote_updated_at, remote_progress, observed_at,
    status_url, provider_context, next_action_at, next_action_reason, create_attempts,
    create_sent_epoch, poll_count, poll_not_before, failure_count, cancel_attempts,
    result_attempts, reconcile_attempts, lease_owner, lease_expires_at, lease_epoch, takeovers,
    cancel_requested_at, cancel_requested_by, cancel_reason, result_location, result_size,
    result_sha256, result_content_type, result_summary, supersedes, superseded_by, edited_by,
    history_seq, history_head, calls_seq, calls_head
FROM operations
WHERE id = $1
