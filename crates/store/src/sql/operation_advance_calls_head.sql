-- Move an operation's call-chain head to a call just logged outside a fenced step (a refused write's
-- call, logged by its stale worker in a transaction of its own; the row is locked by it). A
-- Retry-After that call was answered with ($4, milliseconds) still binds every later status read
-- of the job, whoever owns it now: it can only move poll_not_before later, never earlier.
UPDATE operations
SET calls_seq = $2, calls_head = $3,
    poll_not_before = CASE
        WHEN $4::bigint IS NULL THEN poll_not_before
        ELSE greatest(poll_not_before, now() + $4::bigint * interval '1 millisecond')
    END
WHERE id = $1
