-- Record an anchor (its digest was computed over the heads in this same snapshot).
INSERT INTO audit_anchors (created_by, operations, digest, version) VALUES ($1, $2, $3, $4)
RETURNING id, created_at
