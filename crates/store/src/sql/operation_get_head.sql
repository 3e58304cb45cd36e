-- One operation's recorded chain head (what `audit verify` needs: an auditor may read no more).
SELECT id, history_seq, history_head FROM operations WHERE id = $1
