-- A history link is dated by the database's clock. Every write path stamps a link with the
-- transaction's `now()` (the time the row lock was taken), but the column took any value a writer
-- role sent: the worker's or the API's credentials could append a well-hashed link dated last week,
-- and `audit verify` has no way to tell. A link's `at` must now lie within a minute of the database's
-- clock when it is written: no earlier than a minute before the transaction began, no later than a
-- minute after the statement ran. (The minute is room for a writer that stamps a link with the time
-- of a query it made just before, never a policy for skewed hosts: no write path uses a host's
-- clock.) One statement-level check over the links a statement inserted, like the chain check.
CREATE FUNCTION jobtrail_history_dated_by_the_database() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER operation_history_dated_by_the_database AFTER INSERT ON operation_history
    REFERENCING NEW TABLE AS new_links
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_history_dated_by_the_database();
