-- `audit verify` as an auditor also replays what each operation's chain says of its result (the
-- validated result's summary and content type, the rules a result broke, why it could not be had)
-- and compares it with the row, which is what an agent is told. The `audit_operations` view shows
-- both already. Never edit this file once landed: add a new migration instead.
GRANT SELECT (result_summary, result_content_type) ON operations TO jobtrail_auditor;
