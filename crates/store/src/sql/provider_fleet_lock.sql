-- Serialise claims of fleet-capped providers for this transaction (names sorted by the caller: every
-- claimer takes the locks in one order). The claim that follows counts leases in a fresh snapshot.
SELECT pg_advisory_xact_lock(hashtextextended('jobtrail.provider_fleet:' || name, 0))
FROM unnest($1::text[]) AS name
