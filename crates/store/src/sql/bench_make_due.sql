-- Benchmark only: release every lease and make every automated operation due now.
UPDATE operations SET lease_owner = NULL, lease_expires_at = NULL, next_action_at = now()
WHERE state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                'result_collecting', 'cancel_requested', 'cancelling')
