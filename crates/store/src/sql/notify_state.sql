-- Wake whoever waits on these operations (a long poll, an MCP wait): their state changed. A hint, not
-- the truth: a waiter re-reads the row, so a stray notification on this public channel costs a read.
SELECT pg_notify('jobtrail_state', id) FROM unnest($1::text[]) AS t(id)
