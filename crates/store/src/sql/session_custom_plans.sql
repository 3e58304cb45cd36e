-- Plan this transaction's statements for the data as it is now, never with a plan cached while a
-- table was (or was analysed as) empty: the foreign-key checks of evidence inserts are cached plans
-- of each session, and a sequential one stays for the session's life otherwise.
SET LOCAL plan_cache_mode = force_custom_plan
