-- Copy every operation's chain head into the anchor (same snapshot as the digest).
INSERT INTO audit_anchor_heads (anchor_id, operation_id, seq, hash)
SELECT $1, id, history_seq, history_head FROM operations
