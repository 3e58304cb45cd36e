//! `jobtrail serve` (the HTTP API with MCP over Streamable HTTP at /mcp) and `jobtrail mcp` (MCP over
//! stdio, through the HTTP API).

use crate::start::{on_signal, ops_listener};
use jobtrail_console::shell::{self, CmdResult, exit, fail};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (`127.0.0.1:0` picks a free port; the address is printed).
    #[arg(long, env = "JOBTRAIL_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// A `jobtrail_operator` login for the operator and audit routes (decisions, escalations,
    /// verify). Without it they use DATABASE_URL, whose role decides what succeeds.
    #[arg(long, env = "JOBTRAIL_OPERATOR_DATABASE_URL", hide_env_values = true)]
    pub operator_database_url: Option<String>,
    /// A Host name the MCP endpoint accepts besides loopback (DNS-rebinding protection); repeat
    /// for several (`jobtrail.example`, `jobtrail.example:8443`).
    #[arg(
        long = "mcp-allowed-host",
        env = "JOBTRAIL_MCP_ALLOWED_HOSTS",
        value_delimiter = ',',
        value_parser = mcp_host
    )]
    pub mcp_allowed_hosts: Vec<String>,
    /// How long requests in flight may finish after SIGTERM. 0s to 10m.
    #[arg(long, env = "JOBTRAIL_DRAIN", default_value = "10s")]
    pub drain: String,
    /// After SIGTERM, keep accepting requests this long while /readyz answers 503, so load
    /// balancers take this process out before it stops accepting (a rollout then drops no
    /// connection); the drain follows. 0s: stop accepting at once. At most 5m.
    #[arg(long, env = "JOBTRAIL_STOP_DELAY", default_value = "0s")]
    pub stop_delay: String,
    /// Close a connection whose client takes none of the answer sent to it for this long (a
    /// reader that stops reading holds its answer in memory, and its turn, until then). A
    /// connection with nothing to send, such as a wait, is not affected. 10s to 1h.
    #[arg(long, env = "JOBTRAIL_SEND_TIMEOUT", default_value = "60s")]
    pub send_timeout: String,
    /// Close an HTTP/1.1 connection that has not sent a whole request head this long after it
    /// opened or after its last answer (a head sent a byte at a time, a connection left silent or
    /// idle). A proxy in front must let its idle connections to this server go sooner
    /// (ingress-nginx and AWS load balancers keep them 60 s). 30s to 10m.
    #[arg(long, env = "JOBTRAIL_HEAD_TIMEOUT", default_value = "90s")]
    pub head_timeout: String,
    /// How long one request may run before it is stopped and answered 503 with Retry-After (a
    /// change it had committed stands): every route and each MCP tool call; a wait over HTTP
    /// five minutes more (over MCP, its own timeout more). A database that stops answering on a
    /// connection then holds no request, and what it holds, for longer. 1s to 10m.
    #[arg(long, env = "JOBTRAIL_REQUEST_TIMEOUT", default_value = "30s")]
    pub request_timeout: String,
    /// Connections open at once; at the bound no more is accepted until one closes (they wait in
    /// the system's backlog), so a flood of connections cannot take every file descriptor. Waits
    /// and MCP streams each hold one: scale out rather than raise it past the open-file limit.
    #[arg(long, env = "JOBTRAIL_MAX_CONNECTIONS",
          default_value_t = jobtrail_api::MAX_CONNECTIONS as u32,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,
    /// Connections one client address may hold open at once (a number, or `off`); past it a new
    /// one from that address is answered 429 and closed, so one client cannot take every place.
    /// Addresses in --trusted-proxies are not counted. Behind a proxy not named there, every
    /// client has the proxy's address: set `off` (the Helm chart does unless told otherwise).
    #[arg(long, env = "JOBTRAIL_MAX_CONNECTIONS_PER_ADDRESS",
          default_value_t = Bound(Some(jobtrail_api::MAX_CONNECTIONS_PER_ADDRESS as u32)))]
    pub max_connections_per_address: Bound,
    /// Serve /livez, /readyz and /metrics (Prometheus) on this address, apart from the API (keep it
    /// off the Ingress). Unset: no listener.
    #[arg(long, env = "JOBTRAIL_OPS_LISTEN")]
    pub ops_listen: Option<std::net::SocketAddr>,
    /// Requests one client address may make (`RATE/s`, `RATE/s,BURST`, or `off`), counted before
    /// the token is looked up: past it, 429 with Retry-After. Behind a proxy or an Ingress every
    /// client has the proxy's address: name the proxy in --trusted-proxies.
    #[arg(long, env = "JOBTRAIL_RATE_PER_ADDRESS", default_value = "500/s,1000")]
    pub rate_per_address: jobtrail_api::limit::Rate,
    /// Requests one bearer token may make (`RATE/s`, `RATE/s,BURST`, or `off`): one runaway agent
    /// cannot take the database from the others. Each server process counts on its own.
    #[arg(long, env = "JOBTRAIL_RATE_PER_TOKEN", default_value = "100/s,200")]
    pub rate_per_token: jobtrail_api::limit::Rate,
    /// Proxies whose X-Forwarded-For names the client, for --rate-per-address (addresses or ranges,
    /// comma-separated: your Ingress controller's pod range). From anyone else the header is ignored.
    #[arg(long, env = "JOBTRAIL_TRUSTED_PROXIES", default_value = "")]
    pub trusted_proxies: jobtrail_api::limit::Proxies,
    /// MCP sessions one caller may hold open at once over /mcp (each lives until closed or idle
    /// for 5 minutes); past it, opening another is refused (429).
    #[arg(long, env = "JOBTRAIL_MCP_SESSIONS_PER_CALLER",
          default_value_t = jobtrail_mcp::SESSIONS_PER_CALLER,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub mcp_sessions_per_caller: u32,
    /// Operations one caller may hold open (not yet finished: running, or waiting for a person) at
    /// once, counted across every server by the database; a submit past it is refused (429
    /// too-many-open) and writes nothing. A guard against a runaway agent starting paid jobs
    /// without end.
    #[arg(long, env = "JOBTRAIL_OPEN_PER_CALLER",
          default_value_t = jobtrail_service::OPEN_PER_CALLER,
          value_parser = clap::value_parser!(u32).range(1..=100_000_000))]
    pub open_per_caller: u32,
    /// Waits (HTTP and MCP) one caller may hold open at once; past it, another is refused (429).
    #[arg(long, env = "JOBTRAIL_WAITS_PER_CALLER",
          default_value_t = jobtrail_service::WAITS_PER_CALLER as u32,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub waits_per_caller: u32,
    /// Results (GET /v1/operations/{id}/result) one caller may be sent at once; past it, another
    /// is refused (429). Each is held in memory until the last of it is sent.
    #[arg(long, env = "JOBTRAIL_RESULTS_PER_CALLER",
          default_value_t = jobtrail_service::RESULTS_PER_CALLER as u32,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub results_per_caller: u32,
    /// Request bodies (HTTP and MCP) one caller may be sending at once; past it, another is
    /// refused (429). Each, and what is parsed from it, is held in memory until the request is
    /// answered (a submit: up to 16 MiB).
    #[arg(long, env = "JOBTRAIL_BODIES_PER_CALLER",
          default_value_t = jobtrail_service::BODIES_PER_CALLER as u32,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub bodies_per_caller: u32,
    /// MiB of results being sent and request bodies being read (as declared, or the most a body
    /// may be until it is read) the process holds at once across every caller, one caller at most
    /// half; past either, another is refused (503 with Retry-After: 1). One item counts at most a
    /// quarter, so a larger result is still served. Size the pod's memory limit above it.
    #[arg(long, env = "JOBTRAIL_HELD_MIB",
          default_value_t = (jobtrail_service::HELD_BYTES / (1024 * 1024)) as u32,
          value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub held_mib: u32,
    /// Webhook payloads being read at once for one provider, a quarter of them (at least 1) from
    /// one address (each is read whole, up to 256 KiB, before its signature can be checked); past
    /// either, another is refused (429) and the provider delivers it again later. Webhooks only
    /// hint: status reads go on without them.
    #[arg(long, env = "JOBTRAIL_WEBHOOK_BODIES_PER_PROVIDER",
          default_value_t = jobtrail_service::WEBHOOK_BODIES_PER_PROVIDER as u32,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub webhook_bodies_per_provider: u32,
    #[command(flatten)]
    pub db_wait: crate::start::DbWait,
}

/// An MCP allowed host as the Host header is compared with it: `host` or `host:port`, nothing
/// else. A URL, a path or a user would never match a Host header, so every MCP request under that
/// name would be refused (403) by a server that started as if all were well.
fn mcp_host(given: &str) -> Result<String, String> {
    let given = given.trim();
    // An empty one (a variable set to nothing, a trailing comma) names no host.
    if given.is_empty() {
        return Ok(String::new());
    }
    let bad = || {
        format!(
            "{given:?} is not a host name or host:port (no scheme, no path, no user): \
             e.g. jobtrail.example or jobtrail.example:8443"
        )
    };
    // An IPv6 address alone (`::1`), as rmcp takes it; with a port it is bracketed (`[::1]:8443`).
    if given.parse::<std::net::Ipv6Addr>().is_ok() {
        return Ok(given.to_owned());
    }
    let authority = http::uri::Authority::try_from(given).map_err(|_| bad())?;
    // A port that is no port (`host:`, `host:abc`, `host:99999`) would match any port.
    let after_host = given.rsplit_once(']').map_or(given, |(_, rest)| rest);
    let port_unread = after_host.contains(':') && authority.port_u16().is_none();
    if given.contains('@') || authority.host().is_empty() || port_unread {
        return Err(bad());
    }
    Ok(authority.as_str().to_owned())
}

pub async fn serve(common: &shell::Common, a: ServeArgs) -> CmdResult {
    let drain = shell::parse_duration_within(
        "--drain",
        &a.drain,
        Duration::ZERO,
        Duration::from_secs(600),
    )?;
    let stop_delay = shell::parse_duration_within(
        "--stop-delay",
        &a.stop_delay,
        Duration::ZERO,
        Duration::from_secs(300),
    )?;
    let request_timeout = shell::parse_duration_within(
        "--request-timeout",
        &a.request_timeout,
        Duration::from_secs(1),
        Duration::from_secs(600),
    )?;
    let connections = jobtrail_api::Connections {
        send_timeout: shell::parse_duration_within(
            "--send-timeout",
            &a.send_timeout,
            Duration::from_secs(10),
            Duration::from_secs(3600),
        )?,
        head_timeout: shell::parse_duration_within(
            "--head-timeout",
            &a.head_timeout,
            Duration::from_secs(30),
            Duration::from_secs(600),
        )?,
        most: a.max_connections as usize,
        per_address: a.max_connections_per_address.0.map(|n| n as usize),
        exempt: a.trusted_proxies.clone(),
    };
    let db_wait = a.db_wait.parse()?;
    let registry = shell::registry(&common.providers)?;
    let contracts = registry.names().count();
    // Webhooks only hint (polling goes on without them): said, but the API stays ready for agents.
    for m in registry.unresolvable_secrets(jobtrail_provider::SecretsFor::Webhooks) {
        tracing::warn!("{m}: this provider's webhooks are refused until it is set");
    }
    // SIGTERM marks the process as leaving (unready); it stops accepting --stop-delay later.
    let stopping = tokio_util::sync::CancellationToken::new();
    let shutdown = tokio_util::sync::CancellationToken::new();
    on_signal(stopping.clone(), shutdown.clone());
    tokio::spawn({
        let (stopping, shutdown) = (stopping.clone(), shutdown.clone());
        async move {
            stopping.cancelled().await;
            if !stop_delay.is_zero() {
                tracing::info!("stopping: unready now, accepting for {stop_delay:?} more");
                tokio::select! {
                    _ = tokio::time::sleep(stop_delay) => {}
                    _ = shutdown.cancelled() => {}
                }
            }
            shutdown.cancel();
        }
    });
    // The probes answer before the database does (see `jobtrail worker`); ready once the API
    // answers.
    let at_work = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(addr) = a.ops_listen {
        let probe = jobtrail_telemetry::Probe {
            store: shell::store_lazy(common.database_url.as_deref(), crate::work::PROBE_POOL)?,
            contracts,
            needs_contracts: false,
            unresolved_secrets: Vec::new(),
            stopping: Some(stopping.clone()),
            liveness: None,
            at_work: Some(at_work.clone()),
        };
        ops_listener("jobtrail API", addr, probe, shutdown.clone()).await?;
    }
    // Listening before the database answers: a port already taken is said now, not once the
    // database is back, and a client is answered 503 with Retry-After meanwhile, not refused.
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .map_err(|e| fail(exit::UNAVAILABLE, format!("--listen {}: {e}", a.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| fail(exit::UNAVAILABLE, e))?;
    let ready = std::sync::Arc::new(std::sync::OnceLock::new());
    let mut server = tokio::spawn(jobtrail_api::serve(
        listener,
        jobtrail_api::until_ready(ready.clone()),
        shutdown.clone(),
        drain,
        connections,
    ));
    eprintln!("jobtrail API bound to http://{addr} (503 'starting' until its database answers)");
    // One --db-wait for both logins: the second waits only what the first left of it.
    let began = std::time::Instant::now();
    let database = |url: Option<String>, pool| {
        let stopping = stopping.clone();
        let left = db_wait.map(|w| w.saturating_sub(began.elapsed()));
        async move { crate::start::database(url.as_deref(), pool, left, &stopping).await }
    };
    // The listener's task ends only if it panics: said then, not once the database is back.
    let gone = |ended: Result<std::io::Result<()>, tokio::task::JoinError>| {
        fail(
            exit::UNAVAILABLE,
            format!(
                "--listen {addr}: the listener stopped while waiting for the database: {}",
                match ended {
                    Ok(Ok(())) => "no error".to_owned(),
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => e.to_string(),
                }
            ),
        )
    };
    let connected = tokio::select! {
        connected = database(common.database_url.clone(), common.db_pool) => connected?,
        ended = &mut server => return Err(gone(ended)),
    };
    let Some(store) = connected else {
        return Ok(ExitCode::SUCCESS);
    };
    let service = match a.operator_database_url.filter(|u| !u.trim().is_empty()) {
        Some(u) => {
            let connected = tokio::select! {
                connected = database(Some(u), common.db_pool) => connected?,
                ended = &mut server => return Err(gone(ended)),
            };
            let Some(operator) = connected else {
                return Ok(ExitCode::SUCCESS);
            };
            jobtrail_service::Service::with_operator(store, operator, registry)
        }
        None => jobtrail_service::Service::new(store, registry),
    };
    service.set_request_timeout(request_timeout);
    service.set_open_per_caller(a.open_per_caller);
    service.set_waits_per_caller(a.waits_per_caller as usize);
    service.set_results_per_caller(a.results_per_caller as usize);
    service.set_bodies_per_caller(a.bodies_per_caller as usize);
    service.set_held_bytes(a.held_mib as usize * 1024 * 1024);
    service.set_webhook_bodies_per_provider(a.webhook_bodies_per_provider as usize);
    let mcp = jobtrail_api::protected(
        axum::Router::new()
            .merge(jobtrail_mcp::http_router(
                service.clone(),
                shutdown.clone(),
                a.mcp_allowed_hosts
                    .into_iter()
                    .filter(|h| !h.is_empty())
                    .collect(),
                a.mcp_sessions_per_caller as usize,
            ))
            .layer(axum::middleware::from_fn_with_state(
                service.clone(),
                jobtrail_api::require_bearer,
            )),
    );
    let gate =
        jobtrail_api::limit::Gate::new(a.rate_per_address, a.rate_per_token, a.trusted_proxies);
    let app = gate.around(jobtrail_api::router(service).merge(mcp));
    // Ready before it says it listens: whoever waits for the line finds it answering.
    let _ = ready.set(app);
    at_work.store(true, std::sync::atomic::Ordering::Relaxed);
    eprintln!("jobtrail API listening on http://{addr} (MCP at /mcp, OpenAPI at /openapi.json)");
    server
        .await
        .map_err(|e| fail(exit::UNAVAILABLE, e))?
        .map_err(|e| fail(exit::UNAVAILABLE, e))?;
    Ok(ExitCode::SUCCESS)
}

pub async fn mcp(d: &crate::ops::DoorArgs) -> CmdResult {
    let api = d.api.as_deref().filter(|a| !a.trim().is_empty()).ok_or_else(|| {
        fail(
            exit::BAD_INPUT,
            "jobtrail mcp talks to jobtrail's HTTP API: set JOBTRAIL_API (or --api) and JOBTRAIL_TOKEN",
        )
    })?;
    let token = std::env::var("JOBTRAIL_TOKEN").unwrap_or_default();
    let client =
        jobtrail_service::client::ApiClient::new(api, &token).map_err(crate::ops::failure)?;
    jobtrail_mcp::serve_stdio(jobtrail_mcp::Backend::Api(client))
        .await
        .map_err(|e| fail(exit::UNAVAILABLE, e))?;
    Ok(ExitCode::SUCCESS)
}

/// A bound that may be switched off: a number from 1, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound(pub Option<u32>);

impl std::str::FromStr for Bound {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("off") {
            return Ok(Bound(None));
        }
        match s.trim().parse::<u32>() {
            Ok(n) if (1..=1_000_000).contains(&n) => Ok(Bound(Some(n))),
            _ => Err(format!("{s:?}: a number from 1 to 1000000, or off")),
        }
    }
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(n) => write!(f, "{n}"),
            None => f.write_str("off"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::mcp_host;

    /// A Host header names `host` or `host:port` (an IPv6 address bracketed with a port); an
    /// allowed host that no Host header could name is refused, not kept to answer 403 for ever.
    #[test]
    fn an_mcp_allowed_host_is_what_a_host_header_can_name() {
        for ok in [
            "jobtrail.example",
            "jobtrail.example:8443",
            "::1",
            "[::1]:8443",
            "10.0.0.5",
        ] {
            assert_eq!(mcp_host(ok).as_deref(), Ok(ok), "{ok}");
        }
        assert_eq!(mcp_host(" a.example ").as_deref(), Ok("a.example"));
        assert_eq!(mcp_host("").as_deref(), Ok(""), "names none");
        for bad in [
            "https://jobtrail.example",
            "jobtrail.example/",
            "user@jobtrail.example",
            "jobtrail.example:",
            "jobtrail.example:abc",
            "jobtrail.example:99999",
            "a b",
        ] {
            assert!(mcp_host(bad).is_err(), "{bad}");
        }
    }
}
