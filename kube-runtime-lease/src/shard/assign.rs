//! Which replica owns which shard: the pure part of elected shards
//! (docs/sharding-design.md), with no I/O, so that every rule is tested
//! exactly.
//!
//! - An object's shard is FNV-1a 64 over its UID, modulo the shard count
//!   ([`shard_of`]), as KEP-5866's sharded list/watch proposes.
//! - With `L` members sorted by identity and `S` shards, member `i` owns
//!   `floor(S / L)` shards, plus one if `i < S mod L` ([`targets`]): they sum
//!   to exactly `S`, within one of each other.
//! - Which shards: [`Assignment`], a function of the member list alone, so
//!   that every member computes the same one and needs to watch only the
//!   shards it owns and the ones it would own if one other member left
//!   ([`Assignment::backups`]): each shard goes to the member that prefers
//!   it most (rendezvous hashing, [`preference`]) among those with room left
//!   under their target, taking (preference, member, shard) from the
//!   highest preference down.
//! - A member campaigns for the shards assigned to it and hands the others
//!   over ([`plan`]).
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
#[cfg(test)]
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

/// The one of `members` that deletes the roster entry `name` once it is
/// free (rendezvous hashing again: every member picks the same one, and the
/// entries spread over the members); `None` when there are none.
pub(crate) fn collector<'a>(members: &'a BTreeSet<String>, name: &str) -> Option<&'a String> {
    members
        .iter()
        .max_by_key(|m| (fnv1a(m.bytes().chain([0]).chain(name.bytes())), m.as_str()))
}

/// Who owns which shard, for one member list: every member computes the
/// same one from the same list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Assignment {
    /// The members, sorted.
    members: Vec<String>,
    /// Each shard's owner: an index into `members`.
    owner: Vec<usize>,
}

impl Assignment {
    /// The assignment of `shards` shards over `members` (none when there
    /// are no members). `S log S` per member: computed once per change of
    /// the member list.
    pub(crate) fn new(members: &BTreeSet<String>, shards: u16) -> Self {
        let list: Vec<String> = members.iter().cloned().collect();
        let orders: Vec<Vec<u16>> = list.iter().map(|id| ranking(id, shards)).collect();
        let orders: Vec<&[u16]> = orders.iter().map(Vec::as_slice).collect();
        let owner = fill(&targets(members, shards), &orders, shards);
        Assignment { members: list, owner }
    }

    /// The owner of `shard`.
    #[cfg(test)]
    pub(crate) fn owner(&self, shard: u16) -> Option<&str> {
        let m = *self.owner.get(usize::from(shard))?;
        self.members.get(m).map(String::as_str)
    }

    /// The shards `identity` owns.
    pub(crate) fn of(&self, identity: &str) -> BTreeSet<u16> {
        let Some(m) = self.members.iter().position(|x| x == identity) else {
            return BTreeSet::new();
        };
        (0u16..)
            .zip(&self.owner)
            .filter(|(_, o)| **o == m)
            .map(|(s, _)| s)
            .collect()
    }

    /// The shards `identity` would own if their owner left, each with that
    /// owner: the shards whose owner's death it must see (by watching their
    /// Leases) to take them a lease duration after their last renewal.
    /// Every shard of an assignment of two or more members is in exactly
    /// one member's backups. `L - 1` assignments: computed once per change
    /// of the member list.
    pub(crate) fn backups(&self, identity: &str) -> std::collections::BTreeMap<u16, String> {
        let shards = u16::try_from(self.owner.len()).unwrap_or(u16::MAX);
        let orders: Vec<Vec<u16>> = self.members.iter().map(|id| ranking(id, shards)).collect();
        let mut out = std::collections::BTreeMap::new();
        for (gone, other) in self.members.iter().enumerate().filter(|(_, m)| *m != identity) {
            let owned_now = self.of(other);
            if owned_now.is_empty() {
                continue;
            }
            let rest: BTreeSet<String> = self.members.iter().filter(|m| *m != other).cloned().collect();
            let rest_orders: Vec<&[u16]> = (0..orders.len())
                .filter(|i| *i != gone)
                .map(|i| orders[i].as_slice())
                .collect();
            let then = fill(&targets(&rest, shards), &rest_orders, shards);
            let rest: Vec<&String> = rest.iter().collect();
            for s in owned_now {
                if then
                    .get(usize::from(s))
                    .and_then(|m| rest.get(*m))
                    .is_some_and(|m| *m == identity)
                {
                    out.insert(s, other.clone());
                }
            }
        }
        out
    }
}

/// The shards, most preferred by `identity` first.
fn ranking(identity: &str, shards: u16) -> Vec<u16> {
    let mut order: Vec<u16> = (0..shards).collect();
    order.sort_by_cached_key(|s| (std::cmp::Reverse(preference(identity, *s)), *s));
    order
}

/// Each shard's owner (an index into `orders`): in turns, by member order,
/// each member under its target takes its most preferred shard not taken
/// yet (as Maglev fills its table), so that every member gets exactly its
/// target and a change of members moves few shards.
fn fill(targets: &[u16], orders: &[&[u16]], shards: u16) -> Vec<usize> {
    let mut owner = vec![usize::MAX; usize::from(shards)];
    if orders.is_empty() {
        return Vec::new();
    }
    let mut next = vec![0usize; orders.len()];
    let mut count = vec![0u16; orders.len()];
    let mut left = usize::from(shards);
    while left > 0 {
        let before = left;
        for (m, order) in orders.iter().enumerate() {
            if left == 0 {
                break;
            }
            if count[m] >= targets.get(m).copied().unwrap_or(0) {
                continue;
            }
            while let Some(&s) = order.get(next[m]) {
                next[m] += 1;
                if owner[usize::from(s)] == usize::MAX {
                    owner[usize::from(s)] = m;
                    count[m] += 1;
                    left -= 1;
                    break;
                }
            }
        }
        if left == before {
            break;
        }
    }
    owner
}

/// What a member should do now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Shards assigned to it that it neither holds nor campaigns for, most
    /// preferred first.
    pub(crate) take: Vec<u16>,
    /// Held shards assigned to others, to give up (by graceful release),
    /// least preferred first.
    pub(crate) release: Vec<u16>,
}

/// The plan of `identity`, which holds or campaigns for `mine`, when
/// `assigned` are its shards. `stable`: the member list has not changed for
/// a retry period (a member releases only then, so that a flapping member
/// list does not move shards back and forth).
pub(crate) fn plan(identity: &str, assigned: &BTreeSet<u16>, mine: &BTreeSet<u16>, stable: bool) -> Plan {
    let by_preference = |set: BTreeSet<u16>, most_first: bool| {
        let mut v: Vec<u16> = set.into_iter().collect();
        v.sort_by_key(|s| std::cmp::Reverse(preference(identity, *s)));
        if !most_first {
            v.reverse();
        }
        v
    };
    Plan {
        take: by_preference(assigned.difference(mine).copied().collect(), true),
        release: if stable {
            by_preference(mine.difference(assigned).copied().collect(), false)
        } else {
            Vec::new()
        },
    }
}

#[cfg(test)]
mod tests;
