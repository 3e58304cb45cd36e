-- The anchors recorded with this digest (a copy kept outside the database names it), earliest
-- first: ids come from the sequence (migration 0031), so the one the copy was printed from comes
-- before any row added later with its digest. At most 16: more is a flood, and the earliest ones
-- are the ones that matter.
SELECT id, created_at, created_by, operations, digest, version FROM audit_anchors
WHERE digest = $1 ORDER BY id LIMIT 16
