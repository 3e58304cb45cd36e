-- Benchmark only: whether the server records per-statement database time (pg_stat_statements in
-- shared_preload_libraries: it cannot be loaded later) and the extension can be created here.
SELECT EXISTS (SELECT 1 FROM pg_settings
               WHERE name = 'shared_preload_libraries' AND setting ~ '(^|,)\s*pg_stat_statements\s*(,|$)')
   AND EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements')
