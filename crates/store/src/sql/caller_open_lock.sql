-- One submit at a time per caller counts and adds to its open operations (held until commit), so
-- two servers cannot each see room for the last one.
SELECT pg_advisory_xact_lock(hashtextextended('jobtrail.caller_open:' || $1, 0))
