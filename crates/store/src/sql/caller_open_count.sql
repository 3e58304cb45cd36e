-- A caller's operations not yet terminal (index operations_open_by_caller), this transaction's
-- new ones included.
SELECT count(*) FROM operations WHERE caller = $1 AND finished_at IS NULL
