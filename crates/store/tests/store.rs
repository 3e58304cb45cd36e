//! The store against a real PostgreSQL: submit, claim, fenced writes, the append-only chained history.

use jobtrail_core::*;
use jobtrail_store::testing::TestDb;
use jobtrail_store::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn providers() -> BTreeMap<String, ProviderTerms> {
    let mut m = BTreeMap::new();
    let mut sim = ProviderTerms::new("sim", IdempotencyMode::Header);
    sim.sensitive_fields = vec!["/card".into()];
    m.insert("sim".into(), sim);
    m.insert(
        "legacy".into(),
        ProviderTerms::new("legacy", IdempotencyMode::None),
    );
    m
}

fn submission(body: &str) -> Submission {
    Submission {
        provider: "sim".into(),
        target: "reports".into(),
        body: body.as_bytes().to_vec(),
        caller: "agent-7".into(),
        approved_by: "alice".into(),
        approval_ref: Some("CHG-42".into()),
        ..Default::default()
    }
}

async fn count(db: &TestDb, table: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let sql = format!("SELECT count(*) FROM {table}");
    let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_one(&mut c)
        .await
        .unwrap();
    n
}

async fn exec(db: &TestDb, sql: &str) -> Result<u64, sqlx::Error> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut c)
        .await
        .map(|r| r.rows_affected())
}

/// A leap second (`…:59:60`) in a deadline, which chrono holds and PostgreSQL stores as the next
/// minute's `:00`: the chain must say what the row says, or `audit verify` reports an alteration
/// nobody made.
#[tokio::test]
async fn a_leap_second_deadline_is_chained_as_it_is_stored() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let leap = |minutes: i64| {
        let day = (chrono::Utc::now() + chrono::Duration::days(2)).date_naive();
        let t = day.and_hms_nano_opt(0, 0, 59, 1_250_000_000).unwrap()
            + chrono::Duration::minutes(minutes);
        chrono::DateTime::<chrono::Utc>::from_naive_utc_and_offset(t, chrono::Utc)
    };
    let mut sub = submission("{}");
    sub.create_deadline = Some(leap(0));
    sub.result_deadline = Some(leap(10));
    let op = store
        .submit_new(&sub, &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    assert_eq!(
        op.create_deadline.to_rfc3339(),
        format!("{}T00:01:00.250+00:00", leap(0).date_naive())
    );
    let report = store.verify_operation(op.id).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[tokio::test]
async fn submit_writes_the_intent_and_its_first_history_link() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let s = store
        .submit_new(
            &submission(r#"{"account":"acct_218","format":"csv"}"#),
            &providers(),
            SubmitLimits::default(),
        )
        .await
        .unwrap();
    assert!(s.created);
    let op = s.operation;
    assert_eq!(op.state, State::CreatePending);
    assert!(op.token.as_str().starts_with("idem_") && op.token.as_str().len() == 37);
    assert!(op.fingerprint.as_str().starts_with("sha256:"));
    assert!(op.at_most_once);
    assert_eq!(op.approved_by, "alice");
    assert_eq!(op.approval_ref.as_deref(), Some("CHG-42"));
    assert!(op.create_deadline > op.created_at && op.result_deadline >= op.create_deadline);
    let h = store.history(op.id).await.unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].from_state, None);
    assert_eq!(h[0].to_state, "create_pending");
    assert_eq!(h[0].actor, "agent-7");
    assert!(store.verify_operation(op.id).await.unwrap().is_clean());

    // A provider without idempotency: the record says at-most-once cannot be guaranteed.
    let mut legacy = submission("{}");
    legacy.provider = "legacy".into();
    let l = store
        .submit_new(&legacy, &providers(), SubmitLimits::default())
        .await
        .unwrap();
    assert!(!l.operation.at_most_once);
}

#[tokio::test]
async fn submitting_the_same_id_and_body_twice_returns_one_record() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let id: OperationId = "op_01JAAAAAAAAAAAAAAAAAAAAAAA".parse().unwrap();
    let mut s = submission(r#"{"account":"acct_218","format":"csv"}"#);
    s.operation_id = Some(id);
    let first = store
        .submit_new(&s, &providers(), SubmitLimits::default())
        .await
        .unwrap();
    // Same body, other key order and whitespace: the same fingerprint.
    s.body = b"{ \"format\": \"csv\", \"account\": \"acct_218\" }".to_vec();
    let second = store
        .submit_new(&s, &providers(), SubmitLimits::default())
        .await
        .unwrap();
    assert!(first.created && !second.created);
    assert_eq!(first.operation, second.operation);
    assert_eq!(second.operation.token, first.operation.token);
    assert_eq!(count(&db, "operations").await, 1);
    assert_eq!(count(&db, "operation_history").await, 1);
}

/// An agent that lost the answer to its submit sends it again, after the deadline it named has
/// passed: the same request under its own id is answered with the operation it started, not "that
/// deadline is past, nothing was written" (an agent told that would submit under a new id and start
/// the paid job twice). A changed request is still refused as changed, and another caller's id or
/// an unknown one gets the plain refusal: whether an id exists is never told.
#[tokio::test]
async fn a_retry_after_its_own_deadline_passed_is_answered_with_the_operation_it_started() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let id: OperationId = "op_01JDDDDDDDDDDDDDDDDDDDDDDD".parse().unwrap();
    let mut s = submission(r#"{"account":"acct_218"}"#);
    s.operation_id = Some(id);
    s.create_deadline = Some(chrono::Utc::now() + chrono::Duration::milliseconds(1500));
    let first = store
        .submit_new(&s, &providers(), SubmitLimits::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;

    let again = store
        .submit_new(&s, &providers(), SubmitLimits::default())
        .await
        .unwrap();
    assert!(first.created && !again.created);
    assert_eq!(again.operation, first.operation);
    let batch = store
        .submit_new_batch(
            std::slice::from_ref(&s),
            &providers(),
            SubmitLimits::default(),
        )
        .await
        .unwrap();
    assert!(!batch[0].created);
    assert_eq!(batch[0].operation.id, id);

    let past = |e: StoreError| matches!(e, StoreError::Submit(SubmitError::DeadlineInPast { .. }));
    let mut changed = s.clone();
    changed.body = br#"{"account":"acct_219"}"#.to_vec();
    let e = store
        .submit_new(&changed, &providers(), SubmitLimits::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Submit(SubmitError::FingerprintConflict { .. })
        ),
        "{e}"
    );
    let mut other = s.clone();
    other.caller = "agent-8".into();
    let e = store
        .submit_new(&other, &providers(), SubmitLimits::default())
        .await
        .unwrap_err();
    assert!(past(e));
    let (_, e) = store
        .submit_new_batch(&[other], &providers(), SubmitLimits::default())
        .await
        .unwrap_err();
    assert!(past(e));
    let mut unknown = s.clone();
    unknown.operation_id = Some("op_01JEEEEEEEEEEEEEEEEEEEEEEE".parse().unwrap());
    let e = store
        .submit_new(&unknown, &providers(), SubmitLimits::default())
        .await
        .unwrap_err();
    assert!(past(e));
    assert_eq!(count(&db, "operations").await, 1);
    assert_eq!(count(&db, "operation_history").await, 1);
}

#[tokio::test]
async fn the_same_id_with_a_changed_body_is_refused_and_nothing_is_written() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let id: OperationId = "op_01JBBBBBBBBBBBBBBBBBBBBBBB".parse().unwrap();
    let mut s = submission(r#"{"account":"acct_218","range":"2025-02"}"#);
    s.operation_id = Some(id);
    let first = store
        .submit_new(&s, &providers(), SubmitLimits::default())
        .await
        .unwrap();
    s.body = br#"{"account":"acct_218","range":"2025-03"}"#.to_vec();
    let err = store
        .submit_new(&s, &providers(), SubmitLimits::default())
        .await
        .unwrap_err();
    let msg = err.to_string();
    match err {
        StoreError::Submit(SubmitError::FingerprintConflict {
            stored, submitted, ..
        }) => {
            assert_eq!(stored, first.operation.fingerprint);
            assert!(
                msg.contains(stored.as_str()) && msg.contains(submitted.as_str()),
                "{msg}"
            );
        }
        other => panic!("expected a fingerprint conflict, got {other}"),
    }
    assert_eq!(store.get(id).await.unwrap(), first.operation);
    assert_eq!(count(&db, "operations").await, 1);
    assert_eq!(count(&db, "operation_history").await, 1);
}

/// The same id answers only the same submission: the same request under other recorded terms (who
/// approved it, the approval's reference, the operation it retries) is a conflict naming the
/// field, not a silent "already there" that drops them; other deadlines are the same submission
/// (a relative time resolves anew on every send); another caller's id is "not found", whatever it
/// holds. Nothing is written.
#[tokio::test]
async fn the_same_id_under_other_terms_is_refused_and_another_callers_is_not_found() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let id = OperationId::from_uuid(uuid::Uuid::now_v7());
    let mut s = submission("{}");
    s.operation_id = Some(id);
    let first = store
        .submit_new(&s, &providers(), SubmitLimits::default())
        .await
        .unwrap();
    let later = chrono::Utc::now() + chrono::Duration::hours(2);
    let mut again = s.clone();
    again.create_deadline = Some(later);
    again.result_deadline = Some(later);
    let same = store
        .submit_new(&again, &providers(), SubmitLimits::default())
        .await
        .unwrap();
    assert!(!same.created);
    assert_eq!(same.operation, first.operation);

    let finished = store
        .submit_new(
            &submission(r#"{"n": 0}"#),
            &providers(),
            SubmitLimits::default(),
        )
        .await
        .unwrap()
        .operation;
    store
        .request_cancel(finished.id, CancelRequest::new("agent-7", "wrong").unwrap())
        .await
        .unwrap();
    let mut batch_twice = Vec::new();
    type Change<'a> = (&'a str, &'a dyn Fn(&mut Submission));
    let changes: [Change; 3] = [
        ("approved_by", &|s| s.approved_by = "bob".into()),
        ("approval_ref", &|s| s.approval_ref = None),
        ("supersedes", &|s| s.supersedes = Some(finished.id)),
    ];
    for (field, change) in changes {
        let mut other = s.clone();
        change(&mut other);
        let err = store
            .submit_new(&other, &providers(), SubmitLimits::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Submit(SubmitError::TermsConflict { field: f, .. }) if *f == field),
            "{field}: {err}"
        );
        batch_twice.push(other);
    }
    let refused = store
        .submit_new_batch(
            &[s.clone(), batch_twice[0].clone()],
            &providers(),
            SubmitLimits::default(),
        )
        .await;
    assert!(
        matches!(
            refused,
            Err((
                Some(1),
                StoreError::Submit(SubmitError::TermsConflict { .. })
            ))
        ),
        "{refused:?}"
    );

    let mut foreign = s.clone();
    foreign.caller = "agent-8".into();
    foreign.approved_by = "mallory".into();
    let err = store
        .submit_new(&foreign, &providers(), SubmitLimits::default())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound(n) if n == id), "{err}");
    assert_eq!(store.get(id).await.unwrap(), first.operation);
    assert_eq!(count(&db, "operations").await, 2);
    assert!(
        store
            .get(finished.id)
            .await
            .unwrap()
            .superseded_by
            .is_none()
    );
}

// Peak heap of one store call on the test's own thread (the store's reads decode there).
#[global_allocator]
static HEAP: jobtrail_store::testing::heap::Counting = jobtrail_store::testing::heap::Counting;

/// A tiny request about an operation whose stored request is large (a conflicting resubmit under
/// its id, another caller's guess at it, a cancel) never reads that request: it would cost the
/// server the body's text and many times that parsed, once per tiny request.
#[tokio::test]
async fn tiny_requests_about_a_large_operation_never_read_its_request() {
    use jobtrail_store::testing::heap::peak_of;
    let db = TestDb::new().await;
    let store = db.store().await;
    let mut terms = providers();
    let most_body = jobtrail_core::operation::MAX_BODY_BYTES;
    terms.get_mut("sim").unwrap().max_body_bytes = most_body;
    let limits = SubmitLimits {
        max_body_bytes: most_body,
        ..SubmitLimits::default()
    };
    // 13 MB of text, twice that once parsed (small values take 32 bytes each).
    let body = format!(
        r#"{{"s":"{}","n":[{}0]}}"#,
        "x".repeat(12 << 20),
        "0,".repeat(500_000)
    );
    let id = OperationId::from_uuid(uuid::Uuid::now_v7());
    let mut large = submission(&body);
    large.operation_id = Some(id);
    store.submit_new(&large, &terms, limits).await.unwrap();
    const MOST: usize = 4 << 20;

    let mut conflicting = submission("{}");
    conflicting.operation_id = Some(id);
    let (r, peak) = peak_of(store.submit_new(&conflicting, &terms, limits)).await;
    assert!(
        matches!(
            r,
            Err(StoreError::Submit(SubmitError::FingerprintConflict { .. }))
        ),
        "{r:?}"
    );
    assert!(peak < MOST, "a conflicting resubmit took {peak} bytes");

    let mut guess = conflicting.clone();
    guess.caller = "agent-8".into();
    let (r, peak) = peak_of(store.submit_new(&guess, &terms, limits)).await;
    assert!(
        matches!(r, Err(StoreError::NotFound(n)) if n == id),
        "{r:?}"
    );
    assert!(peak < MOST, "another caller's guess took {peak} bytes");

    let (r, peak) =
        peak_of(store.request_cancel(id, CancelRequest::new("agent-7", "not needed").unwrap()))
            .await;
    assert_eq!(r.unwrap().record.state, State::Withdrawn);
    assert!(peak < MOST, "a cancel took {peak} bytes");
    // The record keeps its request; only these reads went without it.
    assert_eq!(
        store.get(id).await.unwrap().request_body["n"]
            .as_array()
            .map(Vec::len),
        Some(500_001)
    );
}

#[tokio::test]
async fn bad_input_is_refused_and_nothing_is_written() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let now = chrono::Utc::now();
    let mut cases: Vec<(&str, Submission, SubmitLimits)> = Vec::new();
    cases.push((
        "malformed",
        submission(r#"{"account": "#),
        SubmitLimits::default(),
    ));
    let mut unknown = submission("{}");
    unknown.provider = "nope".into();
    cases.push(("unknown provider", unknown, SubmitLimits::default()));
    let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(1024 * 1024));
    cases.push((
        "too large (default 1 MiB)",
        submission(&big),
        SubmitLimits::default(),
    ));
    cases.push((
        "too large (configured)",
        submission(r#"{"a":"0123456789"}"#),
        SubmitLimits {
            max_body_bytes: 8,
            ..SubmitLimits::default()
        },
    ));
    let mut past = submission("{}");
    past.create_deadline = Some(now - chrono::Duration::seconds(5));
    cases.push(("deadline in the past", past, SubmitLimits::default()));
    let mut order = submission("{}");
    order.create_deadline = Some(now + chrono::Duration::minutes(10));
    order.result_deadline = Some(now + chrono::Duration::minutes(5));
    cases.push(("deadlines out of order", order, SubmitLimits::default()));
    cases.push((
        "literal secret",
        submission(r#"{"card":"4111111111111111"}"#),
        SubmitLimits::default(),
    ));
    let mut nobody = submission("{}");
    nobody.approved_by = String::new();
    cases.push(("no approval", nobody, SubmitLimits::default()));

    for (name, s, limits) in cases {
        let err = store
            .submit_new(&s, &providers(), limits)
            .await
            .expect_err(name);
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Submit(_)), "{name}: {msg}");
        assert!(
            !msg.contains("4111111111111111"),
            "{name} leaked the secret: {msg}"
        );
    }
    assert_eq!(count(&db, "operations").await, 0);
    assert_eq!(count(&db, "operation_history").await, 0);
}

#[tokio::test]
async fn two_concurrent_claimers_never_hold_the_same_operation_and_claim_everything() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let mut ids = HashSet::new();
    for i in 0..1000 {
        let s = store
            .submit_new(
                &submission(&format!(r#"{{"n":{i}}}"#)),
                &providers(),
                SubmitLimits::default(),
            )
            .await
            .unwrap();
        ids.insert(s.operation.id);
    }
    let holding: Arc<Mutex<HashMap<OperationId, String>>> = Arc::default();
    let claimed: Arc<Mutex<Vec<OperationId>>> = Arc::default();
    let overlaps: Arc<Mutex<u32>> = Arc::default();
    let mut tasks = Vec::new();
    for w in 0..2 {
        let store = Store::connect(&db.url).await.unwrap();
        let (holding, claimed, overlaps) = (holding.clone(), claimed.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            let me = format!("worker-{w}");
            let mut idle = 0;
            while idle < 3 {
                let batch = store
                    .claim_due(&me, 16, Duration::from_secs(60))
                    .await
                    .unwrap();
                if batch.is_empty() {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                idle = 0;
                for c in &batch {
                    let mut h = holding.lock().unwrap();
                    if h.insert(c.lease.operation_id, me.clone()).is_some() {
                        *overlaps.lock().unwrap() += 1;
                    }
                }
                tokio::task::yield_now().await;
                for c in batch {
                    // Finish it (a definitive rejection is final, so it is never due again).
                    let step = Step::event(Event::CreateRejected {
                        http_status: Some(400),
                        reason: "test".into(),
                    });
                    holding.lock().unwrap().remove(&c.lease.operation_id);
                    store.apply(&c.lease, step).await.unwrap();
                    claimed.lock().unwrap().push(c.lease.operation_id);
                }
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("claimers finish")
            .unwrap();
    }
    assert_eq!(
        *overlaps.lock().unwrap(),
        0,
        "an operation was held by two claimers at once"
    );
    let claimed = claimed.lock().unwrap();
    let unique: HashSet<_> = claimed.iter().copied().collect();
    assert_eq!(claimed.len(), 1000, "each operation claimed exactly once");
    assert_eq!(unique, ids);
}

async fn claim_one(store: &Store, owner: &str, ttl: Duration) -> Claimed {
    for _ in 0..200 {
        if let Some(c) = store.claim_due(owner, 1, ttl).await.unwrap().pop() {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{owner} could not claim within 5 s");
}

#[tokio::test]
async fn a_lease_given_back_is_due_again_by_the_database_clock() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let c = submit_and_claim(&store, 1, "released").await.remove(0);
    store
        .release(&c.lease, Duration::from_secs(90), "later")
        .await
        .unwrap();
    let op = store.get(c.lease.operation_id).await.unwrap();
    let due = op.next_action_at;
    // The delay is counted from the database's clock at release, never a time the worker names.
    let after = (due - c.db_now).num_milliseconds();
    assert!(
        (90_000..95_000).contains(&after),
        "due {after} ms after the claim"
    );
    assert_eq!(op.lease_owner, None);
}

/// A claim marks a pending create as possibly sent under its epoch. A lease given back by a holder
/// that sent nothing clears its own mark (the next claim sends the create); one given back
/// otherwise keeps it (the next claim reconciles), and no release clears an earlier epoch's mark.
#[tokio::test]
async fn a_lease_given_back_unsent_clears_only_its_own_create_mark() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let mark = async |id| store.get(id).await.unwrap().create_sent_epoch;
    let c = submit_and_claim(&store, 1, "m").await.remove(0);
    let id = c.lease.operation_id;
    assert_eq!(mark(id).await, Some(c.lease.epoch));
    store
        .release(&c.lease, Duration::ZERO, "kept")
        .await
        .unwrap();
    assert_eq!(mark(id).await, Some(c.lease.epoch), "a release keeps it");
    // The next claim keeps the earlier epoch's mark; giving it back unsent does not clear that.
    let c = claim_one(&store, "m", Duration::from_secs(30)).await;
    let earlier = c.lease.epoch - 1;
    assert_eq!(mark(id).await, Some(earlier));
    store
        .release_unsent(&c.lease, Duration::ZERO, "unsent")
        .await
        .unwrap();
    assert_eq!(mark(id).await, Some(earlier), "not this lease's mark");
    exec(
        &db,
        &format!(
            "UPDATE operations SET create_sent_epoch = NULL WHERE id = '{}'",
            id.as_uuid()
        ),
    )
    .await
    .unwrap();
    let c = claim_one(&store, "m", Duration::from_secs(30)).await;
    assert_eq!(mark(id).await, Some(c.lease.epoch));
    store
        .release_unsent(&c.lease, Duration::ZERO, "unsent")
        .await
        .unwrap();
    assert_eq!(mark(id).await, None, "this lease's mark goes with it");
    assert!(matches!(
        store
            .release_unsent(&c.lease, Duration::ZERO, "again")
            .await,
        Err(StoreError::LeaseLost { .. })
    ));
}

#[tokio::test]
async fn a_stale_worker_gets_lease_lost_on_every_write_and_the_row_is_untouched() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;

    let stale = claim_one(&store, "worker-a", Duration::from_millis(300)).await;
    // The lease expires; worker-b takes over (waiting on the claim itself, not a fixed sleep).
    let fresh = claim_one(&store, "worker-b", Duration::from_secs(60)).await;
    assert_eq!(fresh.lease.operation_id, op.id);
    assert!(fresh.lease.epoch > stale.lease.epoch);
    let before = store.get(op.id).await.unwrap();

    let lost = |r: Result<(), StoreError>| {
        assert!(matches!(r, Err(StoreError::LeaseLost { .. })), "{r:?}")
    };
    let accept = Step::event(Event::CreateAccepted {
        remote_job_id: "job_stale".into(),
        remote_state: None,
    });
    lost(store.apply(&stale.lease, accept).await.map(|_| ()));
    lost(
        store
            .extend_lease(&stale.lease, Duration::from_secs(60))
            .await
            .map(|_| ()),
    );
    lost(store.release(&stale.lease, Duration::ZERO, "test").await);
    let observe = Step {
        observation: Some(Observation {
            remote_state: Some("x".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    lost(store.apply(&stale.lease, observe).await.map(|_| ()));

    assert_eq!(
        store.get(op.id).await.unwrap(),
        before,
        "the stale worker changed the row"
    );
    assert_eq!(store.history(op.id).await.unwrap().len(), 1);

    // The new owner's writes go through.
    let accept = Step::event(Event::CreateAccepted {
        remote_job_id: "job_1".into(),
        remote_state: Some("queued".into()),
    });
    let applied = store.apply(&fresh.lease, accept).await.unwrap();
    assert_eq!(applied.record.state, State::Accepted);
    assert_eq!(applied.record.remote_job_id.as_deref(), Some("job_1"));
    assert_eq!(applied.record.lease_owner, None, "released after the step");
}

/// A claim that takes over a lost holder's lease counts it only for a collecting operation; a step
/// that records something clears the count, in the row and in the record its holder goes on with
/// (a status read that moves it to collecting must not carry an old count there), alone or
/// group-committed; a deferral, which records nothing, leaves it.
#[tokio::test]
async fn takeovers_of_a_collecting_operation_are_counted_until_a_step_records_something() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    let short = Duration::from_millis(300);
    let takeovers = || async { store.get(op.id).await.unwrap().takeovers };
    // Lost in create_pending: not counted.
    claim_one(&store, "a", short).await;
    assert!(claim_one(&store, "b", short).await.taken_over);
    assert_eq!(takeovers().await, 0, "only a collecting operation counts");
    let c = claim_one(&store, "c", short).await;
    let accept = Step::event(Event::CreateAccepted {
        remote_job_id: "job_1".into(),
        remote_state: None,
    });
    store.apply(&c.lease, accept).await.unwrap();
    exec(
        &db,
        &format!(
            "UPDATE operations SET state = 'result_collecting', next_action_at = now() WHERE id = '{}'",
            op.id.as_uuid()
        ),
    )
    .await
    .unwrap();
    // Three holders lost in a row while collecting: the second, third and fourth claims count.
    for n in 0..4 {
        let held = claim_one(&store, &format!("d{n}"), short).await;
        assert_eq!(held.taken_over, n > 0);
        assert_eq!(held.operation.takeovers, n, "claim {n}");
    }
    let e = claim_one(&store, "e", Duration::from_secs(60)).await;
    assert_eq!(e.operation.takeovers, 4);
    // A deferral records nothing.
    let deferral = Step {
        next_in: Some((Duration::from_millis(1), "provider call rate")),
        keep_lease: true,
        ..Step::default()
    };
    let applied = store.apply(&e.lease, deferral.clone()).await.unwrap();
    assert_eq!(applied.record.takeovers, 4);
    assert_eq!(takeovers().await, 4);
    // A failed fetch is recorded: cleared, and the record says so.
    let failed = Step {
        keep_lease: true,
        ..Step::event(Event::ResultFetchFailed {
            error_class: "timeout".into(),
        })
    };
    let applied = store.apply(&e.lease, failed.clone()).await.unwrap();
    assert_eq!(applied.record.takeovers, 0);
    assert_eq!(takeovers().await, 0);
    // The same through a group commit, beside another operation's write.
    exec(
        &db,
        &format!(
            "UPDATE operations SET takeovers = 2 WHERE id = '{}'",
            op.id.as_uuid()
        ),
    )
    .await
    .unwrap();
    let other = store
        .submit_new(
            &submission(r#"{"n":2}"#),
            &providers(),
            SubmitLimits::default(),
        )
        .await
        .unwrap()
        .operation;
    let o = claim_one(&store, "o", Duration::from_secs(60)).await;
    assert_eq!(o.lease.operation_id, other.id);
    let nothing = Step {
        keep_lease: true,
        ..Step::default()
    };
    for (step, left) in [(deferral, 2), (failed, 0)] {
        let written = store
            .apply_many(vec![
                (e.lease.clone(), step),
                (o.lease.clone(), nothing.clone()),
            ])
            .await;
        assert_eq!(written[0].as_ref().unwrap().record.takeovers, left);
        assert_eq!(takeovers().await, left);
    }
}

/// Each claimed operation's create accepted, its lease kept.
async fn accept_keeping_leases(store: &Store, claimed: &[&Claimed]) {
    for c in claimed {
        let accept = Step {
            keep_lease: true,
            ..Step::event(Event::CreateAccepted {
                remote_job_id: format!("job_{}", c.lease.operation_id),
                remote_state: None,
            })
        };
        store.apply(&c.lease, accept).await.unwrap();
    }
}

/// A status read the provider answered 200, its outcome as logged.
fn status_read(outcome: &str) -> CallRecord {
    CallRecord {
        kind: CallKind::Status,
        method: "GET".into(),
        http_status: Some(200),
        outcome: outcome.into(),
        ..accepted_create("http://127.0.0.1:1/v1/jobs/x")
    }
}

#[tokio::test]
async fn a_retry_after_answered_to_a_worker_that_lost_its_lease_still_binds_the_next_owner() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let mut claimed = submit_and_claim(&store, 3, "ra").await;
    let (a, b, live) = (claimed.remove(0), claimed.remove(0), claimed.remove(0));
    accept_keeping_leases(&store, &[&a, &b, &live]).await;
    // Worker "w" read the status of both jobs; the provider said "not before N s"; meanwhile "w"
    // lost both leases (paused past them, say).
    take_over(&db, &a.lease).await;
    take_over(&db, &b.lease).await;
    let read = |secs: u64| Step {
        observation: Some(Observation {
            remote_state: Some("running".into()),
            ..Default::default()
        }),
        retry_after: Some(Duration::from_secs(secs)),
        call: Some(status_read("running")),
        ..Default::default()
    };
    let not_before = |id| {
        let store = store.clone();
        async move {
            let r = store.get(id).await.unwrap();
            (r.poll_not_before.expect("kept") - chrono::Utc::now()).num_milliseconds()
        }
    };
    let r = store.apply(&a.lease, read(30)).await;
    assert!(matches!(r, Err(StoreError::LeaseLost { .. })), "{r:?}");
    let left = not_before(a.lease.operation_id).await;
    assert!((25_000..=30_000).contains(&left), "{left} ms");
    assert_eq!(
        store.get(a.lease.operation_id).await.unwrap().state,
        State::Accepted
    );
    // A shorter one later never brings it forward.
    let r = store.apply(&a.lease, read(1)).await;
    assert!(matches!(r, Err(StoreError::LeaseLost { .. })), "{r:?}");
    assert!(not_before(a.lease.operation_id).await > 25_000);
    // The group-commit path keeps it too, beside a live write.
    let results = store
        .apply_many(vec![
            (b.lease.clone(), read(20)),
            (live.lease.clone(), read(2)),
        ])
        .await;
    assert!(
        matches!(results[0], Err(StoreError::LeaseLost { .. })),
        "{:?}",
        results[0]
    );
    results[1].as_ref().unwrap();
    let left = not_before(b.lease.operation_id).await;
    assert!((15_000..=20_000).contains(&left), "{left} ms");
    assert!(store.verify_all().await.unwrap().is_clean());
}

#[tokio::test]
async fn a_committed_batch_is_never_applied_a_second_time() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let mut claimed = submit_and_claim(&store, 2, "once").await;
    let (lost, live) = (claimed.remove(0), claimed.remove(0));
    accept_keeping_leases(&store, &[&lost, &live]).await;
    take_over(&db, &lost.lease).await;
    // The refused write's call cannot be logged once the batch has committed.
    exec(
        &db,
        "CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.outcome = 'boom' THEN RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $$; \
         CREATE TRIGGER refuse_boom BEFORE INSERT ON provider_calls \
         FOR EACH ROW EXECUTE FUNCTION refuse_boom()",
    )
    .await
    .unwrap();
    let read = |outcome: &str| Step {
        keep_lease: true,
        call: Some(status_read(outcome)),
        ..Step::event(Event::RemoteProgress {
            remote_state: "running".into(),
            known: true,
        })
    };
    let links = |id| {
        let store = store.clone();
        async move { store.history(id).await.unwrap().len() }
    };
    let before = links(live.lease.operation_id).await;
    let results = store
        .apply_many(vec![
            (lost.lease.clone(), read("boom")),
            (live.lease.clone(), read("running")),
        ])
        .await;
    assert!(results[0].is_err(), "{:?}", results[0]);
    results[1].as_ref().unwrap();
    assert_eq!(
        links(live.lease.operation_id).await,
        before + 1,
        "the live write is recorded once"
    );
}

/// A cancel asked for and not yet sent is due at once after a step the worker decided before it
/// arrived (a status read's next read, or a wait for an earlier Retry-After, seconds off); a wait
/// decided for the cancel itself (the provider deferred the cancel call; the provider's call
/// rate) stands.
#[tokio::test]
async fn a_cancel_not_yet_sent_is_due_at_once_unless_the_wait_was_for_the_cancel() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let claimed = submit_and_claim(&store, 4, "cancel-due").await;
    accept_keeping_leases(&store, &claimed.iter().collect::<Vec<_>>()).await;
    let cancel_call = CallRecord {
        kind: CallKind::Cancel,
        method: "POST".into(),
        http_status: Some(503),
        outcome: "retry later".into(),
        ..accepted_create("http://127.0.0.1:1/v1/jobs/x/cancel")
    };
    let cases = [
        (
            Some(status_read("running")),
            State::Observing,
            -1_000..1_000,
        ),
        (None, State::Observing, -1_000..1_000),
        (Some(cancel_call), State::CancelRequested, 4_000..6_000),
        (None, State::CancelRequested, 4_000..6_000),
    ];
    for (c, (call, decided_in, due_in)) in claimed.iter().zip(cases) {
        let id = c.lease.operation_id;
        store
            .request_cancel(id, CancelRequest::new("alice", "stop").unwrap())
            .await
            .unwrap();
        let what = format!(
            "{:?} decided in {decided_in}",
            call.as_ref().map(|c| c.kind)
        );
        let step = Step {
            call,
            next_in: Some((Duration::from_secs(5), "later")),
            decided_in: Some(decided_in),
            ..Default::default()
        };
        let applied = store.apply(&c.lease, step).await.unwrap();
        assert_eq!(applied.record.state, State::CancelRequested);
        let (now,): (chrono::DateTime<chrono::Utc>,) = sqlx::query_as("SELECT now()")
            .fetch_one(&sqlx::PgPool::connect(&db.url).await.unwrap())
            .await
            .unwrap();
        let after = (applied.record.next_action_at - now).num_milliseconds();
        assert!(due_in.contains(&after), "{what}: due in {after} ms");
    }
}

#[tokio::test]
async fn a_live_lease_is_not_claimable_and_extension_keeps_it() {
    let db = TestDb::new().await;
    let store = db.store().await;
    store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap();
    let a = claim_one(&store, "a", Duration::from_secs(1)).await;
    assert!(
        store
            .claim_due("b", 10, Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty()
    );
    let exp = store
        .extend_lease(&a.lease, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(exp > chrono::Utc::now() + chrono::Duration::seconds(20));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        store
            .claim_due("b", 10, Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn history_refuses_update_and_delete_and_the_chain_recomputes() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    let c = claim_one(&store, "w", Duration::from_secs(30)).await;
    store
        .apply(
            &c.lease,
            Step::event(Event::CreateAccepted {
                remote_job_id: "job_1".into(),
                remote_state: None,
            }),
        )
        .await
        .unwrap();
    let c = claim_one(&store, "w", Duration::from_secs(30)).await;
    store
        .apply(
            &c.lease,
            Step::event(Event::RemoteProgress {
                remote_state: "running".into(),
                known: true,
            }),
        )
        .await
        .unwrap();
    let c = claim_one(&store, "w", Duration::from_secs(30)).await;
    store
        .apply(
            &c.lease,
            Step::event(Event::RemoteSucceeded {
                remote_state: "done".into(),
            }),
        )
        .await
        .unwrap();
    assert_eq!(store.history(op.id).await.unwrap().len(), 4);

    for sql in [
        "UPDATE operation_history SET cause = 'nothing happened'",
        "DELETE FROM operation_history",
        "TRUNCATE operation_history CASCADE",
        "UPDATE provider_calls SET url = 'x'",
        "DELETE FROM operations",
    ] {
        let err = exec(&db, sql).await.expect_err(sql);
        assert!(err.to_string().contains("not allowed"), "{sql}: {err}");
    }
    let report = store.verify_operation(op.id).await.unwrap();
    assert!(report.is_clean(), "{:?}", report.breaks);
    assert_eq!(report.rows, 4);
    let all = store.verify_all().await.unwrap();
    assert!(all.is_clean() && all.operations == 1 && all.rows == 4);
    // A whole database takes minutes: how far it has come is told after each operation.
    let mut told = Vec::new();
    let all = store
        .verify_all_telling(&mut |r| told.push((r.operations, r.rows)))
        .await
        .unwrap();
    assert_eq!(told, [(1, 4)]);
    assert_eq!(all.operations, 1);

    // As a superuser with triggers off, an edit is found at its row.
    exec(&db, "SET session_replication_role = replica; UPDATE operation_history SET cause = 'forged' WHERE seq = 3").await.unwrap();
    let report = store.verify_all().await.unwrap();
    assert_eq!(report.breaks.len(), 1, "{:?}", report.breaks);
    assert_eq!(report.breaks[0].seq, 3);
    assert_eq!(report.breaks[0].operation_id, op.id.to_string());

    // One bulk edit can break every operation: a report lists the first breaks and counts the
    // rest, so what it holds does not grow with the database (1 200 links of operations that do
    // not exist, each a break of its own). An anchor altered besides is listed first: it says
    // the most, and the chains' breaks alone would fill the list.
    store.anchor("auditor").await.unwrap();
    exec(
        &db,
        "SET session_replication_role = replica; UPDATE audit_anchor_heads SET hash = sha256(hash)",
    )
    .await
    .unwrap();
    exec(
        &db,
        "SET session_replication_role = replica; \
         CREATE TEMP TABLE h AS SELECT h.* FROM operation_history h, generate_series(1, 1200) \
         WHERE h.seq = 1; \
         UPDATE h SET operation_id = gen_random_uuid(); \
         INSERT INTO operation_history SELECT * FROM h",
    )
    .await
    .unwrap();
    let report = store.verify_everything(None).await.unwrap();
    assert_eq!(report.breaks.len(), jobtrail_store::MAX_BREAKS_LISTED);
    // The forged link, the 1 200 orphans, the anchor's digest and its rewritten head.
    assert_eq!(report.break_count(), 1203);
    assert_eq!(report.breaks_omitted, 203);
    assert!(
        report.breaks[0]
            .problem
            .contains("no longer hash to its digest"),
        "{:?}",
        report.breaks[0]
    );
    assert!(!report.is_clean());
    assert!(
        report.breaks.iter().any(|b| b.seq == 3),
        "the first found are listed"
    );
}

#[tokio::test]
async fn check_constraints_tie_states_to_their_facts() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    let id = op.id.as_uuid();
    for (why, sql) in [
        (
            "succeeded needs finished_at and a result",
            format!("UPDATE operations SET state = 'succeeded' WHERE id = '{id}'"),
        ),
        (
            "observing needs a remote job id",
            format!("UPDATE operations SET state = 'observing' WHERE id = '{id}'"),
        ),
        (
            "held states need an escalation",
            format!(
                "UPDATE operations SET state = 'result_timed_out', remote_job_id = 'j' WHERE id = '{id}'"
            ),
        ),
        (
            "cancel_requested needs the request",
            format!(
                "UPDATE operations SET state = 'cancel_requested', remote_job_id = 'j' WHERE id = '{id}'"
            ),
        ),
        (
            "a lease is owner and expiry",
            format!("UPDATE operations SET lease_owner = 'w' WHERE id = '{id}'"),
        ),
        (
            "unknown states are refused",
            format!("UPDATE operations SET state = 'done' WHERE id = '{id}'"),
        ),
    ] {
        // Triggers off (a superuser's session), so it is the CHECK constraint that refuses.
        let sql = format!("SET session_replication_role = replica; {sql}");
        assert!(exec(&db, &sql).await.is_err(), "{why}");
    }
    // A state changed without the history link that records it is named by verify.
    exec(
        &db,
        &format!(
            "UPDATE operations SET state = 'abandoned', finished_at = now() WHERE id = '{id}'"
        ),
    )
    .await
    .unwrap();
    let report = store.verify_operation(op.id).await.unwrap();
    assert!(
        report.breaks.iter().any(|b| b
            .problem
            .contains("state differs from where its last history link leads")),
        "{:?}",
        report.breaks
    );
}

/// Every check and foreign key holds for every row, old ones too: a constraint added NOT VALID (to
/// spare a large table's scan under the exclusive lock) is validated by a later migration. The one
/// left so names rows that can never pass: calls logged before calls were chained (migration 0007).
#[tokio::test]
async fn every_constraint_is_validated_but_the_one_old_rows_cannot_meet() {
    use sqlx::Connection;
    let db = TestDb::new().await;
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let unchecked: Vec<(String, String)> = sqlx::query_as(
        "SELECT t.relname::text, c.conname::text FROM pg_constraint c \
         JOIN pg_class t ON t.oid = c.conrelid \
         WHERE t.relnamespace = to_regnamespace(current_schema()) AND NOT c.convalidated \
         ORDER BY 1, 2",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(
        unchecked,
        [(
            "provider_calls".to_owned(),
            "provider_calls_chained".to_owned()
        )],
        "constraints some rows were never checked against"
    );
}

/// A provider call's date is its writer's word, but only within its operation's life: one dated
/// before its operation was submitted, or ending after the database's clock, is refused whoever
/// logs it (with its step: nothing is written), as a history link dated off the database's clock is.
#[tokio::test]
async fn a_call_dated_outside_its_operations_life_is_refused() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let c = submit_and_claim(&store, 1, "dated").await.remove(0);
    let op = &c.operation;
    let accepted = || {
        Step::event(Event::CreateAccepted {
            remote_job_id: "job_1".into(),
            remote_state: None,
        })
    };
    let dated = |started_at: chrono::DateTime<chrono::Utc>, duration_ms: f64| CallRecord {
        started_at,
        duration_ms,
        ..jobtrail_store::testing::accepted_create("http://127.0.0.1:1/v1/jobs")
    };
    let now = chrono::Utc::now();
    for (why, call) in [
        (
            "a year before its operation",
            dated(op.created_at - chrono::Duration::days(365), 1.0),
        ),
        (
            "started in the future",
            dated(now + chrono::Duration::hours(1), 1.0),
        ),
        ("ending in the future", dated(now, 3_600_000.0)),
    ] {
        let r = store.apply(&c.lease, accepted().with_call(call)).await;
        let e = r.err().unwrap_or_else(|| panic!("{why}: logged"));
        assert!(
            e.to_string().contains("outside its operation's life"),
            "{why}: {e}"
        );
        assert!(store.calls(op.id).await.unwrap().is_empty(), "{why}");
        assert_eq!(
            store.get(op.id).await.unwrap().state,
            State::CreatePending,
            "{why}"
        );
    }
    // A call as a worker dates it: within a few minutes of the clock either way is its word.
    store
        .apply(
            &c.lease,
            accepted().with_call(dated(now - chrono::Duration::seconds(90), 200.0)),
        )
        .await
        .unwrap();
    assert_eq!(store.calls(op.id).await.unwrap().len(), 1);
}

/// An operation submitted, claimed and accepted by its provider, with the create call logged.
/// The chain hashes JSON in RFC 8785's form, which reads every number as a double: a number put in
/// the place of the one hashed that reads as the same double (`5` made `5.0000000000000001`, 2^53
/// made 2^53 + 1) leaves every hash as it was. `audit verify` reads the stored text and names such a
/// number; an integer beyond ±2^53 in a link written before writers kept such integers as text
/// (migration 0037) is excused, any other such number never is.
#[tokio::test]
async fn a_number_put_in_the_place_of_the_one_hashed_is_a_break() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    let c = claim_one(&store, "w", Duration::from_secs(30)).await;
    let step = Step {
        detail: Some(
            serde_json::json!({"a": 9007199254740992_u64, "n": 5, "big": 9007199254740992_u64}),
        ),
        ..Step::event(Event::CreateAccepted {
            remote_job_id: "job_1".into(),
            remote_state: None,
        })
        .with_call(jobtrail_store::testing::accepted_create(
            "http://127.0.0.1:1/v1/jobs",
        ))
    };
    store.apply(&c.lease, step).await.unwrap();
    assert!(store.verify_operation(op.id).await.unwrap().is_clean());
    let id = op.id.as_uuid();
    let set = |path: &str, to: &str| {
        format!(
            "SET session_replication_role = replica; UPDATE operation_history SET detail = jsonb_set(detail, '{{{path}}}', '{to}') WHERE operation_id = '{id}' AND seq = 2"
        )
    };
    let found = |r: &VerifyReport| {
        r.breaks
            .iter()
            .map(|b| (b.seq, b.stored.clone()))
            .collect::<Vec<_>>()
    };
    exec(&db, &set("evidence,n", "5.0000000000000001"))
        .await
        .unwrap();
    let r = store.verify_operation(op.id).await.unwrap();
    assert_eq!(found(&r), [(2, "5.0000000000000001".to_owned())], "{r:#?}");
    exec(&db, &set("evidence,n", "5")).await.unwrap();
    exec(&db, &set("evidence,big", "9007199254740993"))
        .await
        .unwrap();
    let r = store.verify_operation(op.id).await.unwrap();
    assert_eq!(found(&r), [(2, "9007199254740993".to_owned())], "{r:#?}");
    assert!(r.breaks[0].problem.contains("beyond a double's precision"));
    // Dated before writers kept such integers as text: a provider's, kept as it came.
    exec(
        &db,
        "SET session_replication_role = replica; UPDATE jobtrail_cutovers SET since = now() + interval '1 day' WHERE name = 'exact_numbers'",
    )
    .await
    .unwrap();
    assert!(store.verify_operation(op.id).await.unwrap().is_clean());
    // An excused integer before `n` in the stored text hides nothing put in after it.
    exec(&db, &set("evidence,a", "9007199254740993"))
        .await
        .unwrap();
    let r = store.verify_operation(op.id).await.unwrap();
    assert!(r.is_clean(), "{r:#?}");
    exec(&db, &set("evidence,n", "5.0000000000000001"))
        .await
        .unwrap();
    assert_eq!(
        found(&store.verify_operation(op.id).await.unwrap()),
        [(2, "5.0000000000000001".to_owned())]
    );
    // Every chain's verify finds it too.
    assert_eq!(
        found(&store.verify_all().await.unwrap()),
        [(2, "5.0000000000000001".to_owned())]
    );
}

/// A column a migration adds (while pods of the release before run, as in every rolling upgrade)
/// does not change what the store's statements return: one prepared before it on a connection
/// kept open still runs after it, where `SELECT *` would fail ("cached plan must not change result
/// type") until the connection was replaced.
#[tokio::test]
async fn statements_prepared_before_an_added_column_still_run_after_it() {
    let db = TestDb::new().await;
    // One connection: whatever ran on it before the migration is what runs after it.
    let store = Store::connect_with(&db.url, 1).await.unwrap();
    let read_all = async |store: &Store, op: &OperationRecord| {
        store.get(op.id).await.unwrap();
        store.history(op.id).await.unwrap();
        store.calls(op.id).await.unwrap();
        let r = store.verify_operation(op.id).await.unwrap();
        assert!(r.is_clean(), "{r:#?}");
    };
    let op = accepted_with_a_call(&store).await;
    read_all(&store, &op).await;
    exec(
        &db,
        "ALTER TABLE operations ADD COLUMN later_release text; \
         ALTER TABLE operation_history ADD COLUMN later_release text; \
         ALTER TABLE provider_calls ADD COLUMN later_release text",
    )
    .await
    .unwrap();
    read_all(&store, &op).await;
    // A submit and a claim, prepared by the first operation's, run too.
    let next = store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    claim_one(&store, "w2", Duration::from_secs(30)).await;
    store.get(next.id).await.unwrap();
}

async fn accepted_with_a_call(store: &Store) -> OperationRecord {
    let op = store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    let c = claim_one(store, "w", Duration::from_secs(30)).await;
    let step = Step::event(Event::CreateAccepted {
        remote_job_id: "job_1".into(),
        remote_state: None,
    })
    .with_call(jobtrail_store::testing::accepted_create(
        "http://127.0.0.1:1/v1/jobs",
    ));
    store.apply(&c.lease, step).await.unwrap();
    op
}

/// No row holds an infinite time or a NaN: PostgreSQL takes both ('NaN' >= 0 is true), the reader
/// cannot decode the one and no canonical JSON holds the other, so one such row written by any role
/// that may write the table made `audit verify` (and a worker's claim) fail on it for good, the
/// evidence being append-only. The schema refuses them, whoever writes.
#[tokio::test]
async fn infinite_times_and_nan_durations_are_refused_by_the_schema() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = accepted_with_a_call(&store).await;
    let id = op.id.as_uuid();
    let copy_call = |column: &str, value: &str| {
        format!(
            "CREATE TEMP TABLE c AS SELECT * FROM provider_calls WHERE operation_id = '{id}'; \
             UPDATE c SET id = gen_random_uuid(), seq = seq + 100, {column} = '{value}'; \
             INSERT INTO provider_calls SELECT * FROM c"
        )
    };
    for (why, sql) in [
        (
            "an infinite deadline",
            format!("UPDATE operations SET result_deadline = 'infinity' WHERE id = '{id}'"),
        ),
        (
            "an infinite due time",
            format!(
                "UPDATE operation_schedule SET next_action_at = 'infinity' WHERE operation_id = '{id}'"
            ),
        ),
        ("a NaN call duration", copy_call("duration_ms", "NaN")),
        (
            "an infinite call duration",
            copy_call("duration_ms", "Infinity"),
        ),
        ("a call at -infinity", copy_call("started_at", "-infinity")),
        (
            "a history link at infinity",
            format!(
                "CREATE TEMP TABLE h AS SELECT * FROM operation_history WHERE operation_id = '{id}' AND seq = 1; \
                 UPDATE h SET seq = 100, at = 'infinity'; INSERT INTO operation_history SELECT * FROM h"
            ),
        ),
    ] {
        // Triggers off (a superuser's session), so it is the CHECK constraint that refuses.
        let sql = format!("SET session_replication_role = replica; {sql}");
        let err = exec(&db, &sql).await.expect_err(why);
        assert!(
            err.as_database_error()
                .is_some_and(|e| e.code().as_deref() == Some("23514")),
            "{why}: {err}"
        );
    }
    assert!(store.verify_operation(op.id).await.unwrap().is_clean());
}

/// A call logged without a chain link (the schema's check dropped, as only an owner can) changes
/// no chain head. In an operation submitted after every writer chained its calls it is a break
/// `audit verify` names; in one submitted before, a call of those days, counted as unchained.
#[tokio::test]
async fn an_unchained_call_in_an_operation_of_chained_days_is_a_break() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = accepted_with_a_call(&store).await;
    let id = op.id.as_uuid();
    let clean = store.verify_operation(op.id).await.unwrap();
    assert!(clean.is_clean(), "{clean:#?}");
    assert_eq!(clean.unchained_calls, 0);
    // A copy of the create's call, with `set` (the schema's check dropped first, as only an owner
    // can).
    let copy_create = |set: &str| {
        format!(
            "ALTER TABLE provider_calls DROP CONSTRAINT IF EXISTS provider_calls_chained; \
             CREATE TEMP TABLE c AS SELECT * FROM provider_calls WHERE operation_id = '{id}' AND seq = 1; \
             UPDATE c SET id = gen_random_uuid(), {set}; INSERT INTO provider_calls SELECT * FROM c"
        )
    };
    let unlinked = copy_create("seq = NULL, prev_hash = NULL, hash = NULL");
    exec(&db, &unlinked).await.unwrap();
    let r = store.verify_operation(op.id).await.unwrap();
    assert_eq!(r.unchained_calls, 1, "{r:#?}");
    assert_eq!(r.breaks.len(), 1, "{r:#?}");
    assert!(r.breaks[0].problem.contains("no chain covers"), "{r:#?}");
    assert!(r.breaks[0].stored.contains("create"), "{r:#?}");
    assert_eq!(store.verify_all().await.unwrap().breaks.len(), 1);
    // One that keeps a number in the chain but lacks its hash is no link either.
    exec(&db, &copy_create("seq = 7, hash = NULL"))
        .await
        .unwrap();
    let r = store.verify_operation(op.id).await.unwrap();
    assert_eq!(r.unchained_calls, 2, "{r:#?}");
    assert_eq!(r.breaks.len(), 2, "{r:#?}");
    // Submitted before calls were always chained: a call of those days.
    exec(
        &db,
        "SET session_replication_role = replica; UPDATE jobtrail_cutovers SET since = now() + interval '1 day' WHERE name = 'current_link_shapes'",
    )
    .await
    .unwrap();
    let r = store.verify_operation(op.id).await.unwrap();
    assert!(r.is_clean(), "{r:#?}");
    assert_eq!(r.unchained_calls, 2);
}

/// PostgreSQL's `jsonb` keeps numbers beyond a double and nesting deeper than serde_json reads. A
/// writer role's own SQL could append such a link to a history that can never lose it: it must be a
/// break `audit verify` names, not an error that stops every verification (and every read of that
/// operation) for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_this_build_cannot_read_is_a_break_not_an_error_that_stops_verify() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = accepted_with_a_call(&store).await;
    let id = op.id.as_uuid();
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    // A link that continues the chain (the owner may record anything), its detail a number no
    // double holds; a call whose headers nest 200 deep; progress on the row beyond a double.
    exec(
        &db,
        &format!(
            "INSERT INTO operation_history (operation_id, seq, at, actor, from_state, to_state, event, cause, detail, prev_hash, hash) \
             SELECT id, history_seq + 1, now(), 'x', state, state, 'remote_progress', 'forged', '{{\"n\": 1e400}}', history_head, sha256(history_head) \
             FROM operations WHERE id = '{id}'; \
             UPDATE operations SET history_seq = history_seq + 1, history_head = sha256(history_head), \
             remote_progress = '{{\"n\": -1e400}}', result_summary = '{{\"n\": 1e400}}', \
             request_body = '{{\"n\": 1e400}}' WHERE id = '{id}'; \
             SET session_replication_role = replica; \
             CREATE TEMP TABLE c AS SELECT * FROM provider_calls WHERE operation_id = '{id}'; \
             UPDATE c SET id = gen_random_uuid(), seq = seq + 100, response_headers = '{deep}'; \
             INSERT INTO provider_calls SELECT * FROM c"
        ),
    )
    .await
    .unwrap();
    let history = store.history(op.id).await.unwrap();
    let forged = history.last().unwrap();
    let forged_seq = forged.seq;
    assert_eq!(forged.cause, "forged");
    assert!(
        forged.detail[jobtrail_store::record::UNREADABLE_JSON]
            .as_str()
            .is_some_and(|why| why.contains("number out of range")),
        "{:?}",
        forged.detail
    );
    let row = store.get(op.id).await.unwrap();
    for v in [
        row.remote_progress.unwrap(),
        row.result_summary.unwrap(),
        row.request_body,
    ] {
        assert!(
            v[jobtrail_store::record::UNREADABLE_JSON].is_string(),
            "{v}"
        );
    }
    let one = store.verify_operation(op.id).await.unwrap();
    assert!(
        one.breaks.iter().any(|b| b.seq == forged_seq),
        "{:?}",
        one.breaks
    );
    let all = store.verify_everything(None).await.unwrap();
    assert!(
        all.breaks.iter().any(|b| b.seq == forged_seq),
        "{:?}",
        all.breaks
    );
    assert!(
        all.breaks.iter().any(|b| b.problem.contains("call")),
        "{:?}",
        all.breaks
    );
}

#[tokio::test]
async fn cancel_before_create_withdraws_and_a_cancel_during_create_is_noted() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let req = CancelRequest::new("alice", "wrong account").unwrap();

    let a = store
        .submit_new(
            &submission(r#"{"n":1}"#),
            &providers(),
            SubmitLimits::default(),
        )
        .await
        .unwrap()
        .operation;
    let applied = store.request_cancel(a.id, req.clone()).await.unwrap();
    assert_eq!(applied.record.state, State::Withdrawn);
    assert_eq!(applied.record.cancel_requested_by.as_deref(), Some("alice"));
    assert!(
        store
            .claim_due("w", 10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty(),
        "withdrawn is never claimed"
    );

    // While a worker holds the lease the create may be in flight: noted, not withdrawn.
    let b = store
        .submit_new(
            &submission(r#"{"n":2}"#),
            &providers(),
            SubmitLimits::default(),
        )
        .await
        .unwrap()
        .operation;
    let c = claim_one(&store, "w", Duration::from_secs(30)).await;
    assert_eq!(c.lease.operation_id, b.id);
    let noted = store.request_cancel(b.id, req.clone()).await.unwrap();
    assert_eq!(noted.record.state, State::CreatePending);
    assert!(noted.record.has_pending_cancel());
    // The worker's create outcome still lands (the job id is never lost to a cancel request).
    let applied = store
        .apply(
            &c.lease,
            Step::event(Event::CreateAccepted {
                remote_job_id: "job_b".into(),
                remote_state: None,
            }),
        )
        .await
        .unwrap();
    assert_eq!(applied.record.state, State::Accepted);
    assert!(applied.record.has_pending_cancel());

    // Accepted: the request moves it to cancel_requested with a cancel deadline.
    let moved = store.request_cancel(b.id, req.clone()).await.unwrap();
    assert_eq!(moved.record.state, State::CancelRequested);
    assert!(moved.record.cancel_deadline.is_some());

    // Asked again while the cancel is under way (asked, then sent): answered, nothing written, the
    // first request standing. Before, a retried cancel was refused "cannot cancel: it is
    // cancel_requested".
    let again = CancelRequest::new("bob", "again").unwrap();
    let repeat = store.request_cancel(b.id, again.clone()).await.unwrap();
    assert!(repeat.transition.is_none());
    assert_eq!(repeat.record.history_seq, moved.record.history_seq);
    let c = claim_one(&store, "w", Duration::from_secs(30)).await;
    let sent = store
        .apply(
            &c.lease,
            Step::event(Event::CancelSent {
                http_status: Some(202),
            }),
        )
        .await
        .unwrap();
    assert_eq!(sent.record.state, State::Cancelling);
    let repeat = store.request_cancel(b.id, again).await.unwrap();
    assert!(repeat.transition.is_none());
    assert_eq!(repeat.record.history_seq, sent.record.history_seq);
    assert_eq!(repeat.record.cancel_requested_by.as_deref(), Some("alice"));
    assert!(store.verify_all().await.unwrap().is_clean());
}

#[tokio::test]
async fn a_late_worker_event_after_a_decision_is_refused_but_its_call_is_kept() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    let c = claim_one(&store, "w", Duration::from_secs(30)).await;
    store
        .apply(
            &c.lease,
            Step::event(Event::CreateAccepted {
                remote_job_id: "job_1".into(),
                remote_state: None,
            }),
        )
        .await
        .unwrap();
    let c = claim_one(&store, "w", Duration::from_secs(30)).await;
    // A person abandons while the worker polls.
    let abandon = Step::event(Event::Abandon {
        decision: Decision::new("bob", "customer withdrew").unwrap(),
    });
    store
        .decide(op.id, State::Accepted, None, abandon)
        .await
        .unwrap();
    // A decision on a view that is no longer current is refused.
    let again = Step::event(Event::Abandon {
        decision: Decision::new("bob", "again").unwrap(),
    });
    assert!(matches!(
        store.decide(op.id, State::Accepted, None, again).await,
        Err(StoreError::Stale { .. })
    ));
    let call = CallRecord {
        id: uuid::Uuid::now_v7(),
        kind: CallKind::Status,
        attempt: 1,
        started_at: chrono::Utc::now(),
        duration_ms: 3.0,
        method: "GET".into(),
        url: "http://127.0.0.1:1/v1/jobs/job_1".into(),
        http_status: Some(200),
        response_headers: serde_json::json!({}),
        provider_request_id: Some("req_1".into()),
        error_class: None,
        outcome: "status running".into(),
        trace_id: op.trace_id.to_string(),
        span_id: "00f067aa0ba902b7".into(),
        response_sha256: None,
    };
    let step = Step::event(Event::RemoteProgress {
        remote_state: "running".into(),
        known: true,
    })
    .with_call(call);
    let r = store.apply(&c.lease, step).await;
    assert!(
        matches!(
            r,
            Err(StoreError::Illegal { .. }) | Err(StoreError::LeaseLost { .. })
        ),
        "{r:?}"
    );
    let after = store.get(op.id).await.unwrap();
    assert_eq!(after.state, State::Abandoned);
    assert!(after.finished_at.is_some());
    let calls = store.calls(op.id).await.unwrap();
    assert_eq!(calls.len(), 1, "the call happened and is logged");
    assert_eq!(calls[0].provider_request_id.as_deref(), Some("req_1"));
    assert_eq!(
        store.history(op.id).await.unwrap().last().unwrap().to_state,
        "abandoned"
    );
}

/// Submit `n` operations (bodies keyed by `key`) and claim them all for "w".
async fn submit_and_claim(store: &Store, n: usize, key: &str) -> Vec<Claimed> {
    for i in 0..n {
        store
            .submit_new(
                &submission(&format!(r#"{{"{key}":{i}}}"#)),
                &providers(),
                SubmitLimits::default(),
            )
            .await
            .unwrap();
    }
    let claimed = store
        .claim_due("w", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), n);
    claimed
}

/// The call log's record of a create the provider accepted (202).
use jobtrail_store::testing::accepted_create;

/// One round of a long-running job's updates: every due operation claimed, a progress step written
/// for each, each due again at once. How many there were.
async fn progress_round(store: &Store) -> usize {
    let writes: Vec<_> = store
        .claim_due("w", 100, Duration::from_secs(60))
        .await
        .unwrap()
        .into_iter()
        .map(|c| {
            let step = Step {
                next_in: Some((Duration::ZERO, "test")),
                ..Step::event(Event::RemoteProgress {
                    remote_state: "running".into(),
                    known: true,
                })
            };
            (c.lease, step)
        })
        .collect();
    let n = writes.len();
    for r in store.apply_many(writes).await {
        r.unwrap();
    }
    n
}

/// Each claimed operation's create accepted (`job_<i>`), the operation due again at once.
async fn accept_every_create(store: &Store, claimed: Vec<Claimed>) {
    let writes = claimed
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let step = Step {
                next_in: Some((Duration::ZERO, "test")),
                ..Step::event(Event::CreateAccepted {
                    remote_job_id: format!("job_{i}"),
                    remote_state: None,
                })
                .with_call(accepted_create("http://127.0.0.1:1/v1/jobs"))
            };
            (c.lease, step)
        })
        .collect();
    for r in store.apply_many(writes).await {
        r.unwrap();
    }
}

/// Make `lease` stale, as if it had expired and been taken over.
async fn take_over(db: &TestDb, lease: &Lease) {
    exec(
        db,
        &format!(
            "UPDATE operations SET lease_epoch = lease_epoch + 1 WHERE id = '{}'",
            lease.operation_id.as_uuid()
        ),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn group_committed_writes_fence_each_operation_on_its_own() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let mut claimed = submit_and_claim(&store, 5, "g").await;
    // One lease goes stale (expired and taken over), one operation is abandoned by a person once
    // its lease ran out (a create still open is not abandoned under a live lease).
    let stale = claimed.remove(0);
    let gone = claimed.remove(0);
    take_over(&db, &stale.lease).await;
    exec(
        &db,
        &format!(
            "UPDATE operations SET lease_expires_at = now() - interval '1 second' WHERE id = '{}'",
            gone.lease.operation_id.as_uuid()
        ),
    )
    .await
    .unwrap();
    store
        .decide(
            gone.lease.operation_id,
            State::CreatePending,
            None,
            Step::event(Event::Abandon {
                decision: Decision::new("bob", "no").unwrap(),
            }),
        )
        .await
        .unwrap();
    let call = |n: u8| accepted_create(&format!("http://127.0.0.1:1/v1/jobs?n={n}"));
    let accept = |job: &str, n: u8| {
        Step::event(Event::CreateAccepted {
            remote_job_id: job.into(),
            remote_state: None,
        })
        .with_call(call(n))
    };
    let mut writes = vec![
        (stale.lease.clone(), accept("job_s", 0)),
        (gone.lease.clone(), accept("job_g", 1)),
    ];
    for (i, c) in claimed.iter().enumerate() {
        writes.push((c.lease.clone(), accept(&format!("job_{i}"), 2 + i as u8)));
    }
    let results = store.apply_many(writes).await;
    assert!(
        matches!(results[0], Err(StoreError::LeaseLost { .. })),
        "{:?}",
        results[0]
    );
    assert!(
        matches!(
            results[1],
            Err(StoreError::LeaseLost { .. }) | Err(StoreError::Illegal { .. })
        ),
        "{:?}",
        results[1]
    );
    for r in &results[2..] {
        assert_eq!(r.as_ref().unwrap().record.state, State::Accepted);
    }
    for c in &claimed {
        assert_eq!(
            store.get(c.lease.operation_id).await.unwrap().state,
            State::Accepted
        );
    }
    assert_eq!(
        store.get(stale.lease.operation_id).await.unwrap().state,
        State::CreatePending,
        "the stale write did not land"
    );
    assert_eq!(
        store.get(gone.lease.operation_id).await.unwrap().state,
        State::Abandoned
    );
    assert_eq!(
        count(&db, "provider_calls").await,
        5,
        "every call is logged, refused writes included"
    );
    assert!(store.verify_all().await.unwrap().is_clean());
}

/// One batch can hold a step of a lease since lost and one of the lease that replaced it: the same
/// worker claimed the operation again while its old step waited for the writer. The current
/// lease's step is written; the lost one's is refused, whichever comes first.
#[tokio::test]
async fn a_lost_lease_and_its_successor_in_one_batch_write_only_the_successors_step() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let claimed = submit_and_claim(&store, 2, "w").await;
    for (old_first, c) in [true, false].into_iter().zip(claimed) {
        let lost = c.lease;
        take_over(&db, &lost).await;
        let current = Lease {
            epoch: lost.epoch + 1,
            ..lost.clone()
        };
        let accept = |job: &str| {
            Step::event(Event::CreateAccepted {
                remote_job_id: job.into(),
                remote_state: None,
            })
            .with_call(accepted_create(&format!(
                "http://127.0.0.1:1/v1/jobs/{job}"
            )))
        };
        // Job ids of their own each round: a job another operation holds is not accepted twice.
        let (lost_job, current_job) = (format!("job_lost_{old_first}"), format!("job_{old_first}"));
        let mut writes = vec![
            (lost.clone(), accept(&lost_job)),
            (current.clone(), accept(&current_job)),
        ];
        if !old_first {
            writes.reverse();
        }
        let mut results = store.apply_many(writes).await;
        if !old_first {
            results.reverse();
        }
        assert!(
            matches!(results[0], Err(StoreError::LeaseLost { .. })),
            "old first: {old_first}: {:?}",
            results[0]
        );
        let written = results[1].as_ref().unwrap();
        assert_eq!(written.record.remote_job_id, Some(current_job.clone()));
        let row = store.get(current.operation_id).await.unwrap();
        assert_eq!(row.remote_job_id, Some(current_job));
        assert_eq!(row.lease_epoch, current.epoch);
    }
    assert!(store.verify_all().await.unwrap().is_clean());
}

#[tokio::test]
async fn result_bytes_are_written_with_their_step_or_not_at_all_and_never_changed() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let mut claimed = submit_and_claim(&store, 3, "r").await;
    let stale = claimed.remove(0);
    take_over(&db, &stale.lease).await;
    let blob = |text: &'static str| {
        use sha2::Digest;
        ResultBytes {
            sha256: hex::encode(sha2::Sha256::digest(text.as_bytes())),
            content_type: Some("text/plain".into()),
            bytes: bytes::Bytes::from_static(text.as_bytes()),
        }
    };
    let with = |b: ResultBytes| Step {
        result_bytes: Some(b),
        keep_lease: true,
        ..Default::default()
    };
    // Group commit: the stale lease's bytes are refused with its step, the live one's are kept.
    let results = store
        .apply_many(vec![
            (stale.lease.clone(), with(blob("stale"))),
            (claimed[0].lease.clone(), with(blob("kept in a batch"))),
        ])
        .await;
    assert!(matches!(results[0], Err(StoreError::LeaseLost { .. })));
    assert!(results[1].is_ok(), "{:?}", results[1]);
    let stale_blob = blob("stale");
    assert_eq!(
        store
            .result_bytes(stale.lease.operation_id, &stale_blob.sha256)
            .await
            .unwrap(),
        None
    );
    let b1 = blob("kept in a batch");
    assert_eq!(
        store
            .result_bytes(claimed[0].lease.operation_id, &b1.sha256)
            .await
            .unwrap()
            .as_deref(),
        Some(b"kept in a batch".as_slice())
    );
    // One step on its own, then the same bytes again (a retried step): one row.
    let b2 = blob("kept alone");
    store
        .apply(&claimed[1].lease, with(b2.clone()))
        .await
        .unwrap();
    store
        .apply(&claimed[1].lease, with(b2.clone()))
        .await
        .unwrap();
    assert_eq!(count(&db, "operation_results").await, 2);
    let loc = b2.location(claimed[1].lease.operation_id);
    assert_eq!(
        ResultBytes::parse_location(&loc),
        Some((claimed[1].lease.operation_id, b2.sha256.as_str()))
    );
    assert_eq!(ResultBytes::parse_location("file:///tmp/x"), None);
    // Kept bytes are evidence: no statement may change or remove them.
    for sql in [
        "UPDATE operation_results SET bytes = 'x'",
        "DELETE FROM operation_results",
        "TRUNCATE operation_results",
    ] {
        let e = exec(&db, sql).await.unwrap_err().to_string();
        assert!(e.contains("append-only"), "{sql}: {e}");
    }
    assert_eq!(count(&db, "operation_results").await, 2);
}

/// The evidence inserts' foreign-key checks stay index lookups however the tables' statistics
/// looked when a session first planned them: here every table is analysed while empty, then one
/// long-lived connection writes 400 steps that each log a call. A check planned for the empty
/// `provider_calls` and kept for the session would read the whole table on every insert (about
/// 80 000 tuples here; tens of millions in a long run).
#[tokio::test]
async fn foreign_key_checks_do_not_scan_tables_analysed_while_empty() {
    let db = TestDb::new().await;
    exec(
        &db,
        "ANALYZE operations; ANALYZE operation_history; ANALYZE provider_calls",
    )
    .await
    .unwrap();
    let store = Store::connect_with(&db.url, 1).await.unwrap();
    let call = || accepted_create("http://127.0.0.1:1/v1/jobs");
    for round in 0..8 {
        for i in 0..50 {
            store
                .submit_new(
                    &submission(&format!(r#"{{"fk":{round},"i":{i}}}"#)),
                    &providers(),
                    SubmitLimits::default(),
                )
                .await
                .unwrap();
        }
        let claimed = store
            .claim_due("w", 50, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(claimed.len(), 50);
        let writes = claimed
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut step = Step::event(Event::CreateAccepted {
                    remote_job_id: format!("job_{round}_{i}"),
                    remote_state: None,
                })
                .with_call(call());
                // Not due again during the test: the next round claims only new operations.
                step.next_in = Some((Duration::from_secs(3600), "test"));
                (c.lease.clone(), step)
            })
            .collect();
        for r in store.apply_many(writes).await {
            r.unwrap();
        }
    }
    // A backend reports its table statistics when it exits: close the connection and wait for it.
    store.close().await;
    use sqlx::Connection;
    let mut reader = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let read = loop {
        let (seq, idx): (i64, i64) = sqlx::query_as(
            "SELECT coalesce(seq_tup_read, 0), coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'provider_calls'",
        )
        .fetch_one(&mut reader)
        .await
        .unwrap();
        if idx + seq > 0 || std::time::Instant::now() > deadline {
            break seq;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(count(&db, "provider_calls").await, 400);
    assert!(
        read < 20_000,
        "{read} tuples of provider_calls read sequentially by 400 inserts"
    );
}

/// Held by the test that counts HOT updates and by the one that seeds thousands of rows, so that
/// they never overlap: run beside the seeding test, the share of HOT updates fell from above 70 %
/// to 30-70 % (the pruning that frees room on a page for the next version happened less often;
/// run beside every other test of this file, or beside bulk inserts into another database, it
/// did not).
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The schedule (migration 0012) holds exactly the operations a worker still has to act on, each at
/// its record's next_action_at.
async fn schedule_mismatches(db: &TestDb) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM operations o FULL JOIN operation_schedule q ON q.operation_id = o.id \
         WHERE (o.state IN ('create_pending', 'create_unknown', 'reconciliation', 'accepted', 'observing', \
                            'result_collecting', 'cancel_requested', 'cancelling')) \
               IS DISTINCT FROM (q.operation_id IS NOT NULL) \
            OR q.next_action_at IS DISTINCT FROM CASE WHEN q.operation_id IS NOT NULL THEN o.next_action_at END \
            OR q.provider IS DISTINCT FROM CASE WHEN q.operation_id IS NOT NULL THEN o.provider END",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    n
}

#[tokio::test]
async fn claims_and_progress_steps_are_hot_updates_and_the_schedule_follows_every_state() {
    let _alone = HEAVY.lock().await;
    let db = TestDb::new().await;
    let store = Store::connect_with(&db.url, 1).await.unwrap();
    let n = 40;
    let mut leases: Vec<Lease> = Vec::new();
    for i in 0..n {
        store
            .submit_new(
                &submission(&format!(r#"{{"hot":{i}}}"#)),
                &providers(),
                SubmitLimits::default(),
            )
            .await
            .unwrap();
    }
    assert_eq!(schedule_mismatches(&db).await, 0, "after submit");
    let claim = |store: &Store| {
        let store = store.clone();
        async move {
            let c = store
                .claim_due("w", 100, Duration::from_secs(60))
                .await
                .unwrap();
            assert_eq!(c.len(), n, "every operation is due again");
            c
        }
    };
    // Accept every create (the step that learns the job id, indexed: not HOT), then six rounds of
    // claim and progress (every row due again at once): the updates a long-running job makes.
    accept_every_create(&store, claim(&store).await).await;
    for _ in 0..6 {
        assert_eq!(
            progress_round(&store).await,
            n,
            "every operation is due again"
        );
        assert_eq!(schedule_mismatches(&db).await, 0, "after a round of steps");
    }
    // Leases given back for later, one operation held for a person and then abandoned, one failed:
    // the schedule follows each.
    leases.extend(claim(&store).await.into_iter().map(|c| c.lease));
    for l in &leases[2..] {
        store
            .release(l, Duration::from_secs(3600), "test")
            .await
            .unwrap();
    }
    let failed = Step::event(Event::RemoteFailed {
        remote_state: "failed".into(),
        reason: None,
    });
    for r in store
        .apply_many(vec![
            (leases[0].clone(), Step::event(Event::ResultDeadlinePassed)),
            (leases[1].clone(), failed),
        ])
        .await
    {
        r.unwrap();
    }
    assert_eq!(
        schedule_mismatches(&db).await,
        0,
        "after a hold and a failure"
    );
    assert_eq!(count(&db, "operation_schedule").await, n as i64 - 2);
    store
        .decide(
            leases[0].operation_id,
            State::ResultTimedOut,
            None,
            Step::event(Event::Abandon {
                decision: Decision::new("bob", "no").unwrap(),
            }),
        )
        .await
        .unwrap();
    assert_eq!(
        schedule_mismatches(&db).await,
        0,
        "after release and decisions"
    );

    // A backend reports its table statistics when it exits: close the connection and wait for it.
    store.close().await;
    use sqlx::Connection;
    let mut reader = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (updates, hot) = loop {
        let (upd, hot): (i64, i64) = sqlx::query_as(
            "SELECT coalesce(n_tup_upd, 0), coalesce(n_tup_hot_upd, 0) FROM pg_stat_user_tables WHERE relname = 'operations'",
        )
        .fetch_one(&mut reader)
        .await
        .unwrap();
        if upd >= (n * 14) as i64 || std::time::Instant::now() > deadline {
            break (upd, hot);
        }
        sqlx::query("SELECT pg_stat_clear_snapshot()")
            .execute(&mut reader)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(updates >= (n * 14) as i64, "{updates} updates counted");
    assert!(
        hot * 10 >= updates * 7,
        "{hot} of {updates} updates of operations were HOT"
    );
}

/// Reads of `operations` and `operation_schedule` (sequential and by index) reported so far, once
/// at least `updates` updates of `operations` are reported: a backend reports its table statistics
/// when it exits, some moments later.
async fn rows_read_after(db: &TestDb, inserts: i64, updates: i64) -> i64 {
    use sqlx::Connection;
    let mut reader = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (ins, upd, read): (i64, i64, i64) = sqlx::query_as(
            "SELECT sum(n_tup_ins) FILTER (WHERE relname = 'operations')::int8, \
                    sum(n_tup_upd) FILTER (WHERE relname = 'operations')::int8, \
                    sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0))::int8 \
             FROM pg_stat_user_tables WHERE relname IN ('operations', 'operation_schedule')",
        )
        .fetch_one(&mut reader)
        .await
        .unwrap();
        if (ins >= inserts && upd >= updates) || std::time::Instant::now() > deadline {
            return read;
        }
        sqlx::query("SELECT pg_stat_clear_snapshot()")
            .execute(&mut reader)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A claim reads the first rows of the due index, whatever the statistics say. Here 2 000
/// operations come due in a queue whose statistics describe it nearly drained (a handful of rows
/// over many pages, as autovacuum leaves a queue it analysed between bursts), and a worker session
/// that starts afterwards makes ten claims of ten. Planned from those statistics, each claim would
/// read and sort the whole schedule and fetch every due operation, and the schedule trigger its
/// update fires would read the whole schedule again (about 60 000 rows for the ten claims; 20 000
/// with the claim fixed and the trigger not).
#[tokio::test]
async fn claims_read_the_due_index_in_order_whatever_the_statistics() {
    let _alone = HEAVY.lock().await;
    let db = TestDb::new().await;
    let seeder = Store::connect_with(&db.url, 1).await.unwrap();
    assert_eq!(seeder.bench_seed(2_000, "observing").await.unwrap(), 2_000);
    seeder.close().await;
    exec(
        &db,
        "ALTER TABLE operations SET (autovacuum_enabled = off); \
         ALTER TABLE operation_schedule SET (autovacuum_enabled = off); \
         UPDATE pg_class SET reltuples = 5, relpages = 200 \
         WHERE relname IN ('operations', 'operation_schedule')",
    )
    .await
    .unwrap();
    let before = rows_read_after(&db, 2_000, 0).await;

    let worker = Store::connect_with(&db.url, 1).await.unwrap();
    let share = ClaimShare {
        provider: "bench".into(),
        fair: 10,
        cap: 10,
        fleet_cap: None,
        reserve: 0,
    };
    for _ in 0..10 {
        let claimed = worker
            .claim_shares(
                "w",
                (10, 10),
                Duration::from_secs(60),
                std::slice::from_ref(&share),
            )
            .await
            .unwrap();
        assert_eq!(claimed.len(), 10);
    }
    worker.close().await;
    let read = rows_read_after(&db, 2_000, 100).await - before;
    assert_eq!(schedule_mismatches(&db).await, 0);
    assert!(
        read < 2_000,
        "ten claims of ten read {read} rows of operations and operation_schedule"
    );
}

/// Two providers borrowing at once leave a third its reserve: their extra rows together stay within
/// the worker's free slots less what every provider is still owed, and a provider's own fair rows
/// in the claim count towards its reserve. Before, each borrower was capped on its own, and two of
/// them took every free slot between them.
#[tokio::test]
async fn borrowers_together_leave_every_other_provider_its_reserve() {
    let db = TestDb::new().await;
    let store = db.store().await;
    for provider in ["sim", "legacy"] {
        for i in 0..6 {
            let mut s = submission(&format!("{{\"n\": {i}}}"));
            s.provider = provider.into();
            store
                .submit_new(&s, &providers(), SubmitLimits::default())
                .await
                .unwrap();
        }
    }
    let share = |provider: &str, fair: i32, reserve: i32| ClaimShare {
        provider: provider.into(),
        fair,
        cap: 10,
        fleet_cap: None,
        reserve,
    };
    // (shares, free slots) → rows claimed.
    let cases = [
        // Both borrow (no fair rows left), a third with nothing due is owed 2 of the 4 free slots.
        (
            vec![
                share("sim", 0, 0),
                share("legacy", 0, 0),
                share("idle", 0, 2),
            ],
            4,
            2,
        ),
        // One fair row each, then one extra: 4 free less 2 fair less 1 owed.
        (
            vec![
                share("sim", 1, 0),
                share("legacy", 1, 0),
                share("idle", 0, 1),
            ],
            4,
            3,
        ),
        // A provider's own fair rows pay its reserve: legacy takes its 2, sim borrows the rest.
        (vec![share("sim", 0, 0), share("legacy", 2, 2)], 4, 4),
        // Nothing owed: every free slot may be borrowed.
        (vec![share("sim", 0, 0), share("legacy", 0, 0)], 4, 4),
    ];
    for (i, (shares, free, want)) in cases.into_iter().enumerate() {
        let claimed = store
            .claim_shares("w", (free, free), Duration::from_secs(60), &shares)
            .await
            .unwrap();
        assert_eq!(claimed.len(), want, "case {i}");
        for c in claimed {
            store
                .release(&c.lease, Duration::ZERO, "test")
                .await
                .unwrap();
        }
    }
}

/// A listing reads a bounded number of rows whatever the table holds. Before, a caller with one
/// operation among thousands of another's walked the primary key through all of them, and a filter
/// that matched nothing (`created_before` a date before any, a state none is in) read every row
/// there was, on each request: with operations kept for good, a few such requests at once held the
/// API's pool. Now a caller's listing reads the (caller, id) index, and a page reads at most
/// LIST_SCAN_MOST of its operations, coming back short (or empty) with where the next starts.
#[tokio::test]
async fn a_listing_reads_a_bounded_number_of_rows_however_many_there_are() {
    let _alone = HEAVY.lock().await;
    let db = TestDb::new().await;
    let store = db.store().await;
    let many = 5_000;
    assert_eq!(store.bench_seed(many, "succeeded").await.unwrap(), 5_000);
    let mine = store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    // Vacuumed, so that reading where a short page's scan ended is an index-only read (no row
    // fetched): the rows counted are those the pages themselves read.
    exec(&db, "VACUUM ANALYZE operations").await.unwrap();
    let of = |caller: &str| ListFilter {
        caller: Some(caller.into()),
        ..Default::default()
    };
    let long_ago = Some("2000-01-01T00:00:00Z".parse().unwrap());

    // The caller with one operation: found without reading the others' rows.
    let read = rows_read_by(&db, many + 1, async |lister| {
        let page = lister.list_page(&of("agent-7"), 51).await.unwrap();
        assert_eq!(page.operations.len(), 1);
        assert_eq!(page.operations[0].id, mine.id);
        assert_eq!(page.scanned_past, None, "nothing past it");
        let none = ListFilter {
            created_before: long_ago,
            ..of("agent-7")
        };
        let page = lister.list_page(&none, 51).await.unwrap();
        assert!(page.operations.is_empty() && page.scanned_past.is_none());
    })
    .await;
    assert!(
        read < 100,
        "two listings of a caller with one operation read {read} rows"
    );

    // The caller with thousands, and a filter that only its oldest operation matches: it is not
    // on the first page, which reads no more than LIST_SCAN_MOST rows, nor the second; it is on
    // the last, the pages before coming back empty with where the next starts.
    exec(
        &db,
        "SET session_replication_role = replica; \
         UPDATE operations SET state = 'failed' \
         WHERE id = (SELECT id FROM operations WHERE caller = 'bench' ORDER BY id LIMIT 1)",
    )
    .await
    .unwrap();
    let failed = ListFilter {
        state: Some(State::Failed),
        ..of("bench")
    };
    let mut cursor = None;
    let mut pages = Vec::new();
    loop {
        let filter = ListFilter {
            before: cursor,
            ..failed.clone()
        };
        let page = store.list_page(&filter, 51).await.unwrap();
        pages.push(page.operations.len());
        assert!(pages.len() <= 10, "the pages never ended");
        match page.scanned_past {
            Some(past) => cursor = Some(past),
            None => break,
        }
    }
    assert_eq!(
        pages,
        [0, 0, 1],
        "pages of at most {LIST_SCAN_MOST} rows read"
    );

    // Paged with no filter, every operation is listed once.
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor = None;
    for _ in 0..100 {
        let filter = ListFilter {
            before: cursor,
            ..Default::default()
        };
        let page = store.list_page(&filter, 200).await.unwrap();
        for o in &page.operations {
            assert!(seen.insert(o.id), "{} listed twice", o.id);
        }
        cursor = match (page.operations.len(), page.scanned_past) {
            (200, _) => page.operations.last().map(|o| o.id),
            (_, past) => past,
        };
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(seen.len() as i64, many + 1);
}

/// Rows of `operations` read by what `work` does on a store of its own, counted once that store's
/// session has ended (a session reports what it read when it ends, or every so often).
async fn rows_read_by(db: &TestDb, inserts: i64, work: impl AsyncFnOnce(&Store)) -> i64 {
    let before = rows_read_after(db, inserts, 0).await;
    let lister = Store::connect_with(&db.url, 1).await.unwrap();
    work(&lister).await;
    lister.close().await;
    // Read until two readings half a second apart agree (the ended session's report lands).
    let mut last = rows_read_after(db, inserts, 0).await;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = rows_read_after(db, inserts, 0).await;
        if now == last && now > before {
            break;
        }
        last = now;
    }
    last - before
}

/// A migration whose concurrent index build was interrupted runs again: PostgreSQL leaves such a
/// build as an INVALID index, and before, `jobtrail migrate` then failed on its name ("already
/// exists") until a person dropped it. (A unique build over duplicates fails as an interrupted one
/// does, leaving the same INVALID index.)
#[tokio::test]
async fn a_migration_whose_concurrent_index_build_was_interrupted_runs_again() {
    let db = TestDb::new().await;
    let store = db.store().await;
    for body in ["{}", r#"{"n": 1}"#] {
        store
            .submit_new(&submission(body), &providers(), SubmitLimits::default())
            .await
            .unwrap();
    }
    exec(&db, "DROP INDEX operations_open_by_caller")
        .await
        .unwrap();
    exec(
        &db,
        "DELETE FROM _sqlx_migrations WHERE version = 20261204000024",
    )
    .await
    .unwrap();
    exec(
        &db,
        "CREATE UNIQUE INDEX CONCURRENTLY operations_open_by_caller ON operations (caller) \
         WHERE finished_at IS NULL",
    )
    .await
    .expect_err("two open operations of one caller");
    let validity = async || {
        let sql = "SELECT i.indisvalid, i.indisunique FROM pg_index i \
                   JOIN pg_class c ON c.oid = i.indexrelid \
                   WHERE c.relname = 'operations_open_by_caller'";
        let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
            .await
            .unwrap();
        let row: Option<(bool, bool)> = sqlx::query_as(sql).fetch_optional(&mut c).await.unwrap();
        row
    };
    assert_eq!(validity().await, Some((false, true)), "left INVALID");

    store.migrate().await.unwrap();
    assert_eq!(
        validity().await,
        Some((true, false)),
        "built again, as 0024 says"
    );
    assert!(store.check_schema().await.is_ok());
}

/// A batch is refused by its first bad item whatever other callers' ids exist: every item is
/// validated before any id is looked up (before, an item holding another caller's id refused the
/// batch as "not found" ahead of a later bad item, so a free id and a taken one answered apart).
/// An id twice in one batch is one operation, answered twice.
#[tokio::test]
async fn a_batch_is_refused_by_its_bad_item_before_any_id_is_looked_up() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let taken = store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    let mut probe = submission("{}");
    probe.caller = "agent-8".into();
    probe.operation_id = Some(taken.id);
    let mut bad = submission("{}");
    bad.caller = "agent-8".into();
    bad.provider = "nope".into();
    for first in [Some(taken.id), None] {
        probe.operation_id = first;
        let refused = store
            .submit_new_batch(
                &[probe.clone(), bad.clone()],
                &providers(),
                SubmitLimits::default(),
            )
            .await;
        assert!(
            matches!(
                refused,
                Err((
                    Some(1),
                    StoreError::Submit(SubmitError::UnknownProvider { .. })
                ))
            ),
            "{first:?}: {refused:?}"
        );
    }
    assert_eq!(count(&db, "operations").await, 1, "nothing written");

    let mut twice = submission(r#"{"n": 2}"#);
    twice.operation_id = Some(OperationId::from_uuid(uuid::Uuid::now_v7()));
    let got = store
        .submit_new_batch(
            &[twice.clone(), twice.clone()],
            &providers(),
            SubmitLimits::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        got.iter()
            .map(|s| (s.operation.id, s.created))
            .collect::<Vec<_>>(),
        [
            (twice.operation_id.unwrap(), true),
            (twice.operation_id.unwrap(), false)
        ]
    );
    assert_eq!(count(&db, "operations").await, 2);
}

/// An agent's retry (`supersedes` in a submission) links both ways in one transaction, as a
/// person's retry does: the old operation gets its `superseded` link and `superseded_by`. The same
/// submission again is the same operation; any other retry of the same operation is refused, alone
/// or in a batch, with nothing written. (Before, each agent retry left the old operation unlinked,
/// so any number of operations could claim to supersede it.)
#[tokio::test]
async fn an_agents_retry_links_both_ways_and_only_once() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let old = store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    store
        .request_cancel(
            old.id,
            CancelRequest::new("agent-7", "wrong range").unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(store.get(old.id).await.unwrap().state, State::Withdrawn);

    let mut retry = submission(r#"{"range": "2026"}"#);
    retry.supersedes = Some(old.id);
    retry.operation_id = Some(OperationId::from_uuid(uuid::Uuid::now_v7()));
    let new = store
        .submit_new(&retry, &providers(), SubmitLimits::default())
        .await
        .unwrap();
    assert!(new.created);
    let linked = store.get(old.id).await.unwrap();
    assert_eq!(linked.superseded_by, Some(new.operation.id));
    let history = store.history(old.id).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(
        (last.event.as_str(), last.actor.as_str()),
        ("superseded", "agent-7")
    );
    assert!(store.verify_operation(old.id).await.unwrap().is_clean());
    assert!(
        store
            .verify_operation(new.operation.id)
            .await
            .unwrap()
            .is_clean()
    );

    let again = store
        .submit_new(&retry, &providers(), SubmitLimits::default())
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.operation.id, new.operation.id);
    assert_eq!(store.history(old.id).await.unwrap().len(), history.len());

    let mut other = submission(r#"{"range": "2025"}"#);
    other.supersedes = Some(old.id);
    let refused = store
        .submit_new(&other, &providers(), SubmitLimits::default())
        .await;
    assert!(
        matches!(refused, Err(StoreError::Conflict(_))),
        "{refused:?}"
    );
    let refused = store
        .submit_new_batch(&[other], &providers(), SubmitLimits::default())
        .await;
    assert!(
        matches!(refused, Err((Some(0), StoreError::Conflict(_)))),
        "{refused:?}"
    );
    assert_eq!(count(&db, "operations").await, 2, "nothing written");

    // Which operation retried it is checked against the link that records the retry.
    exec(
        &db,
        &format!(
            "UPDATE operations SET superseded_by = NULL WHERE id = '{}'",
            old.id.as_uuid()
        ),
    )
    .await
    .unwrap();
    let report = store.verify_operation(old.id).await.unwrap();
    assert!(
        report
            .breaks
            .iter()
            .any(|b| b.problem.contains("superseded_by differs")),
        "{:?}",
        report.breaks
    );
}

#[tokio::test]
async fn verify_reads_one_instant_while_steps_commit() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let n = 8;
    let claimed = submit_and_claim(&store, n, "busy").await;
    let first = claimed[0].lease.operation_id;
    accept_every_create(&store, claimed).await;
    // A worker's progress steps commit without pause (each a link and the head that names it)
    // while the whole record is verified again and again: every verification reads one instant.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && rounds < 5_000 {
                progress_round(&store).await;
                rounds += 1;
            }
            rounds
        })
    };
    let mut verified = 0;
    for _ in 0..40 {
        let report = store.verify_all().await.unwrap();
        assert!(report.breaks.is_empty(), "{:#?}", report.breaks);
        verified += report.rows;
        let one = store.verify_operation(first).await.unwrap();
        assert!(one.breaks.is_empty(), "{:#?}", one.breaks);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = tokio::time::timeout(Duration::from_secs(30), writer)
        .await
        .expect("the writer stops")
        .unwrap();
    assert!(
        rounds > 10,
        "steps committed while verifying: {rounds} rounds"
    );
    assert!(verified > 0);
}

#[tokio::test]
async fn a_job_id_as_long_as_a_status_url_is_recorded_and_found() {
    use sha2::Digest;
    let db = TestDb::new().await;
    let store = db.store().await;
    let claimed = submit_and_claim(&store, 1, "long").await;
    let lease = claimed[0].lease.clone();
    // 8 KiB that do not compress (a signed URL's query string): past a btree entry's ~2.7 KB.
    let mut job = String::new();
    let mut h = sha2::Sha256::digest(b"seed").to_vec();
    while job.len() < jobtrail_core::ids::MAX_LOCATOR_BYTES {
        job.push_str(&hex::encode(&h));
        h = sha2::Sha256::digest(&h).to_vec();
    }
    job.truncate(jobtrail_core::ids::MAX_LOCATOR_BYTES);
    let step = Step::event(Event::CreateAccepted {
        remote_job_id: job.clone(),
        remote_state: None,
    })
    .with_call(accepted_create("http://127.0.0.1:1/v1/jobs"));
    store.apply(&lease, step).await.unwrap();
    assert_eq!(
        store.get(lease.operation_id).await.unwrap().remote_job_id,
        Some(job.clone())
    );
    // A webhook naming the job finds its operation.
    match store
        .webhook_delivered("sim", "evt-long", Some(&job), Duration::from_secs(3600))
        .await
        .unwrap()
    {
        Delivery::New { operation_id, .. } => assert_eq!(operation_id, Some(lease.operation_id)),
        other => panic!("{other:?}"),
    }
}

/// A webhook that arrives while a worker holds the lease (its status read may have been answered
/// just before the job finished) is not lost: the worker's next write makes the next read due
/// soon, not after the backoff its step chose; a step that keeps the lease keeps the mark. Soon is
/// never closer than the floor after the last read, with the lease or without: deliveries without
/// end would have a worker read as fast as it turns round.
#[tokio::test]
async fn a_webhook_during_a_lease_makes_the_next_read_due_at_once() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let claimed = submit_and_claim(&store, 3, "poked").await;
    accept_keeping_leases(&store, &claimed.iter().collect::<Vec<_>>()).await;
    let (poked, quiet, cancelled) = (&claimed[0], &claimed[1], &claimed[2]);
    // Where a cancel not yet sent comes next, a webhook brings nothing forward (it would bring
    // the cancel call forward, not a status read).
    let id = cancelled.lease.operation_id;
    store
        .request_cancel(id, CancelRequest::new("alice", "stop").unwrap())
        .await
        .unwrap();
    match store
        .webhook_delivered(
            "sim",
            "evt-0",
            Some(&format!("job_{id}")),
            Duration::from_secs(3600),
        )
        .await
        .unwrap()
    {
        Delivery::New { outcome, .. } => assert_eq!(outcome, DeliveryOutcome::NotObserving),
        other => panic!("{other:?}"),
    }
    let job = format!("job_{}", poked.lease.operation_id);
    match store
        .webhook_delivered("sim", "evt-1", Some(&job), Duration::from_secs(3600))
        .await
        .unwrap()
    {
        Delivery::New { outcome, .. } => assert_eq!(outcome, DeliveryOutcome::Scheduled),
        other => panic!("{other:?}"),
    }
    let read = |keep_lease: bool| Step {
        keep_lease,
        call: Some(status_read("running")),
        next_in: Some((Duration::from_secs(60), "backoff")),
        ..Step::event(Event::RemoteProgress {
            remote_state: "running".into(),
            known: true,
        })
    };
    // A step that keeps the lease carries the mark on.
    store.apply(&poked.lease, read(true)).await.unwrap();
    let due_in_ms =
        |r: &OperationRecord| (r.next_action_at - chrono::Utc::now()).num_milliseconds();
    let floor = jobtrail_store::WEBHOOK_READ_FLOOR.as_millis() as i64;
    for (c, expected) in [(poked, floor - 1000..=floor), (quiet, 55_000..=60_000)] {
        let r = store.apply(&c.lease, read(false)).await.unwrap().record;
        assert!(
            expected.contains(&due_in_ms(&r)),
            "{}: due in {} ms ({})",
            c.lease.operation_id,
            due_in_ms(&r),
            r.next_action_reason
        );
    }
    // Released after a read, then a webhook: due at the floor after that read, not at once.
    let job = format!("job_{}", quiet.lease.operation_id);
    match store
        .webhook_delivered("sim", "evt-2", Some(&job), Duration::from_secs(3600))
        .await
        .unwrap()
    {
        Delivery::New { outcome, .. } => assert_eq!(outcome, DeliveryOutcome::Scheduled),
        other => panic!("{other:?}"),
    }
    let r = store.get(quiet.lease.operation_id).await.unwrap();
    assert!(
        (floor - 1000..=floor).contains(&due_in_ms(&r)),
        "due in {} ms ({})",
        due_in_ms(&r),
        r.next_action_reason
    );
}

/// Failures spent creating a job are not its status reads': once the provider accepts it, it is
/// watched with the whole retry budget (two status errors after seven failed creates held it for a
/// person, and webhooks were ignored until its first good read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_accepted_after_failed_creates_is_watched_with_the_whole_retry_budget() {
    let db = TestDb::new().await;
    let store = db.store().await;
    store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap();
    let c = claim_one(&store, "w", Duration::from_secs(30)).await;
    for _ in 0..3 {
        let failed = Step {
            keep_lease: true,
            counters: Counters {
                failures: FailureCount::Increment,
                ..Counters::default()
            },
            ..Step::event(Event::CallFailed {
                error_class: "connect_failed".into(),
            })
        };
        store.apply(&c.lease, failed).await.unwrap();
    }
    let op = store.get(c.lease.operation_id).await.unwrap();
    assert_eq!(op.failure_count, 3);
    let accepted = Step::event(Event::CreateAccepted {
        remote_job_id: "job_1".into(),
        remote_state: None,
    })
    .with_call(accepted_create("http://127.0.0.1:1/v1/jobs"));
    let r = store.apply(&c.lease, accepted).await.unwrap().record;
    assert_eq!(r.failure_count, 0);
}

/// A webhook brings a status read forward from a polling wait, never from the backoff after failed
/// reads: deliveries during a provider's outage would spend the retry budget in seconds and hold
/// the job for a person.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_never_shortens_the_backoff_after_failed_reads() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let claimed = submit_and_claim(&store, 2, "outage").await;
    accept_keeping_leases(&store, &claimed.iter().collect::<Vec<_>>()).await;
    let (failing, held) = (&claimed[0], &claimed[1]);
    let failed_read = |keep_lease: bool| Step {
        keep_lease,
        call: Some(status_read("running")),
        counters: Counters {
            polls: 1,
            failures: FailureCount::Increment,
            ..Counters::default()
        },
        next_in: Some((Duration::from_secs(60), "backoff")),
        ..Step::event(Event::CallFailed {
            error_class: "server_error".into(),
        })
    };
    let due_in = |r: &OperationRecord| (r.next_action_at - chrono::Utc::now()).num_seconds();
    // Released after a failed read, then a webhook: the backoff stands.
    store
        .apply(&failing.lease, failed_read(false))
        .await
        .unwrap();
    let job = format!("job_{}", failing.lease.operation_id);
    match store
        .webhook_delivered("sim", "evt-out-1", Some(&job), Duration::from_secs(3600))
        .await
        .unwrap()
    {
        Delivery::New { outcome, .. } => assert_ne!(outcome, DeliveryOutcome::Scheduled),
        other => panic!("{other:?}"),
    }
    let r = store.get(failing.lease.operation_id).await.unwrap();
    assert!(
        (55..=60).contains(&due_in(&r)),
        "due in {} s ({})",
        due_in(&r),
        r.next_action_reason
    );
    // A webhook while the lease is held, then a failed read that lets it go: the backoff stands.
    let job = format!("job_{}", held.lease.operation_id);
    store
        .webhook_delivered("sim", "evt-out-2", Some(&job), Duration::from_secs(3600))
        .await
        .unwrap();
    let r = store
        .apply(&held.lease, failed_read(false))
        .await
        .unwrap()
        .record;
    assert!(
        (55..=60).contains(&due_in(&r)),
        "due in {} s ({})",
        due_in(&r),
        r.next_action_reason
    );
}

#[tokio::test]
async fn verifying_everything_refuses_a_pool_too_small_for_its_streams() {
    let db = TestDb::new().await;
    let small = Store::connect_with(&db.url, 3).await.unwrap();
    let e = small.verify_all().await.unwrap_err().to_string();
    assert!(e.contains("4 streams") && e.contains("holds 3"), "{e}");
    let enough = Store::connect_with(&db.url, 4).await.unwrap();
    assert!(enough.verify_all().await.unwrap().is_clean());
}

/// A URL parameter the driver does not know is refused, not ignored: `ssl_mode=verify-full`
/// connected without TLS checks, and the driver's log line for an unknown parameter printed its
/// value (a misspelt `pasword=`).
#[tokio::test]
async fn an_unknown_database_url_parameter_is_refused_without_its_value() {
    let db = TestDb::new().await;
    let with = |q: &str| {
        let sep = if db.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}{q}", db.url)
    };
    for (q, named) in [
        ("ssl_mode=verify-full", "ssl_mode"),
        ("sslMode=require", "sslMode"),
        ("pasword=hunter2-not-secret", "pasword"),
        // A value typed without its `=`: the "name" is not shown.
        ("password:hunter2-not-secret", "not shown"),
    ] {
        let Err(err) = Store::connect_with(&with(q), 1).await else {
            panic!("{q} was taken");
        };
        let err = err.to_string();
        assert!(err.contains(named), "{q}: {err}");
        assert!(!err.contains("hunter2"), "{q}: {err}");
    }
    let store = Store::connect_with(&with("sslmode=disable&application_name=probe"), 1)
        .await
        .unwrap();
    store.totals().await.unwrap();
}

/// A person may settle an unsettled create (adopt a job, declare none created, abandon it) only
/// while no worker holds the operation: a worker resending the create or looking the job up may
/// land a job after the decision, whose answer would be refused, and a retry of "not created" or
/// of the abandoned operation start a second one.
#[tokio::test]
async fn a_create_is_not_settled_by_a_person_while_a_worker_holds_it() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let c = submit_and_claim(&store, 1, "held").await.remove(0);
    let id = c.lease.operation_id;
    let unknown = Step {
        keep_lease: true,
        ..Step::event(Event::CreateAmbiguous {
            error_class: "timeout".into(),
        })
        .with_call(accepted_create("http://127.0.0.1:1/v1/jobs"))
    };
    store.apply(&c.lease, unknown).await.unwrap();
    let decisions = || {
        let d = || Decision::new("alice", "looked at the provider's console").unwrap();
        [
            Step::event(Event::DeclareNotCreated { decision: d() }),
            Step::event(Event::AdoptRemoteJob {
                decision: d(),
                remote_job_id: "job_seen".into(),
            }),
            Step::event(Event::Abandon { decision: d() }),
        ]
    };
    for step in decisions() {
        let e = store
            .decide(id, State::CreateUnknown, None, step)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::Conflict(m) if m.contains("holds")),
            "{e:?}"
        );
    }
    let op = store.get(id).await.unwrap();
    assert_eq!(
        (op.state, op.history_seq),
        (State::CreateUnknown, 2),
        "nothing written"
    );
    // Once the worker gives the lease back, the person decides.
    store
        .release(&c.lease, Duration::ZERO, "test")
        .await
        .unwrap();
    let [declare, ..] = decisions();
    let applied = store
        .decide(id, State::CreateUnknown, None, declare)
        .await
        .unwrap();
    assert_eq!(applied.record.state, State::NotCreated);
}

/// A write waits a bounded time for a lock another session holds (a psql left in `BEGIN; SELECT …
/// FOR UPDATE`, a stalled process): a person's decision fails as unavailable, naming why, instead
/// of hanging; once the row is free it goes through.
#[tokio::test]
async fn a_decision_behind_a_row_held_elsewhere_fails_in_bounded_time() {
    use sqlx::Connection;
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = store
        .submit_new(&submission("{}"), &providers(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    // A lock a row lock waits behind. (Held by a table lock, which takes no transaction id: a row
    // lock would, and an open transaction id held for 10 s stops HOT pruning for the other tests
    // of this binary, measured in `claims_and_progress_steps_are_hot_updates…`.)
    sqlx::raw_sql("BEGIN; LOCK TABLE operations IN EXCLUSIVE MODE")
        .execute(&mut holder)
        .await
        .unwrap();
    let abandon = || {
        Step::event(Event::Abandon {
            decision: Decision::new("alice", "duplicate order").unwrap(),
        })
    };
    let t0 = std::time::Instant::now();
    let e = tokio::time::timeout(
        Duration::from_secs(30),
        store.decide(op.id, State::CreatePending, None, abandon()),
    )
    .await
    .expect("the decision gave up on its own")
    .unwrap_err();
    assert!(
        matches!(&e, StoreError::Unavailable(m) if m.contains("another database session")),
        "{e:?}"
    );
    assert!(t0.elapsed() >= Duration::from_secs(9), "{:?}", t0.elapsed());
    assert_eq!(
        store.get(op.id).await.unwrap().history_seq,
        1,
        "nothing written"
    );
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .unwrap();
    let applied = store
        .decide(op.id, State::CreatePending, None, abandon())
        .await
        .unwrap();
    assert_eq!(applied.record.state, State::Abandoned);
}

/// One remote job is never two operations': a provider that answers two operations' creates with
/// the same job (it dedupes by body; a caching proxy) would hand the second caller the first's
/// result and let it cancel the first's job. The second is held as a contract violation that keeps
/// the job as the conflicting answer, with its create call logged; the first is untouched. Both
/// write paths: one step at a time, and a group commit naming the job twice in one batch.
#[tokio::test]
async fn a_job_another_operation_holds_is_never_taken_by_a_second() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let accepted = |job: &str| {
        Step::event(Event::CreateAccepted {
            remote_job_id: job.into(),
            remote_state: None,
        })
        .with_call(accepted_create("http://127.0.0.1:1/v1/jobs"))
    };
    let claimed = submit_and_claim(&store, 4, "shared").await;
    let (a, b) = (&claimed[0].lease, &claimed[1].lease);
    store.apply(a, accepted("j-shared")).await.unwrap();
    let held = store.apply(b, accepted("j-shared")).await.unwrap();
    assert_eq!(held.record.state, State::ContractViolation);
    assert_eq!(held.record.remote_job_id, None, "never taken as its job");
    assert_eq!(
        held.record.conflicting_remote_job_id.as_deref(),
        Some("j-shared")
    );
    let link = store.history(b.operation_id).await.unwrap().pop().unwrap();
    assert_eq!(
        link.detail["held_by"],
        a.operation_id.to_string(),
        "names the holder for operators"
    );
    assert!(
        !link.cause.contains(&a.operation_id.to_string())
            && !held
                .record
                .escalation_reason
                .as_deref()
                .unwrap_or_default()
                .contains(&a.operation_id.to_string()),
        "never to the operation's own caller (the holder may be another's): {}",
        link.cause
    );
    assert_eq!(
        store.calls(b.operation_id).await.unwrap().len(),
        1,
        "the create is logged"
    );
    let first = store.get(a.operation_id).await.unwrap();
    assert_eq!(first.state, State::Accepted);
    assert_eq!(first.remote_job_id.as_deref(), Some("j-shared"));
    // In one group commit: the first step takes the job, the second is held.
    let (c, d) = (claimed[2].lease.clone(), claimed[3].lease.clone());
    let results = store
        .apply_many(vec![
            (c.clone(), accepted("j-two")),
            (d.clone(), accepted("j-two")),
        ])
        .await;
    let states: Vec<State> = results
        .iter()
        .map(|r| r.as_ref().unwrap().record.state)
        .collect();
    assert_eq!(states, [State::Accepted, State::ContractViolation]);
    // A contract violation that would record, for an operation with no job yet, a job another
    // holds (a lookup listing others' jobs): held without taking it either.
    let mut more = Vec::new();
    for i in 0..8 {
        let mut s = submission(&format!(r#"{{"more":{i}}}"#));
        if i == 7 {
            s.caller = "agent-8".into();
        }
        let terms = providers();
        let op = store.submit_new(&s, &terms, SubmitLimits::default());
        more.push(op.await.unwrap().operation.id);
    }
    let due = store
        .claim_due("w", 10, Duration::from_secs(60))
        .await
        .unwrap();
    let lease = |id: OperationId| {
        let c = due.iter().find(|d| d.lease.operation_id == id).unwrap();
        c.lease.clone()
    };
    let violated = store
        .apply(
            &lease(more[0]),
            Step::event(Event::ContractViolated {
                recorded_job_id: "j-shared".into(),
                other_job_id: "j-other".into(),
            }),
        )
        .await
        .unwrap();
    assert_eq!(violated.record.remote_job_id, None);
    assert_eq!(violated.record.state, State::ContractViolation);
    // A finished operation's job may be named again (a resource the caller names, updated by a
    // later operation): taken.
    let first = lease(more[1]);
    let mut taking = accepted("j-resource");
    taking.keep_lease = true;
    store.apply(&first, taking).await.unwrap();
    let failed = Step::event(Event::RemoteFailed {
        remote_state: "failed".into(),
        reason: None,
    });
    let done = store.apply(&first, failed).await.unwrap();
    assert!(done.record.state.is_terminal(), "{:?}", done.record.state);
    let again = store
        .apply(&lease(more[2]), accepted("j-resource"))
        .await
        .unwrap();
    assert_eq!(again.record.state, State::Accepted);
    assert_eq!(again.record.remote_job_id.as_deref(), Some("j-resource"));
    // In a batch whose first step names no job, the second's job, held in the table, is found.
    let results = store
        .apply_many(vec![
            (lease(more[3]), Step::default()),
            (lease(more[4]), accepted("j-shared")),
        ])
        .await;
    let second = results[1].as_ref().unwrap();
    assert_eq!(second.record.state, State::ContractViolation);
    assert_eq!(second.record.remote_job_id, None);
    // An abandoned operation still holds its job (it may run on): not taken.
    let abandon = Step::event(Event::Abandon {
        decision: Decision::new("bob", "written off").unwrap(),
    });
    store
        .decide(more[2], State::Accepted, None, abandon)
        .await
        .unwrap();
    let after_abandon = store
        .apply(&lease(more[5]), accepted("j-resource"))
        .await
        .unwrap();
    assert_eq!(after_abandon.record.state, State::ContractViolation);
    // A finished operation's job never comes back to another caller's operation (it would read
    // the first caller's result).
    let first = lease(more[6]);
    let mut taking = accepted("j-done");
    taking.keep_lease = true;
    store.apply(&first, taking).await.unwrap();
    let done = store
        .apply(
            &first,
            Step::event(Event::RemoteFailed {
                remote_state: "failed".into(),
                reason: None,
            }),
        )
        .await
        .unwrap();
    assert!(done.record.state.is_terminal(), "{:?}", done.record.state);
    let other_caller = store
        .apply(&lease(more[7]), accepted("j-done"))
        .await
        .unwrap();
    assert_eq!(other_caller.record.caller, "agent-8");
    assert_eq!(other_caller.record.state, State::ContractViolation);
    assert_eq!(other_caller.record.remote_job_id, None);
    assert!(
        store.verify_all().await.unwrap().is_clean(),
        "the record replays"
    );
}

/// A status read that spent the last of the failure budget was judged in `observing`; a cancel
/// that landed while it was out, and was never sent, is sent first: the step is refused (its call
/// logged) instead of ending `cancellation_unconfirmed`, which says the provider was asked.
#[tokio::test]
async fn failed_reads_never_end_a_cancel_that_was_not_sent() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let claimed = submit_and_claim(&store, 1, "budget").await;
    accept_keeping_leases(&store, &claimed.iter().collect::<Vec<_>>()).await;
    let c = &claimed[0];
    store
        .request_cancel(
            c.lease.operation_id,
            CancelRequest::new("alice", "stop").unwrap(),
        )
        .await
        .unwrap();
    let failed_read = CallRecord {
        http_status: Some(503),
        outcome: "failed: http_503".into(),
        ..status_read("running")
    };
    let step = Step {
        call: Some(failed_read),
        decided_in: Some(State::Observing),
        ..Step::event(Event::RetryBudgetExhausted {
            error_class: "http_503".into(),
            failures: 8,
        })
    };
    let refused = store.apply(&c.lease, step).await.unwrap_err();
    assert!(matches!(refused, StoreError::Moved { .. }), "{refused:?}");
    let op = store.get(c.lease.operation_id).await.unwrap();
    assert_eq!(op.state, State::CancelRequested);
    assert_eq!(op.cancel_attempts, 0);
    let calls = store.calls(c.lease.operation_id).await.unwrap();
    assert_eq!(calls.last().unwrap().kind, "status", "the read is logged");
}

/// `migrate` with nothing to apply still checks what is applied: an older release's migration Job
/// run against a database a newer release migrated fails (before, it passed, and that release's
/// pods then refused to start), and one run again on a current database passes.
#[tokio::test]
async fn migrate_with_nothing_to_apply_still_refuses_a_database_it_does_not_know() {
    let db = TestDb::new().await;
    let store = db.store().await;
    store.migrate().await.unwrap();
    exec(
        &db,
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99991231000000, 'from the future', true, '\\x00', 0)",
    )
    .await
    .unwrap();
    let refused = store.migrate().await;
    assert!(
        matches!(refused, Err(StoreError::Migrate(_))),
        "{refused:?}"
    );
}
