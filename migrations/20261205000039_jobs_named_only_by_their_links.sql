-- Which job an operation follows, and what the provider told it, change only as the chain says.
--
-- Every writer role may UPDATE the columns a step changes, because one statement writes a step's
-- whole row (operation_update_locked.sql). So the API server's login (the one facing the network)
-- could set an operation's `remote_job_id` to another caller's job, or its `status_url` to
-- another job's URL, with no link: the next worker step then copied the job into its own link
-- (`audit verify` found the chain whole) and the operation collected the other caller's result.
--
-- * An operation's job changes only with a link that names it, written in the same transaction:
--   the row's new head link carries the new job and records an event that names a job (the
--   provider's answer to a create, a contract violation, a person's adopt or choice). Whoever
--   writes, the owner aside (who could disable this anyway). `audit verify` checks the same along
--   every chain (a link whose job differs from the one before, without such an event).
-- * What only a provider's answer or the worker sets (the job, its URL, the provider's context
--   and cookies, the create's send mark, the result's place, digest and summary) is never changed
--   by a login that is only the API's: the API submits, cancels and records retries.
--
-- And an agent's retry through the API (`supersedes`) was refused under the API's own login: the
-- superseded operation's `superseded` link was a person's event only. The API's login may now
-- record it on an operation that an operation names as the one it supersedes (that insert comes
-- first, in the same transaction); the unique index of the next migration keeps it to one.
--
-- Never edit this file once landed: add a new migration instead.

CREATE OR REPLACE FUNCTION jobtrail_history_continues_chain() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    ev  text;
    bad record;
BEGIN
    FOR ev IN SELECT DISTINCT event FROM new_links LOOP
        IF NOT jobtrail_may_record(ev)
           AND NOT (ev = 'superseded'
                    AND pg_has_role(current_user, 'jobtrail_api', 'MEMBER')
                    AND NOT EXISTS (SELECT 1 FROM new_links n
                                    WHERE n.event = 'superseded'
                                      AND NOT EXISTS (SELECT 1 FROM operations r
                                                      WHERE r.supersedes = n.operation_id))) THEN
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

-- Whether the session may do anything the schema allows: the tables' owner, or a superuser.
CREATE FUNCTION jobtrail_is_owner() RETURNS boolean LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    RETURN pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'operations'::regclass), 'MEMBER')
        OR coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false);
END $$;

CREATE FUNCTION jobtrail_job_named_by_its_link() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF jobtrail_is_owner() THEN
        RETURN NEW;
    END IF;
    IF NEW.history_seq <= OLD.history_seq OR NOT EXISTS (
        SELECT 1 FROM operation_history h
        WHERE h.operation_id = NEW.id AND h.seq = NEW.history_seq AND h.hash = NEW.history_head
          AND h.remote_job_id IS NOT DISTINCT FROM NEW.remote_job_id
          AND h.event IN ('create_accepted', 'create_completed', 'contract_violated',
                          'adopt_remote_job', 'choose_remote_job')) THEN
        RAISE EXCEPTION 'jobtrail: operation %''s job may change only with a link that names it', NEW.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER operations_job_named_by_its_link BEFORE UPDATE ON operations
    FOR EACH ROW WHEN (OLD.remote_job_id IS DISTINCT FROM NEW.remote_job_id)
    EXECUTE FUNCTION jobtrail_job_named_by_its_link();

CREATE FUNCTION jobtrail_provider_facts_not_from_the_api() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF NOT pg_has_role(current_user, 'jobtrail_worker', 'MEMBER')
       AND NOT pg_has_role(current_user, 'jobtrail_operator', 'MEMBER')
       AND NOT jobtrail_is_owner() THEN
        RAISE EXCEPTION 'jobtrail: role % may not change what the provider said about operation %', current_user, NEW.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER operations_provider_facts_not_from_the_api BEFORE UPDATE ON operations
    -- The role is asked first: a worker's login, whose steps change these columns all the time,
    -- never calls the function.
    FOR EACH ROW WHEN (pg_has_role(current_user, 'jobtrail_api', 'MEMBER') AND (
        OLD.remote_job_id IS DISTINCT FROM NEW.remote_job_id
        OR OLD.conflicting_remote_job_id IS DISTINCT FROM NEW.conflicting_remote_job_id
        OR OLD.status_url IS DISTINCT FROM NEW.status_url
        OR OLD.provider_context IS DISTINCT FROM NEW.provider_context
        OR OLD.create_sent_epoch IS DISTINCT FROM NEW.create_sent_epoch
        OR OLD.remote_state IS DISTINCT FROM NEW.remote_state
        OR OLD.result_location IS DISTINCT FROM NEW.result_location
        OR OLD.result_size IS DISTINCT FROM NEW.result_size
        OR OLD.result_sha256 IS DISTINCT FROM NEW.result_sha256
        OR OLD.result_content_type IS DISTINCT FROM NEW.result_content_type
        OR OLD.result_summary IS DISTINCT FROM NEW.result_summary))
    EXECUTE FUNCTION jobtrail_provider_facts_not_from_the_api();
