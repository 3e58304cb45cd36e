-- Operations a worker still has to act on (neither terminal nor held for a person): exactly the rows
-- of the schedule (migration 0012 keeps it so).
SELECT count(*) FROM operation_schedule
