-- The person whose edit a retried request carries (a person's retry with a request they changed):
-- the request is theirs too, so every send checks the secrets it names against their grants as
-- well as the caller's, as the retry itself was checked. NULL for every other operation, and for
-- those retried before this migration (checked against the caller's grants only, as before).
-- Written once, with the intent: no runtime role may update it (the roles' column grants name it
-- not). Never edit this file once landed: add a new migration instead.
ALTER TABLE operations ADD COLUMN edited_by text;

-- The submission link records it: an auditor compares the row's with the chain's.
GRANT SELECT (edited_by) ON operations TO jobtrail_auditor;
