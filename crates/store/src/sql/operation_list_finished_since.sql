-- Operations of a run: id, state, when they finished (for latency and throughput figures).
SELECT id, state, finished_at FROM operations WHERE created_at >= $1 ORDER BY created_at
