-- The escalation queue, oldest first, optionally filtered by state and provider.
SELECT * FROM operations
WHERE escalated_at IS NOT NULL
  AND ($1::text IS NULL OR state = $1)
  AND ($2::text IS NULL OR provider = $2)
ORDER BY escalated_at, id
