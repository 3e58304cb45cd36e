-- Benchmark only: forget this database's per-statement figures (pg_stat_statements), before a run.
SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)
