-- The operation of this provider that holds this remote job, and its state: the unfinished one
-- where a finished one had the job before (a resource the caller names, updated again).
SELECT id, state FROM operations
WHERE provider = $1 AND remote_job_id = $2
ORDER BY finished_at IS NOT NULL, id DESC
LIMIT 1
