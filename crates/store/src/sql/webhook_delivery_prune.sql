-- Forget deliveries older than the retention window (their timestamps are refused by then anyway).
DELETE FROM webhook_deliveries WHERE received_at < now() - make_interval(secs => $1)
