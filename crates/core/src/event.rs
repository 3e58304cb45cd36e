//! Events: what happened, with the evidence that it happened.
//!
//! An event is the only input of the state machine. Evidence types have private fields and checked
//! constructors, so "succeeded without a validated result" or "cancelled because we sent DELETE" cannot
//! even be expressed.

use crate::text::{self, TextError};
use serde::{Deserialize, Serialize};

/// Evidence was missing or malformed; the event was not built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("missing evidence: {0}")]
pub struct MissingEvidence(pub &'static str);

fn required(value: &str, what: &'static str) -> Result<String, MissingEvidence> {
    let v = value.trim();
    if v.is_empty() {
        Err(MissingEvidence(what))
    } else {
        Ok(v.to_owned())
    }
}

/// Who asked for a cancel and why. Required for `cancel_requested`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    actor: String,
    reason: String,
}

impl CancelRequest {
    /// A new request from a person or an agent: actor and reason bounded, printable text.
    pub fn new(actor: &str, reason: &str) -> Result<Self, TextError> {
        Ok(Self {
            actor: text::ACTOR.check(actor)?,
            reason: text::REASON.check(reason)?,
        })
    }
    /// A request already recorded on the operation's row, read back to act on: only present. (A
    /// bound added later must never drop a pending cancel.)
    pub fn recorded(actor: &str, reason: &str) -> Result<Self, MissingEvidence> {
        Ok(Self {
            actor: required(actor, "a cancel request needs an actor")?,
            reason: required(reason, "a cancel request needs a reason")?,
        })
    }
    pub fn actor(&self) -> &str {
        &self.actor
    }
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// A person's recorded decision: required actor and reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    actor: String,
    reason: String,
}

impl Decision {
    /// A person's decision: actor and reason bounded, printable text.
    pub fn new(actor: &str, reason: &str) -> Result<Self, TextError> {
        Ok(Self {
            actor: text::ACTOR.check(actor)?,
            reason: text::REASON.check(reason)?,
        })
    }
    pub fn actor(&self) -> &str {
        &self.actor
    }
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// The provider's own terminal cancel: its state name as it said it. Required for `cancelled`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelConfirmation {
    remote_state: String,
}

impl CancelConfirmation {
    /// `remote_state` is the provider's word for the state that the contract maps to cancelled.
    pub fn from_provider(remote_state: &str) -> Result<Self, MissingEvidence> {
        Ok(Self {
            remote_state: required(
                remote_state,
                "a cancel confirmation needs the provider's state",
            )?,
        })
    }
    pub fn remote_state(&self) -> &str {
        &self.remote_state
    }
}

/// A result that was fetched, checked against every rule of the contract, and stored. Required for
/// `succeeded`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidatedResult {
    location: String,
    size: u64,
    sha256: String,
    content_type: Option<String>,
    checks: Vec<String>,
    summary: serde_json::Value,
}

impl ValidatedResult {
    /// `checks` names every validation rule that passed (at least one: the integrity record itself).
    pub fn new(
        location: &str,
        size: u64,
        sha256: &str,
        content_type: Option<String>,
        checks: Vec<String>,
        summary: serde_json::Value,
    ) -> Result<Self, MissingEvidence> {
        let location = required(location, "a validated result needs a stored location")?;
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(MissingEvidence("a validated result needs a sha256 digest"));
        }
        if checks.is_empty() {
            return Err(MissingEvidence(
                "a validated result needs the checks it passed",
            ));
        }
        Ok(Self {
            location,
            size,
            sha256: sha256.to_ascii_lowercase(),
            content_type,
            checks,
            summary,
        })
    }
    pub fn location(&self) -> &str {
        &self.location
    }
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn sha256(&self) -> &str {
        &self.sha256
    }
    pub fn content_type(&self) -> Option<&str> {
        self.content_type.as_deref()
    }
    pub fn checks(&self) -> &[String] {
        &self.checks
    }
    pub fn summary(&self) -> &serde_json::Value {
        &self.summary
    }
}

/// Everything that can happen to an operation. Each variant carries its evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    // --- create ---------------------------------------------------------------------------------
    /// The provider definitively accepted the create and named the job.
    CreateAccepted {
        remote_job_id: String,
        remote_state: Option<String>,
    },
    /// The provider answered create with the finished result, synchronously.
    CreateCompleted { remote_job_id: Option<String> },
    /// Create was sent and the answer is unknown (timeout, reset, ambiguous status).
    CreateAmbiguous { error_class: String },
    /// The create deadline passed while no attempt can have created a job (each was never sent or
    /// refused without effect). `attempts`: how many were tried.
    CreateExpired { attempts: i32 },
    /// The provider definitively rejected the create.
    CreateRejected {
        http_status: Option<u16>,
        reason: String,
    },
    /// The worker starts reconciling an ambiguous create.
    ReconciliationStarted { method: String },
    /// A reconciliation attempt did not settle it; try again later.
    ReconciliationInconclusive { error_class: String },
    /// Reconciliation cannot settle it: a person must.
    ReconciliationExhausted { why: String },
    /// The same token came back with a different job id. Both are kept.
    ContractViolated {
        recorded_job_id: String,
        other_job_id: String,
    },
    /// The provider named, for this operation, a job another operation of the provider already
    /// holds (a provider that dedupes by body, a caching proxy, a lookup that ignored its filter):
    /// one remote job is never two operations' (the second caller would read the first's result,
    /// and could cancel its job). Kept as the conflicting answer; a person decides.
    JobHeldElsewhere {
        remote_job_id: String,
        held_by: String,
    },

    // --- observe --------------------------------------------------------------------------------
    /// A status read that is not terminal (queued, running, progress, or a state name we do not know).
    RemoteProgress { remote_state: String, known: bool },
    /// The provider says the job succeeded. Not `succeeded` yet: the result must be collected.
    RemoteSucceeded { remote_state: String },
    /// The provider says the job failed.
    RemoteFailed {
        remote_state: String,
        reason: Option<String>,
    },
    /// The provider says the job is cancelled, in answer to our cancel.
    RemoteCancelled(CancelConfirmation),
    /// The provider says the job is cancelled though nobody asked jobtrail to cancel it (cancelled
    /// in the provider's console, pre-empted, expired): the work was not done, and it is not the
    /// confirmation of a cancel of ours.
    RemoteCancelledUnasked { remote_state: String },
    /// A status or cancel call failed in a way worth retrying (counts against the retry budget).
    CallFailed { error_class: String },
    /// The result deadline passed before the job ended.
    ResultDeadlinePassed,
    /// The provider named a URL outside the contract's origins (sanitized here); nothing was sent.
    UrlRefused { url: String },
    /// Workers holding the operation were lost this many times in a row while collecting its
    /// result, none of them recording a step: the next one stops instead of trying again.
    ResultStalled { takeovers: i32 },
    /// Parsed to be checked, the result would take more memory than the worker gives all the
    /// results it checks at once (`room_bytes`): it is not parsed, and no worker tries again.
    ResultBeyondCheckMemory { room_bytes: u64 },
    /// The result was fetched and checked, but could not be kept where results are kept (a full
    /// or read-only result directory), attempt after attempt until the failure budget was spent:
    /// the job's result exists, and a person decides (room made, then resumed) rather than the
    /// operation ending as if the provider had failed it.
    ResultNotKept { why: String },
    /// The result kept when the create was answered synchronously cannot be read back by this
    /// worker (kept in another host's result directory, or its file gone): the provider will not
    /// send it again, so a person decides (the file restored where it was kept, then resumed)
    /// rather than the operation ending as if the result never existed.
    ResultNotReadable { why: String },
    /// Calls kept failing past the contract's retry budget.
    RetryBudgetExhausted { error_class: String, failures: i32 },

    // --- cancel ---------------------------------------------------------------------------------
    /// A recorded cancel request on an operation whose create may have reached the provider.
    CancelRequested(CancelRequest),
    /// A cancel request on an operation whose create was never sent: nothing to cancel remotely.
    Withdraw(CancelRequest),
    /// The one cancel call was sent (and not refused).
    CancelSent { http_status: Option<u16> },
    /// The cancel deadline passed without confirmation.
    CancelDeadlinePassed,

    // --- collect --------------------------------------------------------------------------------
    /// The result passed validation and is stored.
    ResultValidated(ValidatedResult),
    /// A result fetch failed in a way worth retrying.
    ResultFetchFailed { error_class: String },
    /// A download of the result URL the status named was refused; the status was read again for a
    /// fresh one (`fresh`: it named another).
    ResultUrlRenewed { fresh: bool },
    /// The result cannot be fetched.
    ResultUnavailable { why: String },
    /// The result failed validation.
    ResultInvalid { violations: Vec<String> },

    // --- people ---------------------------------------------------------------------------------
    /// A person found the remote job and adopts its id.
    AdoptRemoteJob {
        decision: Decision,
        remote_job_id: String,
    },
    /// A person established that the remote job was never created.
    DeclareNotCreated { decision: Decision },
    /// A person records the provider's confirmation of a cancel obtained out of band.
    ConfirmCancellation {
        decision: Decision,
        evidence: String,
    },
    /// A person resolves a contract violation by choosing which job id is ours.
    ChooseRemoteJob {
        decision: Decision,
        remote_job_id: String,
    },
    /// A person resumes automation (e.g. after extending a deadline).
    Resume { decision: Decision },
    /// A person stops tracking the operation.
    Abandon { decision: Decision },
    /// A person retried the operation as a new, linked operation.
    Superseded {
        decision: Decision,
        new_operation_id: String,
    },
}

macro_rules! event_kinds {
    ($($variant:ident = $name:literal),* $(,)?) => {
        /// The name of an event, without its evidence: the key of the transition table.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum EventKind { $($variant),* }

        impl EventKind {
            pub const ALL: &'static [EventKind] = &[$(EventKind::$variant),*];
            pub const fn as_str(self) -> &'static str {
                match self { $(EventKind::$variant => $name),* }
            }
        }

        impl std::str::FromStr for EventKind {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s { $($name => Ok(EventKind::$variant),)* other => Err(format!("unknown event {other:?}")) }
            }
        }
    };
}

event_kinds! {
    CreateAccepted = "create_accepted",
    CreateCompleted = "create_completed",
    CreateAmbiguous = "create_ambiguous",
    CreateRejected = "create_rejected",
    CreateExpired = "create_expired",
    ReconciliationStarted = "reconciliation_started",
    ReconciliationInconclusive = "reconciliation_inconclusive",
    ReconciliationExhausted = "reconciliation_exhausted",
    ContractViolated = "contract_violated",
    JobHeldElsewhere = "job_held_elsewhere",
    RemoteProgress = "remote_progress",
    RemoteSucceeded = "remote_succeeded",
    RemoteFailed = "remote_failed",
    RemoteCancelled = "remote_cancelled",
    RemoteCancelledUnasked = "remote_cancelled_unasked",
    CallFailed = "call_failed",
    ResultDeadlinePassed = "result_deadline_passed",
    UrlRefused = "url_refused",
    ResultStalled = "result_stalled",
    ResultBeyondCheckMemory = "result_beyond_check_memory",
    ResultNotKept = "result_not_kept",
    ResultNotReadable = "result_not_readable",
    RetryBudgetExhausted = "retry_budget_exhausted",
    CancelRequested = "cancel_requested",
    Withdraw = "withdraw",
    CancelSent = "cancel_sent",
    CancelDeadlinePassed = "cancel_deadline_passed",
    ResultValidated = "result_validated",
    ResultFetchFailed = "result_fetch_failed",
    ResultUrlRenewed = "result_url_renewed",
    ResultUnavailable = "result_unavailable",
    ResultInvalid = "result_invalid",
    AdoptRemoteJob = "adopt_remote_job",
    DeclareNotCreated = "declare_not_created",
    ConfirmCancellation = "confirm_cancellation",
    ChooseRemoteJob = "choose_remote_job",
    Resume = "resume",
    Abandon = "abandon",
    Superseded = "superseded",
}

impl EventKind {
    /// Events only a person's recorded decision produces.
    pub const fn is_decision(self) -> bool {
        matches!(
            self,
            EventKind::AdoptRemoteJob
                | EventKind::DeclareNotCreated
                | EventKind::ConfirmCancellation
                | EventKind::ChooseRemoteJob
                | EventKind::Resume
                | EventKind::Abandon
                | EventKind::Superseded
        )
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Event {
    /// The table key. Exhaustive: adding an event without deciding its kind does not compile.
    pub fn kind(&self) -> EventKind {
        match self {
            Event::CreateAccepted { .. } => EventKind::CreateAccepted,
            Event::CreateCompleted { .. } => EventKind::CreateCompleted,
            Event::CreateAmbiguous { .. } => EventKind::CreateAmbiguous,
            Event::CreateRejected { .. } => EventKind::CreateRejected,
            Event::CreateExpired { .. } => EventKind::CreateExpired,
            Event::ReconciliationStarted { .. } => EventKind::ReconciliationStarted,
            Event::ReconciliationInconclusive { .. } => EventKind::ReconciliationInconclusive,
            Event::ReconciliationExhausted { .. } => EventKind::ReconciliationExhausted,
            Event::ContractViolated { .. } => EventKind::ContractViolated,
            Event::JobHeldElsewhere { .. } => EventKind::JobHeldElsewhere,
            Event::RemoteProgress { .. } => EventKind::RemoteProgress,
            Event::RemoteSucceeded { .. } => EventKind::RemoteSucceeded,
            Event::RemoteFailed { .. } => EventKind::RemoteFailed,
            Event::RemoteCancelled(_) => EventKind::RemoteCancelled,
            Event::RemoteCancelledUnasked { .. } => EventKind::RemoteCancelledUnasked,
            Event::CallFailed { .. } => EventKind::CallFailed,
            Event::ResultDeadlinePassed => EventKind::ResultDeadlinePassed,
            Event::UrlRefused { .. } => EventKind::UrlRefused,
            Event::ResultStalled { .. } => EventKind::ResultStalled,
            Event::ResultBeyondCheckMemory { .. } => EventKind::ResultBeyondCheckMemory,
            Event::ResultNotKept { .. } => EventKind::ResultNotKept,
            Event::ResultNotReadable { .. } => EventKind::ResultNotReadable,
            Event::RetryBudgetExhausted { .. } => EventKind::RetryBudgetExhausted,
            Event::CancelRequested(_) => EventKind::CancelRequested,
            Event::Withdraw(_) => EventKind::Withdraw,
            Event::CancelSent { .. } => EventKind::CancelSent,
            Event::CancelDeadlinePassed => EventKind::CancelDeadlinePassed,
            Event::ResultValidated(_) => EventKind::ResultValidated,
            Event::ResultFetchFailed { .. } => EventKind::ResultFetchFailed,
            Event::ResultUrlRenewed { .. } => EventKind::ResultUrlRenewed,
            Event::ResultUnavailable { .. } => EventKind::ResultUnavailable,
            Event::ResultInvalid { .. } => EventKind::ResultInvalid,
            Event::AdoptRemoteJob { .. } => EventKind::AdoptRemoteJob,
            Event::DeclareNotCreated { .. } => EventKind::DeclareNotCreated,
            Event::ConfirmCancellation { .. } => EventKind::ConfirmCancellation,
            Event::ChooseRemoteJob { .. } => EventKind::ChooseRemoteJob,
            Event::Resume { .. } => EventKind::Resume,
            Event::Abandon { .. } => EventKind::Abandon,
            Event::Superseded { .. } => EventKind::Superseded,
        }
    }

    /// The remote job id this event establishes, if any.
    pub fn remote_job_id(&self) -> Option<&str> {
        match self {
            Event::CreateAccepted { remote_job_id, .. }
            | Event::AdoptRemoteJob { remote_job_id, .. }
            | Event::ChooseRemoteJob { remote_job_id, .. } => Some(remote_job_id),
            Event::CreateCompleted { remote_job_id } => remote_job_id.as_deref(),
            _ => None,
        }
    }

    /// A short human cause for the history row: the evidence in one line.
    pub fn cause(&self) -> String {
        match self {
            Event::CreateAccepted { remote_job_id, .. } => {
                format!("provider accepted create as {remote_job_id}")
            }
            Event::CreateCompleted { .. } => "provider answered create synchronously".into(),
            Event::CreateAmbiguous { error_class } => {
                format!("create outcome unknown: {error_class}")
            }
            Event::CreateRejected {
                http_status,
                reason,
            } => match http_status {
                Some(s) => format!("provider rejected create ({s}): {reason}"),
                None => format!("provider rejected create: {reason}"),
            },
            Event::CreateExpired { attempts: 0 } => "create deadline passed; never sent".into(),
            Event::CreateExpired { attempts } => format!(
                "create deadline passed; no remote job: each of the {attempts} attempts was never sent or refused without effect"
            ),
            Event::ReconciliationStarted { method } => format!("reconciling by {method}"),
            Event::ReconciliationInconclusive { error_class } => {
                format!("reconciliation inconclusive: {error_class}")
            }
            Event::ReconciliationExhausted { why } => format!("reconciliation exhausted: {why}"),
            Event::ContractViolated {
                recorded_job_id,
                other_job_id,
            } => {
                format!("same token answered with job {other_job_id}, recorded {recorded_job_id}")
            }
            // Not the holder's id: this cause is the operation's caller's to read, and the holder
            // may be another caller's (the link's detail names it for operators).
            Event::JobHeldElsewhere { remote_job_id, .. } => format!(
                "provider named job {remote_job_id}, which another operation already holds: one job is never two operations'"
            ),
            Event::RemoteProgress {
                remote_state,
                known: true,
            } => format!("provider reports {remote_state}"),
            Event::RemoteProgress {
                remote_state,
                known: false,
            } => {
                format!("provider reports unknown state {remote_state:?}")
            }
            Event::RemoteSucceeded { remote_state } => {
                format!("provider reports success ({remote_state})")
            }
            Event::RemoteFailed {
                remote_state,
                reason,
            } => match reason {
                Some(r) => format!("provider reports failure ({remote_state}): {r}"),
                None => format!("provider reports failure ({remote_state})"),
            },
            Event::RemoteCancelled(c) => format!("provider confirms cancel ({})", c.remote_state()),
            Event::RemoteCancelledUnasked { remote_state } => format!(
                "provider reports the job cancelled ({remote_state}) though nobody asked jobtrail to cancel it: the work was not done"
            ),
            Event::CallFailed { error_class } => format!("provider call failed: {error_class}"),
            Event::ResultDeadlinePassed => "result deadline passed".into(),
            Event::UrlRefused { url } => format!(
                "the provider named {url}, outside the origins its contract declares: nothing was sent there"
            ),
            Event::ResultStalled { takeovers } => format!(
                "{takeovers} workers in a row were lost while collecting the result, none recording a step (killed, by the memory limit say, or stalled past the lease): a person decides before another tries"
            ),
            Event::ResultBeyondCheckMemory { room_bytes } => format!(
                "checked, the result would take more than the {} MiB of memory the worker gives the results it checks (--check-mib): it holds too many small values; a person decides (a larger room, or the result taken some other way)",
                room_bytes >> 20
            ),
            Event::ResultNotReadable { why } => format!(
                "the result kept when the job answered at once cannot be read back here ({why}): a person restores it where it was kept and resumes, or abandons"
            ),
            Event::ResultNotKept { why } => format!(
                "the result could not be kept, attempt after attempt ({why}): a person makes room where results are kept and resumes it"
            ),
            Event::RetryBudgetExhausted {
                error_class,
                failures,
            } => {
                format!("retry budget exhausted after {failures} failures (last: {error_class})")
            }
            Event::CancelRequested(r) | Event::Withdraw(r) => {
                format!("cancel requested by {}: {}", r.actor(), r.reason())
            }
            Event::CancelSent { http_status } => match http_status {
                Some(s) => format!("cancel call sent ({s})"),
                None => "cancel call sent".into(),
            },
            Event::CancelDeadlinePassed => "cancel deadline passed without confirmation".into(),
            Event::ResultValidated(r) => {
                format!("result validated and stored ({} bytes)", r.size())
            }
            Event::ResultFetchFailed { error_class } => {
                format!("result fetch failed: {error_class}")
            }
            Event::ResultUrlRenewed { fresh: true } => {
                "result URL refused; the status named a fresh one".into()
            }
            Event::ResultUrlRenewed { fresh: false } => {
                "result URL refused; the status named the same one again".into()
            }
            Event::ResultUnavailable { why } => format!("result unavailable: {why}"),
            Event::ResultInvalid { violations } => {
                format!("result invalid: {}", violations.join("; "))
            }
            Event::AdoptRemoteJob {
                decision,
                remote_job_id,
            } => {
                format!(
                    "{} adopted {remote_job_id}: {}",
                    decision.actor(),
                    decision.reason()
                )
            }
            Event::DeclareNotCreated { decision } => {
                format!(
                    "{} declared never created: {}",
                    decision.actor(),
                    decision.reason()
                )
            }
            Event::ConfirmCancellation { decision, evidence } => {
                format!(
                    "{} confirmed cancel ({evidence}): {}",
                    decision.actor(),
                    decision.reason()
                )
            }
            Event::ChooseRemoteJob {
                decision,
                remote_job_id,
            } => {
                format!(
                    "{} chose {remote_job_id}: {}",
                    decision.actor(),
                    decision.reason()
                )
            }
            Event::Resume { decision } => {
                format!("{} resumed: {}", decision.actor(), decision.reason())
            }
            Event::Abandon { decision } => {
                format!("{} abandoned: {}", decision.actor(), decision.reason())
            }
            Event::Superseded {
                decision,
                new_operation_id,
            } => {
                format!(
                    "{} retried as {new_operation_id}: {}",
                    decision.actor(),
                    decision.reason()
                )
            }
        }
    }
}
