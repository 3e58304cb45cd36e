-- The name of this database's work channel (see notify_work.sql).
SELECT value FROM jobtrail_settings WHERE key = 'work_channel'
