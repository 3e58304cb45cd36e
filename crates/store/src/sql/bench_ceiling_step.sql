-- Benchmark only: the database's ceiling for jobtrail's write pattern, in ONE transaction — claim up
-- to $1 due rows with SKIP LOCKED, a fenced update of each (new epoch, next action, chain head), and
-- one history row each. jobtrail itself spreads this over a claim and a write transaction.
WITH due AS (
    SELECT id FROM operations
    WHERE next_action_at <= now()
      AND state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                    'result_collecting', 'cancel_requested', 'cancelling')
    ORDER BY next_action_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE operations o
    SET lease_epoch = o.lease_epoch + 1, poll_count = o.poll_count + 1,
        next_action_at = now(), history_seq = o.history_seq + 1,
        history_head = sha256(o.history_head)
    FROM due WHERE o.id = due.id
    RETURNING o.id, o.history_seq, o.history_head
)
INSERT INTO operation_history (operation_id, seq, at, actor, from_state, to_state, event, cause, detail,
                               prev_hash, hash)
SELECT id, history_seq, now(), 'bench', 'observing', 'observing', 'remote_progress', 'bench', '{}',
       history_head, sha256(history_head)
FROM upd
