-- The worker's claim: due, automated operations of the providers this worker drives, each provider
-- up to its own cap ($6, after the fleet-wide cap $7 is counted against leases held right now) and
-- not while the provider has told the fleet to wait (a 429 with Retry-After, provider_throttles).
-- Within the batch ($2) each provider's first `fair` ($5) rows come before anyone's extra rows, so a
-- provider with a deep queue cannot push out another with due work. Extra rows, all providers' together,
-- leave every provider its `reserve` ($8: the slots kept for its next due work, less its fair rows
-- in this claim) out of the worker's free slots ($9): two providers borrowing at once cannot take
-- a third's reserve between them. Rows are locked with SKIP LOCKED
-- inside each provider's scan (concurrent claimers take disjoint rows); rows locked but not chosen
-- are released at commit.
--
-- Due rows are found through operation_schedule (migration 0012: the due index on a narrow table, so
-- updates of the wide row stay HOT); every condition is checked again on the operations row itself,
-- which is what is locked: a schedule row read before another claim committed cannot claim a row
-- that is no longer due.
--
-- What a claim sets, and why, as in operation_claim_due_any.sql: owner, expiry, a new fencing epoch,
-- next_action_at moved to the expiry (a dead owner's rows come due exactly when its lease ends), and
-- the create_pending row's "a create may leave under this epoch" mark in this same commit.
-- Columns by name, never `*`: a column a later migration adds must not change what this
-- statement returns, or a running pod's prepared copy of it fails ("cached plan must not change
-- result type") until its connection is replaced.
WITH asked AS (
    SELECT * FROM unnest($4::text[], $5::int4[], $6::int4[], $7::int4[], $8::int4[])
        AS p(name, fair, cap, fleet, reserve)
),
shares AS (
    SELECT p.name, p.fair,
           CASE WHEN p.fleet IS NULL THEN p.cap
                ELSE least(p.cap, p.fleet - (
                    SELECT count(*) FROM operation_schedule q
                    JOIN operations x ON x.id = q.operation_id
                    WHERE q.provider = p.name AND x.lease_expires_at > now()
                      AND x.state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted',
                                      'observing', 'result_collecting', 'cancel_requested', 'cancelling')))
           END AS cap
    FROM asked p
    WHERE NOT EXISTS (SELECT 1 FROM provider_throttles t
                      WHERE t.provider = p.name AND t.paused_until > now())
),
candidates AS (
    SELECT s.name, s.fair, d.id, d.was_due, d.taken_over
    FROM shares s
    CROSS JOIN LATERAL (
        SELECT o.id, o.next_action_at AS was_due, o.lease_owner IS NOT NULL AS taken_over
        FROM operation_schedule q
        JOIN operations o ON o.id = q.operation_id
        WHERE q.provider = s.name AND q.next_action_at <= now()
          AND o.next_action_at <= now() AND o.provider = s.name
          AND o.state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing',
                          'result_collecting', 'cancel_requested', 'cancelling')
          AND (o.lease_expires_at IS NULL OR o.lease_expires_at <= now())
        ORDER BY q.next_action_at
        -- Never more than the claim takes: every row locked here is a write, kept to commit.
        LIMIT least(greatest(s.cap, 0), $2)
        FOR UPDATE OF o SKIP LOCKED
    ) d
),
ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.name ORDER BY c.was_due) AS rank
    FROM candidates c
),
-- What extra rows may take: the free slots less the fair rows and the reserves still owed (a
-- provider's own fair rows in this claim count towards its reserve; a paused one keeps its reserve).
borrowable AS (
    SELECT $9::int8 - least(coalesce(sum(f.taken), 0), $2)
                    - coalesce(sum(greatest(a.reserve - f.taken, 0)), 0) AS n
    FROM asked a
    LEFT JOIN LATERAL (SELECT count(*) FILTER (WHERE r.rank <= r.fair) AS taken
                       FROM ranked r WHERE r.name = a.name) f ON true
),
due AS (
    SELECT id, was_due, taken_over
    FROM (SELECT r.*, row_number() OVER (PARTITION BY r.rank > r.fair ORDER BY r.was_due) AS nth
          FROM ranked r) numbered, borrowable b
    WHERE rank <= fair OR nth <= b.n
    ORDER BY rank > fair, was_due
    LIMIT $2
)
UPDATE operations o
SET lease_owner       = $1,
    lease_expires_at  = now() + make_interval(secs => $3),
    lease_epoch       = o.lease_epoch + 1,
    next_action_at    = now() + make_interval(secs => $3),
    create_sent_epoch = CASE WHEN o.state = 'create_pending'
                             THEN coalesce(o.create_sent_epoch, o.lease_epoch + 1) END,
    takeovers         = o.takeovers + (due.taken_over AND o.state = 'result_collecting')::int
FROM due
WHERE o.id = due.id
RETURNING
    now() AS db_now, due.was_due, due.taken_over,
    o.id, o.provider, o.target, o.request_body, o.request_fingerprint, o.idempotency_token,
    o.idempotency_mode, o.at_most_once, o.caller, o.approved_by, o.approval_ref, o.trace_id,
    o.parent_span_id, o.parent_sampled, o.created_at, o.create_deadline, o.result_deadline,
    o.cancel_window_ms, o.cancel_deadline, o.state, o.state_changed_at, o.finished_at,
    o.escalated_at, o.escalation_reason, o.remote_job_id, o.conflicting_remote_job_id,
    o.remote_state, o.remote_updated_at, o.remote_progress, o.observed_at, o.status_url,
    o.provider_context, o.next_action_at, o.next_action_reason, o.create_attempts,
    o.create_sent_epoch, o.poll_count, o.poll_not_before, o.failure_count, o.cancel_attempts,
    o.result_attempts, o.reconcile_attempts, o.lease_owner, o.lease_expires_at, o.lease_epoch,
    o.takeovers, o.cancel_requested_at, o.cancel_requested_by, o.cancel_reason, o.result_location,
    o.result_size, o.result_sha256, o.result_content_type, o.result_summary, o.supersedes,
    o.superseded_by, o.edited_by, o.history_seq, o.history_head, o.calls_seq, o.calls_head
