-- Record a webhook delivery once: a duplicate or replay of the same event id inserts nothing.
INSERT INTO webhook_deliveries (provider, event_id, remote_job_id, operation_id, outcome)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (provider, event_id) DO NOTHING
RETURNING received_at
