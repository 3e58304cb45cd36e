-- Of the rows a batch's lock skipped or did not find, those whose lease (id, owner, epoch) still
-- holds as last committed: another session holds them for now. Reads without locking.
SELECT o.id
FROM operations o
JOIN UNNEST($1::uuid[], $2::text[], $3::bigint[]) AS l (id, owner, epoch)
  ON o.id = l.id AND o.lease_owner = l.owner AND o.lease_epoch = l.epoch
WHERE o.lease_expires_at > now()
