//! The local states of an operation.
//!
//! Each state says what jobtrail *believes* about one logical operation and who is allowed to move it
//! on. Local facts (`cancel_requested`: we asked) and remote facts (`cancelled`: the provider said so)
//! are different states on purpose. The allowed moves between them live in [`crate::machine`].

use serde::{Deserialize, Serialize};

/// Who moves an operation out of a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mover {
    /// A worker holding the lease acts on it when `next_action_at` comes due.
    Worker,
    /// Automation has stopped; a person decides through the admin binary (the escalation queue).
    Human,
    /// Nobody: the state is final. A retry is a new operation linked to this one.
    Nobody,
}

macro_rules! states {
    ($( $(#[doc = $doc:literal])* $variant:ident = $name:literal, $mover:ident; )*) => {
        /// A local state. See the module docs and `docs/state-machine.md`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum State {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl State {
            /// Every state, in documentation order.
            pub const ALL: &'static [State] = &[$(State::$variant),*];

            /// The stable name used in the database, the CLI and the docs.
            pub const fn as_str(self) -> &'static str {
                match self { $(State::$variant => $name,)* }
            }

            /// Who moves an operation out of this state.
            pub const fn mover(self) -> Mover {
                match self { $(State::$variant => Mover::$mover,)* }
            }

            /// What the state means, for docs and `--help`.
            pub fn meaning(self) -> &'static str {
                match self { $(State::$variant => concat!($($doc, " "),*).trim_ascii(),)* }
            }
        }

        impl std::str::FromStr for State {
            type Err = UnknownState;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name => Ok(State::$variant),)*
                    // Cut: a caller's megabytes are not echoed back in the refusal.
                    other => Err(UnknownState(crate::ids::shown(other))),
                }
            }
        }
    };
}

states! {
    /// The intent is recorded; no job is known to exist. The worker sends create with the stored
    /// token; every attempt recorded here was definitively not created (never sent, or refused with
    /// "not now"). A cancel withdraws the operation unless a send may be in flight.
    CreatePending = "create_pending", Worker;
    /// A create was sent and the answer was ambiguous (timeout, reset, 5xx). The remote job may or may
    /// not exist. The worker starts reconciliation by the contract's documented means.
    CreateUnknown = "create_unknown", Worker;
    /// The worker is reconciling an ambiguous create (resend with the same token, or look up by client
    /// reference) until the create deadline.
    Reconciliation = "reconciliation", Worker;
    /// Reconciliation could not settle whether the remote job exists (no method, or the create deadline
    /// passed). Held for a person: adopt a job id, declare it never created, or abandon.
    CreateUnresolved = "create_unresolved", Human;
    /// The provider confirmed the create and gave a job id; the first status read is due.
    Accepted = "accepted", Worker;
    /// The worker polls the remote job, honouring Retry-After, until it is terminal or the result
    /// deadline passes.
    Observing = "observing", Worker;
    /// The provider reported success (or answered create synchronously); the worker fetches, validates
    /// and stores the result.
    ResultCollecting = "result_collecting", Worker;
    /// Local fact: a person or policy asked to cancel (actor, reason recorded). The lease owner sends
    /// one cancel call.
    CancelRequested = "cancel_requested", Worker;
    /// The cancel call was sent; the worker keeps polling until the provider confirms, the job ends
    /// otherwise, or the cancel deadline passes.
    Cancelling = "cancelling", Worker;
    /// The provider answered the same idempotency token with a different job id, or named a job
    /// another operation holds. Both answers are kept; all automation stops until a person chooses
    /// which job is ours (never one another operation holds) or settles the operation otherwise.
    ContractViolation = "contract_violation", Human;
    /// The cancel deadline passed without the provider confirming (the cancel was sent at least once,
    /// even if that took it past the deadline). Held for a person with the evidence bundle (job id,
    /// trace id, calls, provider request ids).
    CancellationUnconfirmed = "cancellation_unconfirmed", Human;
    /// The result deadline passed before the remote job ended. Automatic polling stopped; the remote job
    /// is not assumed stopped. Held for a person: request a cancel, resume, or abandon.
    ResultTimedOut = "result_timed_out", Human;
    /// The provider named a URL (to poll, or to fetch the result from) outside the origins its
    /// contract declares; nothing was sent there. Held for a person, with the URL in the evidence:
    /// declare the origin in the contract and resume, request a cancel, or abandon.
    UrlRefused = "url_refused", Human;
    /// The remote job succeeded, but its result cannot be collected here: parsed to be checked it
    /// would take more memory than a worker gives that (`--check-mib`), or workers were lost
    /// holding the operation several times in a row while collecting it, none recording a step
    /// (killed, by the memory limit say, or stalled past the lease), or it could not be kept where
    /// results are kept (a full or read-only result directory) until the failure budget was spent,
    /// or a result kept when the job answered at once cannot be read back (kept in another host's
    /// result directory). Held for a person: make room (the workers' memory, their `--check-mib`,
    /// the result directory's disk) or put the kept file back, and resume, or abandon.
    ResultStalled = "result_stalled", Human;
    /// Remote success and a fetched, validated, stored result.
    Succeeded = "succeeded", Nobody;
    /// The provider rejected the create definitively or reported the job failed.
    Failed = "failed", Nobody;
    /// Remote fact: the provider confirmed the cancellation (or a person recorded the provider's
    /// confirmation).
    Cancelled = "cancelled", Nobody;
    /// The remote job succeeded but its result could not be fetched.
    ResultUnavailable = "result_unavailable", Nobody;
    /// The remote job succeeded but its result failed validation (type, size, checksum, schema, rows).
    ResultValidationFailed = "result_validation_failed", Nobody;
    /// Cancelled while no create could have created a job (none was sent, or every one was refused
    /// without effect): nothing exists at the provider.
    Withdrawn = "withdrawn", Nobody;
    /// The remote job was never created: the create deadline passed while every attempt was
    /// definitively not created, or a person established it. A new, linked operation may follow.
    NotCreated = "not_created", Nobody;
    /// A person stopped tracking the operation. Everything recorded is kept.
    Abandoned = "abandoned", Nobody;
}

impl State {
    /// The state every operation starts in.
    pub const INITIAL: State = State::CreatePending;

    /// Final: nothing moves an operation out of it.
    pub const fn is_terminal(self) -> bool {
        matches!(self.mover(), Mover::Nobody)
    }

    /// Held for a person: the escalation queue.
    pub const fn needs_human(self) -> bool {
        matches!(self.mover(), Mover::Human)
    }

    /// A worker acts on it when due.
    pub const fn is_automated(self) -> bool {
        matches!(self.mover(), Mover::Worker)
    }

    /// States in which a remote job id must be known.
    pub const fn requires_remote_job(self) -> bool {
        matches!(
            self,
            State::Accepted
                | State::Observing
                | State::CancelRequested
                | State::Cancelling
                | State::CancellationUnconfirmed
                | State::Cancelled
                | State::ResultTimedOut
                | State::UrlRefused
        )
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state name that is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown state {0:?}")]
pub struct UnknownState(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for s in State::ALL {
            assert!(seen.insert(s.as_str()));
            assert_eq!(s.as_str().parse::<State>().unwrap(), *s);
            assert!(!s.meaning().is_empty());
        }
        assert!("cancelled_maybe".parse::<State>().is_err());
    }

    #[test]
    fn every_state_has_exactly_one_category() {
        for s in State::ALL {
            let n = [s.is_terminal(), s.needs_human(), s.is_automated()]
                .iter()
                .filter(|b| **b)
                .count();
            assert_eq!(n, 1, "{s}");
        }
    }
}
