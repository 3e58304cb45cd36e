-- Does this database (by the connection's search path) have jobtrail's operations table yet?
SELECT to_regclass('operations') IS NOT NULL
