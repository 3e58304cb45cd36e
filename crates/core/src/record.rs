//! The durable operation record and the record of one provider call, as domain values.
//!
//! The store turns its rows into these (row types never leave the store), the adapter reads them to
//! build requests, and the pure decisions in [`crate::decide`] take them as input. Keeping them here
//! lets the provider adapter depend on the core alone.

use crate::ids::{IdempotencyToken, OperationId, SpanId, TraceId};
use crate::operation::IdempotencyMode;
use crate::request::Fingerprint;
use crate::state::State;
use chrono::{DateTime, Utc};
use serde::Serialize;

/// The durable operation record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OperationRecord {
    pub id: OperationId,
    pub provider: String,
    pub target: String,
    pub request_body: serde_json::Value,
    pub fingerprint: Fingerprint,
    #[serde(skip)]
    pub token: IdempotencyToken,
    pub idempotency: IdempotencyMode,
    pub at_most_once: bool,
    pub caller: String,
    pub approved_by: String,
    pub approval_ref: Option<String>,
    pub trace_id: TraceId,
    /// The caller's span the operation's root span is recorded under (trace metadata only).
    pub parent_span: Option<SpanId>,
    /// Whether the caller's trace was sampled (`None`: no caller trace, or not kept then).
    pub parent_sampled: Option<bool>,
    pub created_at: DateTime<Utc>,
    pub create_deadline: DateTime<Utc>,
    pub result_deadline: DateTime<Utc>,
    pub cancel_window_ms: i64,
    pub cancel_deadline: Option<DateTime<Utc>>,
    pub state: State,
    pub state_changed_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub escalated_at: Option<DateTime<Utc>>,
    pub escalation_reason: Option<String>,
    pub remote_job_id: Option<String>,
    pub conflicting_remote_job_id: Option<String>,
    pub remote_state: Option<String>,
    pub remote_updated_at: Option<String>,
    pub remote_progress: Option<serde_json::Value>,
    pub observed_at: Option<DateTime<Utc>>,
    pub status_url: Option<String>,
    #[serde(skip)]
    pub provider_context: serde_json::Value,
    pub next_action_at: DateTime<Utc>,
    pub next_action_reason: String,
    pub create_attempts: i32,
    /// The lease epoch under which a create may have left and whose outcome is not recorded yet.
    /// Set by the claim of a `create_pending` row, in the claim's own commit, before any byte of the
    /// create is sent; cleared by the step that records the outcome. A worker that finds another
    /// epoch's mark knows a send may have reached the provider.
    pub create_sent_epoch: Option<i64>,
    pub poll_count: i32,
    /// The provider's last `Retry-After` for this job, as a time: no status read before it.
    pub poll_not_before: Option<DateTime<Utc>>,
    pub failure_count: i32,
    pub cancel_attempts: i32,
    pub result_attempts: i32,
    /// Reconciliation calls made (lookups and resends).
    pub reconcile_attempts: i32,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub lease_epoch: i64,
    /// Claims in a row that found the previous holder's lease run out (it was lost: killed, or
    /// stalled past the lease) with no step recorded since. Counted by the claim, cleared by every
    /// step written.
    pub takeovers: i32,
    pub cancel_requested_at: Option<DateTime<Utc>>,
    pub cancel_requested_by: Option<String>,
    pub cancel_reason: Option<String>,
    pub result_location: Option<String>,
    pub result_size: Option<i64>,
    pub result_sha256: Option<String>,
    pub result_content_type: Option<String>,
    pub result_summary: Option<serde_json::Value>,
    pub supersedes: Option<OperationId>,
    pub superseded_by: Option<OperationId>,
    /// The person whose edit the request carries (a person's retry with a changed request).
    pub edited_by: Option<String>,
    pub history_seq: i64,
    #[serde(serialize_with = "hex_bytes")]
    pub history_head: Vec<u8>,
    /// The head of this operation's provider-call chain (see `chain`).
    pub calls_seq: i64,
    #[serde(serialize_with = "hex_bytes")]
    pub calls_head: Vec<u8>,
}

pub(crate) fn hex_bytes<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex::encode(b))
}

impl OperationRecord {
    /// Whose grants the secrets the request names are checked against at each create sent: its caller's,
    /// and the person's whose edit it carries.
    pub fn secret_holders(&self) -> Vec<crate::request::Holder<'_>> {
        std::iter::once(crate::request::Holder::Caller(&self.caller))
            .chain(
                self.edited_by
                    .as_deref()
                    .map(crate::request::Holder::Retrier),
            )
            .collect()
    }

    /// A cancel was requested but the job ended otherwise first ("finished before the cancel took
    /// effect"): reported as such, never rewritten.
    pub fn finished_before_cancel(&self) -> bool {
        self.cancel_requested_at.is_some()
            && self.state.is_terminal()
            && !matches!(
                self.state,
                State::Cancelled | State::Withdrawn | State::Abandoned
            )
    }

    /// A cancel was requested and not yet acted on as a state.
    pub fn has_pending_cancel(&self) -> bool {
        self.cancel_requested_at.is_some()
            && !matches!(
                self.state,
                State::CancelRequested
                    | State::Cancelling
                    | State::CancellationUnconfirmed
                    | State::Cancelled
                    | State::Withdrawn
            )
    }

    /// A create may have left under another lease and its outcome was never recorded.
    pub fn create_send_unrecorded(&self, own_epoch: i64) -> bool {
        self.create_sent_epoch.is_some_and(|e| e != own_epoch)
    }
}

/// Which provider endpoint a call went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    Create,
    Status,
    Cancel,
    Result,
    Lookup,
}

impl CallKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            CallKind::Create => "create",
            CallKind::Status => "status",
            CallKind::Cancel => "cancel",
            CallKind::Result => "result",
            CallKind::Lookup => "lookup",
        }
    }
}

/// One external call, as the worker recorded it (already sanitized: no credentials, no secret query
/// parameters, only allow-listed response headers).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallRecord {
    pub id: uuid::Uuid,
    pub kind: CallKind,
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: f64,
    pub method: String,
    pub url: String,
    pub http_status: Option<i32>,
    pub response_headers: serde_json::Value,
    pub provider_request_id: Option<String>,
    pub error_class: Option<String>,
    pub outcome: String,
    pub trace_id: String,
    pub span_id: String,
    pub response_sha256: Option<String>,
}
