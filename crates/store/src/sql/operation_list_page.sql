-- One page of operations, newest id first (ids are time-ordered), keyset-paginated by id so a page
-- costs the same however deep it is. Every filter is optional (NULL: any). A page reads at most $8
-- of the caller's operations below the cursor (by the (caller, id) index; the primary key for
-- every caller's) and keeps those the other filters match: a filter that matches few or none
-- gives a short or empty page, never a walk through the whole table (see
-- operation_list_scan_end.sql for where the next page starts). Run in begin_listing.sql's
-- transaction (custom plans: the NULL filters drop out).
-- Every column but the request body (null here): a listing never shows it, and 200 bodies of up to
-- 16 MiB each, parsed, would let one caller's listing take gigabytes of the server's memory.
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
FROM (
    SELECT *
    FROM operations
    WHERE ($4::text IS NULL OR caller = $4)
      AND ($1::uuid IS NULL OR id < $1)
    ORDER BY id DESC
    LIMIT $8
) AS scanned
WHERE ($2::text IS NULL OR state = $2)
  AND ($3::text IS NULL OR provider = $3)
  AND ($5::timestamptz IS NULL OR created_at >= $5)
  AND ($6::timestamptz IS NULL OR created_at < $6)
ORDER BY id DESC
LIMIT $7
