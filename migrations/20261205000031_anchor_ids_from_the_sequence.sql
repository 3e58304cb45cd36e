-- An anchor kept outside the database is found again by its digest. The operator's login could
-- insert a row of its own with that digest, an id above every other and no heads: the lookup took
-- the highest id, so every later `audit verify --expect-anchor` of the kept anchor reported its
-- heads altered for good (anchors are append-only), a kept anchor spoiled. Anchors now take their
-- id and time from the database only (an operator may name the columns `audit anchor` writes,
-- nothing else), and the lookup takes the earliest anchor with the digest: the one the kept copy
-- was printed from, which no later row can displace.
REVOKE INSERT ON audit_anchors FROM jobtrail_operator;
GRANT INSERT (created_by, operations, digest, version) ON audit_anchors TO jobtrail_operator;
