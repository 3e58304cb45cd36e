-- Copy every operation's chain heads (history and calls) into the anchor (same snapshot as the digest).
INSERT INTO audit_anchor_heads (anchor_id, operation_id, seq, hash, calls_seq, calls_hash)
SELECT $1, id, history_seq, history_head, calls_seq, calls_head FROM operations
