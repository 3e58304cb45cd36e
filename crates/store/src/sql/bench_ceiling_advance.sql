-- Benchmark only, the lean ceiling, statement 2 of 2: a narrow update of the rows statement 1 locked
-- and linked (new epoch, next action, chain head).
UPDATE operations
SET lease_epoch = lease_epoch + 1, poll_count = poll_count + 1, next_action_at = now(),
    history_seq = history_seq + 1, history_head = sha256(history_head)
WHERE id = ANY ($1)
