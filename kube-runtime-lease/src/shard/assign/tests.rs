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

/// The assignment gives every member exactly its target, each shard to one
/// member, and depends on the member list alone.
#[test]
fn an_assignment_gives_each_member_its_target_and_each_shard_one_owner() {
    for shards in [1u16, 2, 7, 12, 16, 64, 256] {
        for n in 1..=17 {
            let m = members(n);
            let a = Assignment::new(&m, shards);
            let t = targets(&m, shards);
            let mut all = BTreeSet::new();
            for (id, want) in m.iter().zip(&t) {
                let of = a.of(id);
                assert_eq!(of.len(), usize::from(*want), "{id} of {n} over {shards}");
                assert!(of.iter().all(|s| a.owner(*s) == Some(id.as_str())));
                all.extend(of);
            }
            assert_eq!(all, (0..shards).collect::<BTreeSet<_>>(), "every shard owned");
            assert_eq!(a, Assignment::new(&m, shards), "deterministic");
        }
    }
    assert_eq!(Assignment::new(&BTreeSet::new(), 12).owner(0), None);
    assert!(Assignment::new(&members(3), 12).of("nobody").is_empty());
}

/// Members own different shards by preference, not by number: the first
/// member does not own the first shards.
#[test]
fn an_assignment_follows_the_preferences() {
    let m = members(4);
    let a = Assignment::new(&m, 64);
    for id in &m {
        let first = (0..64).max_by_key(|s| preference(id, *s)).unwrap();
        // Its most preferred shard is its own unless a member that prefers
        // it more took it first.
        if let Some(owner) = a.owner(first).filter(|o| *o != id) {
            assert!(
                preference(owner, first) > preference(id, first),
                "{id}: {first} went to {owner}"
            );
        }
    }
    let firsts: BTreeSet<u16> = m.iter().map(|id| *a.of(id).first().unwrap()).collect();
    assert_eq!(firsts.len(), 4, "different shards: {firsts:?}");
}

/// Each shard of a member is in exactly one other member's backups: the one
/// that owns it once that member is gone.
#[test]
fn every_shard_has_one_backup_the_owner_after_its_owner_leaves() {
    for (n, shards) in [(2, 16), (3, 12), (4, 64), (8, 64), (8, 256), (16, 256), (20, 16)] {
        let m = members(n);
        let a = Assignment::new(&m, shards);
        let mut backed: Vec<u16> = Vec::new();
        for id in &m {
            let b = a.backups(id);
            for (s, owner) in &b {
                assert_ne!(owner, id);
                assert_eq!(a.owner(*s), Some(owner.as_str()));
                let without: BTreeSet<String> = m.iter().filter(|x| *x != owner).cloned().collect();
                assert_eq!(Assignment::new(&without, shards).owner(*s), Some(id.as_str()));
            }
            backed.extend(b.keys());
        }
        backed.sort_unstable();
        let owned: Vec<u16> = (0..shards).collect();
        assert_eq!(backed, owned, "{n} over {shards}: each shard once");
    }
    assert!(Assignment::new(&members(1), 12).backups("replica-00").is_empty());
}

/// A join moves few shards: the joiner's share and at most four times as
/// many again (the members after it in the fill's turns shift), far from a
/// reshuffle.
#[test]
fn a_join_moves_about_the_joiners_share() {
    for (n, shards) in [(3u16, 12u16), (4, 64), (8, 256), (15, 256)] {
        let before = members(usize::from(n));
        let mut after = before.clone();
        after.insert("replica-joiner".to_owned());
        let (a, b) = (Assignment::new(&before, shards), Assignment::new(&after, shards));
        let moved = (0..shards).filter(|s| a.owner(*s) != b.owner(*s)).count();
        let share = usize::from(shards.div_ceil(n + 1));
        assert!(moved >= share, "{moved} < {share}");
        assert!(
            moved <= 5 * share,
            "{n} + 1 over {shards}: {moved} moved, share {share}"
        );
    }
}

/// A member campaigns for what is assigned to it and does not hold, and
/// hands the rest over, least preferred first, only once members are stable.
#[test]
fn a_plan_takes_the_assigned_and_releases_the_rest_once_stable() {
    let assigned: BTreeSet<u16> = [1, 2, 3].into();
    let mine: BTreeSet<u16> = [3, 4, 5].into();
    let p = plan("replica-00", &assigned, &mine, true);
    let mut take = p.take.clone();
    take.sort_unstable();
    assert_eq!(take, [1, 2]);
    let mut release = p.release.clone();
    release.sort_unstable();
    assert_eq!(release, [4, 5]);
    let pref = |s: &u16| preference("replica-00", *s);
    assert!(pref(&p.take[0]) >= pref(&p.take[1]), "most preferred first");
    assert!(
        pref(&p.release[0]) <= pref(&p.release[1]),
        "least preferred first"
    );
    let unstable = plan("replica-00", &assigned, &mine, false);
    assert!(unstable.release.is_empty(), "no release while members change");
    assert_eq!(unstable.take.len(), 2);
    assert_eq!(plan("replica-00", &mine, &mine, true), Plan::default());
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
    let a = Assignment::new(&many, 12);
    let owners: BTreeSet<&str> = (0..12).filter_map(|s| a.owner(s)).collect();
    assert_eq!(owners.len(), 12, "one shard each for the first 12");
}
