-- Keep result bytes, in the transaction of the step that records them. The same bytes for the same
-- operation again (a step retried after an unknown commit outcome) are already there: nothing to do.
INSERT INTO operation_results (operation_id, sha256, size, content_type, bytes)
SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::int8[], $4::text[], $5::bytea[])
ON CONFLICT (operation_id, sha256) DO NOTHING
