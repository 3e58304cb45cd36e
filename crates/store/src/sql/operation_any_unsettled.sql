-- Is any operation left for workers (neither terminal nor held for a person)? Exactly: is the
-- schedule (migration 0012) non-empty.
SELECT EXISTS (SELECT 1 FROM operation_schedule)
