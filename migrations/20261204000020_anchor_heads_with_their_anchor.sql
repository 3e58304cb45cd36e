-- An anchor's heads are written with the anchor, in the transaction that records it (`audit anchor`
-- does both in one). Any role that may write anchors (the operator's) could otherwise add a head to
-- an anchor kept outside the database long ago, and every later `audit verify --expect-anchor` of it
-- would report its heads altered: a kept anchor spoiled for good (its heads are append-only). A
-- statement-level check over the rows a statement inserted, so an anchor's many heads cost one
-- check.
CREATE FUNCTION jobtrail_anchor_heads_with_their_anchor() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM new_heads h
        WHERE NOT EXISTS (
            SELECT 1 FROM audit_anchors a
            -- The anchor's row was written by this very transaction (its xmin is our xid).
            WHERE a.id = h.anchor_id AND a.xmin::text::bigint = txid_current() % 4294967296
        )
    ) THEN
        RAISE EXCEPTION 'jobtrail: an anchor''s heads are written with the anchor, in the transaction that records it'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER audit_anchor_heads_with_their_anchor AFTER INSERT ON audit_anchor_heads
    REFERENCING NEW TABLE AS new_heads
    FOR EACH STATEMENT EXECUTE FUNCTION jobtrail_anchor_heads_with_their_anchor();
