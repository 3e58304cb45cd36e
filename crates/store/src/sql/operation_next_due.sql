-- When a worker with nothing to claim should look again: seconds until the earliest moment one of
-- the named providers' operations could be claimed (the first rows of each provider's due index; a
-- row whose lease is held counts from the lease's end), or until a provider's pause ends. NULL:
-- nothing open. A read of the index heads, never a scan of the table.
SELECT extract(epoch FROM least(
    (SELECT min(greatest(h.next_action_at, coalesce(h.lease_expires_at, h.next_action_at)))
     FROM unnest($1::text[]) AS p(name)
     CROSS JOIN LATERAL (
         SELECT o.next_action_at, o.lease_expires_at
         FROM operation_schedule q
         JOIN operations o ON o.id = q.operation_id
         WHERE q.provider = p.name
           AND NOT EXISTS (SELECT 1 FROM provider_throttles t
                           WHERE t.provider = p.name AND t.paused_until > now())
         ORDER BY q.next_action_at
         LIMIT 64) h),
    (SELECT min(paused_until) FROM provider_throttles
     WHERE provider = ANY ($1::text[]) AND paused_until > now())
) - now())::float8 AS secs
