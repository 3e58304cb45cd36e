//! When to act next. Pure: the jitter draw comes in as an argument in `[0, 1)`.
//!
//! The provider's `Retry-After` wins, clamped to the contract's bounds. Otherwise capped exponential
//! backoff with jitter ("about 2 s, about 4 s, about 8 s, … up to the cap"), so a fleet of operations
//! that started together does not poll together.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Capped exponential backoff with proportional jitter.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Backoff {
    pub initial: Duration,
    pub factor: f64,
    pub cap: Duration,
    /// 0.2 means "±20 %".
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(2),
            factor: 2.0,
            cap: Duration::from_secs(60),
            jitter: 0.2,
        }
    }
}

impl Backoff {
    /// Delay before attempt `attempt` (0-based), with `draw` in `[0, 1)`. Never above `cap`.
    pub fn delay(&self, attempt: u32, draw: f64) -> Duration {
        let base = self.initial.as_secs_f64() * self.factor.max(1.0).powi(attempt.min(64) as i32);
        let base = base.min(self.cap.as_secs_f64());
        let spread = self.jitter.clamp(0.0, 1.0);
        let scaled = base * (1.0 - spread + 2.0 * spread * draw.clamp(0.0, 1.0));
        Duration::from_secs_f64(scaled.clamp(0.0, self.cap.as_secs_f64()))
    }
}

/// Bounds for a provider's `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetryAfterBounds {
    pub min: Duration,
    pub max: Duration,
}

impl Default for RetryAfterBounds {
    fn default() -> Self {
        Self {
            min: Duration::from_millis(100),
            max: Duration::from_secs(300),
        }
    }
}

impl RetryAfterBounds {
    pub fn clamp(&self, requested: Duration) -> Duration {
        requested.clamp(self.min, self.max.max(self.min))
    }
}

/// Why the next action is scheduled when it is (stored in the row next to the time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NextReason {
    RetryAfter,
    Backoff,
    Immediate,
    Deadline,
}

impl NextReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            NextReason::RetryAfter => "retry_after",
            NextReason::Backoff => "backoff",
            NextReason::Immediate => "immediate",
            NextReason::Deadline => "deadline",
        }
    }
}

/// Decide the delay before the next poll: the provider's `Retry-After` (clamped) if it sent one,
/// otherwise backoff for `attempt`.
pub fn next_poll(
    retry_after: Option<Duration>,
    bounds: &RetryAfterBounds,
    backoff: &Backoff,
    attempt: u32,
    draw: f64,
) -> (Duration, NextReason) {
    match retry_after {
        Some(d) => (bounds.clamp(d), NextReason::RetryAfter),
        None => (backoff.delay(attempt, draw), NextReason::Backoff),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Backoff {
            jitter: 0.0,
            ..Backoff::default()
        };
        assert_eq!(b.delay(0, 0.5), Duration::from_secs(2));
        assert_eq!(b.delay(1, 0.5), Duration::from_secs(4));
        assert_eq!(b.delay(2, 0.5), Duration::from_secs(8));
        assert_eq!(b.delay(30, 0.5), Duration::from_secs(60));
    }

    #[test]
    fn jitter_spreads_within_bounds() {
        let b = Backoff::default();
        let lo = b.delay(0, 0.0).as_secs_f64();
        let hi = b.delay(0, 0.999).as_secs_f64();
        assert!((1.59..=1.61).contains(&lo), "{lo}");
        assert!((2.39..=2.41).contains(&hi), "{hi}");
        assert!(b.delay(40, 0.999) <= b.cap);
    }

    #[test]
    fn retry_after_wins_within_bounds() {
        let bounds = RetryAfterBounds {
            min: Duration::from_secs(1),
            max: Duration::from_secs(30),
        };
        let b = Backoff::default();
        assert_eq!(
            next_poll(Some(Duration::from_secs(5)), &bounds, &b, 3, 0.5),
            (Duration::from_secs(5), NextReason::RetryAfter)
        );
        assert_eq!(
            next_poll(Some(Duration::from_secs(0)), &bounds, &b, 3, 0.5).0,
            Duration::from_secs(1)
        );
        assert_eq!(
            next_poll(Some(Duration::from_secs(999)), &bounds, &b, 3, 0.5).0,
            Duration::from_secs(30)
        );
        assert_eq!(next_poll(None, &bounds, &b, 0, 0.5).1, NextReason::Backoff);
    }
}
