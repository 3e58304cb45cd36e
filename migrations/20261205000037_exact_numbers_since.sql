-- Since when this database's writers record a provider's integers beyond ±2^53 as text. The chain
-- hashes JSON in RFC 8785's form, which reads every number as a double: 2^53 + 1 and 2^53 hash
-- alike, so one kept as a number could be put in the other's place without the hash changing.
-- `audit verify` excuses such an integer only in a link dated before this (links are dated by the
-- database's clock, migration 0021); a number that is no double's shortest decimal in any other
-- form (`5.0000000000000001`) no writer ever wrote, and is reported wherever it stands. A worker
-- of an earlier release still running through the rollout that applies this is the one exception:
-- a provider's large integer it records meanwhile is reported.
INSERT INTO jobtrail_cutovers (name) VALUES ('exact_numbers');
