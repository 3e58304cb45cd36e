-- Benchmark only: an `abandon` link for every unfinished operation created since $1, chained from its
-- head (the chain triggers allow no state change without one). The hash is a stand-in: benchmark
-- databases do not verify. bench_retire_since.sql then moves state and head together.
WITH unfinished AS (
    SELECT id, state, history_seq, history_head FROM operations
    WHERE created_at >= $1 AND finished_at IS NULL
    FOR UPDATE
)
INSERT INTO operation_history (operation_id, seq, at, actor, from_state, to_state, event, cause, detail,
                               prev_hash, hash)
SELECT id, history_seq + 1, now(), 'bench', state, 'abandoned', 'abandon', 'benchmark cleanup', '{}',
       history_head, sha256(history_head)
FROM unfinished
RETURNING operation_id
