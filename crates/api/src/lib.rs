//! # jobtrail-api
//!
//! The HTTP door: a thin axum layer over [`jobtrail_service`]. Every route but the webhook receiver
//! and `/openapi.json` needs a bearer token; the caller recorded in history is the token's, never a
//! field of the request. Errors are RFC 9457 problems ([`problem`]); the OpenAPI 3.1 document is
//! generated from the handlers' annotations ([`openapi`]) and committed as `docs/openapi.json`.

pub mod body;
mod deadline;
pub mod limit;
pub mod problem;
mod routes;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use jobtrail_service::{Kind, Principal, Service, ServiceError};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

pub use problem::{PROBLEM_JSON, Problem, ProblemDoc};

pub use jobtrail_service::{MAX_REQUEST_BYTES, REQUEST_TIMEOUT};

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub service: Arc<Service>,
    pub webhooks: webhook::Receiver,
}

/// The authenticated caller of a request.
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Problem> {
        if let Some(p) = parts.extensions.get::<Principal>() {
            return Ok(Caller(p.clone()));
        }
        authenticate(parts, &state.service).await.map(Caller)
    }
}

/// The token of an `Authorization: Bearer <token>` header, if the request has one.
pub(crate) fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
}

async fn authenticate(parts: &Parts, service: &Service) -> Result<Principal, Problem> {
    let token = bearer(&parts.headers).ok_or_else(|| {
        Problem::new(
            Kind::Unauthenticated,
            "send Authorization: Bearer <token> (jobtrail-admin tokens create)",
        )
    })?;
    Ok(service.authenticate(token).await?)
}

/// What a body may take parsed and still give its turn back once it has arrived (over MCP).
const SMALL_PARSED_BYTES: usize = 1024 * 1024;

/// Middleware for routes served by other crates (the MCP endpoint): authenticate the bearer token,
/// read the body whole with one of the caller's turns ([`body`]), and put the [`Principal`] in the
/// request's extensions.
pub async fn require_bearer(
    State(service): State<Arc<Service>>,
    req: Request,
    next: Next,
) -> Response {
    use axum::body::HttpBody;
    let (mut parts, body) = req.into_parts();
    let p = match authenticate(&parts, &service).await {
        Ok(p) => p,
        Err(problem) => return problem.into_response(),
    };
    // A large body's turn is held until the answer has been sent to its end: MCP answers a call
    // with a stream at once and runs the call (holding what it parsed from the body) behind it. A
    // small one's (a wait, a list, a cancel: small text that takes little parsed) is given back
    // once it has arrived, so that a caller's long MCP waits do not hold its turns.
    let (body, turn) = if body.is_end_stream() {
        (body, None)
    } else {
        // Only a caller who may submit sends a provider's request; any other sends a few words.
        let limit = if p.has(jobtrail_service::Scope::Submit) {
            MAX_REQUEST_BYTES
        } else {
            body::SMALL_REQUEST_BYTES
        };
        match body::read(&service, &p, &parts.headers, body, limit).await {
            Ok((b, (slot, mut held))) => {
                // What MCP's parser builds from the body is held too, before it is built (many
                // small values take many times their text; too many are refused): twice the
                // value, as rmcp reads a message whole into serde's buffer before its own types.
                let parsed = match jobtrail_core::json::footprint(&b) {
                    Ok(parsed) => match service.hold(p.caller(), 2 * parsed) {
                        Ok(more) => {
                            held.join(more);
                            parsed
                        }
                        Err(e) => return Problem::from(e).into_response(),
                    },
                    Err(e) => return body::refused_json(e).into_response(),
                };
                // Two equal keys and inexact numbers are refused as the HTTP routes refuse them:
                // MCP's own parser takes the last key and rounds the number, so
                // `{"provider": "a", "provider": "b"}` would start a job other than the one a
                // reader of the call saw. (A NUL goes on to the tool, which refuses it in words
                // the agent reads.)
                if let Err(e) = jobtrail_core::json::parse_exact(&b) {
                    return body::refused_json(e).into_response();
                }
                let turn = (slot, held);
                let large = b.len() > body::SMALL_REQUEST_BYTES || parsed > SMALL_PARSED_BYTES;
                (axum::body::Body::from(b), large.then_some(turn))
            }
            Err(problem) => return problem.into_response(),
        }
    };
    parts.extensions.insert(p);
    // What the call's answer holds (a result's turn and bytes, put here by MCP's get_result) is
    // held with its body, as the large body's turn is.
    let until_sent = jobtrail_service::HeldUntilSent::default();
    parts.extensions.insert(until_sent.clone());
    let answer = next.run(Request::from_parts(parts, body)).await;
    answer.map(|b| {
        use http_body_util::BodyExt;
        axum::body::Body::new(b.map_frame(move |f| {
            let _held = (&turn, &until_sent);
            f
        }))
    })
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "jobtrail",
        description = "Durable, evidenced remote asynchronous jobs for AI agents: submit an operation and get its id at once; jobtrail creates the remote job once, observes it, cancels on request (cancelled only when the provider confirms), validates the result and keeps a tamper-evident history. Errors are RFC 9457 problems whose `kind` matches the CLI's exit codes.",
        license(name = "Apache-2.0")
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "operations", description = "What agents do: submit, read, wait, cancel, fetch results"),
        (name = "operator", description = "What people do: the escalation queue and decisions (scope decide)"),
        (name = "audit", description = "Evidence verification (scope audit)"),
        (name = "webhooks", description = "Provider webhooks: a hint to read the status now, never a state change by itself")
    )
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A jobtrail API token (jtk_…), from `jobtrail-admin tokens create`",
                    ))
                    .build(),
            ),
        );
    }
}

fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi()).merge(routes::router())
}

/// The routes and their OpenAPI document.
fn api_parts() -> (axum::Router<AppState>, utoipa::openapi::OpenApi) {
    let (routes, mut doc) = api_router().split_for_parts();
    every_route_may_answer(&mut doc);
    (routes, doc)
}

/// The OpenAPI document, generated from the routes.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_parts().1
}

/// What any route may answer whatever it does: a refusal by the door's rate limits (or a bound on
/// waits or MCP sessions held at once), with `Retry-After`; and an unreachable database or an
/// internal error. Written once here rather than on every route, so no route can leave them out.
fn every_route_may_answer(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{
        ContentBuilder, HeaderBuilder, ObjectBuilder, Ref, ResponseBuilder, Type,
    };
    let problem = || {
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("ProblemDoc")))
            .build()
    };
    let limited = ResponseBuilder::new()
        .description(
            "Rate-limited: too many requests from this address or token, or too many waits, MCP sessions, results or request bodies (for a webhook: payloads of its provider) held at once. Nothing was done: try again after `Retry-After` seconds (also `extra.retry_after_secs`). A submit (or a batch) may instead be refused as `too-many-open`, without `Retry-After`: the caller holds as many open operations as the server allows (`extra.open`, `extra.limit`); nothing was written, wait for some to finish",
        )
        .content(PROBLEM_JSON, problem())
        .header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(Some(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(1)),
                ))
                .description(Some("Seconds to wait before trying again"))
                .build(),
        )
        .build();
    let unavailable = ResponseBuilder::new()
        .description(
            "Unavailable: the database could not be reached (`Retry-After` says when to come back), an internal error, or the request ran past its time bound (`--request-timeout`, 30 s by default; a wait, five minutes more), when `Retry-After` says when to come back and a change it had made stands. Try again later (a submit with the same `id` is safe to repeat)",
        )
        .content(PROBLEM_JSON, problem())
        .build();
    for item in doc.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ];
        for op in operations.into_iter().flatten() {
            let answers = &mut op.responses.responses;
            answers
                .entry("429".into())
                .or_insert_with(|| limited.clone().into());
            answers
                .entry("503".into())
                .or_insert_with(|| unavailable.clone().into());
        }
    }
}

/// The API's router (with `/openapi.json`), ready to serve.
pub fn router(service: Arc<Service>) -> axum::Router {
    let bound = deadline::RequestBound(service.request_timeout().unwrap_or(REQUEST_TIMEOUT));
    let state = AppState {
        webhooks: webhook::Receiver::new(service.clone()),
        service,
    };
    let (routes, doc) = api_parts();
    // Written once: served without a token, it must cost a request no more than its bytes (a deep
    // copy and a serialisation of the whole document on every request did).
    let doc =
        bytes::Bytes::from(serde_json::to_vec(&doc).expect("the OpenAPI document serialises"));
    let routes = routes
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let doc = doc.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            axum::http::HeaderValue::from_static("application/json"),
                        )],
                        doc,
                    )
                }
            }),
        )
        .fallback(|| async {
            // `extra.route` tells a client this is no missing operation: its base URL is wrong.
            let mut p = ServiceError::new(
                Kind::NotFound,
                "no such route (see /openapi.json for the API)",
            );
            p.detail = Some(serde_json::json!({"route": "unknown"}));
            Problem(p)
        })
        .method_not_allowed_fallback(|| async {
            Problem::new(
                Kind::MethodNotAllowed,
                "this route does not take that method: the Allow header lists those it does (see /openapi.json)",
            )
        })
        .with_state(state)
        .layer(axum::Extension(bound));
    protected(routes)
}

/// How long a client told the server is starting is asked to wait before it comes back.
const STARTING_RETRY_SECS: u64 = 2;

/// The server before its database answers: `jobtrail serve` listens first (a port already taken
/// is said at once, not after the database returns, and a client is told to come back rather than
/// refused a connection), answering every request 503 `unavailable` with `Retry-After` until
/// `app` is set; then `app` answers everything.
pub fn until_ready(app: Arc<std::sync::OnceLock<axum::Router>>) -> axum::Router {
    axum::Router::new().fallback_service(tower::service_fn(move |request: Request| {
        let app = app.get().cloned();
        async move {
            let Some(app) = app else {
                return Ok(starting());
            };
            tower::ServiceExt::oneshot(app, request).await
        }
    }))
}

/// The answer while the server waits for its database: a refusal for load, as the API's others
/// (`Retry-After` and `extra.retry_after_secs`; the connection closed, its body unread).
fn starting() -> Response {
    Problem(
        jobtrail_service::ServiceError::unavailable(
            "starting: this server is waiting for its database; come back shortly",
        )
        .with_detail(serde_json::json!({ "retry_after_secs": STARTING_RETRY_SECS })),
    )
    .into_response()
}

/// `app` behind the layers every route of the server has (the API's own, and routes other crates
/// serve beside it, such as `/mcp`): the request body limit, a panic answered as a 503 problem
/// rather than a dropped connection, and the `Authorization` header marked sensitive (never logged).
pub fn protected(app: axum::Router) -> axum::Router {
    app.layer(axum::extract::DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| {
                Problem::new(Kind::Unavailable, "internal error").into_response()
            },
        ))
        .layer(
            tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer::new([
                header::AUTHORIZATION,
            ]),
        )
}

/// How a server treats its connections: how long it waits on a peer before closing on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connections {
    /// Close a connection whose peer takes none of the bytes sent to it for this long (hyper has
    /// no write timeout: a reader that stops reading would hold its answer, and what the answer
    /// holds, until it went away). One with nothing to send (a long poll) is not affected.
    pub send_timeout: Duration,
    /// Close an HTTP/1.1 connection that has not sent a whole request head this long after it
    /// opened or after its last answer: a head sent a byte at a time, a connection opened and
    /// left silent, a keep-alive connection left idle.
    pub head_timeout: Duration,
    /// Connections open at once; at the bound the server accepts no more until one closes (they
    /// wait in the system's backlog), so a flood of connections cannot take every file
    /// descriptor and the memory behind them.
    pub most: usize,
    /// Connections one client address (an IPv6 one by its /64) may hold open at once (`None`: no
    /// bound but `most`); past it a new connection from that address is answered 429 and closed,
    /// so one client cannot take every place. Addresses in `exempt` (trusted proxies, which carry
    /// many clients) are not counted.
    pub per_address: Option<usize>,
    pub exempt: limit::Proxies,
}

/// The default `--send-timeout`.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// The default `--head-timeout`.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(90);
/// The default `--max-connections`.
pub const MAX_CONNECTIONS: usize = 4096;
/// The default `--max-connections-per-address`: an eighth of the default bound.
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 512;

impl Default for Connections {
    fn default() -> Self {
        Self {
            send_timeout: SEND_TIMEOUT,
            head_timeout: HEAD_TIMEOUT,
            most: MAX_CONNECTIONS,
            per_address: Some(MAX_CONNECTIONS_PER_ADDRESS),
            exempt: limit::Proxies::default(),
        }
    }
}

/// The most a request head may take (hyper's read buffer; past it, 431 and the connection
/// closed). hyper's default, about 400 KiB, let a head sent slowly hold that much for the head
/// timeout on every connection, before any token was read: 4 096 connections, 1.6 GiB. An
/// Ingress passes no header line over 8 KiB by default.
const HEAD_MOST_BYTES: usize = 16 * 1024;

/// Serve `app` (HTTP/1.1) on `listener` until `shutdown` resolves,
/// then finish the requests in flight (bounded by `drain`). Each request carries its peer's
/// address (`ConnectInfo<SocketAddr>`: the rate limit per address reads it). Its own accept loop,
/// not axum's `serve`, which sets no timer: hyper would then wait on a request head forever.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: tokio_util::sync::CancellationToken,
    drain: Duration,
    connections: Connections,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use tower::Layer;
    // HTTP/1.1 only: HTTP/2 by prior knowledge would first be sniffed from the opening bytes with
    // no deadline, and an HTTP/2 connection has none for being idle, so a client could hold a
    // connection for ever. (An Ingress speaks HTTP/1.1 to its backends unless told otherwise.)
    let mut builder =
        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(connections.head_timeout)
        .max_buf_size(HEAD_MOST_BYTES);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let open = Arc::new(tokio::sync::Semaphore::new(connections.most.max(1)));
    let (mut said_full, mut said_stuck): (Option<std::time::Instant>, Option<std::time::Instant>) =
        (None, None);
    let mut per_address = PerAddress {
        most: connections.per_address,
        exempt: connections.exempt.clone(),
        open: Arc::default(),
        said: None,
    };
    loop {
        // A place for the next connection first: at the bound, none is accepted until one closes.
        let place = match open.clone().try_acquire_owned() {
            Ok(place) => place,
            Err(_) => {
                // Said at most once a minute: under a flood this is every closing connection.
                if said_full.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    said_full = Some(std::time::Instant::now());
                    tracing::warn!(
                        "{} connections open, the most at once (--max-connections): accepting no more until one closes",
                        connections.most
                    );
                }
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    place = open.clone().acquire_owned() => match place {
                        Ok(place) => place,
                        Err(_) => break,
                    },
                }
            }
        };
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // A connection gone before it was accepted: the next one.
                Err(e) if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionRefused
                ) => continue,
                // Out of file descriptors, say: wait rather than spin, and say so once a minute.
                Err(e) => {
                    if said_stuck.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                        said_stuck = Some(std::time::Instant::now());
                        tracing::warn!("accepting a connection: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            },
        };
        let Some(counted) = per_address.admit(peer.ip()) else {
            let _ = tcp.try_write(TOO_MANY_FROM_ADDRESS);
            continue;
        };
        cut_off_after(&tcp, connections.send_timeout);
        let app = axum::Extension(axum::extract::ConnectInfo(peer)).layer(app.clone());
        let conn = builder
            .serve_connection(
                TokioIo::new(tcp),
                hyper_util::service::TowerToHyperService::new(app),
            )
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A connection's end is the peer's business (reset, timed out): nothing to report.
            let _ = conn.await;
            drop((place, counted));
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(drain) => {
            tracing::warn!("requests still open after {drain:?}: stopping anyway");
        }
    }
    Ok(())
}

/// Connections open per client address (only addresses that hold one are kept).
struct PerAddress {
    most: Option<usize>,
    exempt: limit::Proxies,
    open: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    said: Option<std::time::Instant>,
}

/// One connection counted against its address until it closes.
struct CountedConnection {
    open: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    ip: std::net::IpAddr,
}

impl Drop for CountedConnection {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// The answer to a connection past its address's bound: written if the socket takes it at once
/// (the connection is closed either way; nothing of the request is read).
const TOO_MANY_FROM_ADDRESS: &[u8] = b"HTTP/1.1 429 Too Many Requests\r\nconnection: close\r\n\
content-type: text/plain\r\nretry-after: 1\r\ncontent-length: 76\r\n\r\n\
too many connections open from this address (--max-connections-per-address)\n";

impl PerAddress {
    /// Count a new connection from `ip`: `None` (and the connection refused) when its address
    /// already holds its most; `Some(None)` when addresses are not counted or it is exempt.
    fn admit(&mut self, ip: std::net::IpAddr) -> Option<Option<CountedConnection>> {
        let Some(most) = self.most else {
            return Some(None);
        };
        let ip = ip.to_canonical();
        if self.exempt.trusts(ip) {
            return Some(None);
        }
        // An IPv6 client by its /64, as the rate per address counts it.
        let ip = limit::address_key(ip);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_default();
        if *n >= most {
            // Said at most once a minute: under a flood this is every connection.
            if self
                .said
                .is_none_or(|t| t.elapsed() > Duration::from_secs(60))
            {
                self.said = Some(std::time::Instant::now());
                tracing::warn!(
                    "{ip} holds {most} connections open, the most one address may (--max-connections-per-address): refusing its new ones until one closes"
                );
            }
            return None;
        }
        *n += 1;
        Some(Some(CountedConnection {
            open: self.open.clone(),
            ip,
        }))
    }
}

/// Close `tcp` once bytes sent on it have gone unacknowledged, or unsent because the peer's window
/// is shut, for `timeout` (Linux's `TCP_USER_TIMEOUT`; elsewhere only the system's own timeouts).
fn cut_off_after(tcp: &tokio::net::TcpStream, timeout: Duration) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_user_timeout(Some(timeout)) {
        tracing::debug!("TCP_USER_TIMEOUT not set on a connection: {e}");
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = (tcp, timeout);
}

/// A status code for tests and the CLI.
pub fn status_of(kind: Kind) -> StatusCode {
    StatusCode::from_u16(kind.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv6 client is counted by its /64 (one machine commonly holds one whole: counting each
    /// address apart would be no bound at all); an IPv4-mapped one as its IPv4 address; a place is
    /// given back when its connection closes.
    #[test]
    fn one_address_is_an_ipv6_client_by_its_64() {
        let mut per = PerAddress {
            most: Some(1),
            exempt: limit::Proxies::default(),
            open: Arc::default(),
            said: None,
        };
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let first = per.admit(ip("2001:db8::1")).expect("the first is admitted");
        assert!(
            per.admit(ip("2001:db8::2")).is_none(),
            "a sibling in the /64 is admitted"
        );
        assert!(
            per.admit(ip("2001:db8:0:1::1")).is_some(),
            "another /64 is refused"
        );
        let v4 = per.admit(ip("192.0.2.1")).unwrap();
        assert!(
            per.admit(ip("::ffff:192.0.2.1")).is_none(),
            "a mapped address is apart"
        );
        drop((first, v4));
        assert!(
            per.admit(ip("2001:db8::3")).is_some(),
            "a place is not given back"
        );
        assert!(per.admit(ip("192.0.2.1")).is_some());
    }
}
