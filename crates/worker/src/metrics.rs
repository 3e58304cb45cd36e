//! What a worker counts, through the `metrics` facade: nothing is recorded until a binary installs a
//! recorder (jobtrail-telemetry's Prometheus exporter), and label values come from closed sets
//! (event kinds, call kinds, status classes, provider names from loaded contracts), never from
//! provider-supplied text, so a hostile provider cannot blow up the series count.

use jobtrail_store::{CallRecord, Claimed};
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use std::sync::Once;
use std::time::Duration;

pub(crate) fn describe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        describe_counter!("jobtrail_claims_total", "Claim transactions");
        describe_counter!(
            "jobtrail_claim_failures_total",
            "Claims that failed or that the database did not answer within --db-answer-within (the worker backs off and tries again)"
        );
        describe_counter!("jobtrail_claimed_total", "Operations claimed");
        describe_histogram!(
            "jobtrail_claim_seconds",
            "Claim transaction latency (sent to answered)"
        );
        describe_histogram!(
            "jobtrail_claim_batch_size",
            "Operations per claim that found work"
        );
        describe_histogram!(
            "jobtrail_claim_lag_seconds",
            "From an operation's due time to its claim: notification and scan lag, or a saturated fleet"
        );
        describe_counter!(
            "jobtrail_lease_takeovers_total",
            "Claims of operations whose previous owner's lease had run out (a worker died or stalled)"
        );
        describe_counter!(
            "jobtrail_leases_lost_total",
            "Operations this worker stopped acting on because its lease was gone (LeaseLost)"
        );
        describe_counter!(
            "jobtrail_steps_total",
            "Steps written or refused, by event kind (or 'observation') and outcome"
        );
        describe_histogram!(
            "jobtrail_provider_call_seconds",
            "Provider call latency by provider, call kind and status class"
        );
        describe_histogram!(
            "jobtrail_write_batch_size",
            "Steps per write transaction (group commit)"
        );
        describe_histogram!("jobtrail_write_seconds", "Write transaction latency");
        describe_histogram!(
            "jobtrail_notification_lag_seconds",
            "From a work notification's sending (database clock) to its receipt by this worker"
        );
        describe_counter!(
            "jobtrail_provider_throttled_total",
            "Calls held back by a provider's fleet-wide limits: by the call rate ('rate') or a 429 with Retry-After that paused the fleet ('429')"
        );
        describe_counter!(
            "jobtrail_step_panics_total",
            "Steps that panicked (a bug: the operation's lease runs out and its next step retries it)"
        );
        describe_gauge!(
            "jobtrail_steps_in_flight",
            "Operations this worker is driving now"
        );
    });
}

pub(crate) fn step_panicked() {
    counter!("jobtrail_step_panics_total").increment(1);
}

pub(crate) fn claim_failed() {
    counter!("jobtrail_claim_failures_total").increment(1);
}

pub(crate) fn claimed(took: Duration, claimed: &[Claimed]) {
    counter!("jobtrail_claims_total").increment(1);
    histogram!("jobtrail_claim_seconds").record(took.as_secs_f64());
    if claimed.is_empty() {
        return;
    }
    counter!("jobtrail_claimed_total").increment(claimed.len() as u64);
    histogram!("jobtrail_claim_batch_size").record(claimed.len() as f64);
    let lag = histogram!("jobtrail_claim_lag_seconds");
    let mut takeovers = 0;
    for c in claimed {
        lag.record(c.late.as_secs_f64());
        takeovers += u64::from(c.taken_over);
    }
    if takeovers > 0 {
        counter!("jobtrail_lease_takeovers_total").increment(takeovers);
    }
}

pub(crate) fn lease_lost() {
    counter!("jobtrail_leases_lost_total").increment(1);
}

/// A step's fate: `written`, `lease_lost`, `dropped` (a decision landed first) or `failed`.
pub(crate) fn step(kind: Option<jobtrail_core::EventKind>, outcome: &'static str) {
    let kind = kind.map_or("observation", |k| k.as_str());
    counter!("jobtrail_steps_total", "kind" => kind, "outcome" => outcome).increment(1);
}

/// A call's latency by its status class: `no_response` for a call that went out and got no answer
/// (or could not connect); `not_sent` for one that never left this process (a credential not
/// found, a URL outside the contract's origins, a lease too short to send it: 0 s, no latency of
/// the provider's, and no provider fault to alert on).
pub(crate) fn call(provider: &str, call: &CallRecord) {
    let class = match call.http_status {
        Some(s @ 100..=599) => ["1xx", "2xx", "3xx", "4xx", "5xx"][(s / 100 - 1) as usize],
        Some(_) => "other",
        None if call
            .error_class
            .as_deref()
            .is_some_and(jobtrail_provider::wire::WireError::never_left) =>
        {
            "not_sent"
        }
        None => "no_response",
    };
    histogram!(
        "jobtrail_provider_call_seconds",
        "provider" => provider.to_owned(),
        "call" => call.kind.as_str(),
        "status" => class,
    )
    .record(call.duration_ms / 1000.0);
}

pub(crate) fn written(steps: usize, took: Duration) {
    histogram!("jobtrail_write_batch_size").record(steps as f64);
    histogram!("jobtrail_write_seconds").record(took.as_secs_f64());
}

pub(crate) fn in_flight(n: usize) {
    gauge!("jobtrail_steps_in_flight").set(n as f64);
}

pub(crate) fn notified(lag: Duration) {
    histogram!("jobtrail_notification_lag_seconds").record(lag.as_secs_f64());
}

/// A call held back by the provider's fleet-wide limits (`why`: "rate" or "429").
pub(crate) fn throttled(provider: &str, why: &'static str) {
    counter!("jobtrail_provider_throttled_total", "provider" => provider.to_owned(), "why" => why)
        .increment(1);
}
