//! Errors as RFC 9457 `application/problem+json`, with the same meanings as the CLI's exit codes
//! (one [`Kind`] each).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use jobtrail_service::{Kind, ServiceError};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The media type of every error answer.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProblemDoc {
    /// `urn:jobtrail:problem:<kind>`.
    #[serde(rename = "type")]
    pub type_: String,
    pub title: String,
    pub status: u16,
    /// What happened, for a person or an agent to act on.
    pub detail: String,
    /// The kind (bad-input, unauthenticated, forbidden, not-found, method-not-allowed, conflict,
    /// not-succeeded, not-finished, tampered, unavailable, too-large, rate-limited, too-many-open);
    /// the CLI exits with the matching code.
    pub kind: String,
    /// The CLI's exit code for this kind.
    pub exit_code: u8,
    /// Machine-readable details (both fingerprints of a conflict, the current view of a stale one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub extra: Option<serde_json::Value>,
}

/// A service error as an HTTP answer.
#[derive(Debug)]
pub struct Problem(pub ServiceError);

impl From<ServiceError> for Problem {
    fn from(e: ServiceError) -> Self {
        Self(e)
    }
}

impl Problem {
    pub fn new(kind: Kind, detail: impl Into<String>) -> Self {
        Self(ServiceError::new(kind, detail))
    }

    pub fn doc(&self) -> ProblemDoc {
        let k = self.0.kind;
        ProblemDoc {
            type_: format!("urn:jobtrail:problem:{}", k.as_str()),
            title: k.title().to_owned(),
            status: k.http_status(),
            detail: self.0.shown(),
            kind: k.as_str().to_owned(),
            exit_code: k.exit_code(),
            extra: self.0.detail.clone(),
        }
    }
}

/// When a refusal for load was last logged (milliseconds since [`EPOCH`], 0 for never).
static SHED_WARNED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static EPOCH: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

/// Whether a minute has passed since `last` said so (and it is now).
fn once_a_minute(last: &std::sync::atomic::AtomicU64) -> bool {
    use std::sync::atomic::Ordering;
    let now = EPOCH.elapsed().as_millis() as u64 + 1;
    let then = last.load(Ordering::Relaxed);
    (then == 0 || now.saturating_sub(then) >= 60_000)
        && last
            .compare_exchange(then, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let doc = self.doc();
        let status = StatusCode::from_u16(doc.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        metrics::counter!("jobtrail_api_problems_total", "kind" => self.0.kind.as_str())
            .increment(1);
        // Told when to come back: refused for load, or the database away.
        let come_back = (self.0.kind == Kind::RateLimited || self.0.kind == Kind::Unavailable)
            && self
                .0
                .detail
                .as_ref()
                .is_some_and(|d| d.get("retry_after_secs").is_some());
        // Refused for load (a rate, a caller's turns, the bytes held, a route's time bound): not
        // a fault of ours (one kept from the caller, the database away, is logged each time).
        let shed = self.0.kind == Kind::RateLimited || (come_back && !self.0.internal);
        // A server error, or a cause kept from the caller (an internal one: the caller is told
        // the log has it), is logged; refusals for load at most once a minute (they come in
        // floods, and the counter has each).
        if shed {
            if status.is_server_error() && once_a_minute(&SHED_WARNED) {
                tracing::warn!(kind = %doc.kind, detail = %self.0.message, "requests refused for load (said at most once a minute; jobtrail_api_problems_total counts them)");
            }
        } else if (status.is_server_error() || self.0.internal) && !self.0.logged_by_door {
            tracing::warn!(kind = %doc.kind, detail = %self.0.message, "request failed");
        }
        let body = serde_json::to_vec(&doc).unwrap_or_default();
        let mut r = (status, body).into_response();
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        // A refused body may be left unread on the connection, which the server then closes (a
        // refusal for load comes before the body is read): said here, so that a client does not
        // pool the connection and lose its next request on it.
        if self.0.kind == Kind::TooLarge || shed {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        // When to come back, as the refusal says it.
        if shed || come_back {
            r.headers_mut()
                .insert(header::RETRY_AFTER, self.0.retry_after_secs().into());
        }
        if self.0.kind == Kind::Unauthenticated {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"jobtrail\""),
            );
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_failure_is_logged_not_shown_to_the_caller() {
        let inside = jobtrail_store::StoreError::Unavailable(
            "connection to postgres://jobtrail_api_1@db-7.internal failed: role secret_role".into(),
        );
        let doc = Problem::from(ServiceError::from(inside)).doc();
        assert_eq!(doc.kind, "unavailable");
        assert_eq!(doc.status, 503);
        assert!(!doc.detail.contains("db-7"), "{}", doc.detail);
        assert!(!doc.detail.contains("role"), "{}", doc.detail);
        // What the caller should know still reaches them.
        let conflict = jobtrail_store::StoreError::Conflict("op_1 was already retried".into());
        let doc = Problem::from(ServiceError::from(conflict)).doc();
        assert_eq!(doc.detail, "op_1 was already retried");
    }

    /// A cause kept from the caller (a permission the server's own role lacks, answered 503: the
    /// server's fault, whose answer says "the server's log has the cause") is in the server's log.
    #[test]
    fn a_cause_kept_from_the_caller_is_logged() {
        #[derive(Clone, Default)]
        struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let log = Captured::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let denied =
            jobtrail_store::StoreError::Denied("permission denied for table provider_calls".into());
        let response = tracing::subscriber::with_default(subscriber, || {
            Problem::from(ServiceError::from(denied)).into_response()
        });
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        assert!(
            text.contains("permission denied for table provider_calls"),
            "{text}"
        );
    }
}
