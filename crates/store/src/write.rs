//! The one way a row changes state: lock it, let the core decide the transition against the state
//! that is locked, append the history link, write the row, all in one short transaction.

use chrono::{DateTime, Utc};
use jobtrail_core::chain::{self, CallEntry, ChainEntry, Linked, storable};
use jobtrail_core::machine::Transition;
use jobtrail_core::{Event, EventKind, transition};
use sqlx::{Postgres, Transaction};
use std::time::Duration;

use crate::error::StoreError;
use crate::record::{CallRecord, LockedRow, OperationRecord};
use jobtrail_core::State;

pub use jobtrail_core::step::{Counters, FailureCount, Observation, ResultBytes, SendMark, Step};

/// The result of a written step.
#[derive(Debug, Clone)]
pub struct Applied {
    pub record: OperationRecord,
    pub transition: Option<Transition>,
    /// The database's clock when it was written (its transaction's `now()`, which dates its
    /// history link).
    pub at: DateTime<Utc>,
}

/// Apply `step` to a row this transaction holds locked. On an illegal event nothing of the row is
/// written and the error is returned; the caller decides whether the call record is still kept.
pub(crate) async fn apply_locked(
    tx: &mut Transaction<'_, Postgres>,
    locked: LockedRow,
    actor: &str,
    step: Step,
) -> Result<Applied, StoreError> {
    let planned = plan(locked, actor, &step)?;
    execute(tx, &planned).await?;
    Ok(planned.applied)
}

/// A write decided but not yet executed: everything `execute` needs, computed without I/O.
pub(crate) struct Planned<'s> {
    pub applied: Applied,
    epoch: i64,
    actor: String,
    call: Option<(&'s CallRecord, CallLink)>,
    link: Option<(ChainEntry, [u8; 32], [u8; 32])>,
    result: Option<&'s ResultBytes>,
}

/// The schedule's mark for a webhook that arrived while a worker held the operation's lease.
pub(crate) const WEBHOOK_WHILE_LEASED: &str = "webhook_while_leased";

/// The closest a webhook brings a status read to the last call about the job: a provider
/// (or a stolen secret) sending deliveries without end would otherwise have a worker read, and
/// record a call and a link, as fast as it can turn round. One read per two seconds is the rate
/// the default contract's first polls keep; the announcement of a finish is read within it.
pub const WEBHOOK_READ_FLOOR: std::time::Duration = std::time::Duration::from_secs(2);

/// Decide a write against a locked row: the transition (or `Illegal`), the new column values, the
/// history link and its hash. Pure: nothing is written.
pub(crate) fn plan<'s>(
    locked: LockedRow,
    actor: &str,
    step: &'s Step,
) -> Result<Planned<'s>, StoreError> {
    let now = storable(locked.db_now);
    let mut rec: OperationRecord = locked.row.try_into()?;
    let epoch = rec.lease_epoch;
    // A step that records something (an event, a call) shows its holder was not lost (see
    // operation_claim_*.sql). A deferral records nothing: a holder that keeps deferring, then dies
    // checking, is still counted.
    if step.event.is_some() || step.call.is_some() {
        rec.takeovers = 0;
    }
    // A webhook arrived while this lease was held (see `operation_poke_by_remote_job.sql`).
    let poked = rec.next_action_reason == WEBHOOK_WHILE_LEASED;

    let decided = match &step.event {
        Some(ev) => Some(
            transition(rec.state, ev).map_err(|source| StoreError::Illegal {
                operation_id: rec.id,
                source,
            })?,
        ),
        None => None,
    };

    // Failed status reads were judged in the state they were decided in. A cancel that landed
    // meanwhile and was never sent is sent first: `cancellation_unconfirmed` means the provider was
    // asked, and its cancel endpoint may answer where its status endpoint does not.
    if step
        .event
        .as_ref()
        .is_some_and(|e| e.kind() == EventKind::RetryBudgetExhausted)
        && rec.state == State::CancelRequested
        && rec.cancel_attempts == 0
        && step.decided_in.is_some_and(|s| s != State::CancelRequested)
    {
        return Err(StoreError::Moved {
            operation_id: rec.id,
            state: rec.state,
        });
    }

    if let Some(obs) = &step.observation {
        if obs.remote_state.is_some() {
            rec.remote_state.clone_from(&obs.remote_state);
            rec.observed_at = Some(now);
        }
        if obs.remote_updated_at.is_some() {
            rec.remote_updated_at.clone_from(&obs.remote_updated_at);
        }
        if obs.progress.is_some() {
            rec.remote_progress.clone_from(&obs.progress);
        }
        if obs.status_url.is_some() {
            rec.status_url.clone_from(&obs.status_url);
        }
        if let Some(ctx) = &obs.provider_context {
            rec.provider_context = ctx.clone();
        }
    }
    let c = step.counters;
    rec.create_attempts += c.create_attempts;
    rec.poll_count += c.polls;
    rec.cancel_attempts += c.cancel_attempts;
    rec.result_attempts += c.result_attempts;
    rec.reconcile_attempts += c.reconcile_attempts;
    if let Some(ra) = step.retry_after {
        // The provider's Retry-After, from this transaction's clock: no status read before it.
        rec.poll_not_before =
            Some(now + chrono::Duration::from_std(ra).unwrap_or(chrono::Duration::days(365)));
    }
    match step.send_mark {
        SendMark::Keep => {}
        SendMark::Set if rec.state == State::CreatePending && decided.is_none() => {
            rec.create_sent_epoch = Some(epoch);
        }
        // The operation left create_pending meanwhile (a person's decision): no send may follow.
        SendMark::Set => {
            return Err(StoreError::Moved {
                operation_id: rec.id,
                state: rec.state,
            });
        }
        SendMark::Clear => rec.create_sent_epoch = None,
    }
    match c.failures {
        FailureCount::Keep => {}
        FailureCount::Increment => rec.failure_count += 1,
        FailureCount::Reset => rec.failure_count = 0,
    }
    if let Some(d) = step.set_create_deadline {
        rec.create_deadline = storable(d);
    }
    if let Some(d) = step.set_result_deadline {
        rec.result_deadline = storable(d);
    }
    if let Some(d) = step.set_cancel_deadline {
        rec.cancel_deadline = Some(storable(d));
    }

    if let (Some(ev), Some(t)) = (&step.event, decided) {
        apply_event_effects(&mut rec, ev, t, now);
    }
    // The send mark belongs to create_pending only (a CHECK constraint says so too): whatever
    // moves the operation on has recorded what the send did.
    if rec.state != State::CreatePending {
        rec.create_sent_epoch = None;
    }

    // The call's link in the operation's call chain.
    let call = match &step.call {
        Some(c) => {
            let link = next_call_link(&rec, epoch, actor, c)?;
            rec.calls_seq = link.seq;
            rec.calls_head = link.hash.to_vec();
            Some((c, link))
        }
        None => None,
    };

    // The schedule and the lease. A cancel asked for and not yet sent is due at once, whatever a
    // step the worker decided before the request arrived scheduled (a status read in flight, or a
    // wait for an earlier Retry-After, put its next read minutes off, past the cancel's window).
    // A wait decided for the cancel itself (the provider deferred it; the provider's call rate)
    // stands.
    let decided_before_the_cancel = step.decided_in.is_some_and(|s| s != State::CancelRequested);
    let (delay, reason) = match step.next_in {
        Some(_)
            if rec.state == State::CancelRequested
                && rec.cancel_attempts == 0
                && decided_before_the_cancel =>
        {
            (Duration::ZERO, "cancel")
        }
        next_in => next_in.unwrap_or((Duration::ZERO, "immediate")),
    };
    let automated = rec.state.is_automated();
    rec.next_action_at = if automated {
        now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::days(365))
    } else {
        now
    };
    rec.next_action_reason = if automated {
        reason.to_owned()
    } else {
        "none".to_owned()
    };
    if !(step.keep_lease && automated) {
        rec.lease_owner = None;
        rec.lease_expires_at = None;
    } else if let Some(exp) = rec.lease_expires_at {
        // A kept lease stays out of the due index until it expires.
        rec.next_action_at = exp;
    }
    // A webhook that came while the lease was held: the next status read is due at once (never
    // before the provider's Retry-After); a step that keeps the lease keeps the mark for the next.
    if poked && automated {
        if rec.lease_owner.is_some() {
            rec.next_action_reason = WEBHOOK_WHILE_LEASED.to_owned();
        } else if matches!(
            rec.state,
            State::Accepted | State::Observing | State::Cancelling
        ) || (rec.state == State::CancelRequested && rec.cancel_attempts > 0)
        {
            // The floor counts from the last call about the job: this step's (just answered, so
            // now, by the database's clock), else the last read that observed it.
            let floor = chrono::Duration::from_std(WEBHOOK_READ_FLOOR).expect("two seconds");
            let last_call = step.call.as_ref().map(|_| now);
            let soonest = [
                rec.poll_not_before,
                last_call.or(rec.observed_at).map(|t| t + floor),
            ]
            .into_iter()
            .flatten()
            .fold(now, DateTime::max);
            // Never the backoff after failed calls (see `operation_poke_by_remote_job.sql`).
            if rec.next_action_at > soonest && rec.failure_count == 0 {
                rec.next_action_at = soonest;
                rec.next_action_reason = "webhook".to_owned();
            }
        }
    }

    // The history link.
    let mut transition_out = None;
    let mut link = None;
    if let (Some(ev), Some(t)) = (&step.event, decided) {
        let mut detail = serde_json::to_value(ev).unwrap_or(serde_json::Value::Null);
        if let (Some(obj), Some(extra)) = (detail.as_object_mut(), &step.detail) {
            obj.insert("evidence".into(), extra.clone());
        }
        if let (Some(obj), Some(obs)) = (detail.as_object_mut(), &step.observation)
            && let Some(p) = &obs.progress
        {
            obj.insert("progress".into(), p.clone());
        }
        // What a person's resume moved (even nothing), so the chain says to what a deadline was
        // extended and `audit verify` can hold the row's deadlines to it.
        let set = [
            ("create_deadline", step.set_create_deadline),
            ("result_deadline", step.set_result_deadline),
            ("cancel_deadline", step.set_cancel_deadline),
        ];
        if let Some(obj) = detail.as_object_mut()
            && (ev.kind() == EventKind::Resume || set.iter().any(|(_, d)| d.is_some()))
        {
            let set: serde_json::Map<_, _> = set
                .into_iter()
                .filter_map(|(k, d)| Some((k.to_owned(), serde_json::json!(storable(d?)))))
                .collect();
            obj.insert(chain::DEADLINES_SET.into(), set.into());
        }
        let entry = ChainEntry {
            operation_id: rec.id.to_string(),
            seq: rec.history_seq + 1,
            at: now,
            actor: actor.to_owned(),
            from_state: Some(t.from.as_str().to_owned()),
            to_state: t.to.as_str().to_owned(),
            event: ev.kind().as_str().to_owned(),
            cause: ev.cause(),
            remote_job_id: rec.remote_job_id.clone(),
            call_id: step.call.as_ref().map(|c| c.id.to_string()),
            detail,
        };
        let prev: [u8; 32] = rec
            .history_head
            .as_slice()
            .try_into()
            .map_err(|_| StoreError::Corrupt("history_head is not 32 bytes".into()))?;
        let hash = entry.hash(&prev);
        rec.history_seq = entry.seq;
        rec.history_head = hash.to_vec();
        transition_out = Some(t);
        link = Some((entry, prev, hash));
    }

    Ok(Planned {
        applied: Applied {
            record: rec,
            transition: transition_out,
            at: now,
        },
        epoch,
        actor: actor.to_owned(),
        call,
        link,
        result: step.result_bytes.as_ref(),
    })
}

/// A call's place in its operation's call chain: seq, prev_hash, hash.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallLink {
    pub seq: i64,
    pub prev: [u8; 32],
    pub hash: [u8; 32],
}

/// The link a call logged now (by `actor` under `epoch`) takes after the operation's call head.
pub(crate) fn next_call_link(
    rec: &OperationRecord,
    epoch: i64,
    actor: &str,
    c: &CallRecord,
) -> Result<CallLink, StoreError> {
    let prev: [u8; 32] = rec
        .calls_head
        .as_slice()
        .try_into()
        .map_err(|_| StoreError::Corrupt("calls_head is not 32 bytes".into()))?;
    let entry = CallEntry {
        operation_id: rec.id.to_string(),
        seq: rec.calls_seq + 1,
        id: c.id.to_string(),
        kind: c.kind.as_str().to_owned(),
        attempt: c.attempt,
        actor: actor.to_owned(),
        lease_epoch: epoch,
        started_at: storable(c.started_at),
        duration_ms: c.duration_ms,
        method: c.method.clone(),
        url: c.url.clone(),
        http_status: c.http_status,
        response_headers: c.response_headers.clone(),
        provider_request_id: c.provider_request_id.clone(),
        error_class: c.error_class.clone(),
        outcome: c.outcome.clone(),
        trace_id: c.trace_id.clone(),
        span_id: c.span_id.clone(),
        response_sha256: c.response_sha256.clone(),
    };
    Ok(CallLink {
        seq: entry.seq,
        prev,
        hash: entry.hash(&prev),
    })
}

/// Execute a planned write inside the transaction that holds its row locked.
pub(crate) async fn execute(
    tx: &mut Transaction<'_, Postgres>,
    p: &Planned<'_>,
) -> Result<(), StoreError> {
    let rec = &p.applied.record;
    if let Some((call, link)) = p.call {
        insert_call(&mut **tx, rec.id, p.epoch, &p.actor, call, link).await?;
    }
    if let Some((entry, prev, hash)) = &p.link {
        insert_history(tx, entry, p.call.map(|(c, _)| c.id), prev, hash).await?;
    }
    insert_results(tx, std::slice::from_ref(p)).await?;
    update_row(tx, rec, p.epoch).await
}

/// The operations these committed writes moved to another state, for [`crate::Store::announce`].
pub(crate) fn moved<'a>(applied: impl IntoIterator<Item = &'a Applied>) -> Vec<String> {
    applied
        .into_iter()
        .filter(|a| a.transition.is_some_and(|t| t.from != t.to))
        .map(|a| a.record.id.to_string())
        .collect()
}

/// Keep the result bytes the planned steps carry (one statement per bounded chunk: a batch of big
/// results must not become one huge message).
async fn insert_results(
    tx: &mut Transaction<'_, Postgres>,
    planned: &[Planned<'_>],
) -> Result<(), StoreError> {
    const CHUNK_BYTES: usize = 64 << 20;
    let rows: Vec<(uuid::Uuid, &ResultBytes)> = planned
        .iter()
        .filter_map(|p| p.result.map(|r| (p.applied.record.id.as_uuid(), r)))
        .collect();
    let mut start = 0;
    while start < rows.len() {
        // At least one row per statement, then as many as fit.
        let mut end = start + 1;
        let mut size = rows[start].1.bytes.len();
        while end < rows.len() && size + rows[end].1.bytes.len() <= CHUNK_BYTES {
            size += rows[end].1.bytes.len();
            end += 1;
        }
        let chunk = &rows[start..end];
        sqlx::query(include_str!("sql/result_insert_many.sql"))
            .bind(chunk.iter().map(|(op, _)| *op).collect::<Vec<_>>())
            .bind(
                chunk
                    .iter()
                    .map(|(_, r)| r.sha256.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                chunk
                    .iter()
                    .map(|(_, r)| r.bytes.len() as i64)
                    .collect::<Vec<_>>(),
            )
            .bind(
                chunk
                    .iter()
                    .map(|(_, r)| r.content_type.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(
                chunk
                    .iter()
                    .map(|(_, r)| r.bytes.as_ref())
                    .collect::<Vec<&[u8]>>(),
            )
            .execute(&mut **tx)
            .await?;
        start = end;
    }
    Ok(())
}

/// The column effects of an allowed transition.
fn apply_event_effects(rec: &mut OperationRecord, ev: &Event, t: Transition, now: DateTime<Utc>) {
    if let Event::ChooseRemoteJob { remote_job_id, .. } = ev
        && rec.conflicting_remote_job_id.as_deref() == Some(remote_job_id.as_str())
    {
        // Keep the answer that was not chosen next to the one that was.
        rec.conflicting_remote_job_id = rec.remote_job_id.take();
    }
    if let Some(job) = ev.remote_job_id() {
        rec.remote_job_id = Some(job.to_owned());
    }
    match ev {
        Event::ContractViolated {
            recorded_job_id,
            other_job_id,
        } => {
            // Keep both answers: the one we knew first, and the other.
            if rec.remote_job_id.is_none() {
                rec.remote_job_id = Some(recorded_job_id.clone());
            }
            rec.conflicting_remote_job_id = Some(other_job_id.clone());
        }
        // Never taken as this operation's job (its owner's webhooks and decisions stay its own).
        Event::JobHeldElsewhere { remote_job_id, .. } => {
            rec.conflicting_remote_job_id = Some(remote_job_id.clone());
        }
        Event::CancelRequested(req) | Event::Withdraw(req) => {
            if rec.cancel_requested_at.is_none() {
                rec.cancel_requested_at = Some(now);
                rec.cancel_requested_by = Some(req.actor().to_owned());
                rec.cancel_reason = Some(req.reason().to_owned());
            }
            if t.to != t.from || rec.cancel_deadline.is_none() {
                rec.cancel_deadline =
                    Some(now + chrono::Duration::milliseconds(rec.cancel_window_ms));
            }
        }
        Event::ResultValidated(r) => {
            rec.result_location = Some(r.location().to_owned());
            rec.result_size = Some(r.size() as i64);
            rec.result_sha256 = Some(r.sha256().to_owned());
            rec.result_content_type = r.content_type().map(str::to_owned);
            rec.result_summary = Some(r.summary().clone());
        }
        Event::ResultInvalid { violations } => {
            rec.result_summary = Some(serde_json::json!({ "violations": violations }));
        }
        Event::ResultUnavailable { why } => {
            rec.result_summary = Some(serde_json::json!({ "unavailable": why }));
        }
        Event::Superseded {
            new_operation_id, ..
        } => {
            rec.superseded_by = new_operation_id.parse().ok();
        }
        _ => {}
    }
    if t.changes_state() {
        rec.state = t.to;
        rec.state_changed_at = now;
        if t.to.is_terminal() {
            rec.finished_at = Some(now);
        }
        if t.to.needs_human() {
            rec.escalated_at = Some(now);
            rec.escalation_reason = Some(ev.cause());
        } else {
            rec.escalated_at = None;
            rec.escalation_reason = None;
        }
    }
    // Moving back to automation from a held state is due at once.
    if t.from.needs_human() && t.to.is_automated() {
        rec.failure_count = 0;
    }
    // A job the provider accepted (or a lookup found) is watched with the whole retry budget: the
    // failures spent creating it are not its status reads' (and a webhook, which waits out a
    // failure backoff, may bring its first read forward).
    if t.on == jobtrail_core::EventKind::CreateAccepted {
        rec.failure_count = 0;
    }
}

pub(crate) async fn insert_call<'c, E: sqlx::PgExecutor<'c>>(
    exec: E,
    operation_id: jobtrail_core::OperationId,
    epoch: i64,
    actor: &str,
    call: &CallRecord,
    link: CallLink,
) -> Result<(), StoreError> {
    sqlx::query(include_str!("sql/call_insert.sql"))
        .bind(call.id)
        .bind(operation_id.as_uuid())
        .bind(call.kind.as_str())
        .bind(call.attempt)
        .bind(actor)
        .bind(epoch)
        .bind(call.started_at)
        .bind(call.duration_ms)
        .bind(&call.method)
        .bind(&call.url)
        .bind(call.http_status)
        .bind(&call.response_headers)
        .bind(&call.provider_request_id)
        .bind(&call.error_class)
        .bind(&call.outcome)
        .bind(&call.trace_id)
        .bind(&call.span_id)
        .bind(&call.response_sha256)
        .bind(link.seq)
        .bind(link.prev.as_slice())
        .bind(link.hash.as_slice())
        .execute(exec)
        .await?;
    Ok(())
}

pub(crate) async fn insert_history(
    tx: &mut Transaction<'_, Postgres>,
    e: &ChainEntry,
    call_id: Option<uuid::Uuid>,
    prev: &[u8; 32],
    hash: &[u8; 32],
) -> Result<(), StoreError> {
    let op: jobtrail_core::OperationId = e
        .operation_id
        .parse()
        .map_err(|err| StoreError::Corrupt(format!("{err}")))?;
    sqlx::query(include_str!("sql/history_insert.sql"))
        .bind(op.as_uuid())
        .bind(e.seq)
        .bind(e.at)
        .bind(&e.actor)
        .bind(&e.from_state)
        .bind(&e.to_state)
        .bind(&e.event)
        .bind(&e.cause)
        .bind(&e.remote_job_id)
        .bind(call_id)
        .bind(&e.detail)
        .bind(prev.as_slice())
        .bind(hash.as_slice())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn update_row(
    tx: &mut Transaction<'_, Postgres>,
    r: &OperationRecord,
    epoch: i64,
) -> Result<(), StoreError> {
    let done = sqlx::query(include_str!("sql/operation_update_locked.sql"))
        .bind(r.id.as_uuid())
        .bind(epoch)
        .bind(r.state.as_str())
        .bind(r.state_changed_at)
        .bind(r.finished_at)
        .bind(r.escalated_at)
        .bind(&r.escalation_reason)
        .bind(&r.remote_job_id)
        .bind(&r.conflicting_remote_job_id)
        .bind(&r.remote_state)
        .bind(&r.remote_updated_at)
        .bind(&r.remote_progress)
        .bind(r.observed_at)
        .bind(&r.status_url)
        .bind(&r.provider_context)
        .bind(r.next_action_at)
        .bind(&r.next_action_reason)
        .bind(r.create_attempts)
        .bind(r.poll_count)
        .bind(r.failure_count)
        .bind(r.cancel_attempts)
        .bind(r.result_attempts)
        .bind(&r.lease_owner)
        .bind(r.lease_expires_at)
        .bind(r.cancel_requested_at)
        .bind(&r.cancel_requested_by)
        .bind(&r.cancel_reason)
        .bind(r.cancel_deadline)
        .bind(&r.result_location)
        .bind(r.result_size)
        .bind(&r.result_sha256)
        .bind(&r.result_content_type)
        .bind(&r.result_summary)
        .bind(r.superseded_by.map(|s| s.as_uuid()))
        .bind(r.result_deadline)
        .bind(r.create_deadline)
        .bind(r.history_seq)
        .bind(r.history_head.as_slice())
        .bind(r.create_sent_epoch)
        .bind(r.poll_not_before)
        .bind(r.reconcile_attempts)
        .bind(r.calls_seq)
        .bind(r.calls_head.as_slice())
        .bind(r.takeovers)
        .fetch_optional(&mut **tx)
        .await?;
    match done {
        Some(_) => Ok(()),
        None => Err(StoreError::Corrupt(format!(
            "locked row {} changed epoch inside its own transaction",
            r.id
        ))),
    }
}

/// A provider call to log, with who made it under which epoch, and its link.
pub(crate) struct CallRow<'a> {
    pub operation_id: jobtrail_core::OperationId,
    pub epoch: i64,
    pub actor: &'a str,
    pub call: &'a CallRecord,
    pub link: CallLink,
}

impl Planned<'_> {
    pub(crate) fn call_row(&self) -> Option<CallRow<'_>> {
        self.call.map(|(call, link)| CallRow {
            operation_id: self.applied.record.id,
            epoch: self.epoch,
            actor: &self.actor,
            call,
            link,
        })
    }
}

/// Log many calls in one statement.
pub(crate) async fn insert_calls(
    tx: &mut Transaction<'_, Postgres>,
    rows: &[CallRow<'_>],
) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    // Bound by reference: the arrays borrow the rows instead of copying every string.
    let col = |f: for<'r> fn(&'r CallRow<'_>) -> &'r str| rows.iter().map(f).collect::<Vec<_>>();
    sqlx::query(include_str!("sql/call_insert_many.sql"))
        .bind(rows.iter().map(|r| r.call.id).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| r.operation_id.as_uuid())
                .collect::<Vec<_>>(),
        )
        .bind(col(|r| r.call.kind.as_str()))
        .bind(rows.iter().map(|r| r.call.attempt).collect::<Vec<_>>())
        .bind(col(|r| r.actor))
        .bind(rows.iter().map(|r| r.epoch).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.call.started_at).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.call.duration_ms).collect::<Vec<_>>())
        .bind(col(|r| &r.call.method))
        .bind(col(|r| &r.call.url))
        .bind(rows.iter().map(|r| r.call.http_status).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| &r.call.response_headers)
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|r| r.call.provider_request_id.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|r| r.call.error_class.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(col(|r| &r.call.outcome))
        .bind(col(|r| &r.call.trace_id))
        .bind(col(|r| &r.call.span_id))
        .bind(
            rows.iter()
                .map(|r| r.call.response_sha256.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|r| r.link.seq).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| r.link.prev.as_slice())
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|r| r.link.hash.as_slice())
                .collect::<Vec<_>>(),
        )
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// One history link to insert: the entry, its prev and own hash, the call that caused it.
type LinkRow<'a> = (
    &'a ChainEntry,
    &'a [u8; 32],
    &'a [u8; 32],
    Option<uuid::Uuid>,
);

/// Execute many planned writes (rows locked by this transaction) with one statement per table.
pub(crate) async fn execute_many(
    tx: &mut Transaction<'_, Postgres>,
    planned: &[Planned<'_>],
) -> Result<(), StoreError> {
    if planned.is_empty() {
        return Ok(());
    }
    let calls: Vec<CallRow<'_>> = planned.iter().filter_map(Planned::call_row).collect();
    insert_calls(tx, &calls).await?;
    insert_results(tx, planned).await?;

    let links: Vec<LinkRow<'_>> = planned
        .iter()
        .filter_map(|p| {
            p.link
                .as_ref()
                .map(|(e, prev, hash)| (e, prev, hash, p.call.map(|(c, _)| c.id)))
        })
        .collect();
    if !links.is_empty() {
        let ids = links
            .iter()
            .map(|(e, ..)| {
                e.operation_id
                    .parse::<jobtrail_core::OperationId>()
                    .map(|i| i.as_uuid())
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        sqlx::query(include_str!("sql/history_insert_many.sql"))
            .bind(ids)
            .bind(links.iter().map(|(e, ..)| e.seq).collect::<Vec<_>>())
            .bind(links.iter().map(|(e, ..)| e.at).collect::<Vec<_>>())
            .bind(
                links
                    .iter()
                    .map(|(e, ..)| e.actor.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                links
                    .iter()
                    .map(|(e, ..)| e.from_state.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(
                links
                    .iter()
                    .map(|(e, ..)| e.to_state.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                links
                    .iter()
                    .map(|(e, ..)| e.event.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                links
                    .iter()
                    .map(|(e, ..)| e.cause.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                links
                    .iter()
                    .map(|(e, ..)| e.remote_job_id.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(links.iter().map(|(.., c)| *c).collect::<Vec<_>>())
            .bind(links.iter().map(|(e, ..)| &e.detail).collect::<Vec<_>>())
            .bind(
                links
                    .iter()
                    .map(|(_, p, ..)| p.as_slice())
                    .collect::<Vec<_>>(),
            )
            .bind(
                links
                    .iter()
                    .map(|(_, _, h, _)| h.as_slice())
                    .collect::<Vec<_>>(),
            )
            .execute(&mut **tx)
            .await?;
    }

    let r: Vec<&OperationRecord> = planned.iter().map(|p| &p.applied.record).collect();
    let done = sqlx::query(include_str!("sql/operation_update_many_locked.sql"))
        .bind(r.iter().map(|x| x.id.as_uuid()).collect::<Vec<_>>())
        .bind(planned.iter().map(|p| p.epoch).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.state.as_str()).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.state_changed_at).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.finished_at).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.escalated_at).collect::<Vec<_>>())
        .bind(
            r.iter()
                .map(|x| x.escalation_reason.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            r.iter()
                .map(|x| x.remote_job_id.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            r.iter()
                .map(|x| x.conflicting_remote_job_id.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            r.iter()
                .map(|x| x.remote_state.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            r.iter()
                .map(|x| x.remote_updated_at.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            r.iter()
                .map(|x| x.remote_progress.as_ref())
                .collect::<Vec<_>>(),
        )
        .bind(r.iter().map(|x| x.observed_at).collect::<Vec<_>>())
        .bind(
            r.iter()
                .map(|x| x.status_url.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(r.iter().map(|x| &x.provider_context).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.next_action_at).collect::<Vec<_>>())
        .bind(
            r.iter()
                .map(|x| x.next_action_reason.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(r.iter().map(|x| x.create_attempts).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.poll_count).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.failure_count).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.cancel_attempts).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.result_attempts).collect::<Vec<_>>())
        .bind(
            r.iter()
                .map(|x| x.lease_owner.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(r.iter().map(|x| x.lease_expires_at).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.cancel_requested_at).collect::<Vec<_>>())
        .bind(
            r.iter()
                .map(|x| x.cancel_requested_by.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            r.iter()
                .map(|x| x.cancel_reason.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(r.iter().map(|x| x.cancel_deadline).collect::<Vec<_>>())
        .bind(
            r.iter()
                .map(|x| x.result_location.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(r.iter().map(|x| x.result_size).collect::<Vec<_>>())
        .bind(
            r.iter()
                .map(|x| x.result_sha256.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            r.iter()
                .map(|x| x.result_content_type.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            r.iter()
                .map(|x| x.result_summary.as_ref())
                .collect::<Vec<_>>(),
        )
        .bind(
            r.iter()
                .map(|x| x.superseded_by.map(|s| s.as_uuid()))
                .collect::<Vec<_>>(),
        )
        .bind(r.iter().map(|x| x.result_deadline).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.create_deadline).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.history_seq).collect::<Vec<_>>())
        .bind(
            r.iter()
                .map(|x| x.history_head.as_slice())
                .collect::<Vec<_>>(),
        )
        .bind(r.iter().map(|x| x.create_sent_epoch).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.poll_not_before).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.reconcile_attempts).collect::<Vec<_>>())
        .bind(r.iter().map(|x| x.calls_seq).collect::<Vec<_>>())
        .bind(
            r.iter()
                .map(|x| x.calls_head.as_slice())
                .collect::<Vec<_>>(),
        )
        .bind(r.iter().map(|x| x.takeovers).collect::<Vec<_>>())
        .execute(&mut **tx)
        .await?;
    if done.rows_affected() != planned.len() as u64 {
        return Err(StoreError::Corrupt(format!(
            "a batch of {} locked rows updated {} rows",
            planned.len(),
            done.rows_affected()
        )));
    }
    Ok(())
}
