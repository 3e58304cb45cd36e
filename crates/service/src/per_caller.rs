//! What each caller holds at once (waits open, results being sent), counted against a bound, so
//! one caller cannot hold a process's memory or connections while others get nothing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) struct PerCaller {
    most: AtomicUsize,
    held: Mutex<HashMap<String, usize>>,
}

impl PerCaller {
    pub(crate) fn new(most: usize) -> Self {
        Self {
            most: most.max(1).into(),
            held: Mutex::default(),
        }
    }

    /// From now on, at most `n` (at least 1) per caller.
    pub(crate) fn set_most(&self, n: usize) {
        self.most.store(n.max(1), Ordering::Relaxed);
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        // Every change is one counter: a panic while holding the lock leaves the map whole.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One more for `caller`, or `Err` with what it holds when that is the most it may.
    pub(crate) fn take(&self, caller: &str) -> Result<(), usize> {
        let most = self.most.load(Ordering::Relaxed);
        let mut held = self.held();
        let n = held.entry(caller.to_owned()).or_default();
        if *n >= most {
            return Err(*n);
        }
        *n += 1;
        Ok(())
    }

    /// One of `caller`'s given back (a caller holding none is forgotten).
    pub(crate) fn give_back(&self, caller: &str) {
        let mut held = self.held();
        if let Some(n) = held.get_mut(caller) {
            *n -= 1;
            if *n == 0 {
                held.remove(caller);
            }
        }
    }
}

/// Bytes held at once across every caller (results being sent, request bodies being read): the
/// turns above bound each caller, this bounds the process, so that a few callers each within
/// their turns cannot together hold more memory than the process has.
pub(crate) struct HeldBytes {
    most: AtomicUsize,
    held: AtomicUsize,
}

impl HeldBytes {
    pub(crate) fn new(most: usize) -> Self {
        Self {
            most: most.into(),
            held: AtomicUsize::new(0),
        }
    }

    pub(crate) fn set_most(&self, n: usize) {
        self.most.store(n, Ordering::Relaxed);
    }

    /// `n` more bytes held, or `Err` with what is held when that would pass the bound. With
    /// nothing held anything is taken: one result larger than the bound is still served, alone.
    pub(crate) fn take(&self, n: usize) -> Result<(), usize> {
        let most = self.most.load(Ordering::Relaxed);
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held == 0 || held.saturating_add(n) <= most).then(|| held.saturating_add(n))
            })
            .map(|_| ())
    }

    pub(crate) fn give_back(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::AcqRel);
    }

    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_bytes_are_bounded_across_callers_and_one_large_item_passes_alone() {
        let b = HeldBytes::new(100);
        assert!(b.take(60).is_ok());
        assert_eq!(b.take(50), Err(60));
        assert!(b.take(40).is_ok());
        b.give_back(60);
        b.give_back(40);
        assert_eq!(b.held(), 0);
        assert!(b.take(500).is_ok(), "alone, whatever its size");
        assert_eq!(b.take(1), Err(500));
        b.give_back(500);
        assert!(b.take(1).is_ok());
    }
}
