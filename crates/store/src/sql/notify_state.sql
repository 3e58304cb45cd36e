-- Wake whoever waits on these operations (a long poll, an MCP wait): their state changed. A hint, not
-- the truth: a waiter re-reads the row, so a stray notification on this public channel costs a read.
-- Its own transaction, after the write committed: NOTIFY takes a transaction id and a cluster-wide
-- lock at commit, so it must not ride on the workers' group commits; and it commits without waiting
-- for its WAL flush (a notification lost in a crash costs a waiter one fallback re-read).
SELECT set_config('synchronous_commit', 'off', true), pg_notify('jobtrail_state', id)
FROM unnest($1::text[]) AS t(id)
