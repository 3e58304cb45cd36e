-- A read-only transaction on one snapshot, for reading many tables as of one instant.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY
