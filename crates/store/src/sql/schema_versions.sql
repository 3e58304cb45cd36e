-- The migrations applied to this database, for the schema check every command makes at start.
SELECT version, checksum FROM _sqlx_migrations WHERE success ORDER BY version
