-- Wake workers. Delivered at commit; lost notifications only cost latency, because the due-time scan
-- is the truth. The channel's name is a per-database secret (jobtrail_settings, migration 0006), so a
-- role that cannot read it cannot reach the workers.
--
-- Payload: `<what>@<the database clock in Unix milliseconds when it was sent>`, from which workers
-- measure notification lag (jobtrail_notification_lag_seconds).
SELECT pg_notify((SELECT value FROM jobtrail_settings WHERE key = 'work_channel'),
                 $1 || '@' || (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
