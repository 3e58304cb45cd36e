//! A fleet of real worker processes under faults, a kill in the middle, secrets that must never land
//! anywhere, and a clean shutdown.

#[path = "support/mod.rs"]
mod support;

use jobtrail_core::{CancelRequest, State};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use support::{Env, TOKEN};

/// The mix for the fleet: every fault except the deliberate contract violation (so creates per token
/// must be at most one).
fn script(n: usize) -> (&'static str, serde_json::Value, bool) {
    use serde_json::json;
    let s = match n % 20 {
        0 => json!({"create": ["drop_after_accept"]}),
        1 => json!({"create": ["slow_accept"], "create_delay_ms": 2500}),
        2 => json!({"create": ["ambiguous_after_accept"]}),
        3 => json!({"create": ["retry_after_seconds"]}),
        4 => json!({"create": ["reject"]}),
        5 => json!({"outcome": "failed"}),
        6 => {
            json!({"status_faults": {"1": "malformed_json", "2": "error_500", "3": "unknown_state"}, "duration_ms": 800})
        }
        7 => json!({"duration_ms": 1500, "poll_retry_after": 1}),
        8 => json!({"result": "partial_batch"}),
        9 => json!({"result": "bad_checksum"}),
        10 => json!({"never_finish": true}),
        11 => json!({"create": ["sync"]}),
        12 => json!({"create": ["drop_after_accept", "already_exists_error"]}),
        _ => json!({"duration_ms": 300 + (n % 7) as u64 * 100}),
    };
    let provider = if n % 20 == 13 { "sim-legacy" } else { "sim" };
    (provider, s, n % 20 == 10)
}

/// Drill 9: 4 worker processes × 500 operations with faults; one worker SIGKILLed mid-run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_of_four_with_a_kill_settles_every_operation_once() {
    // The cancel window (5 s) is widened: on two loaded cores, with one worker killed and its
    // leases waiting to be taken over, the status read that confirms a cancel once came more than
    // 5 s after the cancel was sent (`cancellation_unconfirmed`, as the engine should say then),
    // and once more than 20 s (the fleet-wide pauses of this mix's 429s add up on such a run).
    // This drill is about settling every operation once, not about how fast a confirmation comes.
    let env =
        Env::with_edited_contracts(&[("sim.toml", "window_ms = 5000", "window_ms = 60000")]).await;
    let mut workers: Vec<_> = (0..4)
        .map(|i| Some(env.spawn_worker(&format!("fleet-{i}"), "2s", &[])))
        .collect();
    let mut ops = Vec::new();
    for n in 0..500 {
        let (provider, mut s, cancel) = script(n);
        s["status_delay_ms"] = serde_json::json!(15);
        let op = env.submit(provider, s, |_| {}).await;
        ops.push((op, cancel));
    }
    let started = Instant::now();
    let mut killed = false;
    // Each never-finishing job is cancelled once it is known to run (a cancel before its create
    // left would rightly end `withdrawn`).
    let mut to_cancel: Vec<_> = ops
        .iter()
        .filter(|(_, c)| *c)
        .map(|(op, _)| op.id)
        .collect();
    let mut cancelled = false;
    loop {
        let open = env.store.count_unsettled().await.unwrap();
        if !cancelled && started.elapsed() > Duration::from_secs(1) {
            let mut still = Vec::new();
            for id in to_cancel {
                if env.store.get(id).await.unwrap().remote_job_id.is_some() {
                    env.store
                        .request_cancel(id, CancelRequest::new("fleet-test", "stop it").unwrap())
                        .await
                        .unwrap();
                } else {
                    still.push(id);
                }
            }
            to_cancel = still;
            cancelled = to_cancel.is_empty();
        }
        if !killed && open < 350 {
            workers[1].as_ref().unwrap().signal(libc::SIGKILL);
            workers[1].take();
            killed = true;
        }
        if open == 0 && cancelled {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(150),
            "{open} operations still open\n{}",
            env.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(killed, "the kill happened mid-run");

    let ledger = env.sim.ledger();
    assert!(
        ledger.max_jobs_per_token() <= 1,
        "a token created more than one job"
    );
    assert!(
        ledger.max_status_in_flight() <= 1,
        "two status calls in flight for one job"
    );
    let by_ref: HashMap<String, String> = ops
        .iter()
        .map(|(op, _)| (op.id.to_string(), op.trace_id.to_string()))
        .collect();
    for (job, j) in &ledger.jobs {
        let want = &by_ref[j.client_reference.as_ref().unwrap()];
        assert_eq!(
            j.trace_ids.iter().collect::<Vec<_>>(),
            vec![want],
            "job {job} saw a foreign trace id"
        );
    }
    assert_eq!(ledger.requests_without_traceparent, 0);
    for (op, cancel) in &ops {
        let now = env.store.get(op.id).await.unwrap();
        assert!(
            now.state.is_terminal() || now.state.needs_human(),
            "{} is {}",
            op.id,
            now.state
        );
        if *cancel {
            assert_eq!(
                now.state,
                State::Cancelled,
                "{}: {:?}",
                op.id,
                env.history_states(&env.store.history(op.id).await.unwrap())
            );
        }
    }
    let report = env.store.verify_all().await.unwrap();
    assert!(report.is_clean(), "{:?}", report.breaks);
    assert_eq!(report.operations, 500);
}

/// No secret value (the provider's bearer token, a sensitive request field) appears in any stored
/// row, call-log row, history row, or worker log line — while both were really sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_database_or_the_logs() {
    let env = Env::new().await;
    const CARD: &str = "4111-1111-SECRET-CARD-98";
    let w = env.spawn_worker(
        "secretive",
        "5s",
        &[("JOBTRAIL_SIM_CARD", CARD), ("JOBTRAIL_LOG", "trace")],
    );
    let mut ids = Vec::new();
    for script in [
        serde_json::json!({}),
        serde_json::json!({"create": ["drop_after_accept"]}),
        serde_json::json!({"result": "bad_checksum"}),
    ] {
        let body = serde_json::json!({"report": "usage", "payment": {"card_number": {"$secret": "customer_card"}}, "sim": script});
        let op = env
            .submit("sim", serde_json::json!({}), |s| {
                s.body = serde_json::to_vec(&body).unwrap()
            })
            .await;
        ids.push(op.id);
    }
    for id in &ids {
        env.wait_settled(*id, Duration::from_secs(40)).await;
    }
    assert_eq!(
        env.store.get(ids[0]).await.unwrap().state,
        State::Succeeded,
        "the secrets were resolved and sent"
    );
    assert_eq!(
        env.sim.ledger().unauthorized,
        0,
        "the bearer token reached the provider"
    );
    drop(w);

    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&env.url).await.unwrap();
    let tables: Vec<(String,)> =
        sqlx::query_as("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
            .fetch_all(&mut c)
            .await
            .unwrap();
    assert!(tables.len() >= 3);
    let mut dumped = 0;
    for (t,) in tables {
        let sql =
            format!("SELECT coalesce(string_agg(row_to_json(x)::text, E'\\n'), '') FROM {t} x");
        let (text,): (String,) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut c)
            .await
            .unwrap();
        assert!(!text.contains(TOKEN), "the bearer token is stored in {t}");
        assert!(!text.contains(CARD), "the card number is stored in {t}");
        dumped += text.len();
    }
    assert!(dumped > 1000, "the dump is not empty");
    let logs = std::fs::read_to_string(env.dir.join("secretive.log")).unwrap();
    assert!(logs.len() > 100, "trace logging produced output");
    assert!(
        !logs.contains(TOKEN) && !logs.contains(CARD),
        "a secret reached a log line"
    );
    // The stored body holds the reference, not the value.
    let op = env.store.get(ids[0]).await.unwrap();
    assert_eq!(
        op.request_body["payment"]["card_number"]["$secret"],
        "customer_card"
    );
}

/// SIGTERM while creates hang past the grace: the calls are abandoned, not forgotten. Each is in
/// the call log as `abandoned_worker_stopping` (it reached the provider), its create is ambiguous
/// (reconciled by the next worker, never resent blind), the lease is given back, and the worker
/// exits 0 well before the calls' own timeout. A second SIGTERM ends a long grace the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_grace_records_the_calls_in_flight() {
    for (grace, signals) in [("200ms", 1), ("60s", 2)] {
        past_the_grace(grace, signals).await;
    }
}

async fn past_the_grace(grace: &str, signals: usize) {
    let env =
        Env::with_edited_contracts(&[("sim.toml", "request_ms = 2000", "request_ms = 20000")])
            .await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            env.submit(
                "sim",
                serde_json::json!({"create": ["slow_accept"], "create_delay_ms": 60000}),
                |_| {},
            )
            .await
            .id,
        );
    }
    let mut w = env.spawn_worker("abandoner", "60s", &[("JOBTRAIL_SHUTDOWN_GRACE", grace)]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while env.sim.ledger().create_requests.values().sum::<u32>() < 3 {
        assert!(
            Instant::now() < deadline,
            "the creates never arrived\n{}",
            env.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let signalled = Instant::now();
    for _ in 0..signals {
        w.signal(libc::SIGTERM);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let status = w
        .wait_exit(Duration::from_secs(15))
        .expect("exits after SIGTERM");
    assert_eq!(status.code(), Some(0));
    assert!(
        signalled.elapsed() < Duration::from_secs(10),
        "grace {grace}, {signals} signals: waited {:?} for calls that time out after 20 s",
        signalled.elapsed()
    );
    for id in &ids {
        let calls = env.store.calls(*id).await.unwrap();
        let create: Vec<_> = calls.iter().filter(|c| c.kind == "create").collect();
        assert_eq!(create.len(), 1, "{id}: {calls:?}");
        assert_eq!(
            create[0].error_class.as_deref(),
            Some("abandoned_worker_stopping"),
            "{id}"
        );
        let op = env.store.get(*id).await.unwrap();
        assert_eq!(op.state, State::CreateUnknown, "{id}\n{}", env.logs());
        assert_eq!(op.lease_owner, None, "{id} still leased after shutdown");
        assert!(env.store.verify_operation(*id).await.unwrap().is_clean());
    }
}

/// SIGTERM: the worker stops claiming, finishes its steps, gives its leases back, wakes the other
/// workers for what it gave back, and exits 0; one already running, idle, takes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_leases_and_exits_zero() {
    // Status reads of 3 s (within a 20 s timeout): when the signal comes, every operation is
    // leased, mid-read.
    let mut env =
        Env::with_edited_contracts(&[("sim.toml", "request_ms = 2000", "request_ms = 20000")])
            .await;
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(
            env.submit(
                "sim",
                serde_json::json!({"never_finish": true, "status_delay_ms": 3000}),
                |_| {},
            )
            .await
            .id,
        );
    }
    let mut w = env.spawn_worker("polite", "30s", &[]);
    for id in &ids {
        env.wait_state(*id, State::Observing, Duration::from_secs(30))
            .await;
    }
    env.start_worker_idle("next", Duration::from_secs(30), Duration::from_secs(60));
    // Let it look once and find nothing it may claim.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut listener = env.store.listen().await.unwrap();
    w.signal(libc::SIGTERM);
    let status = w
        .wait_exit(Duration::from_secs(30))
        .expect("exits after SIGTERM");
    assert_eq!(status.code(), Some(0));
    let exited = Instant::now();
    // It woke the other workers for what it gave back (nothing else was submitted meanwhile).
    assert!(
        tokio::time::timeout(Duration::from_secs(2), listener.wait())
            .await
            .is_ok_and(|n| n.is_some()),
        "no wake-up for the operations given back"
    );
    for id in &ids {
        let op = env.store.get(*id).await.unwrap();
        assert!(
            op.lease_owner.as_deref() != Some("polite"),
            "{id} still leased after shutdown"
        );
        assert!(env.store.verify_operation(*id).await.unwrap().is_clean());
    }
    // The idle worker takes them at once (no lease to wait out, no minute to sleep through).
    let deadline = exited + Duration::from_secs(5);
    while env.store.get(ids[0]).await.unwrap().lease_owner.as_deref() != Some("next")
        && !env
            .store
            .calls(ids[0])
            .await
            .unwrap()
            .iter()
            .any(|c| c.actor == "next")
    {
        assert!(
            Instant::now() < deadline,
            "the next worker never took it\n{}",
            env.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
