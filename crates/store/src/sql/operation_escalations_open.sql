-- Escalations open and the oldest one's time (metrics; the partial index on escalated_at serves it).
SELECT count(*), min(escalated_at) FROM operations WHERE escalated_at IS NOT NULL
