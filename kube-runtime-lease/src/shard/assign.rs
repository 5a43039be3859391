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
mod tests;
