-- Take $4 calls from a provider's fleet-wide bucket ($2 tokens a second, at most $3 saved). Refilled
-- by database time elapsed since the last take (never negative: a transaction that started before the
-- last one committed refills nothing). Returns whether the calls may go now, and if not, how many
-- seconds until they may (the bucket refilling, or the provider's pause ending). The row lock
-- serialises takers across the fleet; a take is one short statement.
WITH cur AS (
    SELECT provider,
           least($3::float8, tokens + $2::float8
                 * greatest(0, extract(epoch FROM now() - refreshed_at)::float8)) AS avail,
           greatest(0, coalesce(extract(epoch FROM paused_until - now())::float8, 0)) AS paused_for
    FROM provider_throttles
    WHERE provider = $1
    FOR UPDATE
)
UPDATE provider_throttles t
SET tokens = CASE WHEN cur.paused_for = 0 AND cur.avail >= $4 THEN cur.avail - $4 ELSE cur.avail END,
    refreshed_at = greatest(t.refreshed_at, now())
FROM cur
WHERE t.provider = cur.provider
RETURNING (cur.paused_for = 0 AND cur.avail >= $4) AS granted,
          greatest(cur.paused_for, ($4 - cur.avail) / $2::float8) AS wait_secs
