-- Every history row, grouped by operation in chain order (for audit verify --all).
SELECT * FROM operation_history ORDER BY operation_id, seq
