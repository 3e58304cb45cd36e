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
RETURNING now() AS db_now, due.was_due, due.taken_over, o.*
