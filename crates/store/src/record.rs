//! What the store hands out: domain records, not database rows. Row types stay private to this crate
//! and are converted here, in one place.

use chrono::{DateTime, Utc};
use jobtrail_core::chain::{ChainEntry, StoredLink};
use jobtrail_core::{Fingerprint, IdempotencyToken, OperationId};
use serde::Serialize;
use uuid::Uuid;

use crate::error::StoreError;

pub use jobtrail_core::record::{CallKind, CallRecord, OperationRecord};

fn hex_bytes<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex::encode(b))
}

/// A `jsonb` column read back for the record. PostgreSQL keeps JSON that serde_json refuses (a
/// number beyond a double, nesting deeper than 128); nothing jobtrail writes is such, but a writer
/// role's own SQL could append one to a history that can never lose it. Such a value is read as a
/// marker naming why, never as an error that would stop every read of the table (`audit verify
/// --all` included) for good: in a hashed row the marker does not hash as the stored value did, so
/// `audit verify` names that row, and reads on.
pub(crate) struct ReadableJson(pub(crate) serde_json::Value);

/// The key of the marker an unreadable value is read as.
pub use jobtrail_core::json::UNREADABLE_JSON;

impl sqlx::Type<sqlx::Postgres> for ReadableJson {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <serde_json::Value as sqlx::Type<sqlx::Postgres>>::type_info()
    }
    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <serde_json::Value as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

/// A jsonb value's JSON text, as PostgreSQL sends it.
fn json_text<'r>(
    value: &sqlx::postgres::PgValueRef<'r>,
) -> Result<&'r [u8], sqlx::error::BoxDynError> {
    let binary = value.format() == sqlx::postgres::PgValueFormat::Binary;
    let text = value.as_bytes()?;
    // jsonb's binary form is a version byte (1) before the text (JSON text never starts so).
    Ok(match text.split_first() {
        Some((1, rest)) if binary => rest,
        _ => text,
    })
}

fn readable(text: &[u8]) -> serde_json::Value {
    serde_json::from_slice(text).unwrap_or_else(|e| {
        serde_json::json!({ UNREADABLE_JSON: format!("PostgreSQL keeps JSON this build cannot read: {e}") })
    })
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for ReadableJson {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        Ok(Self(readable(json_text(&value)?)))
    }
}

/// A history link's detail, as [`ReadableJson`], with the first number in its stored text that the
/// chain's hash cannot tell from another (see `jobtrail_core::json::number_beyond_double`):
/// the text is what the database keeps, the hash was of the value read from it.
pub(crate) struct HashedJson {
    value: serde_json::Value,
    beyond_double: Option<jobtrail_core::json::BeyondDouble>,
}

impl sqlx::Type<sqlx::Postgres> for HashedJson {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <ReadableJson as sqlx::Type<sqlx::Postgres>>::type_info()
    }
    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <ReadableJson as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for HashedJson {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let text = json_text(&value)?;
        Ok(Self {
            value: readable(text),
            beyond_double: jobtrail_core::json::number_beyond_double(text),
        })
    }
}

impl From<ReadableJson> for serde_json::Value {
    fn from(j: ReadableJson) -> Self {
        j.0
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct OperationRow {
    id: Uuid,
    provider: String,
    target: String,
    request_body: ReadableJson,
    request_fingerprint: String,
    idempotency_token: String,
    idempotency_mode: String,
    at_most_once: bool,
    caller: String,
    approved_by: String,
    approval_ref: Option<String>,
    trace_id: String,
    parent_span_id: Option<String>,
    parent_sampled: Option<bool>,
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
    remote_progress: Option<ReadableJson>,
    observed_at: Option<DateTime<Utc>>,
    status_url: Option<String>,
    provider_context: ReadableJson,
    next_action_at: DateTime<Utc>,
    next_action_reason: String,
    create_attempts: i32,
    create_sent_epoch: Option<i64>,
    poll_count: i32,
    poll_not_before: Option<DateTime<Utc>>,
    failure_count: i32,
    cancel_attempts: i32,
    result_attempts: i32,
    reconcile_attempts: i32,
    lease_owner: Option<String>,
    lease_expires_at: Option<DateTime<Utc>>,
    lease_epoch: i64,
    takeovers: i32,
    cancel_requested_at: Option<DateTime<Utc>>,
    cancel_requested_by: Option<String>,
    cancel_reason: Option<String>,
    result_location: Option<String>,
    result_size: Option<i64>,
    result_sha256: Option<String>,
    result_content_type: Option<String>,
    result_summary: Option<ReadableJson>,
    supersedes: Option<Uuid>,
    superseded_by: Option<Uuid>,
    edited_by: Option<String>,
    history_seq: i64,
    history_head: Vec<u8>,
    calls_seq: i64,
    calls_head: Vec<u8>,
}

/// A locked row together with the database clock reading of the locking transaction.
#[derive(sqlx::FromRow)]
pub(crate) struct LockedRow {
    pub db_now: DateTime<Utc>,
    #[sqlx(flatten)]
    pub row: OperationRow,
}

/// A claimed row: the locked row, when it was due, and whether its lease was taken over.
#[derive(sqlx::FromRow)]
pub(crate) struct ClaimedRow {
    pub was_due: DateTime<Utc>,
    pub taken_over: bool,
    #[sqlx(flatten)]
    pub locked: LockedRow,
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
            request_body: r.request_body.0,
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
            parent_span: r
                .parent_span_id
                .map(|s| s.parse())
                .transpose()
                .map_err(|e| corrupt("parent_span_id", e))?,
            parent_sampled: r.parent_sampled,
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
            remote_progress: r.remote_progress.map(|j| j.0),
            observed_at: r.observed_at,
            status_url: r.status_url,
            provider_context: r.provider_context.0,
            next_action_at: r.next_action_at,
            next_action_reason: r.next_action_reason,
            create_attempts: r.create_attempts,
            create_sent_epoch: r.create_sent_epoch,
            poll_count: r.poll_count,
            poll_not_before: r.poll_not_before,
            failure_count: r.failure_count,
            cancel_attempts: r.cancel_attempts,
            result_attempts: r.result_attempts,
            reconcile_attempts: r.reconcile_attempts,
            lease_owner: r.lease_owner,
            lease_expires_at: r.lease_expires_at,
            lease_epoch: r.lease_epoch,
            takeovers: r.takeovers,
            cancel_requested_at: r.cancel_requested_at,
            cancel_requested_by: r.cancel_requested_by,
            cancel_reason: r.cancel_reason,
            result_location: r.result_location,
            result_size: r.result_size,
            result_sha256: r.result_sha256,
            result_content_type: r.result_content_type,
            result_summary: r.result_summary.map(|j| j.0),
            supersedes: r.supersedes.map(OperationId::from_uuid),
            superseded_by: r.superseded_by.map(OperationId::from_uuid),
            edited_by: r.edited_by,
            history_seq: r.history_seq,
            history_head: r.history_head,
            calls_seq: r.calls_seq,
            calls_head: r.calls_head,
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
    /// The database login that inserted the link (migration 0032; `None` before it): what the
    /// database saw, beside the `actor` the writer named. Not hashed.
    pub recorded_by: Option<String>,
    /// A number in the stored `detail` that is not exactly the double the hash read it as
    /// (`audit verify` reports one; see `jobtrail_core::json::number_beyond_double`).
    #[serde(skip)]
    pub detail_number_beyond_double: Option<jobtrail_core::json::BeyondDouble>,
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
    detail: HashedJson,
    prev_hash: Vec<u8>,
    hash: Vec<u8>,
    #[sqlx(default)]
    recorded_by: Option<String>,
}

impl HistoryRow {
    pub(crate) fn operation_uuid(&self) -> Uuid {
        self.operation_id
    }
    pub(crate) fn seq(&self) -> i64 {
        self.seq
    }
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
            detail: r.detail.value,
            prev_hash: r.prev_hash,
            hash: r.hash,
            recorded_by: r.recorded_by,
            detail_number_beyond_double: r.detail.beyond_double,
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
    #[sqlx(try_from = "ReadableJson")]
    pub response_headers: serde_json::Value,
    pub provider_request_id: Option<String>,
    pub error_class: Option<String>,
    pub outcome: String,
    pub trace_id: String,
    pub span_id: String,
    pub response_sha256: Option<String>,
    /// The call's link in its operation's call chain (`None`: logged before calls were chained).
    pub seq: Option<i64>,
    #[serde(skip)]
    pub prev_hash: Option<Vec<u8>>,
    #[serde(skip)]
    pub hash: Option<Vec<u8>>,
}

impl StoredCall {
    /// The chained part of the row, as the call chain defines it.
    pub fn link(
        &self,
    ) -> Option<jobtrail_core::chain::StoredLink<jobtrail_core::chain::CallEntry>> {
        Some(jobtrail_core::chain::StoredLink {
            entry: jobtrail_core::chain::CallEntry {
                operation_id: OperationId::from_uuid(self.operation_id).to_string(),
                seq: self.seq?,
                id: self.id.to_string(),
                kind: self.kind.clone(),
                attempt: self.attempt,
                actor: self.actor.clone(),
                lease_epoch: self.lease_epoch,
                started_at: self.started_at,
                duration_ms: self.duration_ms,
                method: self.method.clone(),
                url: self.url.clone(),
                http_status: self.http_status,
                response_headers: self.response_headers.clone(),
                provider_request_id: self.provider_request_id.clone(),
                error_class: self.error_class.clone(),
                outcome: self.outcome.clone(),
                trace_id: self.trace_id.clone(),
                span_id: self.span_id.clone(),
                response_sha256: self.response_sha256.clone(),
            },
            prev_hash: self.prev_hash.clone()?,
            hash: self.hash.clone()?,
        })
    }
}

impl LockedRow {
    pub(crate) fn row_id(&self) -> uuid::Uuid {
        self.row.id
    }
    pub(crate) fn row_state(&self) -> &str {
        &self.row.state
    }
    pub(crate) fn row_create_sent_epoch(&self) -> Option<i64> {
        self.row.create_sent_epoch
    }
    pub(crate) fn row_cancel_requested(&self) -> bool {
        self.row.cancel_requested_at.is_some()
    }
    /// Who holds the row's lease and until when, if it is still running (by the database clock).
    pub(crate) fn live_lease(&self) -> Option<(&str, DateTime<Utc>)> {
        let owner = self.row.lease_owner.as_deref()?;
        let until = self.row.lease_expires_at?;
        (until > self.db_now).then_some((owner, until))
    }
    pub(crate) fn row_lease_owner(&self) -> Option<&str> {
        self.row.lease_owner.as_deref()
    }
    pub(crate) fn row_lease_epoch(&self) -> i64 {
        self.row.lease_epoch
    }
    pub(crate) fn row_history_seq(&self) -> i64 {
        self.row.history_seq
    }
    pub(crate) fn row_history_head(&self) -> &[u8] {
        &self.row.history_head
    }
    pub(crate) fn row_superseded_by(&self) -> Option<uuid::Uuid> {
        self.row.superseded_by
    }
    pub(crate) fn row_provider(&self) -> &str {
        &self.row.provider
    }
    pub(crate) fn row_caller(&self) -> &str {
        &self.row.caller
    }
    pub(crate) fn row_remote_job_id(&self) -> Option<&str> {
        self.row.remote_job_id.as_deref()
    }
}
