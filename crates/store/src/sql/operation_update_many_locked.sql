-- Write every mutable column of many rows this transaction holds locked (one group-committed batch).
-- Same columns as operation_update_locked.sql; each row's epoch is repeated.
UPDATE operations o SET
    state = u.state, state_changed_at = u.state_changed_at, finished_at = u.finished_at,
    escalated_at = u.escalated_at, escalation_reason = u.escalation_reason,
    remote_job_id = u.remote_job_id, conflicting_remote_job_id = u.conflicting_remote_job_id,
    remote_state = u.remote_state, remote_updated_at = u.remote_updated_at,
    remote_progress = u.remote_progress, observed_at = u.observed_at, status_url = u.status_url,
    provider_context = u.provider_context, next_action_at = u.next_action_at,
    next_action_reason = u.next_action_reason, create_attempts = u.create_attempts,
    poll_count = u.poll_count, failure_count = u.failure_count, cancel_attempts = u.cancel_attempts,
    result_attempts = u.result_attempts, lease_owner = u.lease_owner,
    lease_expires_at = u.lease_expires_at, cancel_requested_at = u.cancel_requested_at,
    cancel_requested_by = u.cancel_requested_by, cancel_reason = u.cancel_reason,
    cancel_deadline = u.cancel_deadline, result_location = u.result_location,
    result_size = u.result_size, result_sha256 = u.result_sha256,
    result_content_type = u.result_content_type, result_summary = u.result_summary,
    superseded_by = u.superseded_by, result_deadline = u.result_deadline,
    create_deadline = u.create_deadline, history_seq = u.history_seq, history_head = u.history_head,
    create_sent_epoch = u.create_sent_epoch, poll_not_before = u.poll_not_before,
    reconcile_attempts = u.reconcile_attempts, calls_seq = u.calls_seq, calls_head = u.calls_head,
    takeovers = u.takeovers
FROM UNNEST(
    $1::uuid[], $2::bigint[], $3::text[], $4::timestamptz[], $5::timestamptz[], $6::timestamptz[],
    $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::jsonb[], $13::timestamptz[],
    $14::text[], $15::jsonb[], $16::timestamptz[], $17::text[], $18::int[], $19::int[], $20::int[],
    $21::int[], $22::int[], $23::text[], $24::timestamptz[], $25::timestamptz[], $26::text[],
    $27::text[], $28::timestamptz[], $29::text[], $30::bigint[], $31::text[], $32::text[],
    $33::jsonb[], $34::uuid[], $35::timestamptz[], $36::timestamptz[], $37::bigint[], $38::bytea[],
    $39::bigint[], $40::timestamptz[], $41::int[], $42::bigint[], $43::bytea[], $44::int[]
) AS u (
    id, epoch, state, state_changed_at, finished_at, escalated_at, escalation_reason, remote_job_id,
    conflicting_remote_job_id, remote_state, remote_updated_at, remote_progress, observed_at,
    status_url, provider_context, next_action_at, next_action_reason, create_attempts, poll_count,
    failure_count, cancel_attempts, result_attempts, lease_owner, lease_expires_at,
    cancel_requested_at, cancel_requested_by, cancel_reason, cancel_deadline, result_location,
    result_size, result_sha256, result_content_type, result_summary, superseded_by, result_deadline,
    create_deadline, history_seq, history_head, create_sent_epoch, poll_not_before,
    reconcile_attempts, calls_seq, calls_head, takeovers
)
WHERE o.id = u.id AND o.lease_epoch = u.epoch
