-- Indexes of these names in jobtrail's schema that are INVALID: what a CREATE INDEX CONCURRENTLY
-- leaves when it is interrupted (or fails), which a new build of the same name then collides with.
SELECT c.relname::text
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
WHERE NOT i.indisvalid
  AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
  AND c.relname = ANY($1::text[])
