-- Benchmark only: end the operations bench_retire_history.sql linked (abandoned), so later phases'
-- workers do not pick up an earlier phase's leftovers.
UPDATE operations
SET state = 'abandoned', state_changed_at = now(), finished_at = now(), escalated_at = NULL,
    escalation_reason = NULL, lease_owner = NULL, lease_expires_at = NULL, create_sent_epoch = NULL,
    history_seq = history_seq + 1, history_head = sha256(history_head)
WHERE id = ANY ($1)
