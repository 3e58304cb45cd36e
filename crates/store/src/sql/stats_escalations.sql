-- The escalation queue's size and its oldest entry.
SELECT count(*) AS n, min(escalated_at) AS oldest FROM operations WHERE escalated_at IS NOT NULL
