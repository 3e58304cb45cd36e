-- Record many provider calls at once (one group-committed batch). Same columns as call_insert.sql.
INSERT INTO provider_calls (
    id, operation_id, kind, attempt, actor, lease_epoch, started_at, duration_ms, method, url,
    http_status, response_headers, provider_request_id, error_class, outcome, trace_id, span_id,
    response_sha256, seq, prev_hash, hash
)
SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::int[], $5::text[], $6::bigint[],
                     $7::timestamptz[], $8::float8[], $9::text[], $10::text[], $11::int[], $12::jsonb[],
                     $13::text[], $14::text[], $15::text[], $16::text[], $17::text[], $18::text[],
                     $19::bigint[], $20::bytea[], $21::bytea[])
