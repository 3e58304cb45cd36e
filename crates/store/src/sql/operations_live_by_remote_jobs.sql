-- For each (provider, job, operation, caller) a worker's steps name: another operation of the
-- provider that holds the job (as its job, or as the other answer of a contract violation), unless
-- it finished with the job done with and was the same caller's: a resource named by the caller
-- comes back to that caller's later operation, never to another caller's (who would read the
-- first one's result). An abandoned one still counts (its job may run on). Both job columns are
-- hash-indexed (migrations 0016 and 0030).
SELECT k.n, o.id
FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[])
    WITH ORDINALITY AS k(provider, job, me, caller, n)
CROSS JOIN LATERAL (
    SELECT id FROM operations
    WHERE provider = k.provider
      AND (remote_job_id = k.job OR conflicting_remote_job_id = k.job)
      AND id <> k.me
      AND (finished_at IS NULL OR state = 'abandoned' OR caller <> k.caller)
    LIMIT 1
) o
