-- A migration that alters a table (in a transaction) waits at most 5 s for each lock
-- (MIGRATION_LOCK_WAIT), then gives way and is tried again: while its exclusive lock request is
-- queued, every read and write of the table queues behind it. A migration that sets its own
-- `SET LOCAL lock_timeout` overrides this for its transaction.
SET lock_timeout = '5s'
