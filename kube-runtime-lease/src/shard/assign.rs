//! Which replica owns which shard: the pure part of elected shards
//! (docs/sharding-design.md), with no I/O, so that every rule is tested
//! exactly.
//!
//! - An object's shard is FNV-1a 64 over its UID, modulo the shard count
//!   ([`shard_of`]), as KEP-5866's sharded list/watch proposes.
//! - With `L` live members sorted by identity and `S` shards, member `i`
//!   wants `floor(S / L)` shards, plus one if `i < S mod L` ([`targets`]):
//!   every member computes the same targets from the same member list, so
//!   they sum to exactly `S` and steady state is within ±1 by construction.
//! - A member under its target campaigns for the free shards it prefers,
//!   by rendezvous hashing ([`preference`]), so that members pick different
//!   shards and do not stampede one when a peer dies; a member over its
//!   target gives up its least preferred surplus shards ([`plan`]).

use std::collections::BTreeSet;

/// FNV-1a, 64 bits.
fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .into_iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The shard of the object with `uid`, of `shards` (at least 1).
pub(crate) fn shard_of(uid: &str, shards: u16) -> u16 {
    let s = u64::from(shards.max(1));
    u16::try_from(fnv1a(uid.bytes()) % s).expect("below a u16")
}

/// How many shards each of `members` (sorted, deduplicated: a `BTreeSet`)
/// should hold, in the same order.
pub(crate) fn targets(members: &BTreeSet<String>, shards: u16) -> Vec<u16> {
    let Ok(l) = u16::try_from(members.len()) else {
        // More members than shards could ever use: the first `shards` get one.
        return (0..members.len())
            .map(|i| u16::from(i < usize::from(shards)))
            .collect();
    };
    if l == 0 {
        return Vec::new();
    }
    let (base, extra) = (shards / l, shards % l);
    (0..l).map(|i| base + u16::from(i < extra)).collect()
}

/// The target of `identity` among `members`; 0 if it is not one of them.
pub(crate) fn target_of(identity: &str, members: &BTreeSet<String>, shards: u16) -> u16 {
    members
        .iter()
        .position(|m| m == identity)
        .map_or(0, |i| targets(members, shards)[i])
}

/// How much `identity` prefers `shard` (rendezvous hashing: the highest
/// wins); every member ranks every shard differently.
pub(crate) fn preference(identity: &str, shard: u16) -> u64 {
    fnv1a(identity.bytes().chain([0]).chain(shard.to_be_bytes()))
}

/// What a member should do now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Free shards to campaign for, most preferred first.
    pub(crate) take: Vec<u16>,
    /// Held shards to give up (by graceful release), least preferred first.
    pub(crate) release: Vec<u16>,
}

/// The plan of `identity`, which holds `held`, when `free` shards are held by
/// nobody and the live members are `members`. `stable`: the member list has
/// not changed for a retry period (a member releases only then, so that a
/// flapping member list does not move shards back and forth).
pub(crate) fn plan(
    identity: &str,
    members: &BTreeSet<String>,
    shards: u16,
    held: &BTreeSet<u16>,
    free: &BTreeSet<u16>,
    stable: bool,
) -> Plan {
    let target = usize::from(target_of(identity, members, shards));
    let by_preference = |set: &BTreeSet<u16>, most_first: bool| {
        let mut v: Vec<u16> = set.iter().copied().collect();
        v.sort_by_key(|s| std::cmp::Reverse(preference(identity, *s)));
        if !most_first {
            v.reverse();
        }
        v
    };
    let mut plan = Plan::default();
    if held.len() < target {
        plan.take = by_preference(free, true);
        plan.take.truncate(target - held.len());
    } else if held.len() > target && stable {
        plan.release = by_preference(held, false);
        plan.release.truncate(held.len() - target);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("replica-{i:02}")).collect()
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        // From the FNV reference (draft-eastlake-fnv): "" and "a".
        assert_eq!(fnv1a(*b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(*b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(*b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn shards_of_many_uids_are_spread_evenly() {
        let shards = 12;
        let mut count = [0u32; 12];
        for i in 0..12_000 {
            let uid = format!("4a1b2c3d-0000-4000-8000-{i:012}");
            count[usize::from(shard_of(&uid, shards))] += 1;
        }
        for c in count {
            assert!((800..1200).contains(&c), "{count:?}");
        }
        assert_eq!(shard_of("x", 0), 0, "no shard count: one shard");
    }

    #[test]
    fn targets_sum_to_the_shard_count_within_one_of_each_other() {
        for shards in [1u16, 2, 7, 12, 16, 64] {
            for n in 1..=20 {
                let t = targets(&members(n), shards);
                assert_eq!(t.len(), n);
                assert_eq!(t.iter().map(|x| u32::from(*x)).sum::<u32>(), u32::from(shards));
                let (min, max) = (t.iter().min().unwrap(), t.iter().max().unwrap());
                assert!(max - min <= 1, "{shards} shards over {n}: {t:?}");
            }
        }
        assert!(targets(&members(0), 12).is_empty());
        assert_eq!(target_of("nobody", &members(3), 12), 0);
        assert_eq!(targets(&members(3), 12), [4, 4, 4]);
        assert_eq!(targets(&members(5), 12), [3, 3, 2, 2, 2]);
    }

    #[test]
    fn members_prefer_different_shards() {
        let m = members(3);
        let free: BTreeSet<u16> = (0..12).collect();
        let firsts: BTreeSet<u16> = m
            .iter()
            .map(|id| plan(id, &m, 12, &BTreeSet::new(), &free, true).take[0])
            .collect();
        assert!(
            firsts.len() >= 2,
            "all members want the same shard first: {firsts:?}"
        );
    }

    #[test]
    fn a_member_under_its_target_takes_only_what_it_lacks() {
        let m = members(3);
        let held: BTreeSet<u16> = [0, 1].into();
        let free: BTreeSet<u16> = (2..12).collect();
        let p = plan("replica-00", &m, 12, &held, &free, true);
        assert_eq!(p.take.len(), 2);
        assert!(p.take.iter().all(|s| free.contains(s)));
        assert!(p.release.is_empty());
    }

    #[test]
    fn a_member_over_its_target_releases_its_surplus_only_once_members_are_stable() {
        // A fourth member joined: 12 over 4 is 3 each; this one holds 4.
        let m = members(4);
        let held: BTreeSet<u16> = [0, 1, 2, 3].into();
        let p = plan("replica-00", &m, 12, &held, &BTreeSet::new(), true);
        assert_eq!(p.release.len(), 1);
        assert!(held.contains(&p.release[0]));
        assert!(p.take.is_empty());
        let unstable = plan("replica-00", &m, 12, &held, &BTreeSet::new(), false);
        assert_eq!(unstable, Plan::default(), "no release while members change");
    }

    #[test]
    fn every_member_following_its_plan_reaches_one_holder_per_shard_within_one() {
        // A simple fixed point: members take free shards and release surplus
        // in turn until nothing changes.
        let m = members(5);
        let shards = 12;
        let mut held: Vec<BTreeSet<u16>> = vec![
            (0..12).collect(),
            BTreeSet::new(),
            BTreeSet::new(),
            BTreeSet::new(),
            BTreeSet::new(),
        ];
        for _round in 0..20 {
            for (i, id) in m.iter().enumerate() {
                let taken: BTreeSet<u16> = held.iter().flatten().copied().collect();
                let free: BTreeSet<u16> = (0..shards).filter(|s| !taken.contains(s)).collect();
                let p = plan(id, &m, shards, &held[i], &free, true);
                for s in p.release {
                    held[i].remove(&s);
                }
                for s in p.take {
                    held[i].insert(s);
                }
            }
        }
        let all: Vec<u16> = held.iter().flatten().copied().collect();
        assert_eq!(all.len(), 12, "each shard once: {held:?}");
        assert_eq!(all.iter().copied().collect::<BTreeSet<_>>().len(), 12);
        let sizes: Vec<usize> = held.iter().map(BTreeSet::len).collect();
        assert_eq!(sizes, [3, 3, 2, 2, 2]);
    }

    /// More members than a `u16` counts (a misconfiguration, but no panic):
    /// the first `shards` get one each, the rest none.
    #[test]
    fn more_members_than_a_u16_counts_get_one_shard_each_at_most() {
        let many = members(70_000);
        let t = targets(&many, 12);
        assert_eq!(t.len(), 70_000);
        assert_eq!(t[..12], [1; 12]);
        assert!(t[12..].iter().all(|&x| x == 0));
    }

    /// A member takes the free shards it prefers most, and gives up the held
    /// ones it prefers least: members pick different shards (rendezvous).
    #[test]
    fn plans_follow_the_preference_order() {
        let m = members(1);
        let id = m.first().unwrap().clone();
        let all: BTreeSet<u16> = (0..12).collect();
        let mut ranked: Vec<u16> = all.iter().copied().collect();
        ranked.sort_by_key(|s| std::cmp::Reverse(preference(&id, *s)));
        // Alone, it wants all 12: the most preferred first.
        let p = plan(&id, &m, 12, &BTreeSet::new(), &all, true);
        assert_eq!(p.take, ranked);
        // Among 4 members its target is 3: holding all 12, it gives up the 9
        // it prefers least, least preferred first.
        let four: BTreeSet<String> = (0..4).map(|i| format!("{id}{}", "~".repeat(i))).collect();
        assert_eq!(target_of(&id, &four, 12), 3);
        let p = plan(&id, &four, 12, &all, &BTreeSet::new(), true);
        let mut least_first = ranked.clone();
        least_first.reverse();
        assert_eq!(p.release, least_first[..9]);
    }
}
