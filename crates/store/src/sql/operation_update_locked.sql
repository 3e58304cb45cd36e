-- Write every mutable column of a row that this transaction holds locked (see operation_lock*.sql).
-- The epoch is repeated so a write can never land on a row that was re-claimed.
UPDATE operations SET
    state = $3, state_changed_at = $4, finished_at = $5, escalated_at = $6, escalation_reason = $7,
    remote_job_id = $8, conflicting_remote_job_id = $9, remote_state = $10, remote_updated_at = $11,
    remote_progress = $12, observed_at = $13, status_url = $14, provider_context = $15,
    next_action_at = $16, next_action_reason = $17,
    create_attempts = $18, poll_count = $19, failure_count = $20, cancel_attempts = $21,
    result_attempts = $22,
    lease_owner = $23, lease_expires_at = $24,
    cancel_requested_at = $25, cancel_requested_by = $26, cancel_reason = $27, cancel_deadline = $28,
    result_location = $29, result_size = $30, result_sha256 = $31, result_content_type = $32,
    result_summary = $33, superseded_by = $34, result_deadline = $35, create_deadline = $36,
    history_seq = $37, history_head = $38,
    create_sent_epoch = $39, poll_not_before = $40, reconcile_attempts = $41,
    calls_seq = $42, calls_head = $43, takeovers = $44
WHERE id = $1 AND lease_epoch = $2
RETURNING id
