-- Dead tuples in the operations table (what autovacuum has not reclaimed yet).
SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relname = 'operations'
