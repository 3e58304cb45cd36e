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
