//! jobtrail-admin: where people decide what automation could not.

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "jobtrail-admin",
    version,
    about = "Operate jobtrail's escalation queue and audit its records"
)]
struct Cli {
    /// PostgreSQL URL. Unset: jobtrail's private cluster (started on demand).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply pending database migrations and exit.
    Migrate,
    /// Recompute hash chains.
    Audit {
        #[command(subcommand)]
        what: Audit,
    },
}

#[derive(Subcommand)]
enum Audit {
    /// Verify every history chain; exits 1 when anything was altered.
    Verify,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    let url = match cli.database_url {
        Some(u) => u,
        None => jobtrail_store::cluster::database_url().await?,
    };
    let store = jobtrail_store::Store::connect(&url)
        .await
        .context("connecting to the database")?;
    store.migrate().await.context("applying migrations")?;
    match cli.command {
        Command::Migrate => {
            println!("migrations applied");
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Audit {
            what: Audit::Verify,
        } => {
            let r = store.verify_all().await?;
            for b in &r.breaks {
                println!(
                    "BREAK {} #{}: {} (expected {}, stored {})",
                    b.operation_id, b.seq, b.problem, b.expected, b.stored
                );
            }
            println!(
                "{} operations, {} history rows, {} breaks",
                r.operations,
                r.rows,
                r.breaks.len()
            );
            Ok(if r.is_clean() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::from(1)
            })
        }
    }
}
