//! # jobtrail-core
//!
//! The pure heart of jobtrail: the operation model, the state machine as data, fingerprints, the hash
//! chain and the retry schedule. No I/O, no clock, no randomness inside: time and random bytes are
//! arguments, so every rule here is testable by table and by property.
//!
//! The key decision: a state change is *decided* here ([`machine::transition`]) and *written* by the
//! store in the same short transaction that locks the row, against the state it locked. Evidence
//! ([`event`]) is typed, so the gated states (succeeded, cancelled, cancel_requested) cannot be reached
//! without it. Everything that can go wrong is a value: [`machine::IllegalTransition`],
//! [`operation::SubmitError`], [`event::MissingEvidence`].

pub mod chain;
pub mod decide;
pub mod event;
pub mod ids;
pub mod json;
pub mod machine;
pub mod operation;
pub mod outcome;
pub mod record;
pub mod request;
pub mod schedule;
pub mod state;
pub mod step;
pub mod text;
pub mod when;

pub use event::{CancelConfirmation, CancelRequest, Decision, Event, EventKind, ValidatedResult};
pub use ids::{IdempotencyToken, OperationId, SpanId, TraceId, TraceParent};
pub use machine::{IllegalTransition, Transition, transition};
pub use operation::{
    BodyShape, Entropy, IdempotencyMode, Intent, ProviderTerms, Submission, SubmitError,
    SubmitLimits,
};
pub use record::{CallKind, CallRecord, OperationRecord};
pub use request::{Fingerprint, Holder, SecretGrant, SecretRef};
pub use state::State;
pub use step::{Counters, FailureCount, Observation, ResultBytes, SendMark, Step};
