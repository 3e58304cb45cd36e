-- No move of the state machine leads back into `create_pending`: an operation is written there by
-- its submission, and a worker that finds it there sends the create. A role that may update an
-- operation's state (a worker's, the API's, the operator's login) could otherwise rewind a finished
-- or failed operation there with plain SQL and have a second paid job started, found by `audit
-- verify` only after the fact. Refused here for every role, the owner's included. Never edit this
-- file once landed: add a new migration instead.
CREATE FUNCTION jobtrail_never_back_to_create_pending() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'jobtrail: operation % may not move from % back into create_pending: no move of the state machine leads there (it would send the create again)',
        NEW.id, OLD.state
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER operations_never_back_to_create_pending
    BEFORE UPDATE OF state ON operations
    FOR EACH ROW
    WHEN (NEW.state = 'create_pending' AND OLD.state <> 'create_pending')
    EXECUTE FUNCTION jobtrail_never_back_to_create_pending();
