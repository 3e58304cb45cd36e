-- Benchmark only: who holds the lease of each operation created since $1.
SELECT id, lease_owner, lease_expires_at FROM operations WHERE created_at >= $1
