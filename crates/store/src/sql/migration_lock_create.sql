-- The table whose exclusive lock serialises `jobtrail migrate` runs. Only its owner (the role that
-- migrates) can lock it: no other jobtrail role is granted anything on it.
CREATE TABLE IF NOT EXISTS jobtrail_migration_lock (note text)
