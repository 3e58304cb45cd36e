//! What the store hands out: domain records, not database rows. Row types stay private to this crate
//! and are converted here, in one place.

use chrono::{DateTime, Utc};
use jobtrail_core::chain::{ChainEntry, StoredLink};
use jobtrail_core::{Fingerprint, IdempotencyMode, IdempotencyToken, OperationId, State, TraceId};
use serde::Serialize;
use uuid::Uuid;

use crate::error::StoreError;

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
    pub poll_count: i32,
    pub failure_count: i32,
    pub cancel_attempts: i32,
    pub result_attempts: i32,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub lease_epoch: i64,
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
    pub history_seq: i64,
    #[serde(serialize_with = "hex_bytes")]
    pub history_head: Vec<u8>,
}

fn hex_bytes<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex::encode(b))
}

impl OperationRecord {
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
}

#[derive(sqlx::FromRow)]
pub(crate) struct OperationRow {
    id: Uuid,
    provider: String,
    target: String,
    request_body: serde_json::Value,
    request_fingerprint: String,
    idempotency_token: String,
    idempotency_mode: String,
    at_most_once: bool,
    caller: String,
    approved_by: String,
    approval_ref: Option<String>,
    trace_id: String,
    created_at: DateTime<Utc>,
    create_deadline: DateTime<Utc>,
    result_deadline: DateTime<Utc>,
    cancel_window_ms: i64,
    cancel_deadline: Option<DateTime<Utc>>,
    state: String,
    state_changed_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    escalated_at: Option<DateTime<Utc>>,
    escalation_reason: Option<String>,
    remote_job_id: Option<String>,
    conflicting_remote_job_id: Option<String>,
    remote_state: Option<String>,
    remote_updated_at: Option<String>,
    remote_progress: Option<serde_json::Value>,
    observed_at: Option<DateTime<Utc>>,
    status_url: Option<String>,
    provider_context: serde_json::Value,
    next_action_at: DateTime<Utc>,
    next_action_reason: String,
    create_attempts: i32,
    poll_count: i32,
    failure_count: i32,
    cancel_attempts: i32,
    result_attempts: i32,
    lease_owner: Option<String>,
    lease_expires_at: Option<DateTime<Utc>>,
    lease_epoch: i64,
    cancel_requested_at: Option<DateTime<Utc>>,
    cancel_requested_by: Option<String>,
    cancel_reason: Option<String>,
    result_location: Option<String>,
    result_size: Option<i64>,
    result_sha256: Option<String>,
    result_content_type: Option<String>,
    result_summary: Option<serde_json::Value>,
    supersedes: Option<Uuid>,
    superseded_by: Option<Uuid>,
    history_seq: i64,
    history_head: Vec<u8>,
}

/// A locked row together with the database clock reading of the locking transaction.
#[derive(sqlx::FromRow)]
pub(crate) struct LockedRow {
    pub db_now: DateTime<Utc>,
    #[sqlx(flatten)]
    pub row: OperationRow,
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

impl TryFrom<OperationRow> for OperationRecord {
    type Error = StoreError;
    fn try_from(r: OperationRow) -> Result<Self, StoreError> {
        Ok(Self {
            id: OperationId::from_uuid(r.id),
            provider: r.provider,
            target: r.target,
            request_body: r.request_body,
            fingerprint: Fingerprint::from_stored(r.request_fingerprint),
            token: IdempotencyToken::from_stored(r.idempotency_token),
            idempotency: r
                .idempotency_mode
                .parse()
                .map_err(|e| corrupt("idempotency_mode", e))?,
            at_most_once: r.at_most_once,
            caller: r.caller,
            approved_by: r.approved_by,
            approval_ref: r.approval_ref,
            trace_id: r.trace_id.parse().map_err(|e| corrupt("trace_id", e))?,
            created_at: r.created_at,
            create_deadline: r.create_deadline,
            result_deadline: r.result_deadline,
            cancel_window_ms: r.cancel_window_ms,
            cancel_deadline: r.cancel_deadline,
            state: r.state.parse().map_err(|e| corrupt("state", e))?,
            state_changed_at: r.state_changed_at,
            finished_at: r.finished_at,
            escalated_at: r.escalated_at,
            escalation_reason: r.escalation_reason,
            remote_job_id: r.remote_job_id,
            conflicting_remote_job_id: r.conflicting_remote_job_id,
            remote_state: r.remote_state,
            remote_updated_at: r.remote_updated_at,
            remote_progress: r.remote_progress,
            observed_at: r.observed_at,
            status_url: r.status_url,
            provider_context: r.provider_context,
            next_action_at: r.next_action_at,
            next_action_reason: r.next_action_reason,
            create_attempts: r.create_attempts,
            poll_count: r.poll_count,
            failure_count: r.failure_count,
            cancel_attempts: r.cancel_attempts,
            result_attempts: r.result_attempts,
            lease_owner: r.lease_owner,
            lease_expires_at: r.lease_expires_at,
            lease_epoch: r.lease_epoch,
            cancel_requested_at: r.cancel_requested_at,
            cancel_requested_by: r.cancel_requested_by,
            cancel_reason: r.cancel_reason,
            result_location: r.result_location,
            result_size: r.result_size,
            result_sha256: r.result_sha256,
            result_content_type: r.result_content_type,
            result_summary: r.result_summary,
            supersedes: r.supersedes.map(OperationId::from_uuid),
            superseded_by: r.superseded_by.map(OperationId::from_uuid),
            history_seq: r.history_seq,
            history_head: r.history_head,
        })
    }
}

/// One row of an operation's history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryRecord {
    pub operation_id: OperationId,
    pub seq: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub from_state: Option<String>,
    pub to_state: String,
    pub event: String,
    pub cause: String,
    pub remote_job_id: Option<String>,
    pub call_id: Option<Uuid>,
    pub detail: serde_json::Value,
    #[serde(serialize_with = "hex_bytes")]
    pub prev_hash: Vec<u8>,
    #[serde(serialize_with = "hex_bytes")]
    pub hash: Vec<u8>,
}

#[derive(sqlx::FromRow)]
pub(crate) struct HistoryRow {
    operation_id: Uuid,
    seq: i64,
    at: DateTime<Utc>,
    actor: String,
    from_state: Option<String>,
    to_state: String,
    event: String,
    cause: String,
    remote_job_id: Option<String>,
    call_id: Option<Uuid>,
    detail: serde_json::Value,
    prev_hash: Vec<u8>,
    hash: Vec<u8>,
}

impl From<HistoryRow> for HistoryRecord {
    fn from(r: HistoryRow) -> Self {
        Self {
            operation_id: OperationId::from_uuid(r.operation_id),
            seq: r.seq,
            at: r.at,
            actor: r.actor,
            from_state: r.from_state,
            to_state: r.to_state,
            event: r.event,
            cause: r.cause,
            remote_job_id: r.remote_job_id,
            call_id: r.call_id,
            detail: r.detail,
            prev_hash: r.prev_hash,
            hash: r.hash,
        }
    }
}

impl HistoryRecord {
    /// The hashed part of the row, as the chain defines it.
    pub fn chain_entry(&self) -> ChainEntry {
        ChainEntry {
            operation_id: self.operation_id.to_string(),
            seq: self.seq,
            at: self.at,
            actor: self.actor.clone(),
            from_state: self.from_state.clone(),
            to_state: self.to_state.clone(),
            event: self.event.clone(),
            cause: self.cause.clone(),
            remote_job_id: self.remote_job_id.clone(),
            call_id: self.call_id.map(|c| c.to_string()),
            detail: self.detail.clone(),
        }
    }

    pub fn link(&self) -> StoredLink {
        StoredLink {
            entry: self.chain_entry(),
            prev_hash: self.prev_hash.clone(),
            hash: self.hash.clone(),
        }
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
    pub id: Uuid,
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

/// A call as read back, with who made it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct StoredCall {
    pub id: Uuid,
    pub operation_id: Uuid,
    pub kind: String,
    pub attempt: i32,
    pub actor: String,
    pub lease_epoch: i64,
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

impl LockedRow {
    pub(crate) fn row_id(&self) -> uuid::Uuid {
        self.row.id
    }
    pub(crate) fn row_state(&self) -> &str {
        &self.row.state
    }
    pub(crate) fn row_create_attempts(&self) -> i32 {
        self.row.create_attempts
    }
    pub(crate) fn row_lease_owner(&self) -> Option<&str> {
        self.row.lease_owner.as_deref()
    }
    pub(crate) fn row_history_seq(&self) -> i64 {
        self.row.history_seq
    }
}
