-- `audit verify` as an auditor also compares which operation retried this one (`superseded_by`)
-- with the link that records the retry. Never edit this file once landed: add a new migration
-- instead.
GRANT SELECT (superseded_by) ON operations TO jobtrail_auditor;
