-- Move an operation's call-chain head to a call just logged outside a fenced step (a refused write's
-- call, logged by its stale worker in a transaction of its own; the row is locked by it).
UPDATE operations SET calls_seq = $2, calls_head = $3 WHERE id = $1
