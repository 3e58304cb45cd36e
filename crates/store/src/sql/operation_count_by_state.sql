-- Operations per state and provider (stats, the demo's report).
SELECT state, provider, count(*) AS n FROM operations GROUP BY state, provider ORDER BY state, provider
