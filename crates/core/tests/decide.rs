//! The step decisions, by table: every (state, outcome) pair a contract allows, with the event it
//! must produce, and a sweep that every decided event is one the transition table allows in that
//! state. Pure: records, outcomes, times and draws are built here; nothing is sent or stored.

use chrono::{DateTime, Duration as Td, Utc};
use jobtrail_core::decide::*;
use jobtrail_core::outcome::*;
use jobtrail_core::*;
use std::time::Duration;

const EPOCH: i64 = 7;

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_780_000_000, 0).unwrap()
}

fn record(state: State) -> OperationRecord {
    let now = t0();
    OperationRecord {
        id: OperationId::from_uuid(uuid::Uuid::from_u128(42)),
        provider: "p".into(),
        target: "t".into(),
        request_body: serde_json::json!({}),
        fingerprint: Fingerprint::of("p", "t", &serde_json::json!({})),
        token: IdempotencyToken::from_random([1; 16]),
        idempotency: IdempotencyMode::Header,
        at_most_once: true,
        caller: "agent".into(),
        approved_by: "alice".into(),
        approval_ref: None,
        parent_span: None,
        parent_sampled: None,
        trace_id: TraceId::from_random([2; 16]),
        created_at: now - Td::seconds(10),
        create_deadline: now + Td::seconds(60),
        result_deadline: now + Td::seconds(600),
        cancel_window_ms: 30_000,
        cancel_deadline: None,
        state,
        state_changed_at: now,
        finished_at: None,
        escalated_at: None,
        escalation_reason: None,
        remote_job_id: state.requires_remote_job().then(|| "job_1".to_owned()),
        conflicting_remote_job_id: None,
        remote_state: None,
        remote_updated_at: None,
        remote_progress: None,
        observed_at: None,
        status_url: None,
        provider_context: serde_json::json!({}),
        next_action_at: now,
        next_action_reason: "immediate".into(),
        create_attempts: 0,
        create_sent_epoch: (state == State::CreatePending).then_some(EPOCH),
        poll_count: 0,
        poll_not_before: None,
        failure_count: 0,
        cancel_attempts: 0,
        result_attempts: 0,
        reconcile_attempts: 0,
        lease_owner: Some("w".into()),
        lease_expires_at: Some(now + Td::seconds(30)),
        lease_epoch: EPOCH,
        takeovers: 0,
        cancel_requested_at: None,
        cancel_requested_by: None,
        cancel_reason: None,
        result_location: None,
        result_size: None,
        result_sha256: None,
        result_content_type: None,
        result_summary: None,
        supersedes: None,
        superseded_by: None,
        edited_by: None,
        history_seq: 1,
        history_head: vec![0; 32],
        calls_seq: 0,
        calls_head: vec![0; 32],
    }
}

fn with_cancel(mut op: OperationRecord) -> OperationRecord {
    op.cancel_requested_at = Some(t0() - Td::seconds(1));
    op.cancel_requested_by = Some("alice".into());
    op.cancel_reason = Some("wrong range".into());
    if matches!(op.state, State::CancelRequested | State::Cancelling) {
        op.cancel_deadline = Some(t0() + Td::seconds(30));
    }
    op
}

fn policy() -> Policy {
    Policy {
        reconcile: ReconcileMethod::Resend,
        lookup: true,
        cancel_idempotent: true,
        ..Policy::default()
    }
}

fn call(kind: CallKind) -> CallRecord {
    CallRecord {
        id: uuid::Uuid::from_u128(9),
        kind,
        attempt: 1,
        started_at: t0(),
        duration_ms: 1.0,
        method: "GET".into(),
        url: "http://127.0.0.1/x".into(),
        http_status: Some(200),
        response_headers: serde_json::json!({}),
        provider_request_id: None,
        error_class: None,
        outcome: "o".into(),
        trace_id: "ab".repeat(16),
        span_id: "cd".repeat(8),
        response_sha256: None,
    }
}

fn called<T>(kind: CallKind, outcome: T) -> Called<T> {
    Called {
        outcome,
        call: call(kind),
        context: None,
    }
}

fn kept() -> Kept {
    Kept {
        location: "postgres:operation_results/x/y".into(),
        size: 2,
        sha256: "a".repeat(64),
        bytes: None,
    }
}

fn status(phase: Option<Phase>, retry_after: Option<Duration>) -> StatusOutcome {
    StatusOutcome::Observed(RemoteStatus {
        remote_state: match phase {
            Some(Phase::Succeeded) => "done",
            Some(Phase::Failed) => "failed",
            Some(Phase::Cancelled) => "cancelled",
            Some(Phase::Queued) => "queued",
            Some(Phase::Running) => "running",
            None => "warming_up",
        }
        .into(),
        phase,
        updated_at: None,
        progress: None,
        error: None,
        status_url: None,
        retry_after,
        hints: ResultHints::default(),
    })
}

fn kind(plan: &Plan) -> Option<EventKind> {
    plan.step.event.as_ref().map(Event::kind)
}

/// Every decided event must be one the table allows in the state it was decided in.
fn legal(op: &OperationRecord, plan: &Plan) {
    // A step written first moves the state the plan's own step starts from.
    let mut state = op.state;
    for step in plan.first.iter().chain([&plan.step]) {
        if let Some(ev) = &step.event {
            let t = machine::transition(state, ev);
            assert!(t.is_ok(), "{} decided in {}", ev.kind(), state);
            state = t.unwrap().to;
        }
    }
}

fn write_of(a: Action) -> Plan {
    match a {
        Action::Write(p) => *p,
        Action::Call(c) => panic!("expected a write, got a call {c:?}"),
    }
}

fn call_of(a: Action) -> Call {
    match a {
        Action::Call(c) => c,
        Action::Write(p) => panic!("expected a call, got {:?}", p.step.event),
    }
}

// ---- next(): what to do, per state ------------------------------------------------------------

#[test]
fn create_pending_sends_withdraws_expires_or_calls_it_ambiguous() {
    let p = policy();
    let now = t0();
    // Our own mark, nothing pending: send, without another commit for the mark.
    let op = record(State::CreatePending);
    assert_eq!(
        call_of(next(&op, &p, EPOCH, now)),
        Call::Create {
            attempt: 1,
            mark: false
        }
    );
    // No mark at all (a continuation): mark first.
    let mut op = record(State::CreatePending);
    op.create_sent_epoch = None;
    assert_eq!(
        call_of(next(&op, &p, EPOCH, now)),
        Call::Create {
            attempt: 1,
            mark: true
        }
    );
    // A cancel with every attempt definitively not created (three 429s, our mark only): withdraw.
    let mut op = with_cancel(record(State::CreatePending));
    op.create_attempts = 3;
    let plan = write_of(next(&op, &p, EPOCH, now));
    assert_eq!(kind(&plan), Some(EventKind::Withdraw));
    assert_eq!(plan.step.send_mark, SendMark::Clear);
    legal(&op, &plan);
    // Another epoch marked a send and never recorded it: the job may exist. Never withdrawn, never
    // expired, never sent blindly: ambiguous, and the unrecorded attempt is counted.
    for deadline_passed in [false, true] {
        let mut op = with_cancel(record(State::CreatePending));
        op.create_sent_epoch = Some(EPOCH - 1);
        if deadline_passed {
            op.create_deadline = now - Td::seconds(1);
        }
        let plan = write_of(next(&op, &p, EPOCH, now));
        assert_eq!(kind(&plan), Some(EventKind::CreateAmbiguous));
        assert_eq!(plan.step.counters.create_attempts, 1);
        assert!(plan.go_on);
        legal(&op, &plan);
    }
    // The create deadline passed and nothing can have been created: a terminal not_created that
    // says so, not a person's problem.
    let mut op = record(State::CreatePending);
    op.create_deadline = now - Td::seconds(1);
    op.create_attempts = 4;
    let plan = write_of(next(&op, &p, EPOCH, now));
    assert_eq!(kind(&plan), Some(EventKind::CreateExpired));
    legal(&op, &plan);
    let t = machine::transition(op.state, plan.step.event.as_ref().unwrap()).unwrap();
    assert_eq!(t.to, State::NotCreated);
    op.create_attempts = 0;
    let plan = write_of(next(&op, &p, EPOCH, now));
    assert_eq!(
        plan.step.event.unwrap().cause(),
        "create deadline passed; never sent"
    );
}

#[test]
fn reconciliation_is_tried_at_least_once_even_past_the_deadline() {
    let now = t0();
    for (method, lookup, expected) in [
        (ReconcileMethod::Lookup, true, Call::Lookup { attempt: 1 }),
        (ReconcileMethod::Resend, true, Call::Lookup { attempt: 1 }),
        (ReconcileMethod::Resend, false, Call::Resend { attempt: 1 }),
    ] {
        let p = Policy {
            reconcile: method,
            lookup,
            ..policy()
        };
        let mut op = record(State::Reconciliation);
        op.create_deadline = now - Td::seconds(5);
        assert_eq!(call_of(next(&op, &p, EPOCH, now)), expected, "{method:?}");
        op.reconcile_attempts = 1;
        let plan = write_of(next(&op, &p, EPOCH, now));
        assert_eq!(kind(&plan), Some(EventKind::ReconciliationExhausted));
        legal(&op, &plan);
    }
    // create_unknown: start, or hand to a person when the contract offers nothing.
    let op = record(State::CreateUnknown);
    let plan = write_of(next(&op, &policy(), EPOCH, now));
    assert_eq!(kind(&plan), Some(EventKind::ReconciliationStarted));
    let none = Policy {
        reconcile: ReconcileMethod::None,
        lookup: false,
        ..policy()
    };
    let plan = write_of(next(&op, &none, EPOCH, now));
    assert_eq!(kind(&plan), Some(EventKind::ReconciliationExhausted));
    legal(&op, &plan);
}

#[test]
fn observing_states_poll_never_before_the_last_retry_after() {
    let p = policy();
    let now = t0();
    for state in [
        State::Accepted,
        State::Observing,
        State::Cancelling,
        State::CancelRequested,
    ] {
        let mut op = record(state);
        if matches!(state, State::CancelRequested | State::Cancelling) {
            op = with_cancel(op);
            op.cancel_attempts = 1;
        }
        op.poll_not_before = Some(now + Td::milliseconds(2_500));
        let plan = write_of(next(&op, &p, EPOCH, now));
        assert_eq!(kind(&plan), None, "{state}");
        assert_eq!(
            plan.step.next_in,
            Some((Duration::from_millis(2_500), "retry_after")),
            "{state}"
        );
        op.poll_not_before = Some(now - Td::seconds(1));
        assert_eq!(
            call_of(next(&op, &p, EPOCH, now)),
            Call::Status { attempt: 1 },
            "{state}"
        );
    }
}

#[test]
fn observing_states_notice_deadlines_and_pending_cancels_first() {
    let p = policy();
    let now = t0();
    let mut op = record(State::Observing);
    op.result_deadline = now;
    let plan = write_of(next(&op, &p, EPOCH, now));
    assert_eq!(kind(&plan), Some(EventKind::ResultDeadlinePassed));
    legal(&op, &plan);

    let op = with_cancel(record(State::Accepted));
    let plan = write_of(next(&op, &p, EPOCH, now));
    assert_eq!(kind(&plan), Some(EventKind::CancelRequested));
    assert!(plan.go_on);
    legal(&op, &plan);
    // A cancel noted earlier goes first, past the result deadline too: the job is asked to stop.
    let mut op = with_cancel(record(State::Observing));
    op.result_deadline = now;
    let plan = write_of(next(&op, &p, EPOCH, now));
    assert_eq!(kind(&plan), Some(EventKind::CancelRequested));
    legal(&op, &plan);

    for state in [State::CancelRequested, State::Cancelling] {
        let mut op = with_cancel(record(state));
        op.cancel_deadline = Some(now - Td::seconds(1));
        op.cancel_attempts = 1;
        let plan = write_of(next(&op, &p, EPOCH, now));
        assert_eq!(kind(&plan), Some(EventKind::CancelDeadlinePassed));
        assert!(plan.evidence_bundle);
        legal(&op, &plan);
    }
    // Past the window with no cancel sent yet (held by a stale schedule or a fleet-wide pause):
    // the provider is asked once before a person is.
    let mut op = with_cancel(record(State::CancelRequested));
    op.cancel_deadline = Some(now - Td::seconds(1));
    assert_eq!(
        call_of(next(&op, &p, EPOCH, now)),
        Call::Cancel { attempt: 1 }
    );
    // One cancel call; again only when idempotent, after a failure, at most three times.
    let mut op = with_cancel(record(State::CancelRequested));
    assert_eq!(
        call_of(next(&op, &p, EPOCH, now)),
        Call::Cancel { attempt: 1 }
    );
    op.cancel_attempts = 1;
    op.failure_count = 1;
    assert_eq!(
        call_of(next(&op, &p, EPOCH, now)),
        Call::Cancel { attempt: 2 }
    );
    let once = Policy {
        cancel_idempotent: false,
        ..policy()
    };
    assert_eq!(
        call_of(next(&op, &once, EPOCH, now)),
        Call::Status { attempt: 1 }
    );
}

// ---- after_*: what each answer means -----------------------------------------------------------

/// (outcome, where a synchronous result was kept and whether it is valid, cancel pending, event).
type CreateCase = (CreateOutcome, Option<Result<Kept, String>>, bool, EventKind);

#[test]
fn create_outcomes_map_to_one_event_each() {
    let p = policy();
    let now = t0();
    let fetched = FetchedResult {
        bytes: bytes::Bytes::from_static(b"{}"),
        content_type: Some("application/json".into()),
        checksum: None,
    };
    let cases: Vec<CreateCase> = vec![
        (
            CreateOutcome::Accepted {
                job_id: "job_1".into(),
                remote_state: Some("queued".into()),
                status_url: None,
                duplicate: false,
                retry_after: None,
            },
            None,
            false,
            EventKind::CreateAccepted,
        ),
        (
            CreateOutcome::Completed {
                job_id: None,
                result: fetched.clone(),
            },
            Some(Ok(kept())),
            false,
            EventKind::CreateCompleted,
        ),
        (
            CreateOutcome::Completed {
                job_id: None,
                result: fetched,
            },
            Some(Err("disk full".into())),
            false,
            EventKind::CreateAmbiguous,
        ),
        (
            CreateOutcome::Rejected {
                http_status: Some(422),
                reason: "no".into(),
            },
            None,
            false,
            EventKind::CreateRejected,
        ),
        (
            CreateOutcome::Ambiguous {
                error_class: "timeout".into(),
            },
            None,
            false,
            EventKind::CreateAmbiguous,
        ),
        (
            CreateOutcome::RetryLater {
                delay: Some(Duration::from_secs(3)),
                reason: "429".into(),
                maybe_processed: false,
            },
            None,
            false,
            EventKind::CallFailed,
        ),
        (
            CreateOutcome::NotSent {
                error_class: "connect_failed".into(),
            },
            None,
            false,
            EventKind::CallFailed,
        ),
        // With a cancel waiting, an attempt that created nothing withdraws: no further create.
        (
            CreateOutcome::RetryLater {
                delay: None,
                reason: "503".into(),
                maybe_processed: false,
            },
            None,
            true,
            EventKind::Withdraw,
        ),
        (
            CreateOutcome::NotSent {
                error_class: "connect_failed".into(),
            },
            None,
            true,
            EventKind::Withdraw,
        ),
        // A 408 or 503 may have followed the job's creation (a gateway's, after forwarding it):
        // with or without a cancel waiting, reconciled, never withdrawn as if nothing were made.
        (
            CreateOutcome::RetryLater {
                delay: Some(Duration::from_secs(2)),
                reason: "503".into(),
                maybe_processed: true,
            },
            None,
            true,
            EventKind::CreateAmbiguous,
        ),
        (
            CreateOutcome::RetryLater {
                delay: None,
                reason: "408".into(),
                maybe_processed: true,
            },
            None,
            false,
            EventKind::CreateAmbiguous,
        ),
        // A cancel waiting does not undo a job that exists: accepted, and the cancel follows.
        (
            CreateOutcome::Accepted {
                job_id: "job_1".into(),
                remote_state: None,
                status_url: None,
                duplicate: false,
                retry_after: None,
            },
            None,
            true,
            EventKind::CreateAccepted,
        ),
        (
            CreateOutcome::Ambiguous {
                error_class: "reset".into(),
            },
            None,
            true,
            EventKind::CreateAmbiguous,
        ),
    ];
    for (outcome, kept, cancel, expected) in cases {
        let mut op = record(State::CreatePending);
        if cancel {
            op = with_cancel(op);
        }
        let what = format!("{outcome:?} cancel={cancel}");
        let plan = after_create(&op, &p, called(CallKind::Create, outcome), kept, now, 0.5);
        assert_eq!(kind(&plan), Some(expected), "{what}");
        assert_eq!(plan.step.counters.create_attempts, 1, "{what}");
        assert_eq!(plan.step.send_mark, SendMark::Clear, "{what}");
        assert!(plan.step.call.is_some(), "{what}: the call is logged");
        legal(&op, &plan);
    }
}

/// A create deferred by an answer that may have followed the job's creation is reconciled after
/// the provider's Retry-After (clamped, never sooner than the reconcile interval, never past the
/// create deadline); at the deadline it is held for a person, never expired as not created.
#[test]
fn a_create_deferred_after_it_may_have_been_processed_is_reconciled_after_retry_after() {
    let p = policy();
    let now = t0();
    let mut op = record(State::CreatePending);
    op.create_deadline = now + Td::seconds(60);
    let deferred = |delay: Option<u64>| {
        called(
            CallKind::Create,
            CreateOutcome::RetryLater {
                delay: delay.map(Duration::from_secs),
                reason: "HTTP 503".into(),
                maybe_processed: true,
            },
        )
    };
    for (delay, waits) in [
        (Some(5), Duration::from_secs(5)),
        (None, p.reconcile_interval),
        (Some(600), Duration::from_secs(60)),
    ] {
        let plan = after_create(&op, &p, deferred(delay), None, now, 0.5);
        assert_eq!(kind(&plan), Some(EventKind::CreateAmbiguous), "{delay:?}");
        let (next, _) = plan.step.next_in.expect("scheduled");
        assert_eq!(next, waits, "{delay:?}");
        legal(&op, &plan);
    }
}

#[test]
fn a_resend_told_not_now_waits_for_retry_after_within_the_create_deadline() {
    let p = policy();
    let now = t0();
    let mut op = record(State::Reconciliation);
    op.create_deadline = now + Td::seconds(60);
    let later = |secs: u64| {
        called(
            CallKind::Create,
            CreateOutcome::RetryLater {
                delay: Some(Duration::from_secs(secs)),
                reason: "429".into(),
                maybe_processed: false,
            },
        )
    };
    let plan = after_resend(&op, &p, later(9), None, None, now);
    assert_eq!(kind(&plan), Some(EventKind::ReconciliationInconclusive));
    assert_eq!(
        plan.step.next_in,
        Some((Duration::from_secs(9), "retry_after"))
    );
    // Shorter than the contract's interval: the interval.
    let plan = after_resend(&op, &p, later(1), None, None, now);
    assert_eq!(plan.step.next_in.unwrap().0, p.reconcile_interval);
    // Never past the create deadline.
    op.create_deadline = now + Td::seconds(4);
    let plan = after_resend(&op, &p, later(9), None, None, now);
    assert_eq!(plan.step.next_in.unwrap().0, Duration::from_secs(4));
}

#[test]
fn a_create_retry_waits_for_retry_after_or_backs_off_within_the_deadline() {
    let p = policy();
    let now = t0();
    let mut op = record(State::CreatePending);
    let plan = after_create(
        &op,
        &p,
        called(
            CallKind::Create,
            CreateOutcome::RetryLater {
                delay: Some(Duration::from_secs(7)),
                reason: "429".into(),
                maybe_processed: false,
            },
        ),
        None,
        now,
        0.5,
    );
    assert_eq!(
        plan.step.next_in,
        Some((Duration::from_secs(7), "retry_after"))
    );
    op.create_deadline = now + Td::seconds(2);
    let plan = after_create(
        &op,
        &p,
        called(
            CallKind::Create,
            CreateOutcome::RetryLater {
                delay: Some(Duration::from_secs(7)),
                reason: "429".into(),
                maybe_processed: false,
            },
        ),
        None,
        now,
        0.5,
    );
    assert_eq!(plan.step.next_in.unwrap().0, Duration::from_secs(2));
}

/// A lookup answered "not now" looked nothing up: no failure counted, no cross-checked resend
/// into a provider that asked for a wait, and the next reconciliation call waits its
/// `Retry-After` when that is longer than the reconcile interval (never past the create deadline).
#[test]
fn a_lookup_told_not_now_waits_and_resends_nothing() {
    let now = t0();
    let op = record(State::Reconciliation);
    let not_now = |secs: Option<u64>| LookupOutcome::RetryLater {
        delay: secs.map(Duration::from_secs),
        reason: "429".into(),
    };
    for method in [ReconcileMethod::Lookup, ReconcileMethod::Resend] {
        let p = Policy {
            reconcile: method,
            ..policy()
        };
        for (delay, waits) in [
            (Some(7), Duration::from_secs(7)),
            // Shorter than the reconcile interval, or no wait given: the interval.
            (Some(1), p.reconcile_interval),
            (None, p.reconcile_interval),
            // Beyond the create deadline (60 s away): the deadline, where a person decides.
            (Some(250), Duration::from_secs(60)),
        ] {
            let what = format!("{method:?} {delay:?}");
            let plan = match after_lookup(&op, &p, called(CallKind::Lookup, not_now(delay)), now) {
                AfterLookup::Write(plan) => plan,
                AfterLookup::Resend { .. } => panic!("resent after a lookup told not now: {what}"),
            };
            assert_eq!(
                kind(&plan),
                Some(EventKind::ReconciliationInconclusive),
                "{what}"
            );
            assert_eq!(plan.step.counters.failures, FailureCount::Keep, "{what}");
            assert_eq!(plan.step.counters.reconcile_attempts, 1, "{what}");
            assert_eq!(plan.step.next_in.unwrap().0, waits, "{what}");
            assert_eq!(
                plan.step.retry_after,
                delay.map(|d| p.retry_after.clamp(Duration::from_secs(d))),
                "{what}"
            );
            legal(&op, &plan);
        }
    }
}

#[test]
fn lookups_and_resends_settle_or_stay_inconclusive() {
    let now = t0();
    let lookup_only = Policy {
        reconcile: ReconcileMethod::Lookup,
        ..policy()
    };
    let op = record(State::Reconciliation);
    let cases = [
        (
            LookupOutcome::Found {
                job_ids: vec!["job_1".into()],
            },
            EventKind::CreateAccepted,
        ),
        (
            LookupOutcome::Found {
                job_ids: vec!["job_1".into(), "job_2".into()],
            },
            EventKind::ContractViolated,
        ),
        (
            LookupOutcome::NotFound,
            EventKind::ReconciliationInconclusive,
        ),
        (
            LookupOutcome::Failed {
                error_class: "timeout".into(),
            },
            EventKind::ReconciliationInconclusive,
        ),
    ];
    for (outcome, expected) in cases {
        let what = format!("{outcome:?}");
        match after_lookup(&op, &lookup_only, called(CallKind::Lookup, outcome), now) {
            AfterLookup::Write(plan) => {
                assert_eq!(kind(&plan), Some(expected), "{what}");
                assert_eq!(plan.step.counters.reconcile_attempts, 1, "{what}");
                legal(&op, &plan);
            }
            AfterLookup::Resend { .. } => panic!("lookup-only contract resent: {what}"),
        }
    }
    // Resend contracts: the lookup is a cross-check; two jobs for our reference stop at once.
    match after_lookup(
        &op,
        &policy(),
        called(
            CallKind::Lookup,
            LookupOutcome::Found {
                job_ids: vec!["job_1".into(), "job_2".into()],
            },
        ),
        now,
    ) {
        AfterLookup::Write(plan) => assert_eq!(kind(&plan), Some(EventKind::ContractViolated)),
        AfterLookup::Resend { .. } => panic!("resent despite two jobs"),
    }
    let accepted = |id: &str| CreateOutcome::Accepted {
        job_id: id.into(),
        remote_state: None,
        status_url: None,
        duplicate: true,
        retry_after: None,
    };
    let rejected = |status: u16| CreateOutcome::Rejected {
        http_status: Some(status),
        reason: "no".into(),
    };
    let fetched = FetchedResult {
        bytes: bytes::Bytes::from_static(b"{}"),
        content_type: Some("application/json".into()),
        checksum: None,
    };
    let cases: Vec<(CreateOutcome, Option<Vec<String>>, EventKind)> = vec![
        (
            accepted("job_1"),
            Some(vec!["job_1".into()]),
            EventKind::CreateAccepted,
        ),
        (accepted("job_1"), None, EventKind::CreateAccepted),
        (
            accepted("job_2"),
            Some(vec!["job_1".into()]),
            EventKind::ContractViolated,
        ),
        // A refused resend settles nothing about the first send: the job the lookup found is
        // taken; "in progress" (409, 425) is tried again; anything else goes to a person. Never
        // `failed`, which would leave a job running unwatched.
        (
            rejected(422),
            Some(vec!["job_1".into()]),
            EventKind::CreateAccepted,
        ),
        (
            rejected(422),
            Some(vec![]),
            EventKind::ReconciliationExhausted,
        ),
        (rejected(422), None, EventKind::ReconciliationExhausted),
        (rejected(409), None, EventKind::ReconciliationInconclusive),
        // The one job the lookup found is ours whatever the resend answered short of naming one,
        // unless the resend may have reached the provider: the next lookup cross-checks it.
        (
            CreateOutcome::Ambiguous {
                error_class: "timeout".into(),
            },
            Some(vec!["job_1".into()]),
            EventKind::ReconciliationInconclusive,
        ),
        (
            CreateOutcome::RetryLater {
                delay: None,
                reason: "429".into(),
                maybe_processed: false,
            },
            Some(vec!["job_1".into()]),
            EventKind::CreateAccepted,
        ),
        (
            rejected(425),
            Some(vec![]),
            EventKind::ReconciliationInconclusive,
        ),
        // A resend answered with the finished result: collected, unless it names another job.
        (
            CreateOutcome::Completed {
                job_id: Some("job_1".into()),
                result: fetched.clone(),
            },
            Some(vec!["job_1".into()]),
            EventKind::CreateCompleted,
        ),
        (
            CreateOutcome::Completed {
                job_id: None,
                result: fetched.clone(),
            },
            None,
            EventKind::CreateCompleted,
        ),
        (
            CreateOutcome::Completed {
                job_id: Some("job_2".into()),
                result: fetched.clone(),
            },
            Some(vec!["job_1".into()]),
            EventKind::ContractViolated,
        ),
        (
            CreateOutcome::Ambiguous {
                error_class: "timeout".into(),
            },
            None,
            EventKind::ReconciliationInconclusive,
        ),
        (
            CreateOutcome::RetryLater {
                delay: None,
                reason: "429".into(),
                maybe_processed: false,
            },
            None,
            EventKind::ReconciliationInconclusive,
        ),
        (
            CreateOutcome::NotSent {
                error_class: "connect_failed".into(),
            },
            None,
            EventKind::ReconciliationInconclusive,
        ),
    ];
    for (outcome, looked_up, expected) in cases {
        let what = format!("{outcome:?} after {looked_up:?}");
        let kept = matches!(outcome, CreateOutcome::Completed { .. }).then(|| Ok(kept()));
        let plan = after_resend(
            &op,
            &policy(),
            called(CallKind::Create, outcome),
            Some((looked_up, call(CallKind::Lookup), None)),
            kept,
            now,
        );
        assert_eq!(kind(&plan), Some(expected), "{what}");
        if expected == EventKind::CreateCompleted {
            let detail = plan.step.detail.as_ref().expect("a kept result is chained");
            assert!(
                detail["sync_result"]["sha256"].is_string() && detail["lookup"].is_object(),
                "{what}: the kept result's digest and the lookup are both in the link: {detail}"
            );
        }
        assert!(
            plan.first.as_ref().and_then(|s| s.call.as_ref()).is_some(),
            "{what}: the lookup gets its own call-log row"
        );
        assert_eq!(plan.step.counters.reconcile_attempts, 1, "{what}");
        legal(&op, &plan);
    }
}

#[test]
fn status_outcomes_map_to_one_event_each_and_every_read_counts() {
    let p = policy();
    let now = t0();
    let budget_spent = |mut op: OperationRecord| {
        op.failure_count = p.max_failures as i32;
        op
    };
    for state in [
        State::Accepted,
        State::Observing,
        State::CancelRequested,
        State::Cancelling,
    ] {
        let base = if matches!(state, State::CancelRequested | State::Cancelling) {
            with_cancel(record(state))
        } else {
            record(state)
        };
        let cases: Vec<(OperationRecord, StatusOutcome, EventKind)> = vec![
            (
                base.clone(),
                status(Some(Phase::Succeeded), None),
                EventKind::RemoteSucceeded,
            ),
            (
                base.clone(),
                status(Some(Phase::Failed), None),
                EventKind::RemoteFailed,
            ),
            (
                base.clone(),
                status(Some(Phase::Cancelled), None),
                // Only a cancel we asked for is confirmed by the provider's cancelled state.
                if matches!(state, State::CancelRequested | State::Cancelling) {
                    EventKind::RemoteCancelled
                } else {
                    EventKind::RemoteCancelledUnasked
                },
            ),
            (
                base.clone(),
                status(Some(Phase::Running), Some(Duration::from_secs(3))),
                EventKind::RemoteProgress,
            ),
            (base.clone(), status(None, None), EventKind::RemoteProgress),
            (
                base.clone(),
                StatusOutcome::RetryLater {
                    delay: None,
                    reason: "429".into(),
                },
                EventKind::CallFailed,
            ),
            (
                base.clone(),
                StatusOutcome::Failed {
                    error_class: "http_500".into(),
                },
                EventKind::CallFailed,
            ),
            (
                budget_spent(base.clone()),
                StatusOutcome::Failed {
                    error_class: "http_500".into(),
                },
                EventKind::RetryBudgetExhausted,
            ),
            (
                budget_spent(base.clone()),
                StatusOutcome::Rejected {
                    http_status: Some(404),
                    reason: "gone".into(),
                },
                EventKind::RetryBudgetExhausted,
            ),
            // Pointed outside the contract's origins: held for a person at once.
            (
                base.clone(),
                StatusOutcome::Refused {
                    url: "http://127.0.0.1:9/x".into(),
                },
                EventKind::UrlRefused,
            ),
        ];
        for (op, outcome, expected) in cases {
            let what = format!("{state} {outcome:?}");
            let plan = after_status(&op, &p, called(CallKind::Status, outcome), now, 0.5);
            assert_eq!(kind(&plan), Some(expected), "{what}");
            assert_eq!(plan.step.counters.polls, 1, "{what}: every read counts");
            legal(&op, &plan);
        }
    }
}

#[test]
fn retry_later_without_retry_after_backs_off_and_with_it_is_remembered() {
    let p = policy();
    let now = t0();
    let mut op = record(State::Observing);
    let mut delays = Vec::new();
    for polls in 0..6 {
        op.poll_count = polls;
        let plan = after_status(
            &op,
            &p,
            called(
                CallKind::Status,
                StatusOutcome::RetryLater {
                    delay: None,
                    reason: "429".into(),
                },
            ),
            now,
            0.5,
        );
        assert_eq!(
            plan.step.counters.failures,
            FailureCount::Keep,
            "not a failure"
        );
        delays.push(plan.step.next_in.unwrap().0);
    }
    assert!(
        delays.windows(2).all(|w| w[1] >= w[0]) && delays[5] > delays[0] * 4,
        "{delays:?}"
    );
    assert!(delays.iter().all(|d| *d <= p.backoff.cap));
    // A Retry-After is kept (clamped) for every later read, not only the next one.
    let plan = after_status(
        &op,
        &p,
        called(
            CallKind::Status,
            status(Some(Phase::Running), Some(Duration::MAX)),
        ),
        now,
        0.5,
    );
    assert_eq!(plan.step.retry_after, Some(p.retry_after.max));
}

#[test]
fn the_first_poll_after_a_cancel_honours_the_last_retry_after() {
    let p = policy();
    let now = t0();
    let mut op = with_cancel(record(State::CancelRequested));
    let accepted = |ra: Option<Duration>| {
        called(
            CallKind::Cancel,
            CancelOutcome::Accepted {
                http_status: Some(202),
                retry_after: ra,
            },
        )
    };
    // Nothing said: soon.
    let plan = after_cancel(&op, &p, accepted(None), now, 0.5);
    assert_eq!(kind(&plan), Some(EventKind::CancelSent));
    assert!(plan.step.next_in.unwrap().0 <= Duration::from_secs(1));
    // An earlier status read said Retry-After: 4 s from now.
    op.poll_not_before = Some(now + Td::seconds(4));
    let plan = after_cancel(&op, &p, accepted(None), now, 0.5);
    assert_eq!(
        plan.step.next_in,
        Some((Duration::from_secs(4), "retry_after"))
    );
    // The cancel answer itself said Retry-After: 9 s.
    let plan = after_cancel(&op, &p, accepted(Some(Duration::from_secs(9))), now, 0.5);
    assert_eq!(plan.step.next_in.unwrap().0, Duration::from_secs(9));
    assert_eq!(plan.step.retry_after, Some(Duration::from_secs(9)));
    // Refused: polling tells the truth, after the Retry-After.
    let plan = after_cancel(
        &op,
        &p,
        called(
            CallKind::Cancel,
            CancelOutcome::Rejected {
                http_status: Some(409),
                reason: "already done".into(),
            },
        ),
        now,
        0.5,
    );
    assert_eq!(kind(&plan), Some(EventKind::CallFailed));
    assert_eq!(plan.step.next_in.unwrap().0, Duration::from_secs(4));
    // The answer is itself the confirmation: the cancel is sent, then confirmed, both recorded.
    let plan = after_cancel(
        &op,
        &p,
        called(
            CallKind::Cancel,
            CancelOutcome::Confirmed {
                http_status: Some(200),
                remote_state: "dismissed".into(),
            },
        ),
        now,
        0.5,
    );
    assert_eq!(kind(&plan), Some(EventKind::RemoteCancelled));
    let first = plan.first.as_ref().expect("the cancel call's own step");
    assert_eq!(
        first.event.as_ref().map(|e| e.kind()),
        Some(EventKind::CancelSent)
    );
    assert!(first.call.is_some() && plan.step.call.is_none());
    assert_eq!(first.counters.cancel_attempts, 1);
    legal(&op, &plan);
    let later = || CancelOutcome::RetryLater {
        delay: Some(Duration::from_secs(2)),
        reason: "429".into(),
    };
    let mut late = op.clone();
    late.cancel_deadline = Some(now);
    let unsent = || CancelOutcome::NotSent {
        error_class: "connect_failed".into(),
    };
    // "Not now" within the window is no attempt (the cancel goes again, idempotent or not, after
    // the provider's wait); nor is a cancel that never left, though it is a failure (backed off);
    // past the window either is one, as is any other failure.
    for (op, outcome, attempts, failures) in [
        (&op, later(), 0, FailureCount::Keep),
        (&late, later(), 1, FailureCount::Increment),
        (&op, unsent(), 0, FailureCount::Increment),
        (&late, unsent(), 1, FailureCount::Increment),
        (
            &op,
            CancelOutcome::Failed {
                error_class: "timeout".into(),
                retry_after: None,
            },
            1,
            FailureCount::Increment,
        ),
    ] {
        let plan = after_cancel(op, &p, called(CallKind::Cancel, outcome), now, 0.5);
        assert_eq!(kind(&plan), Some(EventKind::CallFailed));
        assert_eq!(plan.step.counters.failures, failures);
        assert_eq!(plan.step.counters.cancel_attempts, attempts);
        legal(op, &plan);
    }
    let plan = after_cancel(&op, &p, called(CallKind::Cancel, later()), now, 0.5);
    assert_eq!(plan.step.next_in.unwrap().0, Duration::from_secs(2));
    // A failure that came with a `Retry-After` (a gateway's 503 to a cancel that may not be sent
    // again) is an attempt, and the next read waits the provider's time out.
    let gateway = CancelOutcome::Failed {
        error_class: "http_503".into(),
        retry_after: Some(Duration::from_secs(7)),
    };
    let plan = after_cancel(&op, &p, called(CallKind::Cancel, gateway), now, 0.5);
    assert_eq!(plan.step.counters.cancel_attempts, 1);
    assert_eq!(plan.step.next_in.unwrap().0, Duration::from_secs(7));
    assert_eq!(plan.step.retry_after, Some(Duration::from_secs(7)));
    // Never past the cancel window: a read of the job comes before a person is asked.
    let mut closing = op.clone();
    closing.cancel_deadline = Some(now + chrono::Duration::seconds(3));
    let gateway = CancelOutcome::Failed {
        error_class: "http_503".into(),
        retry_after: Some(Duration::from_secs(7)),
    };
    let plan = after_cancel(&closing, &p, called(CallKind::Cancel, gateway), now, 0.5);
    assert_eq!(plan.step.next_in.unwrap().0, Duration::from_secs(3));
    assert_eq!(plan.step.retry_after, Some(Duration::from_secs(3)));
    // A refusal after failures to reach the provider ends them: the refused cancel is not sent
    // again (idempotent or not), and the next status read has its whole budget.
    let mut tried = op.clone();
    tried.failure_count = p.max_failures as i32;
    let refused = after_cancel(
        &tried,
        &p,
        called(
            CallKind::Cancel,
            CancelOutcome::Rejected {
                http_status: Some(409),
                reason: "already finished".into(),
            },
        ),
        now,
        0.5,
    );
    assert_eq!(refused.step.counters.failures, FailureCount::Reset);
    assert_eq!(refused.step.counters.cancel_attempts, 1);
    let mut after = tried.clone();
    after.failure_count = 0;
    after.cancel_attempts = 1;
    assert!(
        !matches!(
            next(&after, &p, EPOCH, now),
            Action::Call(Call::Cancel { .. })
        ),
        "a refused cancel is not sent again"
    );
    // An unreachable provider is asked less and less often: the wait grows with the failures.
    let waits: Vec<Duration> = (0..4)
        .map(|failures| {
            let mut o = op.clone();
            o.failure_count = failures;
            after_cancel(&o, &p, called(CallKind::Cancel, unsent()), now, 0.5)
                .step
                .next_in
                .unwrap()
                .0
        })
        .collect();
    assert!(waits.windows(2).all(|w| w[1] > w[0]), "{waits:?}");
    // A contract whose cancel is not idempotent still sends it again after a deferral.
    let once = Policy {
        cancel_idempotent: false,
        ..p.clone()
    };
    let mut deferred = op.clone();
    deferred.failure_count = 1;
    assert_eq!(
        call_of(next(&deferred, &once, EPOCH, now)),
        Call::Cancel { attempt: 1 }
    );
}

/// A result whose collection keeps killing its workers (a pathological one parsed past the memory
/// limit) is stopped for a person once enough holders were lost in a row, before another fetch;
/// fewer losses are a deploy or a node and fetch again, and so does a synchronous result.
#[test]
fn lost_holders_in_a_row_stop_result_collecting_for_a_person() {
    let p = policy();
    let now = t0();
    let mut op = record(State::ResultCollecting);
    op.takeovers = STALLED_AFTER_TAKEOVERS - 1;
    assert!(matches!(
        call_of(next(&op, &p, EPOCH, now)),
        Call::FetchResult { .. }
    ));
    op.takeovers = STALLED_AFTER_TAKEOVERS;
    let Action::Write(plan) = next(&op, &p, EPOCH, now) else {
        panic!("a fetch after {STALLED_AFTER_TAKEOVERS} lost holders");
    };
    assert_eq!(
        plan.step.event,
        Some(Event::ResultStalled {
            takeovers: STALLED_AFTER_TAKEOVERS
        })
    );
    assert!(plan.step.call.is_none(), "nothing is sent");
    let to = transition(State::ResultCollecting, plan.step.event.as_ref().unwrap()).unwrap();
    assert_eq!(to.to, State::ResultStalled);
    assert!(to.to.needs_human());
    // A synchronous result is read from the store, and may be what stops them as well.
    op.provider_context = serde_json::json!({"sync_result": {"location": "db:x", "sha256": "00"}});
    assert!(matches!(next(&op, &p, EPOCH, now), Action::Write(_)));
    // Every other automated state goes on: their answers are small and bounded.
    for state in State::ALL.iter().filter(|s| s.is_automated()) {
        if *state == State::ResultCollecting {
            continue;
        }
        let mut other = record(*state);
        other.takeovers = 10;
        if let Action::Write(plan) = next(&other, &p, EPOCH, now) {
            assert_ne!(
                plan.step.event.as_ref().map(Event::kind),
                Some(EventKind::ResultStalled),
                "{state}"
            );
        }
    }
}

#[test]
fn collection_outcomes_map_to_one_event_each() {
    let p = policy();
    let op = record(State::ResultCollecting);
    let valid = |kept: Result<Kept, String>| Collected::Valid {
        fetched_content_type: Some("application/json".into()),
        checks: vec!["sha256".into()],
        summary: serde_json::json!({}),
        kept,
    };
    let mut spent = op.clone();
    spent.failure_count = p.max_failures as i32;
    let now = t0();
    spent.result_deadline = now + Td::seconds(60);
    let mut late = spent.clone();
    late.result_deadline = now;
    let later = |secs: Option<u64>| Collected::RetryLater {
        delay: secs.map(Duration::from_secs),
        reason: "429".into(),
    };
    let cases: Vec<(&OperationRecord, Collected, EventKind)> = vec![
        (&op, valid(Ok(kept())), EventKind::ResultValidated),
        (&op, valid(Err("disk".into())), EventKind::ResultFetchFailed),
        // A result store that keeps failing spends the budget like any failed fetch; past it the
        // result still exists, so it is held for a person, not ended as unavailable.
        (&spent, valid(Err("disk".into())), EventKind::ResultNotKept),
        (
            &op,
            Collected::Invalid {
                violations: vec!["schema".into()],
                kept: Some(kept()),
            },
            EventKind::ResultInvalid,
        ),
        (
            &op,
            Collected::TooLarge { limit: 10 },
            EventKind::ResultInvalid,
        ),
        (
            &op,
            Collected::Unavailable {
                reason: "404".into(),
            },
            EventKind::ResultUnavailable,
        ),
        (
            &op,
            Collected::Failed {
                error_class: "timeout".into(),
            },
            EventKind::ResultFetchFailed,
        ),
        (
            &spent,
            Collected::Failed {
                error_class: "timeout".into(),
            },
            EventKind::RetryBudgetExhausted,
        ),
        (
            &op,
            Collected::Refused {
                url: "http://127.0.0.1:9/r".into(),
            },
            EventKind::UrlRefused,
        ),
        // Parsed, it would take more than the worker's room for checks: held, never parsed.
        (
            &op,
            Collected::BeyondCheckMemory {
                room: 256 << 20,
                kept: Some(kept()),
            },
            EventKind::ResultBeyondCheckMemory,
        ),
        // A result kept at create that cannot be read back here: held, not ended.
        (
            &op,
            Collected::NotReadable {
                reason: "kept on another host".into(),
            },
            EventKind::ResultNotReadable,
        ),
        // "Not now" spends no failure, even with the budget spent, until the result deadline.
        (&spent, later(Some(7)), EventKind::ResultFetchFailed),
        (&late, later(Some(7)), EventKind::RetryBudgetExhausted),
    ];
    for (op, collected, expected) in cases {
        let what = format!("{collected:?}");
        let plan = after_collect(
            op,
            &p,
            collected,
            Some((call(CallKind::Result), None)),
            now,
            0.5,
        );
        assert_eq!(kind(&plan), Some(expected), "{what}");
        assert_eq!(plan.step.counters.result_attempts, 1, "{what}");
        legal(op, &plan);
    }
    // It waits out the provider's Retry-After, and counts nothing against the budget.
    let plan = after_collect(&op, &p, later(Some(7)), None, now, 0.5);
    assert_eq!(
        plan.step.next_in,
        Some((Duration::from_secs(7), "retry_after"))
    );
    assert_eq!(plan.step.counters.failures, FailureCount::Keep);
    let plan = after_collect(&op, &p, later(None), None, now, 0.5);
    assert!(plan.step.next_in.is_some_and(|(d, _)| d > Duration::ZERO));
    // A fresh URL read from the status after a refused download (whose refusal was spent already):
    // downloaded at once by the same worker, nothing more spent, even with the budget spent.
    for fresh in [true, false] {
        let plan = after_collect(
            &spent,
            &p,
            Collected::Renewed {
                fresh,
                observed: Observation {
                    remote_state: Some("succeeded".into()),
                    status_url: Some("/v1/operations/7/3".into()),
                    ..Observation::default()
                },
            },
            Some((call(CallKind::Status), None)),
            now,
            0.5,
        );
        assert_eq!(kind(&plan), Some(EventKind::ResultUrlRenewed));
        // The status read is recorded as any is: a status URL it moved to is followed next.
        let seen = plan
            .step
            .observation
            .as_ref()
            .expect("the read's observation");
        assert_eq!(seen.status_url.as_deref(), Some("/v1/operations/7/3"));
        assert!(plan.go_on && plan.step.keep_lease && plan.step.next_in.is_none());
        assert_eq!(plan.step.counters.failures, FailureCount::Keep);
        legal(&spent, &plan);
    }
}

#[test]
fn result_collection_reads_a_kept_sync_result_or_does_the_final_get_first() {
    let now = t0();
    let mut op = record(State::ResultCollecting);
    let p = Policy {
        final_get: true,
        ..policy()
    };
    assert_eq!(
        call_of(next(&op, &p, EPOCH, now)),
        Call::FinalGet { attempt: 1 }
    );
    // A read that failed, or was told "not now", is made again: not marked done, the read
    // counted, the provider's wait honoured; the result is not fetched without its hints. A
    // failure spends the budget; "not now" does not before the result deadline (a provider that
    // throttles must not turn a succeeded job into result_unavailable), and does after it.
    let throttled = || StatusOutcome::RetryLater {
        delay: Some(Duration::from_secs(30)),
        reason: "429".into(),
    };
    let mut spent = op.clone();
    spent.failure_count = p.max_failures as i32;
    for (at, outcome, failures, wait) in [
        (
            &op,
            StatusOutcome::Failed {
                error_class: "timeout".into(),
            },
            FailureCount::Increment,
            None,
        ),
        (
            &spent,
            throttled(),
            FailureCount::Keep,
            Some(Duration::from_secs(30)),
        ),
    ] {
        let plan = after_final_get(at, &p, called(CallKind::Status, outcome), now, 0.3);
        assert!(!plan.go_on);
        assert!(plan.step.observation.is_none(), "{:?}", plan.step);
        assert_eq!(plan.step.counters.failures, failures);
        assert_eq!(plan.step.counters.polls, 1, "each read is an attempt");
        assert!(matches!(
            plan.step.event,
            Some(Event::ResultFetchFailed { .. })
        ));
        if let Some(w) = wait {
            assert!(plan.step.next_in.unwrap().0 >= w, "{:?}", plan.step.next_in);
        }
    }
    // Nor is it skipped when refused, or when the resource says the job is not succeeded (a
    // provider that went back, a stale replica): each is a failed read, counted.
    for outcome in [
        StatusOutcome::Rejected {
            http_status: Some(404),
            reason: "HTTP 404: no such resource".into(),
        },
        status(Some(Phase::Failed), None),
        status(Some(Phase::Cancelled), None),
    ] {
        // What the read said of the result is not kept; what else it set is.
        let mut read = called(CallKind::Status, outcome.clone());
        read.context = Some(serde_json::json!({
            "result": {"result_url": "https://p.example/other"},
            "cookies": ["c"],
        }));
        let plan = after_final_get(&op, &p, read, now, 0.3);
        assert!(!plan.go_on, "{outcome:?}");
        let kept = plan
            .step
            .observation
            .as_ref()
            .unwrap()
            .provider_context
            .as_ref()
            .unwrap();
        assert_eq!(kept, &serde_json::json!({"cookies": ["c"]}), "{outcome:?}");
        assert_eq!(plan.step.counters.failures, FailureCount::Increment);
        assert!(
            matches!(&plan.step.event, Some(Event::ResultFetchFailed { error_class }) if error_class.starts_with("final GET: ")),
            "{outcome:?}: {:?}",
            plan.step.event
        );
        assert!(kept.get("final_get_done").is_none(), "not marked done");
    }
    // A URL outside the contract's origins: nothing was sent, a person decides.
    let plan = after_final_get(
        &op,
        &p,
        called(
            CallKind::Status,
            StatusOutcome::Refused {
                url: "https://elsewhere.example/x".into(),
            },
        ),
        now,
        0.3,
    );
    assert!(matches!(plan.step.event, Some(Event::UrlRefused { .. })));
    // A state the contract does not map says nothing against the success already seen; nor does
    // one that reads as running (the resource's own, maybe, not the job's).
    for unsaid in [status(None, None), status(Some(Phase::Running), None)] {
        let plan = after_final_get(&op, &p, called(CallKind::Status, unsaid), now, 0.3);
        assert!(plan.go_on);
    }
    let late = spent.result_deadline + chrono::Duration::seconds(1);
    let plan = after_final_get(&spent, &p, called(CallKind::Status, throttled()), late, 0.3);
    assert!(
        matches!(plan.step.event, Some(Event::RetryBudgetExhausted { .. })),
        "{:?}",
        plan.step.event
    );
    let plan = after_final_get(
        &op,
        &p,
        called(CallKind::Status, status(Some(Phase::Succeeded), None)),
        now,
        0.3,
    );
    assert!(plan.go_on);
    assert_eq!(
        plan.step.observation.unwrap().provider_context.unwrap()["final_get_done"],
        true
    );
    op.provider_context = serde_json::json!({"final_get_done": true});
    assert_eq!(
        call_of(next(&op, &p, EPOCH, now)),
        Call::FetchResult { attempt: 1 }
    );
    op.provider_context = serde_json::json!({"sync_result": {"location": "l", "sha256": "s"}});
    assert!(matches!(
        call_of(next(&op, &p, EPOCH, now)),
        Call::SyncResult { .. }
    ));
}

/// The sweep: in every automated state, for every outcome its call can produce, the decided event
/// is allowed by the table in that state (the worker never writes a step the store must refuse).
#[test]
fn every_decision_is_allowed_by_the_table() {
    let now = t0();
    let creates = || {
        vec![
            CreateOutcome::Accepted {
                job_id: "job_1".into(),
                remote_state: None,
                status_url: None,
                duplicate: false,
                retry_after: None,
            },
            CreateOutcome::Accepted {
                job_id: "job_9".into(),
                remote_state: None,
                status_url: None,
                duplicate: true,
                retry_after: None,
            },
            CreateOutcome::Rejected {
                http_status: Some(400),
                reason: "x".into(),
            },
            CreateOutcome::Ambiguous {
                error_class: "x".into(),
            },
            CreateOutcome::RetryLater {
                delay: None,
                reason: "x".into(),
                maybe_processed: false,
            },
            CreateOutcome::NotSent {
                error_class: "x".into(),
            },
        ]
    };
    let statuses = || {
        let mut v: Vec<StatusOutcome> = [
            Some(Phase::Queued),
            Some(Phase::Running),
            Some(Phase::Succeeded),
            Some(Phase::Failed),
            Some(Phase::Cancelled),
            None,
        ]
        .into_iter()
        .map(|ph| status(ph, Some(Duration::from_secs(1))))
        .collect();
        v.push(StatusOutcome::RetryLater {
            delay: None,
            reason: "x".into(),
        });
        v.push(StatusOutcome::Failed {
            error_class: "x".into(),
        });
        v
    };
    let automated: Vec<State> = State::ALL
        .iter()
        .copied()
        .filter(|s| s.is_automated())
        .collect();
    let mut decided = 0;
    for state in automated {
        for cancel in [false, true] {
            for method in [
                ReconcileMethod::Resend,
                ReconcileMethod::Lookup,
                ReconcileMethod::None,
            ] {
                let p = Policy {
                    reconcile: method,
                    lookup: method != ReconcileMethod::None,
                    ..policy()
                };
                let mut op = record(state);
                if cancel || matches!(state, State::CancelRequested | State::Cancelling) {
                    op = with_cancel(op);
                }
                let plans: Vec<Plan> = match next(&op, &p, EPOCH, now) {
                    Action::Write(plan) => vec![*plan],
                    Action::Call(Call::Create { .. }) => creates()
                        .into_iter()
                        .map(|o| after_create(&op, &p, called(CallKind::Create, o), None, now, 0.3))
                        .collect(),
                    Action::Call(Call::Resend { .. }) => creates()
                        .into_iter()
                        .map(|o| {
                            after_resend(&op, &p, called(CallKind::Create, o), None, None, now)
                        })
                        .collect(),
                    Action::Call(Call::Lookup { .. }) => [
                        LookupOutcome::NotFound,
                        LookupOutcome::Found {
                            job_ids: vec!["job_1".into()],
                        },
                        LookupOutcome::Failed {
                            error_class: "x".into(),
                        },
                        LookupOutcome::RetryLater {
                            delay: Some(Duration::from_secs(5)),
                            reason: "429".into(),
                        },
                    ]
                    .into_iter()
                    .flat_map(
                        |o| match after_lookup(&op, &p, called(CallKind::Lookup, o), now) {
                            AfterLookup::Write(plan) => vec![plan],
                            AfterLookup::Resend { looked_up, .. } => creates()
                                .into_iter()
                                .map(|o| {
                                    after_resend(
                                        &op,
                                        &p,
                                        called(CallKind::Create, o),
                                        Some((looked_up.clone(), call(CallKind::Lookup), None)),
                                        None,
                                        now,
                                    )
                                })
                                .collect(),
                        },
                    )
                    .collect(),
                    Action::Call(Call::Status { .. }) => statuses()
                        .into_iter()
                        .map(|o| after_status(&op, &p, called(CallKind::Status, o), now, 0.3))
                        .collect(),
                    Action::Call(Call::Cancel { .. }) => [
                        CancelOutcome::Accepted {
                            http_status: Some(202),
                            retry_after: None,
                        },
                        CancelOutcome::Confirmed {
                            http_status: Some(200),
                            remote_state: "dismissed".into(),
                        },
                        CancelOutcome::Rejected {
                            http_status: Some(409),
                            reason: "x".into(),
                        },
                        CancelOutcome::RetryLater {
                            delay: None,
                            reason: "x".into(),
                        },
                        CancelOutcome::NotSent {
                            error_class: "x".into(),
                        },
                        CancelOutcome::Failed {
                            error_class: "x".into(),
                            retry_after: None,
                        },
                    ]
                    .into_iter()
                    .map(|o| after_cancel(&op, &p, called(CallKind::Cancel, o), now, 0.3))
                    .collect(),
                    Action::Call(
                        Call::FetchResult { .. } | Call::SyncResult { .. } | Call::NoResult,
                    ) => {
                        vec![after_collect(
                            &op,
                            &p,
                            Collected::Unavailable { reason: "x".into() },
                            None,
                            now,
                            0.3,
                        )]
                    }
                    Action::Call(Call::FinalGet { .. }) => {
                        vec![after_final_get(
                            &op,
                            &p,
                            called(CallKind::Status, status(Some(Phase::Succeeded), None)),
                            now,
                            0.3,
                        )]
                    }
                };
                for plan in plans {
                    legal(&op, &plan);
                    decided += 1;
                }
            }
        }
    }
    assert!(decided > 100, "{decided} decisions swept");
}

/// A call held back by the provider's fleet-wide rate: nothing is sent, no event, the operation is
/// due again after the wait, and only a create clears the "may have been sent" mark the claim set
/// (provably nothing left); every other call keeps the mark as it is.
#[test]
fn a_deferred_call_sends_nothing_and_comes_back_after_the_wait() {
    let wait = Duration::from_millis(700);
    for (call, mark) in [
        (
            Call::Create {
                attempt: 1,
                mark: false,
            },
            SendMark::Clear,
        ),
        (Call::Status { attempt: 1 }, SendMark::Keep),
        (Call::Cancel { attempt: 1 }, SendMark::Keep),
        (Call::Lookup { attempt: 1 }, SendMark::Keep),
        (Call::FetchResult { attempt: 1 }, SendMark::Keep),
    ] {
        let plan = deferred(&call, wait);
        assert!(plan.step.event.is_none(), "{call:?}");
        assert!(plan.step.call.is_none(), "{call:?}");
        assert!(!plan.go_on && !plan.step.keep_lease, "{call:?}");
        assert_eq!(plan.step.next_in.map(|n| n.0), Some(wait), "{call:?}");
        assert_eq!(plan.step.send_mark, mark, "{call:?}");
    }
}

#[test]
fn a_contract_without_a_result_collects_nothing() {
    let op = record(State::ResultCollecting);
    let p = Policy {
        no_result: true,
        ..policy()
    };
    assert!(matches!(
        next(&op, &p, EPOCH, Utc::now()),
        Action::Call(Call::NoResult)
    ));
    assert!(matches!(
        next(&op, &policy(), EPOCH, Utc::now()),
        Action::Call(Call::FetchResult { .. })
    ));
}
