-- Every session of a pool waits at most 10 s for a lock another session holds, also in a statement
-- outside any transaction of jobtrail's (a worker's call-rate take, a fleet pause, a lease's
-- extension or release): a `psql` left in `BEGIN; SELECT … FOR UPDATE` fails them as unavailable
-- instead of holding a worker's slot for ever. Transactions set their own (`SET LOCAL`).
SET lock_timeout = '10s'
