-- The bytes of one kept result (the caller checks them against the digest the operation records).
SELECT bytes FROM operation_results WHERE operation_id = $1 AND sha256 = $2
