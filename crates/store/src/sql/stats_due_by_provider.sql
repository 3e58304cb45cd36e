-- Per provider, the operations a worker should be acting on now (due, or past the end of a lease
-- whose owner is gone) and how long the oldest has waited, by the database's clock. A provider
-- whose oldest keeps growing has no worker claiming it: none running, none that loads its contract
-- (renamed or removed), a pause after a 429, or a fleet too small for its work. Through the
-- schedule (migration 0012): only operations a worker still acts on, however many rows are done.
SELECT provider, count(*) AS due,
       extract(epoch FROM now() - min(next_action_at))::float8 AS oldest_secs
FROM operation_schedule
WHERE next_action_at <= now()
GROUP BY provider
ORDER BY provider
