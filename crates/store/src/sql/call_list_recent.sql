-- An operation's most recent provider calls, newest first.
SELECT * FROM provider_calls WHERE operation_id = $1 ORDER BY started_at DESC, id DESC LIMIT $2
