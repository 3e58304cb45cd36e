//! Closed outcomes: every provider response or error becomes exactly one of these values before it
//! touches the store, and [`crate::decide`] maps each value to exactly one step.

use crate::record::CallRecord;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The provider's state names, mapped to the five phases we act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

/// How to settle an ambiguous create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReconcileMethod {
    /// Send create again with the same token; the provider returns the original job.
    Resend,
    /// Look the job up by our client reference.
    Lookup,
    /// The provider offers nothing: a person decides.
    None,
}

impl ReconcileMethod {
    pub const fn as_str(self) -> &'static str {
        match self {
            ReconcileMethod::Resend => "resend",
            ReconcileMethod::Lookup => "lookup",
            ReconcileMethod::None => "none",
        }
    }
}

/// A call's outcome, the call record to log, and the provider context to keep (cookies, result
/// hints) if the call changed it.
#[derive(Debug, Clone)]
pub struct Called<T> {
    pub outcome: T,
    pub call: CallRecord,
    pub context: Option<serde_json::Value>,
}

/// The result of `create`.
#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    /// The provider definitively accepted and named the job. `duplicate`: it said so through an
    /// "already exists" answer, which is read as the original job.
    Accepted {
        job_id: String,
        remote_state: Option<String>,
        status_url: Option<String>,
        duplicate: bool,
        /// The answer's `Retry-After` (an Azure long-running operation's 202 says when to look
        /// first): no status read before it.
        retry_after: Option<Duration>,
    },
    /// The provider answered synchronously with the finished result.
    Completed {
        job_id: Option<String>,
        result: FetchedResult,
    },
    /// Definitive rejection: the provider will not do it.
    Rejected {
        http_status: Option<u16>,
        reason: String,
    },
    /// The request may have reached the provider and we cannot tell what it did.
    Ambiguous { error_class: String },
    /// The provider said "not now". `maybe_processed`: the answer does not rule out that the
    /// create was acted on (a `408`, or a `503` a gateway may send after forwarding it, sent again
    /// safely only under the idempotency token): the job may exist, so it is reconciled, never
    /// concluded "not created". A `429` or `425` says nothing was done.
    RetryLater {
        delay: Option<Duration>,
        reason: String,
        maybe_processed: bool,
    },
    /// Nothing left this process (connection refused, a secret missing): safe to try again.
    NotSent { error_class: String },
}

/// Extra facts from a status body that result collection needs later.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ResultHints {
    pub result_url: Option<String>,
    pub checksum: Option<String>,
    pub expected_count: Option<u64>,
    /// A checksum or a count the status answer gave in a form that cannot be read (an object, a
    /// fraction): the result is refused rather than checked without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
    /// The refusal of the last download of `result_url` (a pre-signed URL that expired answers
    /// 403, some stores 404): the status is read for a fresh URL before the next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<RefusedDownload>,
}

/// A refused download of a result URL: its HTTP status, and the provider's words as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RefusedDownload {
    pub status: u16,
    pub reason: String,
}

/// One status read, in the provider's words.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteStatus {
    pub remote_state: String,
    /// `None`: a state name the contract does not map (recorded as such, never guessed).
    pub phase: Option<Phase>,
    pub updated_at: Option<String>,
    pub progress: Option<serde_json::Value>,
    pub error: Option<String>,
    /// A status URL the provider gave in this response (followed next time).
    pub status_url: Option<String>,
    pub retry_after: Option<Duration>,
    pub hints: ResultHints,
}

/// The result of `status`.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // one per status read, moved once: a box would allocate on each poll
pub enum StatusOutcome {
    Observed(RemoteStatus),
    RetryLater {
        delay: Option<Duration>,
        reason: String,
    },
    /// The read failed (timeout, 5xx, malformed or incomplete body): counts against the retry budget.
    Failed {
        error_class: String,
    },
    /// The provider definitively refused the read (e.g. 404 for our job).
    Rejected {
        http_status: Option<u16>,
        reason: String,
    },
    /// The provider named a status URL outside the origins its contract declares: nothing was sent
    /// there (our credentials must not go there, nor a request of ours).
    Refused {
        url: String,
    },
}

/// The result of `cancel`.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// The provider took the request (not a confirmation: polling continues). `retry_after`: the
    /// provider's `Retry-After` on this answer, honoured by the next status read.
    Accepted {
        http_status: Option<u16>,
        retry_after: Option<Duration>,
    },
    /// The provider's answer to the cancel is itself the job in a cancelled state (OGC's dismiss
    /// answers the job `dismissed`): the confirmation, in the provider's words.
    Confirmed {
        http_status: Option<u16>,
        remote_state: String,
    },
    /// The provider refused (for example, the job already finished). Polling tells the truth.
    Rejected {
        http_status: Option<u16>,
        reason: String,
    },
    /// Not now (a `429`/`503` with its wait): the job was not asked, so within the window it is
    /// no attempt and the cancel goes again.
    RetryLater {
        delay: Option<Duration>,
        reason: String,
    },
    /// Nothing reached the provider (a refused connection, a secret that could not be read): no
    /// attempt within the window either, but a failure, backed off.
    NotSent { error_class: String },
    Failed {
        error_class: String,
        /// A `Retry-After` the answer gave (a gateway's `503` to a cancel that may not be sent
        /// again): the next status read waits it out.
        retry_after: Option<Duration>,
    },
}

/// Result bytes as fetched, before validation.
#[derive(Debug, Clone, PartialEq)]
pub struct FetchedResult {
    pub bytes: bytes::Bytes,
    pub content_type: Option<String>,
    /// A checksum the provider sent with the bytes (header), if the contract names one.
    pub checksum: Option<String>,
}

/// The result of `fetch_result`.
#[derive(Debug, Clone, PartialEq)]
pub enum ResultOutcome {
    Fetched(FetchedResult),
    /// Worth another try later (timeout, 5xx).
    Failed {
        error_class: String,
    },
    /// The provider said "not now" (429, or what the contract calls retry-later) without serving
    /// anything: its `Retry-After`, if it gave one.
    RetryLater {
        delay: Option<Duration>,
        reason: String,
    },
    /// The result is larger than the contract allows (a validation failure, not a fetch failure).
    TooLarge {
        limit: u64,
    },
    /// Will not become available (404, 410, no URL).
    Unavailable {
        http_status: Option<u16>,
        reason: String,
    },
    /// The provider named a result URL outside the origins its contract declares: nothing was sent.
    Refused {
        url: String,
    },
    /// A download of the URL the status named was refused, and the status was read again for a
    /// fresh one (a pre-signed URL expires): the next download is due at once. `fresh`: the status
    /// named another URL than the refused one; `seen`: that read, recorded as any status read is
    /// (a status URL it moved to is followed from now on).
    Renewed {
        fresh: bool,
        seen: Box<RemoteStatus>,
    },
}

/// The result of a lookup by client reference.
#[derive(Debug, Clone, PartialEq)]
pub enum LookupOutcome {
    Found {
        job_ids: Vec<String>,
    },
    NotFound,
    /// The provider said "not now" (a `429`, or what the contract calls retry-later): nothing was
    /// looked up, and nothing may be resent until its `Retry-After` has passed.
    RetryLater {
        delay: Option<Duration>,
        reason: String,
    },
    Failed {
        error_class: String,
    },
}

/// The verdict on a fetched result.
#[derive(Debug, Clone, PartialEq)]
pub enum Checked {
    /// Every rule passed. `checks` names them; `summary` holds counts and failed item references.
    Valid {
        checks: Vec<String>,
        summary: serde_json::Value,
    },
    Invalid {
        violations: Vec<String>,
    },
}
