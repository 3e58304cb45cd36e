-- Of the rows a batch's lock skipped or did not find, those whose lease (id, owner, epoch) still
-- holds as last committed and has not run out by the clock now (not the transaction's start: a
-- lease that ran out since may already be another worker's, whose claim holds the row): another
-- session holds them for the moment. Reads without locking.
SELECT o.id
FROM operations o
JOIN UNNEST($1::uuid[], $2::text[], $3::bigint[]) AS l (id, owner, epoch)
  ON o.id = l.id AND o.lease_owner = l.owner AND o.lease_epoch = l.epoch
WHERE o.lease_expires_at > clock_timestamp()
