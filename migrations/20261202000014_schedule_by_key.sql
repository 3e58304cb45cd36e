-- The schedule trigger finds the rows it removes by key. Never edit this file once landed.
--
-- Migration 0012's trigger deleted with a join against the statement's changed rows. PL/pgSQL keeps
-- the plan it makes for that join for as long as the session lives, made from the statistics of
-- that moment: a worker session that first fired it while the schedule looked small (freshly
-- migrated, or analysed while drained) joined by reading the whole schedule on every claim and
-- every step afterwards. The keys are now gathered into an array first and deleted through the
-- primary key, which is the cheap plan whatever the statistics say. Same function, same rights,
-- same triggers; only the DELETE changes.
CREATE OR REPLACE FUNCTION jobtrail_schedule_follows() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    DELETE FROM public.operation_schedule s
    WHERE s.operation_id = ANY (ARRAY(
        SELECT c.id FROM changed_rows c
        WHERE c.state NOT IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted',
                              'observing', 'result_collecting', 'cancel_requested', 'cancelling')));
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
