//! Recorded human decisions. Each is one transition with a required actor and reason, applied only if
//! the operation is still as the person saw it; the state machine refuses what it does not allow, and
//! either way nothing is written.

use crate::Decided;
use chrono::Utc;
use jobtrail_console::shell::{self, CmdResult, exit, fail, print_json};
use jobtrail_core::{CancelRequest, Decision, Event, OperationId, State, Submission, SubmitLimits};
use jobtrail_store::{Applied, Step, Store, StoreError};
use std::process::ExitCode;

fn parse_id(s: &str) -> Result<OperationId, shell::Failure> {
    s.parse().map_err(|e| fail(exit::BAD_INPUT, e))
}

/// `STATE` or `STATE@SEQ`.
pub fn parse_seen(s: &str) -> Result<(State, Option<i64>), shell::Failure> {
    let (state, seq) = match s.split_once('@') {
        Some((st, n)) => (
            st,
            Some(n.parse::<i64>().map_err(|_| {
                fail(
                    exit::BAD_INPUT,
                    format!("--seen {s:?}: the part after @ must be a history number"),
                )
            })?),
        ),
        None => (s, None),
    };
    let state: State = state
        .parse()
        .map_err(|e| fail(exit::BAD_INPUT, format!("--seen: {e}")))?;
    Ok((state, seq))
}

fn decision(d: &Decided) -> Result<Decision, shell::Failure> {
    Decision::new(&d.actor, &d.reason).map_err(|e| fail(exit::BAD_INPUT, e))
}

async fn apply(store: &Store, id: OperationId, d: &Decided, step: Step, json: bool) -> CmdResult {
    let (seen, seq) = parse_seen(&d.seen)?;
    let applied = match store.decide(id, seen, seq, step).await {
        Ok(a) => a,
        Err(StoreError::Illegal { source, .. }) => {
            return Err(fail(
                exit::CONFLICT,
                format!(
                    "refused: {source}; see `jobtrail-admin show {id}` for the decisions that fit"
                ),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    report(&applied, json);
    Ok(ExitCode::SUCCESS)
}

fn report(a: &Applied, json: bool) {
    let op = &a.record;
    let moved = a
        .transition
        .map(|t| format!("{} → {}", t.from, t.to))
        .unwrap_or_default();
    if json {
        print_json(
            &serde_json::json!({"operation_id": op.id.to_string(), "state": op.state, "history_seq": op.history_seq, "moved": moved}),
        );
    } else {
        println!(
            "{}: {moved} (recorded as history #{})",
            op.id, op.history_seq
        );
    }
}

pub async fn adopt(store: &Store, id: &str, job_id: &str, d: Decided, json: bool) -> CmdResult {
    let id = parse_id(id)?;
    let job = job_id.trim();
    if job.is_empty() {
        return Err(fail(exit::BAD_INPUT, "--job-id must not be empty"));
    }
    let step = Step::event(Event::AdoptRemoteJob {
        decision: decision(&d)?,
        remote_job_id: job.to_owned(),
    });
    apply(store, id, &d, step, json).await
}

pub async fn declare_not_created(store: &Store, id: &str, d: Decided, json: bool) -> CmdResult {
    let id = parse_id(id)?;
    apply(
        store,
        id,
        &d,
        Step::event(Event::DeclareNotCreated {
            decision: decision(&d)?,
        }),
        json,
    )
    .await
}

pub async fn confirm_cancel(
    store: &Store,
    id: &str,
    evidence: &str,
    d: Decided,
    json: bool,
) -> CmdResult {
    let id = parse_id(id)?;
    if evidence.trim().is_empty() {
        return Err(fail(
            exit::BAD_INPUT,
            "--evidence must say what the confirmation rests on",
        ));
    }
    let step = Step::event(Event::ConfirmCancellation {
        decision: decision(&d)?,
        evidence: evidence.trim().to_owned(),
    });
    apply(store, id, &d, step, json).await
}

pub async fn choose_job(
    store: &Store,
    id: &str,
    job_id: &str,
    d: Decided,
    json: bool,
) -> CmdResult {
    let id = parse_id(id)?;
    let op = store.get(id).await?;
    let answers: Vec<&str> = [
        op.remote_job_id.as_deref(),
        op.conflicting_remote_job_id.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !answers.contains(&job_id) {
        return Err(fail(
            exit::BAD_INPUT,
            format!(
                "--job-id {job_id:?} is not one of the provider's answers for {id}: {}",
                answers.join(", ")
            ),
        ));
    }
    let step = Step::event(Event::ChooseRemoteJob {
        decision: decision(&d)?,
        remote_job_id: job_id.to_owned(),
    });
    apply(store, id, &d, step, json).await
}

pub async fn resume(
    store: &Store,
    id: &str,
    result_deadline: Option<String>,
    cancel_window: Option<String>,
    create_deadline: Option<String>,
    d: Decided,
    json: bool,
) -> CmdResult {
    let id = parse_id(id)?;
    let (seen, _) = parse_seen(&d.seen)?;
    let future = |s: &str, flag: &str| -> Result<chrono::DateTime<Utc>, shell::Failure> {
        let t = shell::parse_time(s).map_err(|e| fail(exit::BAD_INPUT, format!("{flag}: {e}")))?;
        if t <= Utc::now() {
            return Err(fail(
                exit::BAD_INPUT,
                format!("{flag}: {t} is not in the future"),
            ));
        }
        Ok(t)
    };
    let mut step = Step::event(Event::Resume {
        decision: decision(&d)?,
    });
    match seen {
        State::ResultTimedOut => {
            let t = result_deadline.ok_or_else(|| fail(exit::BAD_INPUT, "resuming result_timed_out needs --result-deadline (else it times out again at once)"))?;
            step.set_result_deadline = Some(future(&t, "--result-deadline")?);
        }
        State::CancellationUnconfirmed => {
            let w = cancel_window.ok_or_else(|| {
                fail(
                    exit::BAD_INPUT,
                    "resuming cancellation_unconfirmed needs --cancel-window",
                )
            })?;
            let w = shell::parse_duration_within(
                "--cancel-window",
                &w,
                std::time::Duration::from_secs(1),
                jobtrail_core::operation::MAX_CANCEL_WINDOW,
            )?;
            step.set_cancel_deadline =
                Some(Utc::now() + chrono::Duration::from_std(w).expect("thirty days fit"));
        }
        // The contract now declares the origin (or the provider moved on): a status read tells.
        State::UrlRefused => {}
        State::CreateUnresolved => {
            let t = create_deadline.ok_or_else(|| {
                fail(
                    exit::BAD_INPUT,
                    "resuming create_unresolved needs --create-deadline",
                )
            })?;
            let t = future(&t, "--create-deadline")?;
            step.set_create_deadline = Some(t);
            let op = store.get(id).await?;
            if op.result_deadline < t {
                step.set_result_deadline = Some(t);
            }
        }
        other => {
            return Err(fail(
                exit::CONFLICT,
                format!(
                    "{other} cannot be resumed (resume applies to result_timed_out, cancellation_unconfirmed, create_unresolved, url_refused)"
                ),
            ));
        }
    }
    apply(store, id, &d, step, json).await
}

pub async fn abandon(store: &Store, id: &str, d: Decided, json: bool) -> CmdResult {
    let id = parse_id(id)?;
    apply(
        store,
        id,
        &d,
        Step::event(Event::Abandon {
            decision: decision(&d)?,
        }),
        json,
    )
    .await
}

pub async fn cancel(store: &Store, id: &str, actor: &str, reason: &str, json: bool) -> CmdResult {
    let id = parse_id(id)?;
    let req = CancelRequest::new(actor, reason).map_err(|e| fail(exit::BAD_INPUT, e))?;
    match store.request_cancel(id, req).await {
        Ok(a) => {
            report(&a, json);
            Ok(ExitCode::SUCCESS)
        }
        Err(StoreError::Illegal { source, .. }) => {
            Err(fail(exit::CONFLICT, format!("refused: {source}")))
        }
        Err(e) => Err(e.into()),
    }
}

pub async fn retry(
    store: &Store,
    registry: &jobtrail_provider::Registry,
    id: &str,
    body: Option<std::path::PathBuf>,
    result_deadline: Option<String>,
    d: Decided,
    json: bool,
) -> CmdResult {
    let id = parse_id(id)?;
    let (seen, seq) = parse_seen(&d.seen)?;
    let old = store.get(id).await?;
    if !old.state.is_terminal() {
        return Err(fail(
            exit::CONFLICT,
            format!(
                "{id} is {}, not terminal: decide its fate first (declare-not-created or abandon), then retry",
                old.state
            ),
        ));
    }
    let body = match body {
        Some(p) => {
            std::fs::read(&p).map_err(|e| fail(exit::BAD_INPUT, format!("{}: {e}", p.display())))?
        }
        None => serde_json::to_vec(&old.request_body).map_err(|e| fail(exit::UNAVAILABLE, e))?,
    };
    let submission = Submission {
        operation_id: None,
        provider: old.provider.clone(),
        target: old.target.clone(),
        body,
        caller: d.actor.clone(),
        approved_by: old.approved_by.clone(),
        approval_ref: old.approval_ref.clone(),
        create_deadline: None,
        result_deadline: result_deadline
            .as_deref()
            .map(|t| {
                shell::parse_time(t)
                    .map_err(|e| fail(exit::BAD_INPUT, format!("--result-deadline: {e}")))
            })
            .transpose()?,
        cancel_window: None,
        supersedes: Some(id),
    };
    let terms = registry.terms();
    let t = terms.get(&old.provider).ok_or_else(|| {
        fail(
            exit::UNAVAILABLE,
            format!(
                "no contract for provider {} in the providers directory",
                old.provider
            ),
        )
    })?;
    let entropy = jobtrail_store::draw_entropy()?;
    let intent = submission
        .validate(t, SubmitLimits::default(), Utc::now(), entropy)
        .map_err(|e| fail(exit::BAD_INPUT, e))?;
    let s = match store.supersede(id, seen, seq, decision(&d)?, &intent).await {
        Ok(s) => s,
        Err(StoreError::Illegal { source, .. }) => {
            return Err(fail(exit::CONFLICT, format!("refused: {source}")));
        }
        Err(e) => return Err(e.into()),
    };
    if json {
        print_json(
            &serde_json::json!({"operation_id": s.operation.id.to_string(), "supersedes": id.to_string(), "fingerprint": s.operation.fingerprint.as_str()}),
        );
    } else {
        println!(
            "{} (retries {id}; new token, fingerprint {})",
            s.operation.id, s.operation.fingerprint
        );
    }
    Ok(ExitCode::SUCCESS)
}
