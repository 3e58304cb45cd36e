-- A history link's date was held to a minute of the database's clock at the start of the writing
-- transaction (`now()`): a writer role that kept a transaction open (`pg_sleep`, or a rolling set
-- of open transactions) could append a link dated as far back as it had waited. It is now held to
-- a minute of the clock when the link is inserted (`clock_timestamp()`, at the end of the
-- statement): whatever a transaction waited for, no link lands dated more than a minute before it
-- was written. The engine stamps a link with its transaction's `now()` a moment earlier; a step
-- whose transaction waited more than a minute for its row is refused, and retried as a new one.
-- The search path stays as migration 0027 set it. Never edit this file once landed: add a new
-- migration instead.
CREATE OR REPLACE FUNCTION jobtrail_history_dated_by_the_database() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    bad record;
BEGIN
    SELECT n.operation_id, n.seq, n.at INTO bad
    FROM new_links n
    WHERE n.at < clock_timestamp() - interval '1 minute'
       OR n.at > clock_timestamp() + interval '1 minute'
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'jobtrail: history link %/% is dated %, not by the database''s clock (now %)',
            bad.operation_id, bad.seq, bad.at, clock_timestamp()
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END $$;
