-- Stored results with their recorded digest and the digest of their bytes (computed by the database
-- in a SECURITY DEFINER function: verifiers need not read the bytes), for one operation or all.
SELECT operation_id, sha256, actual_sha256 FROM jobtrail_result_digests($1)
