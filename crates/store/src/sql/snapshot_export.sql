-- This transaction's snapshot, for other transactions to read the same instant (`SET TRANSACTION
-- SNAPSHOT`, which takes no parameters: its id is checked before it is written into that statement).
SELECT pg_export_snapshot()
