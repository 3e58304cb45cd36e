-- An anchor's recorded heads, in operation id order (the digest's order).
SELECT operation_id, seq, hash, calls_seq, calls_hash FROM audit_anchor_heads
WHERE anchor_id = $1 ORDER BY operation_id
