//! A step: everything one worker (or person) action writes about one operation, atomically or not at
//! all. The pure decisions ([`crate::decide`]) produce steps; the store writes them.

use crate::event::Event;
use crate::ids::OperationId;
use crate::record::CallRecord;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// What the remote side looked like at this step (provider's words).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observation {
    pub remote_state: Option<String>,
    pub remote_updated_at: Option<String>,
    pub progress: Option<serde_json::Value>,
    pub status_url: Option<String>,
    pub provider_context: Option<serde_json::Value>,
}

impl Observation {
    /// What a status read saw (the provider context is the call's, attached with it).
    pub fn of(s: &crate::outcome::RemoteStatus) -> Self {
        Self {
            remote_state: Some(s.remote_state.clone()),
            remote_updated_at: s.updated_at.clone(),
            progress: s.progress.clone(),
            status_url: s.status_url.clone(),
            provider_context: None,
        }
    }
}

/// How the failure counter (the retry budget) moves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FailureCount {
    #[default]
    Keep,
    Increment,
    Reset,
}

/// Counter movements of one step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub create_attempts: i32,
    pub polls: i32,
    pub cancel_attempts: i32,
    pub result_attempts: i32,
    pub reconcile_attempts: i32,
    pub failures: FailureCount,
}

/// The "a create may be in flight" mark (see [`crate::record::OperationRecord::create_sent_epoch`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SendMark {
    /// Leave it as it is.
    #[default]
    Keep,
    /// Mark it under the writer's lease epoch (only while `create_pending`; refused otherwise).
    Set,
    /// The outcome of the marked send is recorded by this step.
    Clear,
}

/// One step of a worker (or a person) on one operation: at most one event, at most one call, the
/// observation, counters and the next action. Written atomically or not at all.
#[derive(Debug, Clone, Default)]
pub struct Step {
    pub event: Option<Event>,
    pub call: Option<CallRecord>,
    pub observation: Option<Observation>,
    pub counters: Counters,
    /// Delay before the next action (from the database clock) and why. `None`: due at once.
    pub next_in: Option<(Duration, &'static str)>,
    /// Keep the lease after this step (the worker continues at once). Released otherwise.
    pub keep_lease: bool,
    /// Extra evidence for the history row (sanitized response metadata, provider request id, …).
    pub detail: Option<serde_json::Value>,
    pub set_create_deadline: Option<DateTime<Utc>>,
    pub set_result_deadline: Option<DateTime<Utc>>,
    pub set_cancel_deadline: Option<DateTime<Utc>>,
    /// The provider's `Retry-After` on this step's answer (already clamped): no status read of this
    /// job before the database's now plus this.
    pub retry_after: Option<Duration>,
    pub send_mark: SendMark,
    /// Result bytes to keep in the database with this step (its event, evidence or observed provider
    /// context names their location, [`ResultBytes::location`]): both are written, or neither.
    pub result_bytes: Option<ResultBytes>,
    /// The state the worker decided this step in (the write may find another: a cancel request
    /// that landed meanwhile). `None` for steps not decided by a worker.
    pub decided_in: Option<crate::state::State>,
}

/// Result bytes kept in the `operation_results` table, written by the transaction of the step that
/// records where they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultBytes {
    /// Lowercase hex sha256 of `bytes`.
    pub sha256: String,
    pub content_type: Option<String>,
    pub bytes: bytes::Bytes,
}

/// How a location in the database is written: `postgres:operation_results/<operation>/<sha256>`.
const DB_LOCATION_PREFIX: &str = "postgres:operation_results/";

impl ResultBytes {
    /// The location to record for these bytes of `operation`.
    pub fn location(&self, operation: OperationId) -> String {
        format!("{DB_LOCATION_PREFIX}{operation}/{}", self.sha256)
    }

    /// The operation and digest a database location names; `None` for any other location.
    pub fn parse_location(location: &str) -> Option<(OperationId, &str)> {
        let (op, sha) = location.strip_prefix(DB_LOCATION_PREFIX)?.split_once('/')?;
        Some((op.parse().ok()?, sha))
    }
}

impl Step {
    pub fn event(event: Event) -> Self {
        Self {
            event: Some(event),
            ..Default::default()
        }
    }
    pub fn with_call(mut self, call: CallRecord) -> Self {
        self.call = Some(call);
        self
    }
    pub fn next_in(mut self, delay: Duration, reason: &'static str) -> Self {
        self.next_in = Some((delay, reason));
        self
    }
}
