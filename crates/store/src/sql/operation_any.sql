-- Does the database hold any operation at all (reads at most one row)?
SELECT EXISTS (SELECT 1 FROM operations)
