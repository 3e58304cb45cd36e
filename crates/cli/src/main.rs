//! `jobtrail`: submit operations, watch them, run workers, run the demo.

use jobtrail_console::shell as common;
mod bench;
mod contract;
mod demo;
mod fleet;
mod ops;
mod serve;
mod start;
mod work;

use clap::{Parser, Subcommand};
use common::{CmdResult, exit};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const EXIT_CODES: &str = "Exit codes:
  0  success (for wait: the operation succeeded)
  1  the operation ended other than succeeded
  2  bad input or usage: nothing was written
  3  operation not found
  4  conflict: another request under this id, a stale view, or a move the state machine refuses
  5  database or provider configuration unavailable; a submit refused past the caller's open
     operations (too-many-open); through the API also: the token is refused, the API asked to
     slow down (rate-limited), or JOBTRAIL_API is no jobtrail API's base URL
  6  wait timed out
  7  the operation is held for a person (see jobtrail-admin escalations)
  8  evidence disagrees with its chain (a result refused as tampered)
  9  result: the operation has not finished (it runs, or is held for a person); wait, then ask
     again

Agents on another machine: set JOBTRAIL_API (or --api) and JOBTRAIL_TOKEN; then submit,
submit-batch, show, list, providers, cancel, result and wait go through the HTTP API and need no
database URL or contracts.";

#[derive(Subcommand)]
enum ContractCommand {
    /// Print the effective contract (its protocol profile expanded), the timings that follow from
    /// it, and the problem that stops it loading, naming file and key (exit 2).
    #[command(
        after_help = "Example:\n  jobtrail contract check providers/acme.toml\n  jobtrail contract check providers/acme.toml --json"
    )]
    Check {
        /// The contract file (TOML).
        file: PathBuf,
    },
}

#[derive(Parser)]
#[command(
    name = "jobtrail",
    version,
    about = "Durable, evidenced remote async jobs for AI agents",
    long_about = "jobtrail owns remote asynchronous API jobs on behalf of agents: it records the intent before \
anything is sent, creates the remote job once, observes it with one lease owner at a time, cancels on request \
and waits for the provider's confirmation, validates the result, and keeps a tamper-evident history.",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(flatten)]
    common: jobtrail_console::shell::Common,
    #[command(flatten)]
    door: ops::DoorArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the demo: private PostgreSQL (or the empty database DATABASE_URL / --database-url names: one that holds operations is refused), the simulated provider, workers, a few hundred operations with faults.
    #[command(
        after_help = "Example:\n  jobtrail demo\n  jobtrail demo --operations 500 --workers 4"
    )]
    Demo(demo::DemoArgs),
    /// Measure jobtrail against the database's own ceiling, in one run (prints figures; writes JSON). On a private PostgreSQL, or the empty database DATABASE_URL / --database-url names.
    #[command(
        after_help = "Examples:\n  jobtrail bench\n  jobtrail bench --quick --json-out /tmp/bench.json"
    )]
    Bench(bench::BenchArgs),
    /// Submit an operation; prints its id at once. The intent is durable before anything is sent.
    #[command(
        after_help = "Examples:\n  echo '{\"account\":\"acct_218\",\"format\":\"csv\"}' | jobtrail submit --provider sim --target reports \\\n      --caller agent-7 --approved-by alice --approval-ref CHG-42\n  jobtrail submit --provider sim --target reports --body req.json --id op_01J... --result-deadline +2h \\\n      --caller agent-7 --approved-by alice"
    )]
    Submit(ops::SubmitArgs),
    /// Submit many operations in one transaction, all or none: JSON lines, one submission per line
    /// (the API's submit body: id, provider, target, request, approved_by, …); prints the ids in order.
    #[command(
        after_help = "Example:\n  printf '%s\\n' '{\"id\":\"op_01J...\",\"provider\":\"sim\",\"target\":\"r1\",\"request\":{},\"approved_by\":\"alice\"}' \\\n    | jobtrail submit-batch --caller agent-7"
    )]
    SubmitBatch(ops::BatchArgs),
    /// Show an operation: state, remote facts, and its whole timeline.
    Show { operation: String },
    /// List operations, newest first (with --api: the token's own, unless it has the decide or
    /// audit scope).
    #[command(after_help = "Example:\n  jobtrail list --state observing --limit 20")]
    List {
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        provider: Option<String>,
        #[arg(long)]
        caller: Option<String>,
        /// The cursor the previous page printed.
        #[arg(long)]
        cursor: Option<String>,
        /// Page size, 1-200.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=i64::from(jobtrail_service::MAX_PAGE)))]
        limit: u32,
    },
    /// The providers you can submit to, and what a request to each needs.
    Providers,
    /// Provider contracts: check one before deploying it.
    #[command(subcommand)]
    Contract(ContractCommand),
    /// Request a cancel (recorded with actor and reason; confirmed only by the provider).
    #[command(
        after_help = "Examples:\n  jobtrail cancel op_01J... --actor alice --reason \"wrong range\"\n  JOBTRAIL_API=http://127.0.0.1:8080 jobtrail cancel op_01J... --reason \"no longer needed\"   (the token is the actor)"
    )]
    Cancel {
        operation: String,
        /// Who asks (with --api the token decides).
        #[arg(long)]
        actor: Option<String>,
        #[arg(long)]
        reason: String,
        /// The view you saw (`STATE@SEQ:HEAD`, as `show` prints it after "view"), checked before
        /// the cancel is recorded: needed to cancel another caller's operation held for a person.
        #[arg(long)]
        seen: Option<String>,
    },
    /// Write the validated result of a succeeded operation (checked against its recorded sha256).
    #[command(
        after_help = "Examples:\n  jobtrail result op_01J... -o report.json\n  jobtrail result op_01J... > report.csv"
    )]
    Result {
        operation: String,
        /// Output file, replaced whole (written beside it, then renamed over it); `-` or absent:
        /// stdout. Absent and stdout a terminal, a result that is not plain text is refused (a
        /// provider's escape sequences are not for the terminal): give a file, pipe it, or `-`.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Wait until the operation ends or needs a person (woken by notifications, not polling).
    #[command(
        after_help = "Examples:\n  jobtrail wait op_01J... --timeout 90s\n  jobtrail wait op_01J... --timeout 1h --json\n\nExits 0 when it succeeded, 1 when it ended otherwise, 7 when it is held for a person, 6 when\nthe timeout passed first."
    )]
    Wait {
        operation: String,
        /// Give up after this long (90s, 5m).
        #[arg(long, default_value = "5m")]
        timeout: String,
    },
    /// Serve the HTTP API (and MCP over Streamable HTTP at /mcp) until SIGTERM/SIGINT.
    #[command(
        after_help = "Example:\n  DATABASE_URL=postgres://jobtrail_api_1@db/jobtrail jobtrail serve --listen 127.0.0.1:8080\n\nTokens: jobtrail-admin tokens create --caller agent-7 --scopes submit,read,cancel --created-by alice"
    )]
    Serve(serve::ServeArgs),
    /// Serve MCP over stdio for an agent host, through the HTTP API (JOBTRAIL_API, JOBTRAIL_TOKEN):
    /// the agent's machine needs no database URL, contracts or provider credentials.
    #[command(
        after_help = "MCP client configuration:\n  {\"command\": \"jobtrail\", \"args\": [\"mcp\"],\n   \"env\": {\"JOBTRAIL_API\": \"http://127.0.0.1:8080\", \"JOBTRAIL_TOKEN\": \"jtk_...\"}}"
    )]
    Mcp,
    /// Run a worker until SIGTERM/SIGINT (every flag also reads its JOBTRAIL_* variable).
    #[command(
        after_help = "Example:\n  DATABASE_URL=postgres://jobtrail_worker_1@db/jobtrail jobtrail worker --concurrency 64 --ops-listen 0.0.0.0:9090\n\n/livez, /readyz and /metrics (Prometheus) are served on --ops-listen."
    )]
    Worker(work::WorkerArgs),
    /// Start (or reuse) a private PostgreSQL on this machine for trying jobtrail, migrate it and
    /// print its URL: `export DATABASE_URL=$(jobtrail dev-db)`. Not for production: one machine,
    /// data under $JOBTRAIL_PGDATA, else $XDG_DATA_HOME/jobtrail/postgres (/var/lib/jobtrail/postgres
    /// as root).
    DevDb,
    /// Apply database migrations and exit: the command meant for a shared database (dev-db, demo
    /// and bench migrate the database they run on). Run it as the owner role, once per release (a
    /// Kubernetes Job); every other command checks the schema version at start and refuses (exit 5)
    /// when it is behind or ahead. Refuses a database that holds another application's tables and
    /// no jobtrail schema (exit 2) unless --beside-other-tables.
    Migrate(jobtrail_console::shell::MigrateArgs),
}

// Workers allocate and free many small buffers per step (requests, rows, JSON); glibc's allocator
// spent a sixth of a worker's CPU on it under load (`perf`, the benchmark's end-to-end phase).
// `--features system-allocator` builds with glibc's instead, for heap profilers that see only
// `malloc` (heaptrack: docs/benchmark.md).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    jobtrail_console::shell::end_quietly_when_stdout_closes();
    jobtrail_provider::install_crypto();
    let cli = Cli::parse();
    if let Err(f) = jobtrail_console::shell::refuse_passwords_in_arguments(std::env::args_os()) {
        return jobtrail_console::shell::exit_with(Err(f));
    }
    let logs = jobtrail_telemetry::logs::init(match cli.command {
        Command::Worker(_) | Command::Serve(_) => "info",
        // The benchmark's synthetic bulk statements are slow on purpose.
        Command::Bench(_) => "error",
        _ => "warn",
    });
    let refresh = match cli.command {
        Command::Worker(_) | Command::Serve(_) => jobtrail_telemetry::metrics_refresh().map(|_| ()),
        _ => Ok(()),
    };
    if let Err(e) = logs.and(refresh) {
        eprintln!("error: {e}");
        return ExitCode::from(exit::BAD_INPUT);
    }
    // Traces leave only from the processes that call providers.
    let traces = if matches!(cli.command, Command::Worker(_)) {
        match tokio::task::spawn_blocking(jobtrail_telemetry::traces::init).await {
            Ok(Ok(t)) => Some(t),
            Ok(Err(e)) => {
                eprintln!("error: {e}");
                return ExitCode::from(exit::BAD_INPUT);
            }
            Err(e) => {
                eprintln!("error: starting the trace exporter: {e}");
                return ExitCode::from(exit::UNAVAILABLE);
            }
        }
    } else {
        None
    };
    let result = run(cli).await;
    if let Some(t) = traces {
        let _ = tokio::task::spawn_blocking(move || t.shutdown()).await;
    }
    common::exit_with(result)
}

async fn run(cli: Cli) -> CmdResult {
    let json = cli.common.json;
    // `--api` is for the agents' commands; a worker, a server, a migration or a benchmark works on
    // the database itself. A flag that would be ignored is refused (JOBTRAIL_API in the
    // environment, meant for the agents' commands, is left alone).
    let through_api = matches!(
        cli.command,
        Command::Submit(_)
            | Command::SubmitBatch(_)
            | Command::Show { .. }
            | Command::List { .. }
            | Command::Providers
            | Command::Cancel { .. }
            | Command::Result { .. }
            | Command::Wait { .. }
            | Command::Mcp
    );
    if !through_api && cli.door.api.is_some() && std::env::var_os("JOBTRAIL_API").is_none() {
        return Err(common::fail(
            exit::BAD_INPUT,
            "--api applies to submit, submit-batch, show, list, providers, cancel, result, wait and mcp; this command works on the database (DATABASE_URL)",
        ));
    }
    // Likewise `--json` where nothing is printed as records: refused rather than ignored.
    let no_records = match cli.command {
        Command::Bench(_) => Some("bench writes its figures as JSON with --json-out"),
        Command::Result { .. } => Some("result writes the result's own bytes"),
        Command::Serve(_) | Command::Worker(_) | Command::Mcp => {
            Some("a long-running process logs (JOBTRAIL_LOG_FORMAT=json for JSON lines)")
        }
        _ => None,
    };
    if let (true, Some(why)) = (json, no_records) {
        return Err(common::fail(
            exit::BAD_INPUT,
            format!("--json does not apply here: {why}"),
        ));
    }
    match cli.command {
        Command::Demo(args) => demo::run(args, json, cli.common.database_url.as_deref()).await,
        Command::Bench(args) => bench::run(args, cli.common.database_url.as_deref()).await,
        Command::Migrate(args) => {
            let store = common::store_migrated(&cli.common, args.beside_other_tables).await?;
            jobtrail_console::shell::print_migrated(&store, json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Submit(args) => {
            let caller = args.caller.clone().unwrap_or_default();
            let door =
                ops::door(&cli.common, &cli.door, Some(&caller), ops::Needs::Submits).await?;
            ops::submit(&door, args, json).await
        }
        Command::SubmitBatch(args) => {
            let caller = args.caller.clone().unwrap_or_default();
            let door =
                ops::door(&cli.common, &cli.door, Some(&caller), ops::Needs::Submits).await?;
            ops::submit_batch(&door, args, json).await
        }
        Command::Show { operation } => {
            let door = ops::door(&cli.common, &cli.door, None, ops::Needs::Records).await?;
            ops::show(&door, &operation, json).await
        }
        Command::List {
            state,
            provider,
            caller,
            cursor,
            limit,
        } => {
            let q = jobtrail_service::ListQuery {
                state,
                provider,
                caller,
                cursor,
                limit: Some(limit),
                ..Default::default()
            };
            let door = ops::door(&cli.common, &cli.door, None, ops::Needs::Records).await?;
            ops::list(&door, q, json).await
        }
        Command::Contract(ContractCommand::Check { file }) => contract::check(&file, json),
        Command::Providers => {
            let door = ops::door(&cli.common, &cli.door, None, ops::Needs::Contracts).await?;
            ops::providers(&door, json).await
        }
        Command::Cancel {
            operation,
            actor,
            reason,
            seen,
        } => {
            let actor = actor.unwrap_or_default();
            let door = ops::door(&cli.common, &cli.door, Some(&actor), ops::Needs::Records).await?;
            ops::cancel(&door, &operation, &reason, seen.as_deref(), json).await
        }
        Command::Result { operation, output } => {
            let door = ops::door(&cli.common, &cli.door, None, ops::Needs::Records).await?;
            ops::result(&door, &operation, output.as_deref()).await
        }
        Command::Wait { operation, timeout } => {
            let timeout = common::parse_duration_within(
                "--timeout",
                &timeout,
                Duration::ZERO,
                Duration::from_secs(7 * 86_400),
            )?;
            let door = ops::door(&cli.common, &cli.door, None, ops::Needs::Records).await?;
            ops::wait(&door, &operation, timeout, json).await
        }
        Command::Serve(args) => serve::serve(&cli.common, args).await,
        Command::Mcp => serve::mcp(&cli.door).await,
        Command::Worker(args) => work::run(&cli.common, args).await,
        Command::DevDb => {
            let url = jobtrail_store::cluster::private_database_url()
                .await
                .map_err(|e| common::fail(exit::UNAVAILABLE, e))?;
            let mut local = cli.common.clone();
            local.database_url = Some(url.clone());
            // The private cluster is jobtrail's own: nothing of another application's to guard.
            common::store_migrated(&local, true).await?;
            if json {
                println!("{}", serde_json::json!({ "database_url": url }));
            } else {
                println!("{url}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
