-- Another operation of this provider that holds this remote job (as its job, or as the other answer
-- of a contract violation). Run for every job a worker records: both columns are indexed (hash
-- indexes, migrations 0016 and 0030).
SELECT id FROM operations
WHERE provider = $1 AND (remote_job_id = $2 OR conflicting_remote_job_id = $2) AND id <> $3
LIMIT 1
