-- Lock the row for a write that is not a lease holder's (a cancel request, a person's decision).
SELECT now() AS db_now, o.*
FROM operations o
WHERE o.id = $1
FOR UPDATE
