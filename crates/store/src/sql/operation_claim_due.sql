-- Claim due, automated operations: lock a batch with SKIP LOCKED (the LIMIT inside the CTE, so
-- concurrent claimers take disjoint rows), then set owner, expiry and a new fencing epoch. The claim
-- also moves next_action_at to the lease expiry: the row leaves the head of the due index at once,
-- and if the owner dies the row comes due again exactly when its lease expires.
WITH due AS (
    SELECT id
    FROM operations
    WHERE next_action_at <= now()
      AND state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                    'result_collecting', 'cancel_requested', 'cancelling')
      AND (lease_expires_at IS NULL OR lease_expires_at <= now())
    ORDER BY next_action_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE operations o
SET lease_owner      = $1,
    lease_expires_at = now() + make_interval(secs => $3),
    lease_epoch      = o.lease_epoch + 1,
    next_action_at   = now() + make_interval(secs => $3)
FROM due
WHERE o.id = due.id
RETURNING o.*
