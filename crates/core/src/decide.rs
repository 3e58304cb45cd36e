//! What the worker does next, and what each answer means: the step decisions, as pure functions.
//!
//! The worker is the I/O shell around this module (sans-IO, as in quinn-proto): it asks [`next`]
//! what to do for the operation it holds a lease on, makes the one call that names (if any), turns
//! the answer into a closed outcome ([`crate::outcome`]), and asks the matching `after_*` function
//! which [`Step`] to write. Every function here takes the locked record, the outcome, the current
//! time and a random draw in `[0, 1)` for jitter, and returns a [`Plan`]: no I/O, no clock, no
//! randomness, so every (state, outcome) pair is a table test (`crates/core/tests/decide.rs`).
//!
//! **One clock.** `now` is the database's clock: the worker carries the claim's `now()` forward with
//! its monotonic clock from the moment the claim's answer arrived, so it runs at most one claim
//! round trip behind the database. Deadlines are therefore noticed at most that late and never early,
//! and a delay computed here is applied by the store from the database's `now()` at write time, which
//! is never earlier: a provider's `Retry-After` is never cut short.
//!
//! **Truth about creates.** An attempt counts as *definitively not created* only when nothing left
//! (connection refused, a secret missing, the lease too short to send) or the provider answered "not
//! now" (429, 503 with `Retry-After`). Everything else that may have reached the provider leaves
//! `create_pending`. While in `create_pending`, the only thing that can make a job exist unseen is a
//! send in flight, which the claim marks durably before any byte leaves
//! ([`OperationRecord::create_sent_epoch`]): so `withdrawn` and `not_created` are decided only when no
//! other lease's mark is set.

use crate::event::{CancelConfirmation, CancelRequest, Event, ValidatedResult};
use crate::outcome::{
    Called, CancelOutcome, CreateOutcome, FetchedResult, LookupOutcome, Phase, ReconcileMethod,
    StatusOutcome,
};
use crate::record::{CallRecord, OperationRecord};
use crate::schedule::{Backoff, NextReason, RetryAfterBounds, next_poll};
use crate::state::State;
use crate::step::{Counters, FailureCount, Observation, ResultBytes, SendMark, Step};
use chrono::{DateTime, Utc};
use std::time::Duration;

/// The margin a worker keeps between the end of a call and the end of its lease: it extends the
/// lease to at least one call plus this before sending, and a contract's create window must hold as
/// much (so a worker that died mid-create can be taken over with time left to reconcile).
pub const LEASE_MARGIN: Duration = Duration::from_secs(2);

/// Holders lost in a row while collecting a result, none recording a step, after which the next
/// one holds the operation for a person (`result_stalled`) instead of trying again. One loss is a
/// deploy or a node going away; three in a row on the same operation is the operation.
pub const STALLED_AFTER_TAKEOVERS: i32 = 3;

/// What a provider's contract says about scheduling, reconciliation and cancel: everything the
/// decisions need from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub backoff: Backoff,
    pub retry_after: RetryAfterBounds,
    /// Status or result reads that may fail in a row before a person is asked.
    pub max_failures: u32,
    pub reconcile: ReconcileMethod,
    /// The contract can look a job up by our client reference.
    pub lookup: bool,
    pub reconcile_interval: Duration,
    /// Cancel may be sent again (up to three times) after a failed attempt.
    pub cancel_idempotent: bool,
    /// Read the created resource once after remote success.
    pub final_get: bool,
    /// The contract says the job has no result (a DELETE, a POST answered without a body): the
    /// provider's success is the outcome, and nothing is fetched.
    pub no_result: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            backoff: Backoff::default(),
            retry_after: RetryAfterBounds::default(),
            max_failures: 8,
            reconcile: ReconcileMethod::None,
            lookup: false,
            reconcile_interval: Duration::from_secs(2),
            cancel_idempotent: false,
            final_get: false,
            no_result: false,
        }
    }
}

/// One step's decision: what to write, and whether to go on at once under the same lease.
#[derive(Debug, Clone)]
pub struct Plan {
    pub step: Step,
    /// Continue at once under the same lease (the next step is due now).
    pub go_on: bool,
    /// The worker attaches the evidence bundle (every call so far) to the step's detail.
    pub evidence_bundle: bool,
    /// A step to write before this one: a call that needs its own row in the call log.
    pub first: Option<Step>,
}

impl Plan {
    /// Its steps in the order they are written: `first`, if any, then `step`.
    pub fn steps(&self) -> impl Iterator<Item = &Step> {
        self.first.iter().chain(std::iter::once(&self.step))
    }

    fn write(step: Step) -> Self {
        Self {
            step,
            go_on: false,
            evidence_bundle: false,
            first: None,
        }
    }
    fn then_continue(mut self) -> Self {
        self.step.keep_lease = true;
        self.go_on = true;
        self
    }
}

/// The provider's fleet-wide call rate has no room for `call` for `wait`: nothing is sent; the
/// operation is due again then, and gives its slot back meanwhile. A create's "may have been sent"
/// mark, which the claim set for this epoch, is cleared: provably nothing left.
pub fn deferred(call: &Call, wait: Duration) -> Plan {
    deferred_for(call, wait, "provider call rate")
}

/// [`deferred`], for `why` (the worker's own room for a result's bytes was full, say).
pub fn deferred_for(call: &Call, wait: Duration, why: &'static str) -> Plan {
    Plan::write(Step {
        next_in: Some((wait, why)),
        send_mark: match call {
            Call::Create { .. } => SendMark::Clear,
            _ => SendMark::Keep,
        },
        ..Step::default()
    })
}

/// What to do with the operation now.
#[derive(Debug, Clone)]
pub enum Action {
    /// Write this without calling anyone.
    Write(Box<Plan>),
    /// Make this call, then ask the matching `after_*` function.
    Call(Call),
}

/// The one call to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Send create. `mark`: this lease has not marked the send yet; write the mark first.
    Create {
        attempt: i32,
        mark: bool,
    },
    /// Look the job up by our client reference (the reconciliation, or the cross-check before a
    /// resend); then [`after_lookup`].
    Lookup {
        attempt: i32,
    },
    /// Reconcile by sending create again with the same token; then [`after_resend`].
    Resend {
        attempt: i32,
    },
    Status {
        attempt: i32,
    },
    Cancel {
        attempt: i32,
    },
    /// Read the created resource once after remote success; then [`after_final_get`].
    FinalGet {
        attempt: i32,
    },
    FetchResult {
        attempt: i32,
    },
    /// Nothing to fetch by contract: record the empty result as the contract's rules judge it (no
    /// call is made); then [`after_collect`].
    NoResult,
    /// Read back and validate the result kept when create answered synchronously; then
    /// [`after_collect`].
    SyncResult {
        location: String,
        sha256: String,
        content_type: Option<String>,
    },
}

fn until(deadline: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (deadline - now).to_std().unwrap_or(Duration::ZERO)
}

/// The pending cancel request, if one was recorded and not yet acted on as a state.
fn pending_cancel(op: &OperationRecord) -> Option<CancelRequest> {
    if !op.has_pending_cancel() {
        return None;
    }
    CancelRequest::recorded(
        op.cancel_requested_by.as_deref()?,
        op.cancel_reason.as_deref()?,
    )
    .ok()
}

/// Delay before the next status read: at least `d`, and never before the provider's last
/// `Retry-After` of this job.
fn poll_delay(op: &OperationRecord, d: Duration, now: DateTime<Utc>) -> (Duration, bool) {
    match op.poll_not_before {
        Some(nb) if until(nb, now) > d => (until(nb, now), true),
        _ => (d, false),
    }
}

/// The provider's `Retry-After` or backoff for `attempt`, and why.
fn wait(
    policy: &Policy,
    retry_after: Option<Duration>,
    attempt: i32,
    draw: f64,
) -> (Duration, &'static str) {
    let (d, why) = next_poll(
        retry_after,
        &policy.retry_after,
        &policy.backoff,
        attempt.max(0) as u32,
        draw,
    );
    (d, why.as_str())
}

/// A call that failed or was deferred: tried again after `delay`, one more failure counted.
fn failed_call(error_class: String, (delay, why): (Duration, &'static str)) -> Step {
    Step {
        counters: Counters {
            failures: FailureCount::Increment,
            ..Counters::default()
        },
        ..Step::event(Event::CallFailed { error_class }).next_in(delay, why)
    }
}

/// Attach the call and the provider context it left (cookies, result hints) to a step.
fn with_call(mut step: Step, call: CallRecord, context: Option<serde_json::Value>) -> Step {
    step.call = Some(call);
    if context.is_some() {
        let mut obs = step.observation.take().unwrap_or_default();
        obs.provider_context = context;
        step.observation = Some(obs);
    }
    step
}

/// `cancellation_unconfirmed`; the worker attaches the evidence bundle.
fn unconfirmed() -> Plan {
    Plan {
        evidence_bundle: true,
        ..Plan::write(Step::event(Event::CancelDeadlinePassed))
    }
}

fn act(plan: Plan) -> Action {
    Action::Write(Box::new(plan))
}

/// What to do with `op`, held under the lease of `own_epoch`, at `now`.
pub fn next(op: &OperationRecord, policy: &Policy, own_epoch: i64, now: DateTime<Utc>) -> Action {
    match op.state {
        State::CreatePending => next_create(op, own_epoch, now),
        State::CreateUnknown => {
            if policy.reconcile == ReconcileMethod::None {
                return act(Plan::write(Step::event(Event::ReconciliationExhausted {
                    why: "the provider offers no reconciliation: a person must find out whether the job exists".into(),
                })));
            }
            act(Plan::write(Step::event(Event::ReconciliationStarted {
                method: policy.reconcile.as_str().into(),
            }))
            .then_continue())
        }
        State::Reconciliation => {
            // At least one reconciliation call before a person is asked, even past the deadline: a
            // worker that took over late must still try what the contract offers.
            if now >= op.create_deadline
                && (op.reconcile_attempts > 0 || policy.reconcile == ReconcileMethod::None)
            {
                return act(Plan::write(Step::event(Event::ReconciliationExhausted {
                    why: format!(
                        "create deadline passed after {} create attempts and {} reconciliation calls; the remote job may or may not exist",
                        op.create_attempts, op.reconcile_attempts
                    ),
                })));
            }
            let attempt = op.reconcile_attempts + 1;
            match policy.reconcile {
                ReconcileMethod::Lookup => Action::Call(Call::Lookup { attempt }),
                ReconcileMethod::Resend if policy.lookup => Action::Call(Call::Lookup { attempt }),
                ReconcileMethod::Resend => Action::Call(Call::Resend {
                    attempt: op.create_attempts + 1,
                }),
                ReconcileMethod::None => {
                    act(Plan::write(Step::event(Event::ReconciliationExhausted {
                        why: "the provider offers no reconciliation".into(),
                    })))
                }
            }
        }
        State::Accepted | State::Observing => {
            // A cancel noted earlier (while the create was unsettled) goes first: past the result
            // deadline too, the job must be asked to stop, not left running for a person.
            if let Some(req) = pending_cancel(op) {
                return act(Plan::write(Step::event(Event::CancelRequested(req))).then_continue());
            }
            if now >= op.result_deadline {
                return act(Plan::write(Step::event(Event::ResultDeadlinePassed)));
            }
            next_status(op, now)
        }
        State::CancelRequested => {
            // At least one cancel call before a person is asked, even past the window: a step
            // decided before the cancel arrived, or a fleet-wide pause, may have held the
            // operation past it, and "unconfirmed" must mean the provider was asked.
            if op.cancel_deadline.is_some_and(|d| now >= d) && op.cancel_attempts > 0 {
                return act(unconfirmed());
            }
            // One cancel call; again only where the contract says cancel is idempotent.
            if op.cancel_attempts == 0
                || (policy.cancel_idempotent && op.cancel_attempts < 3 && op.failure_count > 0)
            {
                Action::Call(Call::Cancel {
                    attempt: op.cancel_attempts + 1,
                })
            } else {
                next_status(op, now)
            }
        }
        State::Cancelling => {
            if op.cancel_deadline.is_some_and(|d| now >= d) {
                return act(unconfirmed());
            }
            next_status(op, now)
        }
        State::ResultCollecting => {
            // A result can stop the worker collecting it (parsed for its check, a pathological one
            // takes many times its size in memory): the next holder would die the same way, and
            // no attempt is ever counted. Lost holders are, and this many stop it for a person.
            if op.takeovers >= STALLED_AFTER_TAKEOVERS {
                return act(Plan::write(Step::event(Event::ResultStalled {
                    takeovers: op.takeovers,
                })));
            }
            if let Some(sync) = op
                .provider_context
                .get("sync_result")
                .filter(|v| v.is_object())
            {
                return Action::Call(Call::SyncResult {
                    location: sync["location"].as_str().unwrap_or_default().to_owned(),
                    sha256: sync["sha256"].as_str().unwrap_or_default().to_owned(),
                    content_type: sync["content_type"].as_str().map(str::to_owned),
                });
            }
            if policy.final_get && op.provider_context.get("final_get_done").is_none() {
                return Action::Call(Call::FinalGet {
                    attempt: op.poll_count + 1,
                });
            }
            if policy.no_result {
                return Action::Call(Call::NoResult);
            }
            Action::Call(Call::FetchResult {
                attempt: op.result_attempts + 1,
            })
        }
        // Held and terminal states are never claimed; if one is, give it back untouched.
        State::CreateUnresolved
        | State::ContractViolation
        | State::CancellationUnconfirmed
        | State::ResultTimedOut
        | State::UrlRefused
        | State::ResultStalled
        | State::Succeeded
        | State::Failed
        | State::Cancelled
        | State::ResultUnavailable
        | State::ResultValidationFailed
        | State::Withdrawn
        | State::NotCreated
        | State::Abandoned => act(Plan::write(Step::default())),
    }
}

fn next_create(op: &OperationRecord, own_epoch: i64, now: DateTime<Utc>) -> Action {
    // Another lease marked a send whose outcome was never recorded (its worker died or stalled
    // mid-call): the job may exist. That is an ambiguous create, never a reason to withdraw, expire
    // or send blindly again.
    if op.create_send_unrecorded(own_epoch) {
        return act(Plan::write(Step {
            send_mark: SendMark::Clear,
            // The unrecorded attempt counts: it may have reached the provider.
            counters: Counters {
                create_attempts: 1,
                ..Counters::default()
            },
            ..Step::event(Event::CreateAmbiguous {
                error_class:
                    "a previous send's outcome was never recorded (its worker stopped mid-call)"
                        .into(),
            })
        })
        .then_continue());
    }
    // Every attempt so far was definitively not created and none is in flight: nothing exists.
    if let Some(req) = pending_cancel(op) {
        return act(Plan::write(Step {
            send_mark: SendMark::Clear,
            ..Step::event(Event::Withdraw(req))
        }));
    }
    if now >= op.create_deadline {
        return act(Plan::write(Step {
            send_mark: SendMark::Clear,
            ..Step::event(Event::CreateExpired {
                attempts: op.create_attempts,
            })
        }));
    }
    Action::Call(Call::Create {
        attempt: op.create_attempts + 1,
        mark: op.create_sent_epoch != Some(own_epoch),
    })
}

fn next_status(op: &OperationRecord, now: DateTime<Utc>) -> Action {
    // The provider's last Retry-After outlives everything else (a takeover, a cancel, a person's
    // resume): wait for it without calling.
    if let Some(nb) = op.poll_not_before
        && now < nb
    {
        return act(Plan::write(
            Step::default().next_in(until(nb, now), NextReason::RetryAfter.as_str()),
        ));
    }
    Action::Call(Call::Status {
        attempt: op.poll_count + 1,
    })
}

/// The step for a create's outcome. `kept`: for a synchronous answer, where its bytes were kept
/// (or why they could not be) and whether they passed the contract's rules.
pub fn after_create(
    op: &OperationRecord,
    policy: &Policy,
    called: Called<CreateOutcome>,
    kept: Option<Result<Kept, String>>,
    now: DateTime<Utc>,
    draw: f64,
) -> Plan {
    let Called {
        outcome,
        call,
        context,
    } = called;
    let counters = Counters {
        create_attempts: 1,
        ..Counters::default()
    };
    let mut context = context;
    let mut plan = match outcome {
        CreateOutcome::Accepted {
            job_id,
            remote_state,
            status_url,
            retry_after,
            ..
        } => accepted_unless_another(
            op.remote_job_id.clone().filter(|p| *p != job_id),
            job_id,
            (remote_state, status_url),
            retry_after.map(|d| policy.retry_after.clamp(d)),
        ),
        CreateOutcome::Completed { job_id, result } => match kept {
            Some(Ok(k)) => completed(op, job_id, &result, k, &mut context),
            // The job is done but its answer could not be kept: what we know is "created, result not
            // held", which reconciliation settles.
            _ => Plan::write(
                Step::event(Event::CreateAmbiguous {
                    error_class: "result_store_unavailable".into(),
                })
                .next_in(policy.reconcile_interval, "reconcile"),
            ),
        },
        CreateOutcome::Rejected {
            http_status,
            reason,
        } => Plan::write(Step::event(Event::CreateRejected {
            http_status,
            reason,
        })),
        CreateOutcome::Ambiguous { error_class } => Plan::write(
            Step::event(Event::CreateAmbiguous { error_class })
                .next_in(policy.reconcile_interval, "reconcile"),
        ),
        // Deferred by an answer that may have followed the job's creation: reconciled (the resend
        // carries the token), after the provider's Retry-After; never withdrawn, expired or
        // failed as if nothing had been made.
        CreateOutcome::RetryLater {
            delay,
            reason: _,
            maybe_processed: true,
        } => {
            let wait = delay
                .map(|d| policy.retry_after.clamp(d))
                .unwrap_or_default()
                .max(policy.reconcile_interval);
            Plan::write(
                Step::event(Event::CreateAmbiguous {
                    error_class: "deferred_maybe_processed".into(),
                })
                .next_in(
                    wait.min(until(op.create_deadline, now)),
                    NextReason::RetryAfter.as_str(),
                ),
            )
        }
        CreateOutcome::RetryLater {
            delay,
            reason,
            maybe_processed: false,
        } => not_created(
            op,
            policy,
            format!("create deferred: {reason}"),
            delay,
            now,
            draw,
        ),
        CreateOutcome::NotSent { error_class } => not_created(
            op,
            policy,
            format!("create not sent: {error_class}"),
            None,
            now,
            draw,
        ),
    };
    plan.step.counters.create_attempts += counters.create_attempts;
    plan.step.send_mark = SendMark::Clear;
    plan.step = with_call(plan.step, call, context);
    plan
}

/// A synchronous answer whose bytes were kept: the job is done, on to validating its result. The
/// kept bytes' place and verdict go into the provider context, their digest into the step's chained
/// detail.
fn completed(
    op: &OperationRecord,
    job_id: Option<String>,
    result: &FetchedResult,
    k: Kept,
    context: &mut Option<serde_json::Value>,
) -> Plan {
    let mut ctx = context
        .take()
        .unwrap_or_else(|| op.provider_context.clone());
    if !ctx.is_object() {
        ctx = serde_json::json!({});
    }
    ctx["sync_result"] = serde_json::json!({
        "location": k.location, "size": k.size, "sha256": k.sha256,
        "content_type": result.content_type,
    });
    *context = Some(ctx);
    Plan::write(Step {
        // The kept bytes' digest is chained with the step that stores them.
        detail: Some(serde_json::json!({
            "sync_result": {"location": k.location, "sha256": k.sha256},
        })),
        result_bytes: k.bytes,
        ..Step::event(Event::CreateCompleted {
            remote_job_id: job_id,
        })
    })
    .then_continue()
}

/// The provider named the job: accepted, and on at once to the first status read (not before the
/// answer's `Retry-After`, clamped) — unless another job is already known for this token, which is
/// a contract violation (both answers kept).
fn accepted_unless_another(
    other: Option<String>,
    job_id: String,
    (remote_state, status_url): (Option<String>, Option<String>),
    retry_after: Option<Duration>,
) -> Plan {
    match other {
        Some(other) => Plan::write(Step::event(Event::ContractViolated {
            recorded_job_id: other,
            other_job_id: job_id,
        })),
        None => Plan::write(Step {
            observation: Some(Observation {
                remote_state: remote_state.clone(),
                status_url,
                ..Observation::default()
            }),
            retry_after,
            ..Step::event(Event::CreateAccepted {
                remote_job_id: job_id,
                remote_state,
            })
        })
        .then_continue(),
    }
}

/// An attempt that definitively created nothing: withdraw if a cancel is waiting (item: a cancel
/// during create retries never sends again), else try again after Retry-After or backoff.
fn not_created(
    op: &OperationRecord,
    policy: &Policy,
    error_class: String,
    delay: Option<Duration>,
    now: DateTime<Utc>,
    draw: f64,
) -> Plan {
    if let Some(req) = pending_cancel(op) {
        return Plan::write(Step::event(Event::Withdraw(req)));
    }
    let (d, why) = wait(policy, delay, op.failure_count, draw);
    Plan::write(failed_call(
        error_class,
        (d.min(until(op.create_deadline, now)), why),
    ))
}

/// What a lookup by client reference settles.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // a short-lived value, moved once
pub enum AfterLookup {
    Write(Plan),
    /// The contract reconciles by resend: send create again with the same token, then
    /// [`after_resend`] with what the lookup found (`None`: the lookup failed).
    Resend {
        looked_up: Option<Vec<String>>,
        lookup_call: CallRecord,
        context: Option<serde_json::Value>,
    },
}

fn inconclusive(op: &OperationRecord, policy: &Policy, class: String, now: DateTime<Utc>) -> Step {
    Step {
        counters: Counters {
            reconcile_attempts: 1,
            ..Counters::default()
        },
        ..Step::event(Event::ReconciliationInconclusive { error_class: class }).next_in(
            policy
                .reconcile_interval
                .min(until(op.create_deadline, now)),
            "reconcile",
        )
    }
}

/// A lookup the provider answered "not now": inconclusive, no failure counted, and the next
/// reconciliation call (a lookup or a resend) waits for the provider's `Retry-After` when that is
/// longer than the reconcile interval.
fn not_now(
    op: &OperationRecord,
    policy: &Policy,
    delay: Option<Duration>,
    reason: String,
    now: DateTime<Utc>,
) -> Step {
    let retry_after = delay.map(|d| policy.retry_after.clamp(d));
    let mut step = inconclusive(op, policy, format!("retry later: {reason}"), now);
    if let Some(d) = retry_after.filter(|d| *d > policy.reconcile_interval) {
        step = step.next_in(d.min(until(op.create_deadline, now)), "retry_after");
    }
    step.retry_after = retry_after;
    step
}

/// The step for a lookup by client reference (state `reconciliation`).
pub fn after_lookup(
    op: &OperationRecord,
    policy: &Policy,
    called: Called<LookupOutcome>,
    now: DateTime<Utc>,
) -> AfterLookup {
    let Called {
        outcome,
        call,
        context,
    } = called;
    let reconcile = Counters {
        reconcile_attempts: 1,
        ..Counters::default()
    };
    if let LookupOutcome::Found { job_ids } = &outcome
        && job_ids.len() > 1
    {
        let step = Step {
            counters: reconcile,
            detail: Some(serde_json::json!({"jobs_for_our_reference": job_ids})),
            ..Step::event(Event::ContractViolated {
                recorded_job_id: job_ids[0].clone(),
                other_job_id: job_ids[1].clone(),
            })
        };
        return AfterLookup::Write(Plan::write(with_call(step, call, context)));
    }
    if policy.reconcile != ReconcileMethod::Lookup {
        let looked_up = match outcome {
            LookupOutcome::Found { job_ids } => Some(job_ids),
            LookupOutcome::NotFound => Some(Vec::new()),
            LookupOutcome::Failed { .. } => None,
            // No cross-checked resend into a provider that said "not now".
            LookupOutcome::RetryLater { delay, reason } => {
                let step = not_now(op, policy, delay, reason, now);
                return AfterLookup::Write(Plan::write(with_call(step, call, context)));
            }
        };
        return AfterLookup::Resend {
            looked_up,
            lookup_call: call,
            context,
        };
    }
    let plan = match outcome {
        LookupOutcome::Found { mut job_ids } => match job_ids.pop() {
            Some(job) => Plan::write(Step {
                counters: reconcile,
                ..Step::event(Event::CreateAccepted {
                    remote_job_id: job,
                    remote_state: None,
                })
            })
            .then_continue(),
            None => Plan::write(inconclusive(
                op,
                policy,
                "not found by client reference (yet)".into(),
                now,
            )),
        },
        LookupOutcome::NotFound => Plan::write(inconclusive(
            op,
            policy,
            "not found by client reference (yet)".into(),
            now,
        )),
        LookupOutcome::RetryLater { delay, reason } => {
            Plan::write(not_now(op, policy, delay, reason, now))
        }
        LookupOutcome::Failed { error_class } => Plan::write(Step {
            counters: Counters {
                failures: FailureCount::Increment,
                reconcile_attempts: 1,
                ..Counters::default()
            },
            ..inconclusive(op, policy, error_class, now)
        }),
    };
    AfterLookup::Write(Plan {
        step: with_call(plan.step, call, context),
        ..plan
    })
}

/// The step for a resend with the same token (state `reconciliation`). `looked_up`: the jobs a
/// lookup by client reference found just before (a cross-check), `None` if none was made or it
/// failed; `lookup`: that lookup's call, logged on its own row first; `kept`: as for
/// [`after_create`].
///
/// A resend's refusal settles nothing about the first send, which may have created the job (a
/// provider refuses a replay while the original is in progress, or a body whose secret rotated since):
/// the job the lookup found is taken (as it is after any answer short of naming a job), a 409 or
/// 425 is tried again, and anything else goes to a person.
/// It is never recorded as the create's rejection (`failed`), which would leave a job running that
/// nobody watches, and which a retry would duplicate.
pub fn after_resend(
    op: &OperationRecord,
    policy: &Policy,
    called: Called<CreateOutcome>,
    lookup: Option<(Option<Vec<String>>, CallRecord, Option<serde_json::Value>)>,
    kept: Option<Result<Kept, String>>,
    now: DateTime<Utc>,
) -> Plan {
    let Called {
        outcome,
        call,
        mut context,
    } = called;
    let (looked_up, first, detail) = match lookup {
        Some((ids, c, ctx)) => {
            let detail = serde_json::json!({"lookup": {"call_id": c.id, "outcome": c.outcome}});
            let first = with_call(
                Step {
                    keep_lease: true,
                    ..Step::default()
                },
                c,
                ctx,
            );
            (ids, Some(first), Some(detail))
        }
        None => (None, None, None),
    };
    // The one job a lookup found for our reference is ours whatever the resend answered short of
    // naming a job (a refusal, "not now", no answer): the resend only cross-checks it.
    let found = match looked_up.as_deref() {
        Some([job]) => Some(job.clone()),
        _ => None,
    };
    let mut plan = match (outcome, found) {
        (
            CreateOutcome::Accepted {
                job_id,
                remote_state,
                status_url,
                retry_after,
                ..
            },
            _,
        ) => {
            let other = looked_up
                .as_ref()
                .and_then(|ids| ids.iter().find(|i| **i != job_id).cloned())
                .or_else(|| op.remote_job_id.clone().filter(|p| *p != job_id));
            accepted_unless_another(
                other,
                job_id,
                (remote_state, status_url),
                retry_after.map(|d| policy.retry_after.clamp(d)),
            )
        }
        (CreateOutcome::Completed { job_id, result }, found) => {
            let job_id = job_id.or(found);
            let other = job_id.as_ref().and_then(|j| {
                looked_up
                    .as_ref()
                    .and_then(|ids| ids.iter().find(|i| *i != j).cloned())
                    .or_else(|| op.remote_job_id.clone().filter(|p| p != j))
            });
            match (other, job_id, kept) {
                (Some(other), Some(job_id), _) => {
                    Plan::write(Step::event(Event::ContractViolated {
                        recorded_job_id: other,
                        other_job_id: job_id,
                    }))
                }
                (None, job_id, Some(Ok(k))) => completed(op, job_id, &result, k, &mut context),
                _ => Plan::write(inconclusive(
                    op,
                    policy,
                    "the resend answered with the result, which could not be kept".into(),
                    now,
                )),
            }
        }
        // A resend that may have reached the provider is not settled by the lookup made before it:
        // the next round's lookup cross-checks it (two jobs for our reference is a violation).
        (CreateOutcome::Ambiguous { error_class }, _) => {
            Plan::write(inconclusive(op, policy, error_class, now))
        }
        (_, Some(job)) => accepted_unless_another(
            op.remote_job_id.clone().filter(|p| *p != job),
            job,
            (None, None),
            None,
        ),
        (
            CreateOutcome::Rejected {
                http_status,
                reason,
            },
            None,
        ) => {
            if matches!(http_status, Some(409 | 425)) {
                Plan::write(inconclusive(
                    op,
                    policy,
                    format!("the resend was refused for now: {reason}"),
                    now,
                ))
            } else {
                Plan::write(Step::event(Event::ReconciliationExhausted {
                    why: format!(
                        "the resend was refused ({}: {reason}); a refused resend does not say whether the first send created a job",
                        http_status.map_or("no status".to_owned(), |s| format!("HTTP {s}"))
                    ),
                }))
            }
        }
        (CreateOutcome::NotSent { error_class }, None) => {
            Plan::write(inconclusive(op, policy, error_class, now))
        }
        // "Not now": the next attempt waits for the provider's Retry-After (clamped) if it is
        // longer than the contract's interval, within the create deadline.
        (CreateOutcome::RetryLater { reason, delay, .. }, None) => {
            let mut step = inconclusive(op, policy, format!("retry later: {reason}"), now);
            if let Some(d) = delay.map(|d| policy.retry_after.clamp(d))
                && d > policy.reconcile_interval
            {
                step.next_in = Some((
                    d.min(until(op.create_deadline, now)),
                    NextReason::RetryAfter.as_str(),
                ));
            }
            Plan::write(step)
        }
    };
    plan.step.counters.create_attempts = 1;
    plan.step.counters.reconcile_attempts = 1;
    // The lookup's call joins the step's own detail (a kept result's digest stays chained).
    if let Some(lookup) = detail {
        plan.step.detail = Some(match plan.step.detail.take() {
            Some(mut own) if own.is_object() => {
                own["lookup"] = lookup["lookup"].clone();
                own
            }
            _ => lookup,
        });
    }
    plan.step = with_call(plan.step, call, context);
    plan.first = first;
    plan
}

/// The step for a status read (states `accepted`, `observing`, `cancel_requested`, `cancelling`).
pub fn after_status(
    op: &OperationRecord,
    policy: &Policy,
    called: Called<StatusOutcome>,
    now: DateTime<Utc>,
    draw: f64,
) -> Plan {
    let Called {
        outcome,
        call,
        context,
    } = called;
    let cancel_phase = matches!(op.state, State::CancelRequested | State::Cancelling);
    let deadline = if cancel_phase {
        op.cancel_deadline.unwrap_or(op.result_deadline)
    } else {
        op.result_deadline
    };
    // Every read counts, whatever it said: attempts are numbered truthfully and backoff grows.
    let polls = Counters {
        polls: 1,
        ..Counters::default()
    };
    let mut retry_after = None;
    let plan = match outcome {
        StatusOutcome::Observed(s) => {
            let obs = Observation::of(&s);
            retry_after = s.retry_after.map(|d| policy.retry_after.clamp(d));
            let counters = Counters {
                failures: FailureCount::Reset,
                ..polls
            };
            let step = |ev: Event| Step {
                counters,
                observation: Some(obs.clone()),
                ..Step::event(ev)
            };
            match s.phase {
                Some(Phase::Succeeded) => plan_go_on(step(Event::RemoteSucceeded {
                    remote_state: s.remote_state,
                })),
                Some(Phase::Failed) => Plan::write(step(Event::RemoteFailed {
                    remote_state: s.remote_state,
                    reason: s.error,
                })),
                // A cancel nobody here asked for is not the confirmation of ours.
                Some(Phase::Cancelled) if !cancel_phase => {
                    Plan::write(step(Event::RemoteCancelledUnasked {
                        remote_state: s.remote_state,
                    }))
                }
                Some(Phase::Cancelled) => {
                    match CancelConfirmation::from_provider(&s.remote_state) {
                        Ok(c) => Plan::write(step(Event::RemoteCancelled(c))),
                        Err(_) => Plan::write(step(Event::CallFailed {
                            error_class: "empty cancelled state".into(),
                        })),
                    }
                }
                Some(Phase::Queued | Phase::Running) | None => {
                    let (d, why) = wait(policy, s.retry_after, op.poll_count, draw);
                    let (d, why) = capped(d, why, deadline, now);
                    Plan::write(
                        step(Event::RemoteProgress {
                            remote_state: s.remote_state,
                            known: s.phase.is_some(),
                        })
                        .next_in(d, why),
                    )
                }
            }
        }
        StatusOutcome::RetryLater { delay, reason } => {
            // The provider asked us to wait: not a failure, no budget spent, but backoff grows with
            // every read when it gives no Retry-After.
            retry_after = delay.map(|d| policy.retry_after.clamp(d));
            let (d, why) = wait(policy, delay, op.poll_count, draw);
            let (d, why) = capped(d, why, deadline, now);
            Plan::write(Step {
                counters: polls,
                ..Step::event(Event::CallFailed {
                    error_class: format!("retry later: {reason}"),
                })
                .next_in(d, why)
            })
        }
        StatusOutcome::Refused { url } => Plan::write(Step {
            counters: polls,
            detail: Some(serde_json::json!({"refused_url": url})),
            ..Step::event(Event::UrlRefused { url })
        }),
        StatusOutcome::Failed { error_class }
        | StatusOutcome::Rejected {
            reason: error_class,
            ..
        } => {
            if op.failure_count + 1 > policy.max_failures as i32 {
                Plan::write(Step {
                    counters: polls,
                    ..Step::event(Event::RetryBudgetExhausted {
                        error_class,
                        failures: op.failure_count + 1,
                    })
                })
            } else {
                let (d, why) = wait(policy, None, op.failure_count, draw);
                let (d, why) = capped(d, why, deadline, now);
                let mut step = failed_call(error_class, (d, why));
                step.counters.polls = 1;
                Plan::write(step)
            }
        }
    };
    let mut plan = plan;
    plan.step.retry_after = retry_after;
    plan.step = with_call(plan.step, call, context);
    plan
}

fn plan_go_on(step: Step) -> Plan {
    Plan::write(step).then_continue()
}

/// A delay, cut to the deadline (the next step then notices the deadline instead of polling).
fn capped(
    d: Duration,
    why: &'static str,
    deadline: DateTime<Utc>,
    now: DateTime<Utc>,
) -> (Duration, &'static str) {
    let left = until(deadline, now);
    if d > left {
        (left, NextReason::Deadline.as_str())
    } else {
        (d, why)
    }
}

/// The step for the one cancel call (state `cancel_requested`).
pub fn after_cancel(
    op: &OperationRecord,
    policy: &Policy,
    called: Called<CancelOutcome>,
    now: DateTime<Utc>,
    draw: f64,
) -> Plan {
    let Called {
        outcome,
        call,
        context,
    } = called;
    let mut retry_after = None;
    let retry_later = matches!(
        outcome,
        CancelOutcome::RetryLater { .. } | CancelOutcome::NotSent { .. }
    );
    let mut step = match outcome {
        // The answer is the confirmation: the cancel is recorded as sent (with its call), then
        // the provider's cancelled state, as a status read would have recorded it.
        CancelOutcome::Confirmed {
            http_status,
            remote_state,
        } => {
            let sent = Step {
                counters: Counters {
                    cancel_attempts: 1,
                    failures: FailureCount::Reset,
                    ..Counters::default()
                },
                keep_lease: true,
                ..Step::event(Event::CancelSent { http_status })
            };
            let confirmed = match CancelConfirmation::from_provider(&remote_state) {
                Ok(c) => Step {
                    observation: Some(Observation {
                        remote_state: Some(remote_state),
                        remote_updated_at: None,
                        progress: None,
                        status_url: None,
                        provider_context: None,
                    }),
                    ..Step::event(Event::RemoteCancelled(c))
                },
                Err(_) => Step::event(Event::CallFailed {
                    error_class: "empty cancelled state".into(),
                }),
            };
            let mut plan = Plan::write(confirmed);
            plan.first = Some(with_call(sent, call, context));
            return plan;
        }
        CancelOutcome::Accepted {
            http_status,
            retry_after: ra,
        } => {
            // The first poll after the cancel: soon, but never before a Retry-After the provider
            // gave (on this answer or on any earlier status read of the job).
            retry_after = ra.map(|d| policy.retry_after.clamp(d));
            let soon = policy.backoff.initial.min(Duration::from_secs(1));
            let d = retry_after.map_or(soon, |ra| ra.max(soon));
            let (d, held) = poll_delay(op, d, now);
            let why = if held || retry_after.is_some_and(|ra| ra >= soon) {
                NextReason::RetryAfter.as_str()
            } else {
                "after_cancel"
            };
            Step {
                counters: Counters {
                    failures: FailureCount::Reset,
                    ..Counters::default()
                },
                ..Step::event(Event::CancelSent { http_status }).next_in(d, why)
            }
        }
        // Refused (e.g. already finished): do not ask again; polling will tell what happened. The
        // provider answered, so earlier failures (a cancel that could not reach it) are behind us:
        // left counted, they would send the refused cancel again and spend the next status read's
        // budget at once.
        CancelOutcome::Rejected { reason, .. } => {
            let (d, held) = poll_delay(op, Duration::ZERO, now);
            Step {
                counters: Counters {
                    failures: FailureCount::Reset,
                    ..Counters::default()
                },
                ..Step::event(Event::CallFailed {
                    error_class: format!("cancel refused: {reason}"),
                })
                .next_in(d, if held { "retry_after" } else { "after_cancel" })
            }
        }
        // "Not now" within the window spends no failure (as for status reads and results): many
        // deferrals must not leave one transient error short of the failure budget.
        CancelOutcome::RetryLater { delay, reason } => {
            retry_after = delay.map(|d| policy.retry_after.clamp(d));
            let mut step = failed_call(
                format!("cancel deferred: {reason}"),
                wait(policy, delay, op.failure_count, draw),
            );
            if op.cancel_deadline.is_some_and(|d| now < d) {
                step.counters.failures = FailureCount::Keep;
            }
            step
        }
        // Backed off on the failures: a provider that cannot be reached is asked less and less
        // often, not every few seconds for the whole window.
        CancelOutcome::NotSent { error_class } => failed_call(
            format!("cancel not sent: {error_class}"),
            wait(policy, None, op.failure_count, draw),
        ),
        // A provider's wait is kept only within the cancel window: past it a person is asked,
        // and a read of the job before then is what tells whether the cancel took.
        CancelOutcome::Failed {
            error_class,
            retry_after: ra,
        } => {
            let within = |d: Duration| op.cancel_deadline.map_or(d, |end| d.min(until(end, now)));
            retry_after = ra.map(|d| within(policy.retry_after.clamp(d)));
            let (d, why) = wait(policy, ra, op.cancel_attempts, draw);
            failed_call(format!("cancel failed: {error_class}"), (within(d), why))
        }
    };
    // "Not now", and a cancel that never left, asked nothing of the job: no attempt, and the
    // cancel goes again after the provider's wait (or the backoff), idempotent or not — within the
    // window. Past it, it counts: the one call past the window (see `next`) is the last before a
    // person.
    let deferred = retry_later && op.cancel_deadline.is_some_and(|d| now < d);
    step.counters.cancel_attempts = i32::from(!deferred);
    step.retry_after = retry_after;
    Plan::write(with_call(step, call, context))
}

/// The step for the final GET of the created resource: its answer may carry result hints (kept in
/// the provider context); the result is fetched next. A read that failed or was told "not now"
/// is made again: going on without it would check the result without the checksum or count it
/// would have given. "Not now" is waited out (its `Retry-After`, backed off on the reads made)
/// without spending the failure budget until the result deadline, as for the result itself; a
/// failure counts.
pub fn after_final_get(
    op: &OperationRecord,
    policy: &Policy,
    called: Called<StatusOutcome>,
    now: DateTime<Utc>,
    draw: f64,
) -> Plan {
    let Called {
        outcome,
        call,
        context,
    } = called;
    let again = match outcome {
        StatusOutcome::RetryLater { delay, reason } if now < op.result_deadline => {
            let (d, why) = wait(policy, delay, op.poll_count, draw);
            Some(
                Step::event(Event::ResultFetchFailed {
                    error_class: format!("final GET: retry later: {reason}"),
                })
                .next_in(d.min(until(op.result_deadline, now)), why),
            )
        }
        StatusOutcome::RetryLater { delay, reason } => Some(failed_fetch(
            op,
            policy,
            format!("final GET: retry later: {reason}"),
            delay,
            draw,
        )),
        StatusOutcome::Failed { error_class } => Some(failed_fetch(
            op,
            policy,
            format!("final GET: {error_class}"),
            None,
            draw,
        )),
        // Refused (a 403, a 404): the read was not had, and the hints it gives (a checksum, a
        // count) would be missing from the result's checks. Never skipped: read again, within
        // the failure budget.
        StatusOutcome::Rejected { reason, .. } => Some(failed_fetch(
            op,
            policy,
            format!("final GET: refused: {reason}"),
            None,
            draw,
        )),
        // The resource says the job failed or was cancelled after all: a provider that went back,
        // or a stale replica. Its result is not collected on that word. (A resource's own state
        // that reads as running may be the resource's, not the job's: it says nothing against
        // the success already seen, like a state the contract does not map.)
        StatusOutcome::Observed(s) if matches!(s.phase, Some(Phase::Failed | Phase::Cancelled)) => {
            Some(failed_fetch(
                op,
                policy,
                format!(
                    "final GET: status_no_longer_succeeded: the resource says {}",
                    s.remote_state
                ),
                None,
                draw,
            ))
        }
        // Nothing was sent: a person decides, as for any URL outside the contract's origins.
        StatusOutcome::Refused { url } => Some(Step {
            detail: Some(serde_json::json!({"refused_url": url})),
            ..Step::event(Event::UrlRefused { url })
        }),
        StatusOutcome::Observed(_) => None,
    };
    if let Some(mut step) = again {
        // Each read is counted: the next one is a new attempt.
        step.counters.polls = 1;
        // A read that did not count leaves the result's hints (its URL, checksum, count) as they
        // were: only what else it set (cookies) is kept.
        let context = context.map(|mut c| {
            if let Some(c) = c.as_object_mut() {
                match op.provider_context.get("result") {
                    Some(was) => c.insert("result".into(), was.clone()),
                    None => c.remove("result"),
                };
            }
            c
        });
        return Plan::write(with_call(step, call, context));
    }
    let mut ctx = context.unwrap_or_else(|| op.provider_context.clone());
    if !ctx.is_object() {
        ctx = serde_json::json!({});
    }
    ctx["final_get_done"] = serde_json::Value::Bool(true);
    let step = Step {
        counters: Counters {
            polls: 1,
            ..Counters::default()
        },
        ..Step::default()
    };
    Plan::write(with_call(step, call, Some(ctx))).then_continue()
}

/// A result fetch that failed: tried again after the provider's Retry-After or backoff, one more
/// failure counted, until the contract's failure budget is spent.
fn failed_fetch(
    op: &OperationRecord,
    policy: &Policy,
    error_class: String,
    retry_after: Option<Duration>,
    draw: f64,
) -> Step {
    if op.failure_count + 1 > policy.max_failures as i32 {
        return Step::event(Event::RetryBudgetExhausted {
            error_class,
            failures: op.failure_count + 1,
        });
    }
    let (d, why) = wait(policy, retry_after, op.failure_count, draw);
    Step {
        counters: Counters {
            failures: FailureCount::Increment,
            ..Counters::default()
        },
        ..Step::event(Event::ResultFetchFailed { error_class }).next_in(d, why)
    }
}

/// Where result bytes were kept, and the bytes to write with the step when they go to the database.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub location: String,
    pub size: u64,
    pub sha256: String,
    pub bytes: Option<ResultBytes>,
}

/// A result after the worker fetched (or read back), checked and kept it.
#[derive(Debug, Clone)]
pub enum Collected {
    /// Every rule passed; `kept` says where the bytes are, or why they could not be kept.
    Valid {
        fetched_content_type: Option<String>,
        checks: Vec<String>,
        summary: serde_json::Value,
        kept: Result<Kept, String>,
    },
    /// A rule failed; the bytes are kept for inspection where possible.
    Invalid {
        violations: Vec<String>,
        kept: Option<Kept>,
    },
    TooLarge {
        limit: u64,
    },
    /// Parsed to be checked, it would take more than the worker's whole `room` for that (bytes):
    /// never parsed.
    BeyondCheckMemory {
        room: u64,
        /// Where its bytes are kept for inspection, where they could be.
        kept: Option<Kept>,
    },
    /// It will not become available (404, 410, no URL, a kept result altered).
    Unavailable {
        reason: String,
    },
    /// A result kept at create (a synchronous answer) cannot be read back here: kept in another
    /// host's result directory, or its file gone. The provider will not send it again.
    NotReadable {
        reason: String,
    },
    /// The provider named a result URL outside the contract's origins; nothing was sent.
    Refused {
        url: String,
    },
    /// The status was read again for a fresh URL after a refused download (`fresh`: it named
    /// another): downloaded at once.
    Renewed {
        fresh: bool,
        /// The status read that named it: its state, and a status URL it moved to.
        observed: Observation,
    },
    /// Worth another try later.
    Failed {
        error_class: String,
    },
    /// The provider said "not now": after its `Retry-After`, if it gave one.
    RetryLater {
        delay: Option<Duration>,
        reason: String,
    },
}

impl Collected {
    /// A fetched result that the contract's rules found `checked`; `kept` where its bytes went.
    pub fn from_fetched(
        fetched: &FetchedResult,
        checked: crate::outcome::Checked,
        kept: Result<Kept, String>,
    ) -> Self {
        match checked {
            crate::outcome::Checked::Valid { checks, summary } => Collected::Valid {
                fetched_content_type: fetched.content_type.clone(),
                checks,
                summary,
                kept,
            },
            crate::outcome::Checked::Invalid { violations } => Collected::Invalid {
                violations,
                kept: kept.ok(),
            },
        }
    }
}

/// `step`, recording where a result that is not the operation's result was kept for inspection
/// (its bytes stored with the step, where the database keeps them).
fn for_inspection(kept: Option<Kept>, step: Step) -> Step {
    Step {
        detail: kept
            .as_ref()
            .map(|k| serde_json::json!({"kept_for_inspection": k.location, "sha256": k.sha256})),
        result_bytes: kept.and_then(|k| k.bytes),
        ..step
    }
}

/// The step for result collection (state `result_collecting`). `call`: the fetch, if one was made
/// (a synchronous result kept at create needs none).
///
/// A provider's "not now" is waited out (its `Retry-After`, within the contract's bounds) without
/// spending the failure budget until the result deadline: a provider that rate-limits downloads
/// must not turn a finished job into a terminal `result_unavailable`. Past the deadline it counts
/// like any failure, so a provider that never serves still ends.
pub fn after_collect(
    op: &OperationRecord,
    policy: &Policy,
    collected: Collected,
    call: Option<(CallRecord, Option<serde_json::Value>)>,
    now: DateTime<Utc>,
    draw: f64,
) -> Plan {
    let mut go_on = false;
    let mut step = match collected {
        Collected::Valid {
            fetched_content_type,
            checks,
            summary,
            kept: Ok(k),
        } => match ValidatedResult::new(
            &k.location,
            k.size,
            &k.sha256,
            fetched_content_type,
            checks,
            summary,
        ) {
            Ok(v) => Step {
                result_bytes: k.bytes,
                ..Step::event(Event::ResultValidated(v))
            },
            Err(e) => Step::event(Event::ResultUnavailable { why: e.to_string() }),
        },
        // The result could not be kept (a full or read-only result directory): fetched again
        // after backing off, within the failure budget, never every second for good. Past it, the
        // job's result still exists: held for a person, not ended as if the provider failed it.
        Collected::Valid { kept: Err(e), .. } => {
            let why = format!("result store: {e}");
            if op.failure_count + 1 > policy.max_failures as i32 {
                Step::event(Event::ResultNotKept { why })
            } else {
                failed_fetch(op, policy, why, None, draw)
            }
        }
        Collected::Invalid { violations, kept } => {
            for_inspection(kept, Step::event(Event::ResultInvalid { violations }))
        }
        Collected::TooLarge { limit } => Step::event(Event::ResultInvalid {
            violations: vec![format!(
                "the result is larger than the contract's limit of {limit} bytes"
            )],
        }),
        Collected::BeyondCheckMemory { room, kept } => for_inspection(
            kept,
            Step::event(Event::ResultBeyondCheckMemory { room_bytes: room }),
        ),
        Collected::Unavailable { reason } => Step::event(Event::ResultUnavailable { why: reason }),
        // Held, not ended: the result existed, and a person can put it back where it was kept.
        Collected::NotReadable { reason } => Step::event(Event::ResultNotReadable { why: reason }),
        Collected::Refused { url } => Step {
            detail: Some(serde_json::json!({"refused_url": url})),
            ..Step::event(Event::UrlRefused { url })
        },
        // Backed off on the fetches made (no failure is counted, so the failure count stays put).
        Collected::RetryLater { delay, reason } if now < op.result_deadline => {
            let (d, why) = wait(policy, delay, op.result_attempts, draw);
            Step::event(Event::ResultFetchFailed {
                error_class: format!("retry later: {reason}"),
            })
            .next_in(d.min(until(op.result_deadline, now)), why)
        }
        Collected::RetryLater { delay, reason } => {
            failed_fetch(op, policy, format!("retry later: {reason}"), delay, draw)
        }
        Collected::Failed { error_class } => failed_fetch(op, policy, error_class, None, draw),
        // The refused download counted as a failure already: the fresh URL is tried at once.
        Collected::Renewed { fresh, observed } => {
            go_on = true;
            Step {
                observation: Some(observed),
                ..Step::event(Event::ResultUrlRenewed { fresh })
            }
        }
    };
    if let Some((c, ctx)) = call {
        step.counters.result_attempts = 1;
        step = with_call(step, c, ctx);
    }
    let plan = Plan::write(step);
    if go_on { plan.then_continue() } else { plan }
}
