-- Least-privilege roles, and history that can only grow as a chain.
-- Never edit this file once landed: add a new migration instead.
--
-- The role that runs `jobtrail migrate` owns every table: only it can change the schema or disable a
-- trigger, and no other jobtrail command needs DDL rights (they check the schema version and refuse
-- to run when it is behind or ahead). The group roles below get exactly what their commands need:
--
--   jobtrail_worker    `jobtrail worker`: claim, step, log calls, keep result bytes
--   jobtrail_operator  `jobtrail-admin`: decisions, retries, anchors, escalations, stats, verify
--   jobtrail_api       the agent-facing commands (`jobtrail submit|show|cancel|wait|result`) and the
--                      HTTP API: submit and cancel, read what they submitted
--   jobtrail_auditor   read-only: the audit views, history, calls, anchors (created in 0002)
--
-- None of them may UPDATE, DELETE or TRUNCATE evidence (history, calls, result bytes, anchors), or
-- change the facts an operation was submitted with (caller, approver, approval reference, provider,
-- target, body, fingerprint, token, trace id). They are NOLOGIN: create login roles IN ROLE one of
-- them (docs/roles.md).

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['jobtrail_worker', 'jobtrail_operator', 'jobtrail_api', 'jobtrail_auditor'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL; -- another database's migration created them at the same moment (roles are cluster-wide)
END $$;

-- Nobody but the owner creates objects in the schema (PostgreSQL 15 already revokes this from PUBLIC;
-- older servers did not).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

-- Every role reads which migrations are applied: the schema check at start.
GRANT USAGE ON SCHEMA public TO jobtrail_worker, jobtrail_operator, jobtrail_api, jobtrail_auditor;
GRANT SELECT ON _sqlx_migrations TO jobtrail_worker, jobtrail_operator, jobtrail_api, jobtrail_auditor;

-- The columns a step may change. Everything else on an operation is a submitted fact.
GRANT SELECT ON operations TO jobtrail_worker, jobtrail_operator, jobtrail_api;
GRANT UPDATE (
    state, state_changed_at, finished_at, escalated_at, escalation_reason,
    remote_job_id, conflicting_remote_job_id, remote_state, remote_updated_at, remote_progress,
    observed_at, status_url, provider_context, next_action_at, next_action_reason,
    create_attempts, create_sent_epoch, poll_count, poll_not_before, failure_count, cancel_attempts,
    result_attempts, reconcile_attempts, lease_owner, lease_expires_at, lease_epoch,
    cancel_requested_at, cancel_requested_by, cancel_reason, cancel_deadline,
    result_location, result_size, result_sha256, result_content_type, result_summary,
    superseded_by, result_deadline, create_deadline, history_seq, history_head
) ON operations TO jobtrail_worker, jobtrail_operator, jobtrail_api;
-- New operations: submit (api) and retry (operator).
GRANT INSERT ON operations TO jobtrail_operator, jobtrail_api;

-- Evidence: appended, read, never changed (the append-only triggers refuse it for the owner too).
GRANT SELECT, INSERT ON operation_history TO jobtrail_worker, jobtrail_operator, jobtrail_api;
GRANT SELECT, INSERT ON provider_calls TO jobtrail_worker;
GRANT SELECT ON provider_calls TO jobtrail_operator, jobtrail_api;
GRANT SELECT, INSERT ON operation_results TO jobtrail_worker;
GRANT SELECT ON operation_results TO jobtrail_operator, jobtrail_api;
GRANT SELECT, INSERT ON audit_anchors, audit_anchor_heads TO jobtrail_operator;
GRANT USAGE ON SEQUENCE audit_anchors_id_seq TO jobtrail_operator;
GRANT EXECUTE ON FUNCTION jobtrail_public_id(uuid) TO jobtrail_worker, jobtrail_operator, jobtrail_api;
GRANT SELECT ON audit_operations, audit_history, audit_calls, audit_operation_timeline, audit_decisions,
                audit_escalation_queue TO jobtrail_operator;
-- `audit verify` as an auditor: chain heads and the submitted facts the chain commits to, never the
-- request body or the provider context.
GRANT SELECT (id, provider, target, request_fingerprint, idempotency_mode, at_most_once, caller,
              approved_by, approval_ref, trace_id, created_at, state, remote_job_id, result_location,
              result_size, result_sha256, supersedes, history_seq, history_head)
    ON operations TO jobtrail_auditor;

-- ---------------------------------------------------------------------------------------------------
-- Work notifications go to a channel whose name is a random token only the writing roles can read.
-- PostgreSQL has no privilege for NOTIFY: any role that can connect may notify any channel. With a
-- secret name, a role that cannot read it (an auditor) cannot reach the workers. Notifications stay
-- hints either way: a worker woken for nothing scans the due index and finds nothing.
-- ---------------------------------------------------------------------------------------------------
CREATE TABLE jobtrail_settings (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO jobtrail_settings (key, value)
VALUES ('work_channel', 'jobtrail_work_' || md5(random()::text || clock_timestamp()::text));
GRANT SELECT ON jobtrail_settings TO jobtrail_worker, jobtrail_operator, jobtrail_api;

-- ---------------------------------------------------------------------------------------------------
-- Separation of duties, in the schema: which role may record which event. A person's decisions need
-- the operator role; a submission the api (or operator, for a retry) role; a cancel request any of
-- the three; everything a provider said, the worker role. The owner (and a superuser) may record
-- anything: it could disable these triggers anyway.
-- ---------------------------------------------------------------------------------------------------
CREATE FUNCTION jobtrail_may_record(event text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'operation_history'::regclass), 'MEMBER')
        OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
        OR CASE
            WHEN event IN ('adopt_remote_job', 'declare_not_created', 'confirm_cancellation',
                           'choose_remote_job', 'resume', 'abandon', 'superseded')
                THEN pg_has_role(current_user, 'jobtrail_operator', 'MEMBER')
            WHEN event = 'submitted'
                THEN pg_has_role(current_user, 'jobtrail_api', 'MEMBER')
                  OR pg_has_role(current_user, 'jobtrail_operator', 'MEMBER')
            WHEN event IN ('cancel_requested', 'withdraw')
                THEN pg_has_role(current_user, 'jobtrail_api', 'MEMBER')
                  OR pg_has_role(current_user, 'jobtrail_operator', 'MEMBER')
                  OR pg_has_role(current_user, 'jobtrail_worker', 'MEMBER')
            ELSE pg_has_role(current_user, 'jobtrail_worker', 'MEMBER')
        END
$$;

-- ---------------------------------------------------------------------------------------------------
-- History grows only as a chain from the operation's current head, whoever inserts: a new link's seq
-- follows the head's and its prev_hash is the head's hash (the first link, written with its
-- operation, starts from the all-zero genesis and is the head), and its event is one the inserting
-- role may record. The hash itself is computed by the one write path (the JCS form of the link, in
-- Rust) and recomputed by `audit verify`, which also finds a head or a state moved without its link.
-- One check per statement, set-based over the statement's new links (a worker's group commit appends
-- dozens at once); only the table owner could disable it.
-- ---------------------------------------------------------------------------------------------------
CREATE FUNCTION jobtrail_history_continues_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ev  text;
    bad record;
BEGIN
    FOR ev IN SELECT DISTINCT event FROM new_links LOOP
        IF NOT jobtrail_may_record(ev) THEN
            RAISE EXCEPTION 'jobtrail: role % may not record % events', current_user, ev
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END LOOP;
    SELECT n.operation_id, n.seq, o.history_seq AS head_seq INTO bad
    FROM new_links n
    LEFT JOIN operations o ON o.id = n.operation_id
    WHERE o.id IS NULL
       OR (n.seq = 1 AND (o.history_seq <> 1 OR o.history_head <> n.hash
                          OR n.prev_hash <> decode(repeat('00', 32), 'hex')))
       OR (n.seq > 1 AND (n.seq <> o.history_seq + 1 OR n.prev_hash <> o.history_head))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'jobtrail: history link %/% does not continue the chain (head #%)',
            bad.operation_id, bad.seq, bad.head_seq
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER operation_history_continues_chain AFTER INSERT ON operation_history
    REFERENCING NEW TABLE AS new_links
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_history_continues_chain();
