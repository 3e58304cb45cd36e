-- Held for the whole migration run (a transaction on a second connection). Taken without waiting:
-- a run that waited inside this statement would hold a catalog snapshot the whole time, and a
-- migration that builds an index CONCURRENTLY waits for every older snapshot, the waiting run's
-- included, so neither would move. The caller tries again, in a new transaction, for up to 60 s.
LOCK TABLE jobtrail_migration_lock IN ACCESS EXCLUSIVE MODE NOWAIT
