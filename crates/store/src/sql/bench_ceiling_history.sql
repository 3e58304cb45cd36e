-- Benchmark only, the lean ceiling, statement 1 of 2 (one transaction): claim up to $1 due rows with
-- SKIP LOCKED and append one history link each, chained from the row's head. Statement 2
-- (bench_ceiling_advance.sql) moves each head to its new link, as the chain triggers require.
WITH due AS (
    SELECT o.id, o.history_seq, o.history_head
    FROM operation_schedule q
    JOIN operations o ON o.id = q.operation_id
    WHERE q.provider = 'bench' AND q.next_action_at <= now()
      AND o.next_action_at <= now()
      AND o.state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                      'result_collecting', 'cancel_requested', 'cancelling')
    ORDER BY q.next_action_at
    LIMIT $1
    FOR UPDATE OF o SKIP LOCKED
)
INSERT INTO operation_history (operation_id, seq, at, actor, from_state, to_state, event, cause, detail,
                               prev_hash, hash)
SELECT id, history_seq + 1, now(), 'bench', 'observing', 'observing', 'remote_progress', 'bench', '{}',
       history_head, sha256(history_head)
FROM due
RETURNING operation_id
