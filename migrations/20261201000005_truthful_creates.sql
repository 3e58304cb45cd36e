-- Truthful creates, Retry-After that outlives every other step, reconciliation counted.
-- Never edit this file once landed: add a new migration instead.

-- The lease epoch under which a create may have left and whose outcome is not recorded yet. The claim
-- of a create_pending row sets it in the claim's own commit, before any byte of the create is sent
-- (intent before effect for every attempt, at no extra commit); the step that records the outcome
-- clears it. A worker (or a cancel request) that finds another epoch's mark knows a send may have
-- reached the provider: the operation can no longer be withdrawn or declared never created by
-- automation. It means nothing outside create_pending.
ALTER TABLE operations ADD COLUMN create_sent_epoch bigint;
ALTER TABLE operations ADD CONSTRAINT send_mark_only_while_pending
    CHECK (create_sent_epoch IS NULL OR state = 'create_pending');

-- The provider's last Retry-After for this job, as a time (database clock): no status read before it,
-- whatever else happens in between (a cancel call, a takeover, a person's resume).
ALTER TABLE operations ADD COLUMN poll_not_before timestamptz;

-- Reconciliation calls made (lookups and resends): at least one is tried before a person is asked.
ALTER TABLE operations ADD COLUMN reconcile_attempts integer NOT NULL DEFAULT 0
    CHECK (reconcile_attempts >= 0);
