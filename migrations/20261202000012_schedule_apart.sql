-- The schedule apart from the record, so that step updates are HOT. Never edit this file once landed.
--
-- Every claim and every step moves an operation's next_action_at. While the due index was on
-- operations itself, none of those updates could be HOT: each wrote a new version of the whole wide
-- row plus an entry into every index of the table (7.3 updates per operation, 0 HOT). The due index
-- now lives on a narrow table with one row per operation a worker still has to act on, kept by
-- statement triggers on operations. An update of the wide row then changes no indexed column (except
-- on the step that learns the remote job id, or one that holds the operation for a person), so it can
-- be HOT, and only the narrow row (~70 bytes) is rewritten with index entries.
--
-- operations.next_action_at stays the truth: every claim re-checks it on the row it locks. This table
-- is only how due rows are found. Nobody writes it but the triggers below, which run with the owner's
-- rights; the roles read it.

-- Workers of the previous version may still be writing: hold their writes off until the triggers
-- exist, so the backfill below cannot miss a row or keep a stale one.
LOCK TABLE operations IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE operation_schedule (
    operation_id   uuid        PRIMARY KEY REFERENCES operations (id),
    provider       text        NOT NULL,
    next_action_at timestamptz NOT NULL
);
-- The claim scans one provider's due rows at a time (operation_claim_shares.sql).
CREATE INDEX operation_schedule_due ON operation_schedule (provider, next_action_at);
-- Every claim and most steps rewrite a row here (never HOT: the time is indexed): vacuum early, as
-- migration 0001 did for operations, so dead entries do not pile up where the claim reads.
ALTER TABLE operation_schedule SET (autovacuum_vacuum_scale_factor = 0.01,
                                    autovacuum_vacuum_threshold = 200,
                                    autovacuum_vacuum_cost_delay = 0);

INSERT INTO operation_schedule (operation_id, provider, next_action_at)
SELECT id, provider, next_action_at FROM operations
WHERE state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                'result_collecting', 'cancel_requested', 'cancelling');

-- One set-based pass per statement (a worker's group commit updates dozens of rows at once): rows
-- that left the automated states leave the schedule; the others are added or moved. A row whose
-- time did not change is not rewritten. The table is named with its schema and pg_temp is searched
-- last: a caller's temporary table of the same name must not receive the owner's writes (nor run a
-- trigger of its own with the owner's rights).
CREATE FUNCTION jobtrail_schedule_follows() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    DELETE FROM public.operation_schedule s
    USING changed_rows c
    WHERE s.operation_id = c.id
      AND c.state NOT IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                          'result_collecting', 'cancel_requested', 'cancelling');
    INSERT INTO public.operation_schedule AS s (operation_id, provider, next_action_at)
    SELECT c.id, c.provider, c.next_action_at
    FROM changed_rows c
    WHERE c.state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                      'result_collecting', 'cancel_requested', 'cancelling')
    ON CONFLICT (operation_id) DO UPDATE SET next_action_at = excluded.next_action_at
    WHERE s.next_action_at IS DISTINCT FROM excluded.next_action_at;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION jobtrail_schedule_follows() FROM PUBLIC;

CREATE TRIGGER operations_schedule_on_insert AFTER INSERT ON operations
    REFERENCING NEW TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_schedule_follows();
CREATE TRIGGER operations_schedule_on_update AFTER UPDATE ON operations
    REFERENCING NEW TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_schedule_follows();

-- With this index gone, no column a step moves is indexed; migration 0001's fillfactor (70) already
-- leaves room on each page for a row's next versions, which a HOT update needs.
DROP INDEX operations_due;

GRANT SELECT ON operation_schedule TO jobtrail_worker, jobtrail_operator, jobtrail_api;
