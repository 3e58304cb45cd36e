//! The database goes away and comes back: a worker process reconnects with backoff, resumes, and
//! loses nothing. (Its own test binary: it stops and starts its own private cluster.)

#[path = "support/mod.rs"]
mod support;

use jobtrail_core::State;
use jobtrail_store::cluster::{Cluster, ensure_database};
use std::time::{Duration, Instant};
use support::{Env, ops_address};

/// A private cluster this test may stop and start, with a migrated database `name` on it, and an
/// environment over it.
async fn on_a_cluster_of_its_own(name: &str) -> (Cluster, Env) {
    let cluster = tokio::task::spawn_blocking(|| Cluster::throwaway(std::process::id()))
        .await
        .unwrap()
        .unwrap();
    ensure_database(&cluster.url("postgres"), name)
        .await
        .unwrap();
    let url = cluster.url(name);
    let store = jobtrail_store::Store::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    store.close().await;
    (cluster, Env::on(url, None).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_survives_the_database_going_away_and_coming_back() {
    let (cluster, env) = on_a_cluster_of_its_own("outage").await;

    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(
            env.submit(
                "sim",
                serde_json::json!({"duration_ms": 3000 + i * 100}),
                |_| {},
            )
            .await
            .id,
        );
    }
    let mut w = env.spawn_worker("survivor", "5s", &[]);
    let server = env.serve("api");
    let token = env.token("agent-a", &["read"]).await;
    env.wait_state(ids[0], State::Observing, Duration::from_secs(30))
        .await;

    // Pull the database out from under it for three seconds at least.
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop())
        .await
        .unwrap()
        .unwrap();
    let away = Instant::now();
    // An agent meanwhile is told when to come back (the pool's wait for a connection, 10 s, ends
    // before the route's bound, whose answer says 5).
    let r = tokio::time::timeout(
        Duration::from_secs(40),
        support::http()
            .get(server.url("/v1/operations"))
            .bearer_auth(&token)
            .send(),
    )
    .await
    .expect("answered within its bound")
    .expect("an answer");
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("2"),
        "{:?}",
        r.headers()
    );
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(away.elapsed())).await;
    assert!(
        w.child.try_wait().unwrap().is_none(),
        "the worker died with the database\n{}",
        env.logs()
    );
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.start())
        .await
        .unwrap()
        .unwrap();

    let store = jobtrail_store::Store::connect(&env.url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    for id in &ids {
        loop {
            let op = store.get(*id).await.unwrap();
            if op.state == State::Succeeded {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{id} is {} after the outage\n{}",
                op.state,
                env.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(env.sim.ledger().max_jobs_per_token(), 1);
    assert!(store.verify_all().await.unwrap().is_clean());
    let logs = std::fs::read_to_string(env.dir.join("survivor.log")).unwrap();
    assert!(
        logs.contains("database may be away") || logs.contains("database unavailable"),
        "the outage was noticed:\n{logs}"
    );
    w.stop_cleanly();
}

/// A worker and an API server started while their database is down (a pod scheduled before its
/// database, a failover at deploy time) wait for it: alive, not ready, saying why, and at work
/// once it is back. Exiting instead would have their orchestrator restart them ever more slowly
/// (Kubernetes' CrashLoopBackOff: up to 5 minutes) after the database returned. What waiting
/// cannot mend (a database that does not exist) still exits 5 at once, as `--db-wait 0s` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_and_a_server_started_while_the_database_is_down_wait_for_it() {
    let (cluster, env) = on_a_cluster_of_its_own("waited").await;
    let id = env
        .submit("sim", serde_json::json!({"duration_ms": 300}), |_| {})
        .await
        .id;
    // Over TCP, as in a cluster: a port where nothing listens is refused, and that is waited for.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tcp_url = format!("postgres://postgres@127.0.0.1:{closed}/x?sslmode=disable");
    let mut over_tcp = env.spawn_worker("over-tcp", "5s", &[("DATABASE_URL", tcp_url.as_str())]);
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop())
        .await
        .unwrap()
        .unwrap();

    // Told not to wait: exit 5 at once, naming where it could not connect.
    let mut hasty = env.spawn_worker("hasty", "5s", &[("JOBTRAIL_DB_WAIT", "0s")]);
    // Told to wait 3 s: it tries again, says why, and exits 5 once no attempt may start.
    let mut brief = env.spawn_worker("brief", "5s", &[("JOBTRAIL_DB_WAIT", "3s")]);
    let (code, said) = exited(&mut hasty, 30);
    assert_eq!(code, Some(5), "{said}");
    assert!(said.contains("no connection to"), "{said}");
    assert!(!said.contains("trying again"), "{said}");
    let (code, said) = exited(&mut brief, 30);
    assert_eq!(code, Some(5), "{said}");
    assert!(said.contains("trying again in 2 s"), "{said}");

    let mut w = env.spawn_worker("patient", "5s", &[("JOBTRAIL_OPS_LISTEN", "127.0.0.1:0")]);
    let mut api = serve_waiting(&env, "patient-api", "127.0.0.1:0");
    let mut quitter = env.spawn_worker("quitter", "5s", &[]);
    let (w_ops, api_ops) = (ops_address(&w.log), ops_address(&api.log));
    for base in [&w_ops, &api_ops] {
        assert_eq!(status(&format!("{base}/livez")).await, 200);
        let (code, said) = answer(&format!("{base}/readyz")).await;
        assert_eq!(code, 503, "{said}");
        assert!(
            said.contains("starting: waiting for the database"),
            "{said}"
        );
    }
    let said = until_logged(&w.log, "trying again in 2 s");
    assert!(said.contains("no connection to"), "{said}");
    until_logged(&api.log, "trying again in 2 s");
    // An agent meanwhile is told to come back, not refused a connection.
    let api_base = support::announced(&api.log, "bound to ");
    let starting = support::http()
        .get(format!("{api_base}/v1/operations"))
        .send()
        .await
        .expect("GET while starting");
    assert_eq!(starting.status(), 503);
    assert_eq!(starting.headers()["retry-after"], "2");
    assert_eq!(starting.headers()["connection"], "close");
    assert_eq!(
        starting.headers()["content-type"],
        jobtrail_api::PROBLEM_JSON
    );
    let doc: serde_json::Value = starting.json().await.unwrap();
    assert_eq!(doc["kind"], "unavailable", "{doc}");
    assert!(
        doc["detail"].as_str().unwrap().starts_with("starting"),
        "{doc}"
    );
    assert_eq!(doc["extra"]["retry_after_secs"], 2, "{doc}");
    // A port already taken is said at once, not once the database is back.
    let taken = api_base.trim_start_matches("http://");
    let mut clash = serve_waiting(&env, "clashing-api", taken);
    let (code, said) = exited(&mut clash, 10);
    assert_eq!(code, Some(5), "{said}");
    assert!(said.contains(&format!("--listen {taken}")), "{said}");
    assert!(!said.contains("trying again"), "{said}");
    let said = until_logged(&over_tcp.log, "trying again in 2 s");
    assert!(
        said.contains(&format!("no connection to 127.0.0.1:{closed}")),
        "{said}"
    );
    over_tcp.signal(libc::SIGTERM);
    assert_eq!(
        over_tcp
            .wait_exit(Duration::from_secs(20))
            .and_then(|s| s.code()),
        Some(0)
    );
    // Asked to stop while waiting: it holds nothing, and goes at once.
    until_logged(&quitter.log, "trying again in 2 s");
    quitter.signal(libc::SIGTERM);
    let (code, said) = exited(&mut quitter, 10);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("stopped while waiting for the database"),
        "{said}"
    );

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.start())
        .await
        .unwrap()
        .unwrap();
    let done = env.wait_settled(id, Duration::from_secs(60)).await;
    assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    until_logged(&w.log, "the database answers");
    until_logged(&api.log, "listening on");
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&format!("{w_ops}/readyz")).await != 200 {
        assert!(Instant::now() < deadline, "the worker never became ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(status(&format!("{api_ops}/readyz")).await, 200);
    // The API itself answers on the address it held: a request without a token is refused as such.
    assert_eq!(status(&format!("{api_base}/v1/operations")).await, 401);

    // A database that is not there at all is no outage: waiting would not mend it.
    let mut lost = env.spawn_worker(
        "lost",
        "5s",
        &[("DATABASE_URL", cluster.url("nonesuch").as_str())],
    );
    let (code, said) = exited(&mut lost, 30);
    assert_eq!(code, Some(5), "{said}");
    assert!(!said.contains("trying again"), "{said}");

    for p in [&mut w, &mut api] {
        p.signal(libc::SIGTERM);
        assert_eq!(
            p.wait_exit(Duration::from_secs(30)).and_then(|s| s.code()),
            Some(0)
        );
    }
}

/// `jobtrail serve` on `listen` with an operations listener, not waited for (it is at work only
/// once its database answers).
fn serve_waiting(env: &Env, name: &str, listen: &str) -> support::WorkerProcess {
    let log = env.dir.join(format!("{name}.log"));
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_jobtrail"))
        .args(["serve", "--listen", listen, "--drain", "1s"])
        .args(["--ops-listen", "127.0.0.1:0"])
        .env("DATABASE_URL", &env.url)
        .env("JOBTRAIL_PROVIDERS", &env.providers)
        .env("JOBTRAIL_SIM_TOKEN", support::TOKEN)
        .env_remove("JOBTRAIL_OPERATOR_DATABASE_URL")
        .env_remove("JOBTRAIL_DB_WAIT")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn jobtrail serve");
    support::WorkerProcess {
        child,
        log,
        id: name.into(),
    }
}

async fn status(url: &str) -> u16 {
    answer(url).await.0
}

/// A GET's status and body.
async fn answer(url: &str) -> (u16, String) {
    let r = support::http().get(url).send().await.expect("GET");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// Connected, then held up before the schema read that follows (a lock on the migrations table,
/// as a session left in a transaction would hold; the same path as a connection lost just after
/// it was made): an outage like any other, waited out at start, not an exit into the
/// orchestrator's ever slower restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_read_held_up_at_start_is_waited_out() {
    use sqlx::Connection;
    let env = Env::new().await;
    let mut holder = sqlx::PgConnection::connect(&env.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("LOCK TABLE _sqlx_migrations IN ACCESS EXCLUSIVE MODE")
        .execute(&mut holder)
        .await
        .unwrap();
    let mut w = env.spawn_worker("held-up", "5s", &[("JOBTRAIL_OPS_LISTEN", "127.0.0.1:0")]);
    let ops = ops_address(&w.log);
    // A session's lock waits end after 10 s; the first attempt then fails, and is tried again.
    let said = until_logged(&w.log, "trying again in 2 s");
    assert!(said.contains("checking the database schema"), "{said}");
    assert_eq!(w.child.try_wait().unwrap(), None, "{said}");
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&format!("{ops}/readyz")).await != 200 {
        assert!(
            Instant::now() < deadline,
            "never ready: {}",
            std::fs::read_to_string(&w.log).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let id = env
        .submit("sim", serde_json::json!({"duration_ms": 100}), |_| {})
        .await
        .id;
    assert_eq!(
        env.wait_settled(id, Duration::from_secs(30)).await.state,
        State::Succeeded,
        "{}",
        env.logs()
    );
    w.stop_cleanly();
}

/// How `p` exited (waited for up to `secs`), and what its log said.
fn exited(p: &mut support::WorkerProcess, secs: u64) -> (Option<i32>, String) {
    let code = p
        .wait_exit(Duration::from_secs(secs))
        .and_then(|s| s.code());
    (code, std::fs::read_to_string(&p.log).unwrap())
}

/// The log once it says `what` (bounded).
fn until_logged(log: &std::path::Path, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(what) {
            return text;
        }
        assert!(Instant::now() < deadline, "never said {what:?}:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The database's answer is lost without a word: a COMMIT reaches the server and commits, and then
/// nothing more comes back on that connection, which stays open (a failover that takes the old
/// primary's address with it; a dropped route). The driver sets no TCP keepalive, so only the
/// worker's own bound ends the wait: each silenced round trip is given up after the lease, the
/// worker goes on over fresh connections, and every operation still finishes with one job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_goes_on_when_the_database_stops_answering_on_a_connection() {
    let env = Env::new().await;
    let proxy = silencing::Proxy::start(&env.url).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(
            env.submit(
                "sim",
                serde_json::json!({"duration_ms": 1500 + i * 100}),
                |_| {},
            )
            .await
            .id,
        );
    }
    let url = proxy.url();
    // A pool of two: each connection given up must be closed, not kept (a kept one held its slot
    // for as long as the silent socket stayed open, and three lost answers left none).
    let mut w = env.spawn_worker(
        "unanswered",
        "3s",
        &[
            ("DATABASE_URL", url.as_str()),
            ("JOBTRAIL_DB_POOL", "2"),
            ("JOBTRAIL_DB_ANSWER_WITHIN", "3s"),
        ],
    );
    env.wait_state(ids[0], State::Observing, Duration::from_secs(30))
        .await;
    // The next three transactions to commit (claims, batches of steps) lose their answers.
    proxy.silence_next_commits(3);

    let deadline = Instant::now() + Duration::from_secs(60);
    for id in &ids {
        loop {
            let op = env.store.get(*id).await.unwrap();
            if op.state == State::Succeeded {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{id} is {} with {} answers lost\n{}",
                op.state,
                proxy.silenced(),
                env.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(proxy.silenced(), 3, "the proxy silenced three commits");
    let logs = std::fs::read_to_string(env.dir.join("unanswered.log")).unwrap();
    assert!(
        logs.contains("no answer from the database within 3.0 s"),
        "the lost answers were given up:\n{logs}"
    );
    assert_eq!(env.sim.ledger().max_jobs_per_token(), 1);
    assert!(env.store.verify_all().await.unwrap().is_clean());
    w.stop_cleanly();
}

/// A lease extension the database never answers, before a create is sent: the worker gives the
/// operation back with nothing sent, and the next claim sends the create. It is not taken as a
/// create sent and unanswered (reconciled, or held for a person where the contract cannot look
/// one up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_extension_lost_before_a_create_leaves_the_create_unsent_not_ambiguous() {
    let env = Env::new().await;
    let proxy = silencing::Proxy::start(&env.url).await;
    // The sim's calls may take 3 s, more than the 3 s lease: every call extends it first. The
    // first extension's connection goes silent.
    proxy.silence_next(b"Extend a live lease", 1);
    let op = env
        .submit("sim", serde_json::json!({"duration_ms": 300}), |_| {})
        .await
        .id;
    let url = proxy.url();
    let mut w = env.spawn_worker(
        "extends",
        "3s",
        &[
            ("DATABASE_URL", url.as_str()),
            ("JOBTRAIL_DB_ANSWER_WITHIN", "1s"),
        ],
    );
    env.wait_state(op, State::Succeeded, Duration::from_secs(30))
        .await;
    assert_eq!(proxy.silenced(), 1, "the extension went unanswered");
    let logs = std::fs::read_to_string(env.dir.join("extends.log")).unwrap();
    assert!(logs.contains("could not plan a step"), "{logs}");
    let events: Vec<String> = env
        .store
        .history(op)
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.event)
        .collect();
    assert!(
        !events.iter().any(|e| e == "create_ambiguous"),
        "{events:?}"
    );
    assert_eq!(env.sim.ledger().max_jobs_per_token(), 1);
    assert!(env.store.verify_all().await.unwrap().is_clean());
    w.stop_cleanly();
}

/// A create answered while the database stops answering the worker's writes until its lease runs
/// out: the step is not written, but the call was made (the job exists, its id in the answer), so
/// it is logged in the operation's call chain when the database answers again, as a refused
/// step's call is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_step_could_not_be_written_is_still_in_the_call_log() {
    let env = Env::new().await;
    let proxy = silencing::Proxy::start(&env.url).await;
    let op = env
        .submit("sim", serde_json::json!({"duration_ms": 300}), |_| {})
        .await
        .id;
    // More silent writes than fit in the lease (each given up after 1 s, retried while the 5 s
    // the create extended it to last: four); the rest silence a later write, retried.
    proxy.silence_next(b"Lock the row for a fenced write", 5);
    let url = proxy.url();
    let mut w = env.spawn_worker(
        "unwritten",
        "3s",
        &[
            ("DATABASE_URL", url.as_str()),
            ("JOBTRAIL_DB_ANSWER_WITHIN", "1s"),
        ],
    );
    env.wait_state(op, State::Succeeded, Duration::from_secs(90))
        .await;
    assert_eq!(proxy.silenced(), 5);
    let logs = std::fs::read_to_string(env.dir.join("unwritten.log")).unwrap();
    assert!(logs.contains("could not write a step"), "{logs}");
    // Every create that reached the provider is in the call log (the one whose step was not
    // written, and the resend that reconciled it).
    let calls = env.store.calls(op).await.unwrap();
    let logged = calls.iter().filter(|c| c.kind == "create").count();
    let reached: u32 = env.sim.ledger().create_requests.values().sum();
    assert!(reached >= 2, "the create was sent again: {reached}");
    assert_eq!(
        logged as u32,
        reached,
        "{:?}",
        calls
            .iter()
            .map(|c| (&c.kind, c.http_status))
            .collect::<Vec<_>>()
    );
    assert_eq!(env.sim.ledger().max_jobs_per_token(), 1);
    assert!(env.store.verify_all().await.unwrap().is_clean());
    w.stop_cleanly();
}

/// A synchronous result read back from the database is a round trip like any other: a
/// connection gone silent in the middle of it is given up after `--db-answer-within`, and the
/// operation goes back to be tried again at once, not held (with its slot, and the room taken for
/// its bytes) until its lease runs out, or for as long as the worker runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_read_back_over_a_silent_connection_is_given_up() {
    let env = Env::new().await;
    let proxy = silencing::Proxy::start(&env.url).await;
    proxy.silence_next(b"SELECT bytes FROM operation_results", 1);
    let id = env
        .submit("sim", serde_json::json!({"create": ["sync"]}), |_| {})
        .await
        .id;
    let url = proxy.url();
    let mut w = env.spawn_worker(
        "result-read",
        "60s",
        &[
            ("DATABASE_URL", url.as_str()),
            ("JOBTRAIL_DB_ANSWER_WITHIN", "3s"),
        ],
    );
    // Well before the 60 s lease could end.
    let done = env.wait_settled(id, Duration::from_secs(25)).await;
    assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    assert_eq!(proxy.silenced(), 1, "the read was silenced once");
    let logs = std::fs::read_to_string(env.dir.join("result-read.log")).unwrap();
    assert!(
        logs.contains("no answer from the database within 3.0 s"),
        "{logs}"
    );
    w.stop_cleanly();
}

/// The database stops answering on one of the API server's connections in the middle of a
/// request: past `--request-timeout` the request is stopped and answered `unavailable` with when to
/// come back, an HTTP route and an MCP tool call alike (the MCP answer is a stream sent at once,
/// so no route bound stopped its call: it held its turn and its connection for as long as the
/// socket stayed open). The next request, on another connection, is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_database_stops_answering_is_stopped_at_its_bound() {
    let env = Env::new().await;
    let proxy = silencing::Proxy::start(&env.url).await;
    let op = env
        .submit("sim", serde_json::json!({"duration_ms": 100}), |_| {})
        .await;
    let token = env.token(&op.caller, &["read"]).await;
    let url = proxy.url();
    let server = env.serve_with(
        "bounded",
        &[
            ("DATABASE_URL", url.as_str()),
            ("JOBTRAIL_REQUEST_TIMEOUT", "2s"),
        ],
    );
    let c = support::http();
    // The doors' read of one operation (every column but the request body).
    let get_op = b"'null'::jsonb AS request_body";
    let read = || async {
        c.get(server.url(&format!("/v1/operations/{}", op.id)))
            .bearer_auth(&token)
            .timeout(Duration::from_secs(20))
            .send()
            .await
            .unwrap()
    };

    proxy.silence_next(get_op, 1);
    let started = Instant::now();
    let r = read().await;
    assert_eq!(r.status(), 503, "{}", server.log_text());
    assert_eq!(r.headers()["retry-after"], "5");
    let body = r.text().await.unwrap();
    assert!(body.contains("did not finish within 2s"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(proxy.silenced(), 1);

    // Over MCP, on a connection that has not read an operation yet (its text is sent again).
    let session = support::mcp_session(&server, &token).await;
    proxy.silence_next(get_op, 1);
    let started = Instant::now();
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "get_operation", "arguments": {"operation_id": op.id.to_string()}}});
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        support::mcp_post(&server, &token, Some(&session), call)
            .await
            .text(),
    )
    .await
    .expect("the tool call is answered within its bound")
    .unwrap();
    assert!(answer.contains(r#""id":9"#), "{answer}");
    assert!(answer.contains(r#""isError":true"#), "{answer}");
    assert!(
        answer.contains(r#"\"error\":\"unavailable\""#)
            || answer.contains(r#""error":"unavailable""#),
        "{answer}"
    );
    assert!(answer.contains("did not finish within 2s"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(proxy.silenced(), 2, "{}", server.log_text());

    // A submit without an id stopped at its bound may have landed: the refusal names the id made
    // up for it, and the same request under that id is one operation, however often sent.
    let submitter = env.token("agent-9", &["submit", "read"]).await;
    let session = support::mcp_session(&server, &submitter).await;
    let request = serde_json::json!({"provider": "sim", "target": "reports",
        "approved_by": "alice", "request": {"account": "acct_9", "sim": {"duration_ms": 100}}});
    let submit = |id: u32, args: serde_json::Value| {
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "submit_operation", "arguments": args}})
    };
    // The submit's read of the database's clock, the first statement of its transaction.
    proxy.silence_next(b"(every deadline and decision uses this one clock)", 1);
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        support::mcp_post(
            &server,
            &submitter,
            Some(&session),
            submit(10, request.clone()),
        )
        .await
        .text(),
    )
    .await
    .expect("the submit is answered within its bound")
    .unwrap();
    assert_eq!(proxy.silenced(), 3, "{answer}");
    assert!(answer.contains("did not finish within 2s"), "{answer}");
    let minted = answer
        .split("under the id ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no id named: {answer}"))
        .to_owned();
    assert!(minted.starts_with("op_"), "{answer}");
    let mut again = request.clone();
    again["id"] = minted.clone().into();
    for n in [11, 12] {
        let answer = support::mcp_post(
            &server,
            &submitter,
            Some(&session),
            submit(n, again.clone()),
        )
        .await
        .text()
        .await
        .unwrap();
        assert!(
            answer.contains(&minted) && !answer.contains("isError\":true"),
            "{answer}"
        );
    }
    assert_eq!(
        operations_of(&env.url, "agent-9").await,
        [minted],
        "one operation, under the id named"
    );

    // The same over HTTP, one submit and a batch, each stopped after its COMMIT went to the
    // database (the answer never came back): it landed, under the id the refusal names.
    let agent = env.token("agent-10", &["submit", "read"]).await;
    let item = |n: u32| {
        serde_json::json!({"provider": "sim", "target": "reports", "approved_by": "alice",
            "request": {"account": format!("acct_{n}"), "sim": {"duration_ms": 100}}})
    };
    let post = |server: &support::Server, path: &'static str, body: serde_json::Value| {
        let c = c.clone();
        let (to, agent) = (server.url(path), agent.clone());
        async move {
            let r = c
                .post(to)
                .bearer_auth(&agent)
                .json(&body)
                .timeout(Duration::from_secs(20))
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let batch = |items: Vec<serde_json::Value>| serde_json::json!({"operations": items});
    for (path, body) in [
        ("/v1/operations", item(1)),
        (
            "/v1/operations:batch",
            batch(vec![item(2), {
                let mut named = item(3);
                named["id"] = jobtrail_core::OperationId::fresh().to_string().into();
                named
            }]),
        ),
    ] {
        let server = env.serve_with(
            "bounded-http",
            &[
                ("DATABASE_URL", url.as_str()),
                ("JOBTRAIL_REQUEST_TIMEOUT", "2s"),
            ],
        );
        let silenced = proxy.silenced();
        proxy.silence_next_commits(1);
        let (status, problem) = post(&server, path, body.clone()).await;
        assert_eq!(status, 503, "{path}: {problem}");
        assert_eq!(proxy.silenced(), silenced + 1, "{path}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("made up for"), "{path}: {detail}");
        // Sent again (twice) under the ids named: each item is one operation.
        let again = match problem["extra"]["operation_id"].as_str() {
            Some(id) => {
                assert!(detail.contains(id), "{path}: {detail}");
                let mut one = body.clone();
                one["id"] = id.into();
                one
            }
            None => {
                let ids = problem["extra"]["operation_ids"].as_array().unwrap();
                let items = body["operations"].as_array().unwrap();
                assert_eq!(ids.len(), items.len(), "{problem}");
                assert_eq!(items[1]["id"], ids[1], "a given id is listed as given");
                batch(
                    items
                        .iter()
                        .zip(ids)
                        .map(|(item, id)| {
                            let mut item = item.clone();
                            item["id"] = id.clone();
                            item
                        })
                        .collect(),
                )
            }
        };
        for _ in 0..2 {
            let (status, answer) = post(&server, path, again.clone()).await;
            // Nothing new: 200, for one submit as for a batch.
            assert_eq!(status, 200, "{path}: {answer}");
            let answers = answer["operations"]
                .as_array()
                .cloned()
                .unwrap_or_else(|| vec![answer.clone()]);
            assert!(
                answers.iter().all(|a| a["created"] == false),
                "the submit had landed under the ids named: {answer}"
            );
        }
    }
    assert_eq!(
        operations_of(&env.url, "agent-10").await.len(),
        3,
        "one operation per submission, under the ids named"
    );

    // Nothing is silenced now: answered.
    let r = read().await;
    assert_eq!(r.status(), 200, "{}", server.log_text());
    assert!(
        server
            .log_text()
            .contains("a call ran past its time bound and was stopped"),
        "{}",
        server.log_text()
    );
}

/// The ids of `caller`'s operations, read straight from the database.
async fn operations_of(url: &str, caller: &str) -> Vec<String> {
    let ids: Vec<(uuid::Uuid,)> = sqlx::query_as("SELECT id FROM operations WHERE caller = $1")
        .bind(caller)
        .fetch_all(
            &mut <sqlx::PgConnection as sqlx::Connection>::connect(url)
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    ids.into_iter()
        .map(|(id,)| jobtrail_core::OperationId::from_uuid(id).to_string())
        .collect()
}

mod silencing {
    //! A TCP proxy in front of PostgreSQL that, when told, lets the next few COMMITs through to
    //! the server and then goes silent on their connections: nothing more is forwarded either way,
    //! and the sockets stay open.

    use sqlx::postgres::PgConnectOptions;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    pub struct Proxy {
        port: u16,
        upstream: PgConnectOptions,
        armed: Arc<AtomicUsize>,
        silenced: Arc<AtomicUsize>,
        pattern: Arc<std::sync::Mutex<Vec<u8>>>,
        accept: tokio::task::JoinHandle<()>,
    }

    impl Drop for Proxy {
        fn drop(&mut self) {
            self.accept.abort();
        }
    }

    type Half<T> = Box<T>;

    async fn connect(
        to: &PgConnectOptions,
    ) -> std::io::Result<(
        Half<dyn AsyncRead + Unpin + Send>,
        Half<dyn AsyncWrite + Unpin + Send>,
    )> {
        if let Some(dir) = to.get_socket() {
            let path = dir.join(format!(".s.PGSQL.{}", to.get_port()));
            let (r, w) = tokio::net::UnixStream::connect(path).await?.into_split();
            Ok((Box::new(r), Box::new(w)))
        } else {
            let (r, w) = TcpStream::connect((to.get_host(), to.get_port()))
                .await?
                .into_split();
            Ok((Box::new(r), Box::new(w)))
        }
    }

    impl Proxy {
        pub async fn start(url: &str) -> Self {
            let upstream: PgConnectOptions = url.parse().unwrap();
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let armed = Arc::new(AtomicUsize::new(0));
            let silenced = Arc::new(AtomicUsize::new(0));
            let pattern = Arc::new(std::sync::Mutex::new(b"COMMIT\0".to_vec()));
            let (to, a, s, p) = (
                upstream.clone(),
                armed.clone(),
                silenced.clone(),
                pattern.clone(),
            );
            let accept = tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (to, a, s, p) = (to.clone(), a.clone(), s.clone(), p.clone());
                    tokio::spawn(async move {
                        if let Ok(server) = connect(&to).await {
                            relay(client, server, a, s, p).await;
                        }
                    });
                }
            });
            Self {
                port,
                upstream,
                armed,
                silenced,
                pattern,
                accept,
            }
        }

        /// The same database, through this proxy.
        pub fn url(&self) -> String {
            format!(
                "postgres://{}@127.0.0.1:{}/{}?sslmode=disable",
                self.upstream.get_username(),
                self.port,
                self.upstream.get_database().unwrap()
            )
        }

        pub fn silence_next_commits(&self, n: usize) {
            self.silence_next(b"COMMIT\0", n);
        }

        /// Silence the next `n` connections to send a message holding `pattern` (a query's text).
        pub fn silence_next(&self, pattern: &[u8], n: usize) {
            *self.pattern.lock().unwrap() = pattern.to_vec();
            self.armed.store(n, Ordering::SeqCst);
        }

        pub fn silenced(&self) -> usize {
            self.silenced.load(Ordering::SeqCst)
        }
    }

    async fn relay(
        client: TcpStream,
        (mut sr, mut sw): (
            Half<dyn AsyncRead + Unpin + Send>,
            Half<dyn AsyncWrite + Unpin + Send>,
        ),
        armed: Arc<AtomicUsize>,
        silenced: Arc<AtomicUsize>,
        pattern: Arc<std::sync::Mutex<Vec<u8>>>,
    ) {
        let (mut cr, mut cw) = client.into_split();
        let silent = AtomicBool::new(false);
        let up = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let chunk = &buf[..n];
                // A simple-query COMMIT ('Q', length, "COMMIT\0"), as sqlx sends it, or another
                // message holding the pattern asked for.
                let matched = {
                    let p = pattern.lock().unwrap().clone();
                    chunk.windows(p.len()).any(|w| w == p.as_slice())
                };
                if matched
                    && armed
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                {
                    silent.store(true, Ordering::SeqCst);
                    let _ = sw.write_all(chunk).await;
                    silenced.fetch_add(1, Ordering::SeqCst);
                }
                if silent.load(Ordering::SeqCst) {
                    return std::future::pending().await;
                }
                if sw.write_all(chunk).await.is_err() {
                    return;
                }
            }
        };
        let down = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match sr.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if silent.load(Ordering::SeqCst) {
                    return std::future::pending().await;
                }
                if cw.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            _ = up => {}
            _ = down => {}
        }
    }
}

/// A worker with a pool of one connection (`--db-pool 1`) still works: its notification listener
/// has a connection of its own. (It held the pool's only one before, and the worker, ready and
/// logging "database may be away", never claimed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_a_pool_of_one_connection_still_claims() {
    let env = Env::new().await;
    let id = env
        .submit("sim", serde_json::json!({"duration_ms": 200}), |_| {})
        .await
        .id;
    let mut w = env.spawn_worker("frugal", "5s", &[("JOBTRAIL_DB_POOL", "1")]);
    env.wait_state(id, State::Succeeded, Duration::from_secs(30))
        .await;
    w.stop_cleanly();
}
