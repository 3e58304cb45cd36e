//! The service's one error type. Each kind has one meaning everywhere: the CLI's exit code, the HTTP
//! API's status and RFC 9457 problem type, and the MCP server's tool error all come from [`Kind`].

use jobtrail_store::StoreError;

/// What went wrong, as a caller can act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Bad input: nothing was written. Fix the request.
    BadInput,
    /// No credentials, or credentials that are not (or no longer) valid.
    Unauthenticated,
    /// Valid credentials without the scope (or the ownership) this needs.
    Forbidden,
    /// No such operation (or not one this caller may see).
    NotFound,
    /// Another request under this id, a stale view, or a move the state machine refuses.
    Conflict,
    /// The operation did not succeed, so there is no validated result.
    NotSucceeded,
    /// The operation has not finished (it runs, or is held for a person): no result yet. Wait for
    /// it, then ask again.
    NotFinished,
    /// Evidence disagrees with its chain: what depends on it is refused.
    Tampered,
    /// The database, a provider contract or a configured part is unavailable. Try again later.
    Unavailable,
    /// The request body is larger than the limit.
    TooLarge,
    /// Too many requests from this address or token: slow down (`Retry-After` says how long).
    RateLimited,
    /// The route does not take this HTTP method (`Allow` lists those it does).
    MethodNotAllowed,
    /// The caller holds as many open operations as the server lets one caller hold: nothing was
    /// submitted. Wait for some to finish (no `Retry-After`: that depends on the providers).
    TooManyOpen,
}

impl Kind {
    /// The CLI's exit code (README "Exit codes").
    pub fn exit_code(self) -> u8 {
        match self {
            Kind::NotSucceeded => 1,
            Kind::NotFinished => 9,
            Kind::BadInput | Kind::TooLarge | Kind::MethodNotAllowed => 2,
            Kind::NotFound => 3,
            Kind::Conflict => 4,
            Kind::Unavailable
            | Kind::Unauthenticated
            | Kind::Forbidden
            | Kind::RateLimited
            | Kind::TooManyOpen => 5,
            Kind::Tampered => 8,
        }
    }

    /// The HTTP status.
    pub fn http_status(self) -> u16 {
        match self {
            Kind::BadInput => 400,
            Kind::Unauthenticated => 401,
            Kind::Forbidden => 403,
            Kind::NotFound => 404,
            Kind::MethodNotAllowed => 405,
            Kind::Conflict | Kind::NotSucceeded | Kind::NotFinished => 409,
            Kind::TooLarge => 413,
            Kind::RateLimited | Kind::TooManyOpen => 429,
            Kind::Tampered => 500,
            Kind::Unavailable => 503,
        }
    }

    /// The problem type's name (the last segment of its `type` URI).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::BadInput => "bad-input",
            Kind::Unauthenticated => "unauthenticated",
            Kind::Forbidden => "forbidden",
            Kind::NotFound => "not-found",
            Kind::Conflict => "conflict",
            Kind::NotSucceeded => "not-succeeded",
            Kind::NotFinished => "not-finished",
            Kind::Tampered => "tampered",
            Kind::Unavailable => "unavailable",
            Kind::TooLarge => "too-large",
            Kind::RateLimited => "rate-limited",
            Kind::TooManyOpen => "too-many-open",
            Kind::MethodNotAllowed => "method-not-allowed",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// A short title for the problem document.
    pub fn title(self) -> &'static str {
        match self {
            Kind::BadInput => "Bad input: nothing was written",
            Kind::Unauthenticated => "Missing or invalid bearer token",
            Kind::Forbidden => "Not allowed for this token",
            Kind::NotFound => "No such operation",
            Kind::Conflict => "Conflict: nothing was written",
            Kind::NotSucceeded => "The operation did not succeed: there is no validated result",
            Kind::NotFinished => "The operation has not finished: there is no result yet",
            Kind::Tampered => "Evidence disagrees with its chain",
            Kind::Unavailable => "Temporarily unavailable",
            Kind::TooLarge => "Request body too large",
            Kind::RateLimited => "Too many requests: slow down",
            Kind::TooManyOpen => "Too many open operations: nothing was submitted",
            Kind::MethodNotAllowed => "Method not allowed on this route",
        }
    }
}

pub const ALL: [Kind; 13] = [
    Kind::BadInput,
    Kind::Unauthenticated,
    Kind::Forbidden,
    Kind::NotFound,
    Kind::Conflict,
    Kind::NotSucceeded,
    Kind::NotFinished,
    Kind::Tampered,
    Kind::Unavailable,
    Kind::TooLarge,
    Kind::RateLimited,
    Kind::TooManyOpen,
    Kind::MethodNotAllowed,
];

/// A refused or failed request, with a message for the person or agent who sent it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ServiceError {
    pub kind: Kind,
    pub message: String,
    /// Machine-readable details (both fingerprints of a conflict, the current state of a stale view).
    pub detail: Option<serde_json::Value>,
    /// The message describes our insides (a database error, a role, a path): a network door logs it
    /// and tells the caller only what kind of failure it was.
    pub internal: bool,
    /// The door that made it logs it itself, at most once a minute (a webhook receiver whose
    /// secret is unusable refuses every delivery; one line per delivery would flood the log).
    pub logged_by_door: bool,
    /// What the caller must know whatever the cause, said after the message (or after the
    /// generic words that stand for an internal one): the id a submit may have landed under.
    pub note: Option<String>,
}

impl ServiceError {
    /// What a network door (HTTP, MCP) tells the caller: the message, unless it describes our
    /// insides; then only that the request failed (the door logs the message).
    pub fn shown(&self) -> String {
        let said = if self.internal {
            "the service could not complete this request; try again later (the server's log has the cause)"
        } else {
            &self.message
        };
        match &self.note {
            Some(note) => format!("{said} {note}"),
            None => said.to_owned(),
        }
    }

    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            detail: None,
            internal: false,
            logged_by_door: false,
            note: None,
        }
    }
    pub fn with_detail(mut self, detail: serde_json::Value) -> Self {
        self.detail = Some(detail);
        self
    }
    pub fn bad_input(message: impl Into<String>) -> Self {
        Self::new(Kind::BadInput, message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(Kind::Forbidden, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(Kind::Conflict, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Kind::Unavailable, message)
    }
    /// Too many requests: come back in `secs` seconds (carried as `retry_after_secs`).
    pub fn rate_limited(message: impl Into<String>, secs: u64) -> Self {
        Self::new(Kind::RateLimited, message)
            .with_detail(serde_json::json!({ "retry_after_secs": secs }))
    }
    /// When a rate-limited caller may come back (at least a second).
    pub fn retry_after_secs(&self) -> u64 {
        self.detail
            .as_ref()
            .and_then(|d| d["retry_after_secs"].as_u64())
            .unwrap_or(1)
            .max(1)
    }
}

/// How long a caller is asked to wait when the database is away (`Retry-After`).
pub const DATABASE_AWAY_RETRY_SECS: u64 = 2;

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        let kind = match &e {
            StoreError::NotFound(_) => Kind::NotFound,
            StoreError::Submit(jobtrail_core::SubmitError::FingerprintConflict {
                operation_id,
                stored,
                submitted,
            }) => {
                return ServiceError::conflict(e.to_string()).with_detail(serde_json::json!({
                    "operation_id": operation_id.to_string(),
                    "stored_fingerprint": stored.as_str(),
                    "submitted_fingerprint": submitted.as_str(),
                }));
            }
            StoreError::Submit(jobtrail_core::SubmitError::TermsConflict {
                operation_id,
                field,
                ..
            }) => {
                return ServiceError::conflict(e.to_string()).with_detail(serde_json::json!({
                    "operation_id": operation_id.to_string(),
                    "field": field,
                }));
            }
            StoreError::Submit(jobtrail_core::SubmitError::BodyTooLarge { .. }) => Kind::TooLarge,
            StoreError::Submit(jobtrail_core::SubmitError::TooManyOpen { open, limit, .. }) => {
                return ServiceError::new(Kind::TooManyOpen, e.to_string())
                    .with_detail(serde_json::json!({ "open": open, "limit": limit }));
            }
            StoreError::Submit(_) => Kind::BadInput,
            StoreError::Stale {
                current,
                seq,
                seen,
                head,
                ..
            } => {
                // The view to decide on, as `show` prints it (pinned to this operation's head).
                return ServiceError::conflict(e.to_string()).with_detail(serde_json::json!({
                    "seen": seen,
                    "current": crate::operator::seen_token(*current, *seq, head),
                }));
            }
            StoreError::Illegal { .. }
            | StoreError::LeaseLost { .. }
            | StoreError::Moved { .. }
            | StoreError::Conflict(_) => Kind::Conflict,
            StoreError::Tampered(_) | StoreError::AnchorNotFound(_) => Kind::Tampered,
            // The server's own database role may not do this: a misconfiguration, the server's
            // fault and not the caller's (a 403 would tell a client its token may not, and never
            // to come back), whose words (the database's, naming its tables) are for the
            // operator's log. A local door (the CLI, jobtrail-admin) prints them: its operator
            // holds the role.
            StoreError::Denied(_)
            | StoreError::Corrupt(_)
            | StoreError::Unavailable(_)
            | StoreError::Unreachable(_)
            | StoreError::CommitUnknown(_)
            | StoreError::BadUrl(_)
            | StoreError::Database(_)
            | StoreError::Migrate(_)
            | StoreError::Schema(_) => {
                let mut err = ServiceError::new(Kind::Unavailable, e.to_string());
                err.internal = true;
                // The database away (or its pool exhausted): when to come back, as a refusal for
                // load says it (`Retry-After`), so a client backs off rather than hammering.
                if e.is_transient() {
                    err.detail =
                        Some(serde_json::json!({ "retry_after_secs": DATABASE_AWAY_RETRY_SECS }));
                }
                return err;
            }
        };
        ServiceError::new(kind, e.to_string())
    }
}

impl From<jobtrail_core::SubmitError> for ServiceError {
    fn from(e: jobtrail_core::SubmitError) -> Self {
        StoreError::Submit(e).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The database's own words about the server's role (its tables, its roles) stay in the
    /// operator's log: a network door says only that the request failed.
    #[test]
    fn a_role_the_server_lacks_is_not_described_to_the_caller() {
        let e = ServiceError::from(StoreError::Denied(
            "permission denied for table provider_calls".into(),
        ));
        assert_eq!(
            e.kind,
            Kind::Unavailable,
            "the server's fault, not the caller's"
        );
        assert_eq!(
            e.detail, None,
            "no Retry-After: coming back will not mend it"
        );
        assert!(e.message.contains("provider_calls"), "the log keeps it");
        assert!(!e.shown().contains("provider_calls"), "{}", e.shown());
    }

    /// The database away is a refusal to come back from, and says when; a fault that waiting will
    /// not mend says nothing of the kind.
    #[test]
    fn the_database_away_says_when_to_come_back() {
        for away in [
            StoreError::Unavailable("connection refused".into()),
            StoreError::Unreachable("no connection to 127.0.0.1:5432".into()),
        ] {
            let e = ServiceError::from(away);
            assert_eq!(e.kind, Kind::Unavailable);
            assert_eq!(e.retry_after_secs(), DATABASE_AWAY_RETRY_SECS);
        }
        let e = ServiceError::from(StoreError::Schema("older schema".into()));
        assert_eq!(e.detail, None);
    }
}
