//! Model-based test: random interleavings of what goes wrong in production — a send, an answer lost
//! after the provider acted, a worker killed, a worker paused past its lease while another claims,
//! a cancel request, time passing, the provider answering — against a model provider that keeps the
//! truth, with the real worker code, the real PostgreSQL store and real HTTP in between.
//!
//! After every run the record must not contradict the model:
//! * never `withdrawn` or `not_created` while a remote job exists for the token;
//! * never `succeeded` without the provider's success and a stored result with the provider's bytes;
//! * never `cancelled` without the provider having reported the job cancelled;
//! * never more than one job per operation, whether the contract has idempotency tokens (an
//!   ambiguous create is sent again under the same token) or not (it is looked up by its client
//!   reference, never sent again); half the cases run each contract;
//! * no status read earlier than the last `Retry-After` the provider gave for that job — unless
//!   the worker it was given to had its lease taken away meanwhile (a pause past the lease): a new
//!   owner that claimed before that answer was written cannot know it. jobtrail keeps such a
//!   `Retry-After` even though the write it came with is refused (the store's tests show it), which
//!   narrows the window to the claims made before that; the count of these reads is printed.
//!
//! Each case is a seeded sequence (`JOBTRAIL_MODEL_CASES` runs more; a failure names its seed).

use axum::extract::{Path, Query, State as AxState};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use jobtrail_core::{CancelRequest, OperationId, State, Submission, SubmitLimits};
use jobtrail_provider::{HttpProvider, Registry};
use jobtrail_store::Store;
use jobtrail_store::testing::TestDb;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sha2::Digest;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

const RESULT: &[u8] = br#"{"items":[{"id":"a"},{"id":"b"}]}"#;

/// What the harness lets a request do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// The provider acts and answers.
    Answer,
    /// The provider acts, and the answer is lost (the connection drops).
    Lose,
    /// The provider does nothing and says "not now".
    Refuse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Create,
    Status,
    Cancel,
    Result,
    Lookup,
}

struct Arrived {
    worker: usize,
    kind: Kind,
    reply: oneshot::Sender<Fate>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobState {
    Running,
    Succeeded,
    Cancelled,
}

#[derive(Debug)]
struct Job {
    state: JobState,
    polls_left: u32,
    cancel_asked: bool,
    reported_cancelled: bool,
    reported_succeeded: bool,
    not_before: Option<Instant>,
    /// Who was told `not_before`: the worker and when its run began.
    told: Option<(usize, Instant)>,
}

#[derive(Default)]
struct Model {
    jobs: HashMap<String, Job>,
    by_token: HashMap<String, Vec<String>>,
    by_reference: HashMap<String, Vec<String>>,
    next: u64,
    early_polls: Vec<String>,
    /// Early reads after a `Retry-After` told to a worker that lost its lease meanwhile.
    excused: u32,
    /// When each worker's current run began, and when the harness last took its lease away.
    run_started: HashMap<usize, Instant>,
    lease_taken: HashMap<usize, Instant>,
    seed: u64,
}

impl Model {
    /// Whether the `Retry-After` of `job` was told to a worker whose lease was taken after its run
    /// began (so the fleet may not have learnt it before another worker claimed).
    fn told_to_a_stale_worker(&self, job: &Job) -> bool {
        job.told.is_some_and(|(w, began)| {
            self.lease_taken
                .get(&w)
                .is_some_and(|taken| *taken >= began)
        })
    }
}

#[derive(Clone)]
struct Shared {
    model: Arc<Mutex<Model>>,
    queue: mpsc::UnboundedSender<Arrived>,
}

impl Shared {
    /// Report the request to the harness and wait for its fate. A harness that let go of it (the
    /// worker was killed and the request dropped) means nothing was done.
    async fn fate(&self, worker: usize, kind: Kind) -> Fate {
        let (reply, fate) = oneshot::channel();
        let _ = self.queue.send(Arrived {
            worker,
            kind,
            reply,
        });
        fate.await.unwrap_or(Fate::Refuse)
    }
}

fn json(status: StatusCode, v: serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn not_now() -> Response {
    let mut r = json(
        StatusCode::SERVICE_UNAVAILABLE,
        serde_json::json!({"error": "busy"}),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("0"));
    r
}

fn lose() -> ! {
    std::panic::resume_unwind(Box::new("model: dropping the answer on purpose"))
}

fn worker_of(w: &str) -> usize {
    w.trim_start_matches('w').parse().unwrap_or(0)
}

async fn create(
    AxState(s): AxState<Shared>,
    Path(w): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let fate = s.fate(worker_of(&w), Kind::Create).await;
    if fate == Fate::Refuse {
        return not_now();
    }
    let token = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let reference = doc["client_reference"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let id = {
        let mut m = s.model.lock().unwrap();
        // Without a token (the lookup contract) every create makes a job: a resend would show.
        let known = Some(&token)
            .filter(|t| !t.is_empty())
            .and_then(|t| m.by_token.get(t))
            .and_then(|j| j.first())
            .cloned();
        match known {
            Some(existing) => existing,
            None => {
                m.next += 1;
                let id = format!("mjob_{}", m.next);
                let polls = (m.seed.wrapping_mul(m.next) % 3) as u32;
                m.jobs.insert(
                    id.clone(),
                    Job {
                        state: JobState::Running,
                        polls_left: polls,
                        cancel_asked: false,
                        reported_cancelled: false,
                        reported_succeeded: false,
                        not_before: None,
                        told: None,
                    },
                );
                m.by_token.entry(token).or_default().push(id.clone());
                m.by_reference
                    .entry(reference)
                    .or_default()
                    .push(id.clone());
                id
            }
        }
    };
    if fate == Fate::Lose {
        lose();
    }
    json(
        StatusCode::ACCEPTED,
        serde_json::json!({"job_id": id, "state": "running"}),
    )
}

async fn status(AxState(s): AxState<Shared>, Path((w, id)): Path<(String, String)>) -> Response {
    {
        // A poll before the last Retry-After is counted when it arrives, whatever happens next.
        let mut m = s.model.lock().unwrap();
        if let Some(job) = m.jobs.get(&id)
            && job
                .not_before
                .is_some_and(|nb| Instant::now() + Duration::from_millis(15) < nb)
        {
            if m.told_to_a_stale_worker(job) {
                m.excused += 1;
            } else {
                m.early_polls.push(id.clone());
            }
        }
    }
    let fate = s.fate(worker_of(&w), Kind::Status).await;
    if fate == Fate::Refuse {
        return not_now();
    }
    let (state, retry_after) = {
        let mut m = s.model.lock().unwrap();
        // A quarter of the cases ask for a pause between reads.
        let asks_pause = m.seed % 4 == 3;
        let run = m.run_started.get(&worker_of(&w)).copied();
        let Some(job) = m.jobs.get_mut(&id) else {
            return json(
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": "no such job"}),
            );
        };
        if job.state == JobState::Running {
            if job.cancel_asked {
                job.state = JobState::Cancelled;
            } else if job.polls_left == 0 {
                job.state = JobState::Succeeded;
            } else {
                job.polls_left -= 1;
            }
        }
        let told = fate == Fate::Answer;
        let state = match job.state {
            JobState::Running => "running",
            JobState::Succeeded => {
                job.reported_succeeded |= told;
                "succeeded"
            }
            JobState::Cancelled => {
                job.reported_cancelled |= told;
                "cancelled"
            }
        };
        let retry_after = told && asks_pause && job.state == JobState::Running;
        if retry_after {
            job.not_before = Some(Instant::now() + Duration::from_secs(1));
            job.told = run.map(|began| (worker_of(&w), began));
        }
        (state, retry_after)
    };
    if fate == Fate::Lose {
        lose();
    }
    let mut r = json(
        StatusCode::OK,
        serde_json::json!({"job_id": id, "state": state}),
    );
    if retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

async fn cancel(AxState(s): AxState<Shared>, Path((w, id)): Path<(String, String)>) -> Response {
    let fate = s.fate(worker_of(&w), Kind::Cancel).await;
    if fate == Fate::Refuse {
        return not_now();
    }
    let finished = {
        let mut m = s.model.lock().unwrap();
        match m.jobs.get_mut(&id) {
            Some(j) if j.state == JobState::Running => {
                j.cancel_asked = true;
                false
            }
            _ => true,
        }
    };
    if fate == Fate::Lose {
        lose();
    }
    if finished {
        json(
            StatusCode::CONFLICT,
            serde_json::json!({"error": "job already finished"}),
        )
    } else {
        json(StatusCode::ACCEPTED, serde_json::json!({"job_id": id}))
    }
}

async fn result(AxState(s): AxState<Shared>, Path((w, _id)): Path<(String, String)>) -> Response {
    let fate = s.fate(worker_of(&w), Kind::Result).await;
    match fate {
        Fate::Refuse => not_now(),
        Fate::Lose => lose(),
        Fate::Answer => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            RESULT,
        )
            .into_response(),
    }
}

async fn lookup(
    AxState(s): AxState<Shared>,
    Path(w): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let fate = s.fate(worker_of(&w), Kind::Lookup).await;
    if fate == Fate::Refuse {
        return not_now();
    }
    let reference = q.get("client_reference").map(String::as_str).unwrap_or("");
    let jobs: Vec<serde_json::Value> = {
        let m = s.model.lock().unwrap();
        m.by_reference
            .get(reference)
            .into_iter()
            .flatten()
            .map(|id| serde_json::json!({"job_id": id, "client_reference": reference}))
            .collect()
    };
    if fate == Fate::Lose {
        lose();
    }
    json(StatusCode::OK, serde_json::json!({"jobs": jobs}))
}

const CONTRACT: &str = r#"
name = "model"
base_url = "http://127.0.0.1:1"
[timeouts]
connect_ms = 1000
request_ms = 4000
[create]
path = "/v1/jobs"
idempotency = "header"
idempotency_header = "Idempotency-Key"
client_reference_field = "/client_reference"
job_id = "body:/job_id"
initial_state = "body:/state"
[status]
url = "/v1/jobs/{job_id}"
state = "/state"
[status.states]
running = ["running"]
succeeded = ["succeeded"]
failed = ["failed"]
cancelled = ["cancelled"]
[polling]
initial_ms = 20
factor = 2.0
cap_ms = 200
jitter = 0.2
retry_after_min_ms = 10
retry_after_max_ms = 5000
max_failures = 50
[deadlines]
create_ms = 60000
result_ms = 600000
[cancel]
path = "/v1/jobs/{job_id}/cancel"
idempotent = true
window_ms = 60000
[result]
url = "/v1/jobs/{job_id}/result"
content_type = "application/json"
[reconcile]
method = "resend"
lookup_url = "/v1/jobs?client_reference={client_reference}"
lookup_jobs = "/jobs"
lookup_job_id = "/job_id"
lookup_reference = "/client_reference"
interval_ms = 10
"#;

/// The same provider without idempotency tokens: an ambiguous create is settled only by looking
/// the job up by its client reference, never by sending it again.
fn contract_text(provider: &str) -> String {
    if provider == LOOKUP {
        CONTRACT
            .replace("name = \"model\"", &format!("name = \"{LOOKUP}\""))
            .replace(
                "idempotency = \"header\"\nidempotency_header = \"Idempotency-Key\"",
                "idempotency = \"none\"",
            )
            .replace("method = \"resend\"", "method = \"lookup\"")
    } else {
        CONTRACT.to_owned()
    }
}

const LOOKUP: &str = "model-lookup";

const WORKERS: usize = 3;

struct Harness {
    store: Store,
    url: String,
    shared: Shared,
    queue: mpsc::UnboundedReceiver<Arrived>,
    workers: Vec<jobtrail_worker::Worker>,
    registry: Registry,
    _db: TestDb,
}

impl Harness {
    async fn new() -> Self {
        jobtrail_provider::install_crypto();
        let db = TestDb::new().await;
        let store = db.store().await;
        let (tx, queue) = mpsc::unbounded_channel();
        let shared = Shared {
            model: Arc::default(),
            queue: tx,
        };
        let app = axum::Router::new()
            .route("/{w}/v1/jobs", post(create).get(lookup))
            .route("/{w}/v1/jobs/{id}", get(status))
            .route("/{w}/v1/jobs/{id}/cancel", post(cancel))
            .route("/{w}/v1/jobs/{id}/result", get(result))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let contract_for = |provider: &str, w: usize| {
            let text = contract_text(provider);
            assert!(text.contains(provider) && text.contains("reconcile"));
            let mut c = jobtrail_provider::Contract::parse(
                &text,
                std::path::Path::new(&format!("{provider}.toml")),
            )
            .unwrap();
            c.base_url = url::Url::parse(&format!("http://{addr}/w{w}")).unwrap();
            c
        };
        let registry_for = |w: usize| {
            let mut r = Registry::default();
            for provider in ["model", LOOKUP] {
                r.insert(Arc::new(
                    HttpProvider::new(contract_for(provider, w)).unwrap(),
                ));
            }
            r
        };
        let registry = registry_for(0);
        let workers = (0..WORKERS)
            .map(|w| {
                let r = registry_for(w);
                let mut config = jobtrail_worker::WorkerConfig::named_default();
                config.id = format!("w{w}");
                config.lease = Duration::from_secs(20);
                config.batch = 4;
                jobtrail_worker::Worker::new(
                    store.clone(),
                    r,
                    jobtrail_worker::ResultStore::Database,
                    config,
                )
            })
            .collect();
        Self {
            url: db.url.clone(),
            store,
            shared,
            queue,
            workers,
            registry,
            _db: db,
        }
    }

    async fn sql(&self, q: &'static str, id: OperationId) {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&self.url).await.unwrap();
        sqlx::query(q)
            .bind(id.as_uuid())
            .execute(&mut c)
            .await
            .unwrap();
    }

    /// Start worker `w`'s run (one claim and what follows).
    fn start(&self, w: usize) -> Running {
        self.shared
            .model
            .lock()
            .unwrap()
            .run_started
            .insert(w, Instant::now());
        let worker = self.workers[w].clone();
        Running {
            task: tokio::spawn(async move {
                let _ = worker.run_once().await;
            }),
            paused: false,
        }
    }

    /// Time passes for leases: every lease of the operation has expired, and it is due now (a
    /// Retry-After is still the worker's to honour: the row remembers it). The model learns whose
    /// lease was taken.
    async fn time_passes(&self, id: OperationId) -> Option<usize> {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&self.url).await.unwrap();
        let mut tx = c.begin().await.unwrap();
        let owner: Option<String> =
            sqlx::query_scalar("SELECT lease_owner FROM operations WHERE id = $1 FOR UPDATE")
                .bind(id.as_uuid())
                .fetch_one(&mut *tx)
                .await
                .unwrap();
        sqlx::query(
            "UPDATE operations SET lease_expires_at = CASE WHEN lease_owner IS NULL THEN NULL \
             ELSE now() - interval '1 millisecond' END, next_action_at = least(next_action_at, now()) \
             WHERE id = $1",
        )
        .bind(id.as_uuid())
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        let owner = owner.map(|w| worker_of(&w));
        if let Some(w) = owner {
            self.shared
                .model
                .lock()
                .unwrap()
                .lease_taken
                .insert(w, Instant::now());
        }
        owner
    }

    async fn create_deadline_passes(&self, id: OperationId) {
        self.sql(
            "UPDATE operations SET create_deadline = greatest(created_at + interval '1 millisecond', now()) \
             WHERE id = $1",
            id,
        )
        .await;
    }
}

struct Running {
    task: tokio::task::JoinHandle<()>,
    paused: bool,
}

/// Settle every request worker `w` has pending: the provider acted on it (`acted`: answered, or
/// answered into a lost connection) or never got it, at random.
fn settle_pending(
    w: usize,
    acted: Fate,
    why: &str,
    pending: &mut Vec<Arrived>,
    rng: &mut StdRng,
    log: &mut Vec<String>,
) {
    let mut keep = Vec::new();
    for a in pending.drain(..) {
        if a.worker == w {
            let fate = if rng.random_bool(0.5) {
                acted
            } else {
                Fate::Refuse
            };
            log.push(format!("{why} w{w}: its {:?} -> {fate:?}", a.kind));
            let _ = a.reply.send(fate);
        } else {
            keep.push(a);
        }
    }
    *pending = keep;
}

/// A lease runs out only after the request timeout its worker sent under it: by then the provider
/// has acted on that worker's requests or never got them, and the answers are lost either way.
fn expire(
    owner: Option<usize>,
    pending: &mut Vec<Arrived>,
    rng: &mut StdRng,
    log: &mut Vec<String>,
) {
    if let Some(w) = owner {
        settle_pending(w, Fate::Lose, "lease ran out of", pending, rng, log);
    }
}

/// One seeded interleaving, then a calm settle; returns the operation and what went on.
async fn run_case(h: &mut Harness, seed: u64) -> (OperationId, Vec<String>) {
    let mut rng = StdRng::seed_from_u64(seed);
    h.shared.model.lock().unwrap().seed = seed;
    let s = Submission {
        provider: if seed % 2 == 1 { LOOKUP } else { "model" }.into(),
        target: "t".into(),
        body: serde_json::to_vec(&serde_json::json!({"n": seed})).unwrap(),
        caller: "model-test".into(),
        approved_by: "tester".into(),
        ..Default::default()
    };
    let op = h
        .store
        .submit_new(&s, &h.registry.terms(), SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    let id = op.id;
    let mut log = Vec::new();
    let mut running: Vec<Option<Running>> = (0..WORKERS).map(|_| None).collect();
    let mut pending: Vec<Arrived> = Vec::new();
    let mut cancelled = false;
    let mut deadline_passed = false;
    for _ in 0..rng.random_range(8..30) {
        while let Ok(a) = h.queue.try_recv() {
            pending.push(a);
        }
        for r in running.iter_mut() {
            if r.as_ref().is_some_and(|r| r.task.is_finished()) {
                *r = None;
            }
        }
        match rng.random_range(0..10) {
            0..=2 => {
                let w = rng.random_range(0..WORKERS);
                if running[w].is_none() {
                    running[w] = Some(h.start(w));
                    log.push(format!("start w{w}"));
                }
            }
            3..=5 => {
                let live: Vec<usize> = (0..pending.len())
                    .filter(|i| {
                        !running[pending[*i].worker]
                            .as_ref()
                            .is_some_and(|r| r.paused)
                    })
                    .collect();
                if !live.is_empty() {
                    let a = pending.remove(live[rng.random_range(0..live.len())]);
                    let fate = match rng.random_range(0..10) {
                        0..=6 => Fate::Answer,
                        7..=8 => Fate::Lose,
                        _ => Fate::Refuse,
                    };
                    log.push(format!("w{} {:?} -> {fate:?}", a.worker, a.kind));
                    let _ = a.reply.send(fate);
                }
            }
            6 => {
                let w = rng.random_range(0..WORKERS);
                if let Some(r) = running[w].take() {
                    r.task.abort();
                    // What the killed worker had sent: the provider acted on it, or never got it.
                    settle_pending(w, Fate::Answer, "kill", &mut pending, &mut rng, &mut log);
                    log.push(format!("killed w{w}"));
                }
            }
            7 => {
                let w = rng.random_range(0..WORKERS);
                if let Some(r) = running[w].as_mut() {
                    r.paused = !r.paused;
                    if r.paused {
                        let owner = h.time_passes(id).await;
                        expire(owner, &mut pending, &mut rng, &mut log);
                    }
                    log.push(format!("w{w} paused={}", r.paused));
                }
            }
            8 => {
                if !cancelled {
                    cancelled = true;
                    let r = h
                        .store
                        .request_cancel(id, CancelRequest::new("agent", "changed my mind").unwrap())
                        .await;
                    log.push(format!("cancel requested: {:?}", r.map(|a| a.record.state)));
                } else {
                    let owner = h.time_passes(id).await;
                    expire(owner, &mut pending, &mut rng, &mut log);
                    log.push("time passes".into());
                }
            }
            _ => {
                if !deadline_passed && rng.random_bool(0.3) {
                    deadline_passed = true;
                    h.create_deadline_passes(id).await;
                    log.push("create deadline passes".into());
                } else {
                    let owner = h.time_passes(id).await;
                    expire(owner, &mut pending, &mut rng, &mut log);
                    log.push("time passes".into());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    // Settle: paused workers resume, everything is answered, time passes until the operation rests.
    for r in running.iter_mut().flatten() {
        r.paused = false;
    }
    for round in 0..200 {
        while let Ok(a) = h.queue.try_recv() {
            pending.push(a);
        }
        for a in pending.drain(..) {
            let _ = a.reply.send(Fate::Answer);
        }
        let rec = h.store.get(id).await.unwrap();
        let all_idle = running
            .iter()
            .all(|r| r.as_ref().is_none_or(|r| r.task.is_finished()));
        if (rec.state.is_terminal() || rec.state.needs_human()) && all_idle {
            break;
        }
        assert!(round < 199, "seed {seed}: never settled; {rec:?}\n{log:#?}");
        for (w, r) in running.iter_mut().enumerate() {
            if r.as_ref().is_none_or(|r| r.task.is_finished()) && w == round % WORKERS {
                *r = Some(h.start(w));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        if round % 5 == 4 {
            h.time_passes(id).await;
        }
        // Without a token, a create nobody can find is settled only by its deadline (a person
        // decides): let it pass once the interleaving is over.
        if round == 20 && s.provider == LOOKUP && !deadline_passed {
            deadline_passed = true;
            h.create_deadline_passes(id).await;
            log.push("settle: create deadline passes".into());
        }
    }
    (id, log)
}

async fn check(h: &Harness, id: OperationId, seed: u64, log: &[String]) {
    let rec = h.store.get(id).await.unwrap();
    // The harness moves the create deadline on the row to let it pass (no clock to wind), which
    // `verify` rightly names: that one break is the harness's own.
    let moved_by_harness = log.iter().any(|l| l.ends_with("create deadline passes"));
    let breaks: Vec<_> = h
        .store
        .verify_operation(id)
        .await
        .unwrap()
        .breaks
        .into_iter()
        .filter(|b| {
            !(moved_by_harness
                && b.problem
                    == "the operation's create_deadline differs from what its history records")
        })
        .collect();
    assert!(
        breaks.is_empty(),
        "seed {seed}: the chain does not verify: {breaks:#?}\n{log:#?}"
    );
    let m = h.shared.model.lock().unwrap();
    // Every job the model made for this operation, under any token or none: a create sent again
    // under another token, or without one, would show here as a second job.
    let jobs = m
        .by_reference
        .get(&rec.id.to_string())
        .cloned()
        .unwrap_or_default();
    let ctx = || format!("seed {seed}: {} with jobs {jobs:?}\n{log:#?}", rec.state);
    assert!(jobs.len() <= 1, "two jobs for one operation: {}", ctx());
    if rec.provider == "model" {
        let by_token = m
            .by_token
            .get(rec.token.as_str())
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            by_token,
            jobs,
            "a job made without the operation's token: {}",
            ctx()
        );
    }
    if matches!(rec.state, State::Withdrawn | State::NotCreated) {
        assert!(jobs.is_empty(), "a job exists: {}", ctx());
    }
    let job = jobs.first().map(|j| &m.jobs[j]);
    if rec.state == State::Succeeded {
        let job = job.unwrap_or_else(|| panic!("no job: {}", ctx()));
        assert_eq!(job.state, JobState::Succeeded, "{}", ctx());
        assert!(job.reported_succeeded, "{}", ctx());
        assert_eq!(
            rec.result_sha256.as_deref(),
            Some(hex::encode(sha2::Sha256::digest(RESULT)).as_str()),
            "{}",
            ctx()
        );
    }
    if rec.state == State::Cancelled {
        let job = job.unwrap_or_else(|| panic!("no job: {}", ctx()));
        assert!(
            job.reported_cancelled && job.state == JobState::Cancelled,
            "cancelled without the provider's confirmation: {}",
            ctx()
        );
    }
    if let Some(j) = &rec.remote_job_id {
        assert!(
            jobs.contains(j),
            "a job id the provider never gave: {}",
            ctx()
        );
    }
    assert!(
        m.early_polls.iter().all(|j| !jobs.contains(j)),
        "a status read before the provider's Retry-After: {}",
        ctx()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_interleavings_never_make_the_record_lie() {
    let cases: u64 = std::env::var("JOBTRAIL_MODEL_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(30);
    let mut h = Harness::new().await;
    let mut ends: BTreeMap<String, u32> = BTreeMap::new();
    for seed in 0..cases {
        let (id, log) = tokio::time::timeout(Duration::from_secs(60), run_case(&mut h, seed))
            .await
            .unwrap_or_else(|_| panic!("seed {seed} took over a minute"));
        check(&h, id, seed, &log).await;
        let state = h.store.get(id).await.unwrap().state;
        *ends.entry(state.to_string()).or_default() += 1;
    }
    // The interleavings reach the interesting endings, not only the happy one.
    eprintln!(
        "endings over {cases} cases: {ends:?}; status reads before a Retry-After told to a worker \
         that had lost its lease: {}",
        h.shared.model.lock().unwrap().excused
    );
    assert!(ends.len() >= 3, "{ends:?}");
    assert!(ends.contains_key("succeeded"), "{ends:?}");
    assert!(
        ["cancelled", "withdrawn", "not_created"]
            .iter()
            .any(|e| ends.contains_key(*e)),
        "no case ended by a cancel or a create never made: {ends:?}"
    );
}
