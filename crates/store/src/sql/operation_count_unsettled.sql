-- Operations a worker still has to act on (neither terminal nor held for a person).
SELECT count(*) FROM operations
WHERE state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                'result_collecting', 'cancel_requested', 'cancelling')
