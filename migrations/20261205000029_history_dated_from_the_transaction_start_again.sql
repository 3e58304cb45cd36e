-- Migration 0028 held a history link's date to a minute of the clock when the link is inserted. The
-- engine stamps a link with its transaction's `now()`, and some of its transactions take longer
-- than a minute before their links are inserted (a batch submit of a thousand operations waiting on
-- locks; a worker's group commit writing large results before its links): 0028 refused those, and
-- nothing retried them. The check is back to migration 0021's: no earlier than a minute before the
-- writing transaction began. A writer role that keeps a transaction open can therefore date a link
-- as far back as it kept it open (docs/audit.md says so). The search path stays as migration 0027
-- set it. Never edit this file once landed: add a new migration instead.
CREATE OR REPLACE FUNCTION jobtrail_history_dated_by_the_database() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    bad record;
BEGIN
    SELECT n.operation_id, n.seq, n.at INTO bad
    FROM new_links n
    WHERE n.at < now() - interval '1 minute' OR n.at > clock_timestamp() + interval '1 minute'
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'jobtrail: history link %/% is dated %, not by the database''s clock (now %)',
            bad.operation_id, bad.seq, bad.at, clock_timestamp()
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END $$;
