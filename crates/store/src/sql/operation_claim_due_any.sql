-- Claim due, automated operations of any provider (tests and tools; the worker claims per provider,
-- operation_claim_shares.sql, whose index this query cannot use in order: fine for small queues): lock a
-- batch with SKIP LOCKED (the LIMIT inside the CTE, so concurrent claimers take disjoint rows), then
-- set owner, expiry and a new fencing epoch. The claim also moves next_action_at to the lease expiry:
-- the row leaves the head of the due index at once, and if the owner dies the row comes due again
-- exactly when its lease expires.
--
-- A claimed create_pending row is marked "a create may leave under this epoch" in this same commit,
-- before the worker sends anything (create_sent_epoch; see migration 0005). A mark left by an earlier
-- epoch is kept: that send's outcome was never recorded, and the new owner must treat it as unknown.
-- Returns the database clock, from which the worker carries its one decision clock, and for the
-- metrics: when each row was due (claim lag) and whether it still named another owner (a takeover:
-- that owner's lease ran out; a released lease names none). A takeover of a collecting operation is
-- counted in `takeovers` (migration 0034): a holder lost checking a result may have been killed by
-- it; a step that records something clears the count (write.rs).
WITH due AS (
    SELECT o.id, o.next_action_at AS was_due, o.lease_owner IS NOT NULL AS taken_over
    FROM operation_schedule q
    JOIN operations o ON o.id = q.operation_id
    WHERE q.next_action_at <= now()
      AND o.next_action_at <= now()
      AND o.state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                      'result_collecting', 'cancel_requested', 'cancelling')
      AND (o.lease_expires_at IS NULL OR o.lease_expires_at <= now())
    ORDER BY q.next_action_at
    LIMIT $2
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE operations o
SET lease_owner       = $1,
    lease_expires_at  = now() + make_interval(secs => $3),
    lease_epoch       = o.lease_epoch + 1,
    next_action_at    = now() + make_interval(secs => $3),
    create_sent_epoch = CASE WHEN o.state = 'create_pending'
                             THEN coalesce(o.create_sent_epoch, o.lease_epoch + 1) END,
    takeovers         = o.takeovers + (due.taken_over AND o.state = 'result_collecting')::int
FROM due
WHERE o.id = due.id
RETURNING now() AS db_now, due.was_due, due.taken_over, o.*
