-- The schema's checks read tables by name, and PostgreSQL looks a table name up in the session's
-- temporary schema first (even before pg_catalog) unless the search path names `pg_temp` later.
-- Every role may create temporary tables, so a worker's or the API's login could shadow
-- `operation_history` or `pg_roles` (the role check then allowed it every event: a person's
-- decision recorded by a worker), `operations` (the chain check then saw a head of its own
-- making), or `audit_anchors` (an operator's login could add heads to an anchor kept long ago).
-- Each function now searches pg_catalog, then public, then the temporary schema last: a temporary
-- table can no longer stand in for one of ours. The functions that read no table get the same
-- path, so that none is left to reason about. Never edit this file once landed: add a new
-- migration instead.
ALTER FUNCTION jobtrail_may_record(text) SET search_path = pg_catalog, public, pg_temp;
ALTER FUNCTION jobtrail_history_continues_chain() SET search_path = pg_catalog, public, pg_temp;
ALTER FUNCTION jobtrail_anchor_heads_with_their_anchor() SET search_path = pg_catalog, public, pg_temp;
ALTER FUNCTION jobtrail_history_dated_by_the_database() SET search_path = pg_catalog, public, pg_temp;
ALTER FUNCTION jobtrail_result_digests(uuid) SET search_path = pg_catalog, public, pg_temp;
ALTER FUNCTION jobtrail_never_back_to_create_pending() SET search_path = pg_catalog, public, pg_temp;
ALTER FUNCTION jobtrail_refuse_change() SET search_path = pg_catalog, public, pg_temp;
ALTER FUNCTION jobtrail_refuse_delete() SET search_path = pg_catalog, public, pg_temp;
