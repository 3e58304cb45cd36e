//! The reference loop, one claimed operation at a time: decide the step from the locked-in state,
//! make at most one provider call, turn its closed outcome into exactly one event, write it fenced by
//! the lease. Work that is due at once (the first poll after an accepted create, collecting after
//! remote success) continues under the same lease without a new claim.

use crate::fault;
use crate::results::ResultStore;
use chrono::{DateTime, Utc};
use jobtrail_core::schedule::{NextReason, next_poll};
use jobtrail_core::{
    CancelConfirmation, CancelRequest, Event, IdempotencyMode, State, ValidatedResult,
};
use jobtrail_provider::contract::{Polling, ReconcileMethod};
use jobtrail_provider::*;
use jobtrail_store::{
    Counters, FailureCount, Lease, Observation, OperationRecord, Step, Store, StoreError,
};
use std::time::{Duration, Instant};

/// How a drive ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Driven {
    /// History links written (transitions and observations).
    pub events: u32,
    /// Provider calls made.
    pub calls: u32,
    pub lease_lost: bool,
}

pub(crate) struct Ctx<'a> {
    pub store: &'a Store,
    pub writer: &'a crate::writer::Writer,
    pub provider: &'a dyn Provider,
    pub results: &'a ResultStore,
    pub lease: Lease,
    pub ttl: Duration,
    /// Our local view of when the lease expires (monotonic clock; conservative).
    pub expires: Instant,
    /// Set when the worker is stopping: finish the step in flight, start no new call.
    pub shutdown: tokio_util::sync::CancellationToken,
}

/// One step's decision: what to write, and whether to go on at once under the same lease.
struct Plan {
    step: Step,
    go_on: bool,
    called: bool,
}

impl Plan {
    fn write(step: Step) -> Self {
        Self {
            step,
            go_on: false,
            called: false,
        }
    }
    fn then_continue(mut self) -> Self {
        self.step.keep_lease = true;
        self.go_on = true;
        self
    }
    fn called(mut self) -> Self {
        self.called = true;
        self
    }
}

fn draw() -> f64 {
    rand::random::<f64>()
}

/// When to try again: the provider's `Retry-After` (clamped) if it sent one, else backoff for
/// `attempt`; and why.
fn wait(
    polling: &Polling,
    retry_after: Option<Duration>,
    attempt: i32,
) -> (Duration, &'static str) {
    let (d, why) = next_poll(
        retry_after,
        &polling.retry_after,
        &polling.backoff,
        attempt as u32,
        draw(),
    );
    (d, why.as_str())
}

/// A call that failed or was deferred: recorded, tried again after `delay`, one more failure counted
/// against the retry budget.
fn failed_call(
    error_class: String,
    (delay, why): (Duration, &'static str),
    counters: Counters,
) -> Step {
    Step {
        counters: Counters {
            failures: FailureCount::Increment,
            ..counters
        },
        ..Step::event(Event::CallFailed { error_class }).next_in(delay, why)
    }
}

fn until(deadline: DateTime<Utc>) -> Duration {
    (deadline - Utc::now()).to_std().unwrap_or(Duration::ZERO)
}

/// Why the operation cannot go on: stop driving it (nothing half-written).
enum Stop {
    LeaseLost,
    Other(StoreError),
}

impl Ctx<'_> {
    /// Make sure the lease outlives a call that may take `need`; extend it in the database if not.
    /// A worker that cannot extend stops acting on the operation before it calls anyone.
    async fn ensure_lease(&mut self, need: Duration) -> Result<(), Stop> {
        let margin = Duration::from_millis(500);
        if self.expires.saturating_duration_since(Instant::now()) > need + margin {
            return Ok(());
        }
        let ttl = self.ttl.max(need + margin * 4);
        match self.store.extend_lease(&self.lease, ttl).await {
            Ok(_) => {
                self.expires = Instant::now() + ttl;
                Ok(())
            }
            Err(StoreError::LeaseLost { .. }) => Err(Stop::LeaseLost),
            Err(e) => Err(Stop::Other(e)),
        }
    }

    fn call_budget(&self) -> Duration {
        self.provider.contract().request_timeout + self.provider.contract().connect_timeout
    }

    /// Write a step, retrying while the database is away (bounded by our lease).
    async fn write(&mut self, step: Step) -> Result<jobtrail_store::Applied, Stop> {
        let mut delay = Duration::from_millis(100);
        loop {
            match self.writer.apply(&self.lease, step.clone()).await {
                Ok(a) => return Ok(a),
                Err(StoreError::LeaseLost { .. }) => return Err(Stop::LeaseLost),
                Err(e) if e.is_transient() && Instant::now() + delay < self.expires => {
                    tracing::warn!(operation = %self.lease.operation_id, error = %e, "database unavailable; retrying the write");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(Stop::Other(e)),
            }
        }
    }
}

/// Drive one claimed operation until it needs to wait (or is done, or the lease is lost).
pub(crate) async fn drive(mut ctx: Ctx<'_>, mut op: OperationRecord) -> Driven {
    let mut out = Driven::default();
    for round in 0..6 {
        if round > 0 && ctx.shutdown.is_cancelled() {
            let _ = ctx
                .store
                .release(&ctx.lease, Utc::now(), "worker shutdown")
                .await;
            return out;
        }
        let plan = match plan(&mut ctx, &op).await {
            Ok(p) => p,
            Err(Stop::LeaseLost) => {
                out.lease_lost = true;
                return out;
            }
            Err(Stop::Other(e)) => {
                tracing::error!(operation = %op.id, error = %e, "could not plan a step");
                return out;
            }
        };
        if plan.called {
            out.calls += 1;
        }
        let has_event = plan.step.event.is_some();
        let kind = plan.step.event.as_ref().map(|e| e.kind());
        match ctx.write(plan.step).await {
            Ok(applied) => {
                if has_event {
                    out.events += 1;
                }
                if kind == Some(jobtrail_core::EventKind::CreateAccepted) {
                    fault::point("after_create_accepted");
                }
                op = applied.record;
                if !plan.go_on || !op.state.is_automated() || op.lease_owner.is_none() {
                    return out;
                }
            }
            Err(Stop::LeaseLost) => {
                tracing::info!(operation = %op.id, "lease lost; the write was refused and this worker stops acting on it");
                out.lease_lost = true;
                return out;
            }
            Err(Stop::Other(StoreError::Illegal { source, .. })) => {
                tracing::info!(operation = %op.id, %source, "a decision landed meanwhile; the step was dropped (its call is logged)");
                return out;
            }
            Err(Stop::Other(e)) => {
                tracing::error!(operation = %op.id, error = %e, "could not write a step");
                return out;
            }
        }
    }
    // Too many immediate steps in a row: give the lease back, due at once.
    let _ = ctx.store.release(&ctx.lease, Utc::now(), "continue").await;
    out
}

async fn plan(ctx: &mut Ctx<'_>, op: &OperationRecord) -> Result<Plan, Stop> {
    match op.state {
        State::CreatePending => plan_create(ctx, op).await,
        State::CreateUnknown | State::Reconciliation => plan_reconcile(ctx, op).await,
        State::Accepted | State::Observing | State::Cancelling => plan_observe(ctx, op).await,
        State::CancelRequested => {
            let contract = ctx.provider.contract();
            let idempotent = contract.cancel.as_ref().is_some_and(|c| c.idempotent);
            // One cancel call; again only where the contract says cancel is idempotent.
            if op.cancel_attempts == 0
                || (idempotent && op.cancel_attempts < 3 && op.failure_count > 0)
            {
                plan_cancel(ctx, op).await
            } else {
                plan_observe(ctx, op).await
            }
        }
        State::ResultCollecting => plan_collect(ctx, op).await,
        // Held and terminal states are never claimed; if one is, leave it.
        _ => Ok(Plan::write(Step::default())),
    }
}

fn pending_cancel(op: &OperationRecord) -> Option<CancelRequest> {
    if !op.has_pending_cancel() {
        return None;
    }
    CancelRequest::new(
        op.cancel_requested_by.as_deref()?,
        op.cancel_reason.as_deref()?,
    )
    .ok()
}

fn with_context(mut obs: Observation, ctx: Option<serde_json::Value>) -> Observation {
    if ctx.is_some() {
        obs.provider_context = ctx;
    }
    obs
}

async fn plan_create(ctx: &mut Ctx<'_>, op: &OperationRecord) -> Result<Plan, Stop> {
    // A cancel that arrived before any create was sent: nothing is ever sent.
    if let Some(req) = pending_cancel(op)
        && op.create_attempts == 0
    {
        return Ok(Plan::write(Step::event(Event::Withdraw(req))));
    }
    if Utc::now() >= op.create_deadline {
        let why = if op.create_attempts == 0 {
            "create deadline passed before any create was sent".to_owned()
        } else {
            format!(
                "create deadline passed after {} attempts without a definitive answer",
                op.create_attempts
            )
        };
        return Ok(Plan::write(Step::event(Event::ReconciliationExhausted {
            why,
        })));
    }
    let no_token = op.idempotency == IdempotencyMode::None;
    // Without a token, a previous send whose outcome was never recorded may have created the job:
    // sending again could create a second one. That is an ambiguous create, not a retry.
    if no_token
        && op
            .provider_context
            .get("create_sending")
            .is_some_and(|v| v == &serde_json::Value::Bool(true))
    {
        return Ok(Plan::write(Step::event(Event::CreateAmbiguous {
            error_class: "a previous send's outcome was never recorded (worker stopped mid-call)"
                .into(),
        })));
    }
    ctx.ensure_lease(ctx.call_budget()).await?;
    let attempt = op.create_attempts + 1;
    let mut counted = 1;
    let mut base_ctx = op.provider_context.clone();
    if no_token {
        // Intent before effect for this attempt: mark it durably before sending.
        base_ctx["create_sending"] = serde_json::Value::Bool(true);
        let mark = Step {
            observation: Some(Observation {
                provider_context: Some(base_ctx.clone()),
                ..Default::default()
            }),
            counters: Counters {
                create_attempts: 1,
                ..Default::default()
            },
            keep_lease: true,
            ..Default::default()
        };
        ctx.write(mark).await?;
        fault::point("after_create_marked");
        counted = 0;
        base_ctx["create_sending"] = serde_json::Value::Bool(false);
    }
    let mut marked = op.clone();
    marked.provider_context = base_ctx.clone();
    let called = ctx.provider.create(&marked, attempt).await;
    let mut context = called.context.clone().unwrap_or(base_ctx);
    if no_token {
        context["create_sending"] = serde_json::Value::Bool(false);
    }
    let counters = Counters {
        create_attempts: counted,
        ..Default::default()
    };
    let polling = &ctx.provider.contract().polling;
    let step = match called.outcome {
        CreateOutcome::Accepted {
            job_id,
            remote_state,
            status_url,
            ..
        } => {
            if let Some(prev) = op.remote_job_id.as_ref().filter(|p| **p != job_id) {
                Step::event(Event::ContractViolated {
                    recorded_job_id: prev.clone(),
                    other_job_id: job_id,
                })
            } else {
                let obs = Observation {
                    remote_state: remote_state.clone(),
                    status_url,
                    provider_context: Some(context),
                    ..Default::default()
                };
                let s = Step {
                    observation: Some(obs),
                    ..Step::event(Event::CreateAccepted {
                        remote_job_id: job_id,
                        remote_state,
                    })
                };
                return Ok(Plan::write(Step {
                    counters,
                    call: Some(called.call),
                    ..s
                })
                .then_continue()
                .called());
            }
        }
        CreateOutcome::Completed { job_id, result } => {
            // A synchronous answer is a result: keep the bytes now, validate them in the collect step.
            let checked = ctx.provider.check_result(op, &result);
            let stored = ctx
                .results
                .keep(op.id, result.bytes.clone(), result.content_type.clone())
                .await;
            match stored {
                Ok(s) => {
                    context["sync_result"] = serde_json::json!({
                        "location": s.location, "size": s.size, "sha256": s.sha256,
                        "content_type": result.content_type, "valid": matches!(checked, Checked::Valid { .. }),
                    });
                    let obs = Observation {
                        provider_context: Some(context),
                        ..Default::default()
                    };
                    let s = Step {
                        observation: Some(obs),
                        result_bytes: s.pending,
                        ..Step::event(Event::CreateCompleted {
                            remote_job_id: job_id,
                        })
                    };
                    return Ok(Plan::write(Step {
                        counters,
                        call: Some(called.call),
                        ..s
                    })
                    .then_continue()
                    .called());
                }
                Err(e) => {
                    tracing::error!(operation = %op.id, error = %e, "cannot store a synchronous result");
                    Step::event(Event::CreateAmbiguous {
                        error_class: "result_store_unavailable".into(),
                    })
                }
            }
        }
        CreateOutcome::Rejected {
            http_status,
            reason,
        } => Step::event(Event::CreateRejected {
            http_status,
            reason,
        }),
        CreateOutcome::Ambiguous { error_class } => {
            Step::event(Event::CreateAmbiguous { error_class })
                .next_in(ctx.provider.contract().reconcile.interval, "reconcile")
        }
        CreateOutcome::RetryLater { delay, reason } => {
            let (d, why) = wait(polling, delay, op.failure_count);
            failed_call(
                format!("create deferred: {reason}"),
                (d.min(until(op.create_deadline)), why),
                counters,
            )
        }
        CreateOutcome::NotSent { error_class } => {
            let (d, why) = wait(polling, None, op.failure_count);
            failed_call(
                format!("create not sent: {error_class}"),
                (d.min(until(op.create_deadline)), why),
                counters,
            )
        }
    };
    let step = Step {
        call: Some(called.call),
        counters: Counters {
            create_attempts: counted,
            ..step.counters
        },
        observation: Some(with_context(
            step.observation.unwrap_or_default(),
            Some(context),
        )),
        ..step
    };
    Ok(Plan::write(step).called())
}

async fn plan_reconcile(ctx: &mut Ctx<'_>, op: &OperationRecord) -> Result<Plan, Stop> {
    let rc = ctx.provider.contract().reconcile.clone();
    if Utc::now() >= op.create_deadline {
        return Ok(Plan::write(Step::event(Event::ReconciliationExhausted {
            why: format!(
                "create deadline passed after {} attempts; the remote job may or may not exist",
                op.create_attempts
            ),
        })));
    }
    if rc.method == ReconcileMethod::None {
        return Ok(Plan::write(Step::event(Event::ReconciliationExhausted {
            why: "the provider offers no reconciliation: a person must find out whether the job exists".into(),
        })));
    }
    if op.state == State::CreateUnknown {
        return Ok(Plan::write(Step::event(Event::ReconciliationStarted {
            method: rc.method.as_str().into(),
        }))
        .then_continue());
    }
    ctx.ensure_lease(ctx.call_budget() * 2).await?;
    let inconclusive = |class: String| {
        Step::event(Event::ReconciliationInconclusive { error_class: class })
            .next_in(rc.interval.min(until(op.create_deadline)), "reconcile")
    };

    // Look the job up by our client reference (the whole method, or a cross-check of a resend).
    let mut looked_up: Option<Vec<String>> = None;
    let mut lookup_call = None;
    if rc.lookup_url.is_some() {
        let called = ctx.provider.lookup(op, op.failure_count + 1).await;
        lookup_call = Some(called.call);
        match called.outcome {
            LookupOutcome::Found { job_ids } if job_ids.len() > 1 => {
                let step = Step::event(Event::ContractViolated {
                    recorded_job_id: job_ids[0].clone(),
                    other_job_id: job_ids[1].clone(),
                });
                return Ok(Plan::write(Step {
                    call: lookup_call,
                    detail: Some(serde_json::json!({"jobs_for_our_reference": job_ids})),
                    ..step
                })
                .called());
            }
            LookupOutcome::Found { job_ids } => looked_up = Some(job_ids),
            LookupOutcome::NotFound => looked_up = Some(Vec::new()),
            LookupOutcome::Failed { error_class } => {
                if rc.method == ReconcileMethod::Lookup {
                    let s = Step {
                        call: lookup_call,
                        counters: Counters {
                            failures: FailureCount::Increment,
                            ..Default::default()
                        },
                        ..inconclusive(error_class)
                    };
                    return Ok(Plan::write(s).called());
                }
            }
        }
    }
    if rc.method == ReconcileMethod::Lookup {
        let step = match looked_up.unwrap_or_default().pop() {
            Some(job) => Step::event(Event::CreateAccepted {
                remote_job_id: job,
                remote_state: None,
            }),
            None => inconclusive("not found by client reference (yet)".into()),
        };
        return Ok(Plan::write(Step {
            call: lookup_call,
            ..step
        })
        .then_continue()
        .called());
    }

    // Resend with the same token: a careful provider answers with the original job.
    // The lookup's call record is kept in the step's evidence; the resend is the logged call.
    let attempt = op.create_attempts + 1;
    let called = ctx.provider.create(op, attempt).await;
    let counters = Counters {
        create_attempts: 1,
        ..Default::default()
    };
    let detail = lookup_call
        .as_ref()
        .map(|c| serde_json::json!({"lookup": {"call_id": c.id, "outcome": c.outcome}}));
    if let Some(c) = lookup_call {
        // Log the lookup call on its own (no transition).
        ctx.write(Step {
            call: Some(c),
            keep_lease: true,
            ..Default::default()
        })
        .await?;
    }
    let context = called.context.clone();
    let step = match called.outcome {
        CreateOutcome::Accepted {
            job_id,
            remote_state,
            status_url,
            ..
        } => {
            let other = looked_up
                .as_ref()
                .and_then(|ids| ids.iter().find(|i| **i != job_id).cloned());
            match other.or_else(|| op.remote_job_id.clone().filter(|p| *p != job_id)) {
                Some(other) => Step::event(Event::ContractViolated {
                    recorded_job_id: other,
                    other_job_id: job_id,
                }),
                None => {
                    let obs = Observation {
                        remote_state: remote_state.clone(),
                        status_url,
                        provider_context: context,
                        ..Default::default()
                    };
                    let s = Step {
                        observation: Some(obs),
                        counters,
                        call: Some(called.call),
                        detail,
                        ..Step::event(Event::CreateAccepted {
                            remote_job_id: job_id,
                            remote_state,
                        })
                    };
                    return Ok(Plan::write(s).then_continue().called());
                }
            }
        }
        CreateOutcome::Completed { .. } => {
            inconclusive("the resend answered synchronously; collect by lookup".into())
        }
        CreateOutcome::Rejected {
            http_status,
            reason,
        } => Step::event(Event::CreateRejected {
            http_status,
            reason,
        }),
        CreateOutcome::Ambiguous { error_class } | CreateOutcome::NotSent { error_class } => {
            inconclusive(error_class)
        }
        CreateOutcome::RetryLater { reason, .. } => inconclusive(format!("retry later: {reason}")),
    };
    Ok(Plan::write(Step {
        call: Some(called.call),
        counters,
        detail,
        observation: Some(with_context(Observation::default(), context)),
        ..step
    })
    .called())
}

async fn plan_observe(ctx: &mut Ctx<'_>, op: &OperationRecord) -> Result<Plan, Stop> {
    let now = Utc::now();
    let cancel_phase = matches!(op.state, State::CancelRequested | State::Cancelling);
    if !cancel_phase && now >= op.result_deadline {
        return Ok(Plan::write(Step::event(Event::ResultDeadlinePassed)));
    }
    if cancel_phase && op.cancel_deadline.is_some_and(|d| now >= d) {
        return Ok(Plan::write(unconfirmed(ctx, op).await));
    }
    if !cancel_phase && let Some(req) = pending_cancel(op) {
        return Ok(Plan::write(Step::event(Event::CancelRequested(req))).then_continue());
    }
    ctx.ensure_lease(ctx.call_budget()).await?;
    let contract = ctx.provider.contract();
    let polling = contract.polling.clone();
    let budget = polling.max_failures as i32;
    let deadline = if cancel_phase {
        op.cancel_deadline.unwrap_or(op.result_deadline)
    } else {
        op.result_deadline
    };
    let called = ctx.provider.status(op, op.poll_count + 1).await;
    let ctxv = called.context.clone();
    let mut obs = with_context(Observation::default(), ctxv);
    let step = match called.outcome {
        StatusOutcome::Observed(s) => {
            obs.remote_state = Some(s.remote_state.clone());
            obs.remote_updated_at = s.updated_at.clone();
            obs.progress = s.progress.clone();
            obs.status_url = s.status_url.clone();
            let counters = Counters {
                polls: 1,
                failures: FailureCount::Reset,
                ..Default::default()
            };
            match s.phase {
                Some(Phase::Succeeded) => {
                    let step = Step {
                        counters,
                        observation: Some(obs),
                        ..Step::event(Event::RemoteSucceeded {
                            remote_state: s.remote_state,
                        })
                    };
                    return Ok(Plan::write(Step {
                        call: Some(called.call),
                        ..step
                    })
                    .then_continue()
                    .called());
                }
                Some(Phase::Failed) => Step {
                    counters,
                    ..Step::event(Event::RemoteFailed {
                        remote_state: s.remote_state,
                        reason: s.error,
                    })
                },
                Some(Phase::Cancelled) => {
                    match CancelConfirmation::from_provider(&s.remote_state) {
                        Ok(c) => Step {
                            counters,
                            ..Step::event(Event::RemoteCancelled(c))
                        },
                        Err(_) => Step {
                            counters,
                            ..Step::event(Event::CallFailed {
                                error_class: "empty cancelled state".into(),
                            })
                        },
                    }
                }
                Some(Phase::Queued | Phase::Running) | None => {
                    let (d, why) = wait(&polling, s.retry_after, op.poll_count);
                    let (d, why) = if d > until(deadline) {
                        (until(deadline), NextReason::Deadline.as_str())
                    } else {
                        (d, why)
                    };
                    let ev = Event::RemoteProgress {
                        remote_state: s.remote_state,
                        known: s.phase.is_some(),
                    };
                    Step {
                        counters,
                        ..Step::event(ev).next_in(d, why)
                    }
                }
            }
        }
        StatusOutcome::RetryLater { delay, reason } => {
            // The provider asked us to wait: not a failure, no budget spent.
            let (d, why) = wait(&polling, delay, op.poll_count);
            Step::event(Event::CallFailed {
                error_class: format!("retry later: {reason}"),
            })
            .next_in(d.min(until(deadline)), why)
        }
        StatusOutcome::Failed { error_class }
        | StatusOutcome::Rejected {
            reason: error_class,
            ..
        } => {
            if op.failure_count + 1 > budget {
                Step::event(Event::RetryBudgetExhausted {
                    error_class,
                    failures: op.failure_count + 1,
                })
            } else {
                let (d, why) = wait(&polling, None, op.failure_count);
                failed_call(
                    error_class,
                    (d.min(until(deadline)), why),
                    Counters::default(),
                )
            }
        }
    };
    Ok(Plan::write(Step {
        call: Some(called.call),
        observation: Some(obs),
        ..step
    })
    .called())
}

/// `cancellation_unconfirmed`, with the evidence bundle a person (or the provider's support) needs:
/// the remote job id, the trace id, and every call with its provider request id.
async fn unconfirmed(ctx: &Ctx<'_>, op: &OperationRecord) -> Step {
    let calls = ctx.store.calls(op.id).await.unwrap_or_default();
    let bundle = serde_json::json!({
        "remote_job_id": op.remote_job_id,
        "trace_id": op.trace_id.to_string(),
        "cancel_requested_by": op.cancel_requested_by,
        "cancel_reason": op.cancel_reason,
        "cancel_requested_at": op.cancel_requested_at,
        "calls": calls.iter().map(|c| serde_json::json!({
            "kind": c.kind, "at": c.started_at, "http_status": c.http_status,
            "provider_request_id": c.provider_request_id, "outcome": c.outcome,
        })).collect::<Vec<_>>(),
    });
    Step {
        detail: Some(bundle),
        ..Step::event(Event::CancelDeadlinePassed)
    }
}

async fn plan_cancel(ctx: &mut Ctx<'_>, op: &OperationRecord) -> Result<Plan, Stop> {
    if op.cancel_deadline.is_some_and(|d| Utc::now() >= d) {
        return Ok(Plan::write(unconfirmed(ctx, op).await));
    }
    ctx.ensure_lease(ctx.call_budget()).await?;
    let polling = ctx.provider.contract().polling.clone();
    let called = ctx.provider.cancel(op, op.cancel_attempts + 1).await;
    let ctxv = called.context.clone();
    let counters = Counters {
        cancel_attempts: 1,
        ..Default::default()
    };
    let first_poll = polling.backoff.initial.min(Duration::from_secs(1));
    let step = match called.outcome {
        CancelOutcome::Accepted { http_status } => Step {
            counters: Counters {
                failures: FailureCount::Reset,
                ..counters
            },
            ..Step::event(Event::CancelSent { http_status }).next_in(first_poll, "after_cancel")
        },
        // Refused (e.g. already finished): do not ask again; polling will tell what happened.
        CancelOutcome::Rejected { reason, .. } => Step {
            counters,
            ..Step::event(Event::CallFailed {
                error_class: format!("cancel refused: {reason}"),
            })
            .next_in(Duration::ZERO, "after_cancel")
        },
        CancelOutcome::RetryLater { delay, reason } => failed_call(
            format!("cancel deferred: {reason}"),
            wait(&polling, delay, op.cancel_attempts),
            counters,
        ),
        CancelOutcome::Failed { error_class } => failed_call(
            format!("cancel failed: {error_class}"),
            wait(&polling, None, op.cancel_attempts),
            counters,
        ),
    };
    let obs = with_context(Observation::default(), ctxv);
    Ok(Plan::write(Step {
        call: Some(called.call),
        observation: Some(obs),
        ..step
    })
    .called())
}

async fn plan_collect(ctx: &mut Ctx<'_>, op: &OperationRecord) -> Result<Plan, Stop> {
    // A synchronous result was stored at create: validate what we kept.
    if let Some(sync) = op
        .provider_context
        .get("sync_result")
        .filter(|v| v.is_object())
    {
        let location = sync["location"].as_str().unwrap_or_default().to_owned();
        let sha = sync["sha256"].as_str().unwrap_or_default().to_owned();
        let step = match ResultStore::read_verified(ctx.store, &location, &sha).await {
            Ok(bytes) => {
                let fetched = FetchedResult {
                    bytes: bytes.into(),
                    content_type: sync["content_type"].as_str().map(str::to_owned),
                    checksum: None,
                };
                validated_step(ctx, op, fetched).await
            }
            // The database is away: nothing is known about the result yet; try again later.
            Err(crate::results::ReadError::Database(e)) => return Err(Stop::Other(e)),
            Err(why) => Step::event(Event::ResultUnavailable {
                why: why.to_string(),
            }),
        };
        return Ok(Plan::write(step));
    }
    ctx.ensure_lease(ctx.call_budget()).await?;
    let polling = ctx.provider.contract().polling.clone();
    // Some providers want the created resource read once after success; it may carry the result hints.
    if ctx.provider.contract().status.final_get
        && op.provider_context.get("final_get_done").is_none()
    {
        let called = ctx.provider.final_get(op, op.poll_count + 1).await;
        let mut context = called
            .context
            .clone()
            .unwrap_or_else(|| op.provider_context.clone());
        context["final_get_done"] = serde_json::Value::Bool(true);
        let obs = Observation {
            provider_context: Some(context),
            ..Default::default()
        };
        let step = Step {
            call: Some(called.call),
            observation: Some(obs),
            counters: Counters {
                polls: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        return Ok(Plan::write(step).then_continue().called());
    }
    let called = ctx.provider.fetch_result(op, op.result_attempts + 1).await;
    let obs = with_context(Observation::default(), called.context.clone());
    let step = match called.outcome {
        ResultOutcome::Fetched(f) => validated_step(ctx, op, f).await,
        ResultOutcome::TooLarge { limit } => Step::event(Event::ResultInvalid {
            violations: vec![format!(
                "the result is larger than the contract's limit of {limit} bytes"
            )],
        }),
        ResultOutcome::Unavailable { reason, .. } => {
            Step::event(Event::ResultUnavailable { why: reason })
        }
        ResultOutcome::Failed { error_class } => {
            if op.failure_count + 1 > polling.max_failures as i32 {
                Step::event(Event::RetryBudgetExhausted {
                    error_class,
                    failures: op.failure_count + 1,
                })
            } else {
                let (d, why) = wait(&polling, None, op.failure_count);
                Step {
                    counters: Counters {
                        failures: FailureCount::Increment,
                        ..Default::default()
                    },
                    ..Step::event(Event::ResultFetchFailed { error_class }).next_in(d, why)
                }
            }
        }
    };
    Ok(Plan::write(Step {
        call: Some(called.call),
        observation: Some(obs),
        counters: Counters {
            result_attempts: 1,
            ..step.counters
        },
        ..step
    })
    .called())
}

/// Validate and store a fetched result; the event that says which.
async fn validated_step(ctx: &Ctx<'_>, op: &OperationRecord, fetched: FetchedResult) -> Step {
    match ctx.provider.check_result(op, &fetched) {
        Checked::Valid { checks, summary } => {
            match ctx
                .results
                .keep(op.id, fetched.bytes.clone(), fetched.content_type.clone())
                .await
            {
                Ok(stored) => match ValidatedResult::new(
                    &stored.location,
                    stored.size,
                    &stored.sha256,
                    fetched.content_type,
                    checks,
                    summary,
                ) {
                    Ok(v) => Step {
                        result_bytes: stored.pending,
                        ..Step::event(Event::ResultValidated(v))
                    },
                    Err(e) => Step::event(Event::ResultUnavailable { why: e.to_string() }),
                },
                Err(e) => {
                    let d = Duration::from_secs(1);
                    Step::event(Event::ResultFetchFailed {
                        error_class: format!("result store: {e}"),
                    })
                    .next_in(d, "result_store")
                }
            }
        }
        Checked::Invalid { violations } => {
            // Keep the bytes for whoever investigates; the record says where.
            let kept = ctx
                .results
                .keep(op.id, fetched.bytes.clone(), fetched.content_type.clone())
                .await
                .ok();
            Step {
                detail: kept.as_ref().map(
                    |k| serde_json::json!({"kept_for_inspection": k.location, "sha256": k.sha256}),
                ),
                result_bytes: kept.and_then(|k| k.pending),
                ..Step::event(Event::ResultInvalid { violations })
            }
        }
    }
}
