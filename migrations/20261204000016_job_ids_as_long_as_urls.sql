-- A job known only by its status URL has that URL as its id, up to 8 KiB. A btree entry holds at
-- most about 2.7 KB, so a longer id (a signed query string does not compress) made the step that
-- recorded it fail with "index row size exceeds maximum", leaving the create unsettled. A hash
-- index keeps a fixed-size hash per row whatever the id's length, and serves every lookup there
-- is: equality on the job id (webhook routing; the search for another operation holding a job).
-- Never edit this file once landed: add a new migration instead.
DROP INDEX operations_remote_job;
CREATE INDEX operations_remote_job ON operations USING hash (remote_job_id)
    WHERE remote_job_id IS NOT NULL;
