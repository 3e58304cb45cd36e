-- A verified webhook names a remote job: make its operation due for a status read now (or as soon as
-- the provider's Retry-After allows), if a worker would read its status next (not while a cancel
-- not yet sent is what comes next: a webhook must not bring a cancel call forward). While a worker
-- holds the lease the schedule is that worker's: the webhook is left as a mark
-- (`webhook_while_leased`) that the worker's next write honours (its next read is then due at once:
-- the one in flight may have been answered before the job finished). It changes nothing else: the
-- state moves only by a status read, under the normal lease rules. A webhook shortens a polling wait
-- only, never the backoff after failed calls (`failure_count` > 0): deliveries during a provider's
-- outage would otherwise spend its retry budget in seconds and hold the job for a person. Nor does
-- it bring a read closer than $3 milliseconds after the last call to the provider about the job
-- (whatever that call was answered: "not now" without a Retry-After too): deliveries without end
-- would otherwise have a worker read, and record a call and a link, as fast as it turns round.
-- `held`: the mark was left (no worker needs waking).
-- The last call is read in the CTE; the row's own columns are read by the UPDATE, so a row a
-- worker changed while this waited for its lock is judged as it now is (PostgreSQL re-checks the
-- UPDATE's own conditions against the new row, not a CTE's).
WITH target AS (
    SELECT o.id,
           (SELECT max(c.started_at) FROM provider_calls c WHERE c.operation_id = o.id)
               + $3 * interval '1 millisecond' AS after_last_call
    FROM operations o
    WHERE o.provider = $1 AND o.remote_job_id = $2
)
UPDATE operations
SET next_action_at     = CASE WHEN lease_expires_at > now() THEN next_action_at
                              ELSE greatest(now(), poll_not_before, target.after_last_call) END,
    next_action_reason = CASE WHEN lease_expires_at > now() THEN 'webhook_while_leased'
                              ELSE 'webhook' END
FROM target
WHERE operations.id = target.id
  AND operations.provider = $1
  AND operations.remote_job_id = $2
  AND (state IN ('accepted', 'observing', 'cancelling')
       OR (state = 'cancel_requested' AND cancel_attempts > 0))
  AND (lease_expires_at > now()
       OR (failure_count = 0
           AND next_action_at > greatest(now(), poll_not_before, target.after_last_call)))
RETURNING operations.id, coalesce(lease_expires_at > now(), false) AS held
