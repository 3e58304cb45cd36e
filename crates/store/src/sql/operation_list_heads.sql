-- Every operation's chain heads (history, calls), in id order: what an anchor hashes. Each with
-- whether its chains run past the heads its row names (a writer's login may set a row's head back:
-- an anchor of that head would cover less of the chain than there is, leaving the rest for an owner
-- to remove unseen), and whether a head is no link of its chain at all (a made-up hash: an anchor of
-- it would blame the chain for the row's edit at every later verify).
SELECT o.id, o.history_seq, o.history_head, o.calls_seq, o.calls_head,
       EXISTS (SELECT 1 FROM operation_history h WHERE h.operation_id = o.id AND h.seq > o.history_seq)
       OR EXISTS (SELECT 1 FROM provider_calls c WHERE c.operation_id = o.id AND c.seq > o.calls_seq)
           AS runs_past,
       NOT EXISTS (SELECT 1 FROM operation_history h
                   WHERE h.operation_id = o.id AND h.seq = o.history_seq AND h.hash = o.history_head)
       OR (o.calls_seq > 0 AND NOT EXISTS (
               SELECT 1 FROM provider_calls c
               WHERE c.operation_id = o.id AND c.seq = o.calls_seq AND c.hash = o.calls_head))
       OR (o.calls_seq = 0 AND o.calls_head <> decode(repeat('00', 32), 'hex'))
           AS off_chain
FROM operations o
ORDER BY o.id
