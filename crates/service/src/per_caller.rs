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
/// turns above bound each caller's count, this bounds the process's bytes, so that a few callers
/// each within their turns cannot together hold more memory than the process has. One caller
/// holds at most half of it, so it cannot shut the others out. A request body counts at most a
/// quarter ([`HeldBytes::counted`]: its bound is the body limit's, checked before it is read); a
/// result counts whole ([`HeldBytes::take_whole`]): one larger than half the bound is served when
/// it fits beside what others hold, one larger than the bound never.
pub(crate) struct HeldBytes {
    most: AtomicUsize,
    held: Mutex<(usize, HashMap<String, usize>)>,
}

impl HeldBytes {
    pub(crate) fn new(most: usize) -> Self {
        Self {
            most: most.into(),
            held: Mutex::default(),
        }
    }

    pub(crate) fn set_most(&self, n: usize) {
        self.most.store(n, Ordering::Relaxed);
    }

    fn held(&self) -> std::sync::MutexGuard<'_, (usize, HashMap<String, usize>)> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What `n` bytes of one item count for: at most a quarter of the bound (at least 1 byte).
    pub(crate) fn counted(&self, n: usize) -> usize {
        n.min((self.most.load(Ordering::Relaxed) / 4).max(1))
    }

    /// `counted` more bytes held for `holder`, or `Err` with what the process holds when the
    /// process, or the holder's half of it, would pass the bound.
    pub(crate) fn take(&self, holder: &str, counted: usize) -> Result<(), usize> {
        let most = self.most.load(Ordering::Relaxed);
        let mut held = self.held();
        let (total, per) = &mut *held;
        let mine = per.get(holder).copied().unwrap_or(0);
        if total.saturating_add(counted) > most || mine.saturating_add(counted) > most / 2 {
            return Err(*total);
        }
        *total += counted;
        *per.entry(holder.to_owned()).or_default() += counted;
        Ok(())
    }

    /// `n` bytes of one item held for `holder`, counted whole: within the bound with what the
    /// process holds, and within the holder's half unless the item alone is more than half (then
    /// the holder may hold nothing else). `Err(Some(held))` when it does not fit now,
    /// `Err(None)` when it never can (more than the bound).
    pub(crate) fn take_whole(&self, holder: &str, n: usize) -> Result<(), Option<usize>> {
        let most = self.most.load(Ordering::Relaxed);
        if n > most {
            return Err(None);
        }
        let mut held = self.held();
        let (total, per) = &mut *held;
        let mine = per.get(holder).copied().unwrap_or(0);
        let within_half = mine.saturating_add(n) <= most / 2 || (n > most / 2 && mine == 0);
        if total.saturating_add(n) > most || !within_half {
            return Err(Some(*total));
        }
        *total += n;
        *per.entry(holder.to_owned()).or_default() += n;
        Ok(())
    }

    pub(crate) fn give_back(&self, holder: &str, counted: usize) {
        let mut held = self.held();
        let (total, per) = &mut *held;
        *total = total.saturating_sub(counted);
        if let Some(n) = per.get_mut(holder) {
            *n = n.saturating_sub(counted);
            if *n == 0 {
                per.remove(holder);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_bytes_are_bounded_per_process_and_per_caller_and_large_items_count_a_quarter() {
        let b = HeldBytes::new(100);
        assert!(b.take("a", 40).is_ok());
        assert_eq!(b.take("a", 20), Err(40), "a caller holds at most half");
        assert!(b.take("b", 40).is_ok());
        assert_eq!(
            b.take("c", 30),
            Err(80),
            "the process holds at most the bound"
        );
        assert!(b.take("c", 20).is_ok());
        b.give_back("a", 40);
        b.give_back("b", 40);
        b.give_back("c", 20);
        assert_eq!(b.held().0, 0);
        assert!(b.held().1.is_empty());
        assert_eq!(b.counted(500), 25, "a large body counts a quarter");
        assert!(b.take("a", b.counted(500)).is_ok());
    }

    /// A result counts whole: more than half the bound is served only beside little enough, and
    /// only while its holder holds nothing else; more than the bound never.
    #[test]
    fn a_result_counts_whole_and_one_beyond_the_bound_never_fits() {
        let b = HeldBytes::new(100);
        assert_eq!(b.take_whole("a", 101), Err(None), "never");
        assert!(b.take_whole("a", 70).is_ok(), "more than half, alone");
        assert_eq!(b.take_whole("b", 40), Err(Some(70)), "not beside it");
        assert!(b.take_whole("b", 30).is_ok());
        b.give_back("a", 70);
        assert!(b.take_whole("a", 10).is_ok());
        assert_eq!(
            b.take_whole("a", 60),
            Err(Some(40)),
            "more than half only while its holder holds nothing else"
        );
        assert_eq!(b.take_whole("c", 75), Err(Some(40)), "within the bound");
        assert!(b.take_whole("c", 60).is_ok());
        assert_eq!(b.held().0, 100);
    }
}
