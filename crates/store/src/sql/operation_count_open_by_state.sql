-- Operations in the given (non-terminal) states, per state and provider: the metrics' gauge. Those a
-- worker still acts on are found through the schedule (migration 0012), those held for a person
-- through the partial escalation index (held exactly when escalated_at is set), however many
-- terminal rows the table holds.
SELECT o.state, o.provider, count(*) AS n
FROM operation_schedule q
JOIN operations o ON o.id = q.operation_id
WHERE o.state = ANY ($1::text[])
GROUP BY o.state, o.provider
UNION ALL
SELECT state, provider, count(*) AS n
FROM operations
WHERE escalated_at IS NOT NULL AND state = ANY ($1::text[])
GROUP BY state, provider
