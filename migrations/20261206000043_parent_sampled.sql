-- Whether the caller's trace was sampled (the flag of its W3C `traceparent`), kept beside the
-- caller's span (migration 0026): a worker's parent-based sampler follows it, so an operation
-- submitted inside an agent's unsampled trace is not exported as fragments of a trace nobody
-- keeps. Trace metadata, not evidence: no step's decision reads it (only the sampler's) and it is
-- outside the record's hashes. NULL where the caller sent no trace context, and for operations submitted before this
-- migration (decided from their trace id alone, as before). Written once, with the intent: no
-- runtime role may update it (the roles' column grants name it not). A nullable column with no
-- default is added without rewriting the table.
-- Never edit this file once landed: add a new migration instead.
SET LOCAL lock_timeout = '5s';

ALTER TABLE operations ADD COLUMN parent_sampled boolean;
