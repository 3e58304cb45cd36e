//! Fenced writes under contention and faults, against a real PostgreSQL: rows another session
//! holds, a migration waiting behind a long reader, and a commit whose answer is lost on the way
//! back (through a proxy on 127.0.0.1). Its own
//! test binary: holding a row lock takes a transaction id, which would stop HOT pruning for the
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

/// Three operations submitted and claimed by worker "w".
async fn three_claimed(store: &Store) -> Vec<Claimed> {
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
    claimed
}

/// A row another session holds for long (a psql left in `BEGIN; SELECT … FOR UPDATE`) is waited
/// for at most a second by a worker's writes: in a group commit the other writes go through within
/// about two seconds and the held one is "try again" (never a lost lease, which would drop the
/// provider's answer); a lone write the same. Once the row is free, the write goes through.
#[tokio::test]
async fn a_row_held_elsewhere_holds_up_neither_the_batch_nor_the_writer() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let claimed = three_claimed(&store).await;
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
        matches!(&results[1], Err(e @ StoreError::Unavailable(_)) if e.is_transient()),
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

/// A statement outside any transaction of jobtrail's (a fleet pause, a call-rate take, a lease's
/// extension) waits at most 10 s for a lock a forgotten `psql` session holds, then fails as a write
/// to try again: never a worker's slot held for ever.
#[tokio::test]
async fn a_statement_outside_a_transaction_waits_for_a_lock_at_most_ten_seconds() {
    let db = TestDb::new().await;
    let store = db.store().await;
    store
        .pause_provider("sim", Duration::from_millis(1))
        .await
        .unwrap();
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT 1 FROM provider_throttles WHERE provider = 'sim' FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();
    let t0 = Instant::now();
    let paused = tokio::time::timeout(
        Duration::from_secs(30),
        store.pause_provider("sim", Duration::from_secs(1)),
    )
    .await
    .expect("the pause gave up on its own");
    assert!(matches!(&paused, Err(e) if e.is_transient()), "{paused:?}");
    assert!(
        (Duration::from_secs(9)..Duration::from_secs(20)).contains(&t0.elapsed()),
        "{:?}",
        t0.elapsed()
    );
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .unwrap();
    store
        .pause_provider("sim", Duration::from_secs(1))
        .await
        .unwrap();
}

/// A TCP proxy to PostgreSQL on 127.0.0.1 that, when armed, lets the next `COMMIT` through to the
/// server and then cuts the connection before its answer comes back: a commit whose
/// acknowledgement is lost (a dropped connection, a failover). Plain connections only
/// (`sslmode=disable`): it reads the protocol's message frames.
/// `between`: awaited after the server has committed and before the connection is cut (another
/// session's write landing in between).
/// `outage_ms`: for this long after a cut, new connections are closed at once (a failover).
async fn lossy_proxy(
    upstream: url::Url,
    between: Between,
    outage_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let armed = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let arm = armed.clone();
    let down_until: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            if down_until
                .lock()
                .unwrap()
                .is_some_and(|t| Instant::now() < t)
            {
                drop(client);
                continue;
            }
            let Ok(server) = connect(&upstream).await else {
                continue;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = tokio::io::split(server);
            let cut = Arc::new(AtomicBool::new(false));
            let back = {
                let cut = cut.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = sr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        // Cut: what the server answers is dropped, and the client is left
                        // waiting until the connection is closed.
                        if cut.load(Ordering::SeqCst) {
                            continue;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = cw.shutdown().await;
                })
            };
            let arm = arm.clone();
            let between = between.clone();
            let (down_until, outage_ms) = (down_until.clone(), outage_ms.clone());
            tokio::spawn(async move {
                // The startup message has no type byte; every later one does.
                let mut started = false;
                loop {
                    let mut head = vec![0u8; if started { 5 } else { 4 }];
                    if cr.read_exact(&mut head).await.is_err() {
                        break;
                    }
                    let len_at = head.len() - 4;
                    let len = u32::from_be_bytes(head[len_at..].try_into().unwrap()) as usize;
                    let mut body = vec![0u8; len.saturating_sub(4)];
                    if cr.read_exact(&mut body).await.is_err() {
                        break;
                    }
                    let commit = started
                        && head[0] == b'Q'
                        && body.to_ascii_uppercase().starts_with(b"COMMIT")
                        && arm.swap(false, Ordering::SeqCst);
                    if commit {
                        cut.store(true, Ordering::SeqCst);
                        let outage = Duration::from_millis(outage_ms.load(Ordering::SeqCst));
                        *down_until.lock().unwrap() = Some(Instant::now() + outage);
                    }
                    started = true;
                    if sw.write_all(&head).await.is_err() || sw.write_all(&body).await.is_err() {
                        break;
                    }
                    if commit {
                        // The server commits; its answer never reaches the client.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        if let Some(wait) = between.lock().await.take() {
                            let _ = tokio::time::timeout(Duration::from_secs(10), wait).await;
                        }
                        back.abort();
                        break;
                    }
                }
            });
        }
    });
    (addr, armed)
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// The server a test database URL names: its socket directory (`?host=/dir`), or host and port.
async fn connect(url: &url::Url) -> std::io::Result<Box<dyn Io>> {
    let port = url.port().unwrap_or(5432);
    let dir = url
        .query_pairs()
        .find(|(k, _)| k == "host")
        .map(|(_, v)| v.into_owned())
        .filter(|d| d.starts_with('/'));
    Ok(match dir {
        Some(dir) => {
            Box::new(tokio::net::UnixStream::connect(format!("{dir}/.s.PGSQL.{port}")).await?)
        }
        None => Box::new(
            tokio::net::TcpStream::connect((url.host_str().unwrap_or("127.0.0.1"), port)).await?,
        ),
    })
}

type Between = std::sync::Arc<tokio::sync::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>>;

/// A store connected to `db` through [`lossy_proxy`], its arming switch, its `between`, and its
/// outage after a cut (none unless set).
async fn through_lossy_proxy(
    db: &TestDb,
) -> (
    Store,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    Between,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    let url = url::Url::parse(&db.url).unwrap();
    let between: Between = std::sync::Arc::new(tokio::sync::Mutex::new(None));
    let outage = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (proxy, armed) = lossy_proxy(url.clone(), between.clone(), outage.clone()).await;
    let mut through = url.clone();
    through.set_host(Some("127.0.0.1")).unwrap();
    through.set_port(Some(proxy.port())).unwrap();
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != "host" && k != "sslmode")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    through.set_query(None);
    through
        .query_pairs_mut()
        .extend_pairs(kept)
        .append_pair("sslmode", "disable");
    (
        Store::connect(through.as_str()).await.unwrap(),
        armed,
        between,
        outage,
    )
}

/// A commit whose answer is lost in a failover longer than the check (new connections refused for
/// 7 s): whether it committed cannot be told, so it is answered as unknown, never as failed (the
/// writer would apply it again: a second `create_ambiguous`, a create counted twice), and a group
/// commit is not applied again write by write. The server did commit: each is written once.
#[tokio::test]
async fn a_lost_commit_that_cannot_be_checked_is_unknown_and_never_applied_again() {
    let db = TestDb::new().await;
    let direct = db.store().await;
    let (store, armed, _, outage) = through_lossy_proxy(&db).await;
    outage.store(7_000, std::sync::atomic::Ordering::SeqCst);
    let claimed = three_claimed(&direct).await;
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let results = store
        .apply_many(
            claimed[..2]
                .iter()
                .enumerate()
                .map(|(i, c)| (c.lease.clone(), accept(&format!("job_{i}"))))
                .collect(),
        )
        .await;
    assert!(
        !armed.load(std::sync::atomic::Ordering::SeqCst),
        "a commit was cut"
    );
    for (i, r) in results.iter().enumerate() {
        assert!(
            matches!(r, Err(StoreError::CommitUnknown(_))),
            "write {i}: {r:?}"
        );
        let id = claimed[i].lease.operation_id;
        let accepted = direct.history(id).await.unwrap();
        let accepted = accepted
            .iter()
            .filter(|h| h.event == "create_accepted")
            .count();
        assert_eq!(accepted, 1, "write {i} written once");
        assert_eq!(
            direct.calls(id).await.unwrap().len(),
            1,
            "write {i}'s call once"
        );
    }
}

/// A step that logs a call and writes no history link (the lookup a resend is cross-checked by,
/// logged first) is found committed by its call row when the commit's answer is lost: answered as
/// written, never applied again (the call would be refused as a duplicate, and the worker would
/// stop with the resend that followed unlogged).
#[tokio::test]
async fn a_lost_commit_of_a_call_without_a_link_is_found_by_its_call() {
    let db = TestDb::new().await;
    let direct = db.store().await;
    let (store, armed, _, _) = through_lossy_proxy(&db).await;
    let claimed = three_claimed(&direct).await;
    let lookup = CallRecord {
        kind: CallKind::Lookup,
        method: "GET".into(),
        http_status: Some(200),
        outcome: "found job_9".into(),
        ..accepted_create("http://127.0.0.1:1/v1/jobs?client_reference=x")
    };
    let step = Step {
        call: Some(lookup),
        keep_lease: true,
        ..Default::default()
    };
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let written = store.apply(&claimed[0].lease, step).await;
    assert!(
        !armed.load(std::sync::atomic::Ordering::SeqCst),
        "a commit was cut"
    );
    written.unwrap_or_else(|e| panic!("a committed write answered as failed: {e:?}"));
    let id = claimed[0].lease.operation_id;
    assert_eq!(direct.calls(id).await.unwrap().len(), 1, "logged once");
}

/// A commit whose acknowledgement is lost is found committed, by the history links each write
/// planned, and answered as written: never applied a second time (each step's call would be
/// refused as a duplicate, and the worker would stop on an operation that moved). Both for a
/// group commit and a lone write, and also when another write (a cancel request) landed on the
/// operation before the check.
#[tokio::test]
async fn a_commit_whose_answer_is_lost_is_known_committed_and_never_applied_twice() {
    let db = TestDb::new().await;
    let direct = db.store().await;
    let (store, armed, between, _) = through_lossy_proxy(&db).await;

    let claimed = three_claimed(&direct).await;

    // While the first commit's answer is held back, a cancel request lands on the first operation.
    let (go_on, wait) = tokio::sync::oneshot::channel();
    *between.lock().await = Some(wait);
    let cancelled = claimed[0].lease.operation_id;
    let canceller = {
        let direct = direct.clone();
        tokio::spawn(async move {
            for _ in 0..200 {
                if direct.get(cancelled).await.unwrap().state == State::Accepted {
                    direct
                        .request_cancel(
                            cancelled,
                            CancelRequest::new("alice", "changed my mind").unwrap(),
                        )
                        .await
                        .unwrap();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = go_on.send(());
        })
    };
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let results = store
        .apply_many(
            claimed[..2]
                .iter()
                .enumerate()
                .map(|(i, c)| (c.lease.clone(), accept(&format!("job_{i}"))))
                .collect(),
        )
        .await;
    assert!(
        !armed.load(std::sync::atomic::Ordering::SeqCst),
        "a commit was cut"
    );
    canceller.await.unwrap();
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let alone = store.apply(&claimed[2].lease, accept("job_2")).await;
    assert!(
        !armed.load(std::sync::atomic::Ordering::SeqCst),
        "a commit was cut"
    );
    for (i, r) in results.iter().chain([&alone]).enumerate() {
        let applied = r.as_ref().unwrap_or_else(|e| panic!("write {i}: {e:?}"));
        assert_eq!(applied.record.state, State::Accepted);
        let op = direct.get(claimed[i].lease.operation_id).await.unwrap();
        let accepted = direct
            .history(op.id)
            .await
            .unwrap()
            .iter()
            .filter(|h| h.event == "create_accepted")
            .count();
        assert_eq!(accepted, 1, "write {i} written once");
        let expected = if i == 0 {
            (State::CancelRequested, 3)
        } else {
            (State::Accepted, 2)
        };
        assert_eq!((op.state, op.history_seq), expected);
        assert_eq!(
            direct.calls(op.id).await.unwrap().len(),
            1,
            "its call logged once"
        );
    }
}

/// A migration that alters a table gives way while another session holds the table (a `pg_dump`,
/// an `audit verify --all`): its queued exclusive lock request would otherwise stop every read and
/// write of the table behind it until the holder finished. It waits at most 5 s at a time, lets
/// the queue through, tries again, and applies once the holder is gone.
#[tokio::test]
async fn a_migration_gives_way_to_a_long_reader_instead_of_stopping_every_writer() {
    use sqlx::SqlSafeStr as _;
    use sqlx::migrate::{Migration, MigrationType, Migrator};
    let db = TestDb::new().await;
    let store = db.store().await;
    let mut migrations = MIGRATOR.migrations.to_vec();
    migrations.push(Migration::new(
        99_991_231_000_000,
        "a column on history".into(),
        MigrationType::Simple,
        "ALTER TABLE operation_history ADD COLUMN note text".into_sql_str(),
        false,
    ));
    let migrator = Migrator {
        migrations: migrations.into(),
        ..Migrator::DEFAULT
    };
    let connect = async || {
        <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
            .await
            .unwrap()
    };
    // A dump's read of the table, for 14 s.
    let mut dump = connect().await;
    sqlx::raw_sql("BEGIN; LOCK TABLE operation_history IN ACCESS SHARE MODE")
        .execute(&mut dump)
        .await
        .unwrap();
    let migrating = tokio::spawn({
        let store = store.clone();
        async move { store.migrate_from(&migrator).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A reader arriving meanwhile is held at most one try's wait, not until the dump ends.
    let mut reader = connect().await;
    let began = std::time::Instant::now();
    let read = tokio::time::timeout(
        Duration::from_secs(30),
        sqlx::query("SELECT count(*) FROM operation_history").execute(&mut reader),
    )
    .await;
    let waited = began.elapsed();
    assert!(read.is_ok_and(|r| r.is_ok()));
    assert!(
        waited < Duration::from_secs(8),
        "the reader waited {waited:?} behind the migration's lock request"
    );
    tokio::time::sleep(Duration::from_secs(14).saturating_sub(began.elapsed())).await;
    if migrating.is_finished() {
        panic!("not applied while the dump reads: {:?}", migrating.await);
    }
    sqlx::raw_sql("COMMIT").execute(&mut dump).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), migrating)
        .await
        .expect("applied once the dump is done")
        .unwrap()
        .unwrap();
    sqlx::query("SELECT note FROM operation_history LIMIT 1")
        .execute(&mut reader)
        .await
        .unwrap();
}
