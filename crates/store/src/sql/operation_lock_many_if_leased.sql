-- Lock many rows for one group-committed batch of fenced writes: each row only if (id, owner, epoch)
-- still match and the lease has not expired. A row another session holds (a person's decision, a
-- psql left in BEGIN) is skipped, not waited for: the batch's other writes go on, and the caller
-- tells a skipped row (still leased: try again) from a missing one (LeaseLost) with
-- operation_still_leased_many.sql. Locks are taken in id order.
SELECT now() AS db_now, o.*
FROM operations o
JOIN UNNEST($1::uuid[], $2::text[], $3::bigint[]) AS l (id, owner, epoch)
  ON o.id = l.id AND o.lease_owner = l.owner AND o.lease_epoch = l.epoch
WHERE o.lease_expires_at > now()
ORDER BY o.id
FOR UPDATE OF o SKIP LOCKED
