//! Shared harness for the end-to-end tests: a fresh database, the simulated provider on a loopback
//! port, the shipped contracts pointed at it, in-process workers and real worker processes.
#![allow(dead_code)]

use jobtrail_core::{OperationId, State, Submission, SubmitLimits};
use jobtrail_provider::{HttpProvider, Registry};
use jobtrail_store::testing::TestDb;
use jobtrail_store::{OperationRecord, Store};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const TOKEN: &str = "sim-bearer-Zq8v-DO-NOT-LEAK";

/// Run a jobtrail binary against database `url` with the contracts in `providers`, feeding `stdin`
/// (or nothing), and wait for it.
pub fn run_bin(
    bin: &Path,
    url: &str,
    providers: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> std::process::Output {
    run_bin_with(bin, url, providers, args, stdin, &[])
}

/// As [`run_bin`], with more environment variables set for the process.
pub fn run_bin_with(
    bin: &Path,
    url: &str,
    providers: &Path,
    args: &[&str],
    stdin: Option<&str>,
    env: &[(&str, &str)],
) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(bin)
        .args(args)
        .env("DATABASE_URL", url)
        .env("JOBTRAIL_PROVIDERS", providers)
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a jobtrail binary");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(text.as_bytes())
            .expect("write stdin");
    }
    child
        .wait_with_output()
        .expect("wait for a jobtrail binary")
}

pub fn providers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../providers")
}

pub struct Env {
    pub url: String,
    _db: Option<TestDb>,
    pub store: Store,
    pub sim: jobtrail_sim::Running,
    pub registry: Registry,
    pub dir: PathBuf,
    /// Where in-process workers keep results (the database unless a test says otherwise).
    pub results: jobtrail_worker::ResultStore,
    /// The contracts directory servers and processes of this environment load.
    pub providers: PathBuf,
    workers: Vec<(
        tokio_util::sync::CancellationToken,
        tokio::task::JoinHandle<()>,
    )>,
}

impl Env {
    pub async fn new() -> Self {
        let db = TestDb::new().await;
        let url = db.url.clone();
        Self::on(url, Some(db)).await
    }

    /// An environment whose in-process workers use contracts changed by `tweak`.
    pub async fn with_contracts(tweak: impl Fn(&mut jobtrail_provider::Contract)) -> Self {
        let db = TestDb::new().await;
        let url = db.url.clone();
        Self::build(url, Some(db), &tweak).await
    }

    /// An environment on a database of the caller's (already migrated).
    pub async fn on(url: String, db: Option<TestDb>) -> Self {
        Self::build(url, db, &|_| {}).await
    }

    /// An environment whose contracts (for in-process workers and for servers started with
    /// [`Env::providers`]) are the shipped ones with text replaced: `(file, from, to)`.
    pub async fn with_edited_contracts(edits: &[(&str, &str, &str)]) -> Self {
        Self::with_contract_files(edits, &[]).await
    }

    /// The shipped contracts with `edits` (as [`Env::with_edited_contracts`]), and more contract
    /// files beside them: `(file name, text)`.
    pub async fn with_contract_files(edits: &[(&str, &str, &str)], extra: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "jobtrail-providers-{}",
            uuid::Uuid::now_v7().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(providers_dir()).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                let to = dir.join(e.file_name());
                std::fs::create_dir_all(&to).unwrap();
                for f in std::fs::read_dir(&path).unwrap().flatten() {
                    std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
                }
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let mut text = std::fs::read_to_string(&path).unwrap();
            for (file, from, to) in edits {
                if *file == name {
                    assert!(text.contains(from), "{name} has no {from:?}");
                    text = text.replacen(from, to, 1);
                }
            }
            std::fs::write(dir.join(&name), text).unwrap();
        }
        for (name, text) in extra {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let db = TestDb::new().await;
        let url = db.url.clone();
        let mut env = Self::build_from(url, Some(db), &|_| {}, dir.clone()).await;
        env.providers = dir;
        env
    }

    async fn build(
        url: String,
        db: Option<TestDb>,
        tweak: &dyn Fn(&mut jobtrail_provider::Contract),
    ) -> Self {
        Self::build_from(url, db, tweak, providers_dir()).await
    }

    async fn build_from(
        url: String,
        db: Option<TestDb>,
        tweak: &dyn Fn(&mut jobtrail_provider::Contract),
        providers: PathBuf,
    ) -> Self {
        let store = Store::connect(&url).await.unwrap();
        let sim = jobtrail_sim::Sim::new(jobtrail_sim::Config {
            bearer_token: Some(TOKEN.into()),
            webhook: None,
            ..Default::default()
        })
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
        let dir =
            std::env::temp_dir().join(format!("jobtrail-e2e-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        // In-process workers read the token from a file: no process-wide environment changes.
        let secret_file = dir.join("sim-token");
        std::fs::write(&secret_file, TOKEN).unwrap();
        let mut registry = Registry::default();
        for (_, mut c) in jobtrail_provider::contract::load_dir(&providers).unwrap() {
            // The simulator's address, the contract's path (an API version, say).
            let path = c.base_url.path().to_owned();
            c.base_url = url::Url::parse(&sim.base_url()).unwrap();
            c.base_url.set_path(&path);
            if let Some(a) = c.auth.as_mut() {
                a.secret = jobtrail_core::SecretRef::File(secret_file.display().to_string());
            }
            tweak(&mut c);
            registry.insert(Arc::new(HttpProvider::new(c).unwrap()));
        }
        Self {
            url,
            _db: db,
            store,
            sim,
            registry,
            dir,
            results: jobtrail_worker::ResultStore::Database,
            workers: Vec::new(),
            providers,
        }
    }

    /// The test database (for logins as jobtrail's roles).
    pub fn db(&self) -> &TestDb {
        self._db
            .as_ref()
            .expect("an environment on its own test database")
    }

    /// Submit an operation whose body carries a simulator script.
    pub async fn submit(
        &self,
        provider: &str,
        script: serde_json::Value,
        tweak: impl FnOnce(&mut Submission),
    ) -> OperationRecord {
        let body = serde_json::json!({"report": "usage", "sim": script});
        let mut s = Submission {
            provider: provider.into(),
            target: "reports".into(),
            body: serde_json::to_vec(&body).unwrap(),
            caller: "e2e".into(),
            approved_by: "tester".into(),
            ..Default::default()
        };
        tweak(&mut s);
        self.store
            .submit_new(&s, &self.registry.terms(), SubmitLimits::default())
            .await
            .unwrap()
            .operation
    }

    /// Start an in-process worker (the real worker loop) with a short lease.
    pub fn start_worker(&mut self, id: &str, lease: Duration) {
        self.start_worker_idle(id, lease, Duration::from_millis(50));
    }

    /// An in-process worker that scans for due work only every `idle` (notifications aside).
    pub fn start_worker_idle(&mut self, id: &str, lease: Duration, idle: Duration) {
        let mut config = jobtrail_worker::WorkerConfig::named_default();
        config.id = id.into();
        config.lease = lease;
        config.idle = idle;
        let w = jobtrail_worker::Worker::new(
            self.store.clone(),
            self.registry.clone(),
            self.results.clone(),
            config,
        );
        let stop = tokio_util::sync::CancellationToken::new();
        let s = stop.clone();
        let h = tokio::spawn(async move {
            w.run(s).await;
        });
        self.workers.push((stop, h));
    }

    pub async fn stop_workers(&mut self) {
        for (s, h) in self.workers.drain(..) {
            s.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(30), h).await;
        }
    }

    /// Start a real worker process.
    pub fn spawn_worker(&self, id: &str, lease: &str, extra_env: &[(&str, &str)]) -> WorkerProcess {
        let log = self.dir.join(format!("{id}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_jobtrail"));
        cmd.args(["worker", "--id", id, "--lease", lease, "--idle", "50ms"])
            .env("DATABASE_URL", &self.url)
            .env("JOBTRAIL_PROVIDERS", &self.providers)
            .env("JOBTRAIL_SIM_TOKEN", TOKEN)
            .env("JOBTRAIL_PROVIDER_SIM_BASE_URL", self.sim.base_url())
            .env("JOBTRAIL_PROVIDER_SIM_CSV_BASE_URL", self.sim.base_url())
            .env("JOBTRAIL_PROVIDER_SIM_LEGACY_BASE_URL", self.sim.base_url())
            .env("JOBTRAIL_LOG", "debug")
            .env_remove("JOBTRAIL_FAULT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        WorkerProcess {
            child: cmd.spawn().expect("spawn the jobtrail binary"),
            log,
            id: id.into(),
        }
    }

    /// Wait (bounded) until `pred` holds for the operation.
    pub async fn wait_for(
        &self,
        id: OperationId,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&OperationRecord) -> bool,
    ) -> OperationRecord {
        let deadline = Instant::now() + timeout;
        loop {
            let op = self.store.get(id).await.unwrap();
            if pred(&op) {
                return op;
            }
            if Instant::now() >= deadline {
                let story = jobtrail_console::timeline::render(
                    &op,
                    &self.store.history(id).await.unwrap(),
                    &self.store.calls(id).await.unwrap(),
                );
                panic!(
                    "timed out waiting for {what}; operation is {}\n{story}\n{}",
                    op.state,
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub async fn wait_settled(&self, id: OperationId, timeout: Duration) -> OperationRecord {
        self.wait_for(id, "a terminal or held state", timeout, |op| {
            op.state.is_terminal() || op.state.needs_human()
        })
        .await
    }

    /// Ask for a cancel of `id` as a person would ("alice": "stop").
    pub async fn cancel(&self, id: OperationId) {
        self.store
            .request_cancel(
                id,
                jobtrail_core::CancelRequest::new("alice", "stop").unwrap(),
            )
            .await
            .unwrap();
    }

    pub async fn wait_state(
        &self,
        id: OperationId,
        state: State,
        timeout: Duration,
    ) -> OperationRecord {
        self.wait_for(id, state.as_str(), timeout, |op| op.state == state)
            .await
    }

    /// Worker process logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                if e.path().extension().is_some_and(|x| x == "log") {
                    let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(30).collect();
                    out.push_str(&format!("--- {} (last lines)\n", e.path().display()));
                    for l in tail.into_iter().rev() {
                        out.push_str(l);
                        out.push('\n');
                    }
                }
            }
        }
        out
    }

    pub fn history_states(&self, h: &[jobtrail_store::HistoryRecord]) -> Vec<String> {
        h.iter()
            .map(|r| format!("{}:{}", r.event, r.to_state))
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for (s, _) in &self.workers {
            s.cancel();
        }
        // A passing test leaves nothing behind; a failing one keeps its logs to read.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
            let edited = std::path::Path::new(&self.providers);
            if edited
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("jobtrail-providers-"))
            {
                let _ = std::fs::remove_dir_all(edited);
            }
        }
    }
}

/// A worker process, killed when dropped.
pub struct WorkerProcess {
    pub child: Child,
    pub log: PathBuf,
    pub id: String,
}

impl WorkerProcess {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }
    /// Wait (bounded) for the process to exit; its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
    /// Stop it as Kubernetes does (SIGTERM); it exits 0 within 30 s.
    pub fn stop_cleanly(&mut self) {
        self.signal(libc::SIGTERM);
        let code = self
            .wait_exit(Duration::from_secs(30))
            .and_then(|s| s.code());
        assert_eq!(code, Some(0), "{} did not stop cleanly", self.id);
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `jobtrail serve` process (the HTTP API with MCP at /mcp), killed when dropped.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub log: PathBuf,
}

/// The webhook secret servers started by [`Env::serve`] hold (the contract names the variable).
pub const WEBHOOK_SECRET: &str = "whsec_c2ltLXdlYmhvb2stc2VjcmV0LWZvci10ZXN0cw==";

impl Env {
    /// Start `jobtrail serve` on a free loopback port against this environment's database and
    /// contracts; returns once it listens (bounded).
    pub fn serve(&self, name: &str) -> Server {
        self.serve_as(name, &self.url, None)
    }

    /// [`Env::serve`] with its own database logins: `url` for the agents' routes and, if given, an
    /// operator login for decisions and audit.
    pub fn serve_as(&self, name: &str, url: &str, operator_url: Option<&str>) -> Server {
        self.serve_full(name, url, operator_url, &[])
    }

    /// [`Env::serve`] with extra environment.
    pub fn serve_with(&self, name: &str, extra_env: &[(&str, &str)]) -> Server {
        self.serve_full(name, &self.url, None, extra_env)
    }

    fn serve_full(
        &self,
        name: &str,
        url: &str,
        operator_url: Option<&str>,
        extra_env: &[(&str, &str)],
    ) -> Server {
        let log = self.dir.join(format!("{name}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_jobtrail"));
        match operator_url {
            Some(u) => cmd.env("JOBTRAIL_OPERATOR_DATABASE_URL", u),
            None => cmd.env_remove("JOBTRAIL_OPERATOR_DATABASE_URL"),
        };
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--drain", "2s"])
            .env("DATABASE_URL", url)
            .env("JOBTRAIL_PROVIDERS", &self.providers)
            .env("JOBTRAIL_SIM_TOKEN", TOKEN)
            .env("JOBTRAIL_SIM_WEBHOOK_SECRET", WEBHOOK_SECRET)
            .env("JOBTRAIL_PROVIDER_SIM_BASE_URL", self.sim.base_url())
            .env("JOBTRAIL_PROVIDER_SIM_CSV_BASE_URL", self.sim.base_url())
            .env("JOBTRAIL_PROVIDER_SIM_LEGACY_BASE_URL", self.sim.base_url())
            .env("JOBTRAIL_LOG", "info")
            .env_remove("JOBTRAIL_API")
            .env_remove("JOBTRAIL_TOKEN");
        // The extras last: they may replace any of the above.
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("spawn jobtrail serve");
        let mut child = child;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            // Only a whole line: the log is read while the server writes it, and half a line
            // names half an address.
            if let Some((line, _)) = text
                .split("listening on ")
                .nth(1)
                .and_then(|rest| rest.split_once('\n'))
                && let Some(base) = line.split_whitespace().next()
            {
                let base = base.to_owned();
                return Server { child, base, log };
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("jobtrail serve did not start:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A new API token for `caller` with `scopes` (as `jobtrail-admin tokens create` makes them).
    pub async fn token(&self, caller: &str, scopes: &[&str]) -> String {
        let (token, sha256) = jobtrail_service::auth::new_token().unwrap();
        let scopes: Vec<String> = scopes.iter().map(|s| (*s).to_owned()).collect();
        self.store
            .insert_token(&jobtrail_store::NewToken {
                caller,
                scopes: &scopes,
                sha256,
                note: None,
                created_by: "test",
                expires_at: None,
            })
            .await
            .unwrap();
        token
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    /// SIGTERM, and wait (bounded) for a clean exit.
    pub fn stop(mut self) -> Option<std::process::ExitStatus> {
        self.terminate();
        self.exit_within(Duration::from_secs(15))
    }
    /// SIGTERM, without waiting.
    pub fn terminate(&self) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
    }
    /// How the server exited, waiting at most `limit` (`None`: still running).
    pub fn exit_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP client for the API (bounded).
pub fn http() -> reqwest::Client {
    jobtrail_provider::install_crypto();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// What the server answers to a request written by hand on a fresh connection (`head` with its
/// `Content-Length`, and `sent` of the body): the status line's code, read within 10 s.
pub async fn raw_status(addr: &str, head: &str, sent: &[u8]) -> u16 {
    use tokio::io::AsyncWriteExt;
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(sent).await.unwrap();
    let answer = status_line(&mut conn, Duration::from_secs(10)).await;
    answer.split(' ').nth(1).unwrap().parse().unwrap()
}

/// The first line the server answers on `conn`, read within `within` (else the test fails).
pub async fn status_line(conn: &mut tokio::net::TcpStream, within: Duration) -> String {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        while !answer.windows(2).any(|w| w == b"\r\n") {
            // A server that answers before reading all it was sent may reset the connection
            // after its answer: an error with nothing read is no answer.
            let n = conn.read(&mut buf).await.unwrap_or(0);
            assert!(n > 0, "closed without an answer");
            answer.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(within, read)
        .await
        .unwrap_or_else(|_| panic!("no answer within {within:?} (was the body awaited?)"));
    let text = String::from_utf8_lossy(&answer);
    text.lines().next().unwrap_or_default().to_owned()
}

/// The `operations` table locked against writes (reads go on) until released.
pub struct WriteLock(sqlx::PgConnection);

impl WriteLock {
    pub async fn on_operations(url: &str) -> Self {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut c).await.unwrap();
        sqlx::query("LOCK TABLE operations IN SHARE MODE")
            .execute(&mut c)
            .await
            .unwrap();
        Self(c)
    }

    pub async fn release(mut self) {
        sqlx::query("ROLLBACK").execute(&mut self.0).await.unwrap();
    }
}

/// Wait (at most 10 s) until a session of the database at `url` waits for a lock on `table`.
pub async fn until_blocked_on(url: &str, table: &str) {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass",
        )
        .bind(table)
        .fetch_one(&pool)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "nothing waited for {table}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pool.close().await;
}

/// An MCP `initialize` request, as a client opening a session sends it.
pub fn mcp_initialize() -> serde_json::Value {
    serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}})
}

/// A session opened and initialised by hand (as a Streamable HTTP client does): its id.
pub async fn mcp_session(server: &Server, token: &str) -> String {
    let opened = mcp_post(server, token, None, mcp_initialize()).await;
    assert_eq!(opened.status(), reqwest::StatusCode::OK);
    let session = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    drop(opened.text().await);
    let ready = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert!(
        mcp_post(server, token, Some(&session), ready)
            .await
            .status()
            .is_success()
    );
    session
}

/// A POST to `/mcp` on `session` (none: an opening), as a Streamable HTTP client sends it.
pub async fn mcp_post(
    server: &Server,
    token: &str,
    session: Option<&str>,
    body: serde_json::Value,
) -> reqwest::Response {
    let mut r = http()
        .post(server.url("/mcp"))
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18");
    if let Some(s) = session {
        r = r.header("mcp-session-id", s);
    }
    r.json(&body).send().await.unwrap()
}

/// The `jobtrail-admin` binary beside the `jobtrail` one under test (built with the workspace).
pub fn admin_bin() -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_BIN_EXE_jobtrail")).with_file_name("jobtrail-admin");
    assert!(
        p.exists(),
        "build the workspace first: {} is missing",
        p.display()
    );
    p
}

/// The value of the first sample of `series` whose labels include every one of `labels`.
pub fn sample(metrics: &str, series: &str, labels: &[&str]) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(series) && l[series.len()..].starts_with(['{', ' ']))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The address a process printed for its operations listener (bounded wait on its log).
pub fn ops_address(log: &std::path::Path) -> String {
    announced(log, "/metrics on ")
}

/// The address a process's log names right after `marker` (waited for, bounded).
pub fn announced(log: &std::path::Path, marker: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        // Only a whole line: the log is read while the process writes it.
        if let Some((line, _)) = text
            .split(marker)
            .nth(1)
            .and_then(|rest| rest.split_once('\n'))
            && let Some(base) = line.split_whitespace().next()
        {
            return base.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no address after {marker:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
