-- Committed transactions in this database so far (pg_stat_database).
SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()
