-- The digests of the live tokens (not revoked, not expired), for the API's list of tokens it looks
-- up without its budget for unknown ones; at most $1 of them.
SELECT token_sha256
FROM api_tokens
WHERE revoked_at IS NULL
  AND (expires_at IS NULL OR expires_at > now())
LIMIT $1
