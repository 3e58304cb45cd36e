-- Held for the whole migration run (a transaction on a second connection); bounded wait.
SET LOCAL lock_timeout = '60s';
LOCK TABLE jobtrail_migration_lock IN ACCESS EXCLUSIVE MODE
