-- Anchored heads that no longer hold: the operation is gone, or its history (or call chain) no longer
-- has that link with that hash (deleted, or rewritten from the start). $2: one operation, or all.
SELECT h.operation_id, h.seq, h.hash AS anchored, oh.hash AS current,
       (o.id IS NOT NULL) AS operation_exists, 'history link' AS chain
FROM audit_anchor_heads h
LEFT JOIN operations o ON o.id = h.operation_id
LEFT JOIN operation_history oh ON oh.operation_id = h.operation_id AND oh.seq = h.seq
WHERE h.anchor_id = $1 AND ($2::uuid IS NULL OR h.operation_id = $2)
  AND (o.id IS NULL OR oh.hash IS DISTINCT FROM h.hash)
UNION ALL
SELECT h.operation_id, h.calls_seq, h.calls_hash, c.hash, (o.id IS NOT NULL), 'provider call'
FROM audit_anchor_heads h
LEFT JOIN operations o ON o.id = h.operation_id
LEFT JOIN provider_calls c ON c.operation_id = h.operation_id AND c.seq = h.calls_seq
WHERE h.anchor_id = $1 AND ($2::uuid IS NULL OR h.operation_id = $2)
  AND o.id IS NOT NULL AND h.calls_seq > 0 AND c.hash IS DISTINCT FROM h.calls_hash
ORDER BY 1, 2
