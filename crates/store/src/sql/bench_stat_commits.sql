-- Transactions committed in this database as pg_stat_database counts them (read-only ones included),
-- and how many other client sessions are connected to it: a backend reports its counts when it exits
-- (or lazily while idle), so the caller reads once the sessions it waited for have gone.
SELECT
    d.xact_commit,
    (SELECT count(*) FROM pg_stat_activity a
     WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
       AND a.backend_type = 'client backend') AS others
FROM pg_stat_database d
WHERE d.datname = current_database()
