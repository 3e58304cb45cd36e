-- Lock many rows for one group-committed batch of fenced writes: each row only if (id, owner, epoch)
-- still match and the lease has not expired. Rows that are missing are LeaseLost. Locks are taken in
-- id order, so concurrent batches cannot deadlock.
-- Columns by name, never `*`: a column a later migration adds must not change what this
-- statement returns, or a running pod's prepared copy of it fails ("cached plan must not change
-- result type") until its connection is replaced.
SELECT
    now() AS db_now,
    o.id, o.provider, o.target, o.request_body, o.request_fingerprint, o.idempotency_token,
    o.idempotency_mode, o.at_most_once, o.caller, o.approved_by, o.approval_ref, o.trace_id,
    o.parent_span_id, o.parent_sampled, o.created_at, o.create_deadline, o.result_deadline,
    o.cancel_window_ms, o.cancel_deadline, o.state, o.state_changed_at, o.finished_at,
    o.escalated_at, o.escalation_reason, o.remote_job_id, o.conflicting_remote_job_id,
    o.remote_state, o.remote_updated_at, o.remote_progress, o.observed_at, o.status_url,
    o.provider_context, o.next_action_at, o.next_action_reason, o.create_attempts,
    o.create_sent_epoch, o.poll_count, o.poll_not_before, o.failure_count, o.cancel_attempts,
    o.result_attempts, o.reconcile_attempts, o.lease_owner, o.lease_expires_at, o.lease_epoch,
    o.takeovers, o.cancel_requested_at, o.cancel_requested_by, o.cancel_reason, o.result_location,
    o.result_size, o.result_sha256, o.result_content_type, o.result_summary, o.supersedes,
    o.superseded_by, o.edited_by, o.history_seq, o.history_head, o.calls_seq, o.calls_head
FROM operations o
JOIN UNNEST($1::uuid[], $2::text[], $3::bigint[]) AS l (id, owner, epoch)
  ON o.id = l.id AND o.lease_owner = l.owner AND o.lease_epoch = l.epoch
WHERE o.lease_expires_at > now()
ORDER BY o.id
FOR UPDATE OF o
