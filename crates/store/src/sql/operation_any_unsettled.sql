-- Is any operation left for workers (neither terminal nor held for a person)? Reads at most one entry
-- of the due index (same predicate), so polling it is cheap however large the table is.
SELECT EXISTS (
    SELECT 1 FROM operations
    WHERE state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                    'result_collecting', 'cancel_requested', 'cancelling')
)
