-- Result bytes in the database. A worker keeps a validated (or rejected, for inspection) result here,
-- inserted by the same transaction as the step that records its location and digest, so a recorded
-- location always has its bytes and no result file needs an fsync of its own. Any host can read them
-- back (`jobtrail result`), which a worker's local directory cannot offer. History never holds the
-- bytes, only the location and sha256 (the essay: keep a durable location and integrity data, not the
-- opaque content, in the event log).
CREATE TABLE operation_results (
    operation_id uuid NOT NULL REFERENCES operations (id),
    sha256 text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size bigint NOT NULL CHECK (size >= 0),
    content_type text,
    stored_at timestamptz NOT NULL DEFAULT now(),
    bytes bytea NOT NULL,
    PRIMARY KEY (operation_id, sha256),
    CONSTRAINT size_matches CHECK (size = octet_length(bytes))
);

-- Kept as evidence: written once, never changed or removed.
CREATE TRIGGER operation_results_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON operation_results
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_refuse_change();
