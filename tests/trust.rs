//! The trust boundary around secrets, tried as an attacker would: a caller naming the worker host's
//! files and variables, a provider that quotes the request back, and secret sources that are devices
//! or FIFOs. Real worker processes, the simulated provider over real HTTP, a real PostgreSQL.

#[path = "support/mod.rs"]
mod support;

use jobtrail_core::State;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};
use support::{Env, TOKEN};

const CARD: &str = "4111-1111-SECRET-CARD-98";

fn jobtrail(env: &Env, providers: &Path, args: &[&str], stdin: &str) -> Output {
    support::run_bin(
        Path::new(env!("CARGO_BIN_EXE_jobtrail")),
        &env.url,
        providers,
        args,
        Some(stdin),
    )
}

fn submit(env: &Env, providers: &Path, body: &str) -> Output {
    jobtrail(
        env,
        providers,
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
        body,
    )
}

/// A copy of the shipped contracts with `sim.toml` changed by `tweak`.
fn providers_with(env: &Env, tweak: impl Fn(String) -> String) -> PathBuf {
    let dir = env
        .dir
        .join(format!("providers-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(dir.join("schemas")).unwrap();
    let src = support::providers_dir();
    for e in std::fs::read_dir(src.join("schemas")).unwrap().flatten() {
        std::fs::copy(e.path(), dir.join("schemas").join(e.file_name())).unwrap();
    }
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "toml") {
            let text = std::fs::read_to_string(e.path()).unwrap();
            let text = if e.file_name() == "sim.toml" {
                tweak(text)
            } else {
                text
            };
            std::fs::write(dir.join(e.file_name()), text).unwrap();
        }
    }
    dir
}

/// Everything the database holds, as text.
async fn dump(url: &str) -> String {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    let tables: Vec<(String,)> =
        sqlx::query_as("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
            .fetch_all(&mut c)
            .await
            .unwrap();
    let mut all = String::new();
    for (t,) in tables {
        let sql =
            format!("SELECT coalesce(string_agg(row_to_json(x)::text, E'\\n'), '') FROM {t} x");
        let (text,): (String,) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut c)
            .await
            .unwrap();
        all.push_str(&text);
    }
    // Result bytes as text too (row_to_json renders bytea as hex).
    let rows: Vec<(Vec<u8>,)> = sqlx::query_as("SELECT bytes FROM operation_results")
        .fetch_all(&mut c)
        .await
        .unwrap();
    for (b,) in rows {
        all.push_str(&String::from_utf8_lossy(&b));
    }
    all
}

/// Item 2: a caller names secrets only by names the operator granted for this provider, only at the
/// fields the contract marks sensitive — never a path or an environment variable. Every other
/// reference is refused at submit (exit 2) and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_names_only_granted_secrets_never_a_path_or_a_variable() {
    let env = Env::new().await;
    let providers = providers_with(&env, |t| {
        t + "\n[secrets.treasury_key]\nfrom = \"env:JOBTRAIL_TREASURY\"\ncallers = [\"finance-bot\"]\n"
    });
    for (body, says) in [
        (
            r#"{"payment":{"card_number":{"$secret":"env:JOBTRAIL_SIM_TOKEN"}}}"#,
            "never a path or an environment variable",
        ),
        (
            r#"{"payment":{"card_number":{"$secret":"file:/etc/passwd"}}}"#,
            "never a path or an environment variable",
        ),
        (
            r#"{"payment":{"card_number":{"$secret":"DATABASE_URL"}}}"#,
            "not granted",
        ),
        (
            r#"{"payment":{"card_number":{"$secret":"treasury_key"}}}"#,
            "not granted to caller \"agent-7\"",
        ),
        (
            r#"{"note":{"$secret":"customer_card"}}"#,
            "secrets may be named only at /payment/card_number",
        ),
        (
            r#"{"payment":{"card_number":"4111111111111111"}}"#,
            "name a granted secret",
        ),
    ] {
        let out = submit(&env, &providers, body);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{body}: {err}");
        assert!(err.contains(says), "{body}: {err}");
        assert!(
            !err.contains("4111111111111111"),
            "the value is never echoed"
        );
    }
    assert_eq!(
        env.store.totals().await.unwrap(),
        (0, 0, 0),
        "nothing written"
    );
    let ok = submit(
        &env,
        &providers,
        r#"{"payment":{"card_number":{"$secret":"customer_card"}}}"#,
    );
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

/// A person's retry of an agent's operation stays the agent's (its caller: the agent reads it
/// where `superseded_by` points), its submission link names the person, and the audit finds it
/// whole. Sent again unedited it is the agent's request, under the agent's grants; edited, it is
/// the person's too, who reaches no secret granted only to the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_retry_stays_the_agents_and_reaches_only_secrets_both_hold() {
    let env = Env::new().await;
    let providers = providers_with(&env, |t| {
        t + "\n[secrets.treasury_key]\nfrom = \"env:JOBTRAIL_TREASURY\"\ncallers = [\"agent-7\", \"bob\"]\n"
    });
    let _w = env.spawn_worker(
        "retries",
        "5s",
        &[
            ("JOBTRAIL_PROVIDERS", providers.to_str().unwrap()),
            ("JOBTRAIL_TREASURY", "treasury-secret-value"),
            ("JOBTRAIL_SIM_CARD", CARD),
        ],
    );
    let mut done = Vec::new();
    for n in 0..2 {
        let out = submit(
            &env,
            &providers,
            &format!(
                r#"{{"n":{n},"payment":{{"card_number":{{"$secret":"treasury_key"}}}},"sim":{{"duration_ms":100}}}}"#
            ),
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let op = env
            .wait_settled(id.parse().unwrap(), Duration::from_secs(30))
            .await;
        assert_eq!(op.state, State::Succeeded, "{}", env.logs());
        done.push(op);
    }
    let admin = |args: &[&str], stdin: Option<&str>| {
        support::run_bin(&support::admin_bin(), &env.url, &providers, args, stdin)
    };
    let retry = |op: &jobtrail_store::OperationRecord, actor: &str, body: Option<&str>| {
        let (id, seen) = (op.id.to_string(), format!("succeeded@{}", op.history_seq));
        let mut args = vec![
            "retry",
            &id,
            "--seen",
            &seen,
            "--actor",
            actor,
            "--reason",
            "run it again",
            "--json",
        ];
        if body.is_some() {
            args.extend(["--body", "-"]);
        }
        admin(&args, body)
    };

    // The retry a successful `retry` made.
    let retried = |out: Output| -> jobtrail_core::OperationId {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["operation_id"].as_str().unwrap().parse().unwrap()
    };

    // Unedited: the agent's own request, under the agent's grant (alice holds none).
    let again = retried(retry(&done[0], "alice", None));
    assert_eq!(
        env.store.get(done[0].id).await.unwrap().superseded_by,
        Some(again)
    );
    let rerun = env.wait_settled(again, Duration::from_secs(30)).await;
    assert_eq!(rerun.state, State::Succeeded, "{}", env.logs());
    // The agent's operation, not alice's: the agent reads it where the old one points (every
    // door scopes an agent's reads by caller).
    assert_eq!(rerun.caller, "agent-7");
    assert_eq!(
        rerun.approved_by, "alice",
        "a new paid run, approved by who retried it"
    );
    let first = &env.store.history(again).await.unwrap()[0];
    assert_eq!(first.actor, "alice");
    assert!(
        first.cause.starts_with("retried by alice for agent-7"),
        "{}",
        first.cause
    );
    // Edited, by a person the secret is not granted to: refused, nothing written.
    let edited =
        r#"{"n":9,"payment":{"card_number":{"$secret":"treasury_key"}},"sim":{"duration_ms":100}}"#;
    let before = env.store.totals().await.unwrap();
    let out = retry(&done[1], "alice", Some(edited));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("not granted to \"alice\", who edited the request on a retry"),
        "the person is named as the one who retried, not as its caller: {err}"
    );
    assert_eq!(env.store.totals().await.unwrap(), before, "nothing written");
    assert_eq!(env.store.get(done[1].id).await.unwrap().superseded_by, None);
    // …and by one it is granted to: the agent's operation still, approved by bob.
    let bobs = retried(retry(&done[1], "bob", Some(edited)));
    let bobs = env.wait_settled(bobs, Duration::from_secs(30)).await;
    assert_eq!(bobs.state, State::Succeeded, "{}", env.logs());
    assert_eq!(
        (bobs.caller.as_str(), bobs.approved_by.as_str()),
        ("agent-7", "bob")
    );
    // Whose grants every send of it checks: the agent's and bob's, whose edit it carries (the
    // unedited retry, the agent's alone), chained in its submission link.
    assert_eq!(bobs.edited_by.as_deref(), Some("bob"));
    assert_eq!(rerun.edited_by, None);
    let first = &env.store.history(bobs.id).await.unwrap()[0];
    assert_eq!(first.detail["edited_by"], "bob", "{}", first.detail);
    // Sent again unedited, by someone else, it is still bob's edit: his grant is still asked for.
    let again = retried(retry(&bobs, "alice", None));
    let again = env.store.get(again).await.unwrap();
    assert_eq!(again.edited_by.as_deref(), Some("bob"));
    let first = &env.store.history(again.id).await.unwrap()[0];
    assert_eq!(
        (&first.detail["retried_by"], &first.detail["edited_by"]),
        (&serde_json::json!("alice"), &serde_json::json!("bob"))
    );

    // The audit finds every chain whole: the caller the row names is the one the link records.
    let verified = admin(&["audit", "verify", "--all"], None);
    assert_eq!(
        verified.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&verified.stdout),
        String::from_utf8_lossy(&verified.stderr)
    );
    assert!(
        !dump(&env.url).await.contains("treasury-secret-value"),
        "the secret is never at rest"
    );
}

/// Items 2 and 4: a provider that quotes the request back. A 422 repeating the body, a result
/// repeating it, and a synchronous answer repeating it: the card number a caller may have *used* never reaches the call log, the history,
/// the stored results or the logs, and the caller cannot read it back through `jobtrail result`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_echoes_the_request_gets_no_secret_into_the_record_or_back_out() {
    let env = Env::new().await;
    let w = env.spawn_worker(
        "echo",
        "5s",
        &[("JOBTRAIL_SIM_CARD", CARD), ("JOBTRAIL_LOG", "trace")],
    );
    let body = |sim: serde_json::Value| {
        serde_json::to_vec(&serde_json::json!({
            "report": "usage", "payment": {"card_number": {"$secret": "customer_card"}}, "sim": sim,
        }))
        .unwrap()
    };
    let rejected = env
        .submit("sim", serde_json::json!({}), |s| {
            s.body = body(serde_json::json!({"create": ["reject_echo"]}))
        })
        .await;
    let echoed = env
        .submit("sim", serde_json::json!({}), |s| {
            s.body = body(serde_json::json!({"result": "echo_request"}))
        })
        .await;
    let sync = env
        .submit("sim", serde_json::json!({}), |s| {
            s.body = body(serde_json::json!({"create": ["sync_echo"], "duration_ms": 200}))
        })
        .await;
    // A result URL answering 404 with the token and the request quoted: no result, so its words
    // are the recorded reason, scrubbed like any other answer's.
    let gone = env
        .submit("sim", serde_json::json!({}), |s| {
            s.body = body(serde_json::json!({"result": "gone_echo", "duration_ms": 200}))
        })
        .await;
    let r = env.wait_settled(rejected.id, Duration::from_secs(40)).await;
    assert_eq!(r.state, State::Failed);
    let cause = env.store.history(r.id).await.unwrap().pop().unwrap().cause;
    assert!(
        cause.contains("invalid request") && cause.contains("[secret]"),
        "the quote is recorded, the value is not: {cause}"
    );
    let e = env.wait_settled(echoed.id, Duration::from_secs(40)).await;
    assert_eq!(
        e.state,
        State::ResultUnavailable,
        "a result repeating a credential is not kept"
    );
    // The synchronous answer quoting the card is not kept as the result: the create is ambiguous,
    // settled by resending the token (the provider's original job), and its own result fetched.
    let s = env.wait_settled(sync.id, Duration::from_secs(40)).await;
    assert_eq!(s.state, State::Succeeded, "{s:?}");
    let history = env.store.history(s.id).await.unwrap();
    assert!(
        history
            .iter()
            .any(|h| format!("{} {}", h.cause, h.detail)
                .contains("sync_result_repeats_a_credential")),
        "{history:?}"
    );
    let g = env.wait_settled(gone.id, Duration::from_secs(40)).await;
    assert_eq!(g.state, State::ResultUnavailable, "{g:?}");
    let cause = env.store.history(g.id).await.unwrap().pop().unwrap().cause;
    assert!(
        cause.contains("no result for") && cause.contains("[secret]"),
        "the answer's words are recorded, the secrets in them are not: {cause}"
    );
    drop(w);
    let all = dump(&env.url).await;
    assert!(all.len() > 1000);
    assert!(!all.contains(CARD), "the card number is stored");
    assert!(!all.contains(TOKEN), "the bearer token is stored");
    let logs = std::fs::read_to_string(env.dir.join("echo.log")).unwrap();
    assert!(
        !logs.contains(CARD) && !logs.contains(TOKEN),
        "a secret reached a log line"
    );
    let out = jobtrail(
        &env,
        &support::providers_dir(),
        &["result", &e.id.to_string()],
        "",
    );
    assert_eq!(out.status.code(), Some(1), "nothing to read back");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(CARD));
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Item 3: secret sources that are `/dev/zero` or FIFOs are refused, never read: the worker does not
/// grow, its runtime threads never block, and ordinary operations keep flowing beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_and_fifos_as_secret_sources_never_stall_or_bloat_a_worker() {
    let env = Env::new().await;
    let fifo = env.dir.join("secret-fifo");
    let c = std::ffi::CString::new(fifo.display().to_string()).unwrap();
    // SAFETY: creating a FIFO at a path this test owns.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fifo_text = fifo.display().to_string();
    let providers = providers_with(&env, move |t| {
        t + &format!(
            "\n[secrets.zero]\nfrom = \"file:/dev/zero\"\n[secrets.pipe]\nfrom = \"file:{fifo_text}\"\n"
        )
    });
    let w = env.spawn_worker(
        "steady",
        "5s",
        &[("JOBTRAIL_PROVIDERS", providers.to_str().unwrap())],
    );
    let mut hostile = Vec::new();
    for name in ["zero", "pipe", "pipe"] {
        let out = submit(
            &env,
            &providers,
            &format!(r#"{{"payment":{{"card_number":{{"$secret":"{name}"}}}},"sim":{{}}}}"#),
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        hostile.push(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    }
    let started = Instant::now();
    let ordinary = env
        .submit("sim", serde_json::json!({"duration_ms": 200}), |_| {})
        .await;
    let done = env.wait_settled(ordinary.id, Duration::from_secs(30)).await;
    assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "an ordinary operation waited {:?}",
        started.elapsed()
    );
    for id in &hostile {
        let op = env
            .wait_for(
                id.parse().unwrap(),
                "a refused create attempt",
                Duration::from_secs(20),
                |o| o.create_attempts >= 1,
            )
            .await;
        assert_eq!(op.state, State::CreatePending);
        let calls = env.store.calls(op.id).await.unwrap();
        assert!(
            calls
                .iter()
                .all(|c| c.error_class.as_deref() == Some("secret_unresolved")
                    && c.outcome.contains("not a regular file")),
            "{calls:?}"
        );
    }
    assert!(
        rss_kib(w.pid()) < 300 * 1024,
        "the worker grew to {} KiB",
        rss_kib(w.pid())
    );
    assert_eq!(env.sim.ledger().jobs_for_reference(&hostile[0]).len(), 0);
}

/// Every request a listener received: (path, headers).
#[derive(Clone, Default)]
struct Seen(std::sync::Arc<std::sync::Mutex<Vec<(String, axum::http::HeaderMap)>>>);

/// A listener on another loopback port that records every request and answers like a result store.
async fn recorder() -> (String, Seen) {
    use axum::response::IntoResponse;
    let seen = Seen::default();
    let s = seen.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri, headers: axum::http::HeaderMap| {
        let s = s.clone();
        async move {
            let at = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
            s.0.lock().unwrap().push((at, headers));
            let items: Vec<serde_json::Value> = (1..=5)
                .map(|i| serde_json::json!({"id": format!("item_{i}"), "status": "ok", "error": null}))
                .collect();
            let doc = serde_json::json!({"job_id": "elsewhere", "items": items}).to_string();
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                doc,
            )
                .into_response()
        }
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (base, seen)
}

/// Item 1: credentials and cookies go only to the origins a contract declares. A status or result
/// URL the provider names at another origin (another port is enough; the database's port too) is
/// refused and recorded, held for a person with the URL in the evidence; at an origin the contract
/// lists as unauthenticated (pre-signed result URLs), it is called without credentials, cookies or
/// the contract's query parameters, its own query as it was signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_and_cookies_never_follow_a_url_the_provider_names_elsewhere() {
    let (anonymous, anonymous_seen) = recorder().await;
    let (foreign, foreign_seen) = recorder().await;
    let anon_origin = url::Url::parse(&anonymous).unwrap().origin();
    let mut env = Env::with_contracts(move |c| {
        if c.name == "sim" {
            c.unauthenticated_origins = vec![anon_origin.clone()];
            // The contract's own query goes where its credentials go, never to a pre-signed URL
            // (whose signature covers its query: an added parameter would void it).
            c.query.insert("api-version".into(), "2024-01-01".into());
        }
    })
    .await;
    let status_away = env
        .submit(
            "sim",
            serde_json::json!({"status_url_elsewhere": format!("{foreign}/status/1")}),
            |_| {},
        )
        .await;
    let database = env
        .submit(
            "sim",
            serde_json::json!({"status_url_elsewhere": "http://127.0.0.1:5432/v1/jobs/1"}),
            |_| {},
        )
        .await;
    let result_away = env
        .submit(
            "sim",
            serde_json::json!({"result_url_elsewhere": format!("{foreign}/results/1")}),
            |_| {},
        )
        .await;
    let presigned = env
        .submit("sim", serde_json::json!({"result_url_elsewhere": format!("{anonymous}/bucket/r.json?X-Amz-Signature=abc")}), |_| {})
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    for (op, url) in [
        (&status_away, format!("{foreign}/status/1")),
        (&database, "http://127.0.0.1:5432/v1/jobs/1".to_owned()),
        (&result_away, format!("{foreign}/results/1")),
    ] {
        let held = env.wait_settled(op.id, Duration::from_secs(30)).await;
        assert_eq!(held.state, State::UrlRefused, "{}", op.id);
        assert!(held.escalated_at.is_some(), "held for a person");
        let last = env.store.history(op.id).await.unwrap().pop().unwrap();
        assert_eq!(last.event, "url_refused");
        assert_eq!(
            last.detail["evidence"]["refused_url"], url,
            "the URL is in the evidence"
        );
        let call = env.store.calls(op.id).await.unwrap().pop().unwrap();
        assert_eq!(call.error_class.as_deref(), Some("url_outside_origins"));
        assert!(call.http_status.is_none(), "nothing was sent");
    }
    assert!(
        foreign_seen.0.lock().unwrap().is_empty(),
        "the foreign listener received nothing"
    );
    let done = env
        .wait_settled(presigned.id, Duration::from_secs(30))
        .await;
    assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    let got = anonymous_seen.0.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "the pre-signed URL was fetched once");
    assert_eq!(got[0].0, "/bucket/r.json?X-Amz-Signature=abc");
    assert!(
        got[0].1.get("authorization").is_none(),
        "no credential went to it"
    );
    assert!(got[0].1.get("cookie").is_none(), "no cookie went to it");
    assert!(
        got[0].1.get("traceparent").is_some(),
        "the trace still travels"
    );
    // A person can see why and decide.
    let held = env.store.get(status_away.id).await.unwrap();
    assert!(held.escalation_reason.unwrap().contains(&foreign));
    env.stop_workers().await;
}

/// Item 9: terminal escapes and line breaks never reach a terminal: in a caller name they are refused
/// at the door, in a provider's text they are stored replaced (U+FFFD); and every human rendering
/// still escapes what a record holds (records written before these checks), never obeys it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_escapes_from_callers_and_providers_are_shown_not_obeyed() {
    let env = Env::new().await;
    // A caller with an escape and a forged second line never reaches the record: refused at the
    // door (every door validates the same way), nothing written.
    let forged = jobtrail_core::Submission {
        provider: "sim".into(),
        target: "reports".into(),
        body: br#"{"report": "usage"}"#.to_vec(),
        caller: "agent\u{1b}[2J\napproved by security team".into(),
        approved_by: "tester".into(),
        ..Default::default()
    };
    let err = env
        .store
        .submit_new(
            &forged,
            &env.registry.terms(),
            jobtrail_core::SubmitLimits::default(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("control character"), "{err}");
    // A provider's escapes (a binary rejection body) are stored replaced, and shown as such.
    let op = env
        .submit(
            "sim",
            serde_json::json!({"create": ["reject_binary"]}),
            |_| {},
        )
        .await;
    let _w = env.spawn_worker("w1", "5s", &[]);
    env.wait_settled(op.id, Duration::from_secs(30)).await;
    let out = jobtrail(
        &env,
        &support::providers_dir(),
        &["show", &op.id.to_string()],
        "",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains('\u{1b}'),
        "an escape reached the terminal:\n{text}"
    );
    assert!(
        text.contains("r\u{FFFD}e\u{FFFD}j"),
        "shown replaced:\n{text}"
    );
    // A provider's JSON as a record holds it (progress, a result summary): JSON leaves a
    // direction override and a line separator as they are, and `show` escapes them.
    let pool = sqlx::PgPool::connect(&env.url).await.unwrap();
    sqlx::query(
        r#"UPDATE operations SET remote_progress = '{"note": "\u202e evil \u2028 line"}',
           result_summary = '{"verdict": "\u202e\u2066ok"}' WHERE id = $1"#,
    )
    .bind(op.id.as_uuid())
    .execute(&pool)
    .await
    .unwrap();
    let out = jobtrail(
        &env,
        &support::providers_dir(),
        &["show", &op.id.to_string()],
        "",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for c in ['\u{202e}', '\u{2028}', '\u{2066}'] {
        assert!(!text.contains(c), "{c:?} reached the terminal:\n{text}");
    }
    assert!(text.contains("\\u{202e} evil"), "{text}");

    // A job polled for days: its start and its latest are shown, and how many between are not.
    let record = env.store.get(op.id).await.unwrap();
    let history = env.store.history(op.id).await.unwrap();
    let mut calls = env.store.calls(op.id).await.unwrap();
    let first = calls[0].clone();
    for i in 1..5000 {
        let mut c = first.clone();
        c.started_at += chrono::Duration::seconds(i);
        c.outcome = format!("poll {i}");
        calls.push(c);
    }
    // A person's decision among the reads is never among what is left out.
    let mut history = history;
    let mut decided = history.last().unwrap().clone();
    decided.at = first.started_at + chrono::Duration::seconds(2500);
    decided.event = "abandon".into();
    decided.actor = "alice".into();
    decided.cause = "a person decided here".into();
    history.push(decided);
    let story = jobtrail_console::timeline::render(&record, &history, &calls);
    let total = history.len() + calls.len();
    assert!(
        story.lines().count() < 1000,
        "{} lines",
        story.lines().count()
    );
    assert!(
        story.contains("poll 4999") && !story.contains("poll 2000 "),
        "the latest, not the middle"
    );
    assert!(story.contains("a person decided here"), "{story}");
    let left_out: usize = story
        .lines()
        .filter_map(|l| {
            l.split("… ")
                .nth(1)?
                .split(" more")
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum();
    assert_eq!(left_out, total - 421, "every row is shown or counted");
}
