-- The anchor with this digest (named by a copy kept outside the database).
SELECT id, created_at, created_by, operations, digest, version FROM audit_anchors
WHERE digest = $1 ORDER BY id DESC LIMIT 1
