-- Has the migration of this version been applied (jobtrail's first one: its schema is here)?
SELECT EXISTS (SELECT 1 FROM _sqlx_migrations WHERE version = $1 AND success)
