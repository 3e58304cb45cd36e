//! Running it where it lives: a worker process's /livez, /readyz and /metrics (scraped during a real
//! run against the simulated provider), its JSON logs, its flags given as environment variables, and
//! the refusal to run without DATABASE_URL.

#[path = "support/mod.rs"]
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{Env, ops_address, sample};

/// Longer than the readiness answer is cached.
const READY_CACHE: Duration = Duration::from_millis(1100);

async fn get(url: &str) -> (u16, String) {
    let r = support::http().get(url).send().await.expect("GET");
    (r.status().as_u16(), r.text().await.unwrap())
}

/// A claim the database does not answer in time is counted (`jobtrail_claim_failures_total`): a
/// worker that cannot claim shows on a dashboard, not only in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_database_does_not_answer_is_counted() {
    use sqlx::Connection;
    let env = Env::new().await;
    let mut worker = env.spawn_worker(
        "claim-fails",
        "10s",
        &[
            ("JOBTRAIL_OPS_LISTEN", "127.0.0.1:0"),
            ("JOBTRAIL_DB_ANSWER_WITHIN", "1s"),
        ],
    );
    let base = ops_address(&worker.log);
    let failures = || async {
        let (_, metrics) = get(&format!("{base}/metrics")).await;
        sample(&metrics, "jobtrail_claim_failures_total", &[]).unwrap_or(0.0)
    };
    assert_eq!(failures().await, 0.0);
    // The table held for longer than the worker waits for an answer: its claims go unanswered.
    let mut holder = sqlx::PgConnection::connect(&env.url).await.unwrap();
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("LOCK TABLE operations IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    tx.rollback().await.unwrap();
    let series = "jobtrail_claim_failures_total";
    let metrics = scrape_until(&base, series, &[], 1.0).await;
    assert!(
        sample(&metrics, series, &[]).is_some_and(|n| n >= 1.0),
        "no failed claim counted:\n{}",
        std::fs::read_to_string(&worker.log).unwrap_or_default()
    );
    worker.signal(libc::SIGTERM);
    assert!(worker.wait_exit(Duration::from_secs(30)).is_some());
}

/// A notification's lag is measured when it arrives, not when the worker next looks: with its one
/// slot held by a create that takes 1.8 s, a worker looks more than a second after a new submission's
/// notification arrived, and that wait is not the notification's lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notification_lag_is_not_the_time_a_busy_worker_took_to_look() {
    let env = Env::new().await;
    let mut worker = env.spawn_worker(
        "lag-1",
        "10s",
        &[
            ("JOBTRAIL_OPS_LISTEN", "127.0.0.1:0"),
            ("JOBTRAIL_CONCURRENCY", "1"),
        ],
    );
    let base = ops_address(&worker.log);
    let slow = env
        .submit("sim", serde_json::json!({"create_hold_ms": 1800}), |_| {})
        .await;
    // Its create is in flight (the one slot is busy) before the next is submitted.
    let deadline = Instant::now() + Duration::from_secs(20);
    while env.store.get(slow.id).await.unwrap().lease_owner.is_none() {
        assert!(Instant::now() < deadline, "the slow create never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let next = env
        .submit("sim", serde_json::json!({"duration_ms": 50}), |_| {})
        .await;
    for id in [slow.id, next.id] {
        let done = env.wait_settled(id, Duration::from_secs(60)).await;
        assert_eq!(done.state.as_str(), "succeeded", "{}", env.logs());
    }
    let (_, metrics) = get(&format!("{base}/metrics")).await;
    let count = sample(&metrics, "jobtrail_notification_lag_seconds_count", &[]).unwrap_or(0.0);
    let sum = sample(&metrics, "jobtrail_notification_lag_seconds_sum", &[]).unwrap_or(0.0);
    assert!(count >= 1.0, "{metrics}");
    assert!(sum < 0.5, "{count} notifications, {sum} s of lag in all");
    worker.stop_cleanly();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_health_and_metrics_during_a_run_and_logs_json_with_the_operation() {
    let env = Env::new().await;
    // Every setting through its environment form, as a Deployment gives them.
    let mut worker = env.spawn_worker(
        "ops-1",
        "10s",
        &[
            ("JOBTRAIL_OPS_LISTEN", "127.0.0.1:0"),
            ("JOBTRAIL_CONCURRENCY", "8"),
            ("JOBTRAIL_BATCH", "4"),
            ("JOBTRAIL_DB_POOL", "4"),
            ("JOBTRAIL_LOG_FORMAT", "json"),
            ("JOBTRAIL_METRICS_REFRESH", "1"),
        ],
    );
    let base = ops_address(&worker.log);

    let (status, body) = get(&format!("{base}/livez")).await;
    assert_eq!((status, body.trim()), (200, "ok"));
    // The listener opens before the database is connected: ready a moment later.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        let (status, body) = get(&format!("{base}/readyz")).await;
        if status == 200 || Instant::now() > deadline {
            break (status, body);
        }
        assert!(body.contains("starting"), "{body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status, 200, "{body}");
    let ready: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ready["ready"], true);
    assert!(ready["contracts"].as_u64().unwrap() >= 1, "{ready}");

    let mut ops = Vec::new();
    for _ in 0..6 {
        ops.push(
            env.submit("sim", serde_json::json!({"duration_ms": 200}), |_| {})
                .await,
        );
    }
    // Scraped while the run is going: the endpoint answers under load.
    let (status, during) = get(&format!("{base}/metrics")).await;
    assert_eq!(status, 200);
    assert!(
        during.contains("# TYPE jobtrail_claims_total counter"),
        "{during}"
    );
    for op in &ops {
        let done = env.wait_settled(op.id, Duration::from_secs(60)).await;
        assert_eq!(done.state.as_str(), "succeeded", "{}", env.logs());
    }
    // One more, submitted once the worker has a database clock to measure notification lag by.
    let last = env
        .submit("sim", serde_json::json!({"duration_ms": 50}), |_| {})
        .await;
    let done = env.wait_settled(last.id, Duration::from_secs(60)).await;
    assert_eq!(done.state.as_str(), "succeeded", "{}", env.logs());

    let (status, metrics) = get(&format!("{base}/metrics")).await;
    assert_eq!(status, 200);
    let claimed = sample(&metrics, "jobtrail_claimed_total", &[]).unwrap_or(0.0);
    assert!(claimed >= 7.0, "claimed {claimed}\n{metrics}");
    let creates = sample(
        &metrics,
        "jobtrail_provider_call_seconds_count",
        &["provider=\"sim\"", "call=\"create\"", "status=\"2xx\""],
    )
    .unwrap_or(0.0);
    assert_eq!(creates, 7.0, "one create per operation\n{metrics}");
    assert!(
        sample(
            &metrics,
            "jobtrail_provider_call_seconds_bucket",
            &["call=\"status\"", "le=\"+Inf\""]
        )
        .unwrap_or(0.0)
            >= 6.0,
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "jobtrail_steps_total",
            &["kind=\"create_accepted\"", "outcome=\"written\""]
        ),
        Some(7.0),
        "{metrics}"
    );
    // The database's gauges count open operations; the first scrape saw all six open.
    let open_during: f64 = during
        .lines()
        .filter(|l| l.starts_with("jobtrail_operations{") && l.contains("provider=\"sim\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!((1.0..=6.0).contains(&open_during), "{during}");
    assert_eq!(
        sample(&metrics, "jobtrail_escalations_open", &[]),
        Some(0.0)
    );
    assert!(sample(&metrics, "jobtrail_write_batch_size_count", &[]).unwrap_or(0.0) >= 1.0);
    assert!(sample(&metrics, "jobtrail_claim_lag_seconds_count", &[]).unwrap_or(0.0) >= 7.0);
    let notified = sample(&metrics, "jobtrail_notification_lag_seconds_count", &[]).unwrap_or(0.0);
    assert!(notified >= 1.0, "{metrics}");
    // Refreshed (every second here): every operation has ended, so every series seen open is 0,
    // not left at its last value.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (_, later) = get(&format!("{base}/metrics")).await;
    let series: Vec<&str> = later
        .lines()
        .filter(|l| l.starts_with("jobtrail_operations{") && l.contains("provider=\"sim\""))
        .collect();
    assert!(!series.is_empty(), "{later}");
    assert!(series.iter().all(|l| l.ends_with(" 0")), "{series:?}");
    // Label values come from closed sets: no provider text, no operation ids.
    assert!(!metrics.contains("op_"), "{metrics}");

    // A newer release migrated the database (a rolling upgrade): still ready, with a note, so
    // old pods do not all leave their Service at once.
    let admin = sqlx::PgPool::connect(&env.url).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99991231000000, 'from the future', true, '\\x00', 0)",
    )
    .execute(&admin)
    .await
    .unwrap();
    tokio::time::sleep(READY_CACHE).await;
    let (status, body) = get(&format!("{base}/readyz")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("newer than this jobtrail"), "{body}");
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 99991231000000")
        .execute(&admin)
        .await
        .unwrap();
    // A schema behind this binary (a migration missing) is not ready; the worker stays alive.
    let (newest,): (i64,) = sqlx::query_as("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(&admin)
        .await
        .unwrap();
    let (desc, checksum): (String, Vec<u8>) = sqlx::query_as(
        "DELETE FROM _sqlx_migrations WHERE version = $1 RETURNING description, checksum",
    )
    .bind(newest)
    .fetch_one(&admin)
    .await
    .unwrap();
    tokio::time::sleep(READY_CACHE).await;
    let (status, body) = get(&format!("{base}/readyz")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("behind this binary"), "{body}");
    assert_eq!(get(&format!("{base}/livez")).await.0, 200);
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, $2, true, $3, 0)",
    )
    .bind(newest)
    .bind(desc)
    .bind(checksum)
    .execute(&admin)
    .await
    .unwrap();
    tokio::time::sleep(READY_CACHE).await;
    assert_eq!(get(&format!("{base}/readyz")).await.0, 200);
    admin.close().await;

    worker.signal(libc::SIGTERM);
    let exit = worker.wait_exit(Duration::from_secs(30)).expect("stopped");
    assert!(exit.success());

    // JSON logs: every line of an operation's steps names the operation and its trace.
    let log = std::fs::read_to_string(&worker.log).unwrap();
    let op = &ops[0];
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("every JSON log line parses"))
        .collect();
    assert!(!lines.is_empty(), "{log}");
    let about_op: Vec<_> = lines
        .iter()
        .filter(|l| l["span"]["operation"] == op.id.to_string())
        .collect();
    assert!(
        !about_op.is_empty(),
        "no log line inside {}'s steps\n{log}",
        op.id
    );
    for l in about_op {
        assert_eq!(l["span"]["trace_id"], op.trace_id.to_string(), "{l}");
    }
    assert!(!log.contains(support::TOKEN), "a secret reached the logs");
}

fn bare(bin: &str, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env_remove("JOBTRAIL_API")
        .env("JOBTRAIL_PROVIDERS", support::providers_dir())
        // Where a private cluster would be created if anything tried: it must stay empty.
        .env(
            "XDG_DATA_HOME",
            std::env::temp_dir().join("jobtrail-no-cluster-here"),
        )
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// `jobtrail worker` against `url`, bounded: its exit code (`None`: still running after `limit`,
/// and then killed) and what it logged (kept in `dir`).
fn worker_within(url: &str, dir: &std::path::Path, limit: Duration) -> (Option<i32>, String) {
    let log = dir.join(format!("worker-{}.log", uuid::Uuid::now_v7().simple()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
        .arg("worker")
        .env("DATABASE_URL", url)
        .env("JOBTRAIL_PROVIDERS", support::providers_dir())
        .env_remove("JOBTRAIL_DB_WAIT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (code, std::fs::read_to_string(&log).unwrap_or_default())
}

#[test]
fn commands_on_the_database_require_database_url_and_start_no_database_of_their_own() {
    let jobtrail = env!("CARGO_BIN_EXE_jobtrail");
    let home = std::env::temp_dir().join("jobtrail-no-cluster-here");
    for (bin, args) in [
        (jobtrail, vec!["worker"]),
        (jobtrail, vec!["serve", "--listen", "127.0.0.1:0"]),
        (jobtrail, vec!["migrate"]),
        (jobtrail, vec!["list"]),
    ] {
        let out = bare(bin, &args, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "{args:?}: {err}");
        assert!(
            err.contains("DATABASE_URL is not set") && err.contains("jobtrail dev-db"),
            "{args:?}: {err}"
        );
    }
    assert!(
        !home.join("jobtrail").exists(),
        "a private cluster was started"
    );

    // Careless settings are refused before anything connects.
    for (args, envs, says) in [
        (vec!["worker"], vec![("JOBTRAIL_DB_POOL", "0")], "--db-pool"),
        (
            vec!["worker"],
            vec![("JOBTRAIL_CONCURRENCY", "0")],
            "--concurrency",
        ),
        (
            vec!["worker"],
            vec![("JOBTRAIL_LEASE", "100000000d")],
            "--lease",
        ),
        (
            vec!["worker"],
            vec![("JOBTRAIL_SHUTDOWN_GRACE", "2h")],
            "--shutdown-grace",
        ),
        (
            vec!["worker"],
            vec![("JOBTRAIL_OPS_LISTEN", "everywhere")],
            "ops-listen",
        ),
        (
            vec!["worker"],
            vec![("JOBTRAIL_DB_POOL", "many")],
            "--db-pool",
        ),
        (
            vec!["worker"],
            vec![("JOBTRAIL_DB_WAIT", "soon")],
            "--db-wait",
        ),
        (
            vec!["serve", "--listen", "127.0.0.1:0"],
            vec![("JOBTRAIL_DB_WAIT", "-5s")],
            "--db-wait",
        ),
        (
            vec!["worker"],
            vec![("JOBTRAIL_DB_WAIT", "400d")],
            "--db-wait",
        ),
        (
            vec!["worker"],
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
            "http/protobuf",
        ),
        // A sampler the SDK would quietly replace with "sample everything".
        (
            vec!["worker"],
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
                ("OTEL_TRACES_SAMPLER", "traceidration"),
            ],
            "parentbased_traceidratio",
        ),
        (
            vec!["worker"],
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "10%"),
            ],
            "a number from 0 to 1",
        ),
        (
            vec!["worker"],
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
            ],
            "a number from 0 to 1",
        ),
        // An exporter other than otlp or none would be taken for one of them.
        (
            vec!["worker"],
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
                ("OTEL_TRACES_EXPORTER", "zipkin"),
            ],
            "otlp (the default) or none",
        ),
    ] {
        let mut envs = envs.clone();
        envs.push(("DATABASE_URL", "postgres://nobody@127.0.0.1:9/none"));
        let out = bare(jobtrail, &args, &envs);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{envs:?}: {err}");
        assert!(err.contains(says), "{envs:?}: {err}");
    }
}

/// Scrape `base`'s metrics until `series` (its first sample with `labels`) reaches `at_least`
/// (bounded): the last scrape.
async fn scrape_until(base: &str, series: &str, labels: &[&str], at_least: f64) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, metrics) = get(&format!("{base}/metrics")).await;
        if sample(&metrics, series, labels).unwrap_or(0.0) >= at_least || Instant::now() > deadline
        {
            return metrics;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A step that panics (a bug) is counted and logged, and leaves the in-flight gauge and its slot:
/// the worker goes on claiming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_panics_is_counted_and_no_longer_counted_in_flight() {
    let env = Env::new().await;
    let worker = env.spawn_worker(
        "panics-1",
        "30s",
        &[
            ("JOBTRAIL_OPS_LISTEN", "127.0.0.1:0"),
            ("JOBTRAIL_CONCURRENCY", "1"),
            ("JOBTRAIL_FAULT", "panic_at:after_create_marked"),
            ("JOBTRAIL_LOG_FORMAT", "json"),
        ],
    );
    let base = ops_address(&worker.log);
    let series = "jobtrail_step_panics_total";
    let mut ids = Vec::new();
    for n in 1..=2 {
        // One slot: the second operation is claimed once the first's panic gave it back; each
        // panic leaves the in-flight gauge.
        ids.push(
            env.submit("sim", serde_json::json!({"duration_ms": 50}), |_| {})
                .await
                .id
                .to_string(),
        );
        let metrics = scrape_until(&base, series, &[], f64::from(n)).await;
        assert_eq!(
            sample(&metrics, series, &[]),
            Some(f64::from(n)),
            "{metrics}\n{}",
            env.logs()
        );
        assert_eq!(
            sample(&metrics, "jobtrail_steps_in_flight", &[]),
            Some(0.0),
            "{metrics}"
        );
    }
    let log = std::fs::read_to_string(&worker.log).unwrap();
    assert!(log.contains("a step panicked"), "{log}");
    // Each panic is a JSON line of its own, inside its step's span: it names the operation. No
    // plain-text line from the default hook breaks the log pipeline's JSON.
    assert!(!log.contains("thread '"), "{log}");
    let panicked: Vec<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("panicked: "))
        })
        .map(|l| l["span"]["operation"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(panicked, ids, "{log}");
    let (status, _) = get(&format!("{base}/livez")).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ops_listener_on_a_taken_port_is_refused_at_start() {
    let env = Env::new().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut worker = env.spawn_worker("ops-taken", "10s", &[("JOBTRAIL_OPS_LISTEN", &addr)]);
    let exit = worker.wait_exit(Duration::from_secs(30)).expect("exits");
    assert_eq!(exit.code(), Some(5));
    let log = std::fs::read_to_string(&worker.log).unwrap();
    assert!(log.contains(&format!("--ops-listen {addr}")), "{log}");
}

/// A certificate authority and a server certificate for `localhost` signed by it (PEM).
fn authority_and_server() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    (ca_cert.pem(), server.pem(), server_key.serialize_pem())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_require_and_verify_full_work_and_a_wrong_authority_is_refused() {
    jobtrail_provider::install_crypto();
    let cluster = tokio::task::spawn_blocking(|| {
        jobtrail_store::cluster::Cluster::throwaway(std::process::id())
    })
    .await
    .unwrap()
    .expect("a private cluster");
    let (ca, cert, key) = authority_and_server();
    let port = free_port();
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.serve_tls_on_loopback(port, &cert, &key))
        .await
        .unwrap()
        .expect("TLS on loopback");
    let dir = std::env::temp_dir().join(format!("jobtrail-tls-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let (other_ca, _, _) = authority_and_server();
    let other_file = dir.join("other-ca.pem");
    std::fs::write(&other_file, &other_ca).unwrap();

    let base = format!("postgres://postgres@localhost:{port}/postgres");
    let run = |url: String, args: &[&str]| {
        bare(
            env!("CARGO_BIN_EXE_jobtrail"),
            args,
            &[("DATABASE_URL", &url)],
        )
    };
    // verify-full: the server's certificate chains to the given authority and names the host.
    let verified = format!(
        "{base}?sslmode=verify-full&sslrootcert={}",
        ca_file.display()
    );
    let out = run(verified.clone(), &["migrate", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["migrated"], true);
    assert!(
        said["database"]
            .as_str()
            .unwrap()
            .starts_with("database \""),
        "{said}"
    );
    let out = run(verified.clone(), &["list", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // require: encrypted, the certificate not checked.
    let out = run(format!("{base}?sslmode=require"), &["list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The sessions really are encrypted (the server refuses TCP without TLS, and says so).
    let pool = sqlx::PgPool::connect(&verified).await.unwrap();
    let (ssl,): (bool,) =
        sqlx::query_as("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(ssl);
    pool.close().await;
    let out = run(format!("{base}?sslmode=disable"), &["list"]);
    assert_eq!(out.status.code(), Some(5));
    // verify-full to a host the certificate does not name (it names localhost): refused.
    let out = run(
        format!(
            "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=verify-full&sslrootcert={}",
            ca_file.display()
        ),
        &["list"],
    );
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // verify-full against another authority: refused, nothing connects.
    let out = run(
        format!(
            "{base}?sslmode=verify-full&sslrootcert={}",
            other_file.display()
        ),
        &["list"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // A worker waits at start for a database that is away, but not for a certificate refused or a
    // CA file missing (the TLS library says both as I/O errors): waiting would not mend them.
    let missing = dir.join("no-such-ca.pem");
    for (ca, says) in [(&other_file, "certificate"), (&missing, "no such file")] {
        let url = format!("{base}?sslmode=verify-full&sslrootcert={}", ca.display());
        let (code, err) = worker_within(&url, &dir, Duration::from_secs(40));
        assert_eq!(code, Some(5), "{err}");
        assert!(!err.contains("trying again"), "{err}");
        assert!(err.to_lowercase().contains(says), "{err}");
    }
    let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An OTLP/HTTP receiver on loopback: every trace export request it was sent, decoded.
async fn otlp_receiver() -> (String, ReceivedSpans) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let got = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let got = got.clone();
            async move {
                let req = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
                for rs in req.resource_spans {
                    let service = rs
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|a| a.key == "service.name")
                        .and_then(|a| a.value.as_ref())
                        .map(|v| format!("{:?}", v.value));
                    assert!(service.unwrap_or_default().contains("jobtrail"));
                    for ss in rs.scope_spans {
                        got.lock().unwrap().extend(ss.spans);
                    }
                }
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), spans)
}

type ReceivedSpans =
    std::sync::Arc<std::sync::Mutex<Vec<opentelemetry_proto::tonic::trace::v1::Span>>>;

/// A worker exporting its spans (every 100 ms) to a receiver of its own, with `extra` settings.
async fn traced_worker(
    env: &Env,
    id: &str,
    extra: &[(&str, &str)],
) -> (support::WorkerProcess, ReceivedSpans) {
    let (endpoint, spans) = otlp_receiver().await;
    let mut vars = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    vars.extend_from_slice(extra);
    (env.spawn_worker(id, "10s", &vars), spans)
}

/// A traced worker (with `extra` settings) that has carried one operation to success, stopped.
async fn traced_run(
    env: &Env,
    id: &str,
    extra: &[(&str, &str)],
) -> (
    support::WorkerProcess,
    ReceivedSpans,
    jobtrail_store::OperationRecord,
) {
    let (mut worker, spans) = traced_worker(env, id, extra).await;
    let op = env
        .submit("sim", serde_json::json!({"duration_ms": 100}), |_| {})
        .await;
    let done = env.wait_settled(op.id, Duration::from_secs(60)).await;
    assert_eq!(done.state.as_str(), "succeeded", "{}", env.logs());
    worker.stop_cleanly();
    (worker, spans, op)
}

/// `OTEL_TRACES_EXPORTER=none` exports nothing, whatever the endpoint (a platform that sets one for
/// every pod).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_exporter_exports_nothing() {
    let env = Env::new().await;
    let (_, spans, _) = traced_run(&env, "otel-none", &[("OTEL_TRACES_EXPORTER", "none")]).await;
    assert_eq!(spans.lock().unwrap().len(), 0);
}

/// A collector that refuses every export (a wrong endpoint, a token it does not take) is seen in
/// the worker's log, not only in traces that never come: the SDK's own errors are logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_refuses_every_export_is_said_in_the_log() {
    let env = Env::new().await;
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(|| async { axum::http::StatusCode::UNAUTHORIZED }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let mut worker = env.spawn_worker(
        "otel-refused",
        "10s",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let op = env
        .submit("sim", serde_json::json!({"duration_ms": 100}), |_| {})
        .await;
    let done = env.wait_settled(op.id, Duration::from_secs(60)).await;
    assert_eq!(done.state.as_str(), "succeeded", "{}", env.logs());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&worker.log).unwrap_or_default();
        if text.contains("ExportError") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the refused export was never said:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.stop_cleanly();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_receiver_one_trace_per_operation_with_the_ids_providers_received() {
    let env = Env::new().await;
    let (mut worker, spans) = traced_worker(&env, "otel-1", &[]).await;
    let op = env
        .submit("sim", serde_json::json!({"duration_ms": 300}), |_| {})
        .await;
    let done = env.wait_settled(op.id, Duration::from_secs(60)).await;
    assert_eq!(done.state.as_str(), "succeeded", "{}", env.logs());
    // An operation of an agent's trace: its root span is recorded under the agent's span.
    let agent = jobtrail_core::TraceParent {
        trace: "0af7651916cd43dd8448eb211c80319c".parse().unwrap(),
        span: "b7ad6b7169203331".parse().unwrap(),
        sampled: true,
    };
    let joined = env
        .submit("sim", serde_json::json!({"duration_ms": 100}), |s| {
            s.trace = Some(agent)
        })
        .await;
    let done = env.wait_settled(joined.id, Duration::from_secs(60)).await;
    assert_eq!(done.state.as_str(), "succeeded", "{}", env.logs());
    // A caller that names the root's own span id (it derives from an id the caller may choose)
    // does not make the root its own parent: the root is a root, and the operation is sampled as
    // one (its flag, unsampled, is not followed), all of it alike.
    let own = jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7());
    let looped = jobtrail_core::TraceParent {
        trace: "1af7651916cd43dd8448eb211c80319c".parse().unwrap(),
        span: jobtrail_core::SpanId::from_bytes(
            jobtrail_provider::spans::root_span_id(own).to_bytes(),
        )
        .unwrap(),
        sampled: false,
    };
    env.submit("sim", serde_json::json!({"duration_ms": 100}), |s| {
        s.operation_id = Some(own);
        s.trace = Some(looped);
    })
    .await;
    let done = env.wait_settled(own, Duration::from_secs(60)).await;
    assert_eq!(done.state.as_str(), "succeeded", "{}", env.logs());
    worker.stop_cleanly();

    let trace = hex::decode(op.trace_id.to_string()).unwrap();
    let spans = spans.lock().unwrap().clone();
    let joined_roots: Vec<_> = spans
        .iter()
        .filter(|s| s.name.starts_with("operation ") && s.trace_id == agent.trace.to_bytes())
        .collect();
    assert_eq!(joined_roots.len(), 1, "{joined_roots:?}");
    assert_eq!(joined_roots[0].parent_span_id, agent.span.to_bytes());
    let looped_roots: Vec<_> = spans
        .iter()
        .filter(|s| s.name.starts_with("operation ") && s.trace_id == looped.trace.to_bytes())
        .collect();
    assert_eq!(looped_roots.len(), 1, "{looped_roots:?}");
    assert!(
        looped_roots[0].parent_span_id.is_empty(),
        "{looped_roots:?}"
    );
    assert!(
        spans
            .iter()
            .any(|s| s.name.starts_with("step ") && s.trace_id == looped.trace.to_bytes()),
        "the looped operation's steps are sampled as its root is"
    );
    let ours: Vec<_> = spans.iter().filter(|s| s.trace_id == trace).collect();
    let hexid = |b: &[u8]| hex::encode(b);
    let names: Vec<&str> = ours.iter().map(|s| s.name.as_str()).collect();
    // The root: the operation, ended where it ended, with no parent.
    let roots: Vec<_> = ours
        .iter()
        .filter(|s| s.name.starts_with("operation "))
        .collect();
    assert_eq!(roots.len(), 1, "{names:?}");
    let root = roots[0];
    assert!(root.parent_span_id.is_empty(), "{names:?}");
    // Steps under the root; provider calls under steps.
    let steps: Vec<_> = ours
        .iter()
        .filter(|s| s.name.starts_with("step "))
        .collect();
    assert!(steps.len() >= 2, "{names:?}");
    for s in &steps {
        assert_eq!(s.parent_span_id, root.span_id, "{}", s.name);
    }
    let calls: Vec<_> = ours
        .iter()
        .filter(|s| s.name.starts_with("provider "))
        .collect();
    assert!(names.contains(&"provider create"), "{names:?}");
    assert!(names.contains(&"provider status"), "{names:?}");
    assert!(names.contains(&"provider result"), "{names:?}");
    let step_ids: Vec<_> = steps.iter().map(|s| s.span_id.clone()).collect();
    for c in &calls {
        assert!(
            step_ids.contains(&c.parent_span_id),
            "{} has no step parent",
            c.name
        );
    }
    // Each call's span is the one its traceparent named: what the provider received, and what
    // the call log recorded.
    let received = env.sim.ledger().traceparents;
    let recorded = env.store.calls(op.id).await.unwrap();
    assert_eq!(calls.len(), recorded.len(), "{names:?}");
    for c in &calls {
        let sent = format!("00-{}-{}-01", op.trace_id, hexid(&c.span_id));
        assert!(
            received.contains(&sent),
            "the provider never received {sent}: {received:?}"
        );
        assert!(
            recorded.iter().any(|r| r.span_id == hexid(&c.span_id)),
            "{} is not in the call log",
            c.name
        );
    }
}

/// With a parent-based ratio sampler an operation's trace is sampled whole or not at all: by the
/// agent's flag where it sent a trace context, by its trace id otherwise. The SDK's parent-based
/// sampler follows the flags jobtrail sets on the contexts it builds, so those flags must carry the
/// decision, and providers are told it in the `traceparent` they receive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ratio_sampler_keeps_or_drops_each_operations_trace_whole_and_tells_the_provider() {
    let env = Env::new().await;
    let (mut worker, spans) = traced_worker(
        &env,
        "otel-ratio",
        &[
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
        ],
    )
    .await;
    // An operation of an agent's trace follows the agent's sampled flag, whatever its trace id
    // (the ratio sampler reads an id's low 8 bytes: these fall either side of one half) ...
    let caller: jobtrail_core::SpanId = "b7ad6b7169203331".parse().unwrap();
    let mut ops = Vec::new();
    for (trace, sampled) in [
        ("4bf92f3577b34da60000000000000001", true),
        ("5bf92f3577b34da60000000000000001", false),
        ("4bf92f3577b34da6ffffffffffffffff", true),
        ("5bf92f3577b34da6ffffffffffffffff", false),
    ] {
        let trace: jobtrail_core::TraceId = trace.parse().unwrap();
        let op = env
            .submit("sim", serde_json::json!({"duration_ms": 100}), |s| {
                s.trace = Some(jobtrail_core::TraceParent {
                    trace,
                    span: caller,
                    sampled,
                })
            })
            .await;
        ops.push((op, sampled));
    }
    // ... and one of its own trace is decided by the ratio, from its id, on every worker alike.
    for _ in 0..6 {
        let op = env
            .submit("sim", serde_json::json!({"duration_ms": 100}), |_| {})
            .await;
        let low = u64::from_be_bytes(op.trace_id.to_bytes()[8..].try_into().unwrap());
        ops.push((op, (low >> 1) < (1u64 << 62)));
    }
    for (op, _) in &ops {
        let done = env.wait_settled(op.id, Duration::from_secs(60)).await;
        assert_eq!(done.state.as_str(), "succeeded", "{}", env.logs());
    }
    worker.stop_cleanly();
    let spans = spans.lock().unwrap().clone();
    let received = env.sim.ledger().traceparents;
    for (op, sampled) in &ops {
        let trace = op.trace_id.to_string();
        let mine: Vec<&str> = spans
            .iter()
            .filter(|s| hex::encode(&s.trace_id) == trace)
            .map(|s| s.name.as_str())
            .collect();
        let calls: Vec<&String> = received
            .iter()
            .filter(|t| t.starts_with(&format!("00-{trace}-")))
            .collect();
        assert!(calls.len() >= 3, "{trace}: {calls:?}");
        if *sampled {
            for name in [
                "operation sim",
                "step ",
                "provider create",
                "provider result",
            ] {
                assert!(
                    mine.iter().any(|m| m.starts_with(name)),
                    "{trace} lacks {name}: {mine:?}"
                );
            }
            assert!(calls.iter().all(|t| t.ends_with("-01")), "{calls:?}");
        } else {
            assert!(mine.is_empty(), "{trace} was dropped, yet: {mine:?}");
            assert!(calls.iter().all(|t| t.ends_with("-00")), "{calls:?}");
        }
    }
}

/// A remote sampler the spec names but this SDK lacks (the OpenTelemetry Operator may inject
/// one) does not stop a worker: it samples everything, as the default does, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_sampler_named_falls_back_to_sampling_everything_with_a_warning() {
    let env = Env::new().await;
    let (worker, spans, op) =
        traced_run(&env, "otel-xray", &[("OTEL_TRACES_SAMPLER", " XRay ")]).await;
    let log = std::fs::read_to_string(&worker.log).unwrap();
    assert!(log.contains("remote sampler"), "{log}");
    let trace = hex::decode(op.trace_id.to_string()).unwrap();
    let names: Vec<String> = spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.trace_id == trace)
        .map(|s| s.name.clone())
        .collect();
    assert!(names.iter().any(|n| n == "operation sim"), "{names:?}");
    let sent = env.sim.ledger().traceparents;
    let ours: Vec<&String> = sent
        .iter()
        .filter(|t| t.contains(&op.trace_id.to_string()))
        .collect();
    assert!(
        !ours.is_empty() && ours.iter().all(|t| t.ends_with("-01")),
        "{ours:?}"
    );
}

/// The query the chart's KEDA trigger runs (helm/jobtrail/templates/_helpers.tpl, "dueQuery").
fn chart_due_query() -> String {
    let helpers = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../helm/jobtrail/templates/_helpers.tpl"
    ))
    .unwrap();
    let body = helpers
        .split(r#"{{- define "jobtrail.dueQuery" -}}"#)
        .nth(1)
        .and_then(|b| b.split("{{- end -}}").next())
        .expect("the chart defines jobtrail.dueQuery");
    body.trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_autoscaling_query_counts_exactly_what_a_worker_could_claim_as_the_worker_login()
{
    let env = Env::new().await;
    let query = chart_due_query();
    for _ in 0..5 {
        env.submit("sim", serde_json::json!({"duration_ms": 200}), |_| {})
            .await;
    }
    let login = env.db().login("jobtrail_worker").await;
    let pool = sqlx::PgPool::connect(&login).await.unwrap();
    let count = |pool: sqlx::PgPool| {
        let q = query.clone();
        async move {
            let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(q))
                .fetch_one(&pool)
                .await
                .expect("the worker login runs the chart's query");
            n
        }
    };
    assert_eq!(count(pool.clone()).await, 5);
    // Two claimed (leased): no longer work for a new pod.
    let claimed = env
        .store
        .claim_due("scaler-test", 2, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    assert_eq!(count(pool.clone()).await, 3);
    // One not due for an hour: not work yet.
    sqlx::query("UPDATE operations SET next_action_at = now() + interval '1 hour' WHERE id = (SELECT id FROM operations WHERE lease_owner IS NULL LIMIT 1)")
        .execute(&sqlx::PgPool::connect(&env.url).await.unwrap())
        .await
        .unwrap();
    assert_eq!(count(pool.clone()).await, 2);
    // The provider held back fleet-wide after a 429: no worker would claim its work, and more
    // workers would only hold connections.
    env.store
        .pause_provider("sim", Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(count(pool.clone()).await, 0);
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_serves_its_probes_and_metrics_apart_from_the_api() {
    let env = Env::new().await;
    let server = env.serve_with("api-ops", &[("JOBTRAIL_OPS_LISTEN", "127.0.0.1:0")]);
    let base = ops_address(&server.log);
    assert_eq!(get(&format!("{base}/livez")).await.0, 200);
    let (status, body) = get(&format!("{base}/readyz")).await;
    assert_eq!(status, 200, "{body}");
    let op = env
        .submit("sim", serde_json::json!({"duration_ms": 200}), |_| {})
        .await;
    // Due ten minutes ago and claimed by no worker (none runs here): how long it has waited is a
    // gauge an operator can alert on (a renamed contract strands its operations like this).
    sqlx::query(
        "UPDATE operations SET next_action_at = now() - interval '10 minutes' WHERE id = $1",
    )
    .bind(op.id.as_uuid())
    .execute(&sqlx::PgPool::connect(&env.url).await.unwrap())
    .await
    .unwrap();
    let (status, metrics) = get(&format!("{base}/metrics")).await;
    assert_eq!(status, 200);
    assert_eq!(
        sample(
            &metrics,
            "jobtrail_operations",
            &["state=\"create_pending\""]
        ),
        Some(1.0),
        "{metrics}"
    );
    let waited = sample(
        &metrics,
        "jobtrail_due_oldest_age_seconds",
        &["provider=\"sim\""],
    )
    .unwrap_or(0.0);
    assert!((600.0..900.0).contains(&waited), "{metrics}");
    // The probes are not on the API's port, and the API's port serves no metrics.
    assert_eq!(get(&server.url("/metrics")).await.0, 404);
    // Webhook deliveries are counted by provider and outcome: two forged ones (a secret rotated on
    // one side looks like this), and said once in the log; a name no contract has is not a series.
    let post = |path: &str| {
        support::http()
            .post(server.url(path))
            .header("content-type", "application/json")
            .header("X-Sim-Signature", "sha256=00")
            .body(r#"{"event_id":"e","job_id":"j"}"#)
            .send()
    };
    for path in [
        "/v1/webhooks/sim",
        "/v1/webhooks/sim",
        "/v1/webhooks/nobody",
    ] {
        post(path).await.unwrap();
    }
    let (_, metrics) = get(&format!("{base}/metrics")).await;
    assert_eq!(
        sample(
            &metrics,
            "jobtrail_webhooks_total",
            &["provider=\"sim\"", "outcome=\"refused_signature\""]
        ),
        Some(2.0),
        "{metrics}"
    );
    assert!(!metrics.contains("nobody"), "{metrics}");
    // Every problem the API answers is counted by kind (a closed set).
    assert_eq!(
        sample(
            &metrics,
            "jobtrail_api_problems_total",
            &["kind=\"unauthenticated\""]
        ),
        Some(2.0),
        "{metrics}"
    );
    let said = server
        .log_text()
        .matches("webhook deliveries are refused")
        .count();
    assert_eq!(said, 1, "{}", server.log_text());
    assert!(server.stop().is_some_and(|s| s.success()));
}

/// A credential a contract names that the worker cannot find (a misspelt variable in a Deployment)
/// is said at start and keeps the worker unready, naming it, so a rollout stops there instead of
/// every call to that provider failing unsent; the worker is alive meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_the_worker_cannot_find_keeps_it_unready_and_named() {
    let env = Env::new().await;
    let mut worker = env.spawn_worker(
        "ops-nosecret",
        "10s",
        &[
            ("JOBTRAIL_OPS_LISTEN", "127.0.0.1:0"),
            // Blank is missing: a value of spaces is no credential.
            ("JOBTRAIL_SIM_TOKEN", "  "),
        ],
    );
    let base = ops_address(&worker.log);
    let (status, body) = get(&format!("{base}/readyz")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("env:JOBTRAIL_SIM_TOKEN"), "{body}");
    assert_eq!(get(&format!("{base}/livez")).await.0, 200);
    // A create tried meanwhile never leaves the worker: counted as `not_sent`, not as a call the
    // provider did not answer (an alert on `no_response` would page for a provider that is fine).
    env.submit("sim", serde_json::json!({"duration_ms": 50}), |_| {})
        .await;
    let create = ["provider=\"sim\"", "call=\"create\""];
    let series = "jobtrail_provider_call_seconds_count";
    let metrics = scrape_until(&base, series, &create, 1.0).await;
    let not_sent = [create[0], create[1], "status=\"not_sent\""];
    assert!(
        sample(&metrics, series, &not_sent).is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    let no_response = [create[0], create[1], "status=\"no_response\""];
    assert_eq!(sample(&metrics, series, &no_response), None, "{metrics}");
    worker.stop_cleanly();
    let log = std::fs::read_to_string(&worker.log).unwrap();
    assert!(
        log.contains("provider sim: env:JOBTRAIL_SIM_TOKEN is not set"),
        "{log}"
    );
}

/// With `--stop-delay`, SIGTERM makes the API unready at once while it still accepts requests for
/// that long (load balancers take it out first: a rollout drops no connection), then it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_leaves_its_service_before_it_stops_accepting() {
    let env = Env::new().await;
    let mut server = env.serve_with(
        "api-leaving",
        &[
            ("JOBTRAIL_OPS_LISTEN", "127.0.0.1:0"),
            ("JOBTRAIL_STOP_DELAY", "3s"),
        ],
    );
    let base = ops_address(&server.log);
    assert_eq!(get(&format!("{base}/readyz")).await.0, 200);
    server.terminate();
    let signalled = Instant::now();
    let deadline = signalled + Duration::from_secs(2);
    loop {
        let (status, body) = get(&format!("{base}/readyz")).await;
        if status == 503 {
            assert!(body.contains("stopping"), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still ready after SIGTERM: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = get(&server.url("/openapi.json")).await;
    assert_eq!(status, 200, "still accepting while leaving");
    assert!(signalled.elapsed() < Duration::from_secs(3));
    let exit = server
        .exit_within(Duration::from_secs(20))
        .expect("never stopped");
    assert!(exit.success(), "{exit:?}");
    assert!(
        signalled.elapsed() >= Duration::from_secs(3),
        "stopped early"
    );
}

/// A second SIGTERM (or Ctrl-C) does not wait out `--stop-delay`: a person who asks twice means it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_cuts_the_stop_delay_short() {
    let env = Env::new().await;
    let mut server = env.serve_with("api-twice", &[("JOBTRAIL_STOP_DELAY", "60s")]);
    for _ in 0..2 {
        server.terminate();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let exit = server
        .exit_within(Duration::from_secs(20))
        .expect("waited out the stop delay after a second signal");
    assert!(exit.success(), "{exit:?}");
}
