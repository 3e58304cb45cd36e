-- Benchmark only: end every unfinished operation created since $1 (abandoned), so later phases'
-- workers do not pick up an earlier phase's leftovers.
UPDATE operations
SET state = 'abandoned', state_changed_at = now(), finished_at = now(), escalated_at = NULL,
    escalation_reason = NULL, lease_owner = NULL, lease_expires_at = NULL, create_sent_epoch = NULL
WHERE created_at >= $1 AND finished_at IS NULL
