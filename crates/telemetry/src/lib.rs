//! # jobtrail-telemetry
//!
//! What an operator's cluster looks at: Prometheus metrics (`/metrics`), health probes (`/livez`,
//! `/readyz`) on a small HTTP listener of their own, and structured logs. The engine's crates record
//! metrics through the `metrics` facade (a no-op until a binary installs the recorder here), so the
//! worker and the API stay free of any exporter.

pub mod logs;
pub mod traces;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use jobtrail_store::{SchemaState, Store};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Latency buckets (seconds) for every `*_seconds` histogram: provider calls run from milliseconds
/// to their timeout (a contract may allow an hour), claims from sub-millisecond to a stalled
/// database; past a minute the buckets go on to an hour, so a tail there still has a quantile.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 900.0, 3600.0,
];
/// Buckets for counts per transaction (the writer's group commits, claim batches).
const SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// How often a scrape may refresh the database gauges by default: every pod is scraped, and each
/// refresh counts the open operations by state. `JOBTRAIL_METRICS_REFRESH` (whole seconds, 1-3600,
/// `30` or `30s`) changes it.
const FLEET_REFRESH: Duration = Duration::from_secs(15);

fn fleet_refresh() -> Duration {
    metrics_refresh().ok().flatten().unwrap_or(FLEET_REFRESH)
}

/// `JOBTRAIL_METRICS_REFRESH` as set (`None`: not set), or why it is refused. Checked when a
/// process with an operations listener starts, so a typo is refused rather than ignored.
pub fn metrics_refresh() -> Result<Option<Duration>, String> {
    let Ok(v) = std::env::var("JOBTRAIL_METRICS_REFRESH") else {
        return Ok(None);
    };
    let t = v.trim();
    t.strip_suffix('s')
        .unwrap_or(t)
        .parse::<u64>()
        .ok()
        .filter(|s| (1..=3600).contains(s))
        .map(|s| Some(Duration::from_secs(s)))
        .ok_or_else(|| {
            format!("JOBTRAIL_METRICS_REFRESH={v:?}: whole seconds from 1 to 3600 (15, 30s)")
        })
}
/// A probe or a refresh never waits longer than this on the database.
const DB_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The process's Prometheus recorder, installed on first use (once per process).
pub fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_size".into()), SIZE_BUCKETS))
            .expect("non-empty bucket lists");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Another recorder already installed (a test harness): keep ours for rendering anyway.
        let _ = metrics::set_global_recorder(recorder);
        describe();
        handle
    })
}

fn describe() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        "jobtrail_operations",
        "Operations not yet terminal, by state and provider (the database's count, refreshed at most every 15 s; the same on every pod: aggregate with max, not sum)"
    );
    describe_gauge!(
        "jobtrail_due_oldest_age_seconds",
        "Per provider, how long the oldest operation a worker should be acting on now has waited (database clock; 0 when none): one that keeps growing is claimed by no worker"
    );
    describe_gauge!(
        "jobtrail_escalations_open",
        "Operations held for a person (jobtrail-admin escalations)"
    );
    describe_gauge!(
        "jobtrail_escalation_oldest_age_seconds",
        "Age of the oldest open escalation (0 when none)"
    );
    describe_counter!(
        "jobtrail_webhooks_total",
        "Webhook deliveries to a provider that takes them, by outcome: scheduled, duplicate, no_operation, not_observing, or refused_signature, refused_payload, refused_size, busy, unavailable (a delivery to an unknown provider is not counted)"
    );
    describe_counter!(
        "jobtrail_api_problems_total",
        "Problems the API and its MCP door answered (jobtrail serve), by kind: bad-input, unauthenticated, forbidden, not-found, conflict, not-succeeded, not-finished, tampered, too-large, rate-limited, too-many-open, method-not-allowed, unavailable (refusals for load are logged at most once a minute: this counts each)"
    );
    describe_counter!(
        "jobtrail_metrics_refresh_failures_total",
        "Scrapes whose database gauges could not be refreshed (the previous values were kept)"
    );
}

/// What the readiness probe checks: the database answers, its schema is the one this binary was
/// built for, and the provider contracts this process needs are loaded.
#[derive(Clone)]
pub struct Probe {
    /// A small pool of its own (the work's pool may be busy; a probe must not wait behind it, nor
    /// take a connection the work needs).
    pub store: Store,
    /// Provider contracts loaded at start (a worker with none can drive nothing).
    pub contracts: usize,
    /// Whether this process needs contracts to be ready (a worker does; the API can answer reads
    /// without them).
    pub needs_contracts: bool,
    /// Secrets the loaded contracts name that could not be found at start (a misspelt variable, a
    /// missing mount): not ready while any is missing, each named.
    pub unresolved_secrets: Vec<String>,
    /// Cancelled when the process was asked to stop (SIGTERM) and is leaving: not ready from then
    /// on, so load balancers take it out while it still serves (`jobtrail serve --stop-delay`).
    pub stopping: Option<tokio_util::sync::CancellationToken>,
    /// For a process with a loop of its own: how long since it last went round, and the longest a
    /// live loop stays silent. Past that `/livez` fails, so the orchestrator restarts a stuck loop
    /// (a database that is away does not count: the loop keeps going round, retrying).
    pub liveness: Option<(Liveness, Duration)>,
    /// For a process that opens its probes before it can work (it waits for its database at
    /// start): not ready until this is set. `None`: at work from the start.
    pub at_work: Option<Arc<AtomicBool>>,
}

/// How long since a process's loop last went round.
pub type Liveness = Arc<dyn Fn() -> Duration + Send + Sync>;

struct OpsState {
    probe: Probe,
    refresh: Duration,
    /// When the database gauges were last refreshed, and every series set so far (a series whose
    /// count dropped to nothing is set to 0, not left at its last value).
    fleet: Mutex<(Option<Instant>, Seen)>,
    /// The last readiness answer, reused for [`READY_CACHE`]: probes from several kubelets and
    /// anyone else who reaches the port cost at most one database read per interval.
    ready: Mutex<Option<(Instant, StatusCode, serde_json::Value)>>,
}

/// A `jobtrail_operations` series: (state, provider).
type Series = (String, String);

/// The database gauges' series set so far.
#[derive(Default)]
struct Seen {
    operations: HashSet<Series>,
    /// Providers of `jobtrail_due_oldest_age_seconds`.
    due: HashSet<String>,
}

const READY_CACHE: Duration = Duration::from_secs(1);

/// `/livez`, `/readyz` and `/metrics`.
pub fn router(probe: Probe) -> Router {
    metrics();
    let state = Arc::new(OpsState {
        probe,
        refresh: fleet_refresh(),
        fleet: Mutex::new((None, Seen::default())),
        ready: Mutex::new(None),
    });
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(scrape))
        .with_state(state)
}

async fn livez(State(s): State<Arc<OpsState>>) -> Response {
    if let Some((silence, limit)) = &s.probe.liveness {
        let silent = silence();
        if silent > *limit {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "stuck: the loop has not gone round for {} s (limit {} s)\n",
                    silent.as_secs(),
                    limit.as_secs()
                ),
            )
                .into_response();
        }
    }
    "ok\n".into_response()
}

async fn readyz(State(s): State<Arc<OpsState>>) -> Response {
    // Before the cache: a process that is leaving says so at once.
    if s.probe.stopping.as_ref().is_some_and(|t| t.is_cancelled()) {
        let body = serde_json::json!({
            "ready": false,
            "problem": "stopping: this process leaves its Service, then stops accepting",
        });
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    }
    // Uncached too: a process not yet at work says so (or what stops it) without the database,
    // and is ready the moment it starts.
    if s.probe
        .at_work
        .as_ref()
        .is_some_and(|w| !w.load(Ordering::Relaxed))
    {
        let (status, body) = readiness(&s.probe).await;
        return (status, axum::Json(body)).into_response();
    }
    let mut cached = s.ready.lock().await;
    if let Some((at, status, body)) = &*cached
        && at.elapsed() < READY_CACHE
    {
        return (*status, axum::Json(body.clone())).into_response();
    }
    let (status, body) = readiness(&s.probe).await;
    *cached = Some((Instant::now(), status, body.clone()));
    (status, axum::Json(body)).into_response()
}

async fn readiness(p: &Probe) -> (StatusCode, serde_json::Value) {
    let mut note = None;
    let problem = if p.needs_contracts && p.contracts == 0 {
        Some("no provider contracts loaded".to_owned())
    } else if !p.unresolved_secrets.is_empty() {
        Some(format!(
            "provider secrets missing (restart once they are set): {}",
            p.unresolved_secrets.join("; ")
        ))
    } else if p
        .at_work
        .as_ref()
        .is_some_and(|w| !w.load(Ordering::Relaxed))
    {
        Some("starting: waiting for the database (the log says why)".to_owned())
    } else {
        match tokio::time::timeout(DB_PROBE_TIMEOUT, p.store.schema_state()).await {
            Ok(Ok(SchemaState::Current)) => None,
            // A newer release has migrated the database during a rolling upgrade: this process
            // started against its own schema and keeps serving until it is replaced (were it
            // unready, every old pod would leave its Service at once).
            Ok(Ok(SchemaState::Ahead(m) | SchemaState::AheadReadable(m))) => {
                note = Some(m);
                None
            }
            Ok(Ok(SchemaState::Behind(m) | SchemaState::Edited(m))) => {
                Some(format!("database: {m}"))
            }
            Ok(Err(e)) => Some(format!("database: {e}")),
            Err(_) => Some(format!(
                "database: no answer within {} s",
                DB_PROBE_TIMEOUT.as_secs()
            )),
        }
    };
    let body = serde_json::json!({
        "ready": problem.is_none(),
        "contracts": p.contracts,
        "problem": problem,
        "note": note,
    });
    let status = if problem.is_none() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

async fn scrape(State(s): State<Arc<OpsState>>) -> Response {
    refresh_fleet(&s).await;
    let handle = metrics();
    handle.run_upkeep();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        handle.render(),
    )
        .into_response()
}

/// Refresh the gauges only the database knows, at most once per refresh interval (concurrent
/// scrapes wait for one refresh, they do not each run one).
async fn refresh_fleet(s: &OpsState) {
    let mut fleet = s.fleet.lock().await;
    let (last, seen) = &mut *fleet;
    if last.is_some_and(|t| t.elapsed() < s.refresh) {
        return;
    }
    *last = Some(Instant::now());
    let store = &s.probe.store;
    let read = async {
        let by_state = store.count_open_by_state().await?;
        let escalations = store.escalations_open().await?;
        let due = store.due_by_provider().await?;
        Ok::<_, jobtrail_store::StoreError>((by_state, escalations, due))
    };
    match tokio::time::timeout(DB_PROBE_TIMEOUT, read).await {
        Ok(Ok((by_state, (open, oldest), due))) => {
            let mut now_seen = HashSet::new();
            for (state, provider, n) in by_state {
                metrics::gauge!("jobtrail_operations", "state" => state.clone(), "provider" => provider.clone())
                    .set(n as f64);
                now_seen.insert((state, provider));
            }
            for (state, provider) in seen.operations.difference(&now_seen) {
                metrics::gauge!("jobtrail_operations", "state" => state.clone(), "provider" => provider.clone())
                    .set(0.0);
            }
            seen.operations.extend(now_seen);
            let mut now_due = HashSet::new();
            for d in due {
                metrics::gauge!("jobtrail_due_oldest_age_seconds", "provider" => d.provider.clone())
                    .set(d.oldest_secs.max(0.0));
                now_due.insert(d.provider);
            }
            for provider in seen.due.difference(&now_due) {
                metrics::gauge!("jobtrail_due_oldest_age_seconds", "provider" => provider.clone())
                    .set(0.0);
            }
            seen.due.extend(now_due);
            metrics::gauge!("jobtrail_escalations_open").set(open as f64);
            let age = oldest
                .map(|t| (chrono::Utc::now() - t).num_milliseconds().max(0) as f64 / 1000.0)
                .unwrap_or(0.0);
            metrics::gauge!("jobtrail_escalation_oldest_age_seconds").set(age);
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "metrics: could not read operation counts");
            metrics::counter!("jobtrail_metrics_refresh_failures_total").increment(1);
        }
        Err(_) => {
            tracing::warn!("metrics: operation counts took too long; keeping the previous values");
            metrics::counter!("jobtrail_metrics_refresh_failures_total").increment(1);
        }
    }
}
