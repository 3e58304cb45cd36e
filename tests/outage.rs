//! The database goes away and comes back: a worker process reconnects with backoff, resumes, and
//! loses nothing. (Its own test binary: it stops and starts its own private cluster.)

#[path = "support/mod.rs"]
mod support;

use jobtrail_core::State;
use jobtrail_store::cluster::{Cluster, ensure_database};
use std::time::{Duration, Instant};
use support::Env;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_survives_the_database_going_away_and_coming_back() {
    let cluster = tokio::task::spawn_blocking(|| Cluster::throwaway(std::process::id()))
        .await
        .unwrap()
        .unwrap();
    ensure_database(&cluster.url("postgres"), "outage")
        .await
        .unwrap();
    let url = cluster.url("outage");
    let store = jobtrail_store::Store::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    store.close().await;
    let env = Env::on(url, None).await;

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
    env.wait_state(ids[0], State::Observing, Duration::from_secs(30))
        .await;

    // Pull the database out from under it for three seconds.
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop())
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
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
    w.signal(libc::SIGTERM);
    assert_eq!(
        w.wait_exit(Duration::from_secs(30)).and_then(|s| s.code()),
        Some(0)
    );
}
