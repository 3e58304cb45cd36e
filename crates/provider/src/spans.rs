//! One trace per operation, with ids jobtrail chooses: the trace id is the operation's (stored at
//! submit, or the caller's `traceparent`), the operation's root span id is derived from its id, and
//! a provider call's span id is the one its `traceparent` header carries, so the span a tracing
//! backend shows for a call is the parent of whatever the provider records.
//!
//! The OpenTelemetry SDK draws span ids from its id generator and ignores ids on a span builder, so
//! the process's tracer provider uses [`ChosenIds`]: it hands out an id set with [`with_ids`] for
//! the span built inside that closure, and random ids otherwise. Without an installed tracer
//! provider (no OTLP endpoint configured) every span here is a no-op.
//!
//! An operation's trace is sampled whole or not at all: [`sampled`] decides it with the process's
//! sampler (`OTEL_TRACES_SAMPLER`) from the trace id and the caller's sampled flag (kept with the
//! operation), and every context jobtrail builds for it (its root's parent, its steps' parent, the
//! `traceparent` providers receive) carries that decision. Many workers step one operation over
//! its life: a decision from what the operation keeps is the same on each of them.

use jobtrail_core::{OperationId, TraceId};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceState, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, ShouldSample,
};
use std::cell::Cell;
use std::sync::OnceLock;

/// The instrumentation scope every jobtrail span is recorded under.
pub const SCOPE: &str = "jobtrail";

thread_local! {
    static NEXT: Cell<(Option<opentelemetry::trace::TraceId>, Option<SpanId>)> =
        const { Cell::new((None, None)) };
}

/// An id generator that yields the ids set by [`with_ids`] once, random ids otherwise.
#[derive(Debug, Default)]
pub struct ChosenIds(RandomIdGenerator);

impl IdGenerator for ChosenIds {
    fn new_trace_id(&self) -> opentelemetry::trace::TraceId {
        let (trace, span) = NEXT.get();
        match trace {
            Some(t) => {
                NEXT.set((None, span));
                t
            }
            None => self.0.new_trace_id(),
        }
    }
    fn new_span_id(&self) -> SpanId {
        let (trace, span) = NEXT.get();
        match span {
            Some(s) => {
                NEXT.set((trace, None));
                s
            }
            None => self.0.new_span_id(),
        }
    }
}

/// Build a span inside `f` with these ids (the trace id applies only to a span without a parent).
/// Synchronous on purpose: the ids live in a thread-local for exactly the duration of the build.
pub fn with_ids<T>(trace: Option<TraceId>, span: SpanId, f: impl FnOnce() -> T) -> T {
    /// Clears the chosen ids however `f` ends (a panic must not leave them for the next span).
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            NEXT.set((None, None));
        }
    }
    let _clear = Clear;
    NEXT.set((trace.map(otel_trace), Some(span)));
    f()
}

pub fn otel_trace(t: TraceId) -> opentelemetry::trace::TraceId {
    opentelemetry::trace::TraceId::from_bytes(t.to_bytes())
}

/// The sampler the process's tracer provider samples with, once one is installed.
static SAMPLER: OnceLock<Sampler> = OnceLock::new();

/// Decide operations' traces with `sampler` from now on: the one the process's tracer provider
/// was built with (a second call is ignored: one process, one sampler).
pub fn set_sampler(sampler: Sampler) {
    let _ = SAMPLER.set(sampler);
}

/// Whether operation `op` is sampled: the process's sampler's decision for its root span, as
/// [`record_operation`] records it — under the caller's span where the caller sent one (its
/// `caller_sampled` flag: a parent-based sampler follows it), as a root otherwise, or where the
/// caller named the root's own id (`traceidratio`: by the trace id's low 8 bytes, as the SDK
/// decides each of its spans). Sampled where no tracer provider is installed: nothing is recorded
/// here then, and a provider that traces is not told to drop what it records.
pub fn operation_sampled(
    op: OperationId,
    trace: TraceId,
    caller_span: Option<jobtrail_core::SpanId>,
    caller_sampled: Option<bool>,
) -> bool {
    let under_caller = caller_of(op, caller_span).is_some();
    sampled(trace, caller_sampled.filter(|_| under_caller))
}

/// The caller's span the root of `op` is recorded under: none where the caller named the root's
/// own id (it derives from the operation id, which a caller may choose), or the root would be its
/// own parent.
fn caller_of(op: OperationId, caller_span: Option<jobtrail_core::SpanId>) -> Option<SpanId> {
    caller_span
        .map(|s| SpanId::from_bytes(s.to_bytes()))
        .filter(|s| *s != root_span_id(op))
}

fn sampled(trace: TraceId, caller_sampled: Option<bool>) -> bool {
    SAMPLER.get().is_none_or(|s| {
        // Only the parent's validity, remoteness and flag are read: any span id will do.
        let parent = caller_sampled.map(|on| {
            Context::new().with_remote_span_context(SpanContext::new(
                otel_trace(trace),
                SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, 1]),
                as_flags(on),
                true,
                TraceState::default(),
            ))
        });
        let kind = opentelemetry::trace::SpanKind::Internal;
        let decided = s.should_sample(
            parent.as_ref(),
            otel_trace(trace),
            "operation",
            &kind,
            &[],
            &[],
        );
        decided.decision == SamplingDecision::RecordAndSample
    })
}

/// The trace flags of a context whose trace is (or is not) sampled.
pub fn as_flags(sampled: bool) -> TraceFlags {
    if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    }
}

/// The operation's root span id: the first 8 bytes of the SHA-256 of its whole id (never zero). Not
/// the id's own tail: a caller may choose its operation id and may send another's trace id, and
/// with the same tail its root span would have been that other operation's, corrupting its trace.
pub fn root_span_id(op: OperationId) -> SpanId {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(op.as_uuid().as_bytes());
    let mut id: [u8; 8] = digest[..8].try_into().expect("8 bytes");
    if id == [0; 8] {
        id[7] = 1;
    }
    SpanId::from_bytes(id)
}

/// A context whose parent is the operation's root span (exported once, by the worker that writes
/// the operation's terminal step; an operation a person ends has no exported root), flagged with
/// the operation's [`sampled`] decision.
pub fn operation_context(op: OperationId, trace: TraceId, sampled: bool) -> Context {
    Context::new().with_remote_span_context(SpanContext::new(
        otel_trace(trace),
        root_span_id(op),
        as_flags(sampled),
        false,
        TraceState::default(),
    ))
}

pub fn tracer() -> opentelemetry::global::BoxedTracer {
    opentelemetry::global::tracer(SCOPE)
}

/// Export the operation's root span: from its submission to now, named after where it ended; a
/// child of the caller's span when the caller sent one (its `traceparent`), so the operation shows
/// inside the agent's own trace tree.
pub fn record_operation(
    op: OperationId,
    trace: TraceId,
    caller_span: Option<jobtrail_core::SpanId>,
    sampled: bool,
    submitted: std::time::SystemTime,
    state: &str,
    provider: &str,
) {
    use opentelemetry::trace::Span as _;
    let tracer = tracer();
    let parent = match caller_of(op, caller_span) {
        Some(s) => Context::new().with_remote_span_context(SpanContext::new(
            otel_trace(trace),
            s,
            as_flags(sampled),
            true,
            TraceState::default(),
        )),
        None => Context::new(),
    };
    let mut span = with_ids(Some(trace), root_span_id(op), || {
        tracer
            .span_builder(format!("operation {provider}"))
            .with_start_time(submitted)
            .with_attributes([
                KeyValue::new("jobtrail.operation.id", op.to_string()),
                KeyValue::new("jobtrail.provider", provider.to_owned()),
                KeyValue::new("jobtrail.state", state.to_owned()),
            ])
            .start_with_context(&tracer, &parent)
    });
    span.end();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two operation ids that share their last 8 bytes (a caller chose one to match another's)
    /// have different root spans.
    #[test]
    fn root_spans_differ_for_ids_that_share_a_tail() {
        let a: OperationId = "op_01JAAAAAAAAAAAAAAAAAAAAAAA".parse().unwrap();
        let mut bytes = a.as_uuid().into_bytes();
        bytes[0] ^= 0x01;
        let b = OperationId::from_uuid(uuid::Uuid::from_bytes(bytes));
        assert_eq!(a.as_uuid().as_bytes()[8..], b.as_uuid().as_bytes()[8..]);
        assert_ne!(root_span_id(a), root_span_id(b));
        assert_eq!(
            root_span_id(a),
            root_span_id(a),
            "stable: every step finds its root"
        );
    }
}
