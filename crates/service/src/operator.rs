//! What people do: the escalation queue, recorded decisions, and audit reads. Each decision is one
//! transition with its actor (the principal, never a field of the request) and reason, applied only
//! if the operation is still as the person saw it (`STATE@SEQ`); the state machine refuses what it
//! does not allow, and either way nothing is written.

use chrono::Utc;
use jobtrail_core::machine::allowed_events;
use jobtrail_core::{EventKind, OperationId, State, Submission};
use jobtrail_store::{Step, Store, StoreError, VerifyReport};

use crate::error::ServiceError;
use crate::model::{
    DecideRequest, DecideResponse, Decision, Escalation, EscalationList, OperationView,
};
use crate::{Principal, Scope, Service, parse_id};

/// The most held operations one escalation listing shows (oldest first).
pub const ESCALATIONS_SHOWN: i64 = 500;

/// The decisions that fit an operation in `state`, from the transition table (the names of
/// [`Decision`]'s kinds; `cancel` is a cancel request).
pub fn decisions_for(state: State) -> Vec<&'static str> {
    let mut out = Vec::new();
    for k in allowed_events(state) {
        let d = match k {
            EventKind::AdoptRemoteJob => "adopt",
            EventKind::DeclareNotCreated => "declare_not_created",
            EventKind::ConfirmCancellation => "confirm_cancel",
            EventKind::ChooseRemoteJob => "choose_job",
            EventKind::Resume => "resume",
            EventKind::Abandon => "abandon",
            EventKind::Superseded => "retry",
            // A cancel is a person's decision where it moves an operation a person holds (a job
            // that timed out, or one at an origin refused: it may still be running and billing).
            EventKind::CancelRequested
                if !state.is_automated()
                    && jobtrail_core::machine::rule_for(state, k)
                        .is_some_and(|r| r.to != jobtrail_core::machine::To::Same) =>
            {
                "cancel"
            }
            _ => continue,
        };
        out.push(d);
    }
    out
}

/// Whether `provider`'s contract (where it is loaded) offers no way to find a job by our
/// reference: a `create_unresolved` resumed would be held again at once.
pub fn cannot_reconcile(registry: &jobtrail_provider::Registry, provider: &str) -> bool {
    registry.get(provider).is_some_and(|p| {
        p.contract().reconcile.method == jobtrail_core::outcome::ReconcileMethod::None
    })
}

/// The decisions that fit `op`: those of its state ([`decisions_for`]), less a `resume` that
/// would be refused (a `create_unresolved` whose provider offers no reconciliation).
pub fn decisions_for_op(
    op: &jobtrail_store::OperationRecord,
    registry: &jobtrail_provider::Registry,
) -> Vec<&'static str> {
    let mut out = decisions_for(op.state);
    if op.state == State::CreateUnresolved && cannot_reconcile(registry, &op.provider) {
        out.retain(|d| *d != "resume");
    }
    out
}

/// `STATE`, `STATE@SEQ` or `STATE@SEQ:HEAD` (the head pins the view to one operation).
pub fn parse_seen(s: &str) -> Result<(State, Option<i64>), ServiceError> {
    parse_seen_pinned(s).map(|(state, seq, _)| (state, seq))
}

/// A view pinned to one operation (`STATE@SEQ:HEAD`) at `now`'s number but with another head was
/// copied from another operation that went the same way (same state, same number of links), and
/// one at a number `now` has not reached is no view of it either: refused, naming this one's
/// view. At a lower number it is stale, and the write refuses it under the row lock; a link's
/// hash never changes, so `now` needs no lock of its own.
pub fn refuse_pasted(
    seen: &str,
    seq: Option<i64>,
    head: Option<&str>,
    now: &jobtrail_store::OperationRecord,
) -> Result<(), ServiceError> {
    let (Some(seq), Some(head)) = (seq, head) else {
        return Ok(());
    };
    // A number this operation has not reached is no view of it: refused now, since it could be
    // reached between this read and the write's lock, which compares no head. A lower one is
    // stale there for good (a history only grows).
    if seq < now.history_seq
        || (seq == now.history_seq && hex::encode(&now.history_head).starts_with(head))
    {
        return Ok(());
    }
    let current = seen_token(now.state, now.history_seq, &now.history_head);
    Err(ServiceError::conflict(format!(
        "seen {:?} is not {}'s view: this operation is at {current}. Was it copied from another operation? Look at this one (`show`) and decide on its own view",
        seen.trim(),
        now.id
    ))
    .with_detail(serde_json::json!({ "current": current })))
}

/// The view token an operation shows (`seen`): `STATE@SEQ:HEAD`, HEAD the first 8 hex digits of
/// its history head. Two operations that went the same way share STATE@SEQ; the head is theirs
/// alone, so a view pasted onto the wrong operation is refused.
pub fn seen_token(state: State, seq: i64, head: &[u8]) -> String {
    let head = hex::encode(head.get(..4).unwrap_or(head));
    format!("{state}@{seq}:{head}")
}

/// `STATE`, `STATE@SEQ` or `STATE@SEQ:HEAD`; HEAD (4 to 64 hex digits) in lower case.
pub fn parse_seen_pinned(s: &str) -> Result<(State, Option<i64>, Option<String>), ServiceError> {
    let shown = jobtrail_core::ids::shown(s.trim());
    let (state, rest) = match s.trim().split_once('@') {
        Some((st, rest)) => (st, Some(rest)),
        None => (s.trim(), None),
    };
    let (seq, head) = match rest.map(|r| r.split_once(':').map_or((r, None), |(n, h)| (n, Some(h))))
    {
        None => (None, None),
        Some((n, head)) => {
            let n = n.parse::<i64>().map_err(|_| {
                ServiceError::bad_input(format!(
                    "seen {shown:?}: the part after @ must be a history number"
                ))
            })?;
            let head = head
                .map(|h| {
                    if (4..=64).contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit()) {
                        Ok(h.to_ascii_lowercase())
                    } else {
                        Err(ServiceError::bad_input(format!(
                            "seen {shown:?}: the part after : is the head `show` prints (hex digits)"
                        )))
                    }
                })
                .transpose()?;
            (Some(n), head)
        }
    };
    let state: State = state
        .parse()
        .map_err(|e| ServiceError::bad_input(format!("seen: {e}")))?;
    Ok((state, seq, head))
}

/// A time a person gives (RFC 3339, or relative: `+2h`), counted from `now`, the database's clock;
/// at least a minute ahead.
fn in_future(
    s: &str,
    what: &str,
    now: chrono::DateTime<Utc>,
) -> Result<chrono::DateTime<Utc>, ServiceError> {
    jobtrail_core::when::parse_future_at(s, now)
        .map_err(|e| ServiceError::bad_input(format!("{what}: {e}")))
}

fn refused(id: OperationId, e: StoreError) -> ServiceError {
    match e {
        StoreError::Illegal { source, .. } => ServiceError::conflict(format!(
            "refused: {source}; see the operation's timeline for the decisions that fit ({id})"
        )),
        e => e.into(),
    }
}

/// When a caller refused a second verify of every chain may come back.
const VERIFY_RETRY_SECS: u64 = 10;

impl Service {
    /// The store decisions and audit reads use.
    fn operator(&self) -> &Store {
        self.operator_store.as_ref().unwrap_or(&self.store)
    }

    /// Operations held for a person, oldest first (at most [`ESCALATIONS_SHOWN`]), with the
    /// decisions that fit each.
    pub async fn escalations(
        &self,
        p: &Principal,
        state: Option<&str>,
        provider: Option<&str>,
        caller: Option<&str>,
    ) -> Result<EscalationList, ServiceError> {
        p.require(Scope::Decide)?;
        crate::filter_text("provider", provider)?;
        crate::filter_text("caller", caller)?;
        let state = state
            .map(|s| {
                let st: State = s
                    .parse()
                    .map_err(|e| ServiceError::bad_input(format!("state: {e}")))?;
                if !st.needs_human() {
                    return Err(ServiceError::bad_input(format!(
                        "{st} is not a state held for a person"
                    )));
                }
                Ok(st)
            })
            .transpose()?;
        let mut ops = self
            .operator()
            .escalations(state, provider, caller, ESCALATIONS_SHOWN + 1)
            .await?;
        let more = ops.len() > ESCALATIONS_SHOWN as usize;
        ops.truncate(ESCALATIONS_SHOWN as usize);
        Ok(EscalationList {
            more,
            escalations: ops
                .iter()
                .map(|op| Escalation {
                    operation: OperationView::of(op),
                    decisions: decisions_for_op(op, &self.registry)
                        .into_iter()
                        .map(str::to_owned)
                        .collect(),
                })
                .collect(),
        })
    }

    /// Record a person's decision. The actor is the principal.
    pub async fn decide(
        &self,
        p: &Principal,
        id: &str,
        req: DecideRequest,
    ) -> Result<DecideResponse, ServiceError> {
        p.require(Scope::Decide)?;
        let id = parse_id(id)?;
        let (seen, seq, head) = parse_seen_pinned(&req.seen)?;
        // Whether a paid job exists is decided on the very view the person had: with a bare state,
        // an operation that left create_unresolved and came back (a new create, a new answer)
        // would take the old decision, and a "not created" then retried starts a second job.
        if seq.is_none()
            && matches!(
                req.decision,
                Decision::Adopt { .. } | Decision::DeclareNotCreated {}
            )
        {
            return Err(ServiceError::bad_input(format!(
                "seen {:?}: whether a job exists is decided on exactly what you saw: give the STATE@SEQ that `escalations` and `show` print (e.g. {}@{{N}})",
                req.seen.trim(),
                seen
            )));
        }
        let decision = jobtrail_core::Decision::new(p.caller(), &req.reason)
            .map_err(|e| ServiceError::bad_input(e.to_string()))?;
        let store = self.operator();
        // Read without its body: only the view is compared (a body may be 16 MiB).
        if seq.is_some() && head.is_some() {
            refuse_pasted(&req.seen, seq, head.as_deref(), &store.get_shown(id).await?)?;
        }
        let step = match req.decision {
            Decision::Adopt { job_id } => {
                // Pasted from a provider's console: a zero-width space, a line break or a page of
                // text would be recorded for good and polled at as a job that does not exist.
                let job = jobtrail_core::text::JOB_ID
                    .check(&job_id)
                    .map_err(|e| ServiceError::bad_input(e.to_string()))?;
                // Recorded as the provider's answer would be: a URL's capability blanked (never
                // on the record), and the same job the same id as another operation's.
                let job = jobtrail_provider::wire::recorded_job_id(job);
                jobtrail_core::ids::check_remote_job_id(&job)
                    .map_err(|why| ServiceError::bad_input(format!("job_id: {why}")))?;
                Step::event(jobtrail_core::Event::AdoptRemoteJob {
                    decision,
                    remote_job_id: job,
                })
            }
            Decision::DeclareNotCreated {} => {
                Step::event(jobtrail_core::Event::DeclareNotCreated { decision })
            }
            Decision::ConfirmCancel { evidence } => {
                if evidence.trim().is_empty() {
                    return Err(ServiceError::bad_input(
                        "evidence must say what the confirmation rests on",
                    ));
                }
                let evidence = jobtrail_core::text::EVIDENCE
                    .check(&evidence)
                    .map_err(|e| ServiceError::bad_input(e.to_string()))?;
                Step::event(jobtrail_core::Event::ConfirmCancellation { decision, evidence })
            }
            Decision::ChooseJob { job_id } => {
                let op = store.get_shown(id).await?;
                let answers: Vec<&str> = [
                    op.remote_job_id.as_deref(),
                    op.conflicting_remote_job_id.as_deref(),
                ]
                .into_iter()
                .flatten()
                .collect();
                if !answers.contains(&job_id.as_str()) {
                    return Err(ServiceError::bad_input(format!(
                        "job_id {job_id:?} is not one of the provider's answers for {id}: {}",
                        jobtrail_core::text::visible(&answers.join(", "))
                    )));
                }
                Step::event(jobtrail_core::Event::ChooseRemoteJob {
                    decision,
                    remote_job_id: job_id,
                })
            }
            Decision::Resume {
                result_deadline,
                cancel_window,
                create_deadline,
            } => {
                let mut step = Step::event(jobtrail_core::Event::Resume { decision });
                // What each held state's resume takes: anything else given would be ignored
                // without a word, so it is refused.
                let takes: Option<&[&str]> = match seen {
                    State::ResultTimedOut => Some(&["result_deadline"]),
                    State::CancellationUnconfirmed => Some(&["cancel_window"]),
                    State::CreateUnresolved => Some(&["create_deadline"]),
                    State::UrlRefused | State::ResultStalled => Some(&[]),
                    _ => None,
                };
                for (name, given) in [
                    ("result_deadline", result_deadline.is_some()),
                    ("cancel_window", cancel_window.is_some()),
                    ("create_deadline", create_deadline.is_some()),
                ] {
                    if given && takes.is_some_and(|t| !t.contains(&name)) {
                        return Err(ServiceError::bad_input(format!(
                            "resuming {seen} takes no {name}: it would be ignored"
                        )));
                    }
                }
                match seen {
                    State::ResultTimedOut => {
                        let t = result_deadline.ok_or_else(|| ServiceError::bad_input("resuming result_timed_out needs a result deadline (else it times out again at once)"))?;
                        let now = store.db_now().await?;
                        step.set_result_deadline = Some(in_future(&t, "result_deadline", now)?);
                    }
                    State::CancellationUnconfirmed => {
                        let w = cancel_window.ok_or_else(|| {
                            ServiceError::bad_input(
                                "resuming cancellation_unconfirmed needs a cancel window",
                            )
                        })?;
                        let w = jobtrail_core::when::parse_duration_within(
                            "cancel_window",
                            &w,
                            std::time::Duration::from_secs(1),
                            jobtrail_core::operation::MAX_CANCEL_WINDOW,
                        )
                        .map_err(ServiceError::bad_input)?;
                        step.set_cancel_deadline = Some(
                            store.db_now().await?
                                + chrono::Duration::from_std(w).expect("thirty days fit"),
                        );
                    }
                    // The contract now declares the origin (or the provider moved on): a status
                    // read tells.
                    State::UrlRefused => {}
                    // A person made room for the result (the workers' memory, the contract's
                    // limit): it is fetched and checked again, by a holder counted afresh.
                    State::ResultStalled => {}
                    State::CreateUnresolved => {
                        // Resumed, it is reconciled again: with nothing to reconcile by, it would
                        // be held again at once, the person's decision spent on nothing.
                        let op = store.get_shown(id).await?;
                        // Without its contract here, whether it can be reconciled cannot be told.
                        if self.registry.get(&op.provider).is_none() {
                            return Err(ServiceError::unavailable(format!(
                                "no contract for {} is loaded here, so whether it can reconcile an unresolved create cannot be told: nothing was decided; load its contract (--providers) and decide again",
                                op.provider
                            )));
                        }
                        if cannot_reconcile(&self.registry, &op.provider) {
                            return Err(ServiceError::conflict(format!(
                                "{} offers no way to find a job by our reference (its contract's reconcile is none), so resuming {id} would hold it again at once: look in the provider's console, then adopt the job if one was created, or declare_not_created if none was",
                                op.provider
                            )));
                        }
                        let t = create_deadline.ok_or_else(|| {
                            ServiceError::bad_input(
                                "resuming create_unresolved needs a create deadline",
                            )
                        })?;
                        let t = in_future(&t, "create_deadline", store.db_now().await?)?;
                        step.set_create_deadline = Some(t);
                        if op.result_deadline < t {
                            step.set_result_deadline = Some(t);
                        }
                    }
                    other => {
                        return Err(ServiceError::conflict(format!(
                            "{other} cannot be resumed (resume applies to result_timed_out, cancellation_unconfirmed, create_unresolved, url_refused, result_stalled)"
                        )));
                    }
                }
                step
            }
            Decision::Abandon {} => Step::event(jobtrail_core::Event::Abandon { decision }),
            Decision::Retry {
                request,
                result_deadline,
                job_may_exist,
            } => {
                return self
                    .retry(
                        id,
                        (seen, seq),
                        decision,
                        request,
                        result_deadline,
                        job_may_exist,
                    )
                    .await;
            }
        };
        let applied = store
            .decide(id, seen, seq, step)
            .await
            .map_err(|e| refused(id, e))?;
        Ok(DecideResponse {
            moved: applied
                .transition
                .map(|t| format!("{} → {}", t.from, t.to))
                .unwrap_or_default(),
            operation: OperationView::of(&applied.record),
            retry: None,
        })
    }

    /// Retry a finished operation as a new one linked to it (a new token; the same request unless a
    /// new one is given). The old operation must be terminal and still as the person saw it.
    async fn retry(
        &self,
        id: OperationId,
        (seen, seq): (State, Option<i64>),
        decision: jobtrail_core::Decision,
        request: Option<serde_json::Value>,
        result_deadline: Option<String>,
        job_may_exist: bool,
    ) -> Result<DecideResponse, ServiceError> {
        let store = self.operator();
        // Without its request (up to 16 MiB): the refusals just below (not finished, abandoned
        // unsettled) cost no read of it; later ones still do.
        let old = store.get_shown(id).await?;
        if !old.state.is_terminal() {
            return Err(ServiceError::conflict(format!(
                "{id} is {}, not terminal: settle it first (declare_not_created only if you know no job was created; adopt the job if one was; a cancel if it runs), then retry. Abandoning it stops tracking without cancelling: a job it started may run on beside the retry's",
                old.state
            )));
        }
        // Abandoned before anyone settled whether its create made a job: the retry, a new create
        // under a new token, may be a second paid job. Only a person who says they accept that
        // (having looked in the provider's console) starts it.
        let unsettled = if old.state == State::Abandoned && old.remote_job_id.is_none() {
            store.abandoned_unsettled(id).await?
        } else {
            None
        };
        if let Some(from) = &unsettled
            && !job_may_exist
        {
            return Err(ServiceError::conflict(format!(
                "{id} was abandoned in {from}, before anyone settled whether its create made a job at the provider: a retry is a new create and may start a second paid job beside it. Look in the provider's console first; to retry all the same, say so (job_may_exist: true; jobtrail-admin retry --job-may-exist)"
            ))
            .with_detail(serde_json::json!({ "abandoned_in": from })));
        }
        // A new request is this person's, not the original approver's: the approval recorded is
        // theirs, and the request is checked against the contract's schema like any submission.
        let old_request = store.get(id).await?.request_body;
        let edited = request.as_ref().is_some_and(|r| r != &old_request);
        if let (Some(r), Some(c)) = (
            request.as_ref().filter(|_| edited),
            self.registry.get(&old.provider).map(|x| x.contract()),
        ) && let Some(schema) = &c.create.request_schema
        {
            crate::check_request(&schema.validator, &c.redact, r)?;
        }
        // The original approval covers the one run it approved: carried over only where no job
        // was ever created (not_created, withdrawn), so the retry is that run. After a job ran
        // (succeeded, failed, cancelled, abandoned …) the retry is a new paid run, approved by the
        // person who decides it.
        let never_ran = matches!(old.state, State::NotCreated | State::Withdrawn);
        let (approved_by, approval_ref) = if edited || !never_ran {
            (decision.actor().to_owned(), None)
        } else {
            (old.approved_by.clone(), old.approval_ref.clone())
        };
        let body = serde_json::to_vec(request.as_ref().unwrap_or(&old_request))
            .map_err(|e| ServiceError::bad_input(format!("request: {e}")))?;
        // A relative deadline (`+2h`) counts from the database's clock, as the submission is
        // checked by it.
        let result_deadline = match result_deadline.as_deref() {
            Some(t) => Some(
                jobtrail_core::when::parse_time_at(t, store.db_now().await?)
                    .map_err(|e| ServiceError::bad_input(format!("result_deadline: {e}")))?,
            ),
            None => None,
        };
        let submission = Submission {
            operation_id: None,
            provider: old.provider.clone(),
            target: old.target.clone(),
            body,
            caller: old.caller.clone(),
            approved_by,
            approval_ref,
            create_deadline: None,
            result_deadline,
            cancel_window: None,
            supersedes: Some(id),
            trace: None,
            resends_stored_request: !edited,
            retried_by: Some(decision.actor().to_owned()),
            // Resent unedited, the request is still the editor's, whoever retries it.
            edited_by: old.edited_by.clone().filter(|_| !edited),
        };
        let terms = self.terms.get(&old.provider).ok_or_else(|| {
            ServiceError::unavailable(format!(
                "no contract for provider {} in the providers directory",
                old.provider
            ))
        })?;
        let s = store
            .supersede(
                id,
                (seen, seq),
                decision,
                // The person's word that a job of the old operation may exist, and that they
                // start this one beside it all the same, stays in the record with their name
                // (where it was asked for: elsewhere it says nothing).
                unsettled
                    .filter(|_| job_may_exist)
                    .map(|from| serde_json::json!({ "job_may_exist": true, "abandoned_in": from })),
                &submission,
                terms,
            )
            .await
            .map_err(|e| refused(id, e))?;
        // The retry is written: its answer never fails on a read after it (the old record as read
        // before, now linked, stands in).
        let old = match store.get_shown(id).await {
            Ok(now) => now,
            Err(_) => jobtrail_store::OperationRecord {
                superseded_by: Some(s.operation.id),
                ..old
            },
        };
        Ok(DecideResponse {
            moved: format!("{} → {}", old.state, old.state),
            operation: OperationView::of(&old),
            retry: Some(OperationView::of(&s.operation)),
        })
    }

    /// Verify the evidence of one operation or of all, and the heads an anchor recorded: the one
    /// whose digest `expect_anchor` names (kept outside the database), or else the latest in it.
    /// Without the anchor, a chain rewritten whole from its first link, or an operation deleted
    /// with its history, would read as clean.
    pub async fn verify(
        &self,
        p: &Principal,
        id: Option<&str>,
        expect_anchor: Option<&str>,
    ) -> Result<VerifyReport, ServiceError> {
        p.require(Scope::Audit)?;
        let expect = expect_anchor
            .map(|d| {
                let d = d.trim();
                if d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()) {
                    Ok(d.to_ascii_lowercase())
                } else {
                    Err(ServiceError::bad_input(
                        "expect_anchor: the digest of an anchor you kept (64 hex digits)",
                    ))
                }
            })
            .transpose()?;
        let store = self.operator();
        Ok(match id {
            Some(id) => {
                store
                    .verify_operation_anchored(parse_id(id)?, expect.as_deref())
                    .await?
            }
            None => {
                let _only = self.verifying_everything.try_acquire().map_err(|_| {
                    ServiceError::rate_limited(
                        "a verify of every chain is already running in this server (it holds several database connections until it ends): retry later, or verify one operation",
                        VERIFY_RETRY_SECS,
                    )
                })?;
                store.verify_everything(expect.as_deref()).await?
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cancel is offered to a person wherever the table lets one stop a job a person holds, and
    /// nowhere else.
    #[test]
    fn a_cancel_is_offered_where_it_stops_a_job_a_person_holds() {
        let offered: Vec<State> = State::ALL
            .iter()
            .copied()
            .filter(|s| decisions_for(*s).contains(&"cancel"))
            .collect();
        assert_eq!(offered, [State::ResultTimedOut, State::UrlRefused]);
    }
}
