//! Fenced writes against rows another session holds, against a real PostgreSQL. Its own test
//! binary: holding a row lock takes a transaction id, which would stop HOT pruning for the
//! measurements of `store.rs` running beside it.

use jobtrail_core::*;
use jobtrail_store::testing::{TestDb, accepted_create};
use jobtrail_store::*;
use sqlx::Connection;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn accept(job: &str) -> Step {
    Step::event(Event::CreateAccepted {
        remote_job_id: job.into(),
        remote_state: None,
    })
    .with_call(accepted_create(&format!(
        "http://127.0.0.1:1/v1/jobs/{job}"
    )))
}

/// A row another session holds (a person's decision in flight, a psql left in `BEGIN; SELECT …
/// FOR UPDATE`) is not waited for by a worker's writes: in a group commit the other writes go
/// through at once and the held one is "try again" (never a lost lease, which would drop the
/// provider's answer); a lone write the same. Once the row is free, the write goes through.
#[tokio::test]
async fn a_row_held_elsewhere_holds_up_neither_the_batch_nor_the_writer() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let mut terms = BTreeMap::new();
    terms.insert(
        "sim".to_owned(),
        ProviderTerms::new("sim", IdempotencyMode::Header),
    );
    for i in 0..3 {
        store
            .submit_new(
                &Submission {
                    provider: "sim".into(),
                    target: "reports".into(),
                    body: format!(r#"{{"n":{i}}}"#).into_bytes(),
                    caller: "agent-7".into(),
                    approved_by: "alice".into(),
                    ..Default::default()
                },
                &terms,
                SubmitLimits::default(),
            )
            .await
            .unwrap();
    }
    let mut claimed = Vec::new();
    for _ in 0..100 {
        claimed.extend(
            store
                .claim_due("w", 10, Duration::from_secs(60))
                .await
                .unwrap(),
        );
        if claimed.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(claimed.len(), 3);
    let held = claimed[1].lease.clone();
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT 1 FROM operations WHERE id = $1 FOR UPDATE")
        .bind(held.operation_id.as_uuid())
        .execute(&mut holder)
        .await
        .unwrap();

    let t0 = Instant::now();
    let writes = claimed
        .iter()
        .enumerate()
        .map(|(i, c)| (c.lease.clone(), accept(&format!("job_{i}"))))
        .collect();
    let results = store.apply_many(writes).await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(results[0].as_ref().unwrap().record.state, State::Accepted);
    assert_eq!(results[2].as_ref().unwrap().record.state, State::Accepted);
    assert!(
        matches!(&results[1], Err(StoreError::Unavailable(m)) if m.contains("held by another")),
        "{:?}",
        results[1]
    );
    let t0 = Instant::now();
    let alone = store.apply(&held, accept("job_1")).await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(
        matches!(&alone, Err(e) if e.is_transient()),
        "a held row is a write to try again, not a lost lease: {alone:?}"
    );
    assert_eq!(
        store.get(held.operation_id).await.unwrap().history_seq,
        1,
        "nothing written while held"
    );

    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .unwrap();
    let applied = store.apply(&held, accept("job_1")).await.unwrap();
    assert_eq!(applied.record.state, State::Accepted);
    // A lease that is gone is still a lost lease, not "try again".
    let stale = Lease {
        epoch: held.epoch + 100,
        ..held.clone()
    };
    assert!(matches!(
        store.apply(&stale, accept("job_9")).await,
        Err(StoreError::LeaseLost { .. })
    ));
}
