-- jobtrail foundation: the durable operation record, its append-only hash-chained history, and the
-- provider-call log. Never edit this file once landed: add a new migration instead.

-- ---------------------------------------------------------------------------------------------------
-- operations: one row per logical operation. Written before anything reaches a provider.
-- ---------------------------------------------------------------------------------------------------
CREATE TABLE operations (
    id                      uuid        PRIMARY KEY,          -- ours; shown as op_<ULID>
    provider                text        NOT NULL,
    target                  text        NOT NULL,
    -- Sensitive fields hold secret references ({"$secret": "env:NAME"}), never values.
    request_body            jsonb       NOT NULL,
    request_fingerprint     text        NOT NULL CHECK (request_fingerprint ~ '^sha256:[0-9a-f]{64}$'),
    -- One token per operation, bound to exactly one fingerprint (this row).
    idempotency_token       text        NOT NULL UNIQUE CHECK (idempotency_token ~ '^idem_[0-9a-f]{32}$'),
    idempotency_mode        text        NOT NULL CHECK (idempotency_mode IN ('header', 'body_field', 'none')),
    -- False when the provider takes no token: at-most-once creation cannot be guaranteed.
    at_most_once            boolean     NOT NULL,
    caller                  text        NOT NULL CHECK (caller <> ''),
    approved_by             text        NOT NULL CHECK (approved_by <> ''),
    approval_ref            text,
    trace_id                text        NOT NULL CHECK (trace_id ~ '^[0-9a-f]{32}$' AND trace_id <> repeat('0', 32)),

    created_at              timestamptz NOT NULL,
    create_deadline         timestamptz NOT NULL,
    result_deadline         timestamptz NOT NULL,
    cancel_window_ms        bigint      NOT NULL CHECK (cancel_window_ms >= 1000),
    cancel_deadline         timestamptz,                      -- set when a cancel is requested

    state                   text        NOT NULL CHECK (state IN (
                                'create_pending', 'create_unknown', 'reconciliation', 'create_unresolved',
                                'accepted', 'observing', 'result_collecting', 'cancel_requested',
                                'cancelling', 'contract_violation', 'cancellation_unconfirmed',
                                'result_timed_out', 'succeeded', 'failed', 'cancelled',
                                'result_unavailable', 'result_validation_failed', 'withdrawn',
                                'not_created', 'abandoned')),
    state_changed_at        timestamptz NOT NULL,
    finished_at             timestamptz,                      -- set exactly when terminal
    escalated_at            timestamptz,                      -- set exactly when held for a person
    escalation_reason       text,

    -- Remote facts, in the provider's words.
    remote_job_id           text,
    conflicting_remote_job_id text,                           -- the other answer of a contract violation
    remote_state            text,
    remote_updated_at       text,                             -- the provider's own timestamp, verbatim
    remote_progress         jsonb,
    observed_at             timestamptz,
    status_url              text,                             -- the URL the provider gave; may change
    provider_context        jsonb       NOT NULL DEFAULT '{}', -- per-operation provider state (cookies)

    -- The schedule lives in the row.
    next_action_at          timestamptz NOT NULL,
    next_action_reason      text        NOT NULL,
    create_attempts         integer     NOT NULL DEFAULT 0 CHECK (create_attempts >= 0),
    poll_count              integer     NOT NULL DEFAULT 0 CHECK (poll_count >= 0),
    failure_count           integer     NOT NULL DEFAULT 0 CHECK (failure_count >= 0),
    cancel_attempts         integer     NOT NULL DEFAULT 0 CHECK (cancel_attempts >= 0),
    result_attempts         integer     NOT NULL DEFAULT 0 CHECK (result_attempts >= 0),

    -- The lease: one owner at a time. Every write by a worker repeats owner and epoch.
    lease_owner             text,
    lease_expires_at        timestamptz,
    lease_epoch             bigint      NOT NULL DEFAULT 0,

    -- The recorded cancel request (local fact).
    cancel_requested_at     timestamptz,
    cancel_requested_by     text,
    cancel_reason           text,

    -- The stored result and its integrity data (never the bytes).
    result_location         text,
    result_size             bigint,
    result_sha256           text        CHECK (result_sha256 ~ '^[0-9a-f]{64}$'),
    result_content_type     text,
    result_summary          jsonb,

    supersedes              uuid        REFERENCES operations (id),
    superseded_by           uuid        REFERENCES operations (id),

    -- The head of this operation's history chain.
    history_seq             bigint      NOT NULL CHECK (history_seq >= 1),
    history_head            bytea       NOT NULL CHECK (length(history_head) = 32),

    CONSTRAINT deadlines_in_order CHECK (create_deadline > created_at AND result_deadline >= create_deadline),
    CONSTRAINT lease_is_whole CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CONSTRAINT finished_iff_terminal CHECK (
        (state IN ('succeeded', 'failed', 'cancelled', 'result_unavailable', 'result_validation_failed',
                   'withdrawn', 'not_created', 'abandoned')) = (finished_at IS NOT NULL)),
    CONSTRAINT escalated_iff_held CHECK (
        (state IN ('create_unresolved', 'contract_violation', 'cancellation_unconfirmed', 'result_timed_out'))
        = (escalated_at IS NOT NULL AND escalation_reason IS NOT NULL)),
    CONSTRAINT remote_job_known CHECK (
        state NOT IN ('accepted', 'observing', 'cancel_requested', 'cancelling', 'cancellation_unconfirmed',
                      'cancelled', 'result_timed_out')
        OR remote_job_id IS NOT NULL),
    CONSTRAINT cancel_is_recorded CHECK (
        state NOT IN ('cancel_requested', 'cancelling', 'cancellation_unconfirmed', 'withdrawn')
        OR (cancel_requested_at IS NOT NULL AND cancel_requested_by IS NOT NULL
            AND cancel_reason IS NOT NULL AND cancel_deadline IS NOT NULL)),
    CONSTRAINT success_has_result CHECK (
        state <> 'succeeded'
        OR (result_location IS NOT NULL AND result_sha256 IS NOT NULL AND result_size IS NOT NULL)),
    CONSTRAINT violation_keeps_both CHECK (
        state <> 'contract_violation' OR conflicting_remote_job_id IS NOT NULL)
);

-- The claim query's index: due, automated operations by time. Terminal and held rows are not in it,
-- so the queue head stays small however much history accumulates.
CREATE INDEX operations_due ON operations (next_action_at)
    WHERE state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                    'result_collecting', 'cancel_requested', 'cancelling');
CREATE INDEX operations_escalated ON operations (escalated_at) WHERE escalated_at IS NOT NULL;
CREATE INDEX operations_remote_job ON operations (provider, remote_job_id) WHERE remote_job_id IS NOT NULL;
CREATE INDEX operations_state ON operations (state);

-- Operations are kept forever: their history references them.
CREATE FUNCTION jobtrail_refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'jobtrail: % on % is not allowed: records are kept', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;

-- Statement-level, so even a DELETE that matches nothing is refused.
CREATE TRIGGER operations_no_delete BEFORE DELETE OR TRUNCATE ON operations
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_refuse_delete();

-- ---------------------------------------------------------------------------------------------------
-- provider_calls: one row per external call. URL without secrets; sanitized headers; never
-- credentials. Append-only.
-- ---------------------------------------------------------------------------------------------------
CREATE TABLE provider_calls (
    id                  uuid        PRIMARY KEY,
    operation_id        uuid        NOT NULL REFERENCES operations (id),
    kind                text        NOT NULL CHECK (kind IN ('create', 'status', 'cancel', 'result', 'lookup')),
    attempt             integer     NOT NULL CHECK (attempt >= 1),
    actor               text        NOT NULL,
    lease_epoch         bigint      NOT NULL,
    started_at          timestamptz NOT NULL,
    duration_ms         double precision NOT NULL CHECK (duration_ms >= 0),
    method              text        NOT NULL,
    url                 text        NOT NULL,
    http_status         integer,
    response_headers    jsonb       NOT NULL DEFAULT '{}',
    provider_request_id text,
    error_class         text,
    outcome             text        NOT NULL,
    trace_id            text        NOT NULL CHECK (trace_id ~ '^[0-9a-f]{32}$'),
    span_id             text        NOT NULL CHECK (span_id ~ '^[0-9a-f]{16}$'),
    response_sha256     text
);
CREATE INDEX provider_calls_operation ON provider_calls (operation_id, started_at);
CREATE INDEX provider_calls_trace ON provider_calls (trace_id);

-- ---------------------------------------------------------------------------------------------------
-- operation_history: every transition and observation, hash-chained per operation
-- (hash = sha256(prev_hash || JCS(row))). Append-only: UPDATE, DELETE and TRUNCATE are refused.
-- ---------------------------------------------------------------------------------------------------
CREATE TABLE operation_history (
    operation_id    uuid        NOT NULL REFERENCES operations (id),
    seq             bigint      NOT NULL CHECK (seq >= 1),
    at              timestamptz NOT NULL,
    actor           text        NOT NULL CHECK (actor <> ''),
    from_state      text,
    to_state        text        NOT NULL,
    event           text        NOT NULL,
    cause           text        NOT NULL,
    remote_job_id   text,
    call_id         uuid        REFERENCES provider_calls (id),
    detail          jsonb       NOT NULL DEFAULT '{}',
    prev_hash       bytea       NOT NULL CHECK (length(prev_hash) = 32),
    hash            bytea       NOT NULL CHECK (length(hash) = 32),
    PRIMARY KEY (operation_id, seq),
    CHECK ((seq = 1) = (from_state IS NULL))
);
CREATE INDEX operation_history_at ON operation_history (at);

CREATE FUNCTION jobtrail_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'jobtrail: % on % is not allowed: it is append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;

-- Statement-level, so any UPDATE, DELETE or TRUNCATE statement is refused, whatever it matches.
CREATE TRIGGER operation_history_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON operation_history
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_refuse_change();
CREATE TRIGGER provider_calls_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON provider_calls
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_refuse_change();

-- The operations table is updated in place at every step: leave room for HOT updates and vacuum the
-- queue head early, so dead index entries do not pile up where the claim query reads.
ALTER TABLE operations SET (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01,
                            autovacuum_vacuum_threshold = 200, autovacuum_vacuum_cost_delay = 0);
