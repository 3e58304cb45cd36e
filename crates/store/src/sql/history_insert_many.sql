-- Append many history links at once (each to its own operation's chain). Same columns as
-- history_insert.sql; (operation_id, seq) stays the primary key.
INSERT INTO operation_history (
    operation_id, seq, at, actor, from_state, to_state, event, cause, remote_job_id, call_id, detail,
    prev_hash, hash
)
SELECT * FROM UNNEST($1::uuid[], $2::bigint[], $3::timestamptz[], $4::text[], $5::text[], $6::text[],
                     $7::text[], $8::text[], $9::text[], $10::uuid[], $11::jsonb[], $12::bytea[], $13::bytea[])
