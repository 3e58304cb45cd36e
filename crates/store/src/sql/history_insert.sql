-- Append one link of an operation's hash chain. (operation_id, seq) is the primary key, so two
-- writers can never both append link n.
INSERT INTO operation_history (
    operation_id, seq, at, actor, from_state, to_state, event, cause, remote_job_id, call_id, detail,
    prev_hash, hash
) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
