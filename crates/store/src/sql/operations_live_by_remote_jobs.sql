-- For each (provider, job, operation) a worker's steps name: another operation of the provider,
-- not finished, that holds the job (as its job, or as the other answer of a contract violation).
-- A finished one may have had it: a resource named by the caller, updated by a later operation.
-- Both job columns are hash-indexed (migrations 0016 and 0030).
SELECT k.n, o.id
FROM unnest($1::text[], $2::text[], $3::uuid[]) WITH ORDINALITY AS k(provider, job, me, n)
CROSS JOIN LATERAL (
    SELECT id FROM operations
    WHERE provider = k.provider
      AND (remote_job_id = k.job OR conflicting_remote_job_id = k.job)
      AND id <> k.me
      AND finished_at IS NULL
    LIMIT 1
) o
