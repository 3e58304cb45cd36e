-- Fleet-wide limits per provider (contract `[limits]`). Never edit this file once landed.
--
-- One row per provider that has a call rate or was told to slow down: a token bucket every worker
-- draws from before a call (`rate_per_sec`, `burst`; refilled by elapsed database time, so no host
-- clock is involved), and a pause set by a provider's `429` with `Retry-After`, which the claim honours
-- for every worker. Only state lives here: the rate and burst come from each worker's contract.
CREATE TABLE provider_throttles (
    provider     text PRIMARY KEY,
    tokens       double precision NOT NULL CHECK (tokens >= 0),
    refreshed_at timestamptz NOT NULL,
    paused_until timestamptz
);

GRANT SELECT, INSERT, UPDATE ON provider_throttles TO jobtrail_worker;
GRANT SELECT ON provider_throttles TO jobtrail_operator;
