-- The locks of the remote jobs a worker's steps name (held until commit), taken in the order given
-- (the caller sorts them, so two transactions naming the same jobs cannot wait on each other);
-- the same lock as `remote_job_lock.sql`, which a person's decision takes.
SELECT pg_advisory_xact_lock(hashtextextended('jobtrail.remote_job:' || k.provider || ':' || k.job, 0))
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(provider, job, n)
ORDER BY k.n
