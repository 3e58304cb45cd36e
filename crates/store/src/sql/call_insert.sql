-- Record one provider call, as the next link of its operation's call chain. Never credentials: the
-- URL and headers were sanitized before this.
INSERT INTO provider_calls (
    id, operation_id, kind, attempt, actor, lease_epoch, started_at, duration_ms, method, url,
    http_status, response_headers, provider_request_id, error_class, outcome, trace_id, span_id,
    response_sha256, seq, prev_hash, hash
) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)
