-- A submit counts its caller's open operations (not yet terminal) against the server's cap
-- (`--open-per-caller`); this index keeps that count to those rows. `finished_at` changes only on
-- a step into a terminal state, which changes the (indexed) state too, so no step that could be a
-- HOT update stops being one. Never edit this file once landed: add a new migration instead.
CREATE INDEX operations_open_by_caller ON operations (caller) WHERE finished_at IS NULL;
