SELECT id, caller, scopes, note, created_at, created_by, expires_at, revoked_at, revoked_by
FROM api_tokens
ORDER BY created_at, id
