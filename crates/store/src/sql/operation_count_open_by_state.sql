-- Operations in the given (non-terminal) states, per state and provider: the metrics' gauge. The
-- operations_state index serves it, however many terminal rows the table holds.
SELECT state, provider, count(*) AS n FROM operations WHERE state = ANY ($1::text[])
GROUP BY state, provider
