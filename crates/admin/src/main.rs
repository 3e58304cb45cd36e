//! `jobtrail-admin`: where people decide what automation could not, and where auditors check that
//! nothing was rewritten.

mod audit;
mod decide;
mod queue;
mod tokens;

use clap::{Args, Parser, Subcommand};
use jobtrail_console::shell::{self, CmdResult};
use jobtrail_provider::Registry;
use jobtrail_service::Decision;
use std::path::PathBuf;
use std::process::ExitCode;

const EXIT_CODES: &str = "Exit codes:
  0  done (audit verify: every chain and the latest anchor hold)
  1  audit verify found an alteration, a removal or an out-of-order insert
  2  bad input or usage: nothing was written
  3  operation not found
  4  refused: the operation changed since you looked, the state machine does not allow this
     decision, or it conflicts with another record; adopt, declare-not-created and abandon of a
     create still open also while a worker holds the operation (it may be creating or looking
     up the job that moment); retry of an operation abandoned before anyone settled whether its
     create made a job, without --job-may-exist
  5  database or provider configuration unavailable
  8  audit verify: the anchor you named is not in the database, or its signature does not
     verify; audit anchor: an operation's chain and the head its row names disagree (nothing
     anchored: run audit verify)";

#[derive(Parser)]
#[command(
    name = "jobtrail-admin",
    version,
    about = "Work jobtrail's escalation queue, record decisions, and audit the history",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(flatten)]
    common: jobtrail_console::shell::Common,
    #[command(subcommand)]
    command: Command,
}

/// Who decides, why, and on what view. Every decision needs all three.
#[derive(Args, Clone)]
pub struct Decided {
    /// Who decides (recorded in history).
    #[arg(long)]
    pub actor: String,
    /// Why (recorded in history).
    #[arg(long)]
    pub reason: String,
    /// The view you looked at, as `escalations` and `show` print it (`create_unresolved@5:9f2c1a07`:
    /// the state, its history position, and the start of the operation's history head, which pins
    /// it to that operation). Refused if the operation moved since, or if the view is another
    /// operation's. `STATE@SEQ` alone is taken without the pin; a bare state with a warning, except
    /// by adopt and declare-not-created, which refuse it.
    #[arg(long)]
    pub seen: String,
}

#[derive(Subcommand)]
enum Command {
    /// The open escalation queue, oldest first, with the decisions that fit each entry.
    #[command(
        after_help = "Examples:\n  jobtrail-admin escalations\n  jobtrail-admin escalations --state cancellation_unconfirmed --provider sim --json"
    )]
    Escalations {
        /// Only this state (create_unresolved, contract_violation, cancellation_unconfirmed, result_timed_out, url_refused, result_stalled).
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        provider: Option<String>,
        /// Only this caller's operations (one agent whose deadlines were too short for its jobs
        /// can fill the queue; each listed operation names its caller).
        #[arg(long)]
        caller: Option<String>,
    },
    /// The whole story of one operation: every transition and every provider call.
    #[command(after_help = "Example:\n  jobtrail-admin show op_01KB3Z8Q6W4Y7T2V9N5M1P0R3S")]
    Show { operation: String },
    /// Adopt a remote job id a person found (create_unknown / reconciliation / create_unresolved → observing).
    #[command(
        after_help = "Example:\n  jobtrail-admin adopt op_01KB… --job-id job_7ad2 --seen create_unresolved@4:9f2c1a07 --actor alice --reason \"found in the provider console\""
    )]
    Adopt {
        operation: String,
        #[arg(long)]
        job_id: String,
        #[command(flatten)]
        decided: Decided,
    },
    /// Declare that the remote job was never created (→ not_created; a new, linked operation may follow).
    #[command(
        after_help = "Example:\n  jobtrail-admin declare-not-created op_01KB… --seen create_unresolved@7:9f2c1a07 --actor alice --reason \"provider support: no such request\""
    )]
    DeclareNotCreated {
        operation: String,
        #[command(flatten)]
        decided: Decided,
    },
    /// Confirm a cancellation with the evidence you hold (cancelling / cancellation_unconfirmed → cancelled).
    #[command(
        after_help = "Example:\n  jobtrail-admin confirm-cancel op_01KB… --evidence \"ticket 4411: cancelled at 14:02\" --seen cancellation_unconfirmed@9:9f2c1a07 --actor bob --reason \"support confirmed\""
    )]
    ConfirmCancel {
        operation: String,
        /// What the confirmation rests on (ticket, console screenshot id, e-mail).
        #[arg(long)]
        evidence: String,
        #[command(flatten)]
        decided: Decided,
    },
    /// Resume automation after a contract violation by choosing which job id is ours.
    #[command(
        after_help = "Example:\n  jobtrail-admin choose-job op_01KB… --job-id job_000049 --seen contract_violation@6:9f2c1a07 --actor alice --reason \"job_000111 was a provider duplicate, cancelled by them\""
    )]
    ChooseJob {
        operation: String,
        #[arg(long)]
        job_id: String,
        #[command(flatten)]
        decided: Decided,
    },
    /// Resume automation: result_timed_out takes --result-deadline, cancellation_unconfirmed
    /// --cancel-window, create_unresolved --create-deadline (refused where the provider's contract
    /// offers no reconciliation: adopt or declare-not-created instead); url_refused takes none (its
    /// contract now declares the origin), nor does result_stalled (the workers now have room for
    /// the result).
    #[command(
        after_help = "Examples:\n  jobtrail-admin resume op_01KB… --result-deadline +2h --seen result_timed_out@12:9f2c1a07 --actor alice --reason \"provider is slow today\"\n  jobtrail-admin resume op_01KB… --cancel-window 10m --seen cancellation_unconfirmed@9:9f2c1a07 --actor bob --reason \"give it time\""
    )]
    Resume {
        operation: String,
        /// New result deadline (RFC 3339 or +2h, at least a minute ahead) — for result_timed_out.
        #[arg(long)]
        result_deadline: Option<String>,
        /// New time to confirm the cancel (10m) — for cancellation_unconfirmed.
        #[arg(long)]
        cancel_window: Option<String>,
        /// New create deadline (RFC 3339 or +10m, at least a minute ahead) — for create_unresolved.
        #[arg(long)]
        create_deadline: Option<String>,
        #[command(flatten)]
        decided: Decided,
    },
    /// Stop tracking the operation (everything recorded is kept). No cancel is sent: the remote
    /// job, if any, is not assumed stopped and may go on running and billing; to stop it, use
    /// `cancel --seen` instead.
    #[command(
        after_help = "Example:\n  jobtrail-admin abandon op_01KB… --seen result_timed_out@12:9f2c1a07 --actor alice --reason \"the provider lost the job: support ticket 4411 says it never ran\""
    )]
    Abandon {
        operation: String,
        #[command(flatten)]
        decided: Decided,
    },
    /// Retry as a new operation linked to this (terminal) one: a new token, the same request or an
    /// edited one. The original approval carries over only to the same request after no job was
    /// created (not_created, withdrawn); otherwise --actor is recorded as the run's approver.
    #[command(
        after_help = "Examples:\n  jobtrail-admin retry op_01KB… --seen not_created@5:9f2c1a07 --actor alice --reason \"never reached the provider\"\n  jobtrail-admin retry op_01KB… --body fixed.json --seen failed@8:9f2c1a07 --actor alice --reason \"corrected the range\""
    )]
    Retry {
        operation: String,
        /// An edited request body (JSON file); default: the same request.
        #[arg(long)]
        body: Option<PathBuf>,
        /// New result deadline (RFC 3339 or +2h); default: the provider's window.
        #[arg(long)]
        result_deadline: Option<String>,
        /// The operation was abandoned before anyone settled whether its create made a job, and
        /// you accept that the retry may be a second paid job (look in the provider's console
        /// first). Without it such a retry is refused; with it, your word is kept in the record.
        #[arg(long)]
        job_may_exist: bool,
        #[command(flatten)]
        decided: Decided,
    },
    /// Request a cancel (recorded; the lease owner sends one cancel call; only the provider confirms).
    /// An operation held for a person (result_timed_out, say) is cancelled only on the view you
    /// name with --seen, like any decision on the queue.
    #[command(
        after_help = "Examples:\n  jobtrail-admin cancel op_01KB… --actor bob --reason \"over budget\"\n  jobtrail-admin cancel op_01KB… --seen result_timed_out@12:9f2c1a07 --actor bob --reason \"no longer needed\""
    )]
    Cancel {
        operation: String,
        #[arg(long)]
        actor: String,
        #[arg(long)]
        reason: String,
        /// The state you looked at with its history position (`result_timed_out@12`, as
        /// `escalations` and `show` print it): refused if the operation moved since. Needed for
        /// an operation held for a person; optional otherwise.
        #[arg(long)]
        seen: Option<String>,
    },
    /// API tokens: create (shown once), list, revoke. The caller recorded for anything done with a
    /// token is the token's.
    Tokens {
        #[command(subcommand)]
        what: tokens::TokensCmd,
    },
    /// Verify and anchor the tamper-evident history.
    Audit {
        #[command(subcommand)]
        what: AuditCmd,
    },
    /// Operations by state and provider, the escalation queue, providers paused fleet-wide by a
    /// 429, and lease holders.
    #[command(
        after_help = "Examples:\n  jobtrail-admin stats\n  jobtrail-admin stats --json | jq .escalations"
    )]
    Stats,
    /// Apply database migrations and exit (as the owner role; every other command only checks the
    /// schema version). Refuses a database that holds another application's tables and no jobtrail
    /// schema (exit 2) unless --beside-other-tables.
    Migrate(shell::MigrateArgs),
}

#[derive(Subcommand)]
enum AuditCmd {
    /// Recompute both hash chains of every operation (or one), check each operation's facts and
    /// stored results against them, and check an anchor; exits 1 naming each break, 8 when the
    /// anchor you named is not there. Reports how much evidence no anchor covers yet.
    #[command(
        after_help = "Examples:\n  jobtrail-admin audit verify --all\n  jobtrail-admin audit verify op_01KB…\n  jobtrail-admin audit verify --all --expect-anchor 9f2c…            (the digest you kept outside the database)\n  jobtrail-admin audit verify --all --expect-anchor anchors/2026-12-01.json --anchor-public-key 3b6a…"
    )]
    Verify {
        operation: Option<String>,
        /// Every operation (the default when no operation is named).
        #[arg(long)]
        all: bool,
        /// An anchor kept outside the database: its digest, or the file `audit anchor --out` wrote.
        /// It must be in the database and still hold (else exit 8 or 1). Default: the latest anchor.
        #[arg(long)]
        expect_anchor: Option<String>,
        /// Check the anchor file's Ed25519 signature with this public key (hex).
        #[arg(long, env = "JOBTRAIL_ANCHOR_PUBLIC_KEY")]
        anchor_public_key: Option<String>,
    },
    /// Record a checkpoint over every operation's chain heads and write it where the database cannot
    /// reach it (a file, or stdout), signed when a key is given. Run it on a schedule (cron, a
    /// Kubernetes CronJob) and keep the files elsewhere.
    #[command(
        after_help = "Examples:\n  jobtrail-admin audit anchor --out /anchors/ --signing-key /run/secrets/anchor.key     (anchor-<id>-<time>.json)\n  jobtrail-admin audit anchor --out /anchors/$(date -u +%FT%TZ).json\n  jobtrail-admin audit anchor --actor auditor-jane >> anchors.txt"
    )]
    Anchor {
        #[arg(long, default_value = "jobtrail-admin")]
        actor: String,
        /// Also write the anchor as JSON to this file (refuses to overwrite one), or into this
        /// directory as anchor-<id>-<time>.json (for a scheduled job with no shell to name files).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Sign the anchor with this Ed25519 private key (a file of 64 hex digits: the 32-byte seed).
        #[arg(
            long,
            env = "JOBTRAIL_ANCHOR_SIGNING_KEY_FILE",
            value_parser = jobtrail_console::shell::path_or_none()
        )]
        signing_key: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    shell::end_quietly_when_stdout_closes();
    jobtrail_provider::install_crypto();
    let mut cli = Cli::parse();
    // A key set to nothing (a chart or cron value left blank) is unset, as every other setting
    // is, where no anchor file is named: otherwise every scheduled verify would be refused for a
    // key with no anchor to check. With a file, a blank key is refused (its signature unchecked
    // would pass in silence).
    if let Command::Audit {
        what:
            AuditCmd::Verify {
                anchor_public_key,
                expect_anchor: None,
                ..
            },
    } = &mut cli.command
        && anchor_public_key
            .as_deref()
            .is_some_and(|k| k.trim().is_empty())
    {
        *anchor_public_key = None;
    }
    if let Err(f) = shell::refuse_passwords_in_arguments(std::env::args_os()) {
        return shell::exit_with(Err(f));
    }
    // Warnings (a database reached without certificate checks) on stderr, apart from the output.
    if let Err(e) = jobtrail_telemetry::logs::init("warn") {
        eprintln!("error: {e}");
        return ExitCode::from(jobtrail_console::shell::exit::BAD_INPUT);
    }
    shell::exit_with(run(cli).await)
}

/// What can be refused without the database is refused before connecting: a mistyped id, view,
/// actor or reason is bad input (exit 2) whether or not the database is there, never "unavailable".
/// The service checks all of it again; this only answers first.
fn preflight(command: &Command) -> Result<(), shell::Failure> {
    use jobtrail_console::shell::{exit, fail};
    let bad = |e: &dyn std::fmt::Display| fail(exit::BAD_INPUT, e);
    let id = |s: &str| {
        s.trim()
            .parse::<jobtrail_core::OperationId>()
            .map(|_| ())
            .map_err(|e| bad(&e))
    };
    let decided = |d: &Decided| {
        jobtrail_service::operator::parse_seen(&d.seen).map_err(|e| bad(&e.message))?;
        jobtrail_core::Decision::new(&d.actor, &d.reason).map_err(|e| bad(&e))?;
        Ok::<_, shell::Failure>(())
    };
    match command {
        Command::Show { operation } => id(operation),
        Command::Adopt {
            operation,
            decided: d,
            ..
        }
        | Command::DeclareNotCreated {
            operation,
            decided: d,
        }
        | Command::ConfirmCancel {
            operation,
            decided: d,
            ..
        }
        | Command::ChooseJob {
            operation,
            decided: d,
            ..
        }
        | Command::Resume {
            operation,
            decided: d,
            ..
        }
        | Command::Abandon {
            operation,
            decided: d,
        }
        | Command::Retry {
            operation,
            decided: d,
            ..
        } => {
            id(operation)?;
            decided(d)
        }
        Command::Cancel {
            operation,
            actor,
            reason,
            ..
        } => {
            id(operation)?;
            jobtrail_core::CancelRequest::new(actor, reason)
                .map(|_| ())
                .map_err(|e| bad(&e))
        }
        // A public key with no anchor file to check it against would check nothing: refused
        // rather than leaving an auditor who set JOBTRAIL_ANCHOR_PUBLIC_KEY to believe signatures
        // were checked.
        Command::Audit {
            what:
                AuditCmd::Verify {
                    anchor_public_key: Some(_),
                    expect_anchor: None,
                    ..
                },
        } => Err(bad(
            &"--anchor-public-key (or JOBTRAIL_ANCHOR_PUBLIC_KEY) checks the signature of an anchor file: name the file with --expect-anchor (without one, no signature would be checked)",
        )),
        Command::Audit {
            what:
                AuditCmd::Verify {
                    operation: Some(operation),
                    ..
                },
        } => id(operation),
        Command::Audit {
            what: AuditCmd::Anchor { actor, .. },
        } => shell::actor("--actor", actor).map(|_| ()),
        _ => Ok(()),
    }
}

/// The provider contracts, or why they could not be read.
fn contracts_read(dir: &Option<std::path::PathBuf>) -> queue::Contracts {
    shell::registry(dir).map_err(|e| format!("{:#}", e.error))
}

async fn run(cli: Cli) -> CmdResult {
    let json = cli.common.json;
    if let Command::Migrate(args) = &cli.command {
        let store = shell::store_migrated(&cli.common, args.beside_other_tables).await?;
        shell::print_migrated(&store, json);
        return Ok(ExitCode::SUCCESS);
    }
    preflight(&cli.command)?;
    // A retry's new body is bad input before any database is looked for.
    let retry_request = match &cli.command {
        Command::Retry { body, .. } => decide::retry_body(body.clone())?,
        _ => None,
    };
    let store = shell::store(&cli.common).await?;
    match cli.command {
        Command::Migrate(_) => unreachable!("handled above"),
        Command::Escalations {
            state,
            provider,
            caller,
        } => {
            let contracts = contracts_read(&cli.common.providers);
            queue::escalations(&store, state, provider, caller, &contracts, json).await
        }
        Command::Show { operation } => {
            let contracts = contracts_read(&cli.common.providers);
            queue::show(&store, &operation, &contracts, json).await
        }
        Command::Stats => queue::stats(&store, json).await,
        Command::Audit {
            what:
                AuditCmd::Verify {
                    operation,
                    all,
                    expect_anchor,
                    anchor_public_key,
                },
        } => {
            audit::verify(
                &store,
                operation,
                all,
                expect_anchor,
                anchor_public_key,
                json,
            )
            .await
        }
        Command::Audit {
            what:
                AuditCmd::Anchor {
                    actor,
                    out,
                    signing_key,
                },
        } => {
            let signing_key = jobtrail_console::shell::given_path(signing_key);
            audit::anchor(&store, &actor, out, signing_key, json).await
        }
        Command::Cancel {
            operation,
            actor,
            reason,
            seen,
        } => decide::cancel(&store, &operation, (&actor, &reason), seen.as_deref(), json).await,
        Command::Tokens { what } => tokens::run(&store, what, json).await,
        Command::Retry {
            operation,
            result_deadline,
            job_may_exist,
            decided,
            ..
        } => {
            let registry = shell::registry(&cli.common.providers)?;
            let d = Decision::Retry {
                request: retry_request,
                result_deadline,
                job_may_exist,
            };
            decide::decide(&store, registry, &operation, d, decided, json).await
        }
        Command::Adopt {
            operation,
            job_id,
            decided,
        } => {
            let d = Decision::Adopt { job_id };
            decide::decide(&store, Registry::default(), &operation, d, decided, json).await
        }
        Command::DeclareNotCreated { operation, decided } => {
            let d = Decision::DeclareNotCreated {};
            decide::decide(&store, Registry::default(), &operation, d, decided, json).await
        }
        Command::ConfirmCancel {
            operation,
            evidence,
            decided,
        } => {
            let d = Decision::ConfirmCancel { evidence };
            decide::decide(&store, Registry::default(), &operation, d, decided, json).await
        }
        Command::ChooseJob {
            operation,
            job_id,
            decided,
        } => {
            let d = Decision::ChooseJob { job_id };
            decide::decide(&store, Registry::default(), &operation, d, decided, json).await
        }
        Command::Resume {
            operation,
            result_deadline,
            cancel_window,
            create_deadline,
            decided,
        } => {
            let d = Decision::Resume {
                result_deadline,
                cancel_window,
                create_deadline,
            };
            // The contracts tell whether an unresolved create can be reconciled at all: a resume
            // that cannot is refused, and so is one whose contract is not loaded (it would spend
            // the decision and, where the provider cannot reconcile, be held again at once).
            // Other resumes need no contract.
            let registry = contracts_read(&cli.common.providers).unwrap_or_else(|e| {
                eprintln!(
                    "warning: the provider contracts were not read ({e}): a resume of create_unresolved is refused until they can be"
                );
                Registry::default()
            });
            decide::decide(&store, registry, &operation, d, decided, json).await
        }
        Command::Abandon { operation, decided } => {
            let d = Decision::Abandon {};
            decide::decide(&store, Registry::default(), &operation, d, decided, json).await
        }
    }
}
