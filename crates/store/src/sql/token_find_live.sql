-- The live token with this digest: not revoked, not expired.
SELECT id, caller, scopes, note, created_at, created_by, expires_at, revoked_at, revoked_by
FROM api_tokens
WHERE token_sha256 = $1
  AND revoked_at IS NULL
  AND (expires_at IS NULL OR expires_at > now())
