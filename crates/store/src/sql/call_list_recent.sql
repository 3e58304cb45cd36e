-- An operation's most recent provider calls, newest first.
-- Columns by name, never `*`: a column a later migration adds must not change what this
-- statement returns, or a running pod's prepared copy of it fails ("cached plan must not change
-- result type") until its connection is replaced.
SELECT
    id, operation_id, kind, attempt, actor, lease_epoch, started_at, duration_ms, method, url,
    http_status, response_headers, provider_request_id, error_class, outcome, trace_id, span_id,
    response_sha256, seq, prev_hash, hash
FROM provider_calls
WHERE operation_id = $1
ORDER BY started_at DESC, id DESC
LIMIT $2
