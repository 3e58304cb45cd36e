//! `jobtrail worker`: the service loop, its flags (each with a `JOBTRAIL_*` variable, for a
//! Deployment's env), and its operations listener (`/livez`, `/readyz`, `/metrics`).

use jobtrail_console::shell::{self, CmdResult, exit, fail};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// Lease owner name (default HOSTNAME-PID: the pod name on Kubernetes).
    #[arg(long, env = "JOBTRAIL_WORKER_ID")]
    id: Option<String>,
    /// Most operations claimed by one claim transaction. 1 to 10000.
    #[arg(long, env = "JOBTRAIL_BATCH", default_value_t = 32)]
    batch: i64,
    /// Operations driven at once (each under its own lease); more in flight makes bigger group
    /// commits. 1 to 100000.
    #[arg(long, env = "JOBTRAIL_CONCURRENCY", default_value_t = 64)]
    concurrency: usize,
    /// Lease time-to-live: a dead worker's operations are taken over after this. 1s to 1h.
    #[arg(long, env = "JOBTRAIL_LEASE", default_value = "30s")]
    lease: String,
    /// The backstop: longest sleep without looking for work. An idle worker otherwise sleeps until
    /// the earliest due time of work it could claim, or a notification. 50ms to 1h.
    #[arg(long, env = "JOBTRAIL_IDLE", default_value = "30s")]
    idle: String,
    /// Keep result bytes as files in this local directory instead of in the database (the
    /// default). Only this host can then read them back (`jobtrail result`).
    #[arg(long, env = "JOBTRAIL_RESULT_DIR", value_parser = shell::path_or_none())]
    result_dir: Option<PathBuf>,
    /// Most steps written per transaction (group commit); 1 writes each step on its own. At most
    /// 10000.
    #[arg(long, env = "JOBTRAIL_WRITE_BATCH", default_value_t = 64)]
    write_batch: usize,
    /// How long steps in flight may finish after SIGTERM; calls still in flight then are
    /// abandoned and logged as such (they may have reached the provider), their steps written
    /// within 5 s more. A second SIGTERM or Ctrl-C ends the grace at once. Keep the pod's
    /// terminationGracePeriodSeconds above both. 0s to 1h.
    #[arg(long, env = "JOBTRAIL_SHUTDOWN_GRACE", default_value = "20s")]
    shutdown_grace: String,
    /// Give up a database round trip (a claim, a batch of steps, a lease extension) unanswered
    /// this long: a server gone silent in a failover never fails a connection by itself. A batch
    /// given up is "commit unknown", its operations read afresh by their next holder. 1s to 1h.
    #[arg(long, env = "JOBTRAIL_DB_ANSWER_WITHIN", default_value = "60s")]
    db_answer_within: String,
    /// Memory, in MiB, for the JSON results the worker parses at once to check them (default:
    /// half the container's memory limit, else 1024). Each parse is measured first, without
    /// building it, and waits for its share; a result whose parse would take more than all of it
    /// (millions of small values: some thirty times its bytes) is never parsed and is held for a
    /// person (result_stalled). Half as much (at least 1 MiB) bounds results' bytes in flight, from fetch
    /// to written: each fetch first waits for the most its contract lets the result be. Keep the
    /// pod's memory limit above both.
    #[arg(long, env = "JOBTRAIL_CHECK_MIB",
          value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    check_mib: Option<u32>,
    /// The longest the worker keeps an operation's lease while one result is checked and kept
    /// (a large one may take minutes; a result directory whose fsync hangs, for ever). Past it
    /// the lease lapses: another worker takes the operation over, and the third holder lost in a
    /// row holds it for a person (result_stalled). 1s to 24h.
    #[arg(long, env = "JOBTRAIL_CHECK_WITHIN", default_value = "10m")]
    check_within: String,
    /// Serve /livez, /readyz and /metrics (Prometheus) on this address (e.g. 0.0.0.0:9090).
    /// Unset: no listener.
    #[arg(long, env = "JOBTRAIL_OPS_LISTEN")]
    ops_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    db_wait: crate::start::DbWait,
}

/// Connections of the probes' own pool.
pub(crate) const PROBE_POOL: u32 = 2;

pub async fn run(common: &shell::Common, a: WorkerArgs) -> CmdResult {
    let mut config = jobtrail_worker::WorkerConfig::named_default();
    if let Some(id) = a.id.filter(|i| !i.trim().is_empty()) {
        // The actor of every link and call this worker writes, kept for good: one printable line,
        // bounded, as a person's name on a decision is.
        config.id = shell::actor("--id", &id)?;
    }
    if a.batch < 1 || a.concurrency < 1 || a.write_batch < 1 {
        return Err(fail(
            exit::BAD_INPUT,
            "--batch, --concurrency and --write-batch must be at least 1",
        ));
    }
    if a.batch > 10_000 || a.concurrency > 100_000 || a.write_batch > 10_000 {
        return Err(fail(
            exit::BAD_INPUT,
            "--batch and --write-batch may be at most 10000, --concurrency at most 100000",
        ));
    }
    config.batch = a.batch;
    config.concurrency = a.concurrency;
    config.write_batch = a.write_batch;
    config.lease = shell::parse_duration_within(
        "--lease",
        &a.lease,
        Duration::from_secs(1),
        Duration::from_secs(3600),
    )?;
    // A floor: `--idle 30ms` (meant 30s) would scan the database 30 times a second per worker.
    config.idle = shell::parse_duration_within(
        "--idle",
        &a.idle,
        Duration::from_millis(50),
        Duration::from_secs(3600),
    )?;
    config.shutdown_grace = shell::parse_duration_within(
        "--shutdown-grace",
        &a.shutdown_grace,
        Duration::ZERO,
        Duration::from_secs(3600),
    )?;
    // A floor: under a second, a busy but working database would have its group commits given up.
    config.db_answer_within = shell::parse_duration_within(
        "--db-answer-within",
        &a.db_answer_within,
        Duration::from_secs(1),
        Duration::from_secs(3600),
    )?;
    config.check_within = shell::parse_duration_within(
        "--check-within",
        &a.check_within,
        Duration::from_secs(1),
        Duration::from_secs(24 * 3600),
    )?;
    if let Some(mib) = a.check_mib {
        config.check_bytes = u64::from(mib) << 20;
    }
    let db_wait = a.db_wait.parse()?;
    let registry = shell::registry(&common.providers)?;
    let results = match shell::given_path(a.result_dir) {
        Some(d) => jobtrail_worker::ResultStore::directory(d),
        None => jobtrail_worker::ResultStore::Database,
    };
    if let jobtrail_worker::ResultStore::Directory(dir) = &results {
        dir.check().map_err(|e| {
            fail(
                exit::BAD_INPUT,
                format!(
                    "--result-dir {}: results cannot be kept there ({e}): name a directory this process can write",
                    dir.root().display()
                ),
            )
        })?;
    }
    if matches!(results, jobtrail_worker::ResultStore::Database) {
        // Refuse at start what would fail at every collect.
        let limit = jobtrail_worker::results::MAX_DATABASE_RESULT as u64;
        for name in registry.names() {
            let allowed = registry
                .get(name)
                .and_then(|p| p.contract().result.as_ref().map(|r| r.largest()))
                .unwrap_or(0);
            if allowed > limit {
                return Err(fail(
                    exit::BAD_INPUT,
                    format!(
                        "provider {name} allows results of {allowed} bytes; results kept in the database may be at most {limit}: lower its result.max_bytes or run with --result-dir"
                    ),
                ));
            }
        }
    }
    let contracts_loaded = registry.names().count();
    // A secret a contract names and this process cannot read fails every call to that provider
    // unsent: said now, and the worker stays unready (a rollout stops here, old pods keep working).
    let unresolved_secrets = registry.unresolvable_secrets(jobtrail_provider::SecretsFor::Calls);
    for m in &unresolved_secrets {
        tracing::error!("{m}: calls to this provider cannot be sent");
    }
    for m in registry.unresolvable_secrets(jobtrail_provider::SecretsFor::Grants) {
        tracing::warn!("{m}: requests naming this granted secret cannot be sent");
    }
    let shutdown = tokio_util::sync::CancellationToken::new();
    let loop_stop = tokio_util::sync::CancellationToken::new();
    // A second signal ends the shutdown grace at once.
    let hurry = tokio_util::sync::CancellationToken::new();
    crate::start::on_signal(loop_stop.clone(), hurry.clone());
    // The probes answer before the database does: alive while this process waits for it at start
    // (a restart would not bring it sooner), not ready until it works.
    let heartbeat = Arc::new(std::sync::OnceLock::<Arc<jobtrail_worker::Heartbeat>>::new());
    let at_work = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(addr) = a.ops_listen {
        let beat = heartbeat.clone();
        let probe = jobtrail_telemetry::Probe {
            store: shell::store_lazy(common.database_url.as_deref(), PROBE_POOL)?,
            contracts: contracts_loaded,
            needs_contracts: true,
            unresolved_secrets: unresolved_secrets.clone(),
            stopping: None,
            liveness: Some((
                Arc::new(move || beat.get().map_or(Duration::ZERO, |h| h.silence())),
                config.silence_limit(),
            )),
            at_work: Some(at_work.clone()),
        };
        crate::start::ops_listener("jobtrail worker", addr, probe, shutdown.clone()).await?;
    }
    let Some(store) = crate::start::database(
        common.database_url.as_deref(),
        common.db_pool,
        db_wait,
        &loop_stop,
    )
    .await?
    else {
        tracing::info!("stopped while waiting for the database: nothing was held");
        return Ok(ExitCode::SUCCESS);
    };
    // Said once: a result whose parse needs more is held for a person, and the default comes from
    // the cgroup, which an operator should be able to check against the pod's limit.
    tracing::info!(
        check_mib = config.check_bytes >> 20,
        "room for checking results: {} MiB ({})",
        config.check_bytes >> 20,
        if a.check_mib.is_some() {
            "--check-mib"
        } else {
            "half the container's memory limit, else 1024"
        }
    );
    let worker = jobtrail_worker::Worker::new(store, registry, results, config);
    let _ = heartbeat.set(worker.heartbeat());
    at_work.store(true, std::sync::atomic::Ordering::Relaxed);
    let stop = shutdown.clone();
    worker.run_until(loop_stop, hurry).await;
    // The probes answer until the worker has given its leases back.
    stop.cancel();
    Ok(ExitCode::SUCCESS)
}
