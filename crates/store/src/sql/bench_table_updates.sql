-- Benchmark only: for the tables every step writes, row updates so far, how many of them were HOT
-- (no new index entries, the old version reclaimable by page pruning), dead tuples not yet reclaimed,
-- and the table's size with its indexes. Counters reach pg_stat_user_tables when a session reports
-- them: read after the workers' sessions ended.
SELECT relname::text, n_tup_upd, n_tup_hot_upd, n_dead_tup, pg_total_relation_size(relid)
FROM pg_stat_user_tables
WHERE relname IN ('operations', 'operation_schedule')
ORDER BY relname
