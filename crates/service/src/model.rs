//! The typed requests and answers of the operations service. The same structs are the HTTP API's
//! bodies (and its OpenAPI schemas, through `utoipa`), the MCP tools' input and output schemas
//! (through `schemars`) and the CLI's `--json` output.

use chrono::{DateTime, Utc};
use jobtrail_core::{OperationId, State};
use jobtrail_store::{HistoryRecord, OperationRecord};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Submit an operation. The caller is whoever the credentials say, never a field of the request.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// Your own operation id: `op_` and a fresh ULID, one nobody else can guess or take first.
    /// Submitting the same id with the same request returns the existing operation; with a
    /// different request it is refused (409). Without one, one is made up for it: a refusal that
    /// says the submit may have landed all the same (`unavailable`) names it (`operation_id`; a
    /// batch's, `operation_ids`), to send again under; otherwise a retried submit creates a
    /// second operation, so name one.
    #[serde(default)]
    pub id: Option<String>,
    /// The provider's name (see `list_providers` / `GET /v1/providers`).
    pub provider: String,
    /// What the operation acts on (part of the fingerprint), e.g. an account or report name.
    pub target: String,
    /// The request sent to the provider (JSON, usually an object; see the provider's request shape).
    #[schema(value_type = Object)]
    pub request: serde_json::Value,
    /// Who authorised the work (recorded as your claim; providers that require approval need a token
    /// with the `decide` scope, whose caller is then the approver).
    pub approved_by: String,
    /// A reference to the approval (ticket, change request).
    #[serde(default)]
    pub approval_ref: Option<String>,
    /// RFC 3339 time or relative (`+2m`). Default: the provider's create window.
    #[serde(default)]
    pub create_deadline: Option<String>,
    /// RFC 3339 time or relative (`+1h`). Default: the provider's result window.
    #[serde(default)]
    pub result_deadline: Option<String>,
    /// How long a cancel may take to be confirmed (`90s`, `5m`). Default: the provider's.
    #[serde(default)]
    pub cancel_window: Option<String>,
    /// The finished operation (yours) this one retries. Linked both ways in the same write: its
    /// `superseded_by` names this one. An operation is retried once: another retry of it is refused.
    #[serde(default)]
    pub supersedes: Option<String>,
}

/// Many operations submitted at once, all or none.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchSubmitRequest {
    /// 1 to 1000 submissions, each as for a single submit. Name each one's `id`, so a retried
    /// batch returns the same operations instead of creating new ones.
    pub operations: Vec<SubmitRequest>,
}

/// The operations of a batch, in the order submitted.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct BatchSubmitResponse {
    pub operations: Vec<SubmitResponse>,
}

/// A submitted operation.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct SubmitResponse {
    /// False when this id already held the same request: nothing new was written.
    pub created: bool,
    pub operation: OperationView,
}

/// What jobtrail knows about an operation, and what it does not.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct OperationView {
    pub id: String,
    /// jobtrail's state (one of the states in docs/state-machine.md).
    pub state: String,
    /// What the state means, in plain words.
    pub meaning: String,
    /// What to do now (for an agent): wait, fetch the result, do not resubmit, ask a person.
    pub advice: String,
    /// `STATE@SEQ:HEAD`: the view token operator decisions repeat (HEAD, the first 8 hex digits of
    /// the history head, pins it to this operation), and `wait`'s `seen`.
    pub seen: String,
    /// The operation will not move by itself any more (finished, or held for a person).
    pub settled: bool,
    /// Held for a person (see the escalation queue).
    pub needs_human: bool,
    pub provider: String,
    pub target: String,
    pub caller: String,
    pub approved_by: String,
    pub approval_ref: Option<String>,
    /// The request's fingerprint (provider, target, canonical body).
    pub fingerprint: String,
    /// False when the provider takes no idempotency key: at-most-once creation cannot be guaranteed.
    pub at_most_once: bool,
    /// The W3C trace id every provider call of this operation carries.
    pub trace_id: String,
    pub created_at: DateTime<Utc>,
    pub state_changed_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub create_deadline: DateTime<Utc>,
    pub result_deadline: DateTime<Utc>,
    /// The provider's job id, once known.
    pub remote_job_id: Option<String>,
    /// The provider's own state word, as last read.
    pub remote_state: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub remote_progress: Option<serde_json::Value>,
    pub observed_at: Option<DateTime<Utc>>,
    /// Why it is held for a person.
    pub escalation_reason: Option<String>,
    pub cancel_requested_at: Option<DateTime<Utc>>,
    pub cancel_requested_by: Option<String>,
    /// The job ended on its own before a requested cancel took effect.
    pub finished_before_cancel: bool,
    /// The validated result, for a succeeded operation.
    pub result: Option<ResultInfo>,
    pub supersedes: Option<String>,
    pub superseded_by: Option<String>,
    /// The history, oldest first (only when asked for): its newest [`TIMELINE_PAGE`] links, or
    /// those before `timeline_before`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<TimelineEntry>>,
    /// Earlier links exist: ask again with `timeline_before` set to this (the first link shown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline_earlier: Option<i64>,
}

/// Links of history one answer carries at most: an operation polled for days has tens of
/// thousands, and an agent reading them over MCP pays for each in its context.
pub const TIMELINE_PAGE: i64 = 200;

/// Which of an operation's history to include with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Timeline {
    #[default]
    Omit,
    /// The newest [`TIMELINE_PAGE`] links.
    Newest,
    /// The [`TIMELINE_PAGE`] links before this sequence number.
    Before(i64),
}

impl Timeline {
    /// From the doors' two parameters (`timeline_before` implies `timeline`).
    pub fn of(timeline: bool, before: Option<i64>) -> Result<Self, crate::ServiceError> {
        match before {
            Some(seq) if seq < 1 => Err(crate::ServiceError::bad_input(format!(
                "timeline_before is a history sequence number, 1 or more (got {seq})"
            ))),
            Some(seq) => Ok(Self::Before(seq)),
            None if timeline => Ok(Self::Newest),
            None => Ok(Self::Omit),
        }
    }
}

/// The validated result of a succeeded operation (fetch the bytes with `result`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct ResultInfo {
    pub sha256: Option<String>,
    pub size: Option<i64>,
    pub content_type: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub summary: Option<serde_json::Value>,
}

/// One link of an operation's history.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct TimelineEntry {
    pub seq: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub from_state: Option<String>,
    pub to_state: String,
    pub event: String,
    pub cause: String,
}

/// Filters for listing operations; every one is optional.
#[derive(
    Debug, Clone, Default, Serialize, Deserialize, JsonSchema, ToSchema, utoipa::IntoParams,
)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only operations in this state.
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub provider: Option<String>,
    /// Only this caller's operations (tokens without `decide` or `audit` only ever see their own).
    #[serde(default)]
    pub caller: Option<String>,
    /// Created at or after (RFC 3339).
    #[serde(default)]
    pub created_from: Option<DateTime<Utc>>,
    /// Created before (RFC 3339).
    #[serde(default)]
    pub created_before: Option<DateTime<Utc>>,
    /// The `next_cursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
    /// Page size, 1–200 (default 50).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// A page of operations, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct OperationPage {
    pub operations: Vec<OperationView>,
    /// Pass as `cursor` for the next page; absent on the last page. A page reads at most 2 000 of
    /// your operations to find those the filters match, so a page may be short, or empty, and
    /// still have a next one: only an absent cursor is the end.
    pub next_cursor: Option<String>,
}

/// The answer to a bounded wait.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct WaitResponse {
    /// The state changed from the one seen (or the operation was already settled).
    pub changed: bool,
    /// The timeout passed first; the operation is as `operation` says.
    pub timed_out: bool,
    pub operation: OperationView,
}

/// A cancel request.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Why (recorded in history with your caller name).
    pub reason: String,
    /// The view you saw (`STATE@SEQ:HEAD`, as `seen` in the operation's view): checked under the
    /// row lock, a stale one is 409, and one whose HEAD is another operation's is 409. Needed to cancel another caller's operation held for a person
    /// (the decide scope): cancelling it is a decision on what you saw, and another person may
    /// have resumed it since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<String>,
}

/// What a cancel request did.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct CancelResponse {
    /// What happens now: cancelled only when the provider confirms.
    pub note: String,
    pub operation: OperationView,
}

/// A result's bytes, as the history chain records them.
#[derive(Debug)]
pub struct ResultBytes {
    pub bytes: Vec<u8>,
    pub sha256: String,
    pub content_type: Option<String>,
    /// Their share of what the server holds at once, given back when the answer is dropped.
    pub held: Option<crate::Held>,
}

/// What a provider does and what a request to it needs.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct ProviderView {
    pub name: String,
    pub description: Option<String>,
    /// The request's JSON shape: "object" or "any".
    pub request_shape: String,
    /// The JSON Schema a request must satisfy, when the contract gives one.
    #[schema(value_type = Option<Object>)]
    pub request_schema: Option<serde_json::Value>,
    /// Fields that hold secrets: name a granted secret there as `{"$secret": "name"}`.
    pub sensitive_fields: Vec<String>,
    /// Secrets you may name (granted to your caller).
    pub secrets: Vec<String>,
    /// False when the provider takes no idempotency key: at-most-once creation cannot be guaranteed.
    pub at_most_once: bool,
    /// Submissions need a token with the `decide` scope (a person's approval).
    pub requires_approval: bool,
    pub max_request_bytes: usize,
    pub default_create_window_secs: u64,
    pub default_result_window_secs: u64,
    pub default_cancel_window_secs: u64,
}

/// The provider catalogue.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct ProviderList {
    pub providers: Vec<ProviderView>,
}

/// A person's decision on an operation held for one (or a retry of a finished one).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideRequest {
    /// The view decided on, `STATE@SEQ` (an operation's `seen`): refused if it moved since. A bare
    /// `STATE` checks only the state; `adopt` and `declare_not_created` refuse it (400).
    pub seen: String,
    /// Why (recorded in history with your caller name).
    pub reason: String,
    pub decision: Decision,
}

/// The decisions a person may record.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Decision {
    /// The remote job exists with this id: observe it (create_unknown / reconciliation /
    /// create_unresolved → observing).
    Adopt { job_id: String },
    /// The remote job was never created (→ not_created).
    // Braces, not a unit variant: serde lets a unit variant of a tagged enum pass any other key
    // unread, and `{"kind":"declare_not_created","job_id":"J-1"}` (an adopt miswritten) must be
    // refused, not decided as "no job".
    DeclareNotCreated {},
    /// The cancellation is confirmed by evidence you hold (→ cancelled).
    ConfirmCancel { evidence: String },
    /// One of the provider's two answers is ours (contract_violation → observing).
    ChooseJob { job_id: String },
    /// Go on observing with a new deadline or window (the one the held state needs).
    Resume {
        #[serde(default)]
        result_deadline: Option<String>,
        #[serde(default)]
        cancel_window: Option<String>,
        #[serde(default)]
        create_deadline: Option<String>,
    },
    /// Stop tracking; everything recorded is kept.
    Abandon {},
    /// Retry a finished operation as a new, linked one (the same request unless `request` is given).
    Retry {
        #[serde(default)]
        #[schema(value_type = Option<Object>)]
        request: Option<serde_json::Value>,
        #[serde(default)]
        result_deadline: Option<String>,
        /// The operation was abandoned before anyone settled whether its create made a job
        /// (abandoned in create_unknown, reconciliation or create_unresolved), and you accept
        /// that the retry, a new create, may be a second paid job beside one that exists.
        /// Without it such a retry is refused (409). Said, it is kept in the record (the
        /// `superseded` link's evidence), with your name.
        #[serde(default)]
        job_may_exist: bool,
    },
}

/// What a decision did.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct DecideResponse {
    /// `from → to`.
    pub moved: String,
    pub operation: OperationView,
    /// The new operation, for a retry.
    pub retry: Option<OperationView>,
}

/// An operation held for a person, with the decisions that fit it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct Escalation {
    pub operation: OperationView,
    pub decisions: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, ToSchema)]
pub struct EscalationList {
    /// Oldest first, at most 500.
    pub escalations: Vec<Escalation>,
    /// More operations are held than shown: decide these first, or narrow by state or provider.
    #[serde(default)]
    pub more: bool,
}

/// What an agent should do, per state.
pub fn advice(state: State) -> &'static str {
    match state {
        State::CreatePending => "recorded; the create has not been confirmed yet — wait",
        State::CreateUnknown | State::Reconciliation => {
            "we do not yet know whether the provider created the job; do not submit again — wait"
        }
        State::CreateUnresolved => {
            "held for a person: nobody can tell whether the job was created; do not submit again — an operator decides"
        }
        State::Accepted | State::Observing => "the job is running at the provider — wait",
        State::ResultCollecting => {
            "the job succeeded; its result is being fetched and validated — wait"
        }
        State::CancelRequested | State::Cancelling => {
            "cancel requested; cancelled only when the provider confirms — wait"
        }
        State::ContractViolation => {
            "held for a person: the provider's answer cannot be this operation's alone (two job ids for one request, or a job another operation holds) — an operator decides"
        }
        State::CancellationUnconfirmed => {
            "held for a person: the provider never confirmed the cancel; the job may still run"
        }
        State::ResultTimedOut => {
            "held for a person: the result deadline passed; the job may still run"
        }
        State::UrlRefused => {
            "held for a person: the provider pointed outside its declared origins; nothing was sent there"
        }
        State::ResultStalled => {
            "held for a person: the job succeeded, but collecting its result keeps stopping the workers that try, or it cannot be kept (or read back) where results are kept"
        }
        State::Succeeded => "done: fetch the validated result",
        State::Failed => "done: the provider reported failure; there is no result",
        State::Cancelled => "done: the provider confirmed the cancel",
        State::ResultUnavailable => "done: the job succeeded but its result could not be fetched",
        State::ResultValidationFailed => {
            "done: the job succeeded but its result failed validation; nothing is served"
        }
        State::Withdrawn => {
            "done: cancelled before anything was sent; nothing exists at the provider"
        }
        State::NotCreated => "done: the job was never created; a new operation may be submitted",
        State::Abandoned => {
            "done: an operator stopped tracking it; the remote job is not assumed stopped"
        }
    }
}

impl OperationView {
    pub fn of(op: &OperationRecord) -> Self {
        let result = (op.state == State::Succeeded).then(|| ResultInfo {
            sha256: op.result_sha256.clone(),
            size: op.result_size,
            content_type: op.result_content_type.clone(),
            summary: op.result_summary.clone(),
        });
        Self {
            id: op.id.to_string(),
            state: op.state.to_string(),
            meaning: op.state.meaning().to_owned(),
            advice: advice(op.state).to_owned(),
            seen: crate::operator::seen_token(op.state, op.history_seq, &op.history_head),
            settled: op.state.is_terminal() || op.state.needs_human(),
            needs_human: op.state.needs_human(),
            provider: op.provider.clone(),
            target: op.target.clone(),
            caller: op.caller.clone(),
            approved_by: op.approved_by.clone(),
            approval_ref: op.approval_ref.clone(),
            fingerprint: op.fingerprint.as_str().to_owned(),
            at_most_once: op.at_most_once,
            trace_id: op.trace_id.to_string(),
            created_at: op.created_at,
            state_changed_at: op.state_changed_at,
            finished_at: op.finished_at,
            create_deadline: op.create_deadline,
            result_deadline: op.result_deadline,
            remote_job_id: op.remote_job_id.clone(),
            remote_state: op.remote_state.clone(),
            remote_progress: op.remote_progress.clone(),
            observed_at: op.observed_at,
            escalation_reason: op.escalation_reason.clone(),
            cancel_requested_at: op.cancel_requested_at,
            cancel_requested_by: op.cancel_requested_by.clone(),
            finished_before_cancel: op.finished_before_cancel(),
            result,
            supersedes: op.supersedes.map(|s| s.to_string()),
            superseded_by: op.superseded_by.map(|s| s.to_string()),
            timeline: None,
            timeline_earlier: None,
        }
    }

    /// With `history` (a page, in chain order) as its timeline; `earlier`: links before it exist.
    pub fn with_timeline(mut self, history: &[HistoryRecord], earlier: bool) -> Self {
        self.timeline_earlier = history.first().filter(|_| earlier).map(|h| h.seq);
        self.timeline = Some(
            history
                .iter()
                .map(|h| TimelineEntry {
                    seq: h.seq,
                    at: h.at,
                    actor: h.actor.clone(),
                    from_state: h.from_state.clone(),
                    to_state: h.to_state.clone(),
                    event: h.event.clone(),
                    cause: h.cause.clone(),
                })
                .collect(),
        );
        self
    }

    /// The state, parsed back.
    pub fn state(&self) -> Option<State> {
        self.state.parse().ok()
    }

    pub fn operation_id(&self) -> Option<OperationId> {
        self.id.parse().ok()
    }
}
