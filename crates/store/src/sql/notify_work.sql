-- Wake workers (LISTEN jobtrail_work). Delivered at commit; lost notifications only cost latency,
-- because the due-time scan is the truth.
SELECT pg_notify('jobtrail_work', $1)
