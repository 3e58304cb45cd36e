//! What a long-running process (`jobtrail worker`, `jobtrail serve`) does before its work: listen
//! for signals, open its operations listener, and wait for a database that does not answer yet.

use jobtrail_console::shell::{self, exit, fail};
use jobtrail_store::{Store, StoreError};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Between two attempts to reach a database that is not there (each attempt itself keeps trying
/// for up to 10 s).
const AGAIN_AFTER: Duration = Duration::from_secs(2);

/// `--db-wait`, shared by `jobtrail worker` and `jobtrail serve`.
#[derive(clap::Args)]
pub struct DbWait {
    /// How long to wait at start for a database that accepts no connection (refused, no route,
    /// a name not resolving yet, a server starting up), trying again 2 s after each failed
    /// attempt and saying why: `forever`, or a duration after which no attempt starts (0s: exit 5
    /// after one). Meanwhile /livez answers and /readyz does not. A refused login, certificate or
    /// database name, or a schema this binary cannot use, exits 5 at once.
    #[arg(long, env = "JOBTRAIL_DB_WAIT", default_value = "forever")]
    db_wait: String,
}

impl DbWait {
    /// None: forever.
    pub fn parse(&self) -> Result<Option<Duration>, shell::Failure> {
        if self.db_wait.trim().eq_ignore_ascii_case("forever") {
            return Ok(None);
        }
        shell::parse_duration_within(
            "--db-wait",
            &self.db_wait,
            Duration::ZERO,
            Duration::from_secs(30 * 86_400),
        )
        .map(Some)
    }
}

/// Connect to `url` and check its schema, waiting while no server there accepts a connection
/// (refused, no route, a name that does not resolve yet: a database restarting or failing over,
/// a pod scheduled before its database) for up to `wait` (None: until stopped), saying why at
/// each attempt. Anything else (a refused login or certificate, a schema this binary cannot use)
/// fails at once: waiting would not mend it. `Ok(None)`: `stop` was cancelled meanwhile.
///
/// Without this a worker started during an outage exits, and its orchestrator restarts it ever
/// more slowly (Kubernetes' CrashLoopBackOff: up to 5 minutes) after the database is back.
pub async fn database(
    url: Option<&str>,
    pool: u32,
    wait: Option<Duration>,
    stop: &CancellationToken,
) -> Result<Option<Store>, shell::Failure> {
    let began = Instant::now();
    let mut attempt = 0u64;
    loop {
        attempt += 1;
        let failure = tokio::select! {
            connected = shell::store_at(url, pool) => match connected {
                Ok(store) => {
                    if attempt > 1 {
                        tracing::info!(
                            "the database answers: connected after {} s",
                            began.elapsed().as_secs()
                        );
                    }
                    return Ok(Some(store));
                }
                Err(f) => f,
            },
            _ = stop.cancelled() => return Ok(None),
        };
        let unreachable = failure.error.chain().any(|c| {
            matches!(
                c.downcast_ref::<StoreError>(),
                Some(StoreError::Unreachable(_))
            )
        });
        if !unreachable || wait.is_some_and(|w| began.elapsed() + AGAIN_AFTER > w) {
            return Err(failure);
        }
        tracing::warn!(
            attempt,
            "{:#}; trying again in {} s ({} s waited, --db-wait {})",
            failure.error,
            AGAIN_AFTER.as_secs(),
            began.elapsed().as_secs(),
            wait.map_or("forever".to_owned(), |w| format!("{} s", w.as_secs()))
        );
        tokio::select! {
            _ = tokio::time::sleep(AGAIN_AFTER) => {}
            _ = stop.cancelled() => return Ok(None),
        }
    }
}

/// Cancel `first` on SIGTERM or Ctrl-C, and `then` on a second one (a person who asks twice does
/// not want to wait out a delay).
pub fn on_signal(
    first: tokio_util::sync::CancellationToken,
    then: tokio_util::sync::CancellationToken,
) {
    tokio::spawn(async move {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            return;
        };
        for token in [first, then] {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            token.cancel();
        }
    });
}

/// Start the `--ops-listen` listener (probes and metrics) until `shutdown`; says where it listens.
pub async fn ops_listener(
    who: &str,
    addr: std::net::SocketAddr,
    probe: jobtrail_telemetry::Probe,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), shell::Failure> {
    let bound = |e: std::io::Error| fail(exit::UNAVAILABLE, format!("--ops-listen {addr}: {e}"));
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(bound)?;
    let at = listener.local_addr().map_err(bound)?;
    // The API's accept loop, with its timeouts: a probe or a scrape that stalls holds nothing long.
    tokio::spawn(jobtrail_api::serve(
        listener,
        jobtrail_telemetry::router(probe),
        shutdown,
        Duration::from_secs(2),
        jobtrail_api::Connections::default(),
    ));
    eprintln!("{who}: /livez, /readyz and /metrics on http://{at}");
    Ok(())
}
