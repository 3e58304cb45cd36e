//! `jobtrail bench`: jobtrail against the database's own ceiling, in one run, on one database.
//!
//! Phases: (1) the ceiling — claim + fenced update + history insert in one transaction, single-row and
//! batched, at several client counts; (2) jobtrail end to end against the simulated provider with zero
//! latency at several worker-process counts; (3) a realistic run (2 s remote jobs, Retry-After 1 s):
//! latency from remote completion to local success, provider calls and database commits per
//! operation; (4) claim latency with a small and a large operations table; (5) worker RSS at two
//! in-flight counts; (6) lease takeover after kill -9. It prints figures and targets; it asserts
//! nothing.

use crate::fleet::Fleet;
use jobtrail_console::shell::{CmdResult, exit, fail};
use jobtrail_core::{Submission, SubmitLimits};
use jobtrail_store::Store;
use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Seconds per ceiling configuration.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    ceiling_secs: u64,
    /// Client counts for the ceiling.
    #[arg(long, value_delimiter = ',', default_value = "4,16,64", value_parser = count(1_000))]
    clients: Vec<usize>,
    /// Worker-process counts for the end-to-end runs.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8", value_parser = count(64))]
    workers: Vec<usize>,
    /// Operations each end-to-end worker process drives at once (more in flight: bigger group
    /// commits).
    #[arg(long, default_value_t = 256, value_parser = count(100_000))]
    e2e_concurrency: usize,
    /// Operations each end-to-end worker process claims per claim transaction.
    #[arg(long, default_value_t = 128, value_parser = count(10_000))]
    e2e_batch: usize,
    /// Operations per end-to-end run. Enough for several seconds of steady state: worker start-up
    /// and the drain at the end are a fixed cost, not throughput.
    #[arg(long, default_value_t = 20000, value_parser = count(10_000_000))]
    e2e_operations: usize,
    /// Operations in the realistic run.
    #[arg(long, default_value_t = 200, value_parser = count(1_000_000))]
    realistic_operations: usize,
    /// Fast operations per run of the head-of-line phase (each run also has a third as many on a
    /// second provider; the run with slow calls adds a thirtieth as many creates that hang).
    #[arg(long, default_value_t = 300, value_parser = count(1_000_000))]
    hol_operations: usize,
    /// How long the idle phase watches an idle worker.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    idle_secs: u64,
    /// Operations in the table for the large claim-latency measurement.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(i64).range(0..=100_000_000))]
    large_table: i64,
    /// In-flight counts for the worker RSS measurement.
    #[arg(long, value_delimiter = ',', default_value = "100,10000", value_parser = count(100_000))]
    rss_in_flight: Vec<usize>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "jobtrail-bench.json")]
    json_out: std::path::PathBuf,
    /// Small numbers everywhere (a smoke run of every phase in about a minute). It sets the
    /// sizes itself: given with one of them, it is refused rather than overriding it unsaid.
    #[arg(long, conflicts_with_all = [
        "ceiling_secs", "clients", "workers", "e2e_operations", "realistic_operations",
        "hol_operations", "idle_secs", "large_table", "rss_in_flight",
    ])]
    quick: bool,
    /// Phases to run (claim, ceiling, e2e, realistic, hol, idle, takeover, rss, large); default all.
    #[arg(long, value_delimiter = ',', value_parser = PHASES)]
    phases: Vec<String>,
    /// Keep the benchmark's database (on the private cluster) and its work directory afterwards; by
    /// default both are removed (a full run leaves about 1.5 GB).
    #[arg(long)]
    keep_database: bool,
    /// Passed to every worker: most steps per transaction (1 turns group commit off, for comparison).
    #[arg(long, default_value_t = 64, value_parser = count(10_000))]
    write_batch: usize,
}

/// A count from 1 to `most`: 0 would wait on nothing for minutes, and a huge one seed until the
/// disk is full or panic.
fn count(most: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=most)
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

async fn submit_many(
    fleet: &Fleet,
    n: usize,
    script: serde_json::Value,
    tag: &str,
) -> Result<Vec<jobtrail_core::OperationId>, crate::common::Failure> {
    submit_many_to(fleet, "sim", n, script, tag).await
}

async fn submit_many_to(
    fleet: &Fleet,
    provider: &str,
    n: usize,
    script: serde_json::Value,
    tag: &str,
) -> Result<Vec<jobtrail_core::OperationId>, crate::common::Failure> {
    let terms = Arc::new(fleet.registry.terms());
    // A pool of its own, closed at the end: its backends exit and flush their statistics, so commit
    // counts taken afterwards include every submission.
    let pool = Store::connect_with(&fleet.url, 16).await?;
    let ids = Arc::new(std::sync::Mutex::new(Vec::with_capacity(n)));
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (store, terms, ids, next, script, tag, provider) = (
            pool.clone(),
            terms.clone(),
            ids.clone(),
            next.clone(),
            script.clone(),
            tag.to_owned(),
            provider.to_owned(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n {
                    return Ok::<_, jobtrail_store::StoreError>(());
                }
                let body = serde_json::json!({"bench": tag, "n": i, "sim": script});
                // Deadlines far enough out that a slow machine's queue does not outlive the
                // provider's default create window (30 s) and turn waiting into escalations.
                let now = chrono::Utc::now();
                let s = Submission {
                    create_deadline: Some(now + chrono::Duration::minutes(10)),
                    result_deadline: Some(now + chrono::Duration::minutes(15)),
                    provider: provider.clone(),
                    target: "bench".into(),
                    body: serde_json::to_vec(&body).expect("json"),
                    caller: "jobtrail-bench".into(),
                    approved_by: "bench".into(),
                    ..Default::default()
                };
                let op = store
                    .submit_new(&s, &terms, SubmitLimits::default())
                    .await?
                    .operation;
                ids.lock().expect("lock").push(op.id);
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| fail(exit::UNAVAILABLE, e))??;
    }
    pool.close().await;
    let v = ids.lock().expect("lock").clone();
    Ok(v)
}

/// Wait until nothing is left for workers. Returns whether it finished, and how many queries (each
/// its own committed transaction) the waiting itself made, so commit counts can leave them out.
async fn wait_settled(
    url: &str,
    limit: Duration,
    every: Duration,
) -> Result<(bool, i64), crate::common::Failure> {
    // Its own connection, closed at the end (its statistics are flushed when it exits).
    let store = Store::connect_with(url, 1).await?;
    let deadline = Instant::now() + limit;
    let mut polls = 0;
    let done = loop {
        polls += 1;
        if !store.any_unsettled().await? {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(every).await;
    };
    store.close().await;
    Ok((done, polls))
}

/// Durable commits so far: write transactions, counted by the transaction ids they consumed.
async fn settled_commits(url: &str) -> Result<i64, crate::common::Failure> {
    let store = Store::connect_with(url, 1).await?;
    let n = store.bench_commits().await?;
    store.close().await;
    Ok(n)
}

/// Commits as pg_stat_database counts them (read-only transactions included), read once the
/// benchmark's worker processes' sessions have gone (a backend reports its counts when it exits),
/// waiting at most 5 s for that.
async fn stat_commits(url: &str) -> Result<i64, crate::common::Failure> {
    let store = Store::connect_with(url, 1).await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let commits = loop {
        let (commits, workers) = store
            .bench_stat_commits(crate::fleet::WORKER_APP_NAME)
            .await?;
        if workers == 0 {
            break commits;
        }
        if Instant::now() > deadline {
            eprintln!(
                "warning: {workers} worker sessions still connected after 5 s; pg_stat_database may not count all of their commits yet"
            );
            break commits;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    store.close().await;
    Ok(commits)
}

/// Row updates of each table a step writes during one run, how many were HOT, and its growth (dead
/// tuples, bytes with indexes) per 10 000 operations; printed, and returned for the JSON.
fn table_updates(
    before: &[jobtrail_store::TableUpdates],
    after: &[jobtrail_store::TableUpdates],
    operations: usize,
) -> serde_json::Value {
    let per_10k = 10_000.0 / operations.max(1) as f64;
    let mut out = serde_json::Map::new();
    for (name, upd, hot, dead, bytes) in after {
        let (_, upd0, hot0, dead0, bytes0) = before
            .iter()
            .find(|b| &b.0 == name)
            .cloned()
            .unwrap_or_default();
        let (upd, hot) = (upd - upd0, hot - hot0);
        let hot_share = hot as f64 / upd.max(1) as f64;
        let dead = (dead - dead0) as f64 * per_10k;
        let grew = (bytes - bytes0) as f64 * per_10k / (1024.0 * 1024.0);
        // Fewer dead tuples than at the start: (auto)vacuum ran during the run and removed some
        // left by an earlier phase; the difference then says nothing of this run.
        let dead_text = if dead < 0.0 {
            "a vacuum ran during the run, dead tuples not comparable".to_owned()
        } else {
            format!("{dead:.0} dead tuples left")
        };
        println!(
            "    {name}: {upd} updates, {:.0} % HOT; per 10 000 operations {dead_text}, {grew:.1} MiB grown",
            hot_share * 100.0
        );
        let dead = if dead < 0.0 { f64::NAN } else { dead };
        out.insert(
            name.clone(),
            serde_json::json!({"updates": upd, "hot_updates": hot, "hot_share": hot_share, "dead_tuples_per_10k_operations": dead, "mib_grown_per_10k_operations": grew}),
        );
    }
    out.into()
}

/// Print where the database's time went since the reset, by statement (the statement's first line,
/// which for jobtrail's own says what it does), in microseconds per transition: what the end-to-end
/// run pays beyond the ceiling's statements.
async fn statement_times(store: &Store, transitions: f64) -> serde_json::Value {
    let top = match store.bench_statements_top(10).await {
        Ok(top) => top,
        Err(e) => {
            println!("    database time by statement: not read ({e})");
            return serde_json::Value::Null;
        }
    };
    let per = |ms: f64| ms * 1000.0 / transitions.max(1.0);
    let total: f64 = top.iter().map(|t| t.3).sum();
    println!(
        "    database time by statement (pg_stat_statements), µs per transition; the ten largest: {:.0} in all",
        per(total)
    );
    for (label, calls, rows, ms) in &top {
        let label = label.trim_start_matches("-- ");
        println!(
            "    {:>7.0}  {calls:>7} calls {rows:>8} rows  {label}",
            per(*ms)
        );
    }
    top.into_iter()
        .map(|(label, calls, rows, ms)| {
            serde_json::json!({"statement": label, "calls": calls, "rows": rows, "exec_ms": ms})
        })
        .collect::<Vec<_>>()
        .into()
}

/// The worker's own claim query, for the one provider the seeded rows belong to.
async fn claim_latency(store: &Store, rounds: usize) -> Result<(f64, f64), crate::common::Failure> {
    let share = jobtrail_store::ClaimShare {
        provider: "bench".into(),
        fair: 32,
        cap: 32,
        fleet_cap: None,
        reserve: 0,
    };
    let mut ms = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let claimed = store
            .claim_shares(
                "bench-claimer",
                (32, 32),
                Duration::from_secs(60),
                std::slice::from_ref(&share),
            )
            .await?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        for c in claimed {
            store.release(&c.lease, Duration::ZERO, "bench").await?;
        }
    }
    Ok((pct(ms.clone(), 0.5), pct(ms, 0.95)))
}

/// CPU seconds (user + system) a process has used so far, from `/proc/<pid>/stat`.
fn cpu_secs(pid: &str) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces) start after its closing ')'.
    let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks as f64 / hz)
}

/// CPU seconds so far of every PostgreSQL server process on this machine, by pid.
fn database_cpu() -> HashMap<String, f64> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .filter_map(|pid| Some((pid.clone(), cpu_secs(&pid)?)))
        .collect()
}

/// Where one end-to-end run's CPU went: the database server, the worker processes, and this
/// process (the simulated provider answering every call, and the benchmark's own reads).
/// `db0` and `me0` were read when the run started; the workers are still running.
fn cpu_split(db0: &HashMap<String, f64>, me0: f64, workers: &[u32]) -> (f64, f64, f64) {
    let db: f64 = database_cpu()
        .iter()
        .map(|(pid, now)| now - db0.get(pid).copied().unwrap_or(0.0))
        .sum();
    let w: f64 = workers
        .iter()
        .filter_map(|p| cpu_secs(&p.to_string()))
        .sum();
    let me = cpu_secs("self").unwrap_or(0.0) - me0;
    (db, w, me)
}

/// `a / b`, or NaN when `b` was not measured (a phase not run) or is zero.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::NAN }
}

fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// Where a run's CPU went, in µs per transition, and how busy it kept the machine.
#[derive(Debug, Clone, Copy)]
struct CpuPerTransition {
    database_us: f64,
    workers_us: f64,
    provider_and_bench_us: f64,
    /// CPU used over CPU available (every core for the run's wall time).
    busy: f64,
}

impl CpuPerTransition {
    fn of(
        database: f64,
        workers: f64,
        provider_and_bench: f64,
        transitions: f64,
        secs: f64,
    ) -> Self {
        let per = |cpu: f64| ratio(cpu * 1e6, transitions);
        Self {
            database_us: per(database),
            workers_us: per(workers),
            provider_and_bench_us: per(provider_and_bench),
            busy: ratio(database + workers + provider_and_bench, secs * cores()),
        }
    }

    fn total_us(&self) -> f64 {
        self.database_us + self.workers_us + self.provider_and_bench_us
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"database": self.database_us, "workers": self.workers_us, "provider_and_bench": self.provider_and_bench_us, "busy": self.busy})
    }
}

/// Where the end-to-end run's transitions go beyond the lean ceiling's. Both runs keep the
/// machine busy, so each one's rate is about the CPU it has over the CPU a transition costs it:
/// the ratio of CPU per transition bounds the ratio of rates, whatever the database does.
fn lean_gap(lean: &CpuPerTransition, e2e: &CpuPerTransition) -> serde_json::Value {
    println!(
        "\nwhere the end-to-end run's CPU goes against the lean ceiling's, µs per transition (best runs):"
    );
    println!("  {:<40} {:>10} {:>8}", "", "end to end", "lean");
    let rows = [
        ("database", e2e.database_us, lean.database_us),
        ("workers", e2e.workers_us, lean.workers_us),
        (
            "simulated provider and benchmark",
            e2e.provider_and_bench_us,
            lean.provider_and_bench_us,
        ),
        ("all", e2e.total_us(), lean.total_us()),
    ];
    for (what, e, l) in rows {
        println!("  {what:<40} {e:>10.0} {l:>8.0}");
    }
    // At the same share of the machine, the rate ratio is the inverse of the CPU ratio.
    let bound = ratio(lean.total_us(), e2e.total_us()) * ratio(e2e.busy, lean.busy);
    println!(
        "  machine busy: end to end {:.0} %, lean {:.0} %; at these CPU costs end to end reaches {bound:.2} of the lean ceiling",
        e2e.busy * 100.0,
        lean.busy * 100.0
    );
    serde_json::json!({"end_to_end_us": e2e.json(), "lean_us": lean.json(), "expected_ratio_from_cpu": bound})
}

/// One worker's largest RSS (KiB) and the most operations it held leased at once, with `n`
/// operations of `provider` submitted whose status calls the simulator holds open for 1.8 s.
async fn worker_rss(
    fleet: &mut Fleet,
    provider: &str,
    n: usize,
) -> Result<(u64, usize), crate::common::Failure> {
    let store = fleet.store.clone();
    let phase = chrono::Utc::now();
    submit_many_to(
        fleet,
        provider,
        n,
        serde_json::json!({"never_finish": true, "status_delay_ms": 1800}),
        "rss",
    )
    .await?;
    let conc = n.to_string();
    let batch = n.min(500).to_string();
    let pid = fleet.spawn_worker(
        &format!("bench-rss-{provider}-{n}"),
        &[
            "--concurrency",
            &conc,
            "--batch",
            &batch,
            "--lease",
            "60s",
            "--idle",
            "50ms",
        ],
    )?;
    let t0 = Instant::now();
    let mut max_kib = 0;
    let mut in_flight_seen = 0usize;
    while t0.elapsed() < Duration::from_secs(if n > 1000 { 25 } else { 8 }) {
        max_kib = max_kib.max(rss_kib(pid).unwrap_or(0));
        let leased = store
            .bench_leases_since(phase)
            .await?
            .iter()
            .filter(|(_, o, _)| o.is_some())
            .count();
        in_flight_seen = in_flight_seen.max(leased);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fleet.stop_workers();
    store.bench_retire_since(phase).await?;
    Ok((max_kib, in_flight_seen))
}

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The benchmark's phases, by name (a misspelt one is refused, not silently skipped).
const PHASES: [&str; 9] = [
    "claim",
    "ceiling",
    "e2e",
    "realistic",
    "hol",
    "idle",
    "takeover",
    "rss",
    "large",
];

pub async fn run(mut a: BenchArgs, database_url: Option<&str>) -> CmdResult {
    if a.quick {
        a.ceiling_secs = 2;
        a.clients = vec![4, 16];
        a.workers = vec![1, 2];
        a.e2e_operations = 300;
        a.realistic_operations = 40;
        a.hol_operations = 60;
        a.idle_secs = 20;
        a.large_table = 50_000;
        a.rss_in_flight = vec![100, 1000];
    }
    // Where the results go is checked before the run, not found wanting after an hour of it (a
    // file made only to check is removed again: a run refused later leaves nothing behind).
    let existed = a.json_out.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&a.json_out)
        .map_err(|e| {
            fail(
                exit::BAD_INPUT,
                format!("--json-out {}: {e}", a.json_out.display()),
            )
        })?;
    if !existed {
        let _ = std::fs::remove_file(&a.json_out);
    }
    let t_all = Instant::now();
    let mut fleet = Fleet::start("bench", database_url).await?;
    fleet.worker_args = vec!["--write-batch".into(), a.write_batch.to_string()];
    let store = fleet.store.clone();
    let mut out = serde_json::Map::new();
    println!("jobtrail bench on {}", fleet.shown_url());
    let on = |p: &str| a.phases.is_empty() || a.phases.iter().any(|x| x == p);
    let (mut small_p50, mut small_n, mut small_p95) = (f64::NAN, 0, f64::NAN);
    let (mut best_batched, mut best_lean, mut best_e2e, mut commits_per_op, mut p50, mut max_take) =
        (f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN);
    let (mut hol_ratio, mut hol_other_ratio, mut idle_per_min) = (f64::NAN, f64::NAN, f64::NAN);
    let (mut rss_per_call_kib, mut rss_per_call_h2_kib, mut hot_share) =
        (f64::NAN, f64::NAN, f64::NAN);
    let (mut lean_cpu, mut e2e_cpu) = (None, None);
    let lease = Duration::from_secs(5);
    let idle = Duration::from_millis(100);

    if on("claim") {
        // (4a) Claim latency with a small table: 8k terminal + 2k due rows.
        let phase = chrono::Utc::now();
        store.bench_seed(8_000, "succeeded").await?;
        store.bench_seed(2_000, "observing").await?;
        store.bench_analyze().await?;
        small_n = store.totals().await?.0;
        (small_p50, small_p95) = claim_latency(&store, 200).await?;
        store.bench_retire_since(phase).await?;
        println!(
            "claim latency, {small_n} operations: p50 {small_p50:.2} ms, p95 {small_p95:.2} ms"
        );
    }

    if on("ceiling") {
        // (1) The ceiling.
        let phase = chrono::Utc::now();
        store.bench_seed(20_000, "observing").await?;
        store.bench_analyze().await?;
        let mut ceiling = Vec::new();
        best_batched = 0.0f64;
        best_lean = 0.0f64;
        // "jobtrail": the claim query and the worker's fenced batch write (jobtrail's own statements
        // and code, one transaction per batch). "lean": one hand-tuned claim + history insert and
        // one narrow head update; an upper bound, printed for comparison.
        for (kind, batch) in [
            ("jobtrail", 1i64),
            ("jobtrail", 32),
            ("lean", 1),
            ("lean", 32),
        ] {
            for &clients in &a.clients {
                let pool = Store::connect_with(&fleet.url, clients as u32).await?;
                let (tx, rows) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
                let end = Instant::now() + Duration::from_secs(a.ceiling_secs);
                let mut tasks = Vec::new();
                let (db0, me0) = (database_cpu(), cpu_secs("self").unwrap_or(0.0));
                for client in 0..clients {
                    let (pool, tx, rows) = (pool.clone(), tx.clone(), rows.clone());
                    let owner = format!("bench-ceiling-{client}");
                    tasks.push(tokio::spawn(async move {
                        while Instant::now() < end {
                            let step = match kind {
                                "jobtrail" => pool.bench_ceiling_jobtrail(&owner, batch).await,
                                _ => pool.bench_ceiling_step(batch).await,
                            };
                            if let Ok(n) = step {
                                tx.fetch_add(1, Ordering::Relaxed);
                                rows.fetch_add(n, Ordering::Relaxed);
                            }
                        }
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
                // Read before the pool closes: a server process's CPU leaves with it.
                let (db_cpu, _, me_cpu) = cpu_split(&db0, me0, &[]);
                pool.close().await;
                let secs = a.ceiling_secs as f64;
                let (tps, rps) = (
                    tx.load(Ordering::Relaxed) as f64 / secs,
                    rows.load(Ordering::Relaxed) as f64 / secs,
                );
                let cpu = CpuPerTransition::of(db_cpu, 0.0, me_cpu, rps * secs, secs);
                if batch > 1 && kind == "jobtrail" {
                    best_batched = best_batched.max(rps);
                } else if batch > 1 && rps > best_lean {
                    best_lean = rps;
                    lean_cpu = Some(cpu);
                }
                println!(
                    "ceiling ({kind:<8}) batch {batch:>2} × {clients:>2} clients: {tps:>8.0} tx/s {rps:>8.0} transitions/s; CPU per transition {:.0} µs database, {:.0} µs benchmark ({:.0} % of the machine busy)",
                    cpu.database_us,
                    cpu.provider_and_bench_us,
                    cpu.busy * 100.0
                );
                ceiling.push(serde_json::json!({"statements": kind, "batch": batch, "clients": clients, "tx_per_sec": tps, "transitions_per_sec": rps, "cpu_us_per_transition": cpu.json()}));
            }
        }
        store.bench_retire_since(phase).await?;
        out.insert("ceiling".into(), ceiling.into());
    }

    if on("e2e") {
        // (2) End to end, zero-latency provider.
        let mut e2e = Vec::new();
        best_e2e = 0.0f64;
        for &w in &a.workers {
            let phase = chrono::Utc::now();
            submit_many(
                &fleet,
                a.e2e_operations,
                serde_json::json!({"duration_ms": 0}),
                "e2e",
            )
            .await?;
            let (_, h0, _) = store.totals().await?;
            let commits0 = settled_commits(&fleet.url).await?;
            let tables0 = store.bench_table_updates().await?;
            // Where the database's time goes, by statement, if the server records it.
            let statements = store.bench_statements_enable().await.unwrap_or(false)
                && store.bench_statements_reset().await.is_ok();
            let (db_cpu0, me_cpu0) = (database_cpu(), cpu_secs("self").unwrap_or(0.0));
            let t0 = Instant::now();
            let (conc, batch) = (a.e2e_concurrency.to_string(), a.e2e_batch.to_string());
            for i in 0..w {
                fleet.spawn_worker(
                    &format!("bench-e2e-{w}-{i}"),
                    &["--concurrency", &conc, "--batch", &batch, "--idle", "50ms"],
                )?;
            }
            let (done, polls) = wait_settled(
                &fleet.url,
                Duration::from_secs(300),
                Duration::from_millis(20),
            )
            .await?;
            let secs = t0.elapsed().as_secs_f64();
            let (db_cpu, worker_cpu, sim_cpu) = cpu_split(&db_cpu0, me_cpu0, &fleet.worker_pids());
            fleet.stop_workers();
            let _ = polls; // reads take no transaction id
            let commits = (settled_commits(&fleet.url).await? - commits0) as f64;
            let (_, h1, _) = store.totals().await?;
            let transitions = (h1 - h0) as f64;
            let (ops_s, tr_s) = (a.e2e_operations as f64 / secs, transitions / secs);
            let cpu = CpuPerTransition::of(db_cpu, worker_cpu, sim_cpu, transitions, secs);
            if tr_s > best_e2e {
                best_e2e = tr_s;
                e2e_cpu = Some(cpu);
            }
            println!(
                "end to end {w} worker(s): {ops_s:>7.0} operations/s {tr_s:>7.0} transitions/s ({:.1} transitions/op, {:.2} commits/transition){}",
                transitions / a.e2e_operations as f64,
                commits / transitions.max(1.0),
                if done { "" } else { " TIMED OUT" }
            );
            let total = db_cpu + worker_cpu + sim_cpu;
            println!(
                "    CPU {total:.1} s of {:.1} s available: database {:.0} %, workers {:.0} %, simulated provider and benchmark {:.0} %; per transition {:.0} / {:.0} / {:.0} µs",
                secs * cores(),
                db_cpu / total.max(0.001) * 100.0,
                worker_cpu / total.max(0.001) * 100.0,
                sim_cpu / total.max(0.001) * 100.0,
                cpu.database_us,
                cpu.workers_us,
                cpu.provider_and_bench_us,
            );
            let tables = table_updates(
                &tables0,
                &store.bench_table_updates().await?,
                a.e2e_operations,
            );
            if let Some(share) = tables["operations"]["hot_share"].as_f64() {
                hot_share = share;
            }
            let by_statement = if statements {
                statement_times(&store, transitions).await
            } else {
                println!(
                    "    database time by statement: not recorded (load pg_stat_statements: shared_preload_libraries, then restart the server)"
                );
                serde_json::Value::Null
            };
            e2e.push(serde_json::json!({"workers": w, "operations": a.e2e_operations, "secs": secs, "operations_per_sec": ops_s, "transitions_per_sec": tr_s, "commits_per_transition": commits / transitions.max(1.0), "completed": done, "tables": tables, "cpu_secs": {"database": db_cpu, "workers": worker_cpu, "provider_and_bench": sim_cpu}, "cpu_us_per_transition": cpu.json(), "database_ms_by_statement": by_statement}));
            store.bench_retire_since(phase).await?;
        }
        out.insert("end_to_end".into(), e2e.into());
    }

    if on("realistic") {
        // (3) Realistic: 2 s remote jobs, Retry-After 1 s.
        let phase = chrono::Utc::now();
        let c0 = settled_commits(&fleet.url).await?;
        let s0 = stat_commits(&fleet.url).await?;
        let ids = submit_many(
            &fleet,
            a.realistic_operations,
            serde_json::json!({"duration_ms": 2000, "poll_retry_after": 1}),
            "realistic",
        )
        .await?;
        let calls0 = store.totals().await?.2;
        for i in 0..2 {
            fleet.spawn_worker(&format!("bench-real-{i}"), &[])?;
        }
        let (done, polls) = wait_settled(
            &fleet.url,
            Duration::from_secs(120),
            Duration::from_millis(200),
        )
        .await?;
        fleet.stop_workers();
        let _ = polls; // reads take no transaction id
        let c1 = settled_commits(&fleet.url).await?;
        // The benchmark's own reads (this query, the waiting) are in this count too: a few per run.
        let s1 = stat_commits(&fleet.url).await?;
        let (_, _, calls1) = store.totals().await?;
        let ledger = fleet.sim.ledger();
        let ends: HashMap<String, chrono::DateTime<chrono::Utc>> = ledger
            .jobs
            .values()
            .filter_map(|j| Some((j.client_reference.clone()?, j.finishes_at?)))
            .collect();
        let mut lat = Vec::new();
        let mut states: BTreeMap<String, u64> = BTreeMap::new();
        for (id, state, finished) in store.bench_run(phase).await? {
            *states.entry(state).or_default() += 1;
            let key = jobtrail_core::OperationId::from_uuid(id).to_string();
            if let (Some(f), Some(remote)) = (finished, ends.get(&key)) {
                lat.push((f - *remote).num_milliseconds() as f64 / 1000.0);
            }
        }
        let n = ids.len() as f64;
        let calls_per_op = (calls1 - calls0) as f64 / n;
        let min_calls = 1.0 + (2.0f64 / 1.0).floor() + 1.0 + 1.0;
        commits_per_op = (s1 - s0) as f64 / n;
        let durable_per_op = (c1 - c0) as f64 / n;
        p50 = pct(lat.clone(), 0.5);
        let p95 = pct(lat, 0.95);
        println!(
            "realistic ({} ops, 2 s jobs, Retry-After 1 s): remote end → local success p50 {p50:.2} s p95 {p95:.2} s; {calls_per_op:.2} calls/op (minimum {min_calls}); {commits_per_op:.2} commits/op (pg_stat_database), {durable_per_op:.2} write transactions/op (transaction ids, autovacuum's included){}",
            ids.len(),
            if done { "" } else { " TIMED OUT" }
        );
        out.insert(
            "realistic".into(),
            serde_json::json!({"operations": ids.len(), "p50_secs": p50, "p95_secs": p95, "calls_per_operation": calls_per_op, "minimum_calls": min_calls, "commits_per_operation": commits_per_op, "write_transactions_per_operation": durable_per_op, "states": states, "completed": done}),
        );
        store.bench_retire_since(phase).await?;
    }

    if on("hol") {
        // (7) Head of line: 2 s jobs on one provider, a third as many on a second provider, one
        // worker of 16 slots; then the same with a thirtieth as many creates on the first provider,
        // at the head of its queue, that hang to the contract's request timeout (twice each).
        // Completion times of the fast jobs, from the worker's start.
        let mut runs = Vec::new();
        let mut p50s = [[f64::NAN; 2]; 2];
        for (i, slow) in [false, true].into_iter().enumerate() {
            let phase = chrono::Utc::now();
            let job = serde_json::json!({"duration_ms": 2000});
            let n_slow = if slow {
                (a.hol_operations / 30).max(2)
            } else {
                0
            };
            let hang = serde_json::json!({"create": ["slow_accept", "slow_accept"], "create_delay_ms": 60000});
            // The hanging creates first: they are the head of the line.
            submit_many(&fleet, n_slow, hang, "hol-slow").await?;
            let fast = submit_many(&fleet, a.hol_operations, job, "hol").await?;
            let csv = serde_json::json!({"duration_ms": 2000, "format": "csv"});
            let other =
                submit_many_to(&fleet, "sim-csv", a.hol_operations / 3, csv, "hol-other").await?;
            let t0 = chrono::Utc::now();
            fleet.spawn_worker(&format!("bench-hol-{i}"), &["--concurrency", "16"])?;
            let fast_ids: std::collections::HashSet<_> =
                fast.iter().map(|id| id.as_uuid()).collect();
            let other_ids: std::collections::HashSet<_> =
                other.iter().map(|id| id.as_uuid()).collect();
            let deadline = Instant::now() + Duration::from_secs(300);
            let (mut lat, mut lat_other, mut states) = (Vec::new(), Vec::new(), BTreeMap::new());
            loop {
                let run = store.bench_run(phase).await?;
                let finished = |ids: &std::collections::HashSet<uuid::Uuid>| {
                    run.iter()
                        .filter(|(id, _, f)| ids.contains(id) && f.is_some())
                        .count()
                };
                if (finished(&fast_ids) == fast_ids.len()
                    && finished(&other_ids) == other_ids.len())
                    || Instant::now() > deadline
                {
                    for (id, state, f) in run {
                        let secs = f.map(|f| (f - t0).num_milliseconds() as f64 / 1000.0);
                        if fast_ids.contains(&id) {
                            *states.entry(state).or_insert(0u64) += 1;
                            lat.extend(secs);
                        } else if other_ids.contains(&id) {
                            *states.entry(state).or_insert(0u64) += 1;
                            lat_other.extend(secs);
                        }
                    }
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            fleet.stop_workers();
            let (f50, f95, o50, o95) = (
                pct(lat.clone(), 0.5),
                pct(lat, 0.95),
                pct(lat_other.clone(), 0.5),
                pct(lat_other, 0.95),
            );
            p50s[i] = [f50, o50];
            println!(
                "head of line, {}: {} fast jobs done p50 {f50:.2} s p95 {f95:.2} s; second provider ({}) p50 {o50:.2} s p95 {o95:.2} s; states {states:?}",
                if slow {
                    format!("with {n_slow} creates that hang")
                } else {
                    "no slow calls".to_string()
                },
                a.hol_operations,
                a.hol_operations / 3,
            );
            runs.push(serde_json::json!({"slow_creates": n_slow, "fast_p50_secs": f50, "fast_p95_secs": f95, "other_provider_p50_secs": o50, "other_provider_p95_secs": o95, "states": states}));
            store.bench_retire_since(phase).await?;
        }
        hol_ratio = p50s[1][0] / p50s[0][0];
        hol_other_ratio = p50s[1][1] / p50s[0][1];
        out.insert("head_of_line".into(), runs.into());
    }

    if on("idle") {
        // (8) The cost of an idle worker: the statements it sends while it has nothing to do, from
        // its own statement log between its first claim (after the once-per-process LISTEN set-up)
        // and "stopping". A claim and a next-due read are each one statement in a transaction of
        // their own (its BEGIN is not logged, its COMMIT is and is not counted again); anything else
        // is its own transaction: so at most that many commits. Counted at the worker:
        // pg_stat_database's figure is drowned by autovacuum's visits on an otherwise quiet server.
        let secs = a.idle_secs.max(5);
        fleet.spawn_worker_with(
            "bench-idle",
            &[],
            &[(
                "JOBTRAIL_LOG",
                "warn,jobtrail_worker=info,sqlx::query=debug",
            )],
        )?;
        tokio::time::sleep(Duration::from_secs(secs)).await;
        fleet.stop_workers();
        let log = std::fs::read_to_string(fleet.worker_log("bench-idle")).unwrap_or_default();
        let statements = log
            .lines()
            .skip_while(|l| !l.contains("The worker's claim"))
            .take_while(|l| !l.contains("stopping"))
            // (the summary field may be wrapped in colour codes)
            .filter(|l| l.contains("sqlx::query") && !l.contains("\"COMMIT\""))
            .count();
        idle_per_min = statements as f64 / secs as f64 * 60.0;
        println!(
            "idle worker: {statements} statements in {secs} s: {idle_per_min:.1} commits per idle worker-minute at most (with --ops-listen, add the metrics' database gauges: one read per JOBTRAIL_METRICS_REFRESH, 15 s by default)"
        );
        out.insert(
            "idle".into(),
            serde_json::json!({"secs": secs, "statements": statements, "commits_per_idle_minute": idle_per_min}),
        );
    }

    if on("takeover") {
        // (6) Takeover after kill -9.
        let phase = chrono::Utc::now();
        // A lease longer than the contract's longest call (connect 1 s + request 2 s), so it is not
        // extended before calls: what is measured is the configured lease.
        submit_many(
            &fleet,
            50,
            serde_json::json!({"never_finish": true, "status_delay_ms": 60000}),
            "takeover",
        )
        .await?;
        fleet.spawn_worker("bench-victim", &["--lease", "5s", "--idle", "100ms"])?;
        let t_wait = Instant::now();
        let held_at_kill = loop {
            let leases = store.bench_leases_since(phase).await?;
            let held: Vec<_> = leases
                .iter()
                .filter(|(_, o, _)| o.as_deref() == Some("bench-victim"))
                .map(|(id, _, exp)| (*id, *exp))
                .collect();
            if held.len() >= 40 || t_wait.elapsed() > Duration::from_secs(30) {
                break held;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        fleet.spawn_worker("bench-heir", &["--lease", "5s", "--idle", "100ms"])?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let killed_at = chrono::Utc::now();
        let t_kill = Instant::now();
        fleet.signal("bench-victim", libc::SIGKILL);
        let mut taken: HashMap<uuid::Uuid, f64> = HashMap::new();
        let held_ids: HashMap<uuid::Uuid, Option<chrono::DateTime<chrono::Utc>>> =
            held_at_kill.iter().cloned().collect();
        while taken.len() < held_ids.len() && t_kill.elapsed() < Duration::from_secs(30) {
            for (id, owner, _) in store.bench_leases_since(phase).await? {
                if held_ids.contains_key(&id) && owner.as_deref() == Some("bench-heir") {
                    taken.entry(id).or_insert(t_kill.elapsed().as_secs_f64());
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let remaining: Vec<f64> = held_ids
            .values()
            .filter_map(|e| e.map(|e| (e - killed_at).num_milliseconds() as f64 / 1000.0))
            .collect();
        max_take = taken.values().cloned().fold(0.0, f64::max);
        let max_remaining = remaining.iter().cloned().fold(0.0, f64::max);
        fleet.stop_workers();
        store.bench_retire_since(phase).await?;
        println!(
            "takeover after kill -9: {} leases held; all taken over after {max_take:.2} s (longest lease still to run at the kill: {max_remaining:.2} s; lease {} s + claim interval {} ms)",
            held_ids.len(),
            lease.as_secs(),
            idle.as_millis()
        );
        out.insert(
            "takeover".into(),
            serde_json::json!({"leases_held": held_ids.len(), "taken_over": taken.len(), "max_secs": max_take, "max_lease_remaining_secs": max_remaining, "lease_secs": lease.as_secs_f64(), "claim_interval_secs": idle.as_secs_f64()}),
        );
    }

    if on("rss") {
        // (5) Worker RSS with N operations in flight (status calls held open by the simulator),
        // over HTTP/1.1 (a connection per call in flight) and over HTTP/2 (one connection, a
        // stream per call: `sim-h2`, the same contract with `http_version = "2"`).
        let mut rss = Vec::new();
        for (provider, http) in [("sim", "1.1"), ("sim-h2", "2")] {
            let mut runs = Vec::new();
            let connections_before = fleet.sim.ledger().connections;
            for &n in &a.rss_in_flight {
                let (max_kib, in_flight_seen) = worker_rss(&mut fleet, provider, n).await?;
                println!(
                    "worker RSS with {n} operations submitted over HTTP/{http}: max {:.1} MiB (most leased at once: {in_flight_seen})",
                    max_kib as f64 / 1024.0
                );
                runs.push((in_flight_seen as f64, max_kib as f64 / 1024.0));
                rss.push(serde_json::json!({"http": http, "operations": n, "max_rss_mib": max_kib as f64 / 1024.0, "max_in_flight": in_flight_seen}));
            }
            let connections = fleet.sim.ledger().connections - connections_before;
            println!("connections the simulator accepted over HTTP/{http}: {connections}");
            // What one more call in flight costs: the growth from the smallest to the largest load.
            if let (Some(&(n0, m0)), Some(&(n1, m1))) = (runs.first(), runs.last())
                && n1 > n0
            {
                let per_call = (m1 - m0) * 1024.0 / (n1 - n0);
                println!("worker RSS per call in flight over HTTP/{http}: {per_call:.1} KiB");
                if http == "1.1" {
                    rss_per_call_kib = per_call;
                } else {
                    rss_per_call_h2_kib = per_call;
                }
            }
        }
        let by_version = fleet.sim.ledger().requests_by_version;
        println!("the simulator's requests by HTTP version: {by_version:?}");
        out.insert("worker_rss".into(), rss.into());
    }

    let mut large_p50 = f64::NAN;
    if on("large") {
        // (4b) Claim latency with a large table.
        let now_n = store.totals().await?.0;
        let ballast = (a.large_table - now_n - 2_000).max(0);
        let t_seed = Instant::now();
        let mut left = ballast;
        while left > 0 {
            let chunk = left.min(100_000);
            store.bench_seed(chunk, "succeeded").await?;
            left -= chunk;
        }
        let phase = chrono::Utc::now();
        store.bench_seed(2_000, "observing").await?;
        store.bench_analyze().await?;
        let dead = store.bench_dead_tuples().await?;
        let large_n = store.totals().await?.0;
        let (lp50, large_p95) = claim_latency(&store, 200).await?;
        large_p50 = lp50;
        store.bench_retire_since(phase).await?;
        println!(
            "claim latency, {large_n} operations: p50 {large_p50:.2} ms, p95 {large_p95:.2} ms (ballast inserted in {:.0} s; {dead} dead tuples at the start)",
            t_seed.elapsed().as_secs_f64()
        );
        out.insert(
            "claim_latency".into(),
            serde_json::json!({"small": {"operations": small_n, "p50_ms": small_p50, "p95_ms": small_p95}, "large": {"operations": large_n, "p50_ms": large_p50, "p95_ms": large_p95}}),
        );
    }

    // Targets: printed, not asserted.
    let targets = serde_json::json!({
        "transitions_vs_batched_ceiling": {"value": ratio(best_e2e, best_batched), "target": ">= 0.60"},
        "transitions_vs_lean_ceiling": {"value": ratio(best_e2e, best_lean), "target": ">= 0.80"},
        "operations_updates_hot_share": {"value": hot_share, "target": ">= 0.50 (most step updates HOT)"},
        "worker_rss_kib_per_call_in_flight": {"value": rss_per_call_kib, "target": "<= 25 (HTTP/1.1: a connection per call)"},
        "worker_rss_kib_per_call_in_flight_h2": {"value": rss_per_call_h2_kib, "target": "<= 25 (HTTP/2: a stream per call)"},
        "commits_per_operation_realistic": {"value": commits_per_op, "target": "<= 8"},
        "p50_remote_end_to_local_success_secs": {"value": p50, "target": "<= 1.5 (remote duration + 1.5 s)"},
        "takeover_secs": {"value": max_take, "target": format!("<= {:.2} (lease + one claim interval)", lease.as_secs_f64() + idle.as_secs_f64())},
        "claim_latency_large_vs_small": {"value": large_p50 / small_p50.max(0.001), "target": "<= 2"},
        "head_of_line_fast_p50_slow_vs_none": {"value": hol_ratio, "target": "<= 1.2"},
        "head_of_line_other_provider_p50_ratio": {"value": hol_other_ratio, "target": "<= 1.2 (unaffected)"},
        "commits_per_idle_worker_minute": {"value": idle_per_min, "target": "<= 6"},
    });
    println!("\ntargets (printed, not asserted):");
    for (k, v) in targets.as_object().expect("object") {
        println!(
            "  {k:<40} {:>10.3}   target {}",
            v["value"].as_f64().unwrap_or(f64::NAN),
            v["target"].as_str().unwrap_or("")
        );
    }
    out.insert("targets".into(), targets);
    if let (Some(lean), Some(e2e)) = (lean_cpu, e2e_cpu) {
        out.insert("lean_gap".into(), lean_gap(&lean, &e2e));
    }
    out.insert("database".into(), fleet.shown_url().into());
    out.insert("elapsed_secs".into(), t_all.elapsed().as_secs_f64().into());
    out.insert("at".into(), chrono::Utc::now().to_rfc3339().into());
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(out)).expect("json");
    // The database is removed (or kept) whether or not the results could be written: the figures
    // were printed above either way.
    let written = std::fs::write(&a.json_out, text);
    match &written {
        Ok(()) => println!(
            "\nresults written to {} ({:.0} s in all)",
            a.json_out.display(),
            t_all.elapsed().as_secs_f64()
        ),
        Err(e) => eprintln!(
            "\nthe results were not written to {}: {e}",
            a.json_out.display()
        ),
    }
    drop(store);
    if a.keep_database {
        println!("kept the database: {}", fleet.shown_url());
    } else if let Some(name) = fleet.remove().await? {
        println!("dropped the benchmark database {name} (--keep-database keeps it)");
    }
    written.map_err(|e| fail(exit::UNAVAILABLE, format!("{}: {e}", a.json_out.display())))?;
    Ok(ExitCode::SUCCESS)
}
