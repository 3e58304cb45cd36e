-- Write transactions committed so far, as transaction ids consumed on the server: every transaction
-- that writes takes one, read-only ones take none (they need no durable commit). Server-wide: run the
-- benchmark on a server nothing else writes to. (pg_stat_database's xact_commit also counts read-only
-- transactions and is flushed lazily.)
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint
