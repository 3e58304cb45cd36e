-- Benchmark only: $1 synthetic operations in state $2 ('observing' rows are due at once; 'succeeded'
-- rows are terminal ballast). Their history is not written, so a benchmark database does not verify.
INSERT INTO operations (
    id, provider, target, request_body, request_fingerprint, idempotency_token, idempotency_mode,
    at_most_once, caller, approved_by, trace_id, created_at, create_deadline, result_deadline,
    cancel_window_ms, state, state_changed_at, finished_at, remote_job_id, next_action_at,
    next_action_reason, result_location, result_size, result_sha256, history_seq, history_head
)
SELECT gen_random_uuid(), 'bench', 'bench', '{}'::jsonb,
       'sha256:' || encode(sha256(convert_to(g::text || random()::text, 'UTF8')), 'hex'),
       'idem_' || md5(g::text || random()::text), 'header', true, 'bench', 'bench',
       md5(random()::text || g::text), now(), now() + interval '1 hour', now() + interval '2 hours',
       60000, $2, now(),
       CASE WHEN $2 = 'succeeded' THEN now() END,
       'job_' || g,
       now() - interval '1 second' * random(),
       'bench',
       CASE WHEN $2 = 'succeeded' THEN 'file:///dev/null' END,
       CASE WHEN $2 = 'succeeded' THEN 0 END,
       CASE WHEN $2 = 'succeeded' THEN repeat('0', 64) END,
       1, sha256(convert_to(g::text, 'UTF8'))
FROM generate_series(1, $1) AS g
