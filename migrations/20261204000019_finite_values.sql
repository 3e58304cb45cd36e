-- Every timestamp and float a row holds is finite. PostgreSQL takes 'infinity' for a timestamptz
-- and 'NaN' for a float (and 'NaN' >= 0 is true, so the existing checks let it through); jobtrail's
-- reader cannot decode an infinite timestamp, and no canonical JSON (RFC 8785) holds NaN. One such
-- row written by any role that may write the table made `audit verify` (and a worker's claim) fail
-- on it for good, the evidence tables being append-only. CHECK passes NULL: nullable columns stay
-- nullable.

ALTER TABLE operation_history
    ADD CONSTRAINT at_is_finite CHECK (isfinite(at));

ALTER TABLE provider_calls
    ADD CONSTRAINT started_at_is_finite CHECK (isfinite(started_at)),
    -- 'NaN' sorts above 'Infinity' in PostgreSQL: this refuses both.
    ADD CONSTRAINT duration_is_finite CHECK (duration_ms < 'Infinity'::double precision);

ALTER TABLE operations
    ADD CONSTRAINT timestamps_are_finite CHECK (
        isfinite(created_at) AND isfinite(state_changed_at) AND isfinite(create_deadline)
        AND isfinite(result_deadline) AND isfinite(cancel_deadline) AND isfinite(cancel_requested_at)
        AND isfinite(escalated_at) AND isfinite(finished_at) AND isfinite(lease_expires_at)
        AND isfinite(next_action_at) AND isfinite(observed_at) AND isfinite(poll_not_before)
    );

ALTER TABLE operation_schedule
    ADD CONSTRAINT next_action_at_is_finite CHECK (isfinite(next_action_at));

ALTER TABLE operation_results
    ADD CONSTRAINT stored_at_is_finite CHECK (isfinite(stored_at));

ALTER TABLE provider_throttles
    ADD CONSTRAINT values_are_finite CHECK (
        tokens < 'Infinity'::double precision AND isfinite(paused_until) AND isfinite(refreshed_at)
    );

ALTER TABLE api_tokens
    ADD CONSTRAINT timestamps_are_finite CHECK (
        isfinite(created_at) AND isfinite(expires_at) AND isfinite(revoked_at)
    );

ALTER TABLE audit_anchors
    ADD CONSTRAINT created_at_is_finite CHECK (isfinite(created_at));

ALTER TABLE webhook_deliveries
    ADD CONSTRAINT received_at_is_finite CHECK (isfinite(received_at));
