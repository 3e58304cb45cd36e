//! # jobtrail-worker
//!
//! A pool of these processes drives every operation from intent to a truthful end. Each worker claims
//! due operations in batches (a lease with a fencing epoch), drives each one step at a time through its
//! provider, writes every outcome fenced by the lease, stores the next action time in the row, and
//! releases the lease. Nothing is held in memory that a restart would need: the schedule, the attempt
//! counts and the deadlines live in the row, so any worker can take over any operation whose lease
//! expired.
//!
//! A worker claims whenever a slot is free and work is due; a hanging call holds one slot, and each
//! provider gets its share of the slots (share.rs). With nothing to claim it sleeps until the
//! earliest moment something it could claim comes due, a notification on the database's work channel
//! (new submissions, cancel requests, decisions), or a slow backstop (`idle`); lost notifications
//! cost latency, never work. On shutdown a worker stops claiming, lets the steps in flight finish
//! (each writes all of itself or nothing), and gives back its leases. When its grace runs out, the
//! calls still in flight are abandoned and their steps written as failed calls that may have
//! reached the provider, so the call log keeps every call that left.

mod check_room;
mod drive;
pub mod fault;
mod metrics;
pub mod results;
mod share;
mod writer;

pub use check_room::default_check_bytes;
pub use drive::Driven;
pub use results::ResultStore;

use jobtrail_provider::Registry;
use jobtrail_provider::contract::Limits;
use jobtrail_store::{ClaimShare, Claimed, Lease, Store, StoreError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// A reading of the database clock and when (by this host's monotonic clock) it arrived.
type DbReading = (chrono::DateTime<chrono::Utc>, Instant);

/// The shortest sleep when something is due but this worker could not claim it (another claimer
/// holds the row, or the provider's fleet-wide cap is reached).
const NOT_CLAIMABLE_FLOOR: Duration = Duration::from_millis(50);

/// While the queue is deep, how long a claim may wait for more slots to free up so that one claim
/// (one transaction) fills several. A bound, not a threshold: slots held by slow calls delay a claim
/// by at most this, never stop it.
const CLAIM_GATHER: Duration = Duration::from_millis(20);

/// While every slot is busy, how often the loop still wakes to beat. A contract's call may run up to
/// an hour (`timeouts.request_ms`): a loop that only waited for a slot would fall silent for that
/// long, and `/livez` would have a healthy worker restarted mid-call.
const BUSY_BEAT: Duration = Duration::from_secs(1);

/// How long a stopping worker whose grace has run out waits for the steps of its abandoned calls
/// to be written, before it drops them.
const ABANDONED_WRITE_GRACE: Duration = Duration::from_secs(5);

/// Bound a database round trip (a claim, a lease extension, a release) by `within`
/// ([`WorkerConfig::db_answer_within`]). A connection whose server
/// went silent (a failover that took the old primary's address with it, a dropped route) never
/// fails by itself, as the driver sets no TCP keepalive; without a bound one lost answer would hold
/// the loop or a slot for ever. The abandoned connection fails the pool's bounded check on
/// release and is closed, not reused.
pub(crate) async fn answered_within<T>(
    within: Duration,
    round_trip: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(within, round_trip)
        .await
        .unwrap_or_else(|_| Err(StoreError::Unavailable(no_answer(within))))
}

/// Why a round trip was given up (see [`answered_within`]).
pub(crate) fn no_answer(within: Duration) -> String {
    format!(
        "no answer from the database within {:.1} s (a connection lost without a word: a failover, a dropped route); the connection is given up",
        within.as_secs_f64()
    )
}

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
    /// Longest sleep without a claim attempt (the backstop: due times and notifications wake a
    /// worker sooner).
    pub idle: Duration,
    /// How long shutdown waits for steps in flight before abandoning them.
    pub shutdown_grace: Duration,
    /// Most steps written per transaction (group commit); 1 writes each step on its own.
    pub write_batch: usize,
    /// The longest a database round trip may go unanswered before the worker gives it up (see
    /// [`answered_within`]): long enough for a slow but working database (lock waits, a group
    /// commit carrying large results), short enough that a server gone silent costs a minute.
    pub db_answer_within: Duration,
    /// Memory for results parsed to be checked, across the worker (see check_room.rs): a result
    /// whose parse would take more is held for a person, never parsed. Half as much (at least 1 MiB) is the
    /// room for results' bytes in flight, from fetch to written.
    pub check_bytes: u64,
    /// The longest the worker keeps an operation's lease alive while one of its results is
    /// checked and kept (a check that outlasts the lease is normal for a large result; one that
    /// never ends, on a result directory whose fsync hangs, say, must not pin the operation).
    /// Past it the lease is left to lapse: the next holder counts this one lost, and the third
    /// lost in a row holds the operation for a person (`result_stalled`).
    pub check_within: Duration,
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
            idle: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(20),
            write_batch: 64,
            db_answer_within: Duration::from_secs(60),
            check_bytes: check_room::default_check_bytes(),
            check_within: Duration::from_secs(600),
        }
    }

    /// The longest silence of a live service loop's heartbeat: an idle wait, a step's whole
    /// lease, a minute of margin (claims retried while the database is away back off for at
    /// most 5 s and still beat), and the three round trips a pass may wait on while the database
    /// says nothing (listen, then the throttles' seeding or the claim, then the next due time),
    /// each given up after `db_answer_within`. Without them, a stalled database and a long
    /// `--db-answer-within` made the probe fail a loop that was only waiting as told, and the
    /// restart turned the creates in flight into ambiguous ones.
    pub fn silence_limit(&self) -> Duration {
        self.idle + self.lease + Duration::from_secs(60) + self.db_answer_within * 3
    }
}

/// The work channel, read all the time by a task of its own. Read only while the loop slept, a
/// busy worker (every slot taken, a deep queue) left its notifications unread for as long as it
/// was busy: once the socket's buffers filled, the server's session behind the listener blocked on
/// its write and stopped reading PostgreSQL's notification queue, which every session of the
/// cluster shares and which can then only grow (to its 8 GB, when every `NOTIFY`, a submit's too,
/// fails). Notifications that arrive while the loop works are one wake, not one each.
struct Listening {
    woken: Arc<tokio::sync::Notify>,
    state: Arc<ListenState>,
    reader: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct ListenState {
    lost: AtomicBool,
}

impl Listening {
    /// `db_clock`: the database's clock as the last claim read it (pinned to its answer: pinned to
    /// its sending, the wait for a pooled connection would count as lag), against which a notification's
    /// lag is measured when it arrives (here, not when the worker next looks: a worker busy with
    /// every slot looks seconds later, and that is not the notification's lag).
    fn start(mut l: jobtrail_store::WorkListener, db_clock: Arc<Mutex<Option<DbReading>>>) -> Self {
        let woken = Arc::new(tokio::sync::Notify::new());
        let state = Arc::new(ListenState::default());
        let (w, st) = (woken.clone(), state.clone());
        let reader = tokio::spawn(async move {
            loop {
                match l.wait().await {
                    Some(sent) => {
                        if let (Some(sent), Some((db, at))) =
                            (sent, *db_clock.lock().expect("lock"))
                        {
                            let now =
                                db + chrono::Duration::from_std(at.elapsed()).unwrap_or_default();
                            metrics::notified((now - sent).to_std().unwrap_or_default());
                        }
                    }
                    None => {
                        st.lost.store(true, Ordering::SeqCst);
                        w.notify_one();
                        return;
                    }
                }
                w.notify_one();
            }
        });
        Self {
            woken,
            state,
            reader,
        }
    }

    /// The connection broke: listen again.
    fn lost(&self) -> bool {
        self.state.lost.load(Ordering::SeqCst)
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.reader.abort();
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
    check_room: Arc<check_room::CheckRoom>,
    /// Results' bytes in flight (half the check room; see check_room.rs).
    bytes_room: Arc<check_room::CheckRoom>,
    config: WorkerConfig,
    stats: Arc<Stats>,
    active: Arc<Mutex<HashMap<jobtrail_core::OperationId, Lease>>>,
    writer: writer::Writer,
    /// The providers this worker has contracts for (the only ones it claims), with their limits.
    providers: Arc<Vec<(String, Limits)>>,
    /// Steps in flight on this worker, by provider.
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
    /// The earliest moment an operation this worker just left waiting comes due again, and a
    /// wake-up for the service loop when it is set (so an idle loop need not ask the database).
    own_due: Arc<Mutex<Option<Instant>>>,
    step_done: Arc<tokio::sync::Notify>,
    /// The database clock at the last claim that returned rows, and when its answer arrived: the
    /// reference for notification lag (never compared with this host's wall clock).
    db_clock: Arc<Mutex<Option<DbReading>>>,
    /// When the service loop last went round (for the liveness probe).
    heartbeat: Arc<Heartbeat>,
}

/// A step's task has ended: a panic (a bug) is logged and counted; the step's slot and its place
/// in `active` went back as it unwound (see `Slot`).
fn step_ended(done: Option<Result<(), tokio::task::JoinError>>) {
    if let Some(Err(e)) = done
        && e.is_panic()
    {
        tracing::error!("a step panicked: {e}");
        metrics::step_panicked();
    }
}

/// One step's hold on a worker slot, its provider's count and its place in `active`: given back
/// when dropped, also when the step panics or is aborted. (The shutdown takes the leases of the
/// steps it aborts from `active` first, to give them back. A panicked step's lease is not given
/// back: it runs out, and the operation's next step waits that long, as after a crash, instead of
/// panicking again at once.)
struct Slot {
    worker: Worker,
    /// In `active` under this id, for this lease epoch, until [`Slot::leave_active`].
    operation: Option<(jobtrail_core::OperationId, i64)>,
    provider: String,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Slot {
    /// The operation is no longer driven here: out of `active` and the in-flight gauge. Only its
    /// own entry: a step that outlived its lease (a write waiting on a stalled database) may end
    /// after this worker claimed the operation again, and that later step's entry stays.
    fn leave_active(&mut self) {
        let Some((id, epoch)) = self.operation.take() else {
            return;
        };
        let mut active = self.worker.active.lock().unwrap_or_else(|p| p.into_inner());
        if active.get(&id).is_some_and(|l| l.epoch == epoch) {
            active.remove(&id);
        }
        metrics::in_flight(active.len());
    }
}

impl Slot {
    /// Give the slot and the provider's count back (once: dropping the slot afterwards does
    /// nothing more).
    fn release(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        if let Some(n) = self
            .worker
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&self.provider)
        {
            *n = n.saturating_sub(1);
        }
        drop(permit);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // A step that panicked ends here: nothing else takes it out of `active` (the gauge would
        // count it in flight until the worker stopped).
        self.leave_active();
        self.release();
    }
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
        let writer = writer::Writer::start(
            store.clone(),
            1,
            config.write_batch.max(1),
            config.db_answer_within,
        );
        let providers = Arc::new(
            registry
                .names()
                .filter_map(|n| Some((n.to_owned(), registry.get(n)?.contract().limits)))
                .collect(),
        );
        Self {
            writer,
            providers,
            in_flight: Arc::default(),
            own_due: Arc::default(),
            step_done: Arc::default(),
            store,
            registry: Arc::new(registry),
            results: Arc::new(results),
            check_room: Arc::new(check_room::CheckRoom::new(config.check_bytes)),
            bytes_room: Arc::new(check_room::CheckRoom::new(config.check_bytes / 2)),
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

    /// The service loop's heartbeat (see [`WorkerConfig::silence_limit`]).
    pub fn heartbeat(&self) -> Arc<Heartbeat> {
        self.heartbeat.clone()
    }

    /// Drive one claimed operation (all its immediate steps). `sent`: when the claim was sent (the
    /// lease is measured from then, so this worker never believes it holds it longer than the
    /// database does); `answered`: when the claim's answer arrived (the decision clock starts then).
    async fn drive_one(
        &self,
        // Boxed, as the record is in `drive`: an async fn keeps its arguments twice (as captured
        // and as moved in), and every in-flight operation's task holds this future.
        c: Box<Claimed>,
        (sent, answered): (Instant, Instant),
        (shutdown, abandon): (CancellationToken, CancellationToken),
    ) -> Driven {
        let Some(provider) = self.registry.get(&c.operation.provider).cloned() else {
            // The claim filters by the providers this worker loaded, so this needs a registry
            // changed under a running worker; give the operation back to whoever can drive it.
            tracing::error!(operation = %c.operation.id, provider = %c.operation.provider, "no contract for this provider; giving it back");
            let _ = Box::pin(answered_within(
                self.config.db_answer_within,
                self.store
                    .release_unsent(&c.lease, Duration::ZERO, "provider not configured here"),
            ))
            .await;
            return Driven::default();
        };
        let span = tracing::info_span!(
            "operation",
            operation = %c.operation.id,
            trace_id = %c.operation.trace_id,
            provider = %c.operation.provider,
        );
        let mut ctx = drive::Ctx {
            store: &self.store,
            writer: &self.writer,
            policy: provider.contract().policy(),
            provider: provider.as_ref(),
            results: &self.results,
            check_room: &self.check_room,
            bytes_room: &self.bytes_room,
            holding: None,
            lease: c.lease.clone(),
            ttl: self.config.lease,
            answer_within: self.config.db_answer_within,
            check_within: self.config.check_within,
            expires: sent + self.config.lease,
            clock: drive::DbClock {
                at: c.db_now,
                since: answered,
            },
            shutdown,
            abandon,
        };
        tracing::Instrument::instrument(drive::drive(&mut ctx, c.operation), span).await
    }

    /// Claim up to `limit` due operations of the providers this worker has contracts for, each
    /// within its share of `free` slots.
    async fn claim(
        &self,
        (limit, free): (i64, i64),
        shares: &[ClaimShare],
    ) -> Result<(Vec<Claimed>, (Instant, Instant)), StoreError> {
        let sent = Instant::now();
        let claimed = answered_within(
            self.config.db_answer_within,
            self.store
                .claim_shares(&self.config.id, (limit, free), self.config.lease, shares),
        )
        .await?;
        let answered = Instant::now();
        metrics::claimed(answered - sent, &claimed);
        if let Some(c) = claimed.first() {
            *self.db_clock.lock().expect("lock") = Some((c.db_now, answered));
        }
        Ok((claimed, (sent, answered)))
    }

    /// This claim's shares of `free` slots.
    fn shares(&self, free: usize) -> Vec<ClaimShare> {
        let in_flight = self.in_flight.lock().expect("lock");
        share::shares(self.config.concurrency, free, &in_flight, &self.providers)
    }

    /// Fleet-wide token buckets for the providers with a call rate (full when new).
    async fn seed_throttles(&self) -> Result<(), StoreError> {
        for (name, limits) in self.providers.iter() {
            if let Some(rate) = limits.rate {
                answered_within(
                    self.config.db_answer_within,
                    self.store.seed_throttle(name, rate.burst),
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Claim one batch and drive every claimed operation to its next wait. Returns what was done.
    /// (Tests and benchmarks call this; [`Worker::run`] is the service loop.)
    pub async fn run_once(&self) -> Result<StatsSnapshot, StoreError> {
        let before = self.stats.snapshot();
        self.seed_throttles().await?;
        let shares = self.shares(self.config.batch as usize);
        let batch = self.config.batch;
        let (claimed, times) = self.claim((batch, batch), &shares).await?;
        self.stats
            .claimed
            .fetch_add(claimed.len() as u64, Ordering::Relaxed);
        let never = CancellationToken::new();
        let driven = futures::future::join_all(
            claimed
                .into_iter()
                .map(|c| self.drive_one(Box::new(c), times, (never.clone(), never.clone()))),
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

    /// Drive one claimed operation in a task of its own, holding one slot.
    async fn spawn(
        &self,
        tasks: &mut tokio::task::JoinSet<()>,
        permits: &Arc<tokio::sync::Semaphore>,
        c: Claimed,
        times: (Instant, Instant),
        stop: (CancellationToken, CancellationToken),
    ) {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore open");
        let provider = c.operation.provider.clone();
        {
            let mut active = self.active.lock().expect("lock");
            active.insert(c.lease.operation_id, c.lease.clone());
            metrics::in_flight(active.len());
        }
        *self
            .in_flight
            .lock()
            .expect("lock")
            .entry(provider.clone())
            .or_default() += 1;
        // Whatever happens to the step (a panic included), its slot and its counts go back. The
        // slot's worker is the task's only one (a `Worker` is 200 bytes, held by every task).
        let mut slot = Slot {
            worker: self.clone(),
            operation: Some((c.lease.operation_id, c.lease.epoch)),
            provider,
            permit: Some(permit),
        };
        let c = Box::new(c);
        tasks.spawn(async move {
            let d = slot.worker.drive_one(c, times, stop).await;
            slot.worker.stats.add(d);
            slot.leave_active();
            slot.release();
            if let Some(due) = d.due_in {
                let at = Instant::now() + due;
                let mut own = slot.worker.own_due.lock().expect("lock");
                *own = Some(own.map_or(at, |o| o.min(at)));
                slot.worker.step_done.notify_one();
            }
        });
    }

    /// The service loop, until `shutdown` is cancelled. Survives the database going away.
    pub async fn run(&self, shutdown: CancellationToken) -> StatsSnapshot {
        self.run_until(shutdown, CancellationToken::new()).await
    }

    /// [`Worker::run`], and `hurry` (a second signal: a person who asks twice) ends the shutdown
    /// grace at once: the calls still in flight are abandoned and recorded, as when it runs out.
    pub async fn run_until(
        &self,
        shutdown: CancellationToken,
        hurry: CancellationToken,
    ) -> StatsSnapshot {
        let permits = Arc::new(tokio::sync::Semaphore::new(self.config.concurrency.max(1)));
        let mut tasks = tokio::task::JoinSet::new();
        let abandon = CancellationToken::new();
        let mut listener: Option<Listening> = None;
        let mut backoff = Duration::from_millis(100);
        let mut seeded = false;
        // The last claim took all it asked for, or all a provider's share allowed and a step of it
        // has since finished: the queue is deep, and the next claim gathers freed slots first.
        let mut deep = false;
        // Steps finished (slots freed) since the last claim.
        let mut freed = 0usize;
        tracing::info!(worker = %self.config.id, "worker started");
        loop {
            self.heartbeat.beat();
            if shutdown.is_cancelled() {
                break;
            }
            while let Some(done) = tasks.try_join_next() {
                freed += 1;
                step_ended(Some(done));
            }
            if listener.as_ref().is_some_and(Listening::lost) {
                listener = None;
            }
            if listener.is_none() {
                listener = answered_within(self.config.db_answer_within, self.store.listen())
                    .await
                    .ok()
                    .map(|l| Listening::start(l, self.db_clock.clone()));
            }
            if permits.available_permits() == 0 {
                // Every slot is busy: the next claim waits for one to free up.
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    done = tasks.join_next() => {
                        freed += 1;
                        step_ended(done);
                    }
                    _ = tokio::time::sleep(BUSY_BEAT) => {}
                }
                continue;
            }
            if deep {
                // A deep queue: let a quarter of a claim's worth of steps finish (under load they
                // end every moment) before claiming, for at most CLAIM_GATHER. One claim then fills
                // many slots instead of one transaction per freed slot (claims of one row each
                // halved end-to-end throughput); a slot held by a slow call delays the next claim
                // by at most the bound. Counted as steps finished, not slots free: slots kept in
                // reserve for providers with nothing due are always free.
                let enough =
                    (self.config.batch.min(self.config.concurrency as i64) / 4).max(1) as usize;
                let until = tokio::time::Instant::now() + CLAIM_GATHER;
                while freed < enough && !tasks.is_empty() {
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        done = tasks.join_next() => {
                            freed += 1;
                            step_ended(done);
                        }
                        _ = tokio::time::sleep_until(until) => break,
                    }
                }
                if shutdown.is_cancelled() {
                    break;
                }
            }
            let claimed = async {
                if !seeded {
                    self.seed_throttles().await?;
                }
                let free = permits.available_permits();
                let want = (free as i64).min(self.config.batch);
                // Shares of this claim, not of every free slot: a provider's cap is also how many
                // rows its scan locks (unchosen ones are released only at commit, each lock a write).
                let shares = self.shares(want as usize);
                self.claim((want, free as i64), &shares)
                    .await
                    .map(|(c, times)| (c, times, (want, free as i64), shares))
            }
            .await;
            let (claimed, times, (want, free), shares) = match claimed {
                Ok(c) => c,
                Err(e) => {
                    metrics::claim_failed();
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "claim failed; the database may be away");
                    listener = None;
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            seeded = true;
            backoff = Duration::from_millis(100);
            freed = 0;
            let got = claimed.len() as i64;
            self.stats.claimed.fetch_add(got as u64, Ordering::Relaxed);
            let mut took: HashMap<String, i32> = HashMap::new();
            for c in claimed {
                *took.entry(c.operation.provider.clone()).or_default() += 1;
                self.spawn(
                    &mut tasks,
                    &permits,
                    c,
                    times,
                    (shutdown.clone(), abandon.clone()),
                )
                .await;
            }
            deep = got == want && want > 0;
            if deep {
                continue; // more may be due right now
            }
            // Nothing more this worker may take is due now. Sleep until the earliest moment something
            // it could claim comes due (or a paused provider may go again), a notification, a freed
            // slot of a provider held at its cap, or the backstop.
            let took_of = |s: &ClaimShare| took.get(&s.provider).copied().unwrap_or(0);
            // The free slots the reserves still keep from borrowers (see the claim's SQL): with
            // none left to borrow, a provider past its fair share is held as at a cap, until a
            // slot frees up. (Its due rows would otherwise bring the next claim round at once.)
            let owed: i64 = shares
                .iter()
                .map(|s| i64::from((s.reserve - took_of(s)).max(0)))
                .sum();
            let none_to_borrow = free - got - owed <= 0;
            let held = |s: &ClaimShare| {
                s.cap == 0 || took_of(s) == s.cap || (none_to_borrow && took_of(s) >= s.fair)
            };
            let at_cap = shares.iter().any(held);
            let open: Vec<String> = shares
                .iter()
                .filter(|s| !held(s))
                .map(|s| s.provider.clone())
                .collect();
            let backstop = if listener.is_some() {
                self.config.idle
            } else {
                self.config.idle.min(Duration::from_secs(1))
            };
            let sleep = if open.is_empty() {
                backstop
            } else {
                match answered_within(self.config.db_answer_within, self.store.next_due(&open))
                    .await
                {
                    // Due now yet not claimed: another claimer holds it, or the fleet cap; look again
                    // soon, not at once (later while a fleet-wide cap may be what holds it).
                    Ok(Some(d)) => {
                        let floor = if shares.iter().any(|s| s.fleet_cap.is_some()) {
                            NOT_CLAIMABLE_FLOOR * 5
                        } else {
                            NOT_CLAIMABLE_FLOOR
                        };
                        d.max(floor).min(backstop)
                    }
                    Ok(None) => backstop,
                    Err(_) => backstop.min(Duration::from_secs(1)),
                }
            };
            let mut until = Instant::now() + sleep;
            loop {
                // An operation this worker just left waiting may come due before anything the
                // database said: wake for it, without asking again.
                if let Some(at) = self.own_due.lock().expect("lock").take() {
                    until = until.min(at);
                }
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep_until(until.into()) => break,
                    _ = self.step_done.notified() => continue,
                    () = async { match &listener { Some(l) => l.woken.notified().await, None => std::future::pending().await } } => break,
                    // A provider held at its share or cap got a slot back: claim again, and since
                    // its queue may be deep, gather first.
                    done = tasks.join_next(), if at_cap && !tasks.is_empty() => {
                        freed += 1;
                        step_ended(done);
                        deep = true;
                        break;
                    }
                }
            }
        }
        tracing::info!(worker = %self.config.id, in_flight = tasks.len(), "stopping: no new claims; finishing steps in flight");
        let gave_back = !tasks.is_empty();
        let mut aborted: Vec<Lease> = Vec::new();
        let grace = tokio::time::sleep(self.config.shutdown_grace);
        tokio::pin!(grace);
        let mut hurried = false;
        while !tasks.is_empty() {
            tokio::select! {
                _ = hurry.cancelled(), if !hurried && !abandon.is_cancelled() => {
                    hurried = true;
                    tracing::warn!(in_flight = tasks.len(), "asked again: the grace period ends now");
                    grace.as_mut().reset(tokio::time::Instant::now());
                }
                _ = &mut grace => {
                    if !abandon.is_cancelled() {
                        // The calls still in flight end now as abandoned, and their steps are
                        // written (the call log keeps every call that may have reached a
                        // provider); a step whose write cannot finish soon is dropped with
                        // nothing half-written.
                        tracing::warn!(in_flight = tasks.len(), "grace period over; abandoning the calls in flight and recording them");
                        abandon.cancel();
                        grace.as_mut().reset(tokio::time::Instant::now() + ABANDONED_WRITE_GRACE);
                        continue;
                    }
                    tracing::warn!(abandoned = tasks.len(), "steps still unwritten; dropping them (nothing half-written)");
                    // Their slots leave `active` as they drop: their leases are given back below.
                    aborted.extend(self.active.lock().expect("lock").values().cloned());
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    break;
                }
                done = tasks.join_next() => step_ended(done),
            }
        }
        let leftover: Vec<Lease> = self
            .active
            .lock()
            .expect("lock")
            .drain()
            .map(|(_, l)| l)
            .chain(aborted)
            .collect();
        let gave_back = gave_back || !leftover.is_empty();
        // At once, each bounded: one after another, a stalled database would hold the exit for
        // as many answer limits as there are leases.
        futures::future::join_all(leftover.iter().map(|lease| {
            answered_within(
                self.config.db_answer_within,
                self.store.release(lease, Duration::ZERO, "worker shutdown"),
            )
        }))
        .await;
        // What this worker gave back is due at once: the others take it now, not at their next
        // look (up to --idle away). Best effort: their backstop finds it either way.
        if gave_back
            && let Err(e) = answered_within(
                self.config.db_answer_within,
                self.store.wake_workers("released"),
            )
            .await
        {
            tracing::warn!(error = %e, "could not wake the other workers for the operations given back");
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The liveness probe waits out what one pass of a live loop may wait on while the database
    /// says nothing: three round trips, each given up after `db_answer_within`, and the idle wait.
    #[test]
    fn the_probe_waits_out_a_pass_against_a_silent_database() {
        let mut c = WorkerConfig::named_default();
        for within in [1, 60, 300] {
            c.db_answer_within = Duration::from_secs(within);
            let pass = c.db_answer_within * 3 + c.idle;
            assert!(c.silence_limit() > pass, "{within} s");
        }
    }
}
