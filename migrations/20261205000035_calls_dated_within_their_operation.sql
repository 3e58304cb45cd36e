-- A provider call is dated by the worker that made it (the database's clock as read at its claim or
-- last write, plus its own monotonic clock since: a call's start is only known to the one who made
-- it), and nothing bounded the date: a writer role could log a well-hashed call dated a year
-- before its operation existed, or ending next week. A call must now start no earlier than its
-- operation was submitted and end no later than the database's clock when it is logged, each
-- within five minutes (room for a worker's reading of the database's clock, taken across a round
-- trip that may itself last a minute; never a policy for skewed hosts: no write path uses a host's
-- clock). Within those bounds a call's time remains its writer's word (docs/audit.md says so). One
-- statement-level check over the calls a statement inserted, like the history's date check; it
-- reads each call's operation by its key. Never edit this file once landed: add a new migration.
CREATE FUNCTION jobtrail_calls_dated_within_their_operation() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    bad record;
BEGIN
    SELECT n.operation_id, n.seq, n.started_at, n.duration_ms, o.created_at INTO bad
    FROM new_calls n
    JOIN operations o ON o.id = n.operation_id
    WHERE n.started_at < o.created_at - interval '5 minutes'
       OR n.started_at + n.duration_ms * interval '1 millisecond'
          > clock_timestamp() + interval '5 minutes'
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'jobtrail: provider call %/% is dated % (lasting % ms), outside its operation''s life (submitted %, now %)',
            bad.operation_id, bad.seq, bad.started_at, bad.duration_ms, bad.created_at, clock_timestamp()
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER provider_calls_dated_within_their_operation AFTER INSERT ON provider_calls
    REFERENCING NEW TABLE AS new_calls
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_calls_dated_within_their_operation();
