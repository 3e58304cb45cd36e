-- The anchor with this digest (named by a copy kept outside the database): the earliest, the one
-- the copy was printed from (a later row with the same digest cannot displace it: ids come from
-- the sequence, migration 0031).
SELECT id, created_at, created_by, operations, digest, version FROM audit_anchors
WHERE digest = $1 ORDER BY id LIMIT 1
