-- A provider's token bucket, full, unless it exists already (every worker with the contract runs this
-- at start; the first one creates it).
INSERT INTO provider_throttles (provider, tokens, refreshed_at)
VALUES ($1, $2, now())
ON CONFLICT (provider) DO NOTHING
