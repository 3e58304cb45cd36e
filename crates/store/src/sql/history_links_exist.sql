-- Which of these planned history links (operation, seq, hash) exist: did writes whose commit
-- answer was lost commit after all? A link, once there, stays (history is append-only), whatever
-- was written after it.
SELECT h.operation_id
FROM operation_history h
JOIN UNNEST($1::uuid[], $2::bigint[], $3::bytea[]) AS p (operation_id, seq, hash)
  ON h.operation_id = p.operation_id AND h.seq = p.seq AND h.hash = p.hash
