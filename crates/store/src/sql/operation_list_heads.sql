-- Every operation's recorded chain head, in id order (history_list_all.sql uses the same order).
SELECT id, history_seq, history_head FROM operations ORDER BY id
