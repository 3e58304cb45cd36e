-- Everything that is evidence is chained: provider calls get a hash chain of their own per operation,
-- anchors cover both chains, and stored result bytes can be checked against their digests by roles
-- that may not read them. Never edit this file once landed: add a new migration instead.

-- The call chain: sha256(prev_hash || JCS(every column of the call)), per operation, seq from 1. Calls
-- logged before this migration have no link (NULL) and are reported as unchained by `audit verify`.
ALTER TABLE provider_calls ADD COLUMN seq bigint CHECK (seq >= 1);
ALTER TABLE provider_calls ADD COLUMN prev_hash bytea CHECK (length(prev_hash) = 32);
ALTER TABLE provider_calls ADD COLUMN hash bytea CHECK (length(hash) = 32);
CREATE UNIQUE INDEX provider_calls_chain ON provider_calls (operation_id, seq);

-- Its head on the operation, beside the history head.
ALTER TABLE operations ADD COLUMN calls_seq bigint NOT NULL DEFAULT 0 CHECK (calls_seq >= 0);
ALTER TABLE operations ADD COLUMN calls_head bytea NOT NULL DEFAULT decode(repeat('00', 32), 'hex')
    CHECK (length(calls_head) = 32);
-- (Every step writes the whole mutable row, so every writing role needs the columns; only calls move them.)
GRANT UPDATE (calls_seq, calls_head) ON operations TO jobtrail_worker, jobtrail_operator, jobtrail_api;
GRANT SELECT (calls_seq, calls_head) ON operations TO jobtrail_auditor;

-- Anchors of version 2 hash both heads of every operation; version 1 anchors (history only) keep
-- verifying as they were made.
ALTER TABLE audit_anchors ADD COLUMN version smallint NOT NULL DEFAULT 1 CHECK (version IN (1, 2));
ALTER TABLE audit_anchor_heads ADD COLUMN calls_seq bigint;
ALTER TABLE audit_anchor_heads ADD COLUMN calls_hash bytea;

-- Stored result bytes against their recorded digests, for `audit verify` run by roles that may not
-- read the bytes themselves (an auditor): the digest is computed by the database, as the owner.
CREATE FUNCTION jobtrail_result_digests(op uuid)
RETURNS TABLE (operation_id uuid, sha256 text, actual_sha256 text, size bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT r.operation_id, r.sha256, encode(sha256(r.bytes), 'hex'), r.size
    FROM public.operation_results r
    WHERE op IS NULL OR r.operation_id = op
    ORDER BY r.operation_id, r.sha256
$$;
REVOKE ALL ON FUNCTION jobtrail_result_digests(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobtrail_result_digests(uuid) TO jobtrail_worker, jobtrail_operator,
    jobtrail_api, jobtrail_auditor;
