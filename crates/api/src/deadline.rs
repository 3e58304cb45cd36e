//! Every route's time bound, answered as the API's other refusals are: a problem document that says
//! what ran out and when to come back (`Retry-After`), not the bare 503 a timeout layer writes.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::Problem;

/// The server's bound on a request (`--request-timeout`), put on every request by
/// [`crate::router`]; [`crate::REQUEST_TIMEOUT`] where none was.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestBound(pub Duration);

fn bound_of(request: &Request) -> Duration {
    request
        .extensions()
        .get::<RequestBound>()
        .map_or(crate::REQUEST_TIMEOUT, |b| b.0)
}

/// The ids a submit route made up for what the agent named none for, where the route's bound can
/// read them: a submit stopped at its bound may have landed, and its refusal names them (see
/// [`jobtrail_service::maybe_submitted`]). Put on every request by [`within`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Minted(Arc<OnceLock<(Vec<String>, bool)>>);

impl Minted {
    /// One submission's id, made up for it.
    pub(crate) fn one(&self, id: &str) {
        let _ = self.0.set((vec![id.to_owned()], false));
    }
    /// A batch's ids in item order, given or made up.
    pub(crate) fn batch(&self, ids: Vec<String>) {
        let _ = self.0.set((ids, true));
    }
    /// `e`, naming what was made up.
    pub(crate) fn told(&self, e: jobtrail_service::ServiceError) -> jobtrail_service::ServiceError {
        match self.0.get() {
            Some((ids, true)) => jobtrail_service::maybe_submitted_batch(e, ids.clone(), true),
            Some((ids, false)) => jobtrail_service::maybe_submitted(e, ids.first().cloned()),
            None => e,
        }
    }
}

/// A route other than a wait, within the server's bound.
pub(crate) async fn route(request: Request, next: Next) -> Response {
    let limit = bound_of(&request);
    within(limit, request, next).await
}

/// A wait, within the longest a wait may last ([`jobtrail_service::MAX_WAIT`], whatever its own
/// timeout) and the server's bound.
pub(crate) async fn wait_route(request: Request, next: Next) -> Response {
    let limit = bound_of(&request) + jobtrail_service::MAX_WAIT;
    within(limit, request, next).await
}

/// Run the route, or answer 503 `unavailable` once `limit` has passed. The route's future is
/// dropped then: a change it had committed stands, one it had not is not made, so the answer says
/// to look before repeating a change.
pub(crate) async fn within(limit: Duration, mut request: Request, next: Next) -> Response {
    // Named in the log (the path, not the query): a route that runs past its bound is a stuck
    // query or a database under strain, each worth a line, not a refusal for load.
    let route = format!("{} {}", request.method(), request.uri().path());
    let minted = Minted::default();
    request.extensions_mut().insert(minted.clone());
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(answer) => answer,
        Err(_) => {
            tracing::warn!(%route, ?limit, "a request ran past its time bound and was stopped");
            Problem(minted.told(jobtrail_service::stopped(limit))).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A route that outlives its bound is answered over real HTTP with a problem document that
    /// says so and when to come back; one within it is answered as it answered.
    #[tokio::test]
    async fn a_route_past_its_bound_is_answered_with_a_problem_and_when_to_come_back() {
        let app = axum::Router::new()
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    "too late"
                }),
            )
            .route("/fast", axum::routing::get(|| async { "in time" }))
            .layer(axum::middleware::from_fn(|request: Request, next: Next| {
                within(Duration::from_millis(200), request, next)
            }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let get = |path: &'static str| async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(
                format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut answer = String::new();
            tokio::time::timeout(Duration::from_secs(10), c.read_to_string(&mut answer))
                .await
                .expect("answered within the bound")
                .unwrap();
            answer.to_ascii_lowercase()
        };
        let started = std::time::Instant::now();
        let slow = get("/slow").await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(slow.starts_with("http/1.1 503"), "{slow}");
        assert!(
            slow.contains("content-type: application/problem+json"),
            "{slow}"
        );
        assert!(slow.contains("retry-after: 5\r\n"), "{slow}");
        assert!(slow.contains("\"kind\":\"unavailable\""), "{slow}");
        assert!(slow.contains("did not finish within 200ms"), "{slow}");
        assert!(slow.contains("\"retry_after_secs\":5"), "{slow}");
        let fast = get("/fast").await;
        assert!(
            fast.starts_with("http/1.1 200") && fast.ends_with("in time"),
            "{fast}"
        );
        server.abort();
    }
}
