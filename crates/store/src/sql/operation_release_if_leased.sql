-- Give a lease back without a transition, due again $4 milliseconds from now by the database's
-- clock (never a host's: a worker whose clock runs ahead would push the operation into the future).
-- Zero rows is LeaseLost.
UPDATE operations
SET lease_owner = NULL, lease_expires_at = NULL,
    next_action_at = now() + $4::bigint * interval '1 millisecond', next_action_reason = $5
WHERE id = $1 AND lease_owner = $2 AND lease_epoch = $3 AND lease_expires_at > now()
RETURNING id
