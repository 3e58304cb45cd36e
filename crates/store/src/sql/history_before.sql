-- A page of an operation's history: up to $3 links before seq $2 (from the newest when NULL),
-- newest first (the caller puts them back in chain order).
SELECT * FROM operation_history
WHERE operation_id = $1 AND ($2::bigint IS NULL OR seq < $2)
ORDER BY seq DESC
LIMIT $3
