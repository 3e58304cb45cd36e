-- Transactions committed in this database as pg_stat_database counts them (read-only ones included),
-- and how many sessions named $1 (application_name) are still connected: a backend reports its counts
-- when it exits (or lazily while idle), so the caller reads once the sessions it waits for are gone.
SELECT
    d.xact_commit,
    (SELECT count(*) FROM pg_stat_activity a
     WHERE a.datname = current_database() AND a.application_name = $1) AS others
FROM pg_stat_database d
WHERE d.datname = current_database()
