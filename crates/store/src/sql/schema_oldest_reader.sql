-- The oldest binary (by its newest migration) that may run against this database's schema
-- (migration 0033): a database ahead of a binary at least this new is one it can still work with.
SELECT oldest_reader FROM jobtrail_schema_readers
