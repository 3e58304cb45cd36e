-- Where a listing's scan ended, for a page that came back short: the id of the $3-th operation
-- below $1 (NULL: from the newest) of caller $2 (NULL: any), newest first; none if there are fewer.
-- The next page starts below it. Reads the same index entries the page's scan read, no more.
SELECT id
FROM operations
WHERE ($2::text IS NULL OR caller = $2)
  AND ($1::uuid IS NULL OR id < $1)
ORDER BY id DESC
OFFSET $3 - 1
LIMIT 1
