-- A provider said "not before" (429 with Retry-After): every worker's claim skips its operations, and
-- its bucket grants nothing, until then. A later pause never shortens an earlier one. The bucket is
-- emptied and refills only from the pause's end, so the fleet does not spend a whole burst the
-- moment the pause lifts.
INSERT INTO provider_throttles AS t (provider, tokens, refreshed_at, paused_until)
VALUES ($1, 0, now() + make_interval(secs => $2), now() + make_interval(secs => $2))
ON CONFLICT (provider) DO UPDATE
SET paused_until = greatest(t.paused_until, excluded.paused_until),
    tokens       = 0,
    refreshed_at = greatest(t.refreshed_at, excluded.paused_until)
