//! # jobtrail-worker
//!
//! A pool of these processes drives every operation from intent to a truthful end. Each worker claims
//! due operations in batches (a lease with a fencing epoch), drives each one step at a time through its
//! provider, writes every outcome fenced by the lease, stores the next action time in the row, and
//! releases the lease. Nothing is held in memory that a restart would need: the schedule, the attempt
//! counts and the deadlines live in the row, so any worker can take over any operation whose lease
//! expired.
//!
//! Wake-ups come from LISTEN on the database's work channel (new submissions, cancel requests,
//! decisions) and from a short idle scan; lost notifications cost latency, never work. On shutdown a
//! worker stops claiming, lets the steps in flight finish (each writes all of itself or nothing), and
//! gives back its leases.

mod drive;
pub mod fault;
mod metrics;
pub mod results;
mod writer;

pub use drive::Driven;
pub use results::ResultStore;

use jobtrail_provider::Registry;
use jobtrail_store::{Claimed, Lease, Store, StoreError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// A reading of the database clock and when (by this host's monotonic clock) it arrived.
type DbReading = (chrono::DateTime<chrono::Utc>, Instant);

/// Worker settings (validated by the binary).
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Lease owner name; unique per process.
    pub id: String,
    /// Operations claimed per claim transaction.
    pub batch: i64,
    /// Operations driven at once.
    pub concurrency: usize,
    /// Lease time-to-live. A dead worker's operations are taken over after this.
    pub lease: Duration,
    /// Longest wait between scans when no notification arrives.
    pub idle: Duration,
    /// How long shutdown waits for steps in flight before abandoning them.
    pub shutdown_grace: Duration,
    /// Most steps written per transaction (group commit); 1 writes each step on its own.
    pub write_batch: usize,
}

impl WorkerConfig {
    /// `HOSTNAME-PID` (the pod name on Kubernetes) with sane defaults.
    pub fn named_default() -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "worker".into());
        Self {
            id: format!("{host}-{}", std::process::id()),
            batch: 32,
            concurrency: 64,
            lease: Duration::from_secs(30),
            idle: Duration::from_millis(250),
            shutdown_grace: Duration::from_secs(20),
            write_batch: 64,
        }
    }
}

/// Counters of what a worker did.
#[derive(Debug, Default)]
pub struct Stats {
    pub claimed: AtomicU64,
    pub events: AtomicU64,
    pub calls: AtomicU64,
    pub leases_lost: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatsSnapshot {
    pub claimed: u64,
    pub events: u64,
    pub calls: u64,
    pub leases_lost: u64,
}

impl Stats {
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            claimed: self.claimed.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
            calls: self.calls.load(Ordering::Relaxed),
            leases_lost: self.leases_lost.load(Ordering::Relaxed),
        }
    }
    fn add(&self, d: Driven) {
        self.events.fetch_add(d.events as u64, Ordering::Relaxed);
        self.calls.fetch_add(d.calls as u64, Ordering::Relaxed);
        if d.lease_lost {
            self.leases_lost.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One worker.
#[derive(Clone)]
pub struct Worker {
    store: Store,
    registry: Arc<Registry>,
    results: Arc<ResultStore>,
    config: WorkerConfig,
    stats: Arc<Stats>,
    active: Arc<Mutex<HashMap<jobtrail_core::OperationId, Lease>>>,
    writer: writer::Writer,
    /// The providers this worker has contracts for: the only ones it claims.
    providers: Arc<Vec<String>>,
    /// The database clock at the last claim that returned rows, and when its answer arrived: the
    /// reference for notification lag (never compared with this host's wall clock).
    db_clock: Arc<Mutex<Option<DbReading>>>,
    /// When the service loop last went round (for the liveness probe).
    heartbeat: Arc<Heartbeat>,
}

/// When a loop last went round, by the monotonic clock.
#[derive(Debug)]
pub struct Heartbeat {
    start: Instant,
    last_ms: AtomicU64,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
}

impl Heartbeat {
    fn beat(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }
    /// How long since the last beat.
    pub fn silence(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

impl Worker {
    pub fn new(
        store: Store,
        registry: Registry,
        results: ResultStore,
        config: WorkerConfig,
    ) -> Self {
        // One writer lane: while a batch is being written the next one queues up, so batches form by
        // themselves; up to `write_batch` steps per transaction (see writer.rs).
        metrics::describe();
        let writer = writer::Writer::start(store.clone(), 1, config.write_batch.max(1));
        let providers = Arc::new(registry.names().map(str::to_owned).collect());
        Self {
            writer,
            providers,
            store,
            registry: Arc::new(registry),
            results: Arc::new(results),
            config,
            stats: Arc::default(),
            active: Arc::default(),
            db_clock: Arc::default(),
            heartbeat: Arc::default(),
        }
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    pub fn id(&self) -> &str {
        &self.config.id
    }

    /// The service loop's heartbeat, and the longest silence a live loop can have: an idle wait,
    /// a step's whole lease, and a minute of margin (claims retried while the database is away
    /// back off for at most 5 s and still beat).
    pub fn heartbeat(&self) -> (Arc<Heartbeat>, Duration) {
        (
            self.heartbeat.clone(),
            self.config.idle + self.config.lease + Duration::from_secs(60),
        )
    }

    /// Drive one claimed operation (all its immediate steps). `sent`: when the claim was sent (the
    /// lease is measured from then, so this worker never believes it holds it longer than the
    /// database does); `answered`: when the claim's answer arrived (the decision clock starts then).
    async fn drive_one(
        &self,
        c: Claimed,
        (sent, answered): (Instant, Instant),
        shutdown: CancellationToken,
    ) -> Driven {
        let Some(provider) = self.registry.get(&c.operation.provider).cloned() else {
            // The claim filters by the providers this worker loaded, so this needs a registry
            // changed under a running worker; give the operation back to whoever can drive it.
            tracing::error!(operation = %c.operation.id, provider = %c.operation.provider, "no contract for this provider; giving it back");
            let _ = self
                .store
                .release(&c.lease, chrono::Utc::now(), "provider not configured here")
                .await;
            return Driven::default();
        };
        let span = tracing::info_span!(
            "operation",
            operation = %c.operation.id,
            trace_id = %c.operation.trace_id,
            provider = %c.operation.provider,
        );
        let ctx = drive::Ctx {
            store: &self.store,
            writer: &self.writer,
            policy: provider.contract().policy(),
            provider: provider.as_ref(),
            results: &self.results,
            lease: c.lease.clone(),
            ttl: self.config.lease,
            expires: sent + self.config.lease,
            clock: drive::DbClock {
                at: c.db_now,
                since: answered,
            },
            shutdown,
        };
        tracing::Instrument::instrument(drive::drive(ctx, c.operation), span).await
    }

    /// Claim up to `limit` due operations of the providers this worker has contracts for.
    async fn claim(&self, limit: i64) -> Result<(Vec<Claimed>, (Instant, Instant)), StoreError> {
        let sent = Instant::now();
        let claimed = self
            .store
            .claim_due_for(&self.config.id, limit, self.config.lease, &self.providers)
            .await?;
        let answered = Instant::now();
        metrics::claimed(answered - sent, &claimed);
        if let Some(c) = claimed.first() {
            *self.db_clock.lock().expect("lock") = Some((c.db_now, answered));
        }
        Ok((claimed, (sent, answered)))
    }

    /// Claim one batch and drive every claimed operation to its next wait. Returns what was done.
    /// (Tests and benchmarks call this; [`Worker::run`] is the service loop.)
    pub async fn run_once(&self) -> Result<StatsSnapshot, StoreError> {
        let before = self.stats.snapshot();
        let (claimed, times) = self.claim(self.config.batch).await?;
        self.stats
            .claimed
            .fetch_add(claimed.len() as u64, Ordering::Relaxed);
        let never = CancellationToken::new();
        let driven = futures::future::join_all(
            claimed
                .into_iter()
                .map(|c| self.drive_one(c, times, never.clone())),
        )
        .await;
        for d in driven {
            self.stats.add(d);
        }
        let after = self.stats.snapshot();
        Ok(StatsSnapshot {
            claimed: after.claimed - before.claimed,
            events: after.events - before.events,
            calls: after.calls - before.calls,
            leases_lost: after.leases_lost - before.leases_lost,
        })
    }

    /// The service loop, until `shutdown` is cancelled. Survives the database going away.
    pub async fn run(&self, shutdown: CancellationToken) -> StatsSnapshot {
        let permits = Arc::new(tokio::sync::Semaphore::new(self.config.concurrency.max(1)));
        let mut tasks = tokio::task::JoinSet::new();
        let mut listener: Option<jobtrail_store::WorkListener> = None;
        let mut backoff = Duration::from_millis(100);
        tracing::info!(worker = %self.config.id, "worker started");
        loop {
            self.heartbeat.beat();
            if shutdown.is_cancelled() {
                break;
            }
            while let Some(done) = tasks.try_join_next() {
                if let Err(e) = done
                    && e.is_panic()
                {
                    tracing::error!("a step panicked: {e}");
                }
            }
            if listener.is_none() {
                listener = self.store.listen().await.ok();
            }
            let free = permits.available_permits() as i64;
            let want = free.min(self.config.batch);
            // While steps are running and only a few slots are free, let more finish first: one claim
            // for many operations costs one commit, a claim per freed slot costs one each.
            let enough = (self.config.batch.min(self.config.concurrency as i64) / 2).max(1);
            if want < enough && !tasks.is_empty() {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tasks.join_next() => {}
                    _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
                continue;
            }
            let mut got = 0;
            if want > 0 {
                match self.claim(want).await {
                    Ok((claimed, times)) => {
                        backoff = Duration::from_millis(100);
                        got = claimed.len() as i64;
                        self.stats.claimed.fetch_add(got as u64, Ordering::Relaxed);
                        for c in claimed {
                            let permit = permits
                                .clone()
                                .acquire_owned()
                                .await
                                .expect("semaphore open");
                            {
                                let mut active = self.active.lock().expect("lock");
                                active.insert(c.lease.operation_id, c.lease.clone());
                                metrics::in_flight(active.len());
                            }
                            let me = self.clone();
                            let stop = shutdown.clone();
                            tasks.spawn(async move {
                                let id = c.lease.operation_id;
                                let d = me.drive_one(c, times, stop).await;
                                me.stats.add(d);
                                {
                                    let mut active = me.active.lock().expect("lock");
                                    active.remove(&id);
                                    metrics::in_flight(active.len());
                                }
                                drop(permit);
                            });
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "claim failed; the database may be away");
                        listener = None;
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
            if got == want && want > 0 {
                continue; // more may be due right now
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.config.idle) => {}
                woke = async { match &mut listener { Some(l) => l.wait().await, None => std::future::pending().await } } => {
                    match woke {
                        None => listener = None,
                        Some(sent) => {
                            if let (Some(sent), Some((db, at))) = (sent, *self.db_clock.lock().expect("lock")) {
                                let now = db + chrono::Duration::from_std(at.elapsed()).unwrap_or_default();
                                metrics::notified((now - sent).to_std().unwrap_or_default());
                            }
                        }
                    }
                }
                _ = tasks.join_next(), if !tasks.is_empty() && permits.available_permits() == 0 => {}
            }
        }
        tracing::info!(worker = %self.config.id, in_flight = tasks.len(), "stopping: no new claims; finishing steps in flight");
        let grace = tokio::time::sleep(self.config.shutdown_grace);
        tokio::pin!(grace);
        while !tasks.is_empty() {
            tokio::select! {
                _ = &mut grace => {
                    tracing::warn!(abandoned = tasks.len(), "grace period over; abandoning steps in flight (nothing half-written)");
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    break;
                }
                _ = tasks.join_next() => {}
            }
        }
        let leftover: Vec<Lease> = self
            .active
            .lock()
            .expect("lock")
            .drain()
            .map(|(_, l)| l)
            .collect();
        for lease in leftover {
            let _ = self
                .store
                .release(&lease, chrono::Utc::now(), "worker shutdown")
                .await;
        }
        let s = self.stats.snapshot();
        let (write_tx, steps) = self.writer.counts();
        tracing::info!(
            worker = %self.config.id, claimed = s.claimed, events = s.events, calls = s.calls,
            write_transactions = write_tx, steps_written = steps, "worker stopped"
        );
        s
    }
}
