-- Every operation's chain heads (history, calls), in id order: what an anchor hashes.
SELECT id, history_seq, history_head, calls_seq, calls_head FROM operations ORDER BY id
