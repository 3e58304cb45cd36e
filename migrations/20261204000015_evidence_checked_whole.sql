-- Evidence checked whole. Every call logged from now on is a link of its operation's call chain: a
-- row without one (no seq, no hashes) was accepted from any role that may log calls, and `audit verify` could only count it
-- as "logged before calls were chained", never check it: a made-up call that no chain covers. The
-- one write path always chains calls; now the database refuses anything else, whoever inserts.
-- Calls logged before migration 0007 keep their NULLs (NOT VALID: rows already there are not
-- checked). Never edit this file once landed: add a new migration instead.
ALTER TABLE provider_calls ADD CONSTRAINT provider_calls_chained
    CHECK (seq IS NOT NULL AND prev_hash IS NOT NULL AND hash IS NOT NULL) NOT VALID;

-- `audit verify` as an auditor also compares who asked for a cancel, why and when with the cancel
-- request the history records (these columns are what "cancelled by a person" queries read).
GRANT SELECT (cancel_requested_at, cancel_requested_by, cancel_reason) ON operations TO jobtrail_auditor;
