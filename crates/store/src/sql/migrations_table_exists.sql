-- Does this database (by the connection's search path) have sqlx's migration bookkeeping table?
SELECT to_regclass('_sqlx_migrations') IS NOT NULL
