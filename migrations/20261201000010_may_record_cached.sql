-- The history trigger's role check, with the same rule, as PL/pgSQL instead of SQL. A LANGUAGE sql
-- function that cannot be inlined (this one is called from PL/pgSQL and holds sub-selects) has its
-- body parsed and planned again on every call; under a worker's group commits that was about a fifth
-- of the database's time (measured with `perf` during `jobtrail bench`). PL/pgSQL keeps the plan for
-- the session. Never edit this file once landed: add a new migration instead.
CREATE OR REPLACE FUNCTION jobtrail_may_record(event text) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'operation_history'::regclass), 'MEMBER')
        OR coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false)
        OR CASE
            WHEN event IN ('adopt_remote_job', 'declare_not_created', 'confirm_cancellation',
                           'choose_remote_job', 'resume', 'abandon', 'superseded')
                THEN pg_has_role(current_user, 'jobtrail_operator', 'MEMBER')
            WHEN event = 'submitted'
                THEN pg_has_role(current_user, 'jobtrail_api', 'MEMBER')
                  OR pg_has_role(current_user, 'jobtrail_operator', 'MEMBER')
            WHEN event IN ('cancel_requested', 'withdraw')
                THEN pg_has_role(current_user, 'jobtrail_api', 'MEMBER')
                  OR pg_has_role(current_user, 'jobtrail_operator', 'MEMBER')
                  OR pg_has_role(current_user, 'jobtrail_worker', 'MEMBER')
            ELSE pg_has_role(current_user, 'jobtrail_worker', 'MEMBER')
        END;
END $$;
