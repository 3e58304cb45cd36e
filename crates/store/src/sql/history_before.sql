-- A page of an operation's history: up to $3 links before seq $2 (from the newest when NULL),
-- newest first (the caller puts them back in chain order).
-- Columns by name, never `*`: a column a later migration adds must not change what this
-- statement returns, or a running pod's prepared copy of it fails ("cached plan must not change
-- result type") until its connection is replaced.
SELECT
    operation_id, seq, at, actor, from_state, to_state, event, cause, remote_job_id, call_id,
    detail, prev_hash, hash, recorded_by
FROM operation_history
WHERE operation_id = $1 AND ($2::bigint IS NULL OR seq < $2)
ORDER BY seq DESC
LIMIT $3
