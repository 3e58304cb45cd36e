-- Benchmark only: the view of pg_stat_statements in this database (the server must preload it).
CREATE EXTENSION IF NOT EXISTS pg_stat_statements
