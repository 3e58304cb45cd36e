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
    /// Serve the API under this path, as a provider behind a gateway does (`/gateway/v2`): every
    /// route and every URL the simulator names starts with it.
    #[arg(long, value_name = "PATH", value_parser = path_prefix)]
    path_prefix: Option<String>,
}

fn path_prefix(s: &str) -> Result<String, String> {
    let ok = s.starts_with('/')
        && s[1..]
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-._~".contains(&b));
    if ok {
        Ok(s.to_owned())
    } else {
        Err("a path such as /gateway/v2: starts with /, no empty, . or .. segment, letters, digits and -._~ only".into())
    }
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
        path_prefix: cli.path_prefix.unwrap_or_default(),
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_path_prefix_is_a_plain_absolute_path() {
        assert_eq!(super::path_prefix("/gateway/v2").unwrap(), "/gateway/v2");
        for bad in [
            "",
            "/",
            "gateway",
            "/gateway/",
            "/a?b",
            "/a b",
            "/a#b",
            "/%2e%2e",
            "/..",
            "/./x",
            "/a//b",
        ] {
            assert!(super::path_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
