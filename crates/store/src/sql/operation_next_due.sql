-- When a worker with nothing to claim should look again: seconds until the earliest moment one of
-- the named providers' operations could be claimed (the first rows of the due index; a row whose
-- lease is held counts from the lease's end), or until a provider's pause ends. NULL: nothing open.
-- A read of the index head, never a scan of the table.
SELECT extract(epoch FROM least(
    (SELECT min(greatest(h.next_action_at, coalesce(h.lease_expires_at, h.next_action_at)))
     FROM (SELECT next_action_at, lease_expires_at
           FROM operations
           WHERE state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted',
                           'observing', 'result_collecting', 'cancel_requested', 'cancelling')
             AND provider = ANY ($1::text[])
             AND NOT EXISTS (SELECT 1 FROM provider_throttles t
                             WHERE t.provider = operations.provider AND t.paused_until > now())
           ORDER BY next_action_at
           LIMIT 64) h),
    (SELECT min(paused_until) FROM provider_throttles
     WHERE provider = ANY ($1::text[]) AND paused_until > now())
) - now())::float8 AS secs
