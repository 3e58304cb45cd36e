-- A token revoked stays revoked, as it was revoked. The operator's login may set `revoked_at` and
-- `revoked_by` (that is how a token is revoked), and the write path sets them only on a token not
-- yet revoked (token_revoke.sql); but a login with the same grant could set them back to NULL with
-- SQL of its own, and a leaked token would work again with no trace. Now no login but the owner,
-- who could disable this, changes a revocation once made. Never edit this file once landed: add a
-- new migration instead.
CREATE FUNCTION jobtrail_revoked_for_good() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'jobtrail: token % was revoked at % by %; a revocation is never undone or rewritten',
        OLD.id, OLD.revoked_at, OLD.revoked_by
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER api_tokens_revoked_for_good BEFORE UPDATE ON api_tokens
    FOR EACH ROW WHEN (OLD.revoked_at IS NOT NULL AND (NEW.revoked_at IS DISTINCT FROM OLD.revoked_at
                                                        OR NEW.revoked_by IS DISTINCT FROM OLD.revoked_by))
    EXECUTE FUNCTION jobtrail_revoked_for_good();
