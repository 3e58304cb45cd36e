-- The front door: bearer tokens for the HTTP API and MCP server, and the webhook receiver's
-- deduplication table.

-- ---------------------------------------------------------------------------------------------------
-- API tokens. The token itself is shown once, at creation; only its SHA-256 is kept (a token is 256
-- random bits, so a fast hash is enough: there is nothing to guess). The caller recorded in history
-- for anything done with a token is the token's caller, never what a request says.
-- ---------------------------------------------------------------------------------------------------
CREATE TABLE api_tokens (
    id            uuid PRIMARY KEY,
    caller        text NOT NULL CHECK (caller <> '' AND length(caller) <= 200),
    scopes        text[] NOT NULL
                  CHECK (cardinality(scopes) > 0
                         AND scopes <@ ARRAY['submit', 'read', 'cancel', 'decide', 'audit']::text[]),
    token_sha256  bytea NOT NULL UNIQUE CHECK (length(token_sha256) = 32),
    note          text CHECK (length(note) <= 500),
    created_at    timestamptz NOT NULL DEFAULT now(),
    created_by    text NOT NULL CHECK (created_by <> ''),
    expires_at    timestamptz,
    revoked_at    timestamptz,
    revoked_by    text,
    CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);

-- The API looks tokens up by digest; operators create, list and revoke them.
GRANT SELECT ON api_tokens TO jobtrail_api;
GRANT SELECT, INSERT ON api_tokens TO jobtrail_operator;
GRANT UPDATE (revoked_at, revoked_by) ON api_tokens TO jobtrail_operator;

-- ---------------------------------------------------------------------------------------------------
-- Webhook deliveries, one row per (provider, event id): a replay or a duplicate finds its row and
-- changes nothing. Rows older than the retention window are pruned by the receiver; a delivery older
-- than the window is refused by its timestamp before it could be mistaken for a new one.
-- ---------------------------------------------------------------------------------------------------
CREATE TABLE webhook_deliveries (
    provider       text NOT NULL,
    event_id       text NOT NULL CHECK (event_id <> '' AND length(event_id) <= 200),
    received_at    timestamptz NOT NULL DEFAULT now(),
    remote_job_id  text,
    operation_id   uuid,
    outcome        text NOT NULL CHECK (outcome IN ('scheduled', 'no_operation', 'not_observing')),
    PRIMARY KEY (provider, event_id)
);
CREATE INDEX webhook_deliveries_received ON webhook_deliveries (received_at);

GRANT SELECT, INSERT, DELETE ON webhook_deliveries TO jobtrail_api;
GRANT SELECT ON webhook_deliveries TO jobtrail_operator, jobtrail_auditor;

-- A webhook's operation is found by its remote job id (migration 0003 dropped this index while no
-- query used it; every step's update is non-HOT anyway, so it costs one index entry per step).
CREATE INDEX operations_remote_job ON operations (provider, remote_job_id)
    WHERE remote_job_id IS NOT NULL;
