-- The operation of this provider that holds this remote job, and its state.
SELECT id, state FROM operations
WHERE provider = $1 AND remote_job_id = $2
LIMIT 1
