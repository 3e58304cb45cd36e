//! The intent: what must be written durably before anything reaches a provider.
//!
//! [`Submission::validate`] turns untrusted input (raw body bytes, deadlines, names) into an [`Intent`]
//! or a [`SubmitError`] that says exactly what is wrong. It is pure: the clock reading and the random
//! bytes for the operation id, the token and the trace id are arguments.

use crate::ids::{IdempotencyToken, OperationId, SpanId, TraceId, TraceParent};
use crate::request::{
    Fingerprint, Holder, SecretGrant, SensitiveFieldError, check_sensitive_fields,
};
use crate::text;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Where a provider takes the idempotency token. With `None` at-most-once creation cannot be
/// guaranteed, and every record of that provider says so. `Natural`: no token, but the create is
/// a PUT to a URL the operation chooses, so sending it again names the same resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdempotencyMode {
    Header,
    BodyField,
    None,
    Natural,
}

impl IdempotencyMode {
    pub const fn as_str(self) -> &'static str {
        match self {
            IdempotencyMode::Header => "header",
            IdempotencyMode::BodyField => "body_field",
            IdempotencyMode::None => "none",
            IdempotencyMode::Natural => "natural",
        }
    }
    pub const fn guarantees_at_most_once(self) -> bool {
        !matches!(self, IdempotencyMode::None)
    }
}

impl std::str::FromStr for IdempotencyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "header" => Ok(Self::Header),
            "body_field" => Ok(Self::BodyField),
            "none" => Ok(Self::None),
            "natural" => Ok(Self::Natural),
            o => Err(format!("unknown idempotency mode {o:?}")),
        }
    }
}

/// Which JSON values a provider takes as a create body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyShape {
    /// A JSON object (the default: almost every API).
    #[default]
    Object,
    /// Any JSON value, `null` included.
    Any,
}

/// The farthest ahead a deadline may be: ten years. Further is a typo, and the clock arithmetic of
/// every layer stays far from overflow.
pub const MAX_HORIZON: Duration = Duration::from_secs(3660 * 86_400);

/// The longest cancel window: thirty days.
pub const MAX_CANCEL_WINDOW: Duration = Duration::from_secs(30 * 86_400);

/// What submit needs to know about a provider (from its contract).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderTerms {
    pub name: String,
    pub idempotency: IdempotencyMode,
    #[serde(default)]
    pub body: BodyShape,
    pub sensitive_fields: Vec<String>,
    /// The largest request body the provider takes (operator configuration, never the caller's).
    #[serde(default = "default_body_bytes")]
    pub max_body_bytes: usize,
    /// Secrets callers may name at the sensitive fields, by grant name.
    #[serde(default)]
    pub secret_grants: std::collections::BTreeMap<String, SecretGrant>,
    pub default_create_window: Duration,
    pub default_result_window: Duration,
    pub default_cancel_window: Duration,
    /// Where the request names its result format, and the names the contract knows (a request
    /// naming another is refused at submit).
    #[serde(default)]
    pub result_formats: Option<ResultFormats>,
    /// Where the create writes values of its own into the request body (the idempotency key's
    /// field, the client reference's), as JSON pointers: a body that cannot take one (not an
    /// object, or a value on the way that is not) could never be sent, and is refused at submit.
    #[serde(default)]
    pub written_fields: Vec<String>,
}

/// The result formats a request may choose between (`result.format_from` in the contract).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultFormats {
    /// JSON pointer into the request body.
    pub pointer: String,
    pub names: Vec<String>,
}

impl ProviderTerms {
    /// Terms with sane defaults: 2 min to create, 1 h for the result, 5 min to confirm a cancel.
    pub fn new(name: &str, idempotency: IdempotencyMode) -> Self {
        Self {
            name: name.to_owned(),
            idempotency,
            body: BodyShape::Object,
            sensitive_fields: Vec::new(),
            max_body_bytes: DEFAULT_BODY_BYTES,
            secret_grants: std::collections::BTreeMap::new(),
            default_create_window: Duration::from_secs(120),
            default_result_window: Duration::from_secs(3600),
            default_cancel_window: Duration::from_secs(300),
            result_formats: None,
            written_fields: Vec::new(),
        }
    }
}

fn default_body_bytes() -> usize {
    DEFAULT_BODY_BYTES
}

/// Where a value cannot be written at `pointer` in `body`: the pointer to the first value on the
/// way (the body itself: `""`) that is not an object, and what it is. Parts not there yet are
/// made as the value is written; the last part's value is replaced.
fn blocked_write(body: &serde_json::Value, pointer: &str) -> Option<(String, &'static str)> {
    let parts: Vec<&str> = pointer.strip_prefix('/')?.split('/').collect();
    let mut cur = body;
    let mut at = String::new();
    for (i, raw) in parts.iter().enumerate() {
        let Some(obj) = cur.as_object() else {
            return Some((at, crate::json::kind_of(cur)));
        };
        if i + 1 == parts.len() {
            return None;
        }
        cur = obj.get(&raw.replace("~1", "/").replace("~0", "~"))?;
        at.push('/');
        at.push_str(raw);
    }
    None
}

/// Untrusted input to submit.
#[derive(Debug, Clone, Default)]
pub struct Submission {
    pub operation_id: Option<OperationId>,
    pub provider: String,
    pub target: String,
    /// The request body exactly as received.
    pub body: Vec<u8>,
    pub caller: String,
    pub approved_by: String,
    pub approval_ref: Option<String>,
    pub create_deadline: Option<DateTime<Utc>>,
    pub result_deadline: Option<DateTime<Utc>>,
    pub cancel_window: Option<Duration>,
    pub supersedes: Option<OperationId>,
    /// The caller's trace context (W3C `traceparent`), so the operation's trace joins the agent's
    /// under the agent's span; a new trace otherwise.
    pub trace: Option<TraceParent>,
    /// The body is the request the superseded operation was stored with, sent again unedited (a
    /// person's retry): what an earlier build stored is not refused for rules added since (an
    /// integer beyond 2^53). Never set from a caller's input.
    pub resends_stored_request: bool,
    /// The person retrying `caller`'s operation (a decision, never a caller's input): the retry
    /// stays the caller's (theirs to read, wait on and cancel), and its submission link names
    /// the person. A request the person edited names only secrets granted to both.
    pub retried_by: Option<String>,
    /// With `resends_stored_request`: the person whose edit the stored request carries (the
    /// superseded operation's `edited_by`). Sent again unedited it is still theirs too.
    pub edited_by: Option<String>,
}

/// Caller-drawn randomness for a new intent.
#[derive(Debug, Clone, Copy)]
pub struct Entropy {
    /// A UUIDv7 for the operation id (used only when the caller did not name one).
    pub operation_uuid: uuid::Uuid,
    pub token: [u8; 16],
    pub trace: [u8; 16],
}

/// Submit limits of the server (the operator's): a ceiling over every provider's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubmitLimits {
    pub max_body_bytes: usize,
    /// Operations one caller may hold open (not yet terminal: running, or waiting for a person)
    /// at once; a submit that would open one more is refused ([`SubmitError::TooManyOpen`]).
    /// `None`: no cap (the library's default; `jobtrail serve` sets one).
    pub max_open_per_caller: Option<u32>,
}

/// The largest request body any contract may allow.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// A provider's request body limit unless its contract says otherwise.
pub const DEFAULT_BODY_BYTES: usize = 1024 * 1024;

impl Default for SubmitLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: MAX_BODY_BYTES,
            max_open_per_caller: None,
        }
    }
}

/// A validated intent, ready to be written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Intent {
    pub operation_id: OperationId,
    pub provider: String,
    pub target: String,
    pub body: serde_json::Value,
    pub fingerprint: Fingerprint,
    pub token: IdempotencyToken,
    pub idempotency: IdempotencyMode,
    pub trace_id: TraceId,
    /// The caller's span the operation's root span is recorded under (trace metadata, not
    /// evidence: no decision reads it, and it is outside the record's hashes).
    #[serde(default)]
    pub parent_span: Option<SpanId>,
    /// Whether the caller's trace was sampled: trace metadata, outside the record's hashes, read
    /// only by the worker's trace sampler.
    #[serde(default)]
    pub parent_sampled: Option<bool>,
    pub caller: String,
    pub approved_by: String,
    pub approval_ref: Option<String>,
    pub created_at: DateTime<Utc>,
    pub create_deadline: DateTime<Utc>,
    pub result_deadline: DateTime<Utc>,
    pub cancel_window: Duration,
    pub supersedes: Option<OperationId>,
    /// The person who retried the operation this one supersedes on the caller's behalf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried_by: Option<String>,
    /// That person, where they edited the request: it names only secrets granted to both, checked
    /// again at every send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_by: Option<String>,
}

/// Why a submission was refused. Nothing was written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("request body is not valid JSON: {message} (line {line}, column {column})")]
    MalformedJson {
        message: String,
        line: usize,
        column: usize,
    },
    #[error(
        "request body holds the integer {number} at {pointer:?}, beyond 2^53: a request's fingerprint writes numbers as doubles (RFC 8785) and could not tell it from its neighbours; send it as a string"
    )]
    IntegerBeyondDouble { pointer: String, number: String },
    #[error(
        "request body holds the key {key:?}, which jobtrail reads in place of a stored request it could not read: a retry of such an operation must name its request"
    )]
    ReservedKey { key: &'static str },
    #[error("request body is {found}; provider {provider} takes a JSON object")]
    BodyNotObject {
        provider: String,
        found: &'static str,
    },
    #[error(
        "provider {provider} writes a value of its own at {pointer} in the request body, but {at} is {found}, not an object: send an object there (or leave it out)"
    )]
    FieldNotWritable {
        provider: String,
        pointer: String,
        /// The body (`the body`) or the pointer to the value in the way.
        at: String,
        found: &'static str,
    },
    #[error("{field} is {at}, more than ten years ahead (latest allowed {max})")]
    DeadlineTooFar {
        field: &'static str,
        at: DateTime<Utc>,
        max: DateTime<Utc>,
    },
    #[error(
        "id {id} names the time {at}, more than an hour ahead of now ({now}): an operation id is op_ followed by a ULID (or UUIDv7) made now; one from the future would list above every operation made after it"
    )]
    IdAhead {
        id: OperationId,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    },
    #[error("cancel window of {secs} s is longer than the thirty days allowed")]
    CancelWindowTooLong { secs: u64 },
    #[error("request body is {size} bytes, over the limit of {limit} bytes")]
    BodyTooLarge { size: usize, limit: usize },
    #[error("unknown provider {name:?}; known providers: {known}")]
    UnknownProvider { name: String, known: String },
    #[error(transparent)]
    Text(#[from] text::TextError),
    #[error("{field} is {at}, which is not in the future (now {now})")]
    DeadlineInPast {
        field: &'static str,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    },
    #[error(
        "deadlines out of order: result_deadline {result} must not be before create_deadline {create}"
    )]
    DeadlinesOutOfOrder {
        create: DateTime<Utc>,
        result: DateTime<Utc>,
    },
    #[error("cancel window must be at least one second")]
    CancelWindowTooShort,
    #[error(transparent)]
    Sensitive(#[from] SensitiveFieldError),
    #[error(
        "operation {operation_id} already exists with fingerprint {stored}; this request has fingerprint {submitted}. A changed request is a new operation: submit it without --id (or with a new one)"
    )]
    FingerprintConflict {
        operation_id: OperationId,
        stored: Fingerprint,
        submitted: Fingerprint,
    },
    #[error(
        "operation {operation_id} already exists with {field} {stored}; this request has {field} {submitted}. The same id answers only the same submission: submit a changed one without an id (or with a new one)"
    )]
    TermsConflict {
        operation_id: OperationId,
        field: &'static str,
        stored: String,
        submitted: String,
    },
    #[error(
        "caller {caller} may hold {limit} open operations at once (the server's --open-per-caller) and this submit would make it {open}: nothing was submitted; wait for some to finish (or cancel some), then submit again"
    )]
    TooManyOpen {
        caller: String,
        open: i64,
        limit: u32,
    },
    #[error("operation {0} named by supersedes does not exist")]
    SupersededMissing(OperationId),
    #[error(
        "retried_by, edited_by and resending a stored request belong to a person's retry, which supersedes an operation; this submission supersedes none"
    )]
    RetryWithoutOriginal,
    #[error("not a usable job id: {0}")]
    UnusableJobId(String),
    #[error("{pointer} is {found}; provider {provider} delivers its result as one of: {known}")]
    UnknownResultFormat {
        provider: String,
        pointer: String,
        found: String,
        known: String,
    },
}

impl Intent {
    /// Why this intent is not the stored operation under its id submitted again: another request
    /// (its fingerprint), or other terms a person or agent relies on being recorded (who approved
    /// it, the approval's reference, the operation it retries). Deadlines and the cancel window
    /// are not compared: a relative time resolves anew on every send.
    pub fn conflict_with(&self, stored: &crate::OperationRecord) -> Option<SubmitError> {
        if stored.fingerprint != self.fingerprint {
            return Some(SubmitError::FingerprintConflict {
                operation_id: self.operation_id,
                stored: stored.fingerprint.clone(),
                submitted: self.fingerprint.clone(),
            });
        }
        let shown = |v: Option<&str>| v.map_or("(none)".to_owned(), |v| format!("{v:?}"));
        let supersedes = |v: Option<OperationId>| v.map(|v| v.to_string());
        [
            (
                "approved_by",
                Some(stored.approved_by.as_str()),
                Some(self.approved_by.as_str()),
            ),
            (
                "approval_ref",
                stored.approval_ref.as_deref(),
                self.approval_ref.as_deref(),
            ),
            (
                "supersedes",
                supersedes(stored.supersedes).as_deref(),
                supersedes(self.supersedes).as_deref(),
            ),
        ]
        .into_iter()
        .find(|(_, a, b)| a != b)
        .map(|(field, a, b)| SubmitError::TermsConflict {
            operation_id: self.operation_id,
            field,
            stored: shown(a),
            submitted: shown(b),
        })
    }
}

/// How far ahead of the database's clock a caller's own operation id may name its time (clock skew;
/// lists are newest first by id, so an id from further ahead would stay on top of every list).
pub const MAX_ID_AHEAD: Duration = Duration::from_secs(3600);

impl Submission {
    /// Validate against the provider's terms at time `now`.
    pub fn validate(
        &self,
        terms: &ProviderTerms,
        limits: SubmitLimits,
        now: DateTime<Utc>,
        entropy: Entropy,
    ) -> Result<Intent, SubmitError> {
        // What a person's retry may skip (the integer check of a request already stored) and
        // record (who retried it) stands only beside the operation it retries.
        if self.supersedes.is_none()
            && (self.retried_by.is_some()
                || self.resends_stored_request
                || self.edited_by.is_some())
        {
            return Err(SubmitError::RetryWithoutOriginal);
        }
        let limit = limits.max_body_bytes.min(terms.max_body_bytes);
        if self.body.len() > limit {
            return Err(SubmitError::BodyTooLarge {
                size: self.body.len(),
                limit,
            });
        }
        let body =
            crate::json::parse_strict(&self.body).map_err(|e| SubmitError::MalformedJson {
                message: e.message,
                line: e.line,
                column: e.column,
            })?;
        // A person's unedited retry sends again what its operation was stored with (earlier
        // builds kept such integers), under a new token.
        if !self.resends_stored_request
            && let Some((pointer, number)) = crate::json::first_integer_beyond_double(&body)
        {
            return Err(SubmitError::IntegerBeyondDouble { pointer, number });
        }
        // What a stored request that could not be read is read as: never sent to a provider.
        if body.get(crate::json::UNREADABLE_JSON).is_some() {
            return Err(SubmitError::ReservedKey {
                key: crate::json::UNREADABLE_JSON,
            });
        }
        if terms.body == BodyShape::Object && !body.is_object() {
            return Err(SubmitError::BodyNotObject {
                provider: terms.name.clone(),
                found: crate::json::kind_of(&body),
            });
        }
        if let Some((pointer, at, found)) = terms
            .written_fields
            .iter()
            .find_map(|p| blocked_write(&body, p).map(|(at, found)| (p, at, found)))
        {
            return Err(SubmitError::FieldNotWritable {
                provider: terms.name.clone(),
                pointer: pointer.clone(),
                at: if at.is_empty() {
                    "the body".to_owned()
                } else {
                    at
                },
                found,
            });
        }
        let target = text::TARGET.check(&self.target)?;
        let caller = text::CALLER.check(&self.caller)?;
        let approved_by = text::APPROVED_BY.check(&self.approved_by)?;
        let approval_ref = text::APPROVAL_REF.check_optional(self.approval_ref.as_deref())?;
        check_sensitive_fields(
            &body,
            &terms.sensitive_fields,
            &terms.secret_grants,
            Holder::Caller(&caller),
        )?;
        let retried_by = self
            .retried_by
            .as_deref()
            .map(|p| text::CALLER.check(p))
            .transpose()?;
        // The caller's own request, sent again, is the caller's to name secrets in; one a person
        // edited is also the person's, who may not reach a secret through an agent's grant (and
        // stays theirs when it is sent again unedited, by whoever retries it).
        let edited_by = if self.resends_stored_request {
            self.edited_by
                .as_deref()
                .map(|p| text::CALLER.check(p))
                .transpose()?
        } else {
            retried_by.clone()
        };
        if let Some(person) = edited_by.as_deref() {
            check_sensitive_fields(
                &body,
                &terms.sensitive_fields,
                &terms.secret_grants,
                Holder::Retrier(person),
            )?;
        }
        if let Some(f) = &terms.result_formats
            && let Some(v) = body.pointer(&f.pointer)
            && !v
                .as_str()
                .is_some_and(|name| f.names.iter().any(|n| n == name))
        {
            return Err(SubmitError::UnknownResultFormat {
                provider: terms.name.clone(),
                pointer: f.pointer.clone(),
                found: match v.as_str() {
                    Some(s) => format!("{:?}", s.chars().take(80).collect::<String>()),
                    None => crate::json::kind_of(v).to_owned(),
                },
                known: f.names.join(", "),
            });
        }

        let now = crate::chain::storable(now);
        // Saturating: a window too long to add is caught as "too far" below, never a panic.
        let after = |d: Duration| {
            chrono::Duration::from_std(d)
                .ok()
                .and_then(|d| now.checked_add_signed(d))
                .unwrap_or(DateTime::<Utc>::MAX_UTC)
        };
        let create_deadline = crate::chain::storable(
            self.create_deadline
                .unwrap_or_else(|| after(terms.default_create_window)),
        );
        if create_deadline <= now {
            return Err(SubmitError::DeadlineInPast {
                field: "create_deadline",
                at: create_deadline,
                now,
            });
        }
        let result_deadline = crate::chain::storable(
            self.result_deadline
                .unwrap_or_else(|| after(terms.default_result_window).max(create_deadline)),
        );
        if result_deadline <= now {
            return Err(SubmitError::DeadlineInPast {
                field: "result_deadline",
                at: result_deadline,
                now,
            });
        }
        let latest = now + chrono::Duration::from_std(MAX_HORIZON).expect("ten years fit");
        for (field, at) in [
            ("create_deadline", create_deadline),
            ("result_deadline", result_deadline),
        ] {
            if at > latest {
                return Err(SubmitError::DeadlineTooFar {
                    field,
                    at,
                    max: latest,
                });
            }
        }
        if result_deadline < create_deadline {
            return Err(SubmitError::DeadlinesOutOfOrder {
                create: create_deadline,
                result: result_deadline,
            });
        }
        let cancel_window = self.cancel_window.unwrap_or(terms.default_cancel_window);
        if let Some(id) = self.operation_id {
            let at = id.time();
            if at > now + chrono::Duration::from_std(MAX_ID_AHEAD).expect("an hour fits") {
                return Err(SubmitError::IdAhead { id, at, now });
            }
        }
        if cancel_window < Duration::from_secs(1) {
            return Err(SubmitError::CancelWindowTooShort);
        }
        if cancel_window > MAX_CANCEL_WINDOW {
            return Err(SubmitError::CancelWindowTooLong {
                secs: cancel_window.as_secs(),
            });
        }

        Ok(Intent {
            operation_id: self
                .operation_id
                .unwrap_or(OperationId::from_uuid(entropy.operation_uuid)),
            fingerprint: Fingerprint::of(&terms.name, &target, &body),
            provider: terms.name.clone(),
            target,
            body,
            token: IdempotencyToken::from_random(entropy.token),
            idempotency: terms.idempotency,
            trace_id: self
                .trace
                .map_or(TraceId::from_random(entropy.trace), |t| t.trace),
            parent_span: self.trace.map(|t| t.span),
            parent_sampled: self.trace.map(|t| t.sampled),
            caller,
            approved_by,
            approval_ref,
            created_at: now,
            create_deadline,
            result_deadline,
            cancel_window,
            supersedes: self.supersedes,
            edited_by,
            retried_by,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entropy() -> Entropy {
        Entropy {
            operation_uuid: uuid::Uuid::from_u128(1),
            token: [1; 16],
            trace: [2; 16],
        }
    }
    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_750_000_000, 0).unwrap()
    }
    fn sub(body: &str) -> Submission {
        Submission {
            provider: "sim".into(),
            target: "reports".into(),
            body: body.as_bytes().to_vec(),
            caller: "agent-7".into(),
            approved_by: "alice".into(),
            ..Default::default()
        }
    }
    fn terms() -> ProviderTerms {
        ProviderTerms::new("sim", IdempotencyMode::Header)
    }

    #[test]
    fn an_integer_a_double_cannot_hold_is_refused_but_a_retry_sends_what_was_stored() {
        let body = r#"{"account":{"id":9007199254740993}}"#;
        let err = sub(body)
            .validate(&terms(), SubmitLimits::default(), now(), entropy())
            .unwrap_err();
        assert!(
            matches!(&err, SubmitError::IntegerBeyondDouble { pointer, .. } if pointer == "/account/id"),
            "{err}"
        );
        // Naming an operation to supersede is not enough (an agent may): only a person's
        // unedited retry sends what was stored.
        let agents = Submission {
            supersedes: Some(OperationId::from_uuid(uuid::Uuid::from_u128(7))),
            ..sub(body)
        };
        assert!(
            agents
                .validate(&terms(), SubmitLimits::default(), now(), entropy())
                .is_err()
        );
        let retry = Submission {
            resends_stored_request: true,
            ..agents
        };
        assert!(
            retry
                .validate(&terms(), SubmitLimits::default(), now(), entropy())
                .is_ok()
        );
        // The marker an unreadable stored request is read as is never sent on.
        let marker = format!(
            r#"{{"{}": "number out of range"}}"#,
            crate::json::UNREADABLE_JSON
        );
        let err = Submission {
            resends_stored_request: true,
            supersedes: retry.supersedes,
            ..sub(&marker)
        }
        .validate(&terms(), SubmitLimits::default(), now(), entropy())
        .unwrap_err();
        assert!(matches!(err, SubmitError::ReservedKey { .. }), "{err}");
        // A retry's terms without the operation it retries are no retry: refused, the stored
        // integer not let through and no person recorded as having retried anything.
        for orphan in [
            Submission {
                resends_stored_request: true,
                ..sub(body)
            },
            Submission {
                retried_by: Some("alice".into()),
                ..sub(r#"{"n":1}"#)
            },
            Submission {
                edited_by: Some("alice".into()),
                ..sub(r#"{"n":1}"#)
            },
        ] {
            let err = orphan
                .validate(&terms(), SubmitLimits::default(), now(), entropy())
                .unwrap_err();
            assert!(matches!(err, SubmitError::RetryWithoutOriginal), "{err}");
        }
    }

    /// A request a person edited stays theirs when it is resent unedited by someone else: the
    /// editor's grant is still asked for, and the intent still names them.
    #[test]
    fn a_resent_edited_request_is_still_checked_against_its_editors_grant() {
        let mut t = terms();
        t.sensitive_fields = vec!["/card".into()];
        t.secret_grants.insert(
            "card".into(),
            SecretGrant {
                callers: Some(vec!["agent-7".into(), "bob".into()]),
            },
        );
        let resend = |editor: &str| Submission {
            supersedes: Some(OperationId::from_uuid(uuid::Uuid::from_u128(7))),
            resends_stored_request: true,
            retried_by: Some("alice".into()),
            edited_by: Some(editor.into()),
            ..sub(r#"{"card":{"$secret":"card"}}"#)
        };
        let intent = resend("bob")
            .validate(&t, SubmitLimits::default(), now(), entropy())
            .unwrap();
        assert_eq!(intent.edited_by.as_deref(), Some("bob"));
        assert_eq!(intent.retried_by.as_deref(), Some("alice"));
        let err = resend("carol")
            .validate(&t, SubmitLimits::default(), now(), entropy())
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("\"carol\", who edited the request"),
            "{err}"
        );
    }

    #[test]
    fn a_result_format_the_contract_does_not_name_is_refused() {
        let mut t = terms();
        t.result_formats = Some(ResultFormats {
            pointer: "/out/format".into(),
            names: vec!["csv".into(), "json".into()],
        });
        let v = |body: &str| sub(body).validate(&t, SubmitLimits::default(), now(), entropy());
        assert!(v(r#"{"out":{"format":"csv"}}"#).is_ok());
        assert!(v(r#"{"out":{}}"#).is_ok(), "naming none takes the default");
        for bad in [
            r#"{"out":{"format":"xml"}}"#,
            r#"{"out":{"format":"CSV"}}"#,
            r#"{"out":{"format":5}}"#,
            r#"{"out":{"format":null}}"#,
            r#"{"out":{"format":["csv"]}}"#,
        ] {
            let err = v(bad).unwrap_err();
            assert!(
                matches!(err, SubmitError::UnknownResultFormat { .. }),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains("one of: csv, json"), "{err}");
        }
    }

    /// A caller's own id may name a time up to an hour ahead (clock skew), not more: lists are
    /// newest first by id, and `op_7ZZZ…` would stay above every operation made after it. An id
    /// from the past only lists itself lower.
    #[test]
    fn a_callers_id_from_the_future_is_refused() {
        let at = |t: DateTime<Utc>| {
            let ms = t.timestamp_millis() as u128;
            OperationId::from_uuid(uuid::Uuid::from_u128(
                (ms << 80) | 0x7000_8000_0000_0000_0001,
            ))
        };
        let v = |id: OperationId| {
            let mut s = sub("{}");
            s.operation_id = Some(id);
            s.validate(&terms(), SubmitLimits::default(), now(), entropy())
        };
        assert_eq!(at(now()).time(), now());
        assert!(v(at(now())).is_ok());
        assert!(v(at(now() + chrono::Duration::minutes(59))).is_ok());
        assert!(v(at(now() - chrono::Duration::days(400))).is_ok());
        assert!(v("op_00000000000000000000000000".parse().unwrap()).is_ok());
        for ahead in [
            at(now() + chrono::Duration::minutes(61)),
            "op_7ZZZZZZZZZZZZZZZZZZZZZZZZZ".parse().unwrap(),
        ] {
            let err = v(ahead).unwrap_err();
            assert!(matches!(err, SubmitError::IdAhead { .. }), "{err}");
            assert!(err.to_string().contains("ahead"), "{err}");
        }
    }

    #[test]
    fn a_good_submission_gets_defaults() {
        let i = sub(r#"{"a":1}"#)
            .validate(&terms(), SubmitLimits::default(), now(), entropy())
            .unwrap();
        assert_eq!(i.create_deadline, now() + chrono::Duration::seconds(120));
        assert_eq!(i.result_deadline, now() + chrono::Duration::seconds(3600));
        assert!(i.token.as_str().starts_with("idem_"));
    }

    #[test]
    fn bad_input_is_refused_with_what_is_wrong() {
        let v = |s: Submission| {
            s.validate(
                &terms(),
                SubmitLimits {
                    max_body_bytes: 16,
                    ..SubmitLimits::default()
                },
                now(),
                entropy(),
            )
        };
        assert!(matches!(
            v(sub("{not json")),
            Err(SubmitError::MalformedJson { .. })
        ));
        assert!(matches!(
            v(sub(r#"{"a":"0123456789abcdef"}"#)),
            Err(SubmitError::BodyTooLarge {
                size: 24,
                limit: 16
            })
        ));
        let mut s = sub("{}");
        s.create_deadline = Some(now() - chrono::Duration::seconds(1));
        assert!(matches!(
            v(s),
            Err(SubmitError::DeadlineInPast {
                field: "create_deadline",
                ..
            })
        ));
        let mut s = sub("{}");
        s.create_deadline = Some(now() + chrono::Duration::seconds(60));
        s.result_deadline = Some(now() + chrono::Duration::seconds(30));
        assert!(matches!(v(s), Err(SubmitError::DeadlinesOutOfOrder { .. })));
        let mut s = sub("{}");
        s.caller = " ".into();
        assert!(matches!(
            v(s),
            Err(SubmitError::Text(text::TextError::Missing {
                field: "caller"
            }))
        ));
    }

    #[test]
    fn careless_bodies_and_windows_are_refused_before_anything_is_written() {
        let v = |s: Submission, t: &ProviderTerms| {
            s.validate(t, SubmitLimits::default(), now(), entropy())
        };
        for body in ["null", "42", "[1, 2]", "\"text\"", "true"] {
            let err = v(sub(body), &terms()).unwrap_err();
            assert!(
                matches!(err, SubmitError::BodyNotObject { .. }),
                "{body}: {err}"
            );
        }
        let mut any = terms();
        any.body = BodyShape::Any;
        assert!(v(sub("null"), &any).is_ok());
        // Where the create writes a value of its own (a client reference, an idempotency key),
        // the body must take it: refused at submit, not left to fail every create attempt.
        let mut writes = any.clone();
        writes.written_fields = vec!["/meta/ref".into(), "/a~1b/key".into()];
        for (body, at, found) in [
            ("[1, 2]", "the body", "an array"),
            ("null", "the body", "null"),
            (r#"{"meta": 5}"#, "/meta", "a number"),
            (r#"{"meta": {}, "a/b": "s"}"#, "/a~1b", "a string"),
        ] {
            match v(sub(body), &writes) {
                Err(SubmitError::FieldNotWritable {
                    at: a, found: f, ..
                }) => assert_eq!((a.as_str(), f), (at, found), "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        for body in [
            "{}",
            r#"{"meta": {"x": 1}}"#,
            r#"{"meta": {"ref": 3}, "a/b": {}}"#,
        ] {
            assert!(v(sub(body), &writes).is_ok(), "{body}");
        }
        for body in [
            r#"{"a": 1, "a": 2}"#,
            r#"{"n": 18446744073709551616}"#,
            r#"{"s": "\u0000"}"#,
        ] {
            assert!(
                matches!(
                    v(sub(body), &terms()),
                    Err(SubmitError::MalformedJson { .. })
                ),
                "{body}"
            );
        }
        let mut s = sub("{}");
        s.cancel_window = Some(Duration::from_secs(u64::MAX));
        assert!(matches!(
            v(s, &terms()),
            Err(SubmitError::CancelWindowTooLong { .. })
        ));
        let mut s = sub("{}");
        s.result_deadline = Some(now() + chrono::Duration::days(365 * 50));
        assert!(matches!(
            v(s, &terms()),
            Err(SubmitError::DeadlineTooFar {
                field: "result_deadline",
                ..
            })
        ));
        // A provider whose default window is absurd cannot overflow the clock either.
        let mut huge = terms();
        huge.default_result_window = Duration::MAX;
        assert!(matches!(
            v(sub("{}"), &huge),
            Err(SubmitError::DeadlineTooFar { .. })
        ));
    }
}
