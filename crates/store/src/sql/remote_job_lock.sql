-- One decision at a time names a given remote job (held until commit): two people adopting the
-- same job onto two operations at once cannot each see it unowned.
SELECT pg_advisory_xact_lock(hashtextextended('jobtrail.remote_job:' || $1 || ':' || $2, 0))
