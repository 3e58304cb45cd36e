//! How a worker's free slots are divided among the providers it drives, before each claim.
//!
//! A slow or hanging provider holds one slot per call, never the worker, and never another
//! provider's share:
//!
//! * **fair share**: `ceil(concurrency / providers)`. The claim takes each provider's rows up to
//!   its share first, and only then anyone's extra rows (by due time), so while others have due
//!   work no provider gets more than its share of what is free;
//! * **borrowing**: a provider may take slots beyond its share while others have nothing due, but
//!   never the last eighth of a share (at least one slot) of each other provider (a reserve: the next
//!   due work of a fast provider finds a slot even when a hanging one borrowed everything else). The
//!   claim query counts the reserves against all providers' extra rows together, so two hanging
//!   providers borrowing at once cannot take a third's reserve between them;
//! * **`limits.max_in_flight`**: the contract's own cap per worker, below the above (a cap, never a
//!   grant: a provider's published "100 at once" on a worker of 64 slots leaves the others their
//!   reserve);
//! * **`limits.fleet_max_in_flight`**: counted by the claim query against leases held across the
//!   fleet.
//!
//! Pure: a function of the counts, table-tested below.

use jobtrail_provider::contract::Limits;
use jobtrail_store::ClaimShare;
use std::collections::HashMap;

/// The shares of one claim of at most `free` rows by a worker of `concurrency` slots that drives
/// `in_flight[p]` steps of provider `p` now.
pub(crate) fn shares(
    concurrency: usize,
    free: usize,
    in_flight: &HashMap<String, usize>,
    providers: &[(String, Limits)],
) -> Vec<ClaimShare> {
    let k = providers.len().max(1);
    let share = concurrency.div_ceil(k);
    // Kept on the smallest workers too (a slot per provider or fewer): one provider's hanging
    // calls never take the slot another's due work needs.
    let reserve = if k > 1 { (share / 8).max(1) } else { 0 };
    let borrow_cap = concurrency.saturating_sub((k - 1) * reserve).max(1);
    providers
        .iter()
        .map(|(name, limits)| {
            let hard = limits
                .max_in_flight
                .map_or(borrow_cap, |m| (m as usize).min(borrow_cap));
            let now = in_flight.get(name).copied().unwrap_or(0);
            let cap = hard.saturating_sub(now).min(free);
            let fair = share.min(hard).saturating_sub(now).min(cap);
            ClaimShare {
                provider: name.clone(),
                fair: fair as i32,
                cap: cap as i32,
                fleet_cap: limits.fleet_max_in_flight.map(|f| f as i32),
                reserve: reserve.saturating_sub(now) as i32,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: Option<u32>) -> Limits {
        Limits {
            max_in_flight: max,
            ..Limits::default()
        }
    }

    fn run(
        concurrency: usize,
        free: usize,
        in_flight: &[(&str, usize)],
        providers: &[(&str, Option<u32>)],
    ) -> Vec<(i32, i32)> {
        let in_flight = in_flight.iter().map(|(p, n)| (p.to_string(), *n)).collect();
        let providers: Vec<(String, Limits)> = providers
            .iter()
            .map(|(p, m)| (p.to_string(), limits(*m)))
            .collect();
        shares(concurrency, free, &in_flight, &providers)
            .into_iter()
            .map(|s| (s.fair, s.cap))
            .collect()
    }

    /// (concurrency, free, in flight, providers with their max_in_flight) → (fair, cap) each.
    type Case<'a> = (
        usize,
        usize,
        &'a [(&'a str, usize)],
        &'a [(&'a str, Option<u32>)],
        &'a [(i32, i32)],
    );

    #[test]
    fn the_table() {
        // (concurrency, free, in flight, providers) → (fair, cap) per provider.
        let cases: &[Case] = &[
            // One provider: every free slot is its share.
            (64, 64, &[], &[("a", None)], &[(64, 64)]),
            (64, 10, &[("a", 54)], &[("a", None)], &[(10, 10)]),
            // Two providers, nothing running: 32 each first; each may borrow up to 64 - 4.
            (
                64,
                64,
                &[],
                &[("a", None), ("b", None)],
                &[(32, 60), (32, 60)],
            ),
            // A hangs in 60 slots: it may take nothing more; B gets all 4 that are free, all fair.
            (
                64,
                4,
                &[("a", 60)],
                &[("a", None), ("b", None)],
                &[(0, 0), (4, 4)],
            ),
            // A holds its share: more of A only after B's due rows.
            (
                64,
                32,
                &[("a", 32)],
                &[("a", None), ("b", None)],
                &[(0, 28), (32, 32)],
            ),
            // The contract's cap lowers the borrowing cap, never raises it: the others keep their
            // reserve, and it is never above the slots.
            (
                64,
                64,
                &[("a", 3)],
                &[("a", Some(4)), ("b", None)],
                &[(1, 1), (32, 60)],
            ),
            (
                64,
                64,
                &[],
                &[("a", Some(100)), ("b", None)],
                &[(32, 60), (32, 60)],
            ),
            (8, 8, &[], &[("a", Some(100))], &[(8, 8)]),
            // Tiny workers: a slot each at least.
            (
                1,
                1,
                &[],
                &[("a", None), ("b", None), ("c", None)],
                &[(1, 1), (1, 1), (1, 1)],
            ),
            (2, 0, &[], &[("a", None), ("b", None)], &[(0, 0), (0, 0)]),
            // A slot per provider: one that holds two (it took them before the others had work)
            // takes no more, and the others keep theirs.
            (
                3,
                1,
                &[("a", 2)],
                &[("a", None), ("b", None), ("c", None)],
                &[(0, 0), (1, 1), (1, 1)],
            ),
            // Small workers keep a reserve of one slot per other provider.
            (
                4,
                4,
                &[("a", 3)],
                &[("a", None), ("b", None)],
                &[(0, 0), (2, 3)],
            ),
        ];
        for (i, (c, free, running, providers, want)) in cases.iter().enumerate() {
            assert_eq!(
                run(*c, *free, running, providers),
                want.to_vec(),
                "case {i}"
            );
        }
    }

    #[test]
    fn a_reserve_is_what_a_provider_still_lacks_of_it() {
        let providers: Vec<(String, Limits)> = ["a", "b", "c"]
            .iter()
            .map(|p| (p.to_string(), limits(None)))
            .collect();
        let in_flight = [("a".to_string(), 30), ("c".to_string(), 1)].into();
        // 64 slots, three providers: a share of 22, a reserve of 2 each.
        let reserves: Vec<i32> = shares(64, 33, &in_flight, &providers)
            .iter()
            .map(|s| s.reserve)
            .collect();
        assert_eq!(reserves, vec![0, 2, 1]);
        let alone = shares(64, 64, &HashMap::new(), &providers[..1]);
        assert_eq!(alone[0].reserve, 0, "one provider keeps nothing back");
    }

    #[test]
    fn the_fleet_cap_passes_through() {
        let providers = vec![(
            "a".to_string(),
            Limits {
                fleet_max_in_flight: Some(5),
                ..Limits::default()
            },
        )];
        let s = shares(16, 16, &HashMap::new(), &providers);
        assert_eq!(s[0].fleet_cap, Some(5));
    }
}
