//! The I/O shell around `jobtrail_core::decide`, one claimed operation at a time: ask the core what
//! to do, make at most one provider call (two for a cross-checked resend), keep result bytes, ask the
//! core which step the answer means, write it fenced by the lease. Work that is due at once (the
//! first poll after an accepted create, collecting after remote success) continues under the same
//! lease without a new claim.
//!
//! Nothing here decides a state: every decision is a pure function of the locked record, the closed
//! outcome, the database clock and a random draw (see the core's `decide` module and its table
//! tests). What lives here is I/O: the lease (extended before a call that could outlive it, and
//! checked again by the adapter immediately before the bytes leave), the result store, the call log's
//! evidence bundle, and retrying a write while the database is away.
//!
//! Every database wait here is boxed (`Box::pin(..).await`): a store future is kilobytes (sqlx's
//! pool acquire alone is ~14 KB) and an async fn is as large as its largest await, so one unboxed
//! write would size every in-flight operation's task for it, though a task spends its life waiting
//! on the provider. `jobtrail bench`'s `rss` phase measures what a call in flight costs.

use crate::answered_within;
use crate::check_room::{CheckRoom, Room, keep_only};
use crate::fault;
use crate::metrics;
use crate::results::{ReadError, ResultStore};
use chrono::{DateTime, Utc};
use jobtrail_core::decide::{
    self, Action, AfterLookup, Call, Collected, LEASE_MARGIN, Plan, Policy,
};
use jobtrail_core::{EventKind, SendMark};
use jobtrail_provider::*;
use jobtrail_store::{Lease, OperationRecord, Step, Store, StoreError};
use opentelemetry::trace::TraceContextExt as _;
use std::time::{Duration, Instant};

/// The longest a step waits in its slot for the provider's call rate; longer, it gives the slot
/// back and comes due again when the rate allows.
const ADMIT_IN_PLACE: Duration = Duration::from_millis(250);

/// The longest one `429` stops the provider's calls fleet-wide (the operation told to wait waits
/// its whole `Retry-After`).
const FLEET_PAUSE_MOST: Duration = Duration::from_secs(60);

/// How a drive ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Driven {
    /// History links written (transitions and observations).
    pub events: u32,
    /// Provider calls made.
    pub calls: u32,
    pub lease_lost: bool,
    /// When the operation comes due again, if this worker left it waiting (its worker loop then
    /// knows when to look again without asking the database).
    pub due_in: Option<Duration>,
}

/// The database's clock, carried forward by this process's monotonic clock from the moment the
/// claim's answer arrived (so it runs at most one claim round trip behind the database, never ahead).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DbClock {
    pub at: DateTime<Utc>,
    pub since: Instant,
}

impl DbClock {
    pub fn now(&self) -> DateTime<Utc> {
        self.at + chrono::Duration::from_std(self.since.elapsed()).unwrap_or_default()
    }
}

pub(crate) struct Ctx<'a> {
    pub store: &'a Store,
    pub writer: &'a crate::writer::Writer,
    pub provider: &'a dyn Provider,
    pub policy: Policy,
    pub results: &'a ResultStore,
    /// The worker's memory for parsed results being checked.
    pub check_room: &'a CheckRoom,
    /// The worker's memory for results' bytes in flight.
    pub bytes_room: &'a CheckRoom,
    /// This operation's share of `bytes_room`, from before its result is fetched (or read back)
    /// until the step carrying it is written, or for as long as a call reads an answer that may
    /// carry the result ([`Ctx::bytes_room_for`]).
    pub holding: Option<tokio::sync::SemaphorePermit<'a>>,
    pub lease: Lease,
    pub ttl: Duration,
    /// How long a database round trip may go unanswered ([`crate::answered_within`]).
    pub answer_within: Duration,
    /// The longest a result's check and keeping is covered by lease extensions
    /// ([`Ctx::keeping_lease`]).
    pub check_within: Duration,
    /// When the lease ends by our monotonic clock, measured from before the claim (or extension)
    /// was sent: never later than the database's expiry.
    pub expires: Instant,
    pub clock: DbClock,
    /// Set when the worker is stopping: finish the step in flight, start no new call.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Set when the worker's shutdown grace has run out: a call still in flight ends as abandoned
    /// (it may have reached the provider) and its step is written like any failed call's, so the
    /// call log keeps it.
    pub abandon: tokio_util::sync::CancellationToken,
}

fn draw() -> f64 {
    rand::random::<f64>()
}

/// Why the operation cannot go on: stop driving it (nothing half-written).
enum Stop {
    LeaseLost,
    Other(StoreError),
}

impl Ctx<'_> {
    /// Make sure the lease outlives a call that may take `need`; extend it in the database if not.
    /// A worker that cannot extend stops acting on the operation before it calls anyone.
    async fn ensure_lease(&mut self, need: Duration) -> Result<(), Stop> {
        if self.expires.saturating_duration_since(Instant::now()) > need + LEASE_MARGIN / 4 {
            return Ok(());
        }
        let ttl = self.ttl.max(need + LEASE_MARGIN);
        let sent = Instant::now();
        match Box::pin(answered_within(
            self.answer_within,
            self.store.extend_lease(&self.lease, ttl),
        ))
        .await
        {
            Ok(_) => {
                self.expires = sent + ttl;
                Ok(())
            }
            Err(StoreError::LeaseLost { .. }) => Err(Stop::LeaseLost),
            Err(e) => Err(Stop::Other(e)),
        }
    }

    /// Take `calls` from the provider's fleet-wide call rate (contract `limits.rate_per_sec`).
    /// Waits a little in place when the bucket refills soon; otherwise returns how long until it
    /// does, and the operation gives its slot back for that long. Bounded: a few tries.
    async fn admit(&mut self, calls: u32) -> Result<Option<Duration>, Stop> {
        let Some(rate) = self.provider.contract().limits.rate else {
            return Ok(None);
        };
        let name = &self.provider.contract().name;
        for _ in 0..4 {
            let wait = match Box::pin(answered_within(
                self.answer_within,
                self.store.take_calls(name, rate.per_sec, rate.burst, calls),
            ))
            .await
            {
                Ok(None) => return Ok(None),
                Ok(Some(wait)) => wait,
                // The database is away: send nothing, give the slot back, look again soon (the
                // deferral clears a create's "may have been sent" mark; it stays unsent).
                Err(e) => {
                    tracing::warn!(provider = %name, error = %e, "could not take from the provider's call rate; deferring the call");
                    return Ok(Some(ADMIT_IN_PLACE * 4));
                }
            };
            metrics::throttled(name, "rate");
            if wait > ADMIT_IN_PLACE || self.shutdown.is_cancelled() {
                // Spread the fleet's retries over a fifth of the wait.
                return Ok(Some(wait.mul_f64(1.0 + 0.2 * draw())));
            }
            tokio::time::sleep(wait).await;
        }
        Ok(Some(ADMIT_IN_PLACE))
    }

    /// The provider answered `429` with `Retry-After`: the whole fleet waits, not only this
    /// operation (every worker's claim skips the provider until then). Best effort: the operation's
    /// own schedule honours the wait either way.
    async fn throttled(&self, call: &jobtrail_core::CallRecord, delay: Option<Duration>) {
        self.pause_fleet(self.fleet_wait(call, delay)).await
    }

    /// How long a `429` with `Retry-After` stops the fleet, if it does: only one from the
    /// provider's own (credentialed) origins, whose limits are the fleet's. Object storage a result
    /// is downloaded from limits per object: one operation's download told to wait must not stop
    /// the others' calls again each time it comes due.
    fn fleet_wait(
        &self,
        call: &jobtrail_core::CallRecord,
        delay: Option<Duration>,
    ) -> Option<Duration> {
        fleet_pause(self.provider.contract(), &call.url, call.http_status, delay)
    }

    /// Stop the fleet's calls to the provider for `wait` (see [`Ctx::throttled`]).
    async fn pause_fleet(&self, wait: Option<Duration>) {
        let Some(wait) = wait else {
            return;
        };
        let name = &self.provider.contract().name;
        metrics::throttled(name, "429");
        if let Err(e) = Box::pin(answered_within(
            self.answer_within,
            self.store.pause_provider(name, wait),
        ))
        .await
        {
            tracing::warn!(provider = %name, error = %e, "could not pause the provider fleet-wide");
        }
    }

    fn call_budget(&self) -> Duration {
        self.provider.contract().call_budget()
    }

    /// A call's circumstances: the adapter refuses to send one that could outlive our lease.
    fn at(&self, attempt: i32) -> CallCtx {
        CallCtx {
            attempt,
            end_by: Some(self.expires),
            clock: Some((self.clock.at, self.clock.since)),
            abandon: Some(self.abandon.clone()),
        }
    }

    /// Write a step, retrying while the database is away (bounded by our lease).
    async fn write(&mut self, step: &Step) -> Result<jobtrail_store::Applied, Stop> {
        let mut delay = Duration::from_millis(100);
        loop {
            match self.writer.apply(&self.lease, step.clone()).await {
                Ok(a) => return Ok(a),
                Err(StoreError::LeaseLost { .. }) => return Err(Stop::LeaseLost),
                Err(e) if e.is_transient() && Instant::now() + delay < self.expires => {
                    tracing::warn!(operation = %self.lease.operation_id, error = %e, "the write could not be applied now (database unavailable, or the row held by another session); retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(Stop::Other(e)),
            }
        }
    }

    /// The most of the result room `call` may hold: a result's bytes fetched or read back (the
    /// most its contract lets it be), or an answer that may carry the result (a status answer
    /// where the result is the final status, a create answer that may be the finished job), read
    /// to the result's limit. `None` for answers held to the contract's `max_response_bytes`,
    /// which every call in flight may hold.
    fn bytes_room_for(&self, call: &Call, op: &OperationRecord) -> Option<u64> {
        let contract = self.provider.contract();
        let beyond_answers = |limit: u64| Some(limit).filter(|&l| l > contract.max_response_bytes);
        match call {
            Call::FetchResult { .. } | Call::SyncResult { .. } => Some(
                contract
                    .result
                    .as_ref()
                    .map_or(0, |r| r.for_request(&op.request_body).max_bytes),
            ),
            Call::Status { .. } | Call::FinalGet { .. } => {
                beyond_answers(contract.status_read_limit())
            }
            // A lookup may resend the create under the same lease.
            Call::Create { .. } | Call::Resend { .. } | Call::Lookup { .. } => {
                beyond_answers(contract.create_read_limit())
            }
            Call::Cancel { .. } | Call::NoResult => None,
        }
    }

    /// Room for `most` bytes of the result room (see [`Ctx::bytes_room_for`]). Waited for up to
    /// [`BYTES_ROOM_WAIT`], under a lease extended to cover the wait (the call's own budget is
    /// made sure of after it); `false` when none came in time.
    async fn take_bytes_room(&mut self, most: u64) -> Result<bool, Stop> {
        Box::pin(self.ensure_lease(BYTES_ROOM_WAIT)).await?;
        let left = self
            .expires
            .saturating_duration_since(Instant::now())
            .saturating_sub(LEASE_MARGIN / 4)
            .min(BYTES_ROOM_WAIT);
        let room = self.bytes_room;
        let taken = tokio::select! {
            room = tokio::time::timeout(left, room.take_bytes(most)) => room.ok().flatten(),
            () = self.abandon.cancelled() => None,
        };
        self.holding = taken;
        Ok(self.holding.is_some())
    }

    /// Keep result bytes (the database store only computes their digest; a directory makes them
    /// durable now).
    async fn keep(&self, op: &OperationRecord, r: &FetchedResult) -> Result<decide::Kept, String> {
        self.results
            .keep(op.id, r.bytes.clone(), r.content_type.clone())
            .await
            .map_err(|e| e.to_string())
    }

    /// Check fetched bytes against the contract and keep them (valid ones as the result, invalid
    /// ones for inspection).
    async fn collected(&self, op: &OperationRecord, fetched: FetchedResult) -> Collected {
        self.keeping_lease(self.check_and_keep(op, fetched)).await
    }

    /// Run `work` with the lease kept alive beside it. Measuring and checking a large result takes
    /// a thread for as long as it takes (and waits for one of the turns first), which can outlast
    /// the lease: the next worker would take the operation over and count this one as a holder
    /// lost, and a result whose checks outlast the lease each time would be held for a person as
    /// `result_stalled` though nothing is wrong with it. The keeper runs on another runtime thread
    /// from shortly before the lease would run short (a check done by then costs nothing), and
    /// each extension reaches past the lease this worker counts on (`expires`), so the database's
    /// expiry is never earlier than it. It stops when the lease is lost (the step's fenced write
    /// then says so), with `work`, however that ends (a panic included), and once one part of
    /// the work (measuring, checking, keeping: [`CheckPart`]) has run `check_within`: work that
    /// never ends (a result directory whose fsync hangs) must not keep the operation from every
    /// other worker, and a person, for good. Waits for a turn do not count (a queue of large
    /// results is no fault). The lease then lapses; the next holder counts this one lost (three in
    /// a row: `result_stalled`, held for a person), and this worker's step, if the work ever ends,
    /// is refused as a lost lease's.
    async fn keeping_lease<T>(&self, work: impl std::future::Future<Output = T>) -> T {
        let (store, lease, within) = (self.store.clone(), self.lease.clone(), self.answer_within);
        let check_within = self.check_within;
        let part = CheckPart::new();
        let watched = part.clone();
        let ttl = self.ttl + LEASE_MARGIN;
        let every = (ttl / 3).max(Duration::from_millis(100));
        let first = tokio::time::Instant::from_std(
            self.expires
                .checked_sub(LEASE_MARGIN)
                .unwrap_or(self.expires),
        );
        let _keeper = AbortOnDrop(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(first, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if watched.running_for().is_some_and(|d| d >= check_within) {
                    tracing::error!(
                        operation = %lease.operation_id,
                        check_within = ?check_within,
                        "checking and keeping a result has taken longer than --check-within: its lease is left to lapse, so another worker takes the operation over (the third holder lost in a row holds it for a person as result_stalled)"
                    );
                    return;
                }
                match answered_within(within, store.extend_lease(&lease, ttl)).await {
                    Ok(_) => {}
                    Err(StoreError::LeaseLost { .. }) => return,
                    // The database is away for now: try again at the next tick.
                    Err(e) => {
                        tracing::warn!(operation = %lease.operation_id, error = %e, "could not extend the lease while checking a result; trying again");
                    }
                }
            }
        }));
        CHECK_PART.scope(part, work).await
    }

    async fn check_and_keep(&self, op: &OperationRecord, fetched: FetchedResult) -> Collected {
        // Where a worker dies of a result too large for its memory (the drills kill it here).
        fault::point("result_fetched");
        let size = fetched.bytes.len();
        // Room for its parse, held until the check is done (see check_room.rs).
        let room = if self.provider.result_is_json(op) {
            let need = off_runtime(size, || self.check_room.measure(&fetched.bytes)).await;
            // Waited for within the lease, or the next holder would count this one as lost.
            let left = self
                .expires
                .saturating_duration_since(Instant::now())
                .saturating_sub(LEASE_MARGIN);
            let taken = tokio::select! {
                room = tokio::time::timeout(left, self.check_room.take(need)) => room.ok(),
                () = self.abandon.cancelled() => None,
            };
            match taken {
                Some(Room::Taken(room)) => room,
                // Kept for inspection, and for whoever takes the result some other way.
                Some(Room::Beyond) => {
                    return Collected::BeyondCheckMemory {
                        room: self.check_room.bytes(),
                        kept: self.keep(op, &fetched).await.ok(),
                    };
                }
                None => {
                    return Collected::RetryLater {
                        delay: Some(ROOM_FULL_RETRY),
                        reason: "the worker's room for checking results stayed full until its lease ran short".into(),
                    };
                }
            }
        } else {
            None
        };
        let checked = off_runtime(size, || {
            // Where a check runs long (the drills slow it here).
            fault::point("result_checking");
            self.provider.check_result(op, &fetched)
        })
        .await;
        drop(room);
        CheckPart::started();
        let kept = self.keep(op, &fetched).await;
        Collected::from_fetched(&fetched, checked, kept)
    }
}

/// A task stopped when its handle is dropped (tokio's own handle lets it run on).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// When a result that found no room to be checked (or fetched) in time is fetched again.
const ROOM_FULL_RETRY: Duration = Duration::from_secs(5);

/// The longest a result's fetch waits for room for its bytes (in the room's fair queue) before
/// it is put off.
const BYTES_ROOM_WAIT: Duration = Duration::from_secs(20);

/// Large results a worker measures or checks at once: each takes a thread handed over from the
/// runtime for as long as it takes. (The memory their parsed trees take is the check room's to
/// bound, check_room.rs.)
pub(crate) const LARGE_CHECKS: usize = 2;

static LARGE_CHECKING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(LARGE_CHECKS);

/// Checking a result (digest, parse, schema, secret search) costs CPU and memory in proportion to
/// its size: a large one waits for one of [`LARGE_CHECKS`] turns, then is checked with this runtime
/// thread handed over to the others first (`block_in_place`), so the calls and steps of every other
/// operation on the worker go on.
async fn off_runtime<T>(size: usize, check: impl FnOnce() -> T) -> T {
    if size < crate::results::BLOCKING_BYTES {
        return check();
    }
    // The semaphore is never closed: a failed acquire cannot happen, and would only skip the bound.
    CheckPart::waiting();
    let _turn = LARGE_CHECKING.acquire().await.ok();
    CheckPart::started();
    jobtrail_provider::wire::sized_work(size, check)
}

tokio::task_local! {
    /// The part of a result's check under way where [`Ctx::keeping_lease`] keeps the lease.
    static CHECK_PART: CheckPart;
}

/// When the part of a result's check under way started (milliseconds since the process's first
/// check), or [`CheckPart::WAITING`] while it waits for a turn: the keeper lets the lease lapse
/// once one part has run `--check-within`, not counting the waits.
#[derive(Clone)]
struct CheckPart(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl CheckPart {
    const WAITING: u64 = u64::MAX;

    fn now() -> u64 {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let ms = START.get_or_init(Instant::now).elapsed().as_millis();
        u64::try_from(ms).unwrap_or(Self::WAITING - 1)
    }

    fn new() -> Self {
        Self(std::sync::Arc::new(std::sync::atomic::AtomicU64::new(
            Self::now(),
        )))
    }

    fn set(at: u64) {
        // Outside a kept lease (a check run without one) there is nothing to tell.
        let _ = CHECK_PART.try_with(|p| p.0.store(at, std::sync::atomic::Ordering::Relaxed));
    }

    /// A part of the work starts now.
    fn started() {
        Self::set(Self::now());
    }

    /// The work waits for a turn (does not count) until the next [`CheckPart::started`].
    fn waiting() {
        Self::set(Self::WAITING);
    }

    /// How long the part under way has run; `None` while it waits for a turn.
    fn running_for(&self) -> Option<Duration> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            Self::WAITING => None,
            since => Some(Duration::from_millis(Self::now().saturating_sub(since))),
        }
    }
}

/// Drive one claimed operation until it needs to wait (or is done, or the lease is lost).
///
/// `ctx` is borrowed, not moved: an async fn keeps a by-value argument twice (captured and moved
/// in), and this future lives as long as the operation's call is in flight.
/// How soon an operation whose step could not be planned (the database away mid-plan) is due again.
const PLAN_RETRY: Duration = Duration::from_secs(2);

pub(crate) async fn drive(ctx: &mut Ctx<'_>, mut op: Box<OperationRecord>) -> Driven {
    let mut out = Driven::default();
    // Where a drill stops a worker between its claim and the operation's first call.
    fault::point("claimed");
    for _ in 0..6 {
        // Stopping: no new call, the first included (an operation claimed as the signal came).
        // Every call of an earlier round is recorded by its step, so nothing is in flight.
        if ctx.shutdown.is_cancelled() {
            let _ = Box::pin(answered_within(
                ctx.answer_within,
                ctx.store
                    .release_unsent(&ctx.lease, Duration::ZERO, "worker shutdown"),
            ))
            .await;
            return out;
        }
        // The step's span, under the operation's trace; provider calls made while planning are
        // its children (their span ids are the `traceparent` the provider receives).
        let step_cx = step_context(&op);
        let planned =
            opentelemetry::context::FutureExt::with_context(plan(ctx, &op), step_cx.clone()).await;
        let mut plan = match planned {
            Ok(p) => p,
            Err(Stop::LeaseLost) => {
                metrics::lease_lost();
                out.lease_lost = true;
                return out;
            }
            Err(Stop::Other(e)) => {
                tracing::error!(operation = %op.id, error = %e, "could not plan a step");
                // Nothing was written, nor sent (a plan fails only before its call): the lease goes
                // back (fenced, best effort), so the operation is tried again in a few seconds
                // rather than when a lease stretched for a long call runs out, and a create is
                // sent then, not taken as sent and unanswered.
                let _ = Box::pin(answered_within(
                    ctx.answer_within,
                    ctx.store
                        .release_unsent(&ctx.lease, PLAN_RETRY, "could not plan a step"),
                ))
                .await;
                return out;
            }
        };
        // What the store needs to tell a step decided before a cancel landed from one decided
        // for it.
        for step in plan.first.iter_mut().chain(std::iter::once(&mut plan.step)) {
            step.decided_in = Some(op.state);
        }
        // By reference: a step is 776 bytes, and one held here across its write would size the
        // task of every operation in flight for it.
        for (i, step) in plan.steps().enumerate() {
            // The steps after this one, whose calls are logged if it is not written.
            let rest = || plan.steps().skip(i + 1);
            if let Some(call) = &step.call {
                out.calls += 1;
                metrics::call(&op.provider, call);
            }
            let kind = step.event.as_ref().map(|e| e.kind());
            let written = Box::pin(ctx.write(step)).await;
            metrics::step(
                kind,
                match &written {
                    Ok(_) => "written",
                    Err(Stop::LeaseLost) => "lease_lost",
                    Err(Stop::Other(StoreError::Illegal { .. } | StoreError::Moved { .. })) => {
                        "dropped"
                    }
                    Err(Stop::Other(_)) => "failed",
                },
            );
            match written {
                Ok(applied) => {
                    if let Some(k) = kind {
                        out.events += 1;
                        step_cx.span().set_attribute(opentelemetry::KeyValue::new(
                            "jobtrail.event",
                            k.as_str(),
                        ));
                    }
                    let ended = applied.record.state;
                    // Terminal states are final: the root span is exported once.
                    if ended != op.state && ended.is_terminal() {
                        jobtrail_provider::spans::record_operation(
                            op.id,
                            op.trace_id,
                            op.parent_span,
                            jobtrail_provider::spans::operation_sampled(
                                op.id,
                                op.trace_id,
                                op.parent_span,
                                op.parent_sampled,
                            ),
                            op.created_at.into(),
                            ended.as_str(),
                            &op.provider,
                        );
                    }
                    match kind {
                        Some(EventKind::CreateAccepted) => fault::point("after_create_accepted"),
                        // A synchronous answer's result kept, not yet read back and checked.
                        Some(EventKind::CreateCompleted) => fault::point("after_create_completed"),
                        _ => {}
                    }
                    // The database's clock read again: the next call (continuing under this lease)
                    // is dated after the link just written, whatever the claim's own lag.
                    ctx.clock = DbClock {
                        at: applied.at.max(ctx.clock.now()),
                        since: Instant::now(),
                    };
                    *op = applied.record;
                }
                Err(Stop::LeaseLost) => {
                    tracing::info!(operation = %op.id, "lease lost; the write was refused and this worker stops acting on it");
                    metrics::lease_lost();
                    Box::pin(log_unwritten_calls(ctx, &op.provider, rest())).await;
                    out.lease_lost = true;
                    return out;
                }
                Err(Stop::Other(e @ (StoreError::Illegal { .. } | StoreError::Moved { .. }))) => {
                    tracing::info!(operation = %op.id, error = %e, "a decision landed meanwhile; the step was dropped (its call is logged)");
                    Box::pin(log_unwritten_calls(ctx, &op.provider, rest())).await;
                    // Give the lease back, due at once, if the state moved under us (a cancel
                    // request keeps the lease): the operation must not wait out a lease extended
                    // for a long call. (A person's decision already took it.) A step refused in
                    // the state it was decided for is a fault, not a race: the lease runs out
                    // instead, so it is not retried in a loop.
                    let moved = match &e {
                        StoreError::Illegal { source, .. } => source.from != op.state,
                        StoreError::Moved { state, .. } => *state != op.state,
                        _ => false,
                    };
                    if moved {
                        let _ = Box::pin(answered_within(
                            ctx.answer_within,
                            ctx.store
                                .release(&ctx.lease, Duration::ZERO, "moved meanwhile"),
                        ))
                        .await;
                        out.due_in = Some(Duration::ZERO);
                    }
                    return out;
                }
                Err(Stop::Other(e)) => {
                    tracing::error!(operation = %op.id, error = %e, "could not write a step");
                    // Its own call too: no write logged it (the database away past the lease,
                    // or a commit whose answer was lost; logged again after a commit that
                    // landed, it is refused: the call's id is its key).
                    if let Some(call) = &step.call {
                        let maybe_logged = matches!(e, StoreError::CommitUnknown(_));
                        Box::pin(log_call(ctx, call, step.retry_after, maybe_logged)).await;
                    }
                    Box::pin(log_unwritten_calls(ctx, &op.provider, rest())).await;
                    return out;
                }
            }
        }
        // The result's bytes this step carried are written: their room goes back.
        ctx.holding = None;
        if !plan.go_on || !op.state.is_automated() || op.lease_owner.is_none() {
            if op.state.is_automated() && op.lease_owner.is_none() {
                out.due_in = Some(
                    (op.next_action_at - ctx.clock.now())
                        .to_std()
                        .unwrap_or_default(),
                );
            }
            return out;
        }
    }
    // Too many immediate steps in a row: give the lease back, due at once.
    let _ = Box::pin(answered_within(
        ctx.answer_within,
        ctx.store.release(&ctx.lease, Duration::ZERO, "continue"),
    ))
    .await;
    out.due_in = Some(Duration::ZERO);
    out
}

/// The calls of a plan's steps after one that was not written (refused: the lease gone, the state
/// moved; or failed: the database away past the lease): they were made (a lookup's resend may have
/// started a job), so they go into the call log as a refused step's own call does, and into the
/// call metrics as every call made does. Best effort, each bounded: the database may be away still.
async fn log_unwritten_calls<'s>(
    ctx: &Ctx<'_>,
    provider: &str,
    rest: impl Iterator<Item = &'s Step>,
) {
    for step in rest {
        let Some(call) = &step.call else { continue };
        metrics::call(provider, call);
        log_call(ctx, call, step.retry_after, false).await;
    }
}

/// Log a call whose step was not written into the operation's call chain (best effort, bounded).
/// `maybe_logged`: its step's commit may have landed with it (its answer lost), and then this
/// one is refused (the call's id is its key): no alarm.
async fn log_call(
    ctx: &Ctx<'_>,
    call: &jobtrail_core::CallRecord,
    retry_after: Option<Duration>,
    maybe_logged: bool,
) {
    match answered_within(
        ctx.answer_within,
        ctx.store.log_refused_call(&ctx.lease, call, retry_after),
    )
    .await
    {
        Ok(()) => {}
        Err(e) if maybe_logged => {
            tracing::info!(operation = %ctx.lease.operation_id, call = %call.id, error = %e, "a call was not logged again: its step's commit may have logged it");
        }
        Err(e) => {
            tracing::error!(operation = %ctx.lease.operation_id, call = %call.id, error = %e, "a call that was made could not be logged");
        }
    }
}

/// A span for one step of `op`, child of the operation's root span.
fn step_context(op: &OperationRecord) -> opentelemetry::Context {
    use opentelemetry::trace::{TraceContextExt as _, Tracer as _};
    let tracer = jobtrail_provider::spans::tracer();
    let sampled = jobtrail_provider::spans::operation_sampled(
        op.id,
        op.trace_id,
        op.parent_span,
        op.parent_sampled,
    );
    let parent = jobtrail_provider::spans::operation_context(op.id, op.trace_id, sampled);
    let span = tracer
        .span_builder(format!("step {}", op.state.as_str()))
        .with_attributes([
            opentelemetry::KeyValue::new("jobtrail.operation.id", op.id.to_string()),
            opentelemetry::KeyValue::new("jobtrail.provider", op.provider.clone()),
            opentelemetry::KeyValue::new("jobtrail.state", op.state.as_str()),
        ])
        .start_with_context(&tracer, &parent);
    parent.with_span(span)
}

/// Ask the core what to do, do the I/O it names, and ask the core what the answer means.
///
/// Each call's I/O is an async fn of its own, boxed where it is awaited: a coroutine holds room
/// for all of its arms at once (rustc overlaps their locals poorly: the single `match` this was
/// made 2.6 KB), and every in-flight operation's task carries it, though it waits in one arm.
async fn plan(ctx: &mut Ctx<'_>, op: &OperationRecord) -> Result<Box<Plan>, Stop> {
    let call = match decide::next(op, &ctx.policy, ctx.lease.epoch, ctx.clock.now()) {
        Action::Write(mut plan) => {
            if plan.evidence_bundle {
                // The database is away: no bundle missing its calls goes into the record for
                // ever; the step is tried again once it answers.
                let bundle = Box::pin(answered_within(
                    ctx.answer_within,
                    evidence_bundle(ctx.store, op),
                ))
                .await
                .map_err(Stop::Other)?;
                plan.step.detail = Some(bundle);
            }
            return Ok(plan);
        }
        Action::Call(call) => call,
    };
    // A cross-checked resend is two calls under one lease.
    let calls = match call {
        Call::Lookup { .. } => 2,
        Call::SyncResult { .. } | Call::NoResult => 0,
        _ => 1,
    };
    // A result's bytes are held from its fetch until its step is written (see check_room.rs), and
    // an answer that may be the result is held to the result's limit while it is read: a hostile
    // provider dripping the most its contract allows into every poll in flight would otherwise
    // hold that many times over, kill the worker, and then each worker that claimed the same
    // operations. Their room is taken first: a call put off for want of it spends none of the
    // call rate.
    if let Some(most) = ctx.bytes_room_for(&call, op)
        && !Box::pin(ctx.take_bytes_room(most)).await?
    {
        return Ok(Box::new(decide::deferred_for(
            &call,
            ROOM_FULL_RETRY,
            "the worker's room for results' bytes stayed full",
        )));
    }
    // A room won late in its wait may have left little of the lease for the rate's round trip.
    if ctx.holding.is_some() {
        Box::pin(ctx.ensure_lease(ctx.call_budget() * calls.max(1))).await?;
    }
    if calls > 0
        && let Some(wait) = Box::pin(ctx.admit(calls)).await?
    {
        return Ok(Box::new(decide::deferred(&call, wait)));
    }
    Box::pin(ctx.ensure_lease(ctx.call_budget() * calls.max(1))).await?;
    match call {
        Call::Create { attempt, mark } => Box::pin(create(ctx, op, attempt, mark)).await,
        Call::Lookup { attempt } => Ok(Box::pin(lookup(ctx, op, attempt)).await),
        Call::Resend { attempt } => Ok(Box::pin(resend(ctx, op, attempt)).await),
        // A status answer is read whole within its call: its room goes back when the call ends.
        Call::Status { attempt } => {
            let plan = Box::pin(status(ctx, op, attempt)).await;
            ctx.holding = None;
            Ok(plan)
        }
        Call::Cancel { attempt } => Ok(Box::pin(cancel(ctx, op, attempt)).await),
        Call::FinalGet { attempt } => {
            let plan = Box::pin(final_get(ctx, op, attempt)).await;
            ctx.holding = None;
            Ok(plan)
        }
        Call::FetchResult { attempt } => Ok(Box::pin(fetch_result(ctx, op, attempt)).await),
        Call::NoResult => Ok(Box::pin(no_result(ctx, op)).await),
        Call::SyncResult {
            location,
            sha256,
            content_type,
        } => Box::pin(sync_result(ctx, op, location, sha256, content_type)).await,
    }
}

async fn create(
    ctx: &mut Ctx<'_>,
    op: &OperationRecord,
    attempt: i32,
    mark: bool,
) -> Result<Box<Plan>, Stop> {
    if mark {
        // Only when this lease's claim did not mark it (a continuation): one more commit.
        Box::pin(ctx.write(&Step {
            send_mark: SendMark::Set,
            keep_lease: true,
            ..Step::default()
        }))
        .await?;
    }
    fault::point("after_create_marked");
    let called = ctx.provider.create(op, ctx.at(attempt)).await;
    let kept = create_answered(ctx, op, &called).await;
    let now = ctx.clock.now();
    Ok(Box::new(decide::after_create(
        op,
        &ctx.policy,
        called,
        kept,
        now,
        draw(),
    )))
}

/// What a create's answer (a first send or a resend) needs before its step is decided: a `429`
/// pauses the provider fleet-wide; a synchronous answer's bytes are kept (`None` for any other
/// answer). They are checked in `result_collecting`, like any result: within the worker's check
/// room, and counted there if checking them kills workers.
async fn create_answered(
    ctx: &Ctx<'_>,
    op: &OperationRecord,
    called: &Called<CreateOutcome>,
) -> Option<Result<decide::Kept, String>> {
    if let CreateOutcome::RetryLater { delay, .. } = &called.outcome {
        ctx.throttled(&called.call, *delay).await;
    }
    let CreateOutcome::Completed { result, .. } = &called.outcome else {
        return None;
    };
    Some(ctx.keep(op, result).await)
}

async fn lookup(ctx: &Ctx<'_>, op: &OperationRecord, attempt: i32) -> Box<Plan> {
    let called = ctx.provider.lookup(op, ctx.at(attempt)).await;
    if let LookupOutcome::RetryLater { delay, .. } = &called.outcome {
        ctx.throttled(&called.call, *delay).await;
    }
    // Boxed: it is kept (1.5 KB) across the resend's await below.
    let after = Box::new(decide::after_lookup(
        op,
        &ctx.policy,
        called,
        ctx.clock.now(),
    ));
    match *after {
        AfterLookup::Write(plan) => Box::new(plan),
        AfterLookup::Resend {
            looked_up,
            lookup_call,
            context,
        } => {
            let resent = ctx
                .provider
                .create(op, ctx.at(op.create_attempts + 1))
                .await;
            fault::point("after_resend");
            let kept = create_answered(ctx, op, &resent).await;
            Box::new(decide::after_resend(
                op,
                &ctx.policy,
                resent,
                Some((looked_up, lookup_call, context)),
                kept,
                ctx.clock.now(),
            ))
        }
    }
}

async fn resend(ctx: &Ctx<'_>, op: &OperationRecord, attempt: i32) -> Box<Plan> {
    let resent = ctx.provider.create(op, ctx.at(attempt)).await;
    let kept = create_answered(ctx, op, &resent).await;
    Box::new(decide::after_resend(
        op,
        &ctx.policy,
        resent,
        None,
        kept,
        ctx.clock.now(),
    ))
}

/// The answer is decided before the fleet is paused, so the answer (half a kilobyte) is not held
/// across that write: this future is what a status call in flight costs beyond the call itself.
async fn status(ctx: &Ctx<'_>, op: &OperationRecord, attempt: i32) -> Box<Plan> {
    // In a block: a moved-from local still holds its room until its scope ends.
    let (plan, pause) = {
        let called = ctx.provider.status(op, ctx.at(attempt)).await;
        let pause = match &called.outcome {
            StatusOutcome::RetryLater { delay, .. } => ctx.fleet_wait(&called.call, *delay),
            _ => None,
        };
        let plan = decide::after_status(op, &ctx.policy, called, ctx.clock.now(), draw());
        (Box::new(plan), pause)
    };
    ctx.pause_fleet(pause).await;
    plan
}

/// Decided before the fleet is paused, as [`status`] is.
async fn cancel(ctx: &Ctx<'_>, op: &OperationRecord, attempt: i32) -> Box<Plan> {
    // In a block: a moved-from local still holds its room until its scope ends.
    let (plan, pause) = {
        let called = ctx.provider.cancel(op, ctx.at(attempt)).await;
        let pause = match &called.outcome {
            CancelOutcome::RetryLater { delay, .. } => ctx.fleet_wait(&called.call, *delay),
            _ => None,
        };
        let plan = decide::after_cancel(op, &ctx.policy, called, ctx.clock.now(), draw());
        (Box::new(plan), pause)
    };
    ctx.pause_fleet(pause).await;
    plan
}

async fn final_get(ctx: &Ctx<'_>, op: &OperationRecord, attempt: i32) -> Box<Plan> {
    let called = ctx.provider.final_get(op, ctx.at(attempt)).await;
    if let StatusOutcome::RetryLater { delay, .. } = &called.outcome {
        ctx.throttled(&called.call, *delay).await;
    }
    Box::new(decide::after_final_get(
        op,
        &ctx.policy,
        called,
        ctx.clock.now(),
        draw(),
    ))
}

async fn fetch_result(ctx: &mut Ctx<'_>, op: &OperationRecord, attempt: i32) -> Box<Plan> {
    let called = ctx.provider.fetch_result(op, ctx.at(attempt)).await;
    // What it did not need of the room taken for it goes back now; none, if nothing came.
    match (&called.outcome, &mut ctx.holding) {
        (ResultOutcome::Fetched(f), Some(held)) => keep_only(held, f.bytes.len() as u64),
        _ => ctx.holding = None,
    }
    if let ResultOutcome::RetryLater { delay, .. } = &called.outcome {
        ctx.throttled(&called.call, *delay).await;
    }
    let collected = match called.outcome {
        ResultOutcome::Fetched(f) => ctx.collected(op, f).await,
        ResultOutcome::TooLarge { limit } => Collected::TooLarge { limit },
        ResultOutcome::Unavailable { reason, .. } => Collected::Unavailable { reason },
        ResultOutcome::Failed { error_class } => Collected::Failed { error_class },
        ResultOutcome::RetryLater { delay, reason } => Collected::RetryLater { delay, reason },
        ResultOutcome::Refused { url } => Collected::Refused { url },
        ResultOutcome::Renewed { fresh, seen } => Collected::Renewed {
            fresh,
            observed: jobtrail_core::Observation::of(&seen),
        },
    };
    Box::new(decide::after_collect(
        op,
        &ctx.policy,
        collected,
        Some((called.call, called.context)),
        ctx.clock.now(),
        draw(),
    ))
}

async fn no_result(ctx: &Ctx<'_>, op: &OperationRecord) -> Box<Plan> {
    let nothing = FetchedResult {
        bytes: bytes::Bytes::new(),
        content_type: None,
        checksum: None,
    };
    let collected = ctx.collected(op, nothing).await;
    Box::new(decide::after_collect(
        op,
        &ctx.policy,
        collected,
        None,
        ctx.clock.now(),
        draw(),
    ))
}

async fn sync_result(
    ctx: &mut Ctx<'_>,
    op: &OperationRecord,
    location: String,
    sha256: String,
    content_type: Option<String>,
) -> Result<Box<Plan>, Stop> {
    // Bounded as every round trip is: a connection gone silent mid-read (a failover) would
    // otherwise hold this slot, and the room taken for the bytes, for as long as the worker runs.
    let read = tokio::time::timeout(
        ctx.answer_within,
        Box::pin(ResultStore::read_verified(ctx.store, &location, &sha256)),
    )
    .await
    .unwrap_or_else(|_| {
        Err(ReadError::Database(
            jobtrail_store::StoreError::Unavailable(crate::no_answer(ctx.answer_within)),
        ))
    });
    let collected = match read {
        Ok(bytes) => {
            if let Some(held) = &mut ctx.holding {
                keep_only(held, bytes.len() as u64);
            }
            let fetched = FetchedResult {
                bytes: bytes.into(),
                content_type,
                checksum: None,
            };
            ctx.collected(op, fetched).await
        }
        // The database is away: nothing is known about the result yet; try again later.
        Err(ReadError::Database(e)) => return Err(Stop::Other(e)),
        // A file kept on another host (a worker that took over from the one that kept it), or
        // gone: a person can put it back. (The database's results are insert-only: one missing
        // there is not coming back.)
        Err(ReadError::Missing(reason))
            if jobtrail_store::ResultBytes::parse_location(&location).is_none() =>
        {
            Collected::NotReadable { reason }
        }
        Err(why) => Collected::Unavailable {
            reason: why.to_string(),
        },
    };
    Ok(Box::new(decide::after_collect(
        op,
        &ctx.policy,
        collected,
        None,
        ctx.clock.now(),
        draw(),
    )))
}

/// The evidence a person (or the provider's support) needs when a cancel is not confirmed: the
/// remote job id, the trace id, and every call with its provider request id.
async fn evidence_bundle(
    store: &Store,
    op: &OperationRecord,
) -> Result<serde_json::Value, StoreError> {
    let calls = store.calls(op.id).await?;
    Ok(serde_json::json!({
        "remote_job_id": op.remote_job_id,
        "trace_id": op.trace_id.to_string(),
        "cancel_requested_by": op.cancel_requested_by,
        "cancel_reason": op.cancel_reason,
        "cancel_requested_at": op.cancel_requested_at,
        "calls": calls.iter().map(|c| serde_json::json!({
            "kind": c.kind, "at": c.started_at, "http_status": c.http_status,
            "provider_request_id": c.provider_request_id, "outcome": c.outcome,
        })).collect::<Vec<_>>(),
    }))
}

/// See [`Ctx::fleet_wait`].
fn fleet_pause(
    contract: &Contract,
    url: &str,
    http_status: Option<i32>,
    delay: Option<Duration>,
) -> Option<Duration> {
    let own_origin = url::Url::parse(url)
        .is_ok_and(|u| contract.access(&u) == Some(contract::Access::Credentials));
    // The contract's bounds on Retry-After hold for the fleet too, and the fleet stops for at most
    // a minute: the operation told to wait waits its whole Retry-After on its own, and one whose
    // every read is answered so (a single job's endpoint, throttled) could otherwise stop every
    // other operation of the provider each time it comes due.
    let bounds = contract.polling.retry_after;
    delay
        .filter(|_| http_status == Some(429) && own_origin)
        .map(|d| bounds.clamp(d).min(FLEET_PAUSE_MOST.max(bounds.min)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A `429` stops the fleet only from the provider's own origins, and for at most a minute.
    #[test]
    fn only_the_providers_own_429_pauses_the_fleet_and_for_at_most_a_minute() {
        // The simulator's contract, with object storage results are fetched from without
        // credentials, and Retry-After honoured up to an hour.
        let text = include_str!("../../../providers/sim.toml")
            .replace(
                "base_url = \"http://127.0.0.1:8700\"",
                "base_url = \"http://127.0.0.1:8700\"\nunauthenticated_origins = [\"http://127.0.0.1:9000\"]",
            )
            .replace("retry_after_max_ms = 10000", "retry_after_max_ms = 3600000");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../providers/sim.toml");
        let contract = Contract::parse(&text, std::path::Path::new(path)).unwrap();
        let pause = |url: &str, status: i32, delay: Option<Duration>| {
            fleet_pause(&contract, url, Some(status), delay)
        };
        let ten = Some(Duration::from_secs(10));
        let own = "http://127.0.0.1:8700/v1/jobs/1";
        assert_eq!(pause(own, 429, ten), ten);
        assert_eq!(
            pause(own, 429, Some(Duration::from_secs(3000))),
            Some(FLEET_PAUSE_MOST)
        );
        assert_eq!(pause(own, 429, None), None);
        let storage = "http://127.0.0.1:9000/results/1.json";
        assert_eq!(pause(storage, 429, ten), None);
        assert_eq!(pause(own, 503, ten), None);
    }

    /// Many large results arriving at once are checked LARGE_CHECKS at a time (their parse trees
    /// are what bounds a worker's memory); small ones are not held back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_results_are_checked_a_few_at_a_time() {
        static NOW: AtomicUsize = AtomicUsize::new(0);
        static MOST: AtomicUsize = AtomicUsize::new(0);
        let check = || {
            let n = NOW.fetch_add(1, Ordering::SeqCst) + 1;
            MOST.fetch_max(n, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(30));
            NOW.fetch_sub(1, Ordering::SeqCst);
        };
        let large = crate::results::BLOCKING_BYTES;
        let tasks: Vec<_> = (0..8)
            .map(|_| tokio::spawn(async move { off_runtime(large, check).await }))
            .collect();
        for t in tasks {
            tokio::time::timeout(std::time::Duration::from_secs(10), t)
                .await
                .expect("bounded")
                .unwrap();
        }
        let most = MOST.load(Ordering::SeqCst);
        assert!((1..=LARGE_CHECKS).contains(&most), "{most} at once");
    }
}
