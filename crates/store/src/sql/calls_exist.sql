-- Which of these planned call rows exist: did writes whose commit answer was lost, and which wrote
-- no history link (a call logged on its own: a lookup before a resend), commit after all? A call
-- row, once there, stays (the call log is append-only).
SELECT id FROM provider_calls WHERE id = ANY($1::uuid[])
