-- Is any operation left for workers (neither terminal nor held for a person)? The ORDER BY/LIMIT
-- makes the plan read the due index (same predicate), at most one entry: a bare EXISTS let the planner
-- pick a sequential scan from stale statistics, which reads every finished row first.
SELECT EXISTS (
    SELECT 1 FROM operations
    WHERE state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                    'result_collecting', 'cancel_requested', 'cancelling')
    ORDER BY next_action_at
    LIMIT 1
)
