-- Benchmark only: statistics for the freshly seeded tables, as autovacuum keeps them in a steady
-- state. Planned from the statistics of the emptier tables, a claim of ten rows (and the schedule
-- trigger its update fires) read every due row: the ceiling measured the stale plan, not the
-- database (docs/benchmark.md).
ANALYZE operations, operation_schedule
