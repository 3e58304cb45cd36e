-- Give a lease back without a transition, scheduling the next action. Zero rows is LeaseLost.
UPDATE operations
SET lease_owner = NULL, lease_expires_at = NULL,
    next_action_at = GREATEST($4, now()), next_action_reason = $5
WHERE id = $1 AND lease_owner = $2 AND lease_epoch = $3 AND lease_expires_at > now()
RETURNING id
