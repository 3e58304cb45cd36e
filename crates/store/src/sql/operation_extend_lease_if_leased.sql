-- Extend a live lease. Zero rows is LeaseLost.
UPDATE operations
SET lease_expires_at = now() + make_interval(secs => $4),
    next_action_at   = now() + make_interval(secs => $4)
WHERE id = $1 AND lease_owner = $2 AND lease_epoch = $3 AND lease_expires_at > now()
RETURNING lease_expires_at
