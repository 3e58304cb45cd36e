-- Lock the row for a fenced write: only the current, unexpired lease holder finds it. Zero rows is
-- LeaseLost. Returns the database clock so every timestamp of the write comes from one clock.
SELECT now() AS db_now, o.*
FROM operations o
WHERE o.id = $1 AND o.lease_owner = $2 AND o.lease_epoch = $3 AND o.lease_expires_at > now()
FOR UPDATE
