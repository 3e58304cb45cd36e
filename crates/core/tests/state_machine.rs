//! The state machine's guarantees, by property over random event sequences, and the freshness of the
//! committed transition table.

use jobtrail_core::machine::{RULES, To, render_markdown, rule_for, transition};
use jobtrail_core::*;
use proptest::prelude::*;

fn decision() -> Decision {
    Decision::new("operator", "checked").unwrap()
}

/// One event of every kind, with valid evidence.
fn sample_events() -> Vec<Event> {
    vec![
        Event::CreateAccepted {
            remote_job_id: "job_1".into(),
            remote_state: Some("queued".into()),
        },
        Event::CreateCompleted {
            remote_job_id: None,
        },
        Event::CreateAmbiguous {
            error_class: "timeout".into(),
        },
        Event::CreateRejected {
            http_status: Some(422),
            reason: "bad".into(),
        },
        Event::CreateExpired { attempts: 2 },
        Event::ReconciliationStarted {
            method: "resend".into(),
        },
        Event::ReconciliationInconclusive {
            error_class: "timeout".into(),
        },
        Event::ReconciliationExhausted {
            why: "deadline".into(),
        },
        Event::ContractViolated {
            recorded_job_id: "job_1".into(),
            other_job_id: "job_2".into(),
        },
        Event::JobHeldElsewhere {
            remote_job_id: "job_1".into(),
            held_by: "op_01KB0000000000000000000000".into(),
        },
        Event::RemoteProgress {
            remote_state: "running".into(),
            known: true,
        },
        Event::RemoteSucceeded {
            remote_state: "done".into(),
        },
        Event::RemoteFailed {
            remote_state: "failed".into(),
            reason: None,
        },
        Event::RemoteCancelled(CancelConfirmation::from_provider("cancelled").unwrap()),
        Event::RemoteCancelledUnasked {
            remote_state: "Canceled".into(),
        },
        Event::CallFailed {
            error_class: "503".into(),
        },
        Event::ResultDeadlinePassed,
        Event::UrlRefused {
            url: "http://127.0.0.1:9/elsewhere".into(),
        },
        Event::ResultStalled { takeovers: 3 },
        Event::ResultBeyondCheckMemory {
            room_bytes: 256 << 20,
        },
        Event::ResultNotKept {
            why: "result store: No space left on device".into(),
        },
        Event::ResultNotReadable {
            why: "/var/lib/jobtrail/results/ab/cd: no such file".into(),
        },
        Event::RetryBudgetExhausted {
            error_class: "timeout".into(),
            failures: 9,
        },
        Event::CancelRequested(CancelRequest::new("alice", "wrong range").unwrap()),
        Event::Withdraw(CancelRequest::new("alice", "never mind").unwrap()),
        Event::CancelSent {
            http_status: Some(202),
        },
        Event::CancelDeadlinePassed,
        Event::ResultValidated(
            ValidatedResult::new(
                "file:///r",
                3,
                &"a".repeat(64),
                None,
                vec!["sha256".into()],
                serde_json::json!({}),
            )
            .unwrap(),
        ),
        Event::ResultFetchFailed {
            error_class: "reset".into(),
        },
        Event::ResultUrlRenewed { fresh: true },
        Event::ResultUnavailable { why: "404".into() },
        Event::ResultInvalid {
            violations: vec!["checksum".into()],
        },
        Event::AdoptRemoteJob {
            decision: decision(),
            remote_job_id: "job_9".into(),
        },
        Event::DeclareNotCreated {
            decision: decision(),
        },
        Event::ConfirmCancellation {
            decision: decision(),
            evidence: "ticket 7".into(),
        },
        Event::ChooseRemoteJob {
            decision: decision(),
            remote_job_id: "job_1".into(),
        },
        Event::Resume {
            decision: decision(),
        },
        Event::Abandon {
            decision: decision(),
        },
        Event::Superseded {
            decision: decision(),
            new_operation_id: "op_x".into(),
        },
    ]
}

#[test]
fn every_event_kind_has_a_sample() {
    let kinds: std::collections::BTreeSet<_> = sample_events().iter().map(Event::kind).collect();
    assert_eq!(kinds.len(), EventKind::ALL.len());
}

#[test]
fn evidence_cannot_be_faked() {
    assert!(CancelRequest::new("", "reason").is_err());
    assert!(CancelRequest::new("alice", "  ").is_err());
    assert!(Decision::new("bob", "").is_err());
    assert!(CancelConfirmation::from_provider("").is_err());
    assert!(
        ValidatedResult::new(
            "loc",
            1,
            "not-a-digest",
            None,
            vec!["x".into()],
            serde_json::Value::Null
        )
        .is_err()
    );
    assert!(
        ValidatedResult::new(
            "loc",
            1,
            &"a".repeat(64),
            None,
            vec![],
            serde_json::Value::Null
        )
        .is_err()
    );
    assert!(
        ValidatedResult::new(
            "",
            1,
            &"a".repeat(64),
            None,
            vec!["x".into()],
            serde_json::Value::Null
        )
        .is_err()
    );
}

#[test]
fn the_essay_paths_are_allowed() {
    use State::*;
    let ev = sample_events();
    let by = |k: EventKind| ev.iter().find(|e| e.kind() == k).unwrap().clone();
    let walk = |path: &[(EventKind, State)]| {
        let mut s = State::INITIAL;
        for (k, want) in path {
            s = transition(s, &by(*k)).unwrap_or_else(|e| panic!("{e}")).to;
            assert_eq!(s, *want);
        }
    };
    walk(&[
        (EventKind::CreateAccepted, Accepted),
        (EventKind::RemoteProgress, Observing),
        (EventKind::RemoteSucceeded, ResultCollecting),
        (EventKind::ResultValidated, Succeeded),
    ]);
    walk(&[
        (EventKind::CreateAmbiguous, CreateUnknown),
        (EventKind::ReconciliationStarted, Reconciliation),
    ]);
    walk(&[
        (EventKind::CreateAccepted, Accepted),
        (EventKind::CancelRequested, CancelRequested),
        (EventKind::CancelSent, Cancelling),
        (EventKind::RemoteCancelled, Cancelled),
    ]);
    walk(&[
        (EventKind::CreateAccepted, Accepted),
        (EventKind::RemoteProgress, Observing),
        (EventKind::ResultDeadlinePassed, ResultTimedOut),
    ]);
    walk(&[
        (EventKind::CreateAccepted, Accepted),
        (EventKind::RemoteFailed, Failed),
    ]);
    walk(&[(EventKind::Withdraw, Withdrawn)]);
}

#[test]
fn illegal_moves_are_refused() {
    let ev = sample_events();
    let by = |k: EventKind| ev.iter().find(|e| e.kind() == k).unwrap().clone();
    // Progress 100 is never success, DELETE is never cancelled, failed never comes back.
    assert!(transition(State::Observing, &by(EventKind::ResultValidated)).is_err());
    assert!(transition(State::Cancelling, &by(EventKind::ResultValidated)).is_err());
    assert!(transition(State::Failed, &by(EventKind::RemoteProgress)).is_err());
    assert!(transition(State::Failed, &by(EventKind::Resume)).is_err());
    assert!(transition(State::CreatePending, &by(EventKind::RemoteCancelled)).is_err());
    assert!(transition(State::Observing, &by(EventKind::Withdraw)).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Over random sequences: every applied move is a row of the table; the gated states are reached
    /// only through their evidence; terminal states never change; refused events change nothing.
    #[test]
    fn random_event_sequences_respect_the_table(seq in proptest::collection::vec(0usize..30, 1..60)) {
        let events = sample_events();
        let mut state = State::INITIAL;
        for i in seq {
            let event = &events[i % events.len()];
            match transition(state, event) {
                Ok(t) => {
                    let rule = rule_for(state, event.kind()).expect("applied move must be in the table");
                    match rule.to {
                        To::State(s) => prop_assert_eq!(t.to, s),
                        To::Same => prop_assert_eq!(t.to, state),
                    }
                    if state.is_terminal() {
                        prop_assert_eq!(t.to, state);
                    }
                    if t.to != state {
                        match t.to {
                            State::Succeeded => prop_assert!(matches!(event, Event::ResultValidated(_))),
                            State::Cancelled => {
                                let evidenced = matches!(event, Event::RemoteCancelled(_) | Event::ConfirmCancellation { .. });
                                prop_assert!(evidenced)
                            }
                            State::CancelRequested => prop_assert!(matches!(event, Event::CancelRequested(_))),
                            _ => {}
                        }
                    }
                    state = t.to;
                }
                Err(e) => {
                    prop_assert!(rule_for(state, event.kind()).is_none());
                    prop_assert_eq!(e.from, state);
                }
            }
        }
    }
}

#[test]
fn table_covers_only_known_states() {
    for r in RULES {
        assert!(!r.from.is_empty());
    }
}

/// `docs/state-machine.md` is generated from the table. Refresh with `JOBTRAIL_BLESS=1`.
#[test]
fn state_machine_doc_is_fresh() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/state-machine.md");
    let want = render_markdown();
    if std::env::var_os("JOBTRAIL_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/state-machine.md is stale: run `JOBTRAIL_BLESS=1 cargo test -p jobtrail-core --test state_machine`"
    );
}
