-- Anchored heads that no longer hold: the operation is gone, or its history no longer has that link
-- with that hash (deleted, or the chain was rewritten from the start).
SELECT h.operation_id, h.seq, h.hash AS anchored, oh.hash AS current, (o.id IS NOT NULL) AS operation_exists
FROM audit_anchor_heads h
LEFT JOIN operations o ON o.id = h.operation_id
LEFT JOIN operation_history oh ON oh.operation_id = h.operation_id AND oh.seq = h.seq
WHERE h.anchor_id = $1 AND (o.id IS NULL OR oh.hash IS DISTINCT FROM h.hash)
ORDER BY h.operation_id
