//! A whole jobtrail on one machine, for the demo and the benchmark: a fresh database (on the private
//! cluster, or the empty one DATABASE_URL names), the simulated provider on a loopback port, the shipped
//! simulator contracts pointed at it, and real worker processes.

use jobtrail_console::shell::{Failure, exit, fail};
use jobtrail_provider::{HttpProvider, Registry};
use jobtrail_store::Store;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The shipped simulator contracts, embedded so the demo and the benchmark run from any directory.
const CONTRACTS: &[(&str, &str)] = &[
    ("sim.toml", include_str!("../../../providers/sim.toml")),
    (
        "sim-csv.toml",
        include_str!("../../../providers/sim-csv.toml"),
    ),
    (
        "sim-legacy.toml",
        include_str!("../../../providers/sim-legacy.toml"),
    ),
    (
        "schemas/sim-result.json",
        include_str!("../../../providers/schemas/sim-result.json"),
    ),
];

fn write_contracts(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("schemas"))?;
    for (name, text) in CONTRACTS {
        std::fs::write(dir.join(name), text)?;
    }
    std::fs::write(dir.join("sim-h2.toml"), sim_over_http2())
}

/// `sim.toml` once more as `sim-h2`, called over HTTP/2 (h2c, the simulator serves both): the
/// benchmark's memory phase measures a call in flight each way.
fn sim_over_http2() -> String {
    let sim = CONTRACTS[0].1;
    let named = "name = \"sim\"\n";
    assert!(
        sim.contains(named),
        "sim.toml names itself on a line of its own"
    );
    sim.replacen(named, "name = \"sim-h2\"\nhttp_version = \"2\"\n", 1)
}

/// The `application_name` of every session a fleet worker opens (set through `PGAPPNAME`).
pub const WORKER_APP_NAME: &str = "jobtrail-fleet-worker";

pub struct Fleet {
    pub work: PathBuf,
    pub providers_dir: PathBuf,
    pub url: String,
    pub store: Store,
    pub sim: jobtrail_sim::Running,
    pub registry: Registry,
    /// Extra arguments for every worker this fleet starts.
    pub worker_args: Vec<String>,
    token: String,
    /// Each worker with the process id its signals go to: its own, or, for a worker started under
    /// a wrapper (a profiler), the negated id of the process group it leads, so a stop reaches the
    /// worker too and not only the wrapper (which need not pass signals on).
    children: Vec<(String, Child, i32)>,
    /// The database this fleet made on the private cluster: (admin URL, name).
    private_db: Option<(String, String)>,
}

/// A database URL as it may be printed or written to a results file: its password (in the
/// authority, or as a `password`/`sslpassword` parameter) replaced by `***`, so a terminal, a CI log
/// or a kept JSON file never carries it.
pub fn shown_url(url: &str) -> String {
    let Ok(mut u) = url::Url::parse(url) else {
        return "(DATABASE_URL, not shown: it does not parse as a URL)".into();
    };
    if u.password().is_some() {
        let _ = u.set_password(Some("***"));
    }
    let secret =
        |k: &str| k.eq_ignore_ascii_case("password") || k.eq_ignore_ascii_case("sslpassword");
    if u.query_pairs().any(|(k, _)| secret(&k)) {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let v = if secret(&k) {
                    "***".into()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.to_string()
}

impl Fleet {
    /// This fleet's database, as it may be shown ([`shown_url`]).
    pub fn shown_url(&self) -> String {
        shown_url(&self.url)
    }

    /// `kind` names the database (`jobtrail_<kind>_<timestamp>`) and the work directory. `url`:
    /// a database to use instead of a new one on the private cluster (`--database-url` or
    /// `DATABASE_URL`), which must hold no operation: the fleet writes hundreds of throwaway
    /// ones and never removes them (history cannot be deleted).
    pub async fn start(kind: &str, url: Option<&str>) -> Result<Self, Failure> {
        let stamp = chrono::Utc::now().format("%Y%m%d_%H%M%S").to_string();
        let given = url.map(str::trim).filter(|u| !u.is_empty());
        // Checked before anything is made (a refused run leaves no work directory behind).
        if let Some(u) = given {
            let store = Store::connect_with(u, 2).await?;
            let used = store.holds_operations().await;
            let other = store.holds_other_tables().await;
            store.close().await;
            if other? {
                return Err(fail(
                    exit::BAD_INPUT,
                    format!(
                        "{} holds another application's tables and no jobtrail schema: jobtrail {kind} would add its schema and hundreds of throwaway operations beside them that can never be removed: name an empty database (createdb), or leave DATABASE_URL and --database-url unset to use a private one",
                        shown_url(u)
                    ),
                ));
            }
            if used? {
                return Err(fail(
                    exit::BAD_INPUT,
                    format!(
                        "{} already holds operations, and jobtrail {kind} would write hundreds of throwaway ones beside them that can never be removed: name an empty database (createdb), or leave DATABASE_URL and --database-url unset to use a private one",
                        shown_url(u)
                    ),
                ));
            }
            eprintln!(
                "jobtrail {kind} writes into {} (DATABASE_URL / --database-url)",
                shown_url(u)
            );
        }
        let work =
            std::env::temp_dir().join(format!("jobtrail-{kind}-{stamp}-{}", std::process::id()));
        let providers_dir = work.join("providers");
        write_contracts(&providers_dir)
            .map_err(|e| fail(exit::UNAVAILABLE, format!("{}: {e}", work.display())))?;
        let mut private_db = None;
        let url = match given {
            Some(u) => u.to_owned(),
            None => {
                eprintln!(
                    "starting the private PostgreSQL cluster (first run: initdb takes a few seconds)…"
                );
                let cluster =
                    tokio::task::spawn_blocking(jobtrail_store::cluster::Cluster::persistent)
                        .await
                        .map_err(|e| fail(exit::UNAVAILABLE, e))?
                        .map_err(|e| fail(exit::UNAVAILABLE, e))?;
                let db = format!("jobtrail_{kind}_{stamp}");
                jobtrail_store::cluster::ensure_database(&cluster.url("postgres"), &db)
                    .await
                    .map_err(|e| fail(exit::UNAVAILABLE, e))?;
                private_db = Some((cluster.url("postgres"), db.clone()));
                cluster.url(&db)
            }
        };
        let store = Store::connect_with(&url, 32).await?;
        store.migrate().await?;
        let token = format!("{kind}-{}", uuid::Uuid::now_v7().simple());
        let sim = jobtrail_sim::Sim::new(jobtrail_sim::Config {
            bearer_token: Some(token.clone()),
            webhook: None,
            ..Default::default()
        })
        .start("127.0.0.1:0".parse().expect("loopback"))
        .await
        .map_err(|e| fail(exit::UNAVAILABLE, format!("starting the simulator: {e}")))?;
        let mut registry = Registry::default();
        for (_, mut c) in jobtrail_provider::contract::load_dir(&providers_dir)
            .map_err(|e| fail(exit::UNAVAILABLE, e))?
        {
            c.base_url = url::Url::parse(&sim.base_url()).expect("loopback URL");
            registry.insert(Arc::new(
                HttpProvider::new(c).map_err(|e| fail(exit::UNAVAILABLE, e))?,
            ));
        }
        Ok(Self {
            work,
            providers_dir,
            url,
            store,
            sim,
            registry,
            worker_args: Vec::new(),
            token,
            children: Vec::new(),
            private_db,
        })
    }

    /// Stop the workers and remove what this fleet made: its database on the private cluster (never
    /// one `DATABASE_URL` named) and its work directory. Returns the dropped database's name.
    pub async fn remove(mut self) -> Result<Option<String>, Failure> {
        self.stop_workers();
        self.store.close().await;
        let _ = std::fs::remove_dir_all(&self.work);
        match self.private_db.take() {
            Some((admin, name)) => {
                jobtrail_store::cluster::drop_database(&admin, &name)
                    .await
                    .map_err(|e| fail(exit::UNAVAILABLE, e))?;
                Ok(Some(name))
            }
            None => Ok(None),
        }
    }

    /// Start a `jobtrail worker` process (its sessions are named [`WORKER_APP_NAME`]); returns its
    /// pid.
    pub fn spawn_worker(&mut self, id: &str, args: &[&str]) -> Result<u32, Failure> {
        self.spawn_worker_with(id, args, &[])
    }

    /// Where the worker named `id` writes its log.
    pub fn worker_log(&self, id: &str) -> PathBuf {
        self.work.join(format!("{id}.log"))
    }

    /// A worker with extra environment variables.
    pub fn spawn_worker_with(
        &mut self,
        id: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<u32, Failure> {
        let exe = std::env::current_exe().map_err(|e| fail(exit::UNAVAILABLE, e))?;
        let base = self.sim.base_url();
        let log = std::fs::File::create(self.work.join(format!("{id}.log")))
            .map_err(|e| fail(exit::UNAVAILABLE, e))?;
        // A profiler to run each worker under (`heaptrack -o /tmp/worker`): the pid returned is
        // then the profiler's.
        let wrapper = std::env::var("JOBTRAIL_BENCH_WORKER_WRAPPER").unwrap_or_default();
        let mut wrapper = wrapper.split_whitespace();
        let (mut command, grouped) = match wrapper.next() {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(wrapper).arg(exe);
                // Its own group, signalled whole: the wrapper and the worker under it.
                std::os::unix::process::CommandExt::process_group(&mut c, 0);
                (c, true)
            }
            None => (Command::new(exe), false),
        };
        // The fleet's workers take their settings from here, never from a JOBTRAIL_* left in
        // the shell (an exported JOBTRAIL_OPS_LISTEN would have them all bind one address, a
        // JOBTRAIL_RESULT_DIR share one directory, and all but one exit with it said only in
        // their logs).
        for (name, _) in std::env::vars_os() {
            if name.as_encoded_bytes().starts_with(b"JOBTRAIL_") {
                command.env_remove(name);
            }
        }
        let child = command
            .args(["worker", "--id", id])
            .args(args)
            .args(&self.worker_args)
            .env("DATABASE_URL", &self.url)
            .env("JOBTRAIL_PROVIDERS", &self.providers_dir)
            .env("JOBTRAIL_SIM_TOKEN", &self.token)
            // How the benchmark recognises its workers' sessions in pg_stat_activity.
            .env("PGAPPNAME", WORKER_APP_NAME)
            .env("JOBTRAIL_PROVIDER_SIM_BASE_URL", &base)
            .env("JOBTRAIL_PROVIDER_SIM_CSV_BASE_URL", &base)
            .env("JOBTRAIL_PROVIDER_SIM_LEGACY_BASE_URL", &base)
            .env("JOBTRAIL_PROVIDER_SIM_H2_BASE_URL", &base)
            .env(
                "JOBTRAIL_LOG",
                std::env::var("JOBTRAIL_WORKER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| fail(exit::UNAVAILABLE, format!("starting a worker: {e}")))?;
        let pid = child.id();
        let target = if grouped { -(pid as i32) } else { pid as i32 };
        self.children.push((id.to_owned(), child, target));
        Ok(pid)
    }

    /// The process ids of the running workers.
    pub fn worker_pids(&self) -> Vec<u32> {
        self.children.iter().map(|(_, c, _)| c.id()).collect()
    }

    /// Send `signal` to the worker named `id` (and forget it if the signal kills it).
    pub fn signal(&mut self, id: &str, signal: i32) {
        if let Some(pos) = self.children.iter().position(|(n, _, _)| n == id) {
            send(self.children[pos].2, signal);
            if signal == libc::SIGKILL {
                let (_, mut c, _) = self.children.remove(pos);
                let _ = c.wait();
            }
        }
    }

    /// SIGTERM every worker and wait (bounded) for them to exit.
    pub fn stop_workers(&mut self) {
        for (_, _, target) in &self.children {
            send(*target, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for (_, c, target) in &mut self.children {
            let mut exited = false;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    exited = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if !exited && *target < 0 {
                send(*target, libc::SIGKILL);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        self.children.clear();
    }
}

/// Send `signal` to a worker: `target` is its pid, or the negated id of the process group it leads.
fn send(target: i32, signal: i32) {
    // SAFETY: kill(2) on our own child (or the group it leads) touches no memory of ours.
    unsafe {
        libc::kill(target, signal);
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop_workers();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_database_password_is_never_shown() {
        for (url, shown) in [
            (
                "postgres://jobtrail:hunter2@db.internal:5432/jobtrail?sslmode=verify-full",
                "postgres://jobtrail:***@db.internal:5432/jobtrail?sslmode=verify-full",
            ),
            (
                "postgres://jobtrail@db/jobtrail?password=hunter2&sslmode=require",
                "postgres://jobtrail@db/jobtrail?password=***&sslmode=require",
            ),
            (
                "postgres://db/jobtrail?SSLPassword=hunter2",
                "postgres://db/jobtrail?SSLPassword=***",
            ),
            (
                "postgres://postgres@127.0.0.1:5432/x",
                "postgres://postgres@127.0.0.1:5432/x",
            ),
        ] {
            let got = super::shown_url(url);
            assert_eq!(got.replace("%2A", "*"), shown);
            assert!(!got.contains("hunter2"));
        }
        assert!(!super::shown_url("not a url hunter2").contains("hunter2"));
    }
}
