-- One page of operations, newest id first (ids are time-ordered), keyset-paginated by id so a page
-- costs the same however deep it is. Every filter is optional (NULL: any).
SELECT *
FROM operations
WHERE ($1::uuid IS NULL OR id < $1)
  AND ($2::text IS NULL OR state = $2)
  AND ($3::text IS NULL OR provider = $3)
  AND ($4::text IS NULL OR caller = $4)
  AND ($5::timestamptz IS NULL OR created_at >= $5)
  AND ($6::timestamptz IS NULL OR created_at < $6)
ORDER BY id DESC
LIMIT $7
