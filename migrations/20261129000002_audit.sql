-- Audit: anchors over every chain head, read-only views for auditors, and the auditor role.

-- Our public operation id (op_ + the ULID rendering of the UUID), so auditors can query by the id
-- everyone else uses. Crockford base32 of the 128-bit value, 26 digits (the same as the `ulid` crate;
-- a test checks they agree).
CREATE FUNCTION jobtrail_public_id(id uuid) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    hex      text := replace(id::text, '-', '');
    n        numeric := 0;
    out      text := '';
    alphabet constant text := '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
BEGIN
    FOR i IN 1..32 LOOP
        n := n * 16 + ('x' || substr(hex, i, 1))::bit(4)::int;
    END LOOP;
    FOR i IN 1..26 LOOP
        out := substr(alphabet, mod(n, 32)::int + 1, 1) || out;
        n := div(n, 32);
    END LOOP;
    RETURN 'op_' || out;
END $$;

-- ---------------------------------------------------------------------------------------------------
-- Anchors: a checkpoint over every operation's chain head. The digest is printed so it can be kept
-- outside the database; `audit verify` checks the latest anchor, so an operation deleted whole, or a
-- chain rewritten from its first link, is found even though its own chain would verify.
-- ---------------------------------------------------------------------------------------------------
CREATE TABLE audit_anchors (
    id          bigserial   PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text        NOT NULL CHECK (created_by <> ''),
    operations  bigint      NOT NULL CHECK (operations >= 0),
    digest      text        NOT NULL CHECK (digest ~ '^[0-9a-f]{64}$')
);

CREATE TABLE audit_anchor_heads (
    anchor_id    bigint NOT NULL REFERENCES audit_anchors (id),
    operation_id uuid   NOT NULL,
    seq          bigint NOT NULL,
    hash         bytea  NOT NULL,
    PRIMARY KEY (anchor_id, operation_id)
);

CREATE TRIGGER audit_anchors_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON audit_anchors
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_refuse_change();
CREATE TRIGGER audit_anchor_heads_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON audit_anchor_heads
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_refuse_change();

-- ---------------------------------------------------------------------------------------------------
-- Read-only views for auditors (documented in docs/audit.md). They leave out request bodies and the
-- per-operation provider context (cookies): business data and session material stay out of audit.
-- ---------------------------------------------------------------------------------------------------
CREATE VIEW audit_operations AS
SELECT jobtrail_public_id(o.id)            AS operation_id,
       o.provider, o.target, o.request_fingerprint, o.idempotency_mode, o.at_most_once,
       o.caller, o.approved_by, o.approval_ref, o.trace_id,
       o.created_at, o.create_deadline, o.result_deadline, o.cancel_deadline,
       o.state, o.state_changed_at, o.finished_at, o.escalated_at, o.escalation_reason,
       o.remote_job_id, o.conflicting_remote_job_id, o.remote_state, o.observed_at,
       o.cancel_requested_at, o.cancel_requested_by, o.cancel_reason,
       o.result_location, o.result_size, o.result_sha256, o.result_summary,
       o.create_attempts, o.poll_count, o.cancel_attempts, o.result_attempts,
       jobtrail_public_id(o.supersedes)    AS supersedes,
       jobtrail_public_id(o.superseded_by) AS superseded_by
FROM operations o;

CREATE VIEW audit_history AS
SELECT jobtrail_public_id(h.operation_id) AS operation_id, h.seq, h.at, h.actor, h.from_state,
       h.to_state, h.event, h.cause, h.remote_job_id, h.call_id, h.detail,
       encode(h.prev_hash, 'hex') AS prev_hash, encode(h.hash, 'hex') AS hash
FROM operation_history h;

CREATE VIEW audit_calls AS
SELECT c.id AS call_id, jobtrail_public_id(c.operation_id) AS operation_id, c.kind, c.attempt, c.actor,
       c.lease_epoch, c.started_at, c.duration_ms, c.method, c.url, c.http_status, c.response_headers,
       c.provider_request_id, c.error_class, c.outcome, c.trace_id, c.span_id
FROM provider_calls c;

-- One story per operation: transitions and provider calls, by time.
CREATE VIEW audit_operation_timeline AS
SELECT operation_id, at, 'transition' AS kind, actor,
       coalesce(from_state || ' -> ', '') || to_state AS what, event || ': ' || cause AS detail,
       remote_job_id, NULL::text AS provider_request_id, seq
FROM audit_history
UNION ALL
SELECT operation_id, started_at, 'call', actor,
       kind || ' #' || attempt,
       method || ' ' || url || ' -> ' || coalesce(http_status::text, error_class, '?') || ': ' || outcome,
       NULL, provider_request_id, NULL
FROM audit_calls;

-- Every recorded human decision and cancel request, with who and why.
CREATE VIEW audit_decisions AS
SELECT operation_id, seq, at, actor, from_state, to_state, event,
       coalesce(detail -> 'decision' ->> 'reason', detail ->> 'reason') AS reason, cause
FROM audit_history
WHERE event IN ('adopt_remote_job', 'declare_not_created', 'confirm_cancellation', 'choose_remote_job',
                'resume', 'abandon', 'superseded', 'cancel_requested', 'withdraw');

-- What waits for a person, oldest first.
CREATE VIEW audit_escalation_queue AS
SELECT operation_id, state, escalation_reason, escalated_at, now() - escalated_at AS age, provider,
       remote_job_id, conflicting_remote_job_id, trace_id
FROM audit_operations
WHERE escalated_at IS NOT NULL;

-- ---------------------------------------------------------------------------------------------------
-- The auditor role: reads the views, history, calls and anchors; changes nothing. (Roles are
-- cluster-wide: created once, granted per database.)
-- ---------------------------------------------------------------------------------------------------
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'jobtrail_auditor') THEN
        CREATE ROLE jobtrail_auditor NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL; -- another database's migration created it at the same moment
END $$;

GRANT USAGE ON SCHEMA public TO jobtrail_auditor;
GRANT SELECT ON audit_operations, audit_history, audit_calls, audit_operation_timeline, audit_decisions,
                audit_escalation_queue, audit_anchors, audit_anchor_heads, operation_history,
                provider_calls TO jobtrail_auditor;
GRANT EXECUTE ON FUNCTION jobtrail_public_id(uuid) TO jobtrail_auditor;
