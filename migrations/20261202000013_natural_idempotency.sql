-- Naturally idempotent creates: a PUT to a URL the operation chooses may be resent without a
-- token, so a provider contract may say `create.idempotency = "natural"`. Never edit this file once
-- landed.
--
-- NOT VALID, then VALIDATE: the new check is enforced on every write at once, and the scan that
-- proves the existing rows meet it does not hold writes off.
ALTER TABLE operations DROP CONSTRAINT operations_idempotency_mode_check;
ALTER TABLE operations ADD CONSTRAINT operations_idempotency_mode_check
    CHECK (idempotency_mode IN ('header', 'body_field', 'none', 'natural')) NOT VALID;
ALTER TABLE operations VALIDATE CONSTRAINT operations_idempotency_mode_check;
