//! jobtrail: submit operations and run workers.

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "jobtrail",
    version,
    about = "Durable, evidenced remote async jobs for AI agents"
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
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let url = match cli.database_url {
        Some(u) => u,
        None => jobtrail_store::cluster::database_url().await?,
    };
    let store = jobtrail_store::Store::connect(&url)
        .await
        .context("connecting to the database")?;
    store.migrate().await.context("applying migrations")?;
    match cli.command {
        Command::Migrate => println!("migrations applied"),
    }
    Ok(())
}
