//! The state machine as data.
//!
//! [`RULES`] is the whole allowed-transition table: for each event kind, which states it may arrive in
//! and where it leads. [`transition`] is the only function that decides a state change; the store calls
//! it inside the same transaction that writes the row, against the state it has locked. The table is
//! rendered into `docs/state-machine.md` by a test that fails when the committed copy is stale.

use crate::event::{Event, EventKind};
use crate::state::State;
use State::*;

/// Where a rule leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum To {
    /// To this state.
    State(State),
    /// Stay: the event is recorded in history as an observation, the state does not change.
    Same,
}

/// One line of the table: `on` arriving in any of `from` leads `to`.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub on: EventKind,
    pub from: &'static [State],
    pub to: To,
    pub why: &'static str,
}

const REMOTE_LIVE: &[State] = &[Accepted, Observing, CancelRequested, Cancelling];
const CREATE_OPEN: &[State] = &[CreatePending, CreateUnknown, Reconciliation];
const CREATE_UNSETTLED: &[State] = &[CreateUnknown, Reconciliation, CreateUnresolved];
const NOT_TERMINAL: &[State] = &[
    CreatePending,
    CreateUnknown,
    Reconciliation,
    CreateUnresolved,
    Accepted,
    Observing,
    ResultCollecting,
    CancelRequested,
    Cancelling,
    ContractViolation,
    CancellationUnconfirmed,
    ResultTimedOut,
    UrlRefused,
    ResultStalled,
];
const TERMINAL: &[State] = &[
    Succeeded,
    Failed,
    Cancelled,
    ResultUnavailable,
    ResultValidationFailed,
    Withdrawn,
    NotCreated,
    Abandoned,
];

/// The allowed-transition table. For one event kind, `from` sets never overlap (a test checks).
pub static RULES: &[Rule] = &[
    Rule {
        on: EventKind::CreateAccepted,
        from: CREATE_OPEN,
        to: To::State(Accepted),
        why: "the provider named the job",
    },
    Rule {
        on: EventKind::CreateCompleted,
        from: CREATE_OPEN,
        to: To::State(ResultCollecting),
        why: "synchronous answer; the result still has to be validated",
    },
    Rule {
        on: EventKind::CreateAmbiguous,
        from: &[CreatePending],
        to: To::State(CreateUnknown),
        why: "sent, no definitive answer",
    },
    Rule {
        on: EventKind::CreateAmbiguous,
        from: &[CreateUnknown, Reconciliation],
        to: To::Same,
        why: "still unknown; attempts are counted",
    },
    Rule {
        on: EventKind::CreateRejected,
        from: CREATE_OPEN,
        to: To::State(Failed),
        why: "definitive rejection",
    },
    Rule {
        on: EventKind::ReconciliationStarted,
        from: &[CreateUnknown],
        to: To::State(Reconciliation),
        why: "the contract's documented reconciliation",
    },
    Rule {
        on: EventKind::ReconciliationInconclusive,
        from: &[Reconciliation],
        to: To::Same,
        why: "try again until the create deadline",
    },
    Rule {
        on: EventKind::ReconciliationExhausted,
        from: &[CreateUnknown, Reconciliation],
        to: To::State(CreateUnresolved),
        why: "a send may have reached the provider and nothing settles it: a person decides",
    },
    Rule {
        on: EventKind::CreateExpired,
        from: &[CreatePending],
        to: To::State(NotCreated),
        why: "create deadline passed and no attempt can have created a job",
    },
    Rule {
        on: EventKind::ContractViolated,
        from: &[
            CreatePending,
            CreateUnknown,
            Reconciliation,
            Accepted,
            Observing,
            CancelRequested,
            Cancelling,
            ResultCollecting,
        ],
        to: To::State(ContractViolation),
        why: "keep both answers, stop automation",
    },
    Rule {
        on: EventKind::JobHeldElsewhere,
        from: &[CreatePending, CreateUnknown, Reconciliation],
        to: To::State(ContractViolation),
        why: "the job named is another operation's: kept as the conflicting answer, never taken",
    },
    Rule {
        on: EventKind::RemoteProgress,
        from: &[Accepted, Observing],
        to: To::State(Observing),
        why: "an observation, never completion",
    },
    Rule {
        on: EventKind::RemoteProgress,
        from: &[CancelRequested, Cancelling],
        to: To::Same,
        why: "still waiting for the cancel to take effect",
    },
    Rule {
        on: EventKind::RemoteSucceeded,
        from: REMOTE_LIVE,
        to: To::State(ResultCollecting),
        why: "remote success; collect before declaring success",
    },
    Rule {
        on: EventKind::RemoteFailed,
        from: REMOTE_LIVE,
        to: To::State(Failed),
        why: "remote failure is final",
    },
    Rule {
        on: EventKind::RemoteCancelledUnasked,
        from: &[Accepted, Observing],
        to: To::State(Failed),
        why: "cancelled on the provider's side, not at our request: the job did not do its work",
    },
    Rule {
        on: EventKind::RemoteCancelled,
        from: REMOTE_LIVE,
        to: To::State(Cancelled),
        why: "the provider's terminal cancel",
    },
    Rule {
        on: EventKind::CallFailed,
        from: &[
            CreatePending,
            Accepted,
            Observing,
            CancelRequested,
            Cancelling,
        ],
        to: To::Same,
        why: "a call failed or was deferred; retry with backoff",
    },
    Rule {
        on: EventKind::RetryBudgetExhausted,
        from: &[Accepted, Observing],
        to: To::State(ResultTimedOut),
        why: "status reads keep failing: stop and ask a person",
    },
    Rule {
        on: EventKind::RetryBudgetExhausted,
        from: &[CancelRequested, Cancelling],
        to: To::State(CancellationUnconfirmed),
        why: "cannot learn whether the cancel took effect",
    },
    Rule {
        on: EventKind::RetryBudgetExhausted,
        from: &[ResultCollecting],
        to: To::State(ResultUnavailable),
        why: "the result fetch keeps failing",
    },
    Rule {
        on: EventKind::UrlRefused,
        from: &[
            Accepted,
            Observing,
            CancelRequested,
            Cancelling,
            ResultCollecting,
        ],
        to: To::State(UrlRefused),
        why: "the provider pointed outside the contract's origins: a person decides",
    },
    Rule {
        on: EventKind::ResultStalled,
        from: &[ResultCollecting],
        to: To::State(ResultStalled),
        why: "workers keep being lost collecting the result: a person decides before another tries",
    },
    Rule {
        on: EventKind::ResultBeyondCheckMemory,
        from: &[ResultCollecting],
        to: To::State(ResultStalled),
        why: "checking the result would take more memory than a worker gives it: a person decides",
    },
    Rule {
        on: EventKind::ResultNotKept,
        from: &[ResultCollecting],
        to: To::State(ResultStalled),
        why: "the result exists but cannot be kept where results are kept: a person decides",
    },
    Rule {
        on: EventKind::ResultNotReadable,
        from: &[ResultCollecting],
        to: To::State(ResultStalled),
        why: "the result kept at create cannot be read back here (another host's result directory, or gone): a person decides",
    },
    Rule {
        on: EventKind::ResultDeadlinePassed,
        from: &[Accepted, Observing],
        to: To::State(ResultTimedOut),
        why: "stop polling; the remote job is not assumed stopped",
    },
    Rule {
        on: EventKind::CancelRequested,
        from: &[Accepted, Observing, ResultTimedOut, UrlRefused],
        to: To::State(CancelRequested),
        why: "local fact: we asked",
    },
    Rule {
        on: EventKind::CancelRequested,
        from: &[
            CreatePending,
            CreateUnknown,
            Reconciliation,
            CreateUnresolved,
            ContractViolation,
        ],
        to: To::Same,
        why: "noted; acted on once the job id is known",
    },
    Rule {
        on: EventKind::Withdraw,
        from: &[CreatePending],
        to: To::State(Withdrawn),
        why: "no create can have reached the provider",
    },
    Rule {
        on: EventKind::CancelSent,
        from: &[CancelRequested],
        to: To::State(Cancelling),
        why: "one cancel call, then keep polling",
    },
    Rule {
        on: EventKind::CancelDeadlinePassed,
        from: &[CancelRequested, Cancelling],
        to: To::State(CancellationUnconfirmed),
        why: "never claim a cancel the provider did not confirm",
    },
    Rule {
        on: EventKind::ResultValidated,
        from: &[ResultCollecting],
        to: To::State(Succeeded),
        why: "the only way to succeeded",
    },
    Rule {
        on: EventKind::ResultFetchFailed,
        from: &[ResultCollecting],
        to: To::Same,
        why: "retry the fetch with backoff",
    },
    Rule {
        on: EventKind::ResultUrlRenewed,
        from: &[ResultCollecting],
        to: To::Same,
        why: "a refused download URL is asked of the status again",
    },
    Rule {
        on: EventKind::ResultUnavailable,
        from: &[ResultCollecting],
        to: To::State(ResultUnavailable),
        why: "remote done, result not obtainable",
    },
    Rule {
        on: EventKind::ResultInvalid,
        from: &[ResultCollecting],
        to: To::State(ResultValidationFailed),
        why: "remote done, result fails the contract",
    },
    Rule {
        on: EventKind::AdoptRemoteJob,
        from: CREATE_UNSETTLED,
        to: To::State(Observing),
        why: "a person found the job",
    },
    Rule {
        on: EventKind::DeclareNotCreated,
        from: CREATE_UNSETTLED,
        to: To::State(NotCreated),
        why: "a person established it never existed",
    },
    Rule {
        on: EventKind::ConfirmCancellation,
        from: &[Cancelling, CancellationUnconfirmed],
        to: To::State(Cancelled),
        why: "a person holds the provider's confirmation",
    },
    Rule {
        on: EventKind::ChooseRemoteJob,
        from: &[ContractViolation],
        to: To::State(Observing),
        why: "a person chose which job is ours",
    },
    Rule {
        on: EventKind::Resume,
        from: &[ResultTimedOut],
        to: To::State(Observing),
        why: "a person extended the result deadline",
    },
    Rule {
        on: EventKind::Resume,
        from: &[CancellationUnconfirmed],
        to: To::State(Cancelling),
        why: "a person extended the cancel deadline",
    },
    Rule {
        on: EventKind::Resume,
        from: &[CreateUnresolved],
        to: To::State(Reconciliation),
        why: "a person extended the create deadline",
    },
    Rule {
        on: EventKind::Resume,
        from: &[UrlRefused],
        to: To::State(Observing),
        why: "a person declared the origin; a status read tells where the job is",
    },
    Rule {
        on: EventKind::Resume,
        from: &[ResultStalled],
        to: To::State(ResultCollecting),
        why: "a person made room for the result; it is fetched and checked again",
    },
    Rule {
        on: EventKind::Abandon,
        from: NOT_TERMINAL,
        to: To::State(Abandoned),
        why: "stop tracking, keep everything",
    },
    Rule {
        on: EventKind::Superseded,
        from: TERMINAL,
        to: To::Same,
        why: "link to the new operation; the state never changes",
    },
];

/// A transition the table allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: State,
    pub to: State,
    pub on: EventKind,
}

impl Transition {
    pub fn changes_state(&self) -> bool {
        self.from != self.to
    }
}

/// The table does not allow this event in this state. Nothing may be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{on} is not allowed in state {from}")]
pub struct IllegalTransition {
    pub from: State,
    pub on: EventKind,
}

/// The rule that applies to `on` in `from`, if any.
pub fn rule_for(from: State, on: EventKind) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.on == on && r.from.contains(&from))
}

/// Rules an earlier build applied and this one no longer does. The links they recorded stay legal
/// history: `audit verify` replays a chain against [`RULES`] and these ([`rule_ever`]).
pub static RETIRED: &[Rule] = &[Rule {
    on: EventKind::ReconciliationExhausted,
    from: &[CreatePending],
    to: To::State(CreateUnresolved),
    why: "before 2026-12-01: a create deadline passed before any send was held for a person (now create_expired leads to not_created)",
}];

/// The rule that applies, or once applied, to `on` in `from`: today's, else a retired one.
pub fn rule_ever(from: State, on: EventKind) -> Option<&'static Rule> {
    rule_for(from, on).or_else(|| {
        RETIRED
            .iter()
            .find(|r| r.on == on && r.from.contains(&from))
    })
}

/// Every event kind the table allows in `state`, in table order.
pub fn allowed_events(state: State) -> Vec<EventKind> {
    let mut out = Vec::new();
    for r in RULES.iter().filter(|r| r.from.contains(&state)) {
        if !out.contains(&r.on) {
            out.push(r.on);
        }
    }
    out
}

/// Decide the move for `event` arriving in `from`. The evidence is in the event's type; the table
/// decides where it may lead.
pub fn transition(from: State, event: &Event) -> Result<Transition, IllegalTransition> {
    let on = event.kind();
    let rule = rule_for(from, on).ok_or(IllegalTransition { from, on })?;
    let to = match rule.to {
        To::State(s) => s,
        To::Same => from,
    };
    Ok(Transition { from, to, on })
}

/// The table as a Markdown document (committed as `docs/state-machine.md`).
pub fn render_markdown() -> String {
    let mut out = String::new();
    out.push_str("# The state machine\n\n");
    out.push_str("<!-- Generated from crates/core/src/machine.rs by the test `state_machine_doc_is_fresh`.\n");
    out.push_str("     Do not edit by hand: run `JOBTRAIL_BLESS=1 cargo test -p jobtrail-core` to refresh. -->\n\n");
    out.push_str("## States\n\n| state | moved on by | meaning |\n| --- | --- | --- |\n");
    for s in State::ALL {
        let mover = match s.mover() {
            crate::state::Mover::Worker => "worker",
            crate::state::Mover::Human => "a person (escalation queue)",
            crate::state::Mover::Nobody => "nobody (terminal)",
        };
        out.push_str(&format!("| `{}` | {} | {} |\n", s, mover, s.meaning()));
    }
    out.push_str("\n## Allowed transitions\n\n`(stays)` means the event is recorded in history and the state does not change.\n\n");
    out.push_str("| event | from | to | why |\n| --- | --- | --- | --- |\n");
    for r in RULES {
        let from: Vec<String> = r.from.iter().map(|s| format!("`{s}`")).collect();
        let to = match r.to {
            To::State(s) => format!("`{s}`"),
            To::Same => "(stays)".into(),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            r.on,
            from.join(", "),
            to,
            r.why
        ));
    }
    out.push_str("\n## Diagram\n\n```mermaid\nstateDiagram-v2\n");
    out.push_str(&format!("    [*] --> {}\n", State::INITIAL));
    let mut edges = std::collections::BTreeSet::new();
    for r in RULES {
        if let To::State(to) = r.to {
            for from in r.from {
                if *from != to {
                    edges.insert((*from, to, r.on));
                }
            }
        }
    }
    for (from, to, on) in edges {
        out.push_str(&format!("    {from} --> {to}: {on}\n"));
    }
    for s in State::ALL.iter().filter(|s| s.is_terminal()) {
        out.push_str(&format!("    {s} --> [*]\n"));
    }
    out.push_str("```\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_sets_do_not_overlap_within_an_event() {
        for on in EventKind::ALL {
            let mut seen = std::collections::HashSet::new();
            for r in RULES.iter().filter(|r| r.on == *on) {
                for s in r.from {
                    assert!(seen.insert(*s), "{on} has two rules for {s}");
                }
            }
            assert!(!seen.is_empty(), "{on} has no rule");
        }
    }

    #[test]
    fn terminal_states_only_accept_notes() {
        for r in RULES {
            for s in r.from {
                if s.is_terminal() {
                    assert_eq!(r.to, To::Same, "{} may leave terminal {s}", r.on);
                }
            }
        }
    }

    #[test]
    fn only_evidence_events_reach_the_gated_states() {
        for r in RULES {
            match r.to {
                To::State(Succeeded) => assert_eq!(r.on, EventKind::ResultValidated),
                To::State(Cancelled) => assert!(matches!(
                    r.on,
                    EventKind::RemoteCancelled | EventKind::ConfirmCancellation
                )),
                To::State(CancelRequested) => assert_eq!(r.on, EventKind::CancelRequested),
                _ => {}
            }
        }
    }

    #[test]
    fn every_non_terminal_state_can_be_left_and_every_state_reached() {
        for s in State::ALL {
            if !s.is_terminal() {
                assert!(
                    RULES.iter().any(|r| r.from.contains(s) && r.to != To::Same),
                    "{s} is a dead end"
                );
            }
            if *s != State::INITIAL {
                assert!(
                    RULES.iter().any(|r| r.to == To::State(*s)),
                    "{s} is unreachable"
                );
            }
        }
    }
}
