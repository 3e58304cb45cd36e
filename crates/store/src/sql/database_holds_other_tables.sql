-- Does this database hold tables outside the system schemas (another application's)? Asked of one
-- where jobtrail's first migration is not recorded applied, before `migrate` or a throwaway fleet
-- would migrate into it.
-- Not counted: what an earlier migrate left before its first migration committed (its lock table,
-- sqlx's bookkeeping: a retried Job must not be refused), and tables an extension owns (PostGIS's
-- spatial_ref_sys in a database made from a template that has it).
SELECT EXISTS (
    SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p')
      AND n.nspname NOT IN ('pg_catalog', 'information_schema')
      AND n.nspname NOT LIKE 'pg\_toast%'
      AND n.nspname NOT LIKE 'pg\_temp%'
      AND c.relname NOT IN ('jobtrail_migration_lock', '_sqlx_migrations')
      AND NOT EXISTS (SELECT 1 FROM pg_depend d
                      WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                        AND d.deptype = 'e')
)
