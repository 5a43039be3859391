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
