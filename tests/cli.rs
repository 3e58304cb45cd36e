//! The `jobtrail` binary as agents and people use it: submit from stdin, show, wait, result, cancel,
//! and the documented exit codes.

#[path = "support/mod.rs"]
mod support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;
use support::Env;

fn jobtrail(env: &Env, args: &[&str], stdin: Option<&str>) -> Output {
    support::run_bin(
        std::path::Path::new(env!("CARGO_BIN_EXE_jobtrail")),
        &env.url,
        &support::providers_dir(),
        args,
        stdin,
    )
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_show_wait_result_and_exit_codes() {
    let mut env = Env::new().await;
    env.start_worker("w1", Duration::from_secs(10));
    let body = r#"{"account":"acct_218","sim":{"duration_ms":300}}"#;
    let submit = [
        "submit",
        "--provider",
        "sim",
        "--target",
        "reports",
        "--caller",
        "agent-7",
        "--approved-by",
        "alice",
        "--approval-ref",
        "CHG-42",
        "--json",
    ];
    let out = jobtrail(&env, &submit, Some(body));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v["operation"]["id"].as_str().unwrap().to_owned();
    assert_eq!(v["created"], true);

    // Submitting the same id again with the same body is a no-op; with another body, a conflict (4).
    let mut again = submit.to_vec();
    again.extend(["--id", &id]);
    assert_eq!(code(&jobtrail(&env, &again, Some(body))), 0);
    let conflict = jobtrail(&env, &again, Some(r#"{"account":"acct_219"}"#));
    assert_eq!(code(&conflict), 4);
    assert!(
        String::from_utf8_lossy(&conflict.stderr).contains("sha256:"),
        "names both fingerprints"
    );

    let wait = jobtrail(&env, &["wait", &id, "--timeout", "40s", "--json"], None);
    assert_eq!(code(&wait), 0, "{}", String::from_utf8_lossy(&wait.stderr));
    let show = jobtrail(&env, &["show", &id, "--json"], None);
    let s: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(s["operation"]["state"], "succeeded");
    // The whole record, the request it was submitted with included.
    assert!(s["operation"]["request_body"].is_object(), "{s}");
    assert!(s["history"].as_array().unwrap().len() >= 4);
    assert!(
        s["calls"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["kind"] == "result")
    );
    let human = jobtrail(&env, &["show", &id], None);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("approved by alice (CHG-42)"));
    // The view `cancel --seen` repeats, as the JSON names it.
    let seen = s["seen"].as_str().unwrap();
    assert!(
        seen.starts_with("succeeded@") && seen.contains(':'),
        "{seen}"
    );
    assert!(human.contains(&format!("view: {seen}")), "{human}");
    // Times are printed in UTC and say so, whatever the reader's zone.
    let first: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(s["history"][0]["at"].clone()).unwrap();
    let shown = first.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string();
    assert!(human.contains(&shown), "{shown} in:\n{human}");

    let result = jobtrail(&env, &["result", &id], None);
    assert_eq!(code(&result), 0);
    let doc: serde_json::Value = serde_json::from_slice(&result.stdout).unwrap();
    assert_eq!(doc["items"].as_array().unwrap().len(), 5);
    // The result to a reader that went away: ended by SIGPIPE, not an error (it was exit 5).
    let mut child = spawn_piped(
        Command::new(env!("CARGO_BIN_EXE_jobtrail"))
            .args(["result", &id])
            .env("DATABASE_URL", &env.url)
            .env("JOBTRAIL_PROVIDERS", support::providers_dir()),
    );
    drop(child.stdout.take());
    ended_by_sigpipe(&bounded_wait(child), "result");
    // An output path that cannot be written is the caller's mistake: exit 2.
    let nowhere = std::env::temp_dir().join(format!("no-dir-{}/r.json", std::process::id()));
    let out = jobtrail(
        &env,
        &["result", &id, "-o", nowhere.to_str().unwrap()],
        None,
    );
    assert_eq!(code(&out), 2, "{}", String::from_utf8_lossy(&out.stderr));
    // Over an earlier copy: replaced whole (renamed into place), nothing else left beside it;
    // onto a directory: exit 2, the directory as it was.
    let dir = std::env::temp_dir().join(format!("jobtrail-cli-o-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let kept = dir.join("r.json");
    std::fs::write(&kept, vec![b'x'; 1 << 20]).unwrap();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o640)).unwrap();
    let before = std::fs::metadata(&kept).unwrap();
    let out = jobtrail(&env, &["result", &id, "-o", kept.to_str().unwrap()], None);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&kept).unwrap(), result.stdout);
    let after = std::fs::metadata(&kept).unwrap();
    assert_ne!(after.ino(), before.ino(), "a new file renamed into place");
    assert_eq!(
        after.mode() & 0o777,
        0o640,
        "with the earlier file's permissions"
    );
    // What is not a regular file is written to, never replaced (run as root, a rename would
    // have put a plain file in the place of /dev/null).
    let out = jobtrail(&env, &["result", &id, "-o", "/dev/null"], None);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device()
    );
    let out = jobtrail(
        &env,
        &["result", &id, "-o", dir.join("sub").to_str().unwrap()],
        None,
    );
    assert_eq!(code(&out), 2, "{}", String::from_utf8_lossy(&out.stderr));
    let mut left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["r.json", "sub"], "no temporary file left behind");
    std::fs::remove_dir_all(&dir).unwrap();

    // Cancelling a finished operation is refused (4); unknown ids are 3; bad input is 2, nothing written.
    assert_eq!(
        code(&jobtrail(
            &env,
            &["cancel", &id, "--actor", "bob", "--reason", "late"],
            None
        )),
        4
    );
    assert_eq!(
        code(&jobtrail(
            &env,
            &["show", "op_01JZZZZZZZZZZZZZZZZZZZZZZZ"],
            None
        )),
        3
    );
    let (before, _, _) = env.store.totals().await.unwrap();
    assert_eq!(code(&jobtrail(&env, &submit, Some("{not json"))), 2);
    let mut past = submit.to_vec();
    past.extend(["--create-deadline", "2020-01-01T00:00:00Z"]);
    assert_eq!(code(&jobtrail(&env, &past, Some(body))), 2);
    assert_eq!(env.store.totals().await.unwrap().0, before);

    // A never-ending job: wait times out (6); a cancel is recorded; then it ends cancelled (1).
    let out = jobtrail(&env, &submit, Some(r#"{"sim":{"never_finish":true}}"#));
    let id2 = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["operation"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        code(&jobtrail(&env, &["wait", &id2, "--timeout", "1s"], None)),
        6
    );
    // No result of a job still running: exit 9 (not finished), not 1 (ended other than succeeded).
    let running = jobtrail(&env, &["result", &id2], None);
    assert_eq!(
        code(&running),
        9,
        "{}",
        String::from_utf8_lossy(&running.stderr)
    );
    assert!(running.stdout.is_empty());
    assert_eq!(
        code(&jobtrail(
            &env,
            &["cancel", &id2, "--actor", "bob", "--reason", "not needed"],
            None
        )),
        0
    );
    assert_eq!(
        code(&jobtrail(&env, &["wait", &id2, "--timeout", "40s"], None)),
        1
    );
    assert_eq!(
        env.store.get(id2.parse().unwrap()).await.unwrap().state,
        jobtrail_core::State::Cancelled
    );
    assert_eq!(code(&jobtrail(&env, &["result", &id2], None)), 1);
    // Held for a person, another's operation is cancelled only on the view seen (4 without one,
    // nothing written); on it, the cancel is recorded.
    let mut held = submit.to_vec();
    held.extend(["--create-deadline", "+2s", "--result-deadline", "+3s"]);
    let out = jobtrail(&env, &held, Some(r#"{"sim":{"never_finish":true}}"#));
    let id3: jobtrail_core::OperationId = serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .unwrap()["operation"]["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let op = env
        .wait_state(
            id3,
            jobtrail_core::State::ResultTimedOut,
            Duration::from_secs(30),
        )
        .await;
    let id3 = id3.to_string();
    // Held for a person is not finished either.
    assert_eq!(code(&jobtrail(&env, &["result", &id3], None)), 9);
    let cancel = ["cancel", &id3, "--actor", "bob", "--reason", "not needed"];
    let out = jobtrail(&env, &cancel, None);
    assert_eq!(code(&out), 4, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--seen"));
    assert_eq!(
        env.store.get(op.id).await.unwrap().history_seq,
        op.history_seq,
        "nothing written"
    );
    let seen = format!("result_timed_out@{}", op.history_seq);
    let out = jobtrail(&env, &[&cancel[..], &["--seen", &seen]].concat(), None);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    // Recorded (the worker may have sent the provider's cancel already).
    let asked = env.store.get(op.id).await.unwrap();
    assert_eq!(asked.cancel_requested_by.as_deref(), Some("bob"));
    assert!(
        matches!(
            asked.state,
            jobtrail_core::State::CancelRequested
                | jobtrail_core::State::Cancelling
                | jobtrail_core::State::Cancelled
        ),
        "{:?}",
        asked.state
    );
    env.stop_workers().await;
}

#[test]
fn help_explains_exit_codes_and_shows_examples() {
    let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Exit codes") && text.contains("held for a person"),
        "{text}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
        .args(["submit", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("Examples"));
}

/// A path setting's variable set to nothing (a chart value left blank) is taken as unset, as every
/// other setting is: not a usage error for every command.
#[test]
fn an_empty_path_variable_is_taken_as_unset() {
    let admin = concat!(env!("CARGO_BIN_EXE_jobtrail"), "-admin");
    // Each refused later for what it lacks (its own flag, a database), not for the variable.
    for (bin, var, args, then) in [
        (
            env!("CARGO_BIN_EXE_jobtrail"),
            "JOBTRAIL_PROVIDERS",
            &["list"][..],
            "DATABASE_URL is not set",
        ),
        (
            admin,
            "JOBTRAIL_PROVIDERS",
            &["escalations"][..],
            "DATABASE_URL is not set",
        ),
        (
            env!("CARGO_BIN_EXE_jobtrail"),
            "JOBTRAIL_RESULT_DIR",
            &["worker", "--lease", "soon"][..],
            "--lease",
        ),
        (
            admin,
            "JOBTRAIL_ANCHOR_SIGNING_KEY_FILE",
            &["audit", "anchor", "--actor", "alice"][..],
            "DATABASE_URL is not set",
        ),
    ] {
        let out = Command::new(bin)
            .args(args)
            .env(var, "")
            .env_remove("DATABASE_URL")
            .env_remove("JOBTRAIL_API")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains(then), "{var} {args:?}: {said}");
        assert_ne!(out.status.code(), Some(0), "{var}: {said}");
    }
}

/// `contract check`: the effective contract with its profile expanded and the timings, exit 0; a
/// broken contract names file and key, exit 2; a file that is not there or not TOML, exit 2. It
/// needs no database.
#[test]
fn contract_check_expands_the_profile_and_names_the_problem() {
    let check = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_jobtrail"))
            .args(["contract", "check"])
            .args(args)
            .env_remove("DATABASE_URL")
            .output()
            .unwrap()
    };
    let example = support::providers_dir().join("examples/google-speech-longrunning.toml");
    let out = check(&[example.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        code(&out),
        0,
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "profile \"google-aip-151\" expanded",
        "state_absent = \"false\"",
        "within = \"/response\"",
        "url = \"/operations/{job_id_path}\"",
        "create_window: 120000 ms: holds",
        "no problems",
    ] {
        assert!(text.contains(want), "{want:?} missing in:\n{text}");
    }
    let out = check(&["--json", example.to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["effective"]["status"]["state_absent"], "false");
    assert_eq!(doc["problems"].as_array().unwrap().len(), 0);

    let dir = std::env::temp_dir().join(format!("jobtrail-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    let text = std::fs::read_to_string(&example)
        .unwrap()
        .replace("initial_ms = 5000", "initial_ms = 5000\nfactor = 99.0");
    std::fs::write(&bad, text).unwrap();
    let out = check(&[bad.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("polling.factor"),
        "{err}"
    );
    // Every problem, not only the first: three independent mistakes are named together; the
    // JSON lists them.
    let text = std::fs::read_to_string(&example)
        .unwrap()
        .replace("initial_ms = 5000", "initial_ms = 5000\nfactor = 99.0")
        .replace("create_ms = 120000", "create_ms = 5")
        .replace(
            "path = \"/operations/{job_id_path}:cancel\"",
            "path = \"/operations/{job}:cancel\"",
        );
    std::fs::write(&bad, text).unwrap();
    let out = check(&[bad.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    let err = String::from_utf8_lossy(&out.stderr);
    for key in [
        "3 problems",
        "polling.factor",
        "deadlines.create_ms",
        "cancel.path",
    ] {
        assert!(err.contains(key), "{key} missing in: {err}");
    }
    let out = check(&["--json", bad.to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["problems"].as_array().unwrap().len(), 3, "{doc}");

    std::fs::write(&bad, "protocol = \"soap\"\nname = \"x\"").unwrap();
    let out = check(&[bad.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("protocol"));
    // ... and a machine reading --json gets it as a problem too.
    let out = check(&["--json", bad.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        doc["problems"][0].as_str().unwrap().contains("protocol"),
        "{doc}"
    );
    // A credential in base_url is refused, and the effective contract printed beside the problem
    // (to a terminal, a CI log) does not show it either, in text or JSON.
    let text = std::fs::read_to_string(&example).unwrap().replace(
        "base_url = \"https://speech.googleapis.com/v1\"",
        "base_url = \"https://admin:hunter2-in-url@speech.googleapis.com/v1?code=hunter3-in-query\"",
    );
    std::fs::write(&bad, text).unwrap();
    for args in [vec![], vec!["--json"]] {
        let out = check(&[args.clone(), vec![bad.to_str().unwrap()]].concat());
        assert_eq!(code(&out), 2);
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(all.contains("base_url"), "{all}");
        assert!(
            !all.contains("hunter2-in-url") && !all.contains("hunter3-in-query"),
            "a credential shown: {args:?}"
        );
    }
    // A base URL without credentials is shown as written and said to hold none, in the forms a
    // URL parser would rewrite too (no path: it adds a `/`).
    let text = std::fs::read_to_string(&example).unwrap().replace(
        "base_url = \"https://speech.googleapis.com/v1\"",
        "base_url = \"https://speech.googleapis.com\"",
    );
    std::fs::write(&bad, text).unwrap();
    let out = check(&[bad.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{shown}");
    assert!(!shown.contains("credentials"), "{shown}");
    assert!(
        shown.contains("base_url = \"https://speech.googleapis.com\""),
        "{shown}"
    );
    std::fs::write(&bad, "name = ").unwrap();
    assert_eq!(code(&check(&[bad.to_str().unwrap()])), 2);
    // Not TOML at all, with --json: still a document naming the problem.
    let out = check(&["--json", bad.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        doc["problems"][0].as_str().unwrap().contains("bad.toml"),
        "{doc}"
    );
    assert_eq!(
        code(&check(&[dir.join("absent.toml").to_str().unwrap()])),
        2
    );
    let out = check(&["--json", dir.join("absent.toml").to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        doc["problems"][0].as_str().unwrap().contains("absent.toml"),
        "{doc}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A password the test database ignores (trust authentication) but a printed URL would show.
const PASSWORD: &str = "hunter2-not-secret";

/// `url` with [`PASSWORD`] in it, as a managed database's URL carries one.
fn with_password(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}password={PASSWORD}")
}

fn assert_no_password(out: &Output) {
    for (what, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        assert!(
            !String::from_utf8_lossy(text).contains(PASSWORD),
            "the database password is on {what}"
        );
    }
}

/// The README's first command, small: every scenario ends where it must, and the report says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_and_every_operation_ends_where_its_scenario_says() {
    let db = jobtrail_store::testing::TestDb::new().await;
    let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
        .args(["demo", "--operations", "100", "--workers", "2", "--json"])
        .env("DATABASE_URL", with_password(&db.url))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        code(&out),
        0,
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_password(&out);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["unexpected_outcomes"], serde_json::json!([]));
    assert_eq!(r["max_concurrent_polls_one_job"], 1);
    assert_eq!(r["chain_breaks"], 0);
    assert_eq!(r["early_polls"], 0);
    assert_eq!(r["timed_out"], false);
    // The report names the directory it keeps, with the workers' logs in it.
    let work = std::path::PathBuf::from(r["work_dir"].as_str().unwrap());
    assert!(work.join("demo-worker-0.log").is_file(), "{work:?}");
    std::fs::remove_dir_all(&work).unwrap();

    // A database that holds operations (a real one named by a DATABASE_URL left exported, or a
    // --database-url) is refused before anything is written: the demo's operations could never
    // be removed from it.
    let store = db.store().await;
    let before = store.totals().await.unwrap();
    for how in [
        vec!["demo", "--operations", "10"],
        vec!["bench", "--phases", "e2e"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
            .args(&how)
            .args(["--database-url", &db.url])
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{how:?}: {err}");
        assert!(err.contains("already holds operations"), "{err}");
    }
    assert_eq!(store.totals().await.unwrap(), before, "nothing was written");

    // Another application's database (a DATABASE_URL left exported) without jobtrail's schema:
    // refused too, and no schema is added to it.
    use sqlx::Connection;
    let name = format!("jt_foreign_{}", uuid::Uuid::now_v7().simple());
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let mut url = url::Url::parse(&db.url).unwrap();
    url.set_path(&name);
    let mut foreign = sqlx::PgConnection::connect(url.as_str()).await.unwrap();
    sqlx::query("CREATE TABLE invoices (id int)")
        .execute(&mut foreign)
        .await
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
        .args(["demo", "--operations", "10", "--database-url", url.as_str()])
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{err}");
    assert!(err.contains("another application's tables"), "{err}");
    let (ours,): (bool,) = sqlx::query_as("SELECT to_regclass('operations') IS NOT NULL")
        .fetch_one(&mut foreign)
        .await
        .unwrap();
    assert!(!ours, "no schema added");
    foreign.close().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
}

/// The benchmark's code paths stay alive (figures are not judged here: benchmarks print, tests don't time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_benchmark_runs_its_phases_and_writes_json() {
    let db = jobtrail_store::testing::TestDb::new().await;
    let json = std::env::temp_dir().join(format!(
        "jobtrail-bench-{}.json",
        uuid::Uuid::now_v7().simple()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
        .args([
            "bench",
            "--phases",
            "claim,ceiling,e2e,realistic",
            "--ceiling-secs",
            "1",
            "--clients",
            "2",
            "--workers",
            "1",
        ])
        .args([
            "--e2e-operations",
            "40",
            "--realistic-operations",
            "10",
            "--json-out",
        ])
        .arg(&json)
        .env("DATABASE_URL", with_password(&db.url))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        code(&out),
        0,
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_password(&out);
    let kept = std::fs::read(&json).unwrap();
    assert!(
        !String::from_utf8_lossy(&kept).contains(PASSWORD),
        "the results file carries no password"
    );
    let r: serde_json::Value = serde_json::from_slice(&kept).unwrap();
    // Read: a full test run otherwise leaves one in the temporary directory each time.
    std::fs::remove_file(&json).unwrap();
    assert_eq!(r["end_to_end"][0]["completed"], true);
    assert_eq!(r["realistic"]["completed"], true);
    assert_eq!(r["realistic"]["states"]["succeeded"], 10);
    // Both ceilings (jobtrail's own statements, and the lean one), single-row and batched.
    let ceiling = r["ceiling"].as_array().unwrap();
    assert_eq!(ceiling.len(), 4);
    for kind in ["jobtrail", "lean"] {
        assert!(
            ceiling
                .iter()
                .filter(|c| c["statements"] == kind)
                .all(|c| c["transitions_per_sec"].as_f64().unwrap() > 0.0),
            "{kind}: {ceiling:?}"
        );
    }
    assert!(
        r["targets"]["transitions_vs_batched_ceiling"]["value"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(
        r["targets"]["commits_per_operation_realistic"]["value"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    // Both counts of commits are there: pg_stat_database's and the write transactions'.
    let realistic = &r["realistic"];
    for key in ["commits_per_operation", "write_transactions_per_operation"] {
        assert!(realistic[key].as_f64().unwrap() > 0.0, "{key}: {realistic}");
    }
}

/// A worker keeping results in the database refuses, before touching anything, a contract that allows
/// results larger than the database store takes.
#[test]
fn a_worker_refuses_contracts_whose_results_the_database_cannot_keep() {
    let providers = std::env::temp_dir().join(format!(
        "jobtrail-big-results-{}",
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::create_dir_all(providers.join("schemas")).unwrap();
    let src = support::providers_dir();
    std::fs::copy(
        src.join("schemas/sim-result.json"),
        providers.join("schemas/sim-result.json"),
    )
    .unwrap();
    let toml = std::fs::read_to_string(src.join("sim.toml"))
        .unwrap()
        .replace("max_bytes = 1048576", "max_bytes = 1073741824");
    assert!(toml.contains("max_bytes = 1073741824"));
    std::fs::write(providers.join("sim.toml"), toml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
        .args(["worker", "--id", "w"])
        // Never reached: the refusal comes first.
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
        .env("JOBTRAIL_PROVIDERS", &providers)
        .env_remove("JOBTRAIL_RESULT_DIR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(
        stderr.contains("provider sim") && stderr.contains("--result-dir"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&providers).unwrap();
}

/// What a careless caller types is refused with exit 2 and a message that names the problem, and
/// nothing is written: overflowing durations, bodies that are not objects, duplicate keys, integers
/// beyond 64 bits, NUL characters, ids past 128 bits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn careless_input_is_refused_with_exit_2_and_nothing_written() {
    let env = Env::new().await;
    let submit = [
        "submit",
        "--provider",
        "sim",
        "--target",
        "reports",
        "--caller",
        "agent-7",
        "--approved-by",
        "alice",
    ];
    let with = |extra: &[&'static str]| {
        let mut v = submit.to_vec();
        v.extend_from_slice(extra);
        v
    };
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        (
            with(&["--cancel-window", "213503982334602d"]),
            "{}",
            "--cancel-window",
        ),
        (with(&["--cancel-window", "31d"]), "{}", "--cancel-window"),
        (with(&["--cancel-window", "0s"]), "{}", "--cancel-window"),
        (
            with(&["--result-deadline", "+100000000d"]),
            "{}",
            "--result-deadline",
        ),
        (with(&["--result-deadline", "+4000d"]), "{}", "ten years"),
        (
            with(&["--id", "op_8ZZZZZZZZZZZZZZZZZZZZZZZZZ"]),
            "{}",
            "operation id",
        ),
        (submit.to_vec(), "null", "takes a JSON object"),
        (submit.to_vec(), "42", "takes a JSON object"),
        (submit.to_vec(), "[1,2]", "takes a JSON object"),
        (submit.to_vec(), r#"{"a":1,"a":2}"#, "appears twice"),
        (
            submit.to_vec(),
            r#"{"n":18446744073709551616}"#,
            "send it as a string",
        ),
        // Kept exactly, but fingerprinted as a double: it could pass for 2^53 on a resend.
        (
            submit.to_vec(),
            r#"{"account":{"id":9007199254740993}}"#,
            "holds the integer 9007199254740993 at \"/account/id\"",
        ),
        (submit.to_vec(), r#"{"s":"a\u0000b"}"#, "NUL"),
        // The body limit is the operator's (the contract's), not the caller's to raise.
        (
            with(&["--max-body-bytes", "999999999"]),
            "{}",
            "--max-body-bytes",
        ),
    ];
    for (args, body, says) in cases {
        let out = jobtrail(&env, &args, Some(body));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{args:?} {body}: {stderr}");
        assert!(stderr.contains(says), "{args:?} {body}: {stderr}");
    }
    let long_id = "w".repeat(300);
    for (args, says) in [
        (
            vec![
                "wait",
                "op_01JZZZZZZZZZZZZZZZZZZZZZZZ",
                "--timeout",
                "99999999999d",
            ],
            "--timeout",
        ),
        (vec!["worker", "--lease", "100000000d"], "--lease"),
        // A contract path named by mistake is not read until memory runs out.
        (vec!["contract", "check", "/dev/zero"], "larger than"),
        // Bench counts that would wait on nothing, seed until the disk is full, or panic.
        (vec!["bench", "--e2e-concurrency", "0"], "--e2e-concurrency"),
        (vec!["bench", "--large-table=-1"], "--large-table"),
        (
            vec!["bench", "--ceiling-secs", "18446744073709551615"],
            "--ceiling-secs",
        ),
        (vec!["bench", "--clients", "4,4294967300"], "--clients"),
        (
            vec!["bench", "--json-out", "/nonexistent-dir/x.json"],
            "--json-out",
        ),
        (vec!["worker", "--lease", "2h"], "--lease"),
        // The actor of every link it writes: no escape, no line break, no page of text.
        (vec!["worker", "--id", "w\u{1b}[2J"], "--id"),
        (vec!["worker", "--id", "w1\nalice"], "--id"),
        (vec!["worker", "--id", &long_id], "--id"),
        (vec!["worker", "--idle", "0s"], "--idle"),
        (vec!["worker", "--idle", "30ms"], "--idle"),
        (
            vec!["worker", "--db-answer-within", "0s"],
            "--db-answer-within",
        ),
        (
            vec!["worker", "--db-answer-within", "forever"],
            "--db-answer-within",
        ),
        // A check of zero would let every large result's lease lapse; a day and more is a typo.
        (vec!["worker", "--check-within", "0s"], "--check-within"),
        (vec!["worker", "--check-within", "10"], "--check-within"),
        (vec!["worker", "--check-within", "2d"], "--check-within"),
        // No room at all would hold every JSON result; a size with a unit is not a number of MiB.
        (vec!["worker", "--check-mib", "0"], "--check-mib"),
        (vec!["worker", "--check-mib", "512Mi"], "--check-mib"),
        (vec!["worker", "--check-mib", "2000000"], "--check-mib"),
        // A Host header never matches a URL, a path or a user: each MCP request would be 403.
        (
            vec!["serve", "--mcp-allowed-host", "https://jobtrail.example"],
            "--mcp-allowed-host",
        ),
        (
            vec!["serve", "--mcp-allowed-host", "jobtrail.example/"],
            "no scheme, no path",
        ),
        (
            vec!["serve", "--mcp-allowed-host", "a.example,user@b.example"],
            "user@b.example",
        ),
        (
            vec!["serve", "--mcp-allowed-host", "jobtrail.example:99999"],
            "no scheme, no path",
        ),
        (
            vec!["serve", "--mcp-allowed-host", "jobtrail.example:"],
            "no scheme, no path",
        ),
    ] {
        let out = jobtrail(&env, &args, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    // A result directory that cannot take a file (here a plain file; a read-only mount or one
    // without permission alike): refused at start, not found out as every finished job fails.
    let not_a_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = jobtrail(&env, &["worker", "--result-dir", not_a_dir], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(stderr.contains("results cannot be kept there"), "{stderr}");
    // A stale TRACEPARENT left in the shell: the error says where the value came from, since the
    // user typed no --traceparent.
    let out = support::run_bin_with(
        std::path::Path::new(env!("CARGO_BIN_EXE_jobtrail")),
        &env.url,
        &support::providers_dir(),
        &submit,
        Some("{}"),
        &[("TRACEPARENT", "00-not-a-trace")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(
        stderr.contains("TRACEPARENT in the environment"),
        "{stderr}"
    );
    assert_eq!(
        env.store.totals().await.unwrap(),
        (0, 0, 0),
        "nothing written"
    );
}

/// The API door as a careless user reaches it: a password in the API's URL is never printed,
/// whatever else is wrong with it, and an argument that is not UTF-8 (a file name) is no panic.
#[test]
fn the_api_door_never_prints_a_password_or_panics_on_an_argument() {
    let run = |args: &[&std::ffi::OsStr], api: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
            .args(args)
            .env("JOBTRAIL_API", api)
            .env("JOBTRAIL_TOKEN", "jtk_not-a-live-token")
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let op = std::ffi::OsStr::new("op_01JZZZZZZZZZZZZZZZZZZZZZZZ");
    let show = std::ffi::OsStr::new("show");
    let db = std::ffi::OsStr::new("--database-url=postgres://127.0.0.1:9/x");
    for (args, api) in [
        (vec![show, op], "ftp://u:hunter2@127.0.0.1:9/"),
        (vec![show, op], "http://u:hunter2@127.0.0.1:bad/"),
        (vec![show, op, db], "http://u:hunter2@127.0.0.1:9/"),
    ] {
        let (code, err) = run(&args, api);
        assert_eq!(code, Some(2), "{api}: {err}");
        assert!(!err.contains("hunter2"), "{api}: {err}");
    }
    use std::os::unix::ffi::OsStrExt;
    let (code, err) = run(
        &[
            std::ffi::OsStr::new("result"),
            op,
            std::ffi::OsStr::new("-o"),
            std::ffi::OsStr::from_bytes(b"r\xe9sum\xe9.json"),
        ],
        "http://127.0.0.1:9/",
    );
    assert_ne!(code, Some(101), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn api_on_a_command_that_works_on_the_database_is_refused_not_ignored() {
    for cmd in [&["worker"][..], &["migrate"], &["serve"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
            .args(cmd)
            .args(["--api", "http://127.0.0.1:9"])
            .env_remove("JOBTRAIL_API")
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:9/none")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(err.contains("--api applies to"), "{cmd:?}: {err}");
    }
}

/// A database URL that is wrong in itself is bad input (exit 2), said at once and sent nowhere: the
/// driver read any scheme as PostgreSQL's (`mysql://host/db` logged in to the PostgreSQL on `host`)
/// and a malformed URL was exit 5, like an outage. A database that refuses connections is exit 5
/// naming why, not only "pool timed out" after 10 s. No password appears in any of it.
#[test]
fn a_wrong_database_url_is_bad_input_and_an_unreachable_one_says_why() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let run = |bin: &str, url: &str| {
        let list = if bin.ends_with("admin") {
            "escalations"
        } else {
            "list"
        };
        let out = Command::new(bin)
            .arg(list)
            .env("DATABASE_URL", url)
            .env_remove("JOBTRAIL_DATABASE_URL")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!err.contains("hunter2"), "{url}: {err}");
        (out.status.code(), err)
    };
    let admin = support::admin_bin();
    for bin in [env!("CARGO_BIN_EXE_jobtrail"), admin.to_str().unwrap()] {
        for (url, says) in [
            (
                format!("mysql://u:hunter2@127.0.0.1:{port}/x"),
                "must start with postgres:// or postgresql://, not mysql:",
            ),
            (format!("http://127.0.0.1:{port}/x"), "not http:"),
            (
                format!("postgres://u:hunter2@127.0.0.1:{port}/x?sslmode=disable&pasword=x"),
                "unknown parameter \"pasword\"",
            ),
            (
                "postgres://u:hunter2@bad host/x".to_owned(),
                "bad database URL",
            ),
            (format!("127.0.0.1:{port}"), "bad database URL"),
        ] {
            let (code, err) = run(bin, &url);
            assert_eq!(code, Some(2), "{bin} {url}: {err}");
            assert!(err.contains(says), "{bin} {url}: {err}");
        }
    }
    // Nothing connected to the address any of those URLs named.
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "a refused URL was connected to"
    );
    drop(listener);
    // The port is closed now: refused, retried for 10 s, then named.
    let (code, err) = run(
        env!("CARGO_BIN_EXE_jobtrail"),
        &format!("postgres://u:hunter2@127.0.0.1:{port}/x?sslmode=disable"),
    );
    assert_eq!(code, Some(5), "{err}");
    assert!(
        err.contains(&format!("no connection to 127.0.0.1:{port} within 10 s"))
            && err.contains("refused"),
        "{err}"
    );
}

/// A reader that goes away ends the command as it ends any Unix tool: no panic, no backtrace,
/// no exit 101.
#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let contract = concat!(env!("CARGO_MANIFEST_DIR"), "/../../providers/sim.toml");
    for args in [
        vec!["contract", "check", contract],
        vec!["--json", "contract", "check", contract],
    ] {
        let mut child = spawn_piped(Command::new(env!("CARGO_BIN_EXE_jobtrail")).args(&args));
        drop(child.stdout.take());
        let out = bounded_wait(child);
        ended_by_sigpipe(&out, &format!("{args:?}"));
    }
}

/// Started with no stdin and both outputs captured.
fn spawn_piped(command: &mut Command) -> std::process::Child {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The child's output, killing it if it has not ended within 20 s.
fn bounded_wait(mut child: std::process::Child) -> Output {
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Ended as a Unix tool ends when its reader goes away: by SIGPIPE, saying nothing (or, had the
/// write gone through before the reader left, normally).
fn ended_by_sigpipe(out: &Output, what: &str) {
    use std::os::unix::process::ExitStatusExt;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.signal() == Some(libc::SIGPIPE) || out.status.success(),
        "{what}: {:?} {stderr}",
        out.status
    );
    assert!(stderr.is_empty(), "{what}: {stderr}");
}

/// `submit` without `--body` at a terminal says what it wants instead of waiting without a word,
/// and writes nothing.
#[tokio::test]
async fn submit_at_a_terminal_without_a_body_asks_for_one() {
    let Ok(script) = which_script() else {
        eprintln!("skipped: no `script` to give the command a terminal");
        return;
    };
    let env = Env::new().await;
    for cmd in [
        "submit --provider sim --target t --approved-by a --caller c",
        "submit-batch --caller c",
    ] {
        let line = format!("{} {cmd}", env!("CARGO_BIN_EXE_jobtrail"));
        // A kill after 20 s (still waiting at the terminal) fails the exit-code check.
        let out = bounded_wait(spawn_piped(
            Command::new(&script)
                .args(["-qec", &line, "/dev/null"])
                .env("DATABASE_URL", &env.url)
                .env("JOBTRAIL_PROVIDERS", support::providers_dir()),
        ));
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {said}");
        assert!(said.contains("stdin is a terminal"), "{cmd}: {said}");
    }
    assert_eq!(
        env.store.totals().await.unwrap().0,
        0,
        "nothing was written"
    );
}

fn which_script() -> Result<std::path::PathBuf, ()> {
    ["/usr/bin/script", "/bin/script"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
        .ok_or(())
}

/// Settings in the environment that a typo would make mean something else (other logs, another
/// refresh) are refused at start, naming the variable; the forms documented are taken.
#[test]
fn misspelt_settings_in_the_environment_are_refused_not_ignored() {
    let contract = concat!(env!("CARGO_MANIFEST_DIR"), "/../../providers/sim.toml");
    let run = |args: &[&str], var: &str, value: &str| {
        Command::new(env!("CARGO_BIN_EXE_jobtrail"))
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("JOBTRAIL_LOG")
            .env_remove("JOBTRAIL_LOG_FORMAT")
            .env_remove("JOBTRAIL_METRICS_REFRESH")
            .env(var, value)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let check = ["contract", "check", contract];
    for (args, var, value) in [
        (&check[..], "JOBTRAIL_LOG_FORMAT", "jsn"),
        (&check[..], "JOBTRAIL_LOG", "jobtrail_worker=loud"),
        (&["worker"][..], "JOBTRAIL_METRICS_REFRESH", "30m"),
        (&["worker"][..], "JOBTRAIL_METRICS_REFRESH", "0"),
    ] {
        let out = run(args, var, value);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{var}={value}: {err}");
        assert!(err.contains(var), "{var}={value}: {err}");
    }
    for (var, value) in [
        ("JOBTRAIL_LOG_FORMAT", "JSON"),
        ("JOBTRAIL_LOG_FORMAT", "text"),
        ("JOBTRAIL_LOG", "info,jobtrail_worker=debug"),
    ] {
        let out = run(&check, var, value);
        assert_eq!(
            code(&out),
            0,
            "{var}={value}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A valid refresh gets past the check (to the missing database: exit 5).
    assert_eq!(
        code(&run(&["worker"], "JOBTRAIL_METRICS_REFRESH", "30s")),
        5
    );
}

/// Numbers a typo makes absurd are refused before anything starts: a demo of a hundred thousand
/// worker processes, a wait of centuries, a benchmark phase that does not exist (it ran nothing),
/// a page of nothing, a pool of no connections.
#[test]
fn absurd_demo_and_bench_flags_are_refused_before_anything_starts() {
    for args in [
        vec!["demo", "--workers", "33"],
        vec!["demo", "--operations", "0"],
        vec!["demo", "--timeout-secs", "18446744073709551615"],
        vec!["bench", "--phases", "e2"],
        // --quick sets the sizes: beside one given, it would override it unsaid.
        vec!["bench", "--quick", "--workers", "8"],
        vec!["bench", "--quick", "--clients", "64"],
        // Checked before a database is looked for (none is set here: that would be exit 5).
        vec!["list", "--limit", "0"],
        vec!["list", "--limit", "201"],
        vec!["list", "--db-pool", "0"],
        vec!["serve", "--stop-delay", "1h"],
        vec!["serve", "--results-per-caller", "0"],
        vec!["serve", "--bodies-per-caller", "0"],
        vec!["serve", "--webhook-bodies-per-provider", "0"],
        vec!["serve", "--send-timeout", "5s"],
        vec!["serve", "--send-timeout", "2h"],
        vec!["serve", "--head-timeout", "10s"],
        vec!["serve", "--head-timeout", "11m"],
        vec!["serve", "--request-timeout", "0s"],
        vec!["serve", "--request-timeout", "30"],
        vec!["serve", "--request-timeout", "11m"],
        vec!["serve", "--max-connections", "0"],
        // Who asks is usage, named before any database is looked for (it was exit 5 without one).
        vec![
            "submit",
            "--provider",
            "sim",
            "--target",
            "t",
            "--approved-by",
            "alice",
            "--body",
            "/dev/null",
        ],
        vec![
            "cancel",
            "op_01KB0000000000000000000000",
            "--actor",
            " ",
            "--reason",
            "r",
        ],
        // A duration needs its unit: `--idle 250` (meant as ms) was 250 seconds.
        vec!["worker", "--idle", "250"],
        vec!["worker", "--lease", "30"],
        vec!["serve", "--drain", "10"],
        vec!["serve", "--max-connections-per-address", "0"],
        vec!["serve", "--max-connections-per-address", "none"],
        // --json where nothing is printed as records is refused, not ignored.
        vec!["serve", "--json"],
        vec!["worker", "--json"],
        vec!["bench", "--json"],
        vec!["mcp", "--json"],
        vec!["result", "op_01KB0000000000000000000000", "--json"],
        // A password on the command line (every user reads the process list): refused, in both
        // spellings of the flag; the same URL in DATABASE_URL is taken.
        vec![
            "migrate",
            "--database-url",
            "postgres://jt:s3cr3t-pw@127.0.0.1:1/x",
        ],
        vec![
            "worker",
            "--database-url=postgres://jt:s3cr3t-pw@127.0.0.1:1/x",
        ],
        vec![
            "migrate",
            "--database-url",
            "postgres://jt@127.0.0.1:1/x?password=s3cr3t-pw",
        ],
        vec![
            "serve",
            "--operator-database-url",
            "postgres://op:s3cr3t-pw@127.0.0.1:1/x",
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
            .args(&args)
            .env_remove("DATABASE_URL")
            .env_remove("JOBTRAIL_CALLER")
            .env_remove("JOBTRAIL_API")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("s3cr3t"), "{args:?}: {err}");
        if args.iter().any(|a| a.contains("s3cr3t")) {
            assert!(err.contains("process list"), "{args:?}: {err}");
        }
    }
    let admin = Command::new(support::admin_bin())
        .args([
            "escalations",
            "--database-url",
            "postgres://jt:s3cr3t-pw@127.0.0.1:1/x",
        ])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&admin.stderr);
    assert_eq!(code(&admin), 2, "{err}");
    assert!(
        err.contains("process list") && !err.contains("s3cr3t"),
        "{err}"
    );
    // In the environment it is taken (and the database, not there, is unavailable: 5).
    let env = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
        .args(["migrate"])
        .env("DATABASE_URL", "postgres://jt:s3cr3t-pw@127.0.0.1:1/x")
        .output()
        .unwrap();
    assert_eq!(code(&env), 5, "{}", String::from_utf8_lossy(&env.stderr));
}

/// A submit straight to the database takes `JOBTRAIL_OPEN_PER_CALLER` as `jobtrail serve` does: past
/// it, refused (exit 5, naming the cap) with nothing written; a value that is no count is bad input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_submit_holds_the_caller_to_its_open_operations_cap() {
    let env = Env::new().await;
    let submit = |cap: &str| {
        support::run_bin_with(
            std::path::Path::new(env!("CARGO_BIN_EXE_jobtrail")),
            &env.url,
            &support::providers_dir(),
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
            Some(r#"{"account":"acct_1"}"#),
            &[("JOBTRAIL_OPEN_PER_CALLER", cap)],
        )
    };
    assert_eq!(code(&submit("1")), 0);
    let refused = submit("1");
    assert_eq!(code(&refused), 5);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--open-per-caller"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let bad = submit("ten");
    assert_eq!(code(&bad), 2, "{}", String::from_utf8_lossy(&bad.stderr));
    assert_eq!(env.store.totals().await.unwrap().0, 1, "one written");
    assert_eq!(code(&submit("2")), 0);
    // Commands that submit nothing are not refused for a submit setting they never use.
    for args in [&["list"][..], &["providers"][..]] {
        let out = support::run_bin_with(
            std::path::Path::new(env!("CARGO_BIN_EXE_jobtrail")),
            &env.url,
            &support::providers_dir(),
            args,
            None,
            &[("JOBTRAIL_OPEN_PER_CALLER", "10 000")],
        );
        assert_eq!(
            code(&out),
            0,
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
