-- The most recent anchor.
SELECT id, created_at, created_by, operations, digest, version FROM audit_anchors ORDER BY id DESC LIMIT 1
