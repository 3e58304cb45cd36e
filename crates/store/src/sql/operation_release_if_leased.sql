-- Give a lease back without a transition, due again $4 milliseconds from now by the database's
-- clock (never a host's: a worker whose clock runs ahead would push the operation into the future).
-- Zero rows is LeaseLost. $6: the holder sent no create its steps did not record (it gave up before
-- its call, or stopped before its first), so the claim's "a create may leave under this epoch" mark
-- goes with the lease: left, the next claim would take the create as sent and unanswered.
UPDATE operations
SET lease_owner = NULL, lease_expires_at = NULL,
    next_action_at = now() + $4::bigint * interval '1 millisecond', next_action_reason = $5,
    create_sent_epoch = CASE WHEN $6 AND create_sent_epoch = $3 THEN NULL ELSE create_sent_epoch END
WHERE id = $1 AND lease_owner = $2 AND lease_epoch = $3 AND lease_expires_at > now()
RETURNING id
