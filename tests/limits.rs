//! Fair shares and fleet-wide limits, against the simulated provider over real HTTP and a real
//! PostgreSQL: a provider whose calls hang does not hold up another on the same worker, three worker
//! processes keep a provider within its contract's call rate, and a `429` with `Retry-After` pauses
//! every worker's calls to that provider, not only the one operation's.

#[path = "support/mod.rs"]
mod support;

use jobtrail_core::State;
use std::time::{Duration, Instant};
use support::Env;

/// A worker of 16 slots drives a provider whose creates hang (to a 20 s timeout) beside one that
/// answers at once. The hanging provider may borrow slots while the other has nothing due, but
/// never its reserve: the fast provider's operations keep flowing while every hanging call is still
/// hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_provider_does_not_hold_up_a_fast_one() {
    // Three providers on 16 slots: a reserve of one slot each for the two others.
    hanging_beside_a_fast_one(&["sim"], 14).await;
}

/// Two providers hang at once: between them they borrow every slot but the fast one's reserve
/// (before, each was held back from it on its own, and together they took it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hanging_providers_together_leave_a_fast_one_its_reserve() {
    hanging_beside_a_fast_one(&["sim", "sim-csv"], 15).await;
}

/// Thirty operations of each of `slow` whose creates hang, a worker of 16 slots that borrows
/// `borrowed` slots for them, then twelve operations of `sim-legacy` that must settle meanwhile.
async fn hanging_beside_a_fast_one(slow: &[&str], borrowed: u32) {
    let env = Env::with_contracts(|c| {
        if slow.contains(&c.name.as_str()) {
            c.request_timeout = Duration::from_secs(20);
            c.create_window = Duration::from_secs(120);
        }
    })
    .await;
    let mut hanging = Vec::new();
    for provider in slow {
        for _ in 0..30 {
            hanging.push(
                env.submit(
                    provider,
                    serde_json::json!({"create": ["slow_accept"], "create_delay_ms": 60000}),
                    |_| {},
                )
                .await
                .id,
            );
        }
    }
    let mut config = jobtrail_worker::WorkerConfig::named_default();
    config.id = "fair-worker".into();
    config.concurrency = 16;
    config.batch = 16;
    config.lease = Duration::from_secs(30);
    config.shutdown_grace = Duration::from_millis(200);
    let worker = jobtrail_worker::Worker::new(
        env.store.clone(),
        env.registry.clone(),
        env.results.clone(),
        config,
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let run = {
        let (w, s) = (worker.clone(), stop.clone());
        tokio::spawn(async move { w.run(s).await })
    };
    // The hanging providers borrow every slot they may while nothing else is due.
    let deadline = Instant::now() + Duration::from_secs(10);
    let took = loop {
        let n: u32 = env.sim.ledger().create_requests.values().sum();
        if n >= borrowed || Instant::now() > deadline {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let took_later: u32 = env.sim.ledger().create_requests.values().sum();
    assert_eq!(
        (took, took_later),
        (borrowed, borrowed),
        "the hanging providers take 16 slots less the other providers' reserve"
    );
    // Held back by the reserve, the worker waits for a slot to free up (or for new work): it does
    // not claim again and again what it may not take. (Counted by the test database's commits;
    // the statistics reach them within a second or so, hence the long window.)
    let commits = async || -> i64 {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&env.url).await.unwrap();
        sqlx::query_scalar(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&mut c)
        .await
        .unwrap()
    };
    let before = commits().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = commits().await - before;
    assert!(idle < 20, "{idle} commits in 3 s with nothing it may take");

    let started = Instant::now();
    let mut fast = Vec::new();
    for _ in 0..12 {
        fast.push(
            env.submit("sim-legacy", serde_json::json!({"duration_ms": 0}), |_| {})
                .await
                .id,
        );
    }
    for id in &fast {
        let op = env.wait_settled(*id, Duration::from_secs(15)).await;
        assert_eq!(op.state, State::Succeeded, "{}", op.id);
    }
    let took = started.elapsed();
    // Every hanging call is still hanging: the fast ones did not wait for any of them.
    for id in &hanging {
        let op = env.store.get(*id).await.unwrap();
        assert_eq!(op.state, State::CreatePending, "{} moved", op.id);
    }
    assert!(
        took < Duration::from_secs(15),
        "fast operations took {took:?}"
    );
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
}

/// Three worker processes share the provider's contract rate (10 calls a second, a burst of 5),
/// enforced through the database: seen from the provider, no window holds more calls than the
/// burst plus the rate over the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_keep_a_provider_within_its_call_rate() {
    let env = Env::with_edited_contracts(&[(
        "sim.toml",
        "[timeouts]",
        "[limits]\nrate_per_sec = 10\nburst = 5\n\n[timeouts]",
    )])
    .await;
    let mut ids = Vec::new();
    for _ in 0..24 {
        ids.push(
            env.submit("sim", serde_json::json!({"duration_ms": 0}), |_| {})
                .await
                .id,
        );
    }
    let workers: Vec<_> = (0..3)
        .map(|i| env.spawn_worker(&format!("rate-{i}"), "30s", &[]))
        .collect();
    for id in &ids {
        let op = env.wait_settled(*id, Duration::from_secs(60)).await;
        assert_eq!(op.state, State::Succeeded, "{}\n{}", op.id, env.logs());
    }
    drop(workers);
    let arrivals = env.sim.ledger().arrivals_ms;
    assert!(arrivals.len() >= 24 * 3, "{} calls", arrivals.len());
    let (rate, burst) = (10.0, 5.0);
    // Arrival times are the provider's clock and the bucket runs on the database's: one call of
    // slack for the network between them.
    let slack = 1.0;
    let mut worst = (0usize, 0u64, 0u64);
    for (i, &from) in arrivals.iter().enumerate() {
        for window in [200u64, 500, 1000, 2000, 4000] {
            let n = arrivals[i..]
                .iter()
                .take_while(|&&a| a < from + window)
                .count();
            let allowed = burst + rate * window as f64 / 1000.0 + slack;
            if n as f64 > allowed {
                worst = (n, from, window);
            }
        }
    }
    assert_eq!(
        worst,
        (0, 0, 0),
        "(calls, at ms, window ms) above the rate; arrivals {arrivals:?}"
    );
    let span = arrivals.last().unwrap() - arrivals.first().unwrap();
    let floor = ((arrivals.len() as f64 - burst) / rate * 1000.0 * 0.9) as u64;
    assert!(
        span >= floor,
        "{} calls in {span} ms: the rate was not applied",
        arrivals.len()
    );
}

/// One job's status read is answered `429` with `Retry-After: 1`: for that second no worker calls
/// the provider for any operation (the claim skips a paused provider), then polling resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_pauses_the_whole_fleet() {
    let (mut env, mut ids) = polled_every_100ms("sim").await;
    env.start_worker("pause-a", Duration::from_secs(10));
    env.start_worker("pause-b", Duration::from_secs(10));
    // Let polling settle into its rhythm, then one job says "slow down".
    tokio::time::sleep(Duration::from_millis(1000)).await;
    ids.push(
        env.submit(
            "sim",
            serde_json::json!({"duration_ms": 2000, "status_faults": {"1": "too_many_requests"}}),
            |_| {},
        )
        .await
        .id,
    );
    for id in &ids {
        let op = env.wait_settled(*id, Duration::from_secs(30)).await;
        assert_eq!(op.state, State::Succeeded, "{}", op.id);
    }
    env.stop_workers().await;
    assert_fleet_waited(&env.sim.ledger());
}

/// An ambiguous create is reconciled by looking the job up, and the provider answers that lookup
/// `429` with `Retry-After: 1`: the whole fleet waits as for any call's 429, the lookup is made
/// again after the wait (no failure counted), and the job it then finds is followed to success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_on_a_lookup_pauses_the_fleet_and_the_lookup_waits() {
    let (mut env, mut ids) = polled_every_100ms("sim-legacy").await;
    env.start_worker("lookup-pause-a", Duration::from_secs(10));
    env.start_worker("lookup-pause-b", Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let lost = env
        .submit(
            "sim-legacy",
            serde_json::json!({"duration_ms": 2000, "create": ["drop_after_accept"], "lookup_throttled": 1}),
            |_| {},
        )
        .await
        .id;
    ids.push(lost);
    for id in &ids {
        let op = env.wait_settled(*id, Duration::from_secs(30)).await;
        assert_eq!(op.state, State::Succeeded, "{}", op.id);
    }
    env.stop_workers().await;
    let ledger = env.sim.ledger();
    let job = ledger
        .jobs
        .values()
        .find(|j| j.calls.get("lookup").is_some_and(|&n| n > 0))
        .expect("the lost create's job was looked up");
    assert_eq!(job.calls["lookup"], 2, "one lookup told to wait, one after");
    assert_eq!(ledger.throttled_ms.len(), 1);
    assert_fleet_waited(&ledger);
    let lookups: Vec<_> = env
        .store
        .calls(lost)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.kind == "lookup")
        .collect();
    assert_eq!(lookups.len(), 2, "{lookups:?}");
    let apart = lookups[1].started_at - lookups[0].started_at;
    assert!(
        apart >= chrono::Duration::milliseconds(950),
        "the second lookup went {apart} after the one told to wait a second"
    );
}

/// Six operations of `provider`, each job running 4 s, polled every 100 ms once workers start.
async fn polled_every_100ms(provider: &str) -> (Env, Vec<jobtrail_core::OperationId>) {
    let env = Env::with_contracts(|c| {
        c.polling.backoff = jobtrail_core::schedule::Backoff {
            initial: Duration::from_millis(100),
            factor: 1.0,
            cap: Duration::from_millis(100),
            jitter: 0.0,
        };
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(
            env.submit(provider, serde_json::json!({"duration_ms": 4000}), |_| {})
                .await
                .id,
        );
    }
    (env, ids)
}

/// After the provider's first `429` (with `Retry-After: 1`), nothing reached it for most of that
/// second, although other operations were being polled often just before.
fn assert_fleet_waited(ledger: &jobtrail_sim::Ledger) {
    let at = *ledger.throttled_ms.first().expect("a 429 was answered");
    // Calls already under way when the 429 arrived may still land just after it.
    let during: Vec<u64> = ledger
        .arrivals_ms
        .iter()
        .copied()
        .filter(|&a| a > at + 150 && a < at + 900)
        .collect();
    let before: usize = ledger
        .arrivals_ms
        .iter()
        .filter(|&&a| a + 750 > at && a < at)
        .count();
    assert!(
        before >= 3,
        "the other jobs were polled often before the 429 ({before} calls)"
    );
    assert!(
        during.is_empty(),
        "calls reached the provider while it had asked the fleet to wait: {during:?} (429 at {at})"
    );
}

/// A provider asks for a wait far beyond anything sane (`Retry-After: 9000000000000`, about 285 000
/// years): the fleet-wide pause and the operation's own wait are clamped to the contract's
/// `retry_after_max_ms` (1 s here), so the create is sent again about a second later and the
/// operation finishes; nothing overflows, nothing stops for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_retry_after_pauses_only_as_long_as_the_contract_allows() {
    let mut env = Env::with_contracts(|c| {
        c.polling.retry_after = jobtrail_core::schedule::RetryAfterBounds {
            min: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
    })
    .await;
    let id = env
        .submit(
            "sim",
            serde_json::json!({"create": ["retry_after_seconds"], "retry_after_secs": 9_000_000_000_000u64, "duration_ms": 0}),
            |_| {},
        )
        .await
        .id;
    env.start_worker("huge-wait", Duration::from_secs(10));
    let op = env.wait_settled(id, Duration::from_secs(20)).await;
    env.stop_workers().await;
    assert_eq!(op.state, State::Succeeded);
    let arrivals = env.sim.ledger().arrivals_ms;
    assert!(arrivals.len() >= 2, "{arrivals:?}");
    let gap = arrivals[1] - arrivals[0];
    assert!(
        (900..3000).contains(&gap),
        "the create was sent again {gap} ms after the 429 (the contract allows at most 1 s)"
    );
}
