//! Least privilege, as a matrix: each jobtrail command run as each database role, and what each
//! role must not be able to do with SQL of its own. The owner (whoever runs `jobtrail migrate`) is
//! the test database's superuser; the others are login roles made the way docs/roles.md says.

#[path = "support/mod.rs"]
mod support;

use jobtrail_core::State;
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use support::Env;

use support::admin_bin;

fn run(bin: &std::path::Path, url: &str, args: &[&str], stdin: Option<&str>) -> Output {
    support::run_bin(bin, url, &support::providers_dir(), args, stdin)
}

fn jobtrail(url: &str, args: &[&str], stdin: Option<&str>) -> Output {
    run(
        std::path::Path::new(env!("CARGO_BIN_EXE_jobtrail")),
        url,
        args,
        stdin,
    )
}

fn admin(url: &str, args: &[&str]) -> Output {
    run(&admin_bin(), url, args, None)
}

#[track_caller]
fn allowed(o: &Output, what: &str) {
    assert_eq!(
        o.status.code(),
        Some(0),
        "{what} should be allowed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[track_caller]
fn denied(o: &Output, what: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{what} should be refused: {err}");
    assert!(err.contains("permission denied"), "{what}: {err}");
}

async fn sql_refused(url: &str, sql: &str) -> String {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    match sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut c)
        .await
    {
        Ok(_) => panic!("{url}: {sql} was allowed"),
        Err(e) => e.to_string(),
    }
}

async fn sql_allowed(url: &str, sql: &str) {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut c)
        .await
        .unwrap_or_else(|e| panic!("{url}: {sql}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_runs_its_commands_and_nothing_else() {
    let env = Env::new().await;
    let owner = env.url.clone();
    let worker = env.db().login("jobtrail_worker").await;
    let operator = env.db().login("jobtrail_operator").await;
    let api = env.db().login("jobtrail_api").await;
    let auditor = env.db().login("jobtrail_auditor").await;

    // Only the owner changes the schema.
    allowed(&jobtrail(&owner, &["migrate"], None), "migrate as owner");
    for url in [&worker, &operator, &api, &auditor] {
        let o = jobtrail(url, &["migrate"], None);
        assert_eq!(o.status.code(), Some(5), "migrate as {url}");
    }

    // Agents submit and cancel through the api role; nobody else submits but an operator's retry.
    let submit = |url: &str, body: &str| {
        jobtrail(
            url,
            &[
                "submit",
                "--provider",
                "sim",
                "--target",
                "reports",
                "--caller",
                "agent-7",
                "--approved-by",
                "alice",
            ],
            Some(body),
        )
    };
    let done = r#"{"sim":{"duration_ms":200}}"#;
    let out = submit(&api, done);
    allowed(&out, "submit as api");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    for url in [&worker, &auditor] {
        denied(&submit(url, done), "submit as worker or auditor");
    }

    // A worker process as the worker role drives it to a validated result.
    let log = env.dir.join("role-worker.log");
    let mut w = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
        .args([
            "worker",
            "--id",
            "role-worker",
            "--lease",
            "5s",
            "--idle",
            "50ms",
        ])
        .env("DATABASE_URL", &worker)
        .env("JOBTRAIL_PROVIDERS", support::providers_dir())
        .env("JOBTRAIL_SIM_TOKEN", support::TOKEN)
        .env("JOBTRAIL_PROVIDER_SIM_BASE_URL", env.sim.base_url())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let op = env
        .wait_settled(id.parse().unwrap(), Duration::from_secs(40))
        .await;
    assert_eq!(
        op.state,
        State::Succeeded,
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    // Reading: everyone but the auditor, who reads through the audit views.
    for url in [&api, &operator, &worker] {
        allowed(&jobtrail(url, &["show", &id], None), "show");
    }
    allowed(&jobtrail(&api, &["result", &id], None), "result as api");
    denied(&jobtrail(&auditor, &["show", &id], None), "show as auditor");

    // A cancel by the agent; decisions by the operator only.
    let out = submit(&api, r#"{"sim":{"never_finish":true}}"#);
    let live = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    env.wait_state(
        live.parse().unwrap(),
        State::Observing,
        Duration::from_secs(30),
    )
    .await;
    let _ = w.kill();
    let _ = w.wait();
    allowed(
        &jobtrail(
            &api,
            &[
                "cancel",
                &live,
                "--actor",
                "agent-7",
                "--reason",
                "not needed",
            ],
            None,
        ),
        "cancel as api",
    );
    let now = env.store.get(live.parse().unwrap()).await.unwrap();
    let seen = format!("{}@{}", now.state, now.history_seq);
    let abandon = |url: &str| {
        admin(
            url,
            &[
                "abandon", &live, "--seen", &seen, "--actor", "alice", "--reason", "test",
            ],
        )
    };
    denied(&abandon(&api), "a decision as api");
    denied(&abandon(&worker), "a decision as worker");
    allowed(&abandon(&operator), "a decision as operator");

    // Each link names the login that wrote it, whatever actor it names: the submission the
    // API's, the worker's steps the worker's, the cancel the API's, the decision the operator's.
    let login = |url: &str| url::Url::parse(url).unwrap().username().to_owned();
    let links = env.store.history(live.parse().unwrap()).await.unwrap();
    let by: Vec<(&str, Option<&str>)> = links
        .iter()
        .map(|l| (l.event.as_str(), l.recorded_by.as_deref()))
        .collect();
    for (event, who) in &by {
        let want = match *event {
            "submitted" | "cancel_requested" => login(&api),
            "abandon" => login(&operator),
            _ => login(&worker),
        };
        assert_eq!(*who, Some(want.as_str()), "{event}: {by:?}");
    }
    assert!(by.iter().any(|(e, _)| *e == "abandon"), "{by:?}");
    // A writer cannot name another login for a link it writes.
    let named = sql_refused(
        &worker,
        &format!(
            "INSERT INTO operation_history (operation_id, seq, at, actor, from_state, to_state, event, cause, prev_hash, hash, recorded_by) \
             VALUES ('{}', 99, now(), 'alice', 'abandoned', 'abandoned', 'remote_progress', 'x', '\\x00', '\\x00', 'alice-login')",
            live.parse::<jobtrail_core::OperationId>().unwrap().as_uuid()
        ),
    )
    .await;
    assert!(named.contains("permission denied"), "{named}");
    // An auditor reads it through the audit views.
    let (seen_by,): (Option<String>,) = {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&auditor).await.unwrap();
        sqlx::query_as("SELECT recorded_by FROM audit_decisions WHERE event = 'abandon'")
            .fetch_one(&mut c)
            .await
            .unwrap()
    };
    assert_eq!(seen_by, Some(login(&operator)));
    allowed(
        &admin(&operator, &["escalations"]),
        "escalations as operator",
    );
    allowed(&admin(&operator, &["stats"]), "stats as operator");
    denied(&admin(&auditor, &["escalations"]), "escalations as auditor");

    // Anchors by the operator; verification by the auditor too.
    allowed(
        &admin(&operator, &["audit", "anchor"]),
        "anchor as operator",
    );
    denied(&admin(&auditor, &["audit", "anchor"]), "anchor as auditor");
    for url in [&operator, &auditor] {
        allowed(&admin(url, &["audit", "verify", "--all"]), "verify --all");
        allowed(&admin(url, &["audit", "verify", &id]), "verify one");
    }

    // What no role but the owner may do with SQL of its own.
    let some = format!(
        "(SELECT id FROM operations WHERE id = '{}')",
        op.id.as_uuid()
    );
    for url in [&worker, &operator, &api] {
        for sql in [
            "UPDATE operation_history SET cause = 'rewritten'".to_owned(),
            "DELETE FROM provider_calls".to_owned(),
            "TRUNCATE operation_results".to_owned(),
            "ALTER TABLE operation_history DISABLE TRIGGER USER".to_owned(),
            format!("UPDATE operations SET caller = 'mallory' WHERE id = {some}"),
            format!("UPDATE operations SET approved_by = 'mallory' WHERE id = {some}"),
            // Whose grants each send checks: written once, with the intent.
            format!("UPDATE operations SET edited_by = 'mallory' WHERE id = {some}"),
            // Trace metadata, written once too.
            format!("UPDATE operations SET parent_sampled = false WHERE id = {some}"),
            format!("UPDATE operations SET request_body = '{{}}' WHERE id = {some}"),
            "CREATE TABLE mischief (x int)".to_owned(),
            // The schedule is kept by the owner's triggers only (migration 0012).
            "DELETE FROM operation_schedule".to_owned(),
            "UPDATE operation_schedule SET next_action_at = now() + interval '1 day'".to_owned(),
            format!(
                "INSERT INTO operation_schedule SELECT id, 'sim', now() FROM operations WHERE id = {some}"
            ),
            "LOCK TABLE jobtrail_migration_lock".to_owned(),
        ] {
            sql_refused(url, &sql).await;
        }
    }
    // Which job an operation follows changes only with a link that names it, whoever writes (the
    // next step would carry a job written by hand into its own link, and collect another caller's
    // result); and what the provider said is not the API's login to change at all.
    for url in [&worker, &operator, &api] {
        let e = sql_refused(
            url,
            &format!("UPDATE operations SET remote_job_id = 'job_of_another' WHERE id = {some}"),
        )
        .await;
        assert!(
            e.contains("may change only with a link that names it")
                || e.contains("may not change what the provider said"),
            "{e}"
        );
    }
    for set in [
        "status_url = 'http://127.0.0.1:1/jobs/of_another'",
        "provider_context = '{\"cookie_jar\": \"x\"}'",
        "create_sent_epoch = 12345",
        "result_sha256 = repeat('0', 64)",
        "result_location = 'elsewhere'",
        "conflicting_remote_job_id = 'x'",
    ] {
        let e = sql_refused(
            &api,
            &format!("UPDATE operations SET {set} WHERE id = {some}"),
        )
        .await;
        assert!(
            e.contains("may not change what the provider said"),
            "{set}: {e}"
        );
    }
    // A link that does not continue the chain, and a decision recorded by a role that may not.
    let forged = format!(
        "INSERT INTO operation_history (operation_id, seq, at, actor, from_state, to_state, event, cause, detail, prev_hash, hash) \
         SELECT id, history_seq + 1, now(), 'x', state, state, '{{event}}', 'forged', '{{}}', {{prev}}, sha256(history_head) \
         FROM operations WHERE id = {some}"
    );
    let e = sql_refused(
        &worker,
        &forged
            .replace("{event}", "remote_progress")
            .replace("{prev}", "sha256('x')"),
    )
    .await;
    assert!(e.contains("does not continue the chain"), "{e}");
    let e = sql_refused(
        &api,
        &forged
            .replace("{event}", "abandon")
            .replace("{prev}", "history_head"),
    )
    .await;
    assert!(e.contains("may not record abandon"), "{e}");
    // The schema's checks name tables a temporary table of the same name could stand in for (a
    // session's temporary schema is searched first unless the path says otherwise): none may.
    let forged_public = forged
        .replace(
            "INSERT INTO operation_history",
            "INSERT INTO public.operation_history",
        )
        .replace("FROM operations", "FROM public.operations");
    let some_public = some.replace("FROM operations", "FROM public.operations");
    for (url, shadow, event, seq, prev, refusal) in [
        // The role check reads the history table's owner, and the roles' catalogue.
        (
            &worker,
            "CREATE TEMP TABLE operation_history (x int)".to_owned(),
            "confirm_cancellation",
            "history_seq + 1",
            "history_head",
            "may not record confirm_cancellation",
        ),
        (
            &api,
            "CREATE TEMP TABLE pg_roles AS SELECT current_user::name AS rolname, true AS rolsuper"
                .to_owned(),
            "abandon",
            "history_seq + 1",
            "history_head",
            "may not record abandon",
        ),
        // The chain check reads the operation's head: here one of the attacker's making.
        (
            &worker,
            format!(
                "CREATE TEMP TABLE operations AS SELECT id, 41::bigint AS history_seq, \
                 sha256('x') AS history_head FROM public.operations WHERE id = {some_public}"
            ),
            "remote_progress",
            "42",
            "sha256('x')",
            "does not continue the chain",
        ),
    ] {
        let sql = format!(
            "{shadow}; {}",
            forged_public
                .replace("{event}", event)
                .replace("{prev}", prev)
                .replace("history_seq + 1", seq)
        );
        let e = sql_refused(url, &sql).await;
        assert!(e.contains(refusal), "{sql}: {e}");
    }
    // Heads added to an old anchor, with an `audit_anchors` of the attacker's own written in the
    // same transaction.
    let e = sql_refused(
        &operator,
        "BEGIN; CREATE TEMP TABLE audit_anchors AS SELECT id FROM public.audit_anchors; \
             INSERT INTO audit_anchor_heads (anchor_id, operation_id, seq, hash) \
             SELECT (SELECT min(id) FROM public.audit_anchors), gen_random_uuid(), 1, sha256('x'); COMMIT",
    )
    .await;
    assert!(e.contains("written with the anchor"), "{e}");
    sql_refused(
        &worker,
        "INSERT INTO operations (id) VALUES (gen_random_uuid())",
    )
    .await;
    sql_refused(
        &api,
        "INSERT INTO provider_calls (id) VALUES (gen_random_uuid())",
    )
    .await;
    // A call logged outside its operation's chain (no seq, no hashes) is refused: `audit verify`
    // could only have counted it, never checked it.
    let e = sql_refused(
        &worker,
        &format!(
            "INSERT INTO provider_calls (id, operation_id, kind, attempt, actor, lease_epoch, started_at, \
             duration_ms, method, url, outcome, trace_id, span_id) \
             SELECT gen_random_uuid(), id, 'cancel', 1, 'w', lease_epoch, now(), 1, 'POST', \
             'https://x.example/cancel', 'cancelled', trace_id, '0123456789abcdef' FROM operations WHERE id = {some}"
        ),
    )
    .await;
    assert!(e.contains("provider_calls_chained"), "{e}");
    // The schedule's trigger runs with the owner's rights: a temporary table of the same name (with
    // a trigger of its own, which would run as the owner) must not be what it writes to.
    for url in [&worker, &operator, &api] {
        sql_allowed(
            url,
            &format!(
                "CREATE FUNCTION pg_temp.hijack() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN RAISE EXCEPTION 'the owner wrote to a temporary table'; END $$; \
                 CREATE TEMP TABLE operation_schedule (operation_id uuid PRIMARY KEY, provider text, next_action_at timestamptz); \
                 CREATE TRIGGER hijack BEFORE INSERT OR UPDATE OR DELETE ON pg_temp.operation_schedule \
                 FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.hijack(); \
                 UPDATE operations SET next_action_reason = next_action_reason WHERE id = {some}"
            ),
        )
        .await;
    }

    // The auditor reads the views and changes nothing, not even a notification.
    sql_allowed(&auditor, "SELECT count(*) FROM audit_operations").await;
    sql_allowed(&auditor, "SELECT count(*) FROM audit_history").await;
    for sql in [
        "SELECT request_body FROM operations",
        "SELECT provider_context FROM operations",
        "SELECT bytes FROM operation_results",
        "INSERT INTO audit_anchors (created_by, operations, digest) VALUES ('a', 0, repeat('0', 64))",
        // PostgreSQL has no privilege for NOTIFY; the workers' channel is named by a secret the
        // auditor cannot read.
        "SELECT value FROM jobtrail_settings",
        "CREATE TABLE mischief (x int)",
        "LOCK TABLE jobtrail_migration_lock",
        "BEGIN; LOCK TABLE _sqlx_migrations IN EXCLUSIVE MODE; COMMIT",
    ] {
        sql_refused(&auditor, sql).await;
    }
    assert!(env.store.verify_everything(None).await.unwrap().is_clean());

    // The worker may move an operation's state (that is its job), but a state the history does not
    // lead to is found by verify: the row is checked against the chain, not trusted.
    sql_allowed(
        &worker,
        &format!("UPDATE operations SET state = 'failed' WHERE id = {some}"),
    )
    .await;
    let one = env.store.verify_operation(op.id).await.unwrap();
    assert!(
        one.breaks.iter().any(|b| b.problem.contains("state")),
        "{:?}",
        one.breaks
    );
    assert_eq!(
        env.store
            .verify_everything(None)
            .await
            .unwrap()
            .breaks
            .len(),
        1
    );
}

/// A new, empty database on the test server (nothing migrated): its URL and its name.
async fn empty_database(env: &Env) -> (String, String) {
    let name = format!("jobtrail_empty_{}", uuid::Uuid::now_v7().simple());
    admin_sql(env, &format!("CREATE DATABASE {name}")).await;
    (env.url.replace(&env.db().name, &name), name)
}

/// Run `sql` on the test server as its administrator (database-level statements).
async fn admin_sql(env: &Env, sql: &str) {
    use sqlx::Connection;
    let mut admin_conn = sqlx::PgConnection::connect(env.db().admin_url())
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut admin_conn)
        .await
        .unwrap();
}

/// Every command but `migrate` checks the schema with one read and refuses a database that is behind
/// (never migrating it: a read-only `show` on an empty database creates nothing) or ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_refuse_a_schema_behind_or_ahead_and_never_migrate() {
    use sqlx::Connection;
    let env = Env::new().await;
    let (empty, name) = empty_database(&env).await;
    let tables = |url: String| async move {
        let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
        let (n,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
                .fetch_one(&mut c)
                .await
                .unwrap();
        n
    };
    let out = jobtrail(&empty, &["show", "op_01JZZZZZZZZZZZZZZZZZZZZZZZ"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(
        err.contains("behind") && err.contains("jobtrail migrate"),
        "{err}"
    );
    assert_eq!(tables(empty.clone()).await, 0, "nothing was created");

    allowed(&jobtrail(&empty, &["migrate"], None), "migrate");
    let out = jobtrail(&empty, &["show", "op_01JZZZZZZZZZZZZZZZZZZZZZZZ"], None);
    assert_eq!(
        out.status.code(),
        Some(3),
        "now the schema is there: not found"
    );

    // A release newer than this binary migrated the database.
    let mut c = sqlx::PgConnection::connect(&empty).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99991231000000, 'from the future', true, '\\x00', 1)",
    )
    .execute(&mut c)
    .await
    .unwrap();
    // Its migration keeps what this binary does working (the database's oldest_reader is no newer
    // than this binary): it starts, with a warning (an old pod restarting mid-rollout).
    let out = jobtrail(&empty, &["show", "op_01JZZZZZZZZZZZZZZZZZZZZZZZ"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("newer than this jobtrail"), "{err}");
    // One that breaks it says so: refused.
    sqlx::raw_sql("UPDATE jobtrail_schema_readers SET oldest_reader = 99991231000000")
        .execute(&mut c)
        .await
        .unwrap();
    let out = jobtrail(&empty, &["show", "op_01JZZZZZZZZZZZZZZZZZZZZZZZ"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("newer than this jobtrail"), "{err}");
    drop(c);
    admin_sql(&env, &format!("DROP DATABASE {name} WITH (FORCE)")).await;
}

/// `migrate` pointed at another application's database (DATABASE_URL naming the wrong one, after
/// every other command said "run jobtrail migrate") refuses, exit 2, with nothing created: from
/// either binary. Told so, it migrates beside those tables, and says where it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_a_database_that_holds_another_applications_tables() {
    use sqlx::Connection;
    let env = Env::new().await;
    let (other, name) = empty_database(&env).await;
    let mut c = sqlx::PgConnection::connect(&other).await.unwrap();
    // What a first migrate killed before its first migration committed leaves is jobtrail's, not
    // another application's: a retried Job is not refused for it.
    let (bare, bare_name) = empty_database(&env).await;
    let mut b = sqlx::PgConnection::connect(&bare).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE jobtrail_migration_lock (note text); \
         CREATE TABLE _sqlx_migrations (version bigint PRIMARY KEY, description text NOT NULL, \
         installed_on timestamptz NOT NULL DEFAULT now(), success boolean NOT NULL, \
         checksum bytea NOT NULL, execution_time bigint NOT NULL)",
    )
    .execute(&mut b)
    .await
    .unwrap();
    drop(b);
    allowed(
        &jobtrail(&bare, &["migrate"], None),
        "a retried first migrate",
    );
    admin_sql(&env, &format!("DROP DATABASE {bare_name} WITH (FORCE)")).await;
    // Another application's own `operations` table is no jobtrail schema: refused as the others,
    // with nothing created (migrating beside it would fail half-way, its bookkeeping left behind).
    let (clash, clash_name) = empty_database(&env).await;
    let mut k = sqlx::PgConnection::connect(&clash).await.unwrap();
    sqlx::raw_sql("CREATE TABLE operations (id int PRIMARY KEY)")
        .execute(&mut k)
        .await
        .unwrap();
    let out = jobtrail(&clash, &["migrate"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("another application's tables"), "{err}");
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname <> 'operations'",
    )
    .fetch_one(&mut k)
    .await
    .unwrap();
    assert_eq!(left, 0, "nothing was created");
    drop(k);
    admin_sql(&env, &format!("DROP DATABASE {clash_name} WITH (FORCE)")).await;
    sqlx::raw_sql("CREATE TABLE customers (id int PRIMARY KEY)")
        .execute(&mut c)
        .await
        .unwrap();
    let ours = async |c: &mut sqlx::PgConnection| -> bool {
        sqlx::query_scalar("SELECT to_regclass('public.operations') IS NOT NULL")
            .fetch_one(c)
            .await
            .unwrap()
    };
    for out in [
        jobtrail(&other, &["migrate"], None),
        admin(&other, &["migrate"]),
    ] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("another application's tables")
                && err.contains(&name)
                && err.contains("--beside-other-tables"),
            "{err}"
        );
        assert!(!ours(&mut c).await, "nothing was migrated");
    }
    let out = jobtrail(&other, &["migrate", "--beside-other-tables"], None);
    allowed(&out, "migrate beside other tables");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&name),
        "it says where"
    );
    assert!(ours(&mut c).await);
    // Once jobtrail's schema is there, migrating again needs no flag.
    allowed(&admin(&other, &["migrate"]), "migrate again");
    drop(c);
    admin_sql(&env, &format!("DROP DATABASE {name} WITH (FORCE)")).await;
}

/// `jobtrail serve` runs as the `jobtrail_api` role, with an operator login only for decisions and
/// audit: an agent submits, waits and fetches its result over HTTP, a verified webhook is recorded
/// and schedules a read, a person decides; and neither role can mint or widen a token with SQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_runs_as_the_api_role_and_people_decide_through_an_operator_login() {
    use jobtrail_sim::webhook::{Signing, Target};
    use serde_json::json;
    let mut env = Env::new().await;
    let api = env.db().login("jobtrail_api").await;
    let operator = env.db().login("jobtrail_operator").await;
    let server = env.serve_as("api-role", &api, Some(&operator));
    env.sim.sim.set_webhook(Some(Target {
        url: server.url("/v1/webhooks/sim"),
        signing: Signing::Hmac {
            secret: support::WEBHOOK_SECRET.into(),
            header: "X-Sim-Signature".into(),
        },
    }));
    env.start_worker("w1", Duration::from_secs(5));
    let agent = env.token("agent-7", &["submit", "read", "cancel"]).await;
    let alice = env.token("alice", &["read", "decide"]).await;
    let jane = env.token("jane", &["audit"]).await;
    let c = support::http();

    let submitted: serde_json::Value = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&agent)
        .json(
            &json!({"provider": "sim", "target": "reports", "approved_by": "alice",
                      "request": {"account": "acct_1", "sim": {"duration_ms": 300}}}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = submitted["operation"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{submitted}: {}", server.log_text()))
        .to_owned();
    let waited: serde_json::Value = c
        .get(server.url(&format!("/v1/operations/{id}/wait?timeout=30s")))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let op = env
        .wait_state(
            id.parse().unwrap(),
            State::Succeeded,
            Duration::from_secs(30),
        )
        .await;
    assert!(waited["operation"]["state"].is_string(), "{waited}");
    let r = c
        .get(server.url(&format!("/v1/operations/{id}/result")))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", server.log_text());
    let digest = r.headers()["jobtrail-result-sha256"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(Some(digest), op.result_sha256.clone());
    assert_eq!(op.caller, "agent-7");

    // The agent retries it, recorded under the API's login (the `superseded` link on the old
    // operation was a person's event only, and the retry failed); a second retry is refused.
    let retry = |n: u32| {
        c.post(server.url("/v1/operations"))
            .bearer_auth(&agent)
            .json(&json!({"provider": "sim", "target": "reports", "approved_by": "alice",
                          "supersedes": id,
                          "request": {"account": format!("acct_r{n}"), "sim": {"duration_ms": 300}}}))
            .send()
    };
    // Another caller cannot, not even one whose token may decide: a decider retries another's
    // operation through a decision that names the person; a submit superseding it would mark it
    // retried under the decider's caller and shut its own caller's retry out.
    let decider = env
        .token("agent-oscar", &["submit", "read", "decide"])
        .await;
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&decider)
        .json(
            &json!({"provider": "sim", "target": "reports", "approved_by": "alice",
                      "supersedes": id,
                      "request": {"account": "acct_o", "sim": {"duration_ms": 300}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "{}", server.log_text());
    let r = retry(1).await.unwrap();
    assert_eq!(r.status(), 201, "{}", server.log_text());
    let retried: serde_json::Value = r.json().await.unwrap();
    let old = env.store.get(id.parse().unwrap()).await.unwrap();
    assert_eq!(
        old.superseded_by.map(|s| s.to_string()).as_deref(),
        retried["operation"]["id"].as_str()
    );
    let r = retry(2).await.unwrap();
    assert_eq!(r.status(), 409, "{}", server.log_text());
    // The schema keeps it to one as well, whoever inserts (here past every trigger).
    let copy = format!(
        "SET session_replication_role = replica; \
         CREATE TEMP TABLE twin AS SELECT * FROM operations WHERE id = '{}'; \
         UPDATE twin SET id = gen_random_uuid(), idempotency_token = 'idem_' || md5(random()::text); \
         INSERT INTO operations SELECT * FROM twin",
        old.superseded_by.unwrap().as_uuid()
    );
    let e = sql_refused(&env.url, &copy).await;
    assert!(e.contains("operations_retried_once"), "{e}");

    // The provider's end-of-job webhook was verified and recorded by the api role.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let sent = env.sim.ledger().webhooks.clone();
        if let Some(w) = sent
            .iter()
            .find(|w| w.kind == "finish" && w.status.is_some())
        {
            assert_eq!(w.status, Some(200), "{}", server.log_text());
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no webhook delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A person abandons a held operation through the operator login; the actor is the token's.
    let held: serde_json::Value = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&agent)
        .json(
            &json!({"provider": "sim", "target": "reports", "approved_by": "alice",
                      "create_deadline": "+2s", "result_deadline": "+3s",
                      "request": {"account": "acct_1", "sim": {"never_finish": true}}}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let held_id = held["operation"]["id"].as_str().unwrap().to_owned();
    let h = env
        .wait_state(
            held_id.parse().unwrap(),
            State::ResultTimedOut,
            Duration::from_secs(30),
        )
        .await;
    let r = c
        .post(server.url(&format!("/v1/operations/{held_id}/decisions")))
        .bearer_auth(&alice)
        .json(
            &json!({"seen": format!("result_timed_out@{}", h.history_seq),
                      "reason": "not needed", "decision": {"kind": "abandon"}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", server.log_text());
    let history = env.store.history(held_id.parse().unwrap()).await.unwrap();
    assert_eq!(history.last().unwrap().actor, "alice");
    let v: serde_json::Value = c
        .get(server.url("/v1/audit/verify"))
        .bearer_auth(&jane)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["breaks"].as_array().map(Vec::len), Some(0), "{v}");
    env.stop_workers().await;

    // Tokens: the api role only looks them up; an operator creates and revokes, never widens.
    let forge = "INSERT INTO api_tokens (id, caller, scopes, token_sha256, created_by) \
                 VALUES (gen_random_uuid(), 'mallory', ARRAY['decide'], sha256('x'), 'mallory')";
    assert!(sql_refused(&api, forge).await.contains("permission denied"));
    for url in [&api, &operator] {
        let e = sql_refused(
            url,
            "UPDATE api_tokens SET scopes = ARRAY['decide','audit']",
        )
        .await;
        assert!(e.contains("permission denied"), "{e}");
        let e = sql_refused(url, "UPDATE api_tokens SET caller = 'alice'").await;
        assert!(e.contains("permission denied"), "{e}");
    }
    let e = sql_refused(&operator, "DELETE FROM webhook_deliveries").await;
    assert!(e.contains("permission denied"), "{e}");
    sql_allowed(
        &operator,
        "UPDATE api_tokens SET revoked_at = now(), revoked_by = 'alice'",
    )
    .await;
    // Revoked for good: not undone, not re-dated, not put on another's name.
    for undo in [
        "UPDATE api_tokens SET revoked_at = NULL, revoked_by = NULL",
        "UPDATE api_tokens SET revoked_at = now() + interval '1 day'",
        "UPDATE api_tokens SET revoked_by = 'bob'",
    ] {
        let e = sql_refused(&operator, undo).await;
        assert!(e.contains("never undone"), "{undo}: {e}");
    }
    let r = c
        .get(server.url("/v1/operations"))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    server.stop();
}

/// Two `jobtrail migrate` runs at once (two pods of a release, an operator and a Job) serialise:
/// both succeed, one after the other, with migrations that build an index concurrently among them
/// (such a build waits for every older transaction, so a run waiting its turn must hold none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_migrations_at_once_both_succeed() {
    let env = Env::new().await;
    let (empty, name) = empty_database(&env).await;
    let t0 = std::time::Instant::now();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| jobtrail(&empty, &["migrate"], None));
        let b = s.spawn(|| jobtrail(&empty, &["migrate"], None));
        (a.join().unwrap(), b.join().unwrap())
    });
    allowed(&a, "the first migrate");
    allowed(&b, "the second migrate");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(45),
        "{:?}: one waited out the other's lock",
        t0.elapsed()
    );
    admin_sql(&env, &format!("DROP DATABASE {name} WITH (FORCE)")).await;
}
