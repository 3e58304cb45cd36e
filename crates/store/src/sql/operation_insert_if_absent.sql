-- Write a new intent. ON CONFLICT leaves an existing operation untouched: the caller then compares
-- fingerprints (same: idempotent success; different: refused).
INSERT INTO operations (
    id, provider, target, request_body, request_fingerprint, idempotency_token, idempotency_mode,
    at_most_once, caller, approved_by, approval_ref, trace_id, created_at, create_deadline,
    result_deadline, cancel_window_ms, state, state_changed_at, next_action_at, next_action_reason,
    supersedes, history_seq, history_head, parent_span_id, edited_by, parent_sampled
) VALUES (
    $1, $2, $3, $4, $5, $6, $7,
    $8, $9, $10, $11, $12, $13, $14,
    $15, $16, 'create_pending', $13, $13, 'submitted',
    $17, 1, $18, $19, $20, $21
)
ON CONFLICT (id) DO NOTHING
RETURNING id
