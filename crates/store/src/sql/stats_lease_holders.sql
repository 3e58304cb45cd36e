-- Who holds leases now, and how many of them have expired (a dead worker, until taken over).
SELECT lease_owner, count(*) AS held, count(*) FILTER (WHERE lease_expires_at <= now()) AS expired
FROM operations WHERE lease_owner IS NOT NULL GROUP BY lease_owner ORDER BY lease_owner
