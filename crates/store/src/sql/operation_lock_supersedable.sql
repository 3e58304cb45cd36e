-- The operation a new one would supersede, locked: its state and whether it was retried already.
SELECT state, superseded_by FROM operations WHERE id = $1 FOR UPDATE
