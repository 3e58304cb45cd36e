-- An operation's provider calls in chain order (calls logged before chaining first, by start time).
SELECT * FROM provider_calls WHERE operation_id = $1 ORDER BY seq NULLS FIRST, started_at, id
