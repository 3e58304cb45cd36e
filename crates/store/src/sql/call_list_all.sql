-- Every provider call, grouped by operation in chain order (for audit verify --all).
SELECT * FROM provider_calls ORDER BY operation_id, seq NULLS FIRST, started_at, id
