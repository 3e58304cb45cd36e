//! The probes over real HTTP against a real database: /livez fails once a loop has been silent
//! past its limit (the orchestrator then restarts it), and says ok while it goes round.

use jobtrail_store::testing::TestDb;
use jobtrail_telemetry::{Probe, router};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn livez_fails_when_the_loop_is_stuck_and_readyz_still_reads_the_database() {
    jobtrail_provider::install_crypto();
    let db = TestDb::new().await;
    let silent_s = Arc::new(AtomicU64::new(0));
    let s = silent_s.clone();
    // Set once the process is at work (after its database answered at start).
    let at_work = Arc::new(AtomicBool::new(false));
    let probe = Probe {
        store: db.store().await,
        contracts: 1,
        needs_contracts: true,
        unresolved_secrets: Vec::new(),
        stopping: None,
        at_work: Some(at_work.clone()),
        liveness: Some((
            Arc::new(move || Duration::from_secs(s.load(Ordering::Relaxed))),
            Duration::from_secs(90),
        )),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router(probe)).await });
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let get = |path: &'static str| {
        let client = client.clone();
        async move {
            let r = client
                .get(format!("http://{addr}{path}"))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(get("/livez").await, (200, "ok\n".to_owned()));
    // Alive, but not ready before it is at work, though the database answers.
    let (status, body) = get("/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("starting"), "{body}");
    at_work.store(true, Ordering::Relaxed);
    silent_s.store(91, Ordering::Relaxed);
    let (status, body) = get("/livez").await;
    assert_eq!(status, 503);
    assert!(body.contains("91 s"), "{body}");
    // Liveness and readiness are separate questions: the database is fine.
    assert_eq!(get("/readyz").await.0, 200);
    silent_s.store(0, Ordering::Relaxed);
    assert_eq!(get("/livez").await.0, 200);
    server.abort();
}
