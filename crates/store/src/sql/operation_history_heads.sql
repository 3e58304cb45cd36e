-- The history heads of these operations as last committed (did a write whose commit answer was
-- lost commit after all?).
SELECT id, history_seq, history_head FROM operations WHERE id = ANY ($1)
