-- Bound this transaction's lock waits (a claim waiting behind a stalled claimer fails and is retried
-- with backoff, instead of stalling this worker's claims for every provider).
SET LOCAL lock_timeout = '2s'
