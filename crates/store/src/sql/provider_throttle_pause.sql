-- A provider said "not before" (429 with Retry-After): every worker's claim skips its operations, and
-- its bucket grants nothing, until then. A later pause never shortens an earlier one.
INSERT INTO provider_throttles AS t (provider, tokens, refreshed_at, paused_until)
VALUES ($1, 0, now(), now() + make_interval(secs => $2))
ON CONFLICT (provider) DO UPDATE
SET paused_until = greatest(t.paused_until, excluded.paused_until)
