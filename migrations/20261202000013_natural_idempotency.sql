-- Naturally idempotent creates: a PUT to a URL the operation names may be resent without a token,
-- so a provider contract may say `create.idempotency = "natural"`. Never edit this file once
-- landed.
--
-- One statement in the migration's one transaction: the wider check replaces the old one
-- atomically. Proving the existing rows meet it scans the table under the exclusive lock the
-- ALTER takes (a text comparison per row; writes wait for it).
ALTER TABLE operations
    DROP CONSTRAINT operations_idempotency_mode_check,
    ADD CONSTRAINT operations_idempotency_mode_check
        CHECK (idempotency_mode IN ('header', 'body_field', 'none', 'natural'));
