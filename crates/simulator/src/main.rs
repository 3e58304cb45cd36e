//! jobtrail-sim: run the simulated provider on a loopback port.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "jobtrail-sim",
    version,
    about = "A fault-injecting simulated async-job provider (see crates/simulator/README.md)",
    after_help = "Example:\n  jobtrail-sim --listen 127.0.0.1:8700\n  curl -s localhost:8700/_sim/ledger"
)]
struct Cli {
    /// Address to listen on. Loopback by default; the simulator is a test fixture, not a service.
    #[arg(long, default_value = "127.0.0.1:8700")]
    listen: std::net::SocketAddr,
    /// Require `Authorization: Bearer <value of this environment variable>` on every request.
    #[arg(long, value_name = "ENV_VAR")]
    token_env: Option<String>,
    /// Speak HTTP/1.1 only (by default HTTP/2 without TLS is served too, to a client that starts
    /// with it).
    #[arg(long)]
    http1_only: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let bearer_token = match &cli.token_env {
        Some(var) => match std::env::var(var) {
            Ok(v) => Some(v),
            Err(_) => {
                eprintln!("error: --token-env {var}: the variable is not set");
                return std::process::ExitCode::from(2);
            }
        },
        None => None,
    };
    let sim = jobtrail_sim::Sim::new(jobtrail_sim::Config {
        bearer_token,
        webhook: None,
        http1_only: cli.http1_only,
    });
    let running = match sim.start(cli.listen).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", cli.listen);
            return std::process::ExitCode::from(2);
        }
    };
    println!("jobtrail-sim listening on {}", running.base_url());
    // Ctrl-C in a terminal, SIGTERM from a container runtime.
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    running.stop().await;
    std::process::ExitCode::SUCCESS
}
