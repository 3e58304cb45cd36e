-- Revoke the token with this digest (a leaked token pasted by an operator), once: a second revoke
-- keeps the first one's time and actor.
UPDATE api_tokens
SET revoked_at = coalesce(revoked_at, now()),
    revoked_by = coalesce(revoked_by, $2)
WHERE token_sha256 = $1
RETURNING id, caller, scopes, note, created_at, created_by, expires_at, revoked_at, revoked_by
