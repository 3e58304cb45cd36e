-- Evidence after anchor $1 (all evidence when $1 is NULL): operations it does not cover, history
-- links and chained calls past its heads; of operation $2 only, or of every operation when NULL.
SELECT
    (SELECT count(*) FROM operations o
     WHERE ($2::uuid IS NULL OR o.id = $2)
       AND NOT EXISTS (SELECT 1 FROM audit_anchor_heads h
                       WHERE h.anchor_id = $1 AND h.operation_id = o.id)) AS operations,
    (SELECT count(*) FROM operation_history x
     LEFT JOIN audit_anchor_heads h ON h.anchor_id = $1 AND h.operation_id = x.operation_id
     WHERE ($2::uuid IS NULL OR x.operation_id = $2) AND x.seq > coalesce(h.seq, 0)) AS links,
    (SELECT count(*) FROM provider_calls c
     LEFT JOIN audit_anchor_heads h ON h.anchor_id = $1 AND h.operation_id = c.operation_id
     WHERE ($2::uuid IS NULL OR c.operation_id = $2) AND c.seq > coalesce(h.calls_seq, 0)) AS calls
