-- Lock many rows for one group-committed batch of fenced writes: each row only if (id, owner, epoch)
-- still match and the lease has not expired. Rows that are missing are LeaseLost. Locks are taken in
-- id order, so concurrent batches cannot deadlock.
SELECT now() AS db_now, o.*
FROM operations o
JOIN UNNEST($1::uuid[], $2::text[], $3::bigint[]) AS l (id, owner, epoch)
  ON o.id = l.id AND o.lease_owner = l.owner AND o.lease_epoch = l.epoch
WHERE o.lease_expires_at > now()
ORDER BY o.id
FOR UPDATE OF o
