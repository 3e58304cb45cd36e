//! # jobtrail-sim
//!
//! A simulated provider of asynchronous jobs: a real HTTP server (axum) with create (idempotency key),
//! status, cancel, result and lookup-by-client-reference, whose behaviour is scripted per job by a
//! `"sim"` object in the create body (see [`script::Script`]). Every fault the essay names can be made
//! to happen on purpose: a dropped connection after accepting, an answer after the client's timeout,
//! 429/503 with `Retry-After`, unconfirmed cancels, cancels that lose the race, a token answered with a
//! different job id, and every kind of bad result.
//!
//! It keeps a ledger (`GET /_sim/ledger`): jobs per idempotency token and per request fingerprint,
//! calls per job by kind, the most status calls in flight at once for one job, polls that came before
//! the `Retry-After` it sent, and the trace ids it saw. Tests use it to prove at-most-once creation and
//! single-owner polling from the provider's side of the wire.

pub mod script;
pub mod webhook;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use script::{
    CancelAct, CreateAct, Format, Outcome, Progress, Protocol, ResultAct, Script, StatusFault,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Server settings.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// When set, every request must carry `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
    /// Where (and how signed) the simulator sends webhooks about its jobs; none when unset.
    pub webhook: Option<webhook::Target>,
    /// Speak HTTP/1.1 only, as many providers do (otherwise HTTP/2 without TLS is served too, to a
    /// client that starts with it: h2c by prior knowledge).
    pub http1_only: bool,
    /// Serve the API under this path (`/gateway/ogcapi`, say), as a provider behind a gateway
    /// does: every route and every URL the simulator names (`Location`, status and result URLs)
    /// starts with it. Empty: served at the root.
    pub path_prefix: String,
}

/// What the simulator saw for one job.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JobLedger {
    /// When the simulator created the job (wall clock).
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When the job will end on its own (created + duration), if it ends.
    pub finishes_at: Option<chrono::DateTime<chrono::Utc>>,
    pub token: Option<String>,
    pub client_reference: Option<String>,
    pub fingerprint: String,
    pub state: String,
    pub calls: BTreeMap<String, u32>,
    pub max_status_in_flight: u32,
    pub early_polls: u32,
    pub trace_ids: BTreeSet<String>,
    pub status_paths: BTreeSet<String>,
    pub cookie_seen: u32,
    /// Every `Cookie` header status calls carried.
    pub cookie_headers: BTreeSet<String>,
    pub cancel_requests: u32,
    /// The JSON bodies of the workflow-engine calls that named this job (`stop`, `output`,
    /// `lookup`), in order.
    pub posted: BTreeMap<String, Vec<serde_json::Value>>,
}

/// The whole ledger, as served on `/_sim/ledger`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Ledger {
    /// Jobs created under each idempotency token.
    pub tokens: BTreeMap<String, Vec<String>>,
    /// Jobs created per request fingerprint (sha256 of the canonical body).
    pub fingerprints: BTreeMap<String, Vec<String>>,
    pub jobs: BTreeMap<String, JobLedger>,
    /// Trace ids seen on creates, by client reference.
    pub references: BTreeMap<String, BTreeSet<String>>,
    /// Create requests that reached the simulator, by idempotency token (every attempt, whatever
    /// it was answered).
    pub create_requests: BTreeMap<String, u32>,
    pub requests: u64,
    /// TCP connections accepted.
    pub connections: u64,
    /// Requests by HTTP version (`HTTP/1.1`, `HTTP/2.0`), whatever route they reached.
    pub requests_by_version: BTreeMap<String, u64>,
    pub requests_without_traceparent: u64,
    /// The `traceparent` headers received, in order (the first 10 000).
    pub traceparents: Vec<String>,
    pub unauthorized: u64,
    /// When each request arrived, in milliseconds since the simulator started (the first 100 000):
    /// a provider's view of the call rate.
    pub arrivals_ms: Vec<u64>,
    /// When each `429` with `Retry-After` was answered (same clock).
    pub throttled_ms: Vec<u64>,
    /// Every webhook delivery the simulator made, in order.
    pub webhooks: Vec<webhook::Sent>,
    /// The most result downloads in flight at once, across every job.
    pub max_results_in_flight: u32,
    /// The most status reads being answered at once, across every job.
    pub max_status_reads_in_flight: u32,
}

impl Ledger {
    /// The largest number of jobs created under one token.
    pub fn max_jobs_per_token(&self) -> usize {
        self.tokens.values().map(Vec::len).max().unwrap_or(0)
    }
    /// The largest number of status calls in flight at once for any job.
    pub fn max_status_in_flight(&self) -> u32 {
        self.jobs
            .values()
            .map(|j| j.max_status_in_flight)
            .max()
            .unwrap_or(0)
    }
    pub fn early_polls(&self) -> u32 {
        self.jobs.values().map(|j| j.early_polls).sum()
    }
    pub fn calls(&self, kind: &str) -> u32 {
        self.jobs
            .values()
            .map(|j| j.calls.get(kind).copied().unwrap_or(0))
            .sum()
    }
    pub fn jobs_for_reference(&self, reference: &str) -> Vec<&String> {
        self.jobs
            .iter()
            .filter(|(_, j)| j.client_reference.as_deref() == Some(reference))
            .map(|(id, _)| id)
            .collect()
    }
}

struct Job {
    id: String,
    script: Script,
    created: Instant,
    created_wall: chrono::DateTime<chrono::Utc>,
    cancel_requested: Option<Instant>,
    forced_success: Option<Instant>,
    status_calls: u32,
    result_calls: u32,
    /// Signed result URLs the status has named (script `result_urls_expired`).
    result_urls_signed: u32,
    in_flight: u32,
    not_before: Option<Instant>,
    cookie: String,
    /// The create request body as received (for scripts that echo it).
    request: serde_json::Value,
    ledger: JobLedger,
}

#[derive(Default)]
struct TokenEntry {
    fingerprint: String,
    attempts: usize,
    jobs: Vec<String>,
}

struct Inner {
    /// Where webhooks go (settable after start: the receiver may start after the simulator).
    webhook: Option<webhook::Target>,
    next_job: u64,
    jobs: HashMap<String, Job>,
    tokens: HashMap<String, TokenEntry>,
    ledger: Ledger,
    /// The clock of `Ledger::arrivals_ms`.
    started: Instant,
    /// Result downloads being answered now.
    results_in_flight: u32,
    /// Status reads being answered now.
    status_reads_in_flight: u32,
}

/// The simulator's shared state.
#[derive(Clone)]
pub struct Sim {
    inner: Arc<Mutex<Inner>>,
    config: Arc<Config>,
}

/// A running simulator (for tests and the demo): its address and a way to stop it.
pub struct Running {
    pub addr: SocketAddr,
    pub sim: Sim,
    shutdown: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// The address, and the path prefix the API is served under (a contract's `base_url`).
    pub fn base_url(&self) -> String {
        format!("http://{}{}", self.addr, self.sim.config.path_prefix)
    }
    pub fn ledger(&self) -> Ledger {
        self.sim.ledger()
    }
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

impl Sim {
    /// A simulator with `config`; a path prefix is served as `/a/b` whatever slashes it came with.
    pub fn new(mut config: Config) -> Self {
        let prefix = config.path_prefix.trim_matches('/');
        config.path_prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("/{prefix}")
        };
        Self {
            inner: Arc::new(Mutex::new(Inner {
                webhook: config.webhook.clone(),
                // Job ids never repeat across restarts (a provider's never do: jobtrail holds
                // a second operation named with another's job for a person): counted on from the
                // start time, a thousand ids a millisecond.
                next_job: u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0) * 1000,
                jobs: HashMap::new(),
                tokens: HashMap::new(),
                ledger: Ledger::default(),
                started: Instant::now(),
                results_in_flight: 0,
                status_reads_in_flight: 0,
            })),
            config: Arc::new(config),
        }
    }

    /// Send webhooks about jobs created from now on to `target` (or stop, with `None`).
    pub fn set_webhook(&self, target: Option<webhook::Target>) {
        self.inner.lock().expect("sim lock").webhook = target;
    }

    /// A snapshot of the ledger, with each job's current state.
    pub fn ledger(&self) -> Ledger {
        let g = self.inner.lock().expect("sim lock");
        let mut l = g.ledger.clone();
        let now = Instant::now();
        for (id, job) in &g.jobs {
            let mut jl = job.ledger.clone();
            jl.state = job.phase(now).0.to_owned();
            l.jobs.insert(id.clone(), jl);
        }
        l
    }

    pub fn router(&self) -> Router {
        let api = Router::new()
            .route("/v1/jobs", post(create).get(lookup))
            .route(
                "/v1/resources/{name}",
                axum::routing::put(put_create).get(resource_status),
            )
            .route("/v1/jobs/{id}", get(status))
            .route("/v1/operations/{id}/{n}", get(status_moved))
            .route("/v1/operations/{id}", get(status).post(aip_cancel))
            .route("/v1/monitors/{id}/{n}", get(status_moved))
            .route("/processes/{process}/execution", post(create))
            .route("/jobs/{id}", get(status).delete(ogc_dismiss))
            .route("/jobs/{id}/results", get(result))
            .route("/v1/jobs/{id}/cancel", post(cancel))
            .route("/v1/jobs/{id}/result", get(result))
            // A workflow engine's style: every call a POST with a JSON body naming the run.
            .route("/v2/runs:stop", post(workflow_stop))
            .route("/v2/runs:output", post(workflow_output))
            .route("/v2/runs:lookup", post(workflow_lookup));
        let prefix = self.config.path_prefix.as_str();
        let api = if prefix.is_empty() {
            api
        } else {
            Router::new().nest(prefix, api)
        };
        api.route("/_sim/ledger", get(ledger))
            .route("/healthz", get(|| async { "ok" }))
            .layer(axum::middleware::from_fn(echo_client_request_id))
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                count_http_version,
            ))
            .with_state(self.clone())
    }

    /// Bind `addr` (use 127.0.0.1:0 for a free port) and serve until stopped.
    pub async fn start(self, addr: SocketAddr) -> std::io::Result<Running> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let app = self.router();
        let task = tokio::spawn(serve(listener, app, self.clone(), shutdown.clone()));
        Ok(Running {
            addr,
            sim: self,
            shutdown,
            task,
        })
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.config.bearer_token else {
            return true;
        };
        let ok = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == format!("Bearer {token}"));
        if !ok {
            self.inner.lock().expect("sim lock").ledger.unauthorized += 1;
        }
        ok
    }
}

/// Streams one HTTP/2 connection may carry at once: enough for a benchmark's ten thousand
/// held-open calls from one worker (hyper's default, 200, would queue the rest in the client).
const H2_STREAMS: u32 = 100_000;

/// Serve HTTP/1.1 and, unless the simulator is `http1_only`, HTTP/2 by prior knowledge, until
/// `stop`; then let the connections finish for at most 4 s.
async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    sim: Sim,
    stop: tokio_util::sync::CancellationToken,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http2().max_concurrent_streams(H2_STREAMS);
    let builder = if sim.config.http1_only {
        builder.http1_only()
    } else {
        builder
    };
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let tcp = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                // Out of file descriptors, say: wait rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        sim.inner.lock().expect("sim lock").ledger.connections += 1;
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = builder
            .serve_connection(TokioIo::new(tcp), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(4), graceful.shutdown()).await;
}

/// The trace id of a W3C `traceparent` header.
fn trace_of(headers: &HeaderMap) -> Option<String> {
    let v = headers.get("traceparent")?.to_str().ok()?;
    let parts: Vec<&str> = v.split('-').collect();
    (parts.len() == 4 && parts[1].len() == 32).then(|| parts[1].to_owned())
}

impl Job {
    /// The finish time if nothing interferes.
    fn natural_end(&self) -> Option<Instant> {
        (!self.script.never_finish)
            .then(|| self.created + Duration::from_millis(self.script.duration_ms))
    }

    /// (state, completed, total) at `now`.
    fn phase(&self, now: Instant) -> (&'static str, u64, u64) {
        let total = 100;
        let natural = match self.script.outcome {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
        };
        if let Some(at) = self.forced_success
            && now >= at
        {
            return ("succeeded", total, total);
        }
        let end = self.natural_end();
        if let Some(c) = self.cancel_requested {
            let ended_before = end.is_some_and(|e| e <= c);
            if !ended_before && self.script.cancel == CancelAct::Confirm {
                let confirm = c + Duration::from_millis(self.script.cancel_delay_ms);
                match end {
                    Some(e) if e <= confirm && now >= e => return (natural, total, total),
                    _ if now >= confirm => return ("cancelled", 0, total),
                    _ => return ("cancelling", 0, total),
                }
            }
        }
        match end {
            Some(e) if now >= e => (natural, total, total),
            _ => {
                let elapsed = now.duration_since(self.created).as_millis() as u64;
                let dur = self.script.duration_ms.max(1);
                if elapsed < dur / 10 {
                    return ("queued", 0, total);
                }
                let mut done = (elapsed * total / dur).min(total - 1);
                if self.script.progress == Progress::Bursty {
                    done = done / 25 * 25;
                }
                ("running", done, total)
            }
        }
    }

    fn touch(&mut self, kind: &str, headers: &HeaderMap) {
        *self.ledger.calls.entry(kind.to_owned()).or_default() += 1;
        if let Some(t) = trace_of(headers) {
            self.ledger.trace_ids.insert(t);
        }
    }
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn error(status: StatusCode, msg: &str) -> Response {
    json_response(status, serde_json::json!({ "error": msg }))
}

/// Drop the connection without an answer. `resume_unwind` skips the panic hook, so nothing is
/// printed; the connection task ends and the socket closes mid-request.
fn drop_connection() -> ! {
    std::panic::resume_unwind(Box::new("jobtrail-sim: dropping the connection on purpose"))
}

fn count_request(sim: &Sim, headers: &HeaderMap) {
    let mut g = sim.inner.lock().expect("sim lock");
    g.ledger.requests += 1;
    if g.ledger.arrivals_ms.len() < 100_000 {
        let at = g.started.elapsed().as_millis() as u64;
        g.ledger.arrivals_ms.push(at);
    }
    if trace_of(headers).is_none() {
        g.ledger.requests_without_traceparent += 1;
    }
    if g.ledger.traceparents.len() < 10_000
        && let Some(v) = headers.get("traceparent").and_then(|v| v.to_str().ok())
    {
        g.ledger.traceparents.push(v.to_owned());
    }
}

/// `PUT /v1/resources/{name}`: a create whose URL the client chooses. The name is the idempotency:
/// the same name again answers the job it already made (HTTP's own PUT semantics), with no token.
async fn put_create(
    State(sim): State<Sim>,
    Path(name): Path<String>,
    mut headers: HeaderMap,
    body: bytes::Bytes,
) -> Response {
    if headers.contains_key("idempotency-key") {
        return error(
            StatusCode::BAD_REQUEST,
            "a PUT names its resource: no Idempotency-Key",
        );
    }
    match HeaderValue::from_str(&format!("put:{name}")) {
        Ok(v) => {
            headers.insert("idempotency-key", v);
        }
        Err(_) => return error(StatusCode::BAD_REQUEST, "bad resource name"),
    }
    create(State(sim), headers, body).await
}

/// Every request counted by its HTTP version, whatever route it reaches.
async fn count_http_version(
    State(sim): State<Sim>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    *sim.inner
        .lock()
        .expect("sim lock")
        .ledger
        .requests_by_version
        .entry(format!("{:?}", request.version()))
        .or_default() += 1;
    next.run(request).await
}

/// Azure's `x-ms-client-request-id`: every answer echoes the id its request carried (unless the
/// handler already set one: the fault that echoes another).
async fn echo_client_request_id(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let id = request.headers().get("x-ms-client-request-id").cloned();
    let mut response = next.run(request).await;
    if let Some(id) = id
        && !response.headers().contains_key("x-ms-client-request-id")
    {
        response.headers_mut().insert("x-ms-client-request-id", id);
    }
    response
}

/// `GET /v1/resources/{name}`: the status of the job a PUT made there.
async fn resource_status(
    State(sim): State<Sim>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let job = {
        let g = sim.inner.lock().expect("sim lock");
        g.tokens
            .get(&format!("put:{name}"))
            .and_then(|t| t.jobs.first().cloned())
    };
    match job {
        Some(id) => status_inner(sim, id, headers, format!("/v1/resources/{name}")).await,
        None => {
            count_request(&sim, &headers);
            error(StatusCode::NOT_FOUND, "no such resource")
        }
    }
}

async fn create(State(sim): State<Sim>, headers: HeaderMap, body: bytes::Bytes) -> Response {
    count_request(&sim, &headers);
    if !sim.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    }
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "body is not JSON");
    };
    let mut script: Script = match doc.get("sim") {
        Some(s) => match serde_json::from_value(s.clone()) {
            Ok(s) => s,
            Err(e) => return error(StatusCode::BAD_REQUEST, &format!("bad sim script: {e}")),
        },
        None => Script::default(),
    };
    script.path_prefix.clone_from(&sim.config.path_prefix);
    if script.protocol == Protocol::Ogc
        && headers.get("prefer").and_then(|v| v.to_str().ok()) != Some("respond-async")
    {
        return error(
            StatusCode::BAD_REQUEST,
            "this server executes asynchronously only: send Prefer: respond-async",
        );
    }
    let token = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let reference = doc
        .get("client_reference")
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    let canonical = serde_json_canonicalizer::to_vec(&doc).unwrap_or_default();
    let fingerprint = hex::encode(Sha256::digest(&canonical));
    let trace = trace_of(&headers);
    if script.create_hold_ms > 0 {
        tokio::time::sleep(Duration::from_millis(script.create_hold_ms)).await;
    }

    // Decide under the lock, act (sleep, drop) after it.
    let decided = {
        let mut g = sim.inner.lock().expect("sim lock");
        if let (Some(r), Some(t)) = (&reference, &trace) {
            g.ledger
                .references
                .entry(r.clone())
                .or_default()
                .insert(t.clone());
        }
        let (attempt, existing) = match &token {
            Some(t) => {
                let e = g.tokens.entry(t.clone()).or_default();
                if e.attempts > 0 && e.fingerprint != fingerprint {
                    return error(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "idempotency key reused with a different request body",
                    );
                }
                e.fingerprint.clone_from(&fingerprint);
                e.attempts += 1;
                let seen = (e.attempts, e.jobs.first().cloned());
                *g.ledger.create_requests.entry(t.clone()).or_default() += 1;
                seen
            }
            None => (1, None),
        };
        let act = script.create_act(attempt);
        match act {
            CreateAct::Reject => {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid request: rejected by policy",
                );
            }
            CreateAct::RejectBinary => {
                return (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    [(header::CONTENT_TYPE, "application/octet-stream")],
                    b"r\0e\0j\0e\0c\0t\0\x1b[31m\xff\xfe".to_vec(),
                )
                    .into_response();
            }
            CreateAct::RejectEcho => {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &format!("invalid request: {}", String::from_utf8_lossy(&body)),
                );
            }
            CreateAct::RetryAfterSeconds => {
                let mut r = error(StatusCode::TOO_MANY_REQUESTS, "slow down");
                r.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(script.retry_after_secs),
                );
                return r;
            }
            CreateAct::RetryAfterDate => {
                let at =
                    std::time::SystemTime::now() + Duration::from_secs(script.retry_after_secs + 1);
                let mut r = error(StatusCode::SERVICE_UNAVAILABLE, "overloaded");
                r.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from_str(&httpdate::fmt_http_date(at)).expect("http date"),
                );
                return r;
            }
            CreateAct::DropBeforeAccept => None,
            CreateAct::AlreadyExistsError if existing.is_some() => {
                let id = existing.expect("checked");
                return json_response(
                    StatusCode::CONFLICT,
                    serde_json::json!({"error": "already exists", "job_id": id}),
                );
            }
            _ => {
                let reuse = existing.filter(|_| act != CreateAct::DifferentJobId);
                let (id, replay) = match reuse {
                    Some(id) => (id, true),
                    None => {
                        g.next_job += 1;
                        let id = format!("job_{:06}", g.next_job);
                        let job = Job {
                            id: id.clone(),
                            script: script.clone(),
                            created: Instant::now(),
                            created_wall: chrono::Utc::now(),
                            cancel_requested: None,
                            forced_success: None,
                            status_calls: 0,
                            result_calls: 0,
                            result_urls_signed: 0,
                            in_flight: 0,
                            not_before: None,
                            cookie: format!(
                                "s_{}",
                                hex::encode(&Sha256::digest(id.as_bytes())[..8])
                            ),
                            request: doc.clone(),
                            ledger: JobLedger {
                                created_at: Some(chrono::Utc::now()),
                                finishes_at: (!script.never_finish).then(|| {
                                    chrono::Utc::now()
                                        + chrono::Duration::milliseconds(script.duration_ms as i64)
                                }),
                                token: token.clone(),
                                client_reference: reference.clone(),
                                fingerprint: fingerprint.clone(),
                                ..Default::default()
                            },
                        };
                        g.jobs.insert(id.clone(), job);
                        if let Some(target) = g.webhook.clone() {
                            webhook::spawn(sim.clone(), target, id.clone(), &script);
                        }
                        if let Some(t) = &token {
                            g.tokens.get_mut(t).expect("entry").jobs.push(id.clone());
                            g.ledger
                                .tokens
                                .entry(t.clone())
                                .or_default()
                                .push(id.clone());
                        }
                        g.ledger
                            .fingerprints
                            .entry(fingerprint.clone())
                            .or_default()
                            .push(id.clone());
                        (id, false)
                    }
                };
                let job = g.jobs.get_mut(&id).expect("job");
                job.touch("create", &headers);
                Some((id, replay, act, job.cookie.clone(), job.script.clone()))
            }
        }
    };
    let Some((id, replay, act, cookie, script)) = decided else {
        drop_connection();
    };
    match act {
        CreateAct::DropAfterAccept => drop_connection(),
        CreateAct::SlowAccept => {
            tokio::time::sleep(Duration::from_millis(script.create_delay_ms)).await
        }
        CreateAct::AmbiguousAfterAccept => {
            return error(StatusCode::INTERNAL_SERVER_ERROR, "internal error");
        }
        _ => {}
    }
    if act == CreateAct::Sync && script.protocol == Protocol::Ogc {
        // OGC: executed synchronously after all, answered 200 with the results document itself.
        let (doc, content_type) = result_doc(&id, &script);
        return (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], doc).into_response();
    }
    if matches!(
        act,
        CreateAct::Sync | CreateAct::SyncEcho | CreateAct::SyncEncoded
    ) {
        // The result pretty-printed inside the answer, as many servers write it: bytes a client
        // that re-serialises would not keep.
        let (doc, _) = result_doc(&id, &script);
        let mut result = serde_json::from_slice::<serde_json::Value>(&doc).unwrap_or_default();
        if act == CreateAct::SyncEcho {
            result["echo"] = serde_json::from_slice(&body).unwrap_or_default();
        }
        let pretty = serde_json::to_string_pretty(&result).unwrap_or_default();
        let body = format!(
            "{{\"job_id\": {}, \"state\": \"succeeded\", \"result\": {pretty}}}",
            serde_json::Value::from(id.clone())
        );
        let mut r = (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        if act == CreateAct::SyncEncoded {
            r.headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        return r;
    }
    let named = if act == CreateAct::DotDotJobId {
        "..".to_owned()
    } else {
        id.clone()
    };
    let status_url = script
        .status_url_elsewhere
        .clone()
        .unwrap_or_else(|| script.at(format_args!("/v1/jobs/{named}")));
    let (mut r, location) = match script.protocol {
        Protocol::Native => {
            let state = if act == CreateAct::HostileState {
                format!("queued\u{0}\u{1b}[2J{}", "q".repeat(64 * 1024))
            } else {
                "queued".to_owned()
            };
            let mut body =
                serde_json::json!({"job_id": named, "state": state, "status_url": status_url});
            if script.partial_output {
                body["result"] = serde_json::json!({"job_id": named, "items": []});
            }
            (json_response(StatusCode::ACCEPTED, body), status_url)
        }
        Protocol::Aip => (
            json_response(
                StatusCode::OK,
                serde_json::json!({"name": format!("operations/{named}"), "metadata": {"progress": 0}}),
            ),
            script.at(format_args!("/v1/operations/{named}")),
        ),
        Protocol::Location => (
            json_response(StatusCode::ACCEPTED, serde_json::json!({"job_id": named})),
            script.at(format_args!("/v1/monitors/{named}/0")),
        ),
        Protocol::Ogc => {
            let status = match act {
                CreateAct::StatusInfoAs200 => Some("accepted"),
                CreateAct::SuccessfulStatusInfoAs200 => Some("successful"),
                _ => None,
            };
            let mut r = if let Some(status) = status {
                json_response(
                    StatusCode::OK,
                    serde_json::json!({"jobID": named, "type": "process", "status": status}),
                )
            } else {
                (StatusCode::CREATED, "").into_response()
            };
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            // `status_url_elsewhere` names another Location (a broken provider's, say).
            let location = script.status_url_elsewhere.clone().unwrap_or_else(|| {
                match &script.location_query {
                    Some(q) => script.at(format_args!("/jobs/{named}?{q}")),
                    None => script.at(format_args!("/jobs/{named}")),
                }
            });
            (r, location)
        }
        Protocol::AzureResource => {
            let name = token
                .as_deref()
                .and_then(|t| t.strip_prefix("put:"))
                .unwrap_or(&named)
                .to_owned();
            let location = script.at(format_args!("/v1/resources/{name}"));
            (
                json_response(
                    StatusCode::CREATED,
                    serde_json::json!({"id": location, "name": name, "properties": {"provisioningState": "Accepted"}}),
                ),
                location,
            )
        }
        Protocol::AzureMonitor => {
            let mut r = json_response(
                StatusCode::ACCEPTED,
                serde_json::json!({"job_id": named, "status": "NotStarted"}),
            );
            r.headers_mut().insert(
                "operation-location",
                HeaderValue::from_str(&script.at(format_args!("/v1/operations/{named}/0")))
                    .expect("ascii"),
            );
            if script.bogus_async_header {
                r.headers_mut().insert(
                    "azure-asyncoperation",
                    HeaderValue::from_static("http://[::1"),
                );
            }
            if script.async_operation_header {
                r.headers_mut().insert(
                    "azure-asyncoperation",
                    HeaderValue::from_str(&script.at(format_args!("/v1/operations/{named}/0")))
                        .expect("ascii"),
                );
                r.headers_mut().insert(
                    "operation-location",
                    HeaderValue::from_str(
                        &script.at(format_args!("/v1/operations/{named}-nowhere/0")),
                    )
                    .expect("ascii"),
                );
            }
            // Where the final result will be (Azure's final-state-via: location).
            (r, script.at(format_args!("/v1/jobs/{named}/result")))
        }
    };
    let h = r.headers_mut();
    h.insert(
        header::LOCATION,
        HeaderValue::from_str(&location).expect("ascii"),
    );
    h.insert(
        "x-request-id",
        HeaderValue::from_str(&format!("req_create_{id}")).expect("ascii"),
    );
    h.insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!("sim_session={cookie}; Path=/; HttpOnly")).expect("ascii"),
    );
    // Two more a real cookie store must not send back: one for another path, one already expired.
    h.append(
        header::SET_COOKIE,
        HeaderValue::from_static("sim_scoped=elsewhere; Path=/somewhere-else"),
    );
    h.append(
        header::SET_COOKIE,
        HeaderValue::from_static("sim_expired=old; Path=/; Max-Age=0"),
    );
    if script.status_via_header {
        h.insert(
            "operation-location",
            HeaderValue::from_str(&script.at(format_args!("/v1/operations/{id}/0")))
                .expect("ascii"),
        );
    }
    if replay {
        h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if let Some(secs) = script.create_retry_after {
        h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        let mut g = sim.inner.lock().expect("sim lock");
        if let Some(job) = g.jobs.get_mut(&id) {
            job.not_before = Some(Instant::now() + Duration::from_secs(secs));
        }
    }
    r
}

/// A Google AIP-151 `Operation` for a job in `state`: `done` left out while it runs (as proto3's
/// JSON mapping does), `response` when it succeeded, `error` (google.rpc.Status) when it failed or
/// was cancelled (code 1, CANCELLED).
fn aip_operation(id: &str, state: &str, done: u64, script: &Script) -> serde_json::Value {
    let mut op = serde_json::json!({
        "name": format!("operations/{id}"),
        "metadata": {"progress": done},
    });
    match state {
        "succeeded" => {
            let (doc, _) = result_doc(id, script);
            op["done"] = true.into();
            op["response"] = serde_json::from_slice(&doc).unwrap_or_default();
        }
        "failed" => {
            op["done"] = true.into();
            op["error"] =
                serde_json::json!({"code": 13, "message": "the job failed: simulated failure"});
        }
        "cancelled" => {
            op["done"] = true.into();
            op["error"] = serde_json::json!({"code": 1, "message": "cancelled by the caller"});
        }
        _ => {}
    }
    op
}

/// Azure's status monitor body for a job in `state`.
fn azure_monitor(id: &str, state: &str, script: &Script) -> serde_json::Value {
    let status = match state {
        "queued" => "NotStarted",
        "running" | "cancelling" => "Running",
        "succeeded" => "Succeeded",
        "failed" => "Failed",
        _ => "Canceled",
    };
    let mut body = serde_json::json!({"id": id, "status": status});
    match state {
        "succeeded" => {
            let (doc, _) = result_doc(id, script);
            body["result"] = serde_json::from_slice(&doc).unwrap_or_default();
        }
        "failed" => {
            body["error"] = serde_json::json!({"code": "JobFailed", "message": "the job failed: simulated failure"});
        }
        _ => {}
    }
    body
}

/// An Azure resource made by a PUT, its `provisioningState` the job's state.
fn azure_resource(name: &str, state: &str, script: &Script, id: &str) -> serde_json::Value {
    let provisioning = match state {
        "queued" => "Accepted",
        "running" | "cancelling" => "Provisioning",
        "succeeded" => "Succeeded",
        "failed" => "Failed",
        _ => "Canceled",
    };
    let mut body = serde_json::json!({
        "id": format!("/v1/resources/{name}"),
        "name": name,
        "properties": {"provisioningState": provisioning},
    });
    match state {
        "succeeded" => {
            let (doc, _) = result_doc(id, script);
            body["properties"]["output"] = serde_json::from_slice(&doc).unwrap_or_default();
        }
        "failed" => {
            body["error"] = serde_json::json!({"code": "ProvisioningFailed", "message": "the job failed: simulated failure"});
        }
        _ => {}
    }
    body
}

/// Azure's `Location` polling: the status code is the state. 202 while the job runs (a new
/// `Location` each time with `moving_status_url`), 200 with the job when it succeeded, 400 with an
/// `error` object when it failed.
fn location_monitor(id: &str, state: &str, n: u32, script: &Script) -> Response {
    match state {
        "succeeded" => json_response(
            StatusCode::OK,
            serde_json::json!({"job_id": id, "result_url": script.at(format_args!("/v1/jobs/{id}/result"))}),
        ),
        "failed" | "cancelled" => json_response(
            StatusCode::BAD_REQUEST,
            serde_json::json!({"error": {"code": "JobFailed", "message": format!("the job {state}")}}),
        ),
        _ => {
            let mut r = (StatusCode::ACCEPTED, "").into_response();
            if script.moving_status_url {
                r.headers_mut().insert(
                    header::LOCATION,
                    HeaderValue::from_str(&script.at(format_args!("/v1/monitors/{id}/{}", n + 1)))
                        .expect("ascii"),
                );
            }
            r
        }
    }
}

/// `DELETE /jobs/{id}` (OGC API – Processes): dismiss, answered with the statusInfo.
async fn ogc_dismiss(
    State(sim): State<Sim>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let r = cancel_inner(sim, id.clone(), headers, true).await;
    if !r.status().is_success() {
        return r;
    }
    json_response(
        StatusCode::OK,
        serde_json::json!({"jobID": id, "type": "process", "status": "dismissed"}),
    )
}

/// `POST /v1/operations/{id}:cancel` (AIP-151); the path segment holds both.
async fn aip_cancel(
    State(sim): State<Sim>,
    Path(segment): Path<String>,
    headers: HeaderMap,
) -> Response {
    match segment.strip_suffix(":cancel") {
        Some(id) => cancel_inner(sim, id.to_owned(), headers, true).await,
        None => error(StatusCode::NOT_FOUND, "no such method"),
    }
}

/// Decrements the in-flight count when a status call ends, even if the client went away.
struct InFlight {
    sim: Sim,
    id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut g) = self.sim.inner.lock() {
            g.status_reads_in_flight = g.status_reads_in_flight.saturating_sub(1);
            if let Some(j) = g.jobs.get_mut(&self.id) {
                j.in_flight = j.in_flight.saturating_sub(1);
            }
        }
    }
}

async fn status_moved(
    State(sim): State<Sim>,
    Path((id, _n)): Path<(String, u32)>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    status_inner(sim, id, headers, uri.path().to_owned()).await
}

async fn status(
    State(sim): State<Sim>,
    Path(id): Path<String>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    status_inner(sim, id, headers, uri.path().to_owned()).await
}

async fn status_inner(sim: Sim, id: String, headers: HeaderMap, path: String) -> Response {
    count_request(&sim, &headers);
    if !sim.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    }
    let (delay, require_cookie, cookie) = {
        let mut g = sim.inner.lock().expect("sim lock");
        let Some(job) = g.jobs.get_mut(&id) else {
            return error(StatusCode::NOT_FOUND, "no such job");
        };
        job.touch("status", &headers);
        job.ledger.status_paths.insert(path);
        let now = Instant::now();
        // A small tolerance for clock granularity on both sides.
        if job
            .not_before
            .is_some_and(|nb| now + Duration::from_millis(50) < nb)
        {
            job.ledger.early_polls += 1;
        }
        job.in_flight += 1;
        job.ledger.max_status_in_flight = job.ledger.max_status_in_flight.max(job.in_flight);
        let delay = Duration::from_millis(job.script.status_delay_ms);
        let (require_cookie, cookie) = (job.script.require_cookie, job.cookie.clone());
        g.status_reads_in_flight += 1;
        g.ledger.max_status_reads_in_flight = g
            .ledger
            .max_status_reads_in_flight
            .max(g.status_reads_in_flight);
        (delay, require_cookie, cookie)
    };
    let _guard = InFlight {
        sim: sim.clone(),
        id: id.clone(),
    };
    let cookie_header = headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let has_cookie = cookie_header
        .as_deref()
        .is_some_and(|c| c.contains(&format!("sim_session={cookie}")));
    if let Some(c) = cookie_header {
        let mut g = sim.inner.lock().expect("sim lock");
        if let Some(j) = g.jobs.get_mut(&id) {
            j.ledger.cookie_seen += u32::from(has_cookie);
            j.ledger.cookie_headers.insert(c);
        }
    }
    if require_cookie && !has_cookie {
        return error(StatusCode::UNAUTHORIZED, "session cookie required");
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut g = sim.inner.lock().expect("sim lock");
    let job = g.jobs.get_mut(&id).expect("job exists");
    job.status_calls += 1;
    let n = job.status_calls;
    let now = Instant::now();
    let (state, done, total) = job.phase(now);
    match job.script.status_faults.get(&n) {
        Some(StatusFault::MalformedJson) => {
            return (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                "{\"job_id\": \"",
            )
                .into_response();
        }
        Some(StatusFault::MissingState) => {
            return json_response(StatusCode::OK, serde_json::json!({"job_id": id}));
        }
        Some(StatusFault::Error500) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "status backend unavailable",
            );
        }
        Some(StatusFault::TooManyRequests) => {
            let mut r = error(StatusCode::TOO_MANY_REQUESTS, "slow down");
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
            job.not_before = Some(now + Duration::from_secs(1));
            let at = g.started.elapsed().as_millis() as u64;
            g.ledger.throttled_ms.push(at);
            return r;
        }
        Some(StatusFault::TooManyRequestsBare) => {
            return error(StatusCode::TOO_MANY_REQUESTS, "slow down");
        }
        Some(StatusFault::HostileText) => {
            return json_response(
                StatusCode::OK,
                serde_json::json!({
                    "job_id": id,
                    "state": format!("running\u{0}\u{1b}[2J{}", "x".repeat(64 * 1024)),
                    "updated_at": "2026\u{0}-01-01",
                    "progress": {"note\u{0}": "a\u{0}b", "pad": "y".repeat(128 * 1024)},
                    "status_url": format!("/v1/jobs/{id}\u{0}"),
                    "error": "\u{0}",
                }),
            );
        }
        Some(StatusFault::ValueFlood) => {
            let flood = format!(
                r#"{{"job_id":"{id}","state":"running","progress":[{}{{}}]}}"#,
                r#"{"a":0},"#.repeat(30_000)
            );
            return (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                flood,
            )
                .into_response();
        }
        Some(StatusFault::CookieFlood) => {}
        Some(StatusFault::UnknownState | StatusFault::OtherClientRequestId) | None => {}
    }
    let shown = if job.script.status_faults.get(&n) == Some(&StatusFault::UnknownState) {
        "warming_up"
    } else {
        state
    };
    let mut body = serde_json::json!({
        "job_id": id,
        "state": shown,
        "updated_at": (job.created_wall + chrono::Duration::from_std(now.duration_since(job.created)).unwrap_or_default()).to_rfc3339(),
        "progress": {"completed": done, "total": total},
        "client_reference": job.ledger.client_reference,
    });
    if state == "succeeded" {
        let signed = (job.script.result_urls_expired > 0).then(|| {
            job.result_urls_signed += 1;
            format!("?sig={}", job.result_urls_signed)
        });
        body["result_url"] =
            serde_json::json!(job.script.result_url_elsewhere.clone().unwrap_or_else(|| {
                job.script.at(format_args!(
                    "/v1/jobs/{id}/result{}",
                    signed.unwrap_or_default()
                ))
            }));
        body["expected_items"] = job
            .script
            .expected_items_as
            .clone()
            .unwrap_or_else(|| serde_json::json!(job.script.items));
    }
    if state == "failed" {
        body["error"] = serde_json::json!("the job failed: simulated failure");
    }
    if job.script.moving_status_url {
        body["status_url"] =
            serde_json::json!(job.script.at(format_args!("/v1/operations/{id}/{}", n + 1)));
    }
    let mut r = match job.script.protocol {
        Protocol::Native => json_response(StatusCode::OK, body),
        Protocol::Aip => {
            json_response(StatusCode::OK, aip_operation(&id, state, done, &job.script))
        }
        Protocol::Location => location_monitor(&id, state, n, &job.script),
        Protocol::AzureMonitor => {
            json_response(StatusCode::OK, azure_monitor(&id, state, &job.script))
        }
        Protocol::AzureResource => {
            let name = job
                .ledger
                .token
                .as_deref()
                .and_then(|t| t.strip_prefix("put:"))
                .unwrap_or(&id)
                .to_owned();
            json_response(
                StatusCode::OK,
                azure_resource(&name, state, &job.script, &id),
            )
        }
        // A dismissed job is gone: OGC servers answer 404 for it (its dismissal was confirmed in
        // the DELETE's answer).
        Protocol::Ogc if state == "cancelled" => error(StatusCode::NOT_FOUND, "no such job"),
        Protocol::Ogc => {
            let status = match state {
                "queued" => "accepted",
                "running" | "cancelling" => "running",
                "succeeded" => "successful",
                "failed" => "failed",
                _ => "dismissed",
            };
            json_response(
                StatusCode::OK,
                serde_json::json!({"jobID": id, "type": "process", "status": status, "progress": done}),
            )
        }
    };
    r.headers_mut().insert(
        "x-request-id",
        HeaderValue::from_str(&format!("req_status_{id}_{n}")).expect("ascii"),
    );
    if job.script.status_faults.get(&n) == Some(&StatusFault::CookieFlood) {
        for i in 0..200 {
            let value = if i == 0 {
                "z".repeat(16 * 1024)
            } else {
                i.to_string()
            };
            r.headers_mut().append(
                header::SET_COOKIE,
                HeaderValue::from_str(&format!("flood{i}={value}; Path=/")).expect("ascii"),
            );
        }
    }
    if job.script.status_faults.get(&n) == Some(&StatusFault::OtherClientRequestId) {
        r.headers_mut().insert(
            "x-ms-client-request-id",
            HeaderValue::from_static("00000000-0000-4000-8000-000000000000"),
        );
    }
    let running = matches!(state, "queued" | "running" | "cancelling");
    if let (true, Some(secs)) = (running, job.script.poll_retry_after) {
        if job.script.poll_retry_after_as_date {
            // HTTP-dates have whole seconds: the client may poll at the date itself.
            let at = std::time::SystemTime::now() + Duration::from_secs(secs + 1);
            let text = httpdate::fmt_http_date(at);
            let at = httpdate::parse_http_date(&text).expect("own date");
            let wait = at
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            job.not_before = Some(now + wait);
            r.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&text).expect("ascii"),
            );
        } else {
            job.not_before = Some(now + Duration::from_secs(secs));
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
    } else {
        job.not_before = None;
    }
    r
}

async fn cancel(State(sim): State<Sim>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    cancel_inner(sim, id, headers, false).await
}

/// A cancel request. `aip`: answer as AIP-151 does (200 with an empty object).
async fn cancel_inner(sim: Sim, id: String, headers: HeaderMap, aip: bool) -> Response {
    count_request(&sim, &headers);
    if !sim.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    }
    let mut g = sim.inner.lock().expect("sim lock");
    let Some(job) = g.jobs.get_mut(&id) else {
        return error(StatusCode::NOT_FOUND, "no such job");
    };
    job.touch("cancel", &headers);
    job.ledger.cancel_requests += 1;
    if job.ledger.cancel_requests <= job.script.cancel_throttled {
        let mut r = error(StatusCode::TOO_MANY_REQUESTS, "cancels are rate limited");
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
        return r;
    }
    let now = Instant::now();
    let (state, _, _) = job.phase(now);
    if matches!(state, "succeeded" | "failed" | "cancelled") {
        return error(StatusCode::CONFLICT, &format!("job already {state}"));
    }
    if job.cancel_requested.is_none() {
        job.cancel_requested = Some(now);
        if job.script.cancel == CancelAct::LoseRace {
            job.forced_success = Some(now);
        }
    }
    if job.ledger.cancel_requests <= job.script.cancel_throttled + job.script.cancel_unavailable {
        let mut r = error(StatusCode::SERVICE_UNAVAILABLE, "upstream timed out");
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
        return r;
    }
    let mut r = if aip {
        json_response(StatusCode::OK, serde_json::json!({}))
    } else {
        json_response(
            StatusCode::ACCEPTED,
            serde_json::json!({"job_id": id, "state": "cancelling"}),
        )
    };
    r.headers_mut().insert(
        "x-request-id",
        HeaderValue::from_str(&format!("req_cancel_{id}")).expect("ascii"),
    );
    r
}

/// A workflow-engine call's JSON body, and the run it names (`run`), recorded on that run.
fn workflow_body(
    sim: &Sim,
    headers: &HeaderMap,
    body: &[u8],
    kind: &str,
) -> Result<String, Box<Response>> {
    count_request(sim, headers);
    if !sim.authorized(headers) {
        return Err(Box::new(error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token",
        )));
    }
    if headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| !v.starts_with("application/json"))
    {
        return Err(Box::new(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send a JSON body (Content-Type: application/json)",
        )));
    }
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Err(Box::new(error(StatusCode::BAD_REQUEST, "body is not JSON")));
    };
    let Some(run) = doc.get("run").and_then(|r| r.as_str()).map(str::to_owned) else {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "name the run: {\"run\": \"…\"}",
        )));
    };
    let mut g = sim.inner.lock().expect("sim lock");
    let Some(job) = g.jobs.get_mut(&run) else {
        return Err(Box::new(error(StatusCode::NOT_FOUND, "no such run")));
    };
    job.ledger
        .posted
        .entry(kind.to_owned())
        .or_default()
        .push(doc);
    Ok(run)
}

/// `POST /v2/runs:stop {"run": …, "reason": …}`: a cancel.
async fn workflow_stop(State(sim): State<Sim>, headers: HeaderMap, body: bytes::Bytes) -> Response {
    match workflow_body(&sim, &headers, &body, "stop") {
        Ok(run) => cancel_inner(sim, run, headers, false).await,
        Err(r) => *r,
    }
}

/// `POST /v2/runs:output {"run": …}`: the run's result.
async fn workflow_output(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: bytes::Bytes,
) -> Response {
    match workflow_body(&sim, &headers, &body, "output") {
        Ok(run) => result(State(sim), Path(run), Query(HashMap::new()), headers).await,
        Err(r) => *r,
    }
}

/// `POST /v2/runs:lookup {"request_id": …}`: the runs created under that idempotency key.
async fn workflow_lookup(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: bytes::Bytes,
) -> Response {
    count_request(&sim, &headers);
    if !sim.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    }
    let Some(doc) = serde_json::from_slice::<serde_json::Value>(&body).ok() else {
        return error(StatusCode::BAD_REQUEST, "body is not JSON");
    };
    let Some(key) = doc.get("request_id").and_then(|k| k.as_str()) else {
        return error(StatusCode::BAD_REQUEST, "name the request_id");
    };
    let mut g = sim.inner.lock().expect("sim lock");
    let ids = g.ledger.tokens.get(key).cloned().unwrap_or_default();
    for id in &ids {
        if let Some(j) = g.jobs.get_mut(id) {
            j.touch("lookup", &headers);
            j.ledger
                .posted
                .entry("lookup".into())
                .or_default()
                .push(doc.clone());
        }
    }
    let runs: Vec<serde_json::Value> = ids
        .iter()
        .map(|id| serde_json::json!({"id": id, "request_id": key}))
        .collect();
    json_response(StatusCode::OK, serde_json::json!({ "runs": runs }))
}

/// The result body for a job and its content type.
fn result_doc(id: &str, s: &Script) -> (Vec<u8>, &'static str) {
    if s.format == Format::Csv {
        let mut out = String::from("id,status\n");
        for i in 1..=s.items {
            let bad = s.result == ResultAct::ErrorRows && i % 2 == 0;
            out.push_str(&format!("row_{i},{}\n", if bad { "ERROR" } else { "OK" }));
        }
        return (out.into_bytes(), "text/csv");
    }
    let items: Vec<serde_json::Value> = (1..=s.items)
        .map(|i| {
            let failed = s.result == ResultAct::PartialBatch && i % 2 == 0;
            let item_id = if s.result == ResultAct::SchemaViolation {
                serde_json::json!(i)
            } else {
                serde_json::json!(format!("item_{i}"))
            };
            serde_json::json!({
                "id": item_id,
                "status": if failed { "failed" } else { "ok" },
                "error": if failed { serde_json::json!("upstream timeout") } else { serde_json::Value::Null },
            })
        })
        .collect();
    let mut doc = serde_json::json!({"job_id": id, "items": items});
    if s.result == ResultAct::Oversized {
        doc["padding"] = serde_json::json!("x".repeat(2 * 1024 * 1024));
    }
    (doc.to_string().into_bytes(), "application/json")
}

/// Counts a result download out when its answer is done, even if the client went away.
struct ResultInFlight(Sim);

impl Drop for ResultInFlight {
    fn drop(&mut self) {
        if let Ok(mut g) = self.0.inner.lock() {
            g.results_in_flight = g.results_in_flight.saturating_sub(1);
        }
    }
}

async fn result(
    State(sim): State<Sim>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    count_request(&sim, &headers);
    if !sim.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    }
    let (script, state, request) = {
        let mut g = sim.inner.lock().expect("sim lock");
        let Some(job) = g.jobs.get_mut(&id) else {
            return error(StatusCode::NOT_FOUND, "no such job");
        };
        job.touch("result", &headers);
        job.result_calls += 1;
        if job.result_calls <= job.script.result_throttled {
            let mut r = error(StatusCode::TOO_MANY_REQUESTS, "downloads are rate limited");
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
            return r;
        }
        if job.result_calls <= job.script.result_throttled + job.script.result_forbidden {
            return error(StatusCode::FORBIDDEN, "request signature expired");
        }
        let expired = job.script.result_urls_expired;
        if expired > 0
            && q.get("sig")
                .and_then(|n| n.parse::<u32>().ok())
                .is_none_or(|n| n <= expired)
        {
            return error(StatusCode::FORBIDDEN, "Request has expired");
        }
        let taken = (
            job.script.clone(),
            job.phase(Instant::now()).0,
            job.request.clone(),
        );
        g.results_in_flight += 1;
        g.ledger.max_results_in_flight = g.ledger.max_results_in_flight.max(g.results_in_flight);
        taken
    };
    let _downloading = ResultInFlight(sim.clone());
    if script.result_delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(script.result_delay_ms)).await;
    }
    match script.result {
        ResultAct::Fails => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "result store unavailable",
            );
        }
        ResultAct::Gone => return error(StatusCode::NOT_FOUND, "result expired"),
        ResultAct::GoneEcho => {
            let auth = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            return error(
                StatusCode::NOT_FOUND,
                &format!("no result for {auth}; the job was {request}"),
            );
        }
        _ => {}
    }
    if state != "succeeded" {
        return error(StatusCode::CONFLICT, &format!("job is {state}, no result"));
    }
    let (mut body, content_type) = result_doc(&id, &script);
    if script.result == ResultAct::EchoRequest {
        let mut doc: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        doc["request"] = request;
        body = doc.to_string().into_bytes();
    }
    let digest = if script.result == ResultAct::BadChecksum {
        hex::encode(Sha256::digest(b"something else"))
    } else {
        hex::encode(Sha256::digest(&body))
    };
    let content_type = if script.result == ResultAct::WrongContentType {
        "text/html"
    } else {
        content_type
    };
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        "x-checksum-sha256",
        HeaderValue::from_str(&digest).expect("hex"),
    );
    h.insert(
        "x-request-id",
        HeaderValue::from_str(&format!("req_result_{id}")).expect("ascii"),
    );
    r
}

async fn lookup(
    State(sim): State<Sim>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    count_request(&sim, &headers);
    if !sim.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    }
    let Some(reference) = q.get("client_reference") else {
        return error(StatusCode::BAD_REQUEST, "client_reference is required");
    };
    let mut g = sim.inner.lock().expect("sim lock");
    let now = Instant::now();
    let mut found: Vec<(&Instant, serde_json::Value)> = Vec::new();
    for job in g.jobs.values() {
        if job.ledger.client_reference.as_deref() == Some(reference.as_str()) {
            found.push((
                &job.created,
                serde_json::json!({"job_id": job.id, "state": job.phase(now).0, "client_reference": reference}),
            ));
        }
    }
    found.sort_by_key(|(c, _)| **c);
    let jobs: Vec<serde_json::Value> = found.into_iter().map(|(_, j)| j).collect();
    let ids: Vec<String> = jobs
        .iter()
        .filter_map(|j| j["job_id"].as_str().map(str::to_owned))
        .collect();
    let mut throttled = false;
    for id in ids {
        if let Some(j) = g.jobs.get_mut(&id) {
            j.touch("lookup", &headers);
            throttled |= j.ledger.calls["lookup"] <= j.script.lookup_throttled;
        }
    }
    if throttled {
        let at = g.started.elapsed().as_millis() as u64;
        g.ledger.throttled_ms.push(at);
        let mut r = error(StatusCode::TOO_MANY_REQUESTS, "lookups are rate limited");
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
        return r;
    }
    json_response(StatusCode::OK, serde_json::json!({ "jobs": jobs }))
}

async fn ledger(State(sim): State<Sim>) -> Response {
    json_response(
        StatusCode::OK,
        serde_json::to_value(sim.ledger()).unwrap_or_default(),
    )
}
