INSERT INTO api_tokens (id, caller, scopes, token_sha256, note, created_by, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id, caller, scopes, note, created_at, created_by, expires_at, revoked_at, revoked_by
