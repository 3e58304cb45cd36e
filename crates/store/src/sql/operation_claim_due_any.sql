-- Claim due, automated operations of any provider (tests and tools; the worker claims per provider,
-- operation_claim_shares.sql, whose index this query cannot use in order: fine for small queues): lock a
-- batch with SKIP LOCKED (the LIMIT inside the CTE, so concurrent claimers take disjoint rows), then
-- set owner, expiry and a new fencing epoch. The claim also moves next_action_at to the lease expiry:
-- the row leaves the head of the due index at once, and if the owner dies the row comes due again
-- exactly when its lease expires.
--
-- A claimed create_pending row is marked "a create may leave under this epoch" in this same commit,
-- before the worker sends anything (create_sent_epoch; see migration 0005). A mark left by an earlier
-- epoch is kept: that send's outcome was never recorded, and the new owner must treat it as unknown.
-- Returns the database clock, from which the worker carries its one decision clock, and for the
-- metrics: when each row was due (claim lag) and whether it still named another owner (a takeover:
-- that owner's lease ran out; a released lease names none). A takeover of a collecting operation is
-- counted in `takeovers` (migration 0034): a holder lost checking a result may have been killed by
-- it; a step that records something clears the count (write.rs).
-- Columns by name, never `*`: a column a later migration adds must not change what this
-- statement returns, or a running pod's prepared copy of it fails ("cached plan must not change
-- result type") until its connection is replaced.
WITH due AS (
    SELECT o.id, o.next_action_at AS was_due, o.lease_owner IS NOT NULL AS taken_over
    FROM operation_schedule q
    JOIN operations o ON o.id = q.operation_id
    WHERE q.next_action_at <= now()
      AND o.next_action_at <= now()
      AND o.state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                      'result_collecting', 'cancel_requested', 'cancelling')
      AND (o.lease_expires_at IS NULL OR o.lease_expires_at <= now())
    ORDER BY q.next_action_at
    LIMIT $2
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE operations o
SET lease_owner       = $1,
    lease_expires_at  = now() + make_interval(secs => $3),
    lease_epoch       = o.lease_epoch + 1,
    next_action_at    = now() + make_interval(secs => $3),
    create_sent_epoch = CASE WHEN o.state = 'create_pending'
                             THEN coalesce(o.create_sent_epoch, o.lease_epoch + 1) END,
    takeovers         = o.takeovers + (due.taken_over AND o.state = 'result_collecting')::int
FROM due
WHERE o.id = due.id
RETURNING
    now() AS db_now, due.was_due, due.taken_over,
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
