-- A verified webhook names a remote job: make its operation due for a status read now (or as soon as
-- the provider's Retry-After allows), if a worker would read its status and nobody holds its lease.
-- It changes nothing else: the state moves only by that status read, under the normal lease rules.
UPDATE operations
SET next_action_at     = greatest(now(), coalesce(poll_not_before, now())),
    next_action_reason = 'webhook'
WHERE provider = $1
  AND remote_job_id = $2
  AND state IN ('accepted', 'observing', 'cancel_requested', 'cancelling')
  AND (lease_expires_at IS NULL OR lease_expires_at <= now())
  AND next_action_at > greatest(now(), coalesce(poll_not_before, now()))
RETURNING id
