-- An operation's history in chain order.
SELECT * FROM operation_history WHERE operation_id = $1 ORDER BY seq
