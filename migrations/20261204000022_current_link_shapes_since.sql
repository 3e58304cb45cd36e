-- Since when this database's writers are all of a build that records links in their current shapes
-- (a resume that says which deadlines it moved; no move by a rule since retired). `audit verify`
-- excuses an older shape only in a link dated before it: links are dated by the database's clock
-- (migration 0021), so a writer role cannot pass a link written today as an earlier build's. A
-- binary that does not know this migration refuses to start against it, so from here on every
-- writer is such a build (one still running through the rollout that applies this is the one
-- exception: a link it writes meanwhile in an older shape is reported).
CREATE TABLE jobtrail_cutovers (
    name  text PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT now() CHECK (isfinite(since))
);
INSERT INTO jobtrail_cutovers (name) VALUES ('current_link_shapes');
CREATE TRIGGER jobtrail_cutovers_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON jobtrail_cutovers
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_refuse_change();
GRANT SELECT ON jobtrail_cutovers TO jobtrail_worker, jobtrail_api, jobtrail_operator, jobtrail_auditor;
