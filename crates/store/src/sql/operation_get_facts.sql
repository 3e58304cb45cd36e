-- One operation's chain heads and the facts its chain commits to (what `audit verify` compares;
-- an auditor may read these columns and no others).
SELECT id, provider, target, request_fingerprint, caller, approved_by, approval_ref, edited_by, trace_id,
       idempotency_mode, at_most_once, created_at, supersedes, superseded_by, state, remote_job_id,
       result_location, result_size, result_sha256, result_summary, result_content_type,
       cancel_requested_at, cancel_requested_by,
       cancel_reason, state_changed_at, finished_at, escalated_at, escalation_reason,
       conflicting_remote_job_id, create_deadline, result_deadline, cancel_deadline, history_seq,
       history_head, calls_seq, calls_head
FROM operations WHERE id = $1
