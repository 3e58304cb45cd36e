-- An operation's provider calls in the order they started.
SELECT * FROM provider_calls WHERE operation_id = $1 ORDER BY started_at, id
