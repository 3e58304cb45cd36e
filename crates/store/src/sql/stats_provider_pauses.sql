-- Providers the fleet is holding back now because one of them answered 429 with Retry-After
-- (provider_throttles.paused_until): no worker claims their operations until then. Soonest first.
SELECT provider, paused_until,
       extract(epoch FROM paused_until - now())::float8 AS remaining_secs
FROM provider_throttles
WHERE paused_until > now()
ORDER BY paused_until, provider
