//! The sharded election on the Lease double, with paused time.

use std::{collections::BTreeSet, time::Duration};

use tokio::time::sleep;

use super::{ShardConfig, ShardedElector, assign::Assignment};
use crate::{LeaseConfig, test_util::FakeLeaseApi, tests::support::paused};

const S: fn(u64) -> Duration = Duration::from_secs;

fn replica(fake: &FakeLeaseApi, identity: &str) -> ShardedElector {
    let (client, _) = fake.client();
    let lease = LeaseConfig::new("default", "ctl", identity)
        .lease_duration(S(4))
        .renew_deadline(S(3))
        .retry_period(S(1));
    ShardedElector::new(client, ShardConfig::new(lease, 12)).unwrap()
}

/// The shards each replica holds now.
fn held(replicas: &[&ShardedElector]) -> Vec<BTreeSet<u16>> {
    replicas.iter().map(|r| r.held().borrow().clone()).collect()
}

/// Samples for `span` (every 100 ms of paused time) that no shard is ever
/// held by two replicas.
async fn never_shared(replicas: &[&ShardedElector], span: Duration) {
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        let each = held(replicas);
        let total: usize = each.iter().map(BTreeSet::len).sum();
        let union: BTreeSet<u16> = each.iter().flatten().copied().collect();
        assert_eq!(total, union.len(), "a shard held twice: {each:?}");
        sleep(Duration::from_millis(100)).await;
    }
}

fn sizes(h: &[BTreeSet<u16>]) -> Vec<usize> {
    h.iter().map(BTreeSet::len).collect()
}

/// Invalid settings are typed errors before any API call: no shards, a
/// base name that cannot be the label value that finds the Leases, and
/// whatever one Lease's configuration breaks.
#[test]
fn an_invalid_sharded_election_is_an_error_before_any_api_call() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (client, _) = fake.client();
        let lease = LeaseConfig::new("default", "ctl", "a");
        let err = ShardedElector::new(client.clone(), ShardConfig::new(lease.clone(), 0)).unwrap_err();
        assert_eq!(err, crate::ConfigError::NoShards);
        let long = LeaseConfig::new("default", "x".repeat(64), "a");
        let err = ShardedElector::new(client.clone(), ShardConfig::new(long, 4)).unwrap_err();
        assert!(matches!(err, crate::ConfigError::InvalidLabel { .. }), "{err:?}");
        let bad = lease.renew_deadline(S(20));
        let err = ShardedElector::new(client, ShardConfig::new(bad, 4)).unwrap_err();
        assert_eq!(err, crate::ConfigError::LeaseDurationNotGreaterThanRenewDeadline);
        assert!(fake.requests().is_empty(), "no API call: {:?}", fake.requests());
    });
}

#[test]
fn replicas_share_the_shards_within_one_and_rebalance_on_join_and_leave() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, b, c) = (replica(&fake, "a"), replica(&fake, "b"), replica(&fake, "c"));
        for r in [&a, &b, &c] {
            let r = r.clone();
            tokio::spawn(async move { r.run().await });
        }
        never_shared(&[&a, &b, &c], S(60)).await;
        let now = held(&[&a, &b, &c]);
        assert_eq!(sizes(&now), [4, 4, 4], "{now:?}");
        assert_eq!(now.iter().flatten().count(), 12);
        // A fourth replica joins: the others hand shards over (3 each).
        let d = replica(&fake, "d");
        {
            let d = d.clone();
            tokio::spawn(async move { d.run().await });
        }
        never_shared(&[&a, &b, &c, &d], S(60)).await;
        let now = held(&[&a, &b, &c, &d]);
        assert_eq!(sizes(&now), [3, 3, 3, 3], "{now:?}");
        // Each holds exactly its assignment; each of the three handed over
        // the shards the assignment moved away from it; d none.
        let ids = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<String>>();
        let (three, four) = (
            Assignment::new(&ids(&["a", "b", "c"]), 12),
            Assignment::new(&ids(&["a", "b", "c", "d"]), 12),
        );
        for (r, id) in [(&a, "a"), (&b, "b"), (&c, "c"), (&d, "d")] {
            assert_eq!(*r.held().borrow(), four.of(id), "{id} holds its assignment");
        }
        let moved: Vec<u64> = ["a", "b", "c", "d"]
            .iter()
            .map(|id| three.of(id).difference(&four.of(id)).count() as u64)
            .collect();
        assert_eq!(moved[3], 0, "d held nothing before");
        assert!(
            moved.iter().sum::<u64>() >= 3,
            "d's three came from the others: {moved:?}"
        );
        let rebalances = |rs: &[&ShardedElector]| rs.iter().map(|r| r.rebalances()).collect::<Vec<_>>();
        assert_eq!(rebalances(&[&a, &b, &c, &d]), moved);
        // It leaves: its shards are taken again, each within a watch event
        // and a write (paused time: within a second) by the replica it
        // assigns them to; the few the assignment moves between the others
        // once the roster is stable for a retry period (4 each, within 2 s).
        let left = tokio::time::Instant::now();
        d.shutdown(S(1)).await;
        while held(&[&a, &b, &c]).iter().flatten().count() < 12 {
            assert!(
                left.elapsed() < S(1),
                "not re-owned within 1 s: {:?}",
                held(&[&a, &b, &c])
            );
            never_shared(&[&a, &b, &c], Duration::from_millis(10)).await;
        }
        while sizes(&held(&[&a, &b, &c])) != [4, 4, 4] {
            assert!(
                left.elapsed() < S(2),
                "not balanced within 2 s: {:?}",
                held(&[&a, &b, &c])
            );
            never_shared(&[&a, &b, &c], Duration::from_millis(10)).await;
        }
        never_shared(&[&a, &b, &c], S(30)).await;
        let now = held(&[&a, &b, &c]);
        assert_eq!(sizes(&now), [4, 4, 4], "{now:?}");
        // Taking a leaver's shards is no rebalance, nor is leaving; handing
        // back what the join's assignment moved between the three is.
        let back: Vec<u64> = ["a", "b", "c", "d"]
            .iter()
            .zip(&moved)
            .map(|(id, m)| m + (four.of(id).difference(&three.of(id)).count() as u64) * u64::from(*id != "d"))
            .collect();
        assert_eq!(rebalances(&[&a, &b, &c, &d]), back);
        for (r, id) in [(&a, "a"), (&b, "b"), (&c, "c")] {
            assert_eq!(
                *r.held().borrow(),
                three.of(id),
                "{id} holds its assignment again"
            );
        }
        let status = a.status();
        assert_eq!(status.len(), 12);
        let leading: BTreeSet<u16> = status
            .iter()
            .filter(|(_, s)| s.is_leader)
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(leading, *a.held().borrow(), "status agrees with held()");
        let some_uid = "0b6c6c1a-0000-4000-8000-000000000001";
        let owners = [&a, &b, &c].iter().filter(|r| r.owns_uid(some_uid)).count();
        assert_eq!(owners, 1, "one owner per object");
        let mut object = k8s_openapi::api::core::v1::ConfigMap::default();
        assert!(
            [&a, &b, &c].iter().all(|r| !r.owns(&object)),
            "an object without a UID is owned by nobody"
        );
        object.metadata.uid = Some(some_uid.to_owned());
        let owner = [&a, &b, &c].iter().position(|r| r.owns(&object));
        assert_eq!(
            owner,
            [&a, &b, &c].iter().position(|r| r.owns_uid(some_uid)),
            "owns(&object) is owns_uid(its UID)"
        );
        assert!(owner.is_some());
    });
}

/// A replica cut off from the API server (as after a crash, or a partition)
/// stops believing it holds its shards at their renew deadline; the others
/// take them over once their records have not changed for a lease duration
/// (counted from when their own watch last saw a change, not from when a
/// campaign first read them: within the lease duration and one retry period
/// of the cut), and never two replicas hold one shard at any sampled instant.
/// A peer watching over its shards evicts it from the roster; healed, it
/// joins the roster again and the shards are balanced again: 4 each.
#[test]
fn the_shards_of_a_replica_cut_off_are_taken_over_after_their_lease_duration() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let mut ids = Vec::new();
        let mut replicas = Vec::new();
        for name in ["a", "b", "c"] {
            let (client, id) = fake.client();
            let lease = LeaseConfig::new("default", "ctl", name)
                .lease_duration(S(4))
                .renew_deadline(S(3))
                .retry_period(S(1));
            let r = ShardedElector::new(client, ShardConfig::new(lease, 12)).unwrap();
            let run = r.clone();
            tokio::spawn(async move { run.run().await });
            ids.push(id);
            replicas.push(r);
        }
        let [a, b, c] = [&replicas[0], &replicas[1], &replicas[2]];
        never_shared(&[a, b, c], S(60)).await;
        assert_eq!(sizes(&held(&[a, b, c])), [4, 4, 4]);
        let cut = tokio::time::Instant::now();
        fake.partition(ids[2], true);
        // c's terms end at their renew deadline (3 s after its last renewal).
        never_shared(&[a, b, c], S(4)).await;
        assert!(
            c.held().borrow().is_empty(),
            "c still believes it holds {:?}",
            c.held().borrow()
        );
        // a and b take c's shards: 6 each, within the lease duration and a
        // retry period (the eviction is judged when their records expire).
        let deadline = cut + S(5);
        loop {
            never_shared(&[a, b, c], Duration::from_millis(100)).await;
            if sizes(&held(&[a, b])) == [6, 6] {
                break;
            }
            assert!(
                tokio::time::Instant::now() <= deadline,
                "not re-owned within the lease duration and a retry period: {:?}",
                held(&[a, b, c])
            );
        }
        assert!(
            cut.elapsed() >= S(3),
            "taken before the lease duration since c's last renewal: {:?}",
            cut.elapsed()
        );
        // c was evicted from the roster by a peer watching over its shards.
        assert_eq!(
            roster_members(&fake),
            BTreeSet::from(["a".to_owned(), "b".to_owned()])
        );
        // Healed: c joins the roster again, and the shards are shared by three.
        fake.partition(ids[2], false);
        never_shared(&[a, b, c], S(60)).await;
        assert_eq!(sizes(&held(&[a, b, c])), [4, 4, 4], "{:?}", held(&[a, b, c]));
        assert_eq!(roster_members(&fake).len(), 3);
    });
}

/// A replica whose balancer stops without `shutdown` (its controller's
/// stream dropped, say) gives every shard up: nothing keeps renewing them,
/// and the other takes them at once, by release, not after their lease
/// duration.
#[test]
fn a_replica_whose_balancer_is_dropped_gives_its_shards_up() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, b) = (replica(&fake, "a"), replica(&fake, "b"));
        let run_a = {
            let a = a.clone();
            tokio::spawn(async move { a.run().await })
        };
        {
            let b = b.clone();
            tokio::spawn(async move { b.run().await });
        }
        never_shared(&[&a, &b], S(60)).await;
        assert_eq!(sizes(&held(&[&a, &b])), [6, 6]);
        let stopped = tokio::time::Instant::now();
        run_a.abort();
        while sizes(&held(&[&a, &b])) != [0, 12] {
            assert!(
                stopped.elapsed() < S(2),
                "a's shards not released within 2 s (lease duration 4 s): {:?}",
                held(&[&a, &b])
            );
            never_shared(&[&a, &b], Duration::from_millis(10)).await;
        }
        assert!(a.status().values().all(|s| !s.is_leader), "a renews nothing");
    });
}

/// A balancer (`run`) dropped after any number of polls, 250 ms of paused
/// time apart, while `b` runs beside it: whatever `a` was doing (joining the
/// roster, campaigning, holding its share, a write in flight), `b` holds
/// all 12 shards within a lease duration (4 s) and a second after the drop,
/// no shard is ever held twice, and `a` renews nothing.
#[test]
fn a_balancer_dropped_after_any_number_of_polls_leaves_nothing_held() {
    let mut found = Vec::new();
    for polls in 0..48 {
        let outcome = std::sync::Arc::new(parking_lot::Mutex::new(None));
        let out = outcome.clone();
        paused(async move {
            let fake = FakeLeaseApi::default();
            let (a, b) = (replica(&fake, "a"), replica(&fake, "b"));
            {
                let b = b.clone();
                tokio::spawn(async move { b.run().await });
            }
            {
                let mut run_a = std::pin::pin!(a.run());
                for _ in 0..polls {
                    if futures::poll!(run_a.as_mut()).is_ready() {
                        break;
                    }
                    sleep(Duration::from_millis(250)).await;
                }
            }
            let dropped = tokio::time::Instant::now();
            while sizes(&held(&[&a, &b])) != [0, 12] && dropped.elapsed() < S(5) {
                never_shared(&[&a, &b], Duration::from_millis(10)).await;
            }
            let renews = a.status().values().filter(|s| s.is_leader).count();
            *out.lock() = Some((held(&[&a, &b]), dropped.elapsed(), renews));
        });
        let (held, after, renews) = outcome.lock().take().unwrap();
        if sizes(&held) != [0, 12] || renews > 0 {
            found.push(format!(
                "dropped after {polls} polls: {after:?} later, held {held:?}, a leads {renews} shards"
            ));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Every shard's election is in the metrics, one series per shard Lease: the
/// shards a replica holds are their sum.
#[cfg(feature = "metrics")]
#[test]
fn the_metrics_have_one_series_per_shard() {
    paused(async {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = crate::metrics::LeaseMetrics::register(&mut registry);
        let fake = FakeLeaseApi::default();
        let a = replica(&fake, "a").with_metrics(&metrics);
        let run = a.clone();
        tokio::spawn(async move { run.run().await });
        never_shared(&[&a], S(30)).await;
        assert_eq!(a.held().borrow().len(), 12);
        let text = crate::tests::support::scrape(&registry);
        let leading = (0..12)
            .filter(|s| {
                text.contains(&format!(
                    r#"leader_election_is_leader{{namespace="default",lease="ctl-s12-shard-{s:02}"}} 1"#
                ))
            })
            .count();
        assert_eq!(leading, 12, "{text}");
        assert!(
            text.contains(r#"leader_election_shards_held{namespace="default",lease="ctl"} 12"#),
            "{text}"
        );
        assert!(
            text.contains(r#"leader_election_shard_rebalances_total{namespace="default",lease="ctl"} 0"#),
            "{text}"
        );
    });
}

/// A member's or shard's record is judged by its own lease duration (the
/// fallback only when it has none), and is live strictly before it expires,
/// as `Observed::verdict` judges any Lease.
#[test]
fn records_are_fresh_for_their_own_lease_duration_and_not_at_its_end() {
    paused(async {
        let seen = |duration: Option<i32>| super::Watched {
            holder: Some("b".to_owned()),
            lease: k8s_openapi::api::coordination::v1::Lease {
                spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                    holder_identity: Some("b".to_owned()),
                    lease_duration_seconds: duration,
                    ..Default::default()
                }),
                ..Default::default()
            },
            changed: tokio::time::Instant::now(),
            firsts: Vec::new(),
            released: false,
        };
        let (long, none) = (seen(Some(20)), seen(None));
        let start = tokio::time::Instant::now();
        // 10 s later: a 20 s record is fresh, though the fallback is 4 s.
        assert!(long.fresh(S(4), start + S(10)));
        assert!(!none.fresh(S(4), start + S(10)), "no duration: the fallback");
        // At its very end it is not fresh any more.
        assert!(long.fresh(S(4), start + S(20) - Duration::from_millis(1)));
        assert!(!long.fresh(S(4), start + S(20)));
        // The watch's view: a record seen again (a re-list) keeps its clock;
        // another object, or a changed record, restarts it.
        let config = ShardConfig::new(LeaseConfig::new("default", "ctl", "a"), 12);
        let mut lease = long.lease.clone();
        lease.metadata.name = Some("ctl-s12-shard-03".to_owned());
        lease.metadata.uid = Some("u1".to_owned());
        lease.metadata.labels = Some(
            [(super::ROLE_LABEL.to_owned(), "shard".to_owned())]
                .into_iter()
                .collect(),
        );
        let key = |l: &k8s_openapi::api::coordination::v1::Lease| config.shard_of_lease(l);
        let mut view = super::view::Listing::<u16>::default();
        let apply =
            |view: &mut super::view::Listing<u16>, l: &k8s_openapi::api::coordination::v1::Lease, at| {
                view.event(kube_runtime::watcher::Event::Apply(l.clone()), key, at);
            };
        apply(&mut view, &lease, start);
        apply(&mut view, &lease, start + S(2));
        assert_eq!(view.get(&3).unwrap().changed, start, "seen again: the same clock");
        assert_eq!(view.get(&3).unwrap().holder.as_deref(), Some("b"));
        let mut recreated = lease.clone();
        recreated.metadata.uid = Some("u2".to_owned());
        apply(&mut view, &recreated, start + S(3));
        assert_eq!(view.get(&3).unwrap().changed, start + S(3), "another object");
        let mut renewed = recreated.clone();
        renewed.spec.as_mut().unwrap().lease_transitions = Some(1);
        apply(&mut view, &renewed, start + S(4));
        assert_eq!(view.get(&3).unwrap().changed, start + S(4), "a changed record");
        // A shard Lease of another shard count, or beyond the count, is not
        // this election's.
        for name in ["ctl-s6-shard-04", "ctl-s12-shard-12", "ctl-s12-shard-x"] {
            let mut other = lease.clone();
            other.metadata.name = Some(name.to_owned());
            assert_eq!(config.shard_of_lease(&other), None, "{name}");
        }
        // A re-list: what is listed again unchanged keeps its clock, what is
        // gone is dropped, and the listing is whole only at its end.
        let mut four = renewed.clone();
        four.metadata.name = Some("ctl-s12-shard-04".to_owned());
        apply(&mut view, &four, start + S(4));
        view.event(kube_runtime::watcher::Event::Init, key, start + S(5));
        view.event(
            kube_runtime::watcher::Event::InitApply(renewed.clone()),
            key,
            start + S(5),
        );
        assert!(
            view.get(&4).is_some(),
            "the old listing stands until the new one is whole"
        );
        view.event(kube_runtime::watcher::Event::InitDone, key, start + S(5));
        assert!(view.synced());
        assert_eq!(
            view.get(&3).unwrap().changed,
            start + S(4),
            "listed again unchanged"
        );
        assert!(view.get(&4).is_none(), "gone from the new list");
        view.event(
            kube_runtime::watcher::Event::Delete(renewed.clone()),
            key,
            start + S(6),
        );
        assert!(view.get(&3).is_none(), "deleted");
        view.reselect(|_| true);
        assert!(!view.synced(), "selected again: whole once listed again");
    });
}

/// An object's shard is FNV-1a of its UID modulo the shard count, whichever
/// replica computes it.
#[test]
fn every_replica_computes_the_same_shard_of_an_object() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, b) = (replica(&fake, "a"), replica(&fake, "b"));
        let shards: BTreeSet<u16> = (0..200)
            .map(|i| {
                let uid = format!("4a1b2c3d-0000-4000-8000-{i:012}");
                let s = a.shard_of(&uid);
                assert_eq!(s, b.shard_of(&uid));
                assert_eq!(s, super::assign::shard_of(&uid, 12));
                s
            })
            .collect();
        assert_eq!(shards.len(), 12, "every shard gets objects: {shards:?}");
        let debug = format!("{a:?}");
        assert!(
            debug.starts_with("ShardedElector") && debug.contains("held"),
            "{debug}"
        );
    });
}

/// While replicas leave and join: `held()` notifies every change, and only
/// changes (each notified value differs from the one before); and a shard a
/// replica took is never handed over within a lease duration of being taken
/// (the oscillation guard), though the replica is over its share at once.
#[test]
fn held_notifies_each_change_and_young_shards_are_not_handed_over() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, b) = (replica(&fake, "a"), replica(&fake, "b"));
        // Every value `a.held()` notifies, and when.
        let notified = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        {
            let (mut rx, notified) = (a.held(), notified.clone());
            tokio::spawn(async move {
                while rx.changed().await.is_ok() {
                    let now = rx.borrow_and_update().clone();
                    notified.lock().unwrap().push((tokio::time::Instant::now(), now));
                }
            });
        }
        for r in [&a, &b] {
            let r = r.clone();
            tokio::spawn(async move { r.run().await });
        }
        never_shared(&[&a, &b], S(60)).await;
        assert_eq!(sizes(&held(&[&a, &b])), [6, 6]);
        // b leaves: a takes its 6 (young); c joins at once: a is over its
        // share, but hands over only shards it has held for a lease duration.
        b.shutdown(S(1)).await;
        while a.held().borrow().len() < 12 {
            never_shared(&[&a, &b], Duration::from_millis(10)).await;
        }
        let c = replica(&fake, "c");
        {
            let c = c.clone();
            tokio::spawn(async move { c.run().await });
        }
        never_shared(&[&a, &c], S(60)).await;
        assert_eq!(sizes(&held(&[&a, &c])), [6, 6]);
        let notified = notified.lock().unwrap().clone();
        assert!(notified.len() >= 3, "{notified:?}");
        for (i, pair) in notified.windows(2).enumerate() {
            assert_ne!(
                pair[0].1,
                pair[1].1,
                "notification {} of {} came without a change",
                i + 1,
                notified.len()
            );
        }
        assert_eq!(
            notified.last().map(|n| &n.1),
            Some(&*a.held().borrow()),
            "the last change was notified"
        );
        // Each shard's stay with a, from the notifications: never handed
        // over (a is alive throughout) within a lease duration of its taking.
        let mut since = std::collections::BTreeMap::<u16, tokio::time::Instant>::new();
        let mut before = BTreeSet::new();
        for (at, now) in &notified {
            for s in now.difference(&before) {
                since.insert(*s, *at);
            }
            for s in before.difference(now) {
                let held_for = at.duration_since(since[s]);
                assert!(
                    held_for >= S(4),
                    "shard {s} handed over {held_for:?} after a took it"
                );
            }
            before.clone_from(now);
        }
    });
}

/// The cost that grows at scale: the Lease watch events a replica receives
/// per retry period depend on its share of the shards (`S / L`), not on the
/// number of replicas: each receives the renewals of its own shards (twice:
/// its shard electors' watches and its selection), of its backups and of
/// the next member's shards: at most `4 S / L`, whatever `L` (at two
/// replicas the backups and the next member's shards are the same shards,
/// so less), and nothing of the roster between changes. Watching every
/// Lease of the election would cost `S + L` per replica, and grow with `L`.
#[test]
fn watch_events_per_replica_depend_on_the_share_not_the_replica_count() {
    paused(async {
        let mut per_period = Vec::new();
        for (replicas, shards) in [(2usize, 8u16), (4, 16), (8, 32), (16, 64)] {
            let fake = FakeLeaseApi::default();
            let mut all = Vec::new();
            for i in 0..replicas {
                let (client, id) = fake.client();
                let lease = LeaseConfig::new("default", "ctl", format!("r{i}"))
                    .lease_duration(S(4))
                    .renew_deadline(S(3))
                    .retry_period(S(1));
                let r = ShardedElector::new(client, ShardConfig::new(lease, shards)).unwrap();
                let run = r.clone();
                tokio::spawn(async move { run.run().await });
                all.push((r, id));
            }
            let rs: Vec<&ShardedElector> = all.iter().map(|(r, _)| r).collect();
            never_shared(&rs, S(60)).await;
            let share = usize::from(shards) / replicas;
            assert!(sizes(&held(&rs)).iter().all(|n| *n == share), "{:?}", held(&rs));
            let before: Vec<u64> = all.iter().map(|(_, id)| fake.watch_events(*id)).collect();
            // 60 retry periods.
            never_shared(&rs, S(60)).await;
            let events: Vec<u64> = all
                .iter()
                .zip(&before)
                .map(|((_, id), b)| fake.watch_events(*id) - b)
                .collect();
            let mean = events.iter().sum::<u64>() / replicas as u64;
            let model = 60 * (4 * share as u64 + 1);
            assert!(
                mean <= model,
                "{replicas} x {shards}: {mean} events per replica in 60 retry periods, model {model}: {events:?}"
            );
            assert!(
                events.iter().all(|e| *e >= 60 * share as u64),
                "each receives at least its own renewals: {events:?}"
            );
            per_period.push(mean);
            for (r, _) in &all {
                r.shutdown(S(1)).await;
            }
        }
        // From 8 to 16 replicas (twice the replicas, the same share): the
        // same cost, where watching every Lease would nearly double it.
        let (eight, sixteen) = (per_period[2], per_period[3]);
        assert!(
            sixteen * 10 <= eight * 11,
            "events per replica per retry period grew with the replica count at a fixed share: {per_period:?}"
        );
    });
}

/// The shard Leases `client` sent a request of one object to (a get or a
/// write: a campaign begun, a renewal, a release), since request `from`.
fn shard_leases_touched(fake: &FakeLeaseApi, client: usize, from: usize) -> BTreeSet<String> {
    fake.requests()
        .into_iter()
        .skip(from)
        .filter(|r| r.client == client && matches!(r.verb, "get" | "update" | "create"))
        .filter_map(|r| r.name)
        .filter(|n| n.starts_with("ctl-s12-shard-"))
        .collect()
}

/// A replica restarting into a running group (a new process: a new
/// identity) does nothing before it has listed the roster: it campaigns
/// only for its share of the assignment with the members already there, and
/// never for a shard assigned to another (today's first pass, before the
/// list, assigned it all of them).
#[test]
fn a_restarting_replica_campaigns_only_for_its_share_once_the_roster_is_listed() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, b, c) = (replica(&fake, "a"), replica(&fake, "b"), replica(&fake, "c"));
        for r in [&a, &b, &c] {
            let r = r.clone();
            tokio::spawn(async move { r.run().await });
        }
        never_shared(&[&a, &b, &c], S(60)).await;
        assert_eq!(sizes(&held(&[&a, &b, &c])), [4, 4, 4]);
        // c's process ends; its successor, c2, starts.
        c.shutdown(S(1)).await;
        never_shared(&[&a, &b], S(10)).await;
        let from = fake.requests().len();
        let (client, id) = fake.client();
        let lease = LeaseConfig::new("default", "ctl", "c2")
            .lease_duration(S(4))
            .renew_deadline(S(3))
            .retry_period(S(1));
        let c2 = ShardedElector::new(client, ShardConfig::new(lease, 12)).unwrap();
        {
            let c2 = c2.clone();
            tokio::spawn(async move { c2.run().await });
        }
        never_shared(&[&a, &b, &c2], S(60)).await;
        assert_eq!(
            sizes(&held(&[&a, &b, &c2])),
            [4, 4, 4],
            "{:?}",
            held(&[&a, &b, &c2])
        );
        let ids: BTreeSet<String> = ["a", "b", "c2"].iter().map(|s| (*s).to_owned()).collect();
        let share: BTreeSet<String> = Assignment::new(&ids, 12)
            .of("c2")
            .iter()
            .map(|s| format!("ctl-s12-shard-{s:02}"))
            .collect();
        let touched = shard_leases_touched(&fake, id, from);
        assert_eq!(
            touched,
            share,
            "the restarted replica touched {} shard Leases, its share is {}",
            touched.len(),
            share.len()
        );
    });
}

/// The roster's entries now (the Leases of role `member`).
fn roster_leases(fake: &FakeLeaseApi) -> Vec<k8s_openapi::api::coordination::v1::Lease> {
    fake.leases()
        .into_iter()
        .filter(|l| {
            l.metadata
                .labels
                .as_ref()
                .is_some_and(|m| m.get(super::ROLE_LABEL).map(String::as_str) == Some("member"))
        })
        .collect()
}

/// How many entries the roster has now, free ones included.
fn roster_entries(fake: &FakeLeaseApi) -> usize {
    roster_leases(fake).len()
}

/// Every process has its own identity, so every start adds a roster entry:
/// over 30 starts and stops (a third by shutdown, a third by the balancer
/// dropped, a third by a crash: cut off, then gone), departed members'
/// entries are deleted, and the roster holds at most the live members plus
/// two (an entry is deleted a lease duration after it was left or evicted,
/// and a crashed member is evicted a lease duration after its last
/// renewal), and exactly the live members once that time has passed.
#[test]
fn departed_members_roster_entries_are_deleted_so_the_roster_stays_at_the_live_members() {
    paused(async {
        let fake = FakeLeaseApi::default().with_request_budget(200_000);
        let (a, b) = (replica(&fake, "a"), replica(&fake, "b"));
        for r in [&a, &b] {
            let r = r.clone();
            tokio::spawn(async move { r.run().await });
        }
        never_shared(&[&a, &b], S(30)).await;
        // Samples the roster for `span`: at most `live` + 2 entries.
        let bounded = |live: usize, span: Duration| {
            let fake = fake.clone();
            async move {
                let until = tokio::time::Instant::now() + span;
                while tokio::time::Instant::now() < until {
                    let n = roster_entries(&fake);
                    assert!(n <= live + 2, "{n} roster entries, {live} live members");
                    sleep(Duration::from_millis(100)).await;
                }
            }
        };
        for i in 0..30 {
            let (client, id) = fake.client();
            let lease = LeaseConfig::new("default", "ctl", format!("r{i:02}"))
                .lease_duration(S(4))
                .renew_deadline(S(3))
                .retry_period(S(1));
            let r = ShardedElector::new(client, ShardConfig::new(lease, 12)).unwrap();
            let run = {
                let r = r.clone();
                tokio::spawn(async move { r.run().await })
            };
            bounded(3, S(8)).await;
            match i % 3 {
                0 => r.shutdown(S(1)).await,
                1 => run.abort(),
                _ => {
                    fake.partition(id, true);
                    run.abort();
                }
            }
            bounded(2, S(4)).await;
        }
        // Three lease durations after the last stop: only the live members.
        bounded(2, S(12)).await;
        assert_eq!(roster_entries(&fake), 2, "only a's and b's entries are left");
        assert_eq!(sizes(&held(&[&a, &b])), [6, 6], "{:?}", held(&[&a, &b]));
    });
}

/// A departed member's roster entry whose delete is
/// refused by admission (a validating admission policy: a 403 that is not
/// authorization's) is warned with the API server's message, not as a
/// missing RBAC verb.
#[test]
fn a_roster_delete_refused_by_admission_is_not_logged_as_a_missing_rbac_verb() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default();
            let ((a, a_id), (b, b_id)) = (replica_of(&fake, "a", 12), replica_of(&fake, "b", 12));
            for id in [a_id, b_id] {
                for _ in 0..10 {
                    fake.fault(id, Some("delete"), crate::test_util::Fault::Admission);
                }
            }
            start(&[&a, &b]);
            let (c, _) = replica_of(&fake, "c", 12);
            let run = {
                let c = c.clone();
                tokio::spawn(async move { c.run().await })
            };
            sleep(S(20)).await;
            // A crash: its roster entry stays, for a or b to delete.
            run.abort();
            drop(c);
            sleep(S(30)).await;
        });
    });
    let refused: Vec<_> = logs
        .lines()
        .filter(|l| l.contains("could not delete a departed member's roster entry"))
        .collect();
    assert!(!refused.is_empty(), "{logs}");
    for line in refused {
        assert!(
            !line.contains("RBAC") && line.contains("denied request"),
            "{line}"
        );
    }
}

/// Without `delete` on leases, a departed
/// member's roster entry stays, warned once per outage naming the verb:
/// once while the verb is missing (then at debug level), and again when it
/// is taken away again after a delete succeeded meanwhile (the warning was
/// once per sharded elector).
#[test]
fn a_roster_delete_refused_by_rbac_is_warned_once_per_outage() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default();
            let ((a, a_id), (b, b_id)) = (replica_of(&fake, "a", 12), replica_of(&fake, "b", 12));
            let forbid = || {
                for id in [a_id, b_id] {
                    for _ in 0..10 {
                        fake.fault(id, Some("delete"), crate::test_util::Fault::Status(403));
                    }
                }
            };
            forbid();
            start(&[&a, &b]);
            // Three members join and crash in turn: refused, allowed, refused.
            for (member, allowed) in [("c", false), ("d", true), ("e", false)] {
                if allowed {
                    fake.clear_faults();
                } else {
                    forbid();
                }
                let (m, _) = replica_of(&fake, member, 12);
                let run = {
                    let m = m.clone();
                    tokio::spawn(async move { m.run().await })
                };
                sleep(S(20)).await;
                run.abort();
                drop(m);
                sleep(S(30)).await;
            }
        });
    });
    // Each replica warns once per outage: of c's entry, then of e's.
    let warned: std::collections::BTreeSet<_> = logs
        .lines()
        .filter(|l| l.contains("forbidden (RBAC needs `delete` on leases)"))
        .filter_map(|l| l.split("lease=").nth(1))
        .collect();
    assert_eq!(
        warned.len(),
        2,
        "the entries warned of: {warned:?}, not one per outage; logs:\n{logs}"
    );
}

/// What a gated reconcile that never returns does with its shard's guard:
/// races it (as `controller::gated` does) and holds it meanwhile. Resolves,
/// with why and when, only when the term ends.
fn hung_reconcile(
    r: &ShardedElector,
    shard: u16,
) -> tokio::task::JoinHandle<(crate::Lost, tokio::time::Instant)> {
    let guard = r.guard(shard).expect("the shard is held");
    tokio::spawn(async move {
        let work = std::future::pending::<()>();
        tokio::pin!(work);
        match futures::future::select(work, guard).await {
            futures::future::Either::Right((lost, _)) => (lost, tokio::time::Instant::now()),
            futures::future::Either::Left(((), _)) => unreachable!("the work never returns"),
        }
    })
}

/// A shard the balancer moves while a reconcile of it hangs on its old
/// owner (a request with no timeout) is served by its new owner within the
/// reconcile grace, the lease duration and a retry period of the handover:
/// at the end of the grace the hung work is stopped (its guard resolves,
/// `GivenUp`), the shard is not released (the stopped work's requests may
/// still land) but left to expire, and the new owner takes it then. Before,
/// the live guard kept the old owner renewing it for ever.
#[test]
fn a_moved_shard_is_served_by_its_new_owner_within_the_bound_though_its_reconcile_hangs() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let grace = S(2);
        let sharded = |identity: &str| {
            let (client, _) = fake.client();
            let lease = LeaseConfig::new("default", "ctl", identity)
                .lease_duration(S(4))
                .renew_deadline(S(3))
                .retry_period(S(1));
            ShardedElector::new(client, ShardConfig::new(lease, 12).reconcile_grace(grace)).unwrap()
        };
        let a = sharded("a");
        {
            let a = a.clone();
            tokio::spawn(async move { a.run().await });
        }
        never_shared(&[&a], S(30)).await;
        assert_eq!(a.held().borrow().len(), 12);
        // A reconcile of every shard hangs on a.
        let work: Vec<_> = (0..12).map(|s| hung_reconcile(&a, s)).collect();
        let b = sharded("b");
        let joined = tokio::time::Instant::now();
        {
            let b = b.clone();
            tokio::spawn(async move { b.run().await });
        }
        let ids: BTreeSet<String> = ["a", "b"].iter().map(|s| (*s).to_owned()).collect();
        let two = Assignment::new(&ids, 12);
        // The handover comes once the roster is stable for a retry period
        // (within 2 s of the join); then the grace, the lease duration, and
        // a retry period.
        let bound = S(2) + grace + S(4) + S(1);
        while *b.held().borrow() != two.of("b") {
            assert!(
                joined.elapsed() <= bound,
                "b does not serve its shards within {bound:?} of its join: {:?}",
                held(&[&a, &b])
            );
            never_shared(&[&a, &b], Duration::from_millis(100)).await;
        }
        let served = tokio::time::Instant::now();
        assert_eq!(*a.held().borrow(), two.of("a"));
        for (s, w) in work.into_iter().enumerate() {
            let s = u16::try_from(s).unwrap();
            if two.of("b").contains(&s) {
                let (lost, at) = tokio::time::timeout(S(1), w)
                    .await
                    .expect("the moved shard's work was stopped")
                    .unwrap();
                assert_eq!(lost, crate::Lost::GivenUp, "shard {s}");
                // Not released: taken when its record expired, a lease
                // duration after its last renewal (at most a retry period
                // before the work was stopped).
                assert!(
                    served.duration_since(at) >= S(3),
                    "shard {s} served {:?} after its work was stopped: released?",
                    served.duration_since(at)
                );
            } else {
                assert!(
                    !w.is_finished(),
                    "the work of a shard a keeps goes on (shard {s})"
                );
                w.abort();
            }
        }
        never_shared(&[&a, &b], S(20)).await;
        assert_eq!(sizes(&held(&[&a, &b])), [6, 6]);
    });
}

/// Work on a shard handed over that ends within the reconcile grace is not
/// stopped: the shard is released as it ends, and its new owner serves it
/// within a second (a watch event and a write), not a lease duration later.
#[test]
fn a_moved_shards_work_that_ends_within_the_grace_lets_it_be_released_at_once() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let sharded = |identity: &str| {
            let (client, _) = fake.client();
            let lease = LeaseConfig::new("default", "ctl", identity)
                .lease_duration(S(4))
                .renew_deadline(S(3))
                .retry_period(S(1));
            ShardedElector::new(client, ShardConfig::new(lease, 12).reconcile_grace(S(20))).unwrap()
        };
        let a = sharded("a");
        {
            let a = a.clone();
            tokio::spawn(async move { a.run().await });
        }
        never_shared(&[&a], S(30)).await;
        // A reconcile of every shard runs 5 s on a, racing its guard.
        let work: Vec<_> = (0..12)
            .map(|s| {
                let guard = a.guard(s).expect("held");
                tokio::spawn(async move {
                    let work = sleep(S(5));
                    tokio::pin!(work);
                    matches!(
                        futures::future::select(work, guard).await,
                        futures::future::Either::Left(_)
                    )
                })
            })
            .collect();
        let b = sharded("b");
        let joined = tokio::time::Instant::now();
        {
            let b = b.clone();
            tokio::spawn(async move { b.run().await });
        }
        let ids: BTreeSet<String> = ["a", "b"].iter().map(|s| (*s).to_owned()).collect();
        let two = Assignment::new(&ids, 12);
        while *b.held().borrow() != two.of("b") {
            assert!(
                joined.elapsed() <= S(6),
                "b does not serve its shards within a second of the work's end: {:?}",
                held(&[&a, &b])
            );
            never_shared(&[&a, &b], Duration::from_millis(100)).await;
        }
        for w in work {
            assert!(w.await.unwrap(), "the work finished, not stopped");
        }
    });
}

/// A sharded election whose base config is coordinated is
/// refused before any API call (the API server would pick each shard's
/// holder, against the balancer; and every shard Lease would copy one
/// identity's candidate).
#[cfg(feature = "coordinated")]
#[test]
fn a_coordinated_sharded_election_is_refused_before_any_api_call() {
    crate::tests::support::paused(async {
        let fake = crate::test_util::FakeLeaseApi::default().serve_lease_candidates();
        let (client, _) = fake.client();
        let base = crate::LeaseConfig::new("default", "work", "me")
            .coordinated(crate::coordinated::Coordinated::new("1.37.0"));
        let refused = ShardedElector::new(client, ShardConfig::new(base, 4));
        assert!(
            matches!(
                refused,
                Err(crate::ConfigError::InvalidCoordinated {
                    field: "coordinated",
                    ..
                })
            ),
            "{:?}",
            refused.err()
        );
        assert!(fake.requests().is_empty(), "no API call");
    });
}
/// `shutdown` ends within `ShardConfig::shutdown_budget` on a slow API
/// server (every request answered after 2.4 s, within the renew deadline):
/// the roster left, then every shard's handover, each releasing its Lease.
#[test]
fn a_sharded_shutdown_on_a_slow_api_server_ends_within_its_budget() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (client, id) = fake.client();
        let lease = LeaseConfig::new("default", "ctl", "a")
            .lease_duration(S(4))
            .renew_deadline(S(3))
            .retry_period(S(1));
        let config = ShardConfig::new(lease, 12);
        let budget = config.shutdown_budget(S(1));
        let a = ShardedElector::new(client, config).unwrap();
        {
            let a = a.clone();
            tokio::spawn(async move { a.run().await });
        }
        tokio::time::timeout(S(60), async {
            while a.held().borrow().len() < 12 {
                sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("a holds every shard");
        fake.set_latency(id, Duration::from_millis(2_400));
        sleep(Duration::from_millis(500)).await;
        let started = tokio::time::Instant::now();
        tokio::time::timeout(S(120), a.shutdown(S(1)))
            .await
            .expect("shutdown is bounded");
        let took = started.elapsed();
        assert!(took <= budget, "took {took:?}, more than its budget {budget:?}");
        let held: Vec<_> = fake
            .leases()
            .into_iter()
            .filter(|l| l.metadata.name.as_deref().is_some_and(|n| n.contains("-shard-")))
            .filter_map(|l| l.spec.and_then(|s| s.holder_identity))
            .filter(|h| !h.is_empty())
            .collect();
        assert!(held.is_empty(), "shards still held after {took:?}: {held:?}");
    });
}

/// The off switch (`LeaseConfig::enabled(false)`, a `--leader-elect=false`
/// for a local run or a single-replica install) makes no API call and leads
/// at once, so no Lease RBAC is needed: a sharded election with it off is
/// that one replica, holding every shard, without the roster. (Before, it
/// still joined the roster first, and with no RBAC for Leases, or no API
/// server, it never held a shard: nothing was ever reconciled.)
#[test]
fn a_sharded_election_switched_off_holds_every_shard_without_an_api_call() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (client, id) = fake.client();
        fake.partition(id, true);
        let lease = LeaseConfig::new("default", "ctl", "a").enabled(false);
        let a = ShardedElector::new(client, ShardConfig::new(lease, 12)).unwrap();
        {
            let a = a.clone();
            tokio::spawn(async move { a.run().await });
        }
        sleep(S(10)).await;
        assert_eq!(
            a.held().borrow().len(),
            12,
            "holds {:?} of 12 shards; requests: {:?}",
            a.held().borrow(),
            fake.requests()
        );
        assert!(fake.requests().is_empty(), "API calls: {:?}", fake.requests());
        // Shut down: every shard given up, still without an API call.
        tokio::time::timeout(S(5), a.shutdown(S(1)))
            .await
            .expect("the shutdown is bounded");
        assert!(a.held().borrow().is_empty());
        assert!(a.status().values().all(|s| !s.is_leader));
        assert!(fake.requests().is_empty(), "API calls: {:?}", fake.requests());
    });
}

/// The identities the roster names now (the holders of the Leases of role
/// `member`).
fn roster_members(fake: &FakeLeaseApi) -> BTreeSet<String> {
    roster_leases(fake)
        .iter()
        .filter_map(|l| crate::record::holder(l.spec.as_ref()?).map(str::to_owned))
        .collect()
}

/// Writes the roster entry of `identity`, as its `run` does when it joins,
/// for a member that then never campaigns (it died before, or its entry
/// lingers).
async fn join_and_die(fake: &FakeLeaseApi, identity: &str) {
    let (client, _) = fake.client();
    let lease = LeaseConfig::new("default", "ctl", identity)
        .lease_duration(S(4))
        .renew_deadline(S(3))
        .retry_period(S(1));
    let member = ShardConfig::new(lease, 12).member_lease();
    let api: kube_client::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube_client::Api::namespaced(client, "default");
    super::roster::join(&api, &member).await.unwrap();
}

/// A member that joined the roster and died before campaigning leaves the
/// shards assigned to it free; it is evicted once one of them has been held
/// by nobody for two lease durations, and its shards get owners. Other
/// members joining and leaving every 3 s meanwhile (less than those two
/// lease durations: a rolling restart, a scaling loop; named after it, so
/// that `b`, the member before it, watches over its shards throughout) do
/// not reset that clock for the shards still assigned to it: it is evicted
/// within 2 LD and a few seconds of its death. (Before, every roster change
/// restarted every unowned shard's clock, and the churn kept its shards free
/// for ever.)
#[test]
fn a_dead_members_shards_get_owners_though_the_roster_keeps_changing() {
    paused(async {
        let fake = FakeLeaseApi::default().with_request_budget(200_000);
        let (a, b) = (replica(&fake, "a"), replica(&fake, "b"));
        for r in [&a, &b] {
            let r = r.clone();
            tokio::spawn(async move { r.run().await });
        }
        never_shared(&[&a, &b], S(30)).await;
        join_and_die(&fake, "z").await;
        let died = tokio::time::Instant::now();
        let mut previous: Option<ShardedElector> = None;
        let mut i = 0;
        while roster_members(&fake).contains("z") {
            assert!(
                died.elapsed() < S(20),
                "z (dead since it joined) still on the roster {:?} after its death, \
                 under churn every 3 s; shards held: {:?}",
                died.elapsed(),
                held(&[&a, &b])
            );
            let c = replica(&fake, &format!("zz{i:02}"));
            i += 1;
            {
                let c = c.clone();
                tokio::spawn(async move { c.run().await });
            }
            never_shared(&[&a, &b, &c], S(1)).await;
            if let Some(p) = previous.replace(c.clone()) {
                p.shutdown(S(1)).await;
            }
            never_shared(&[&a, &b, &c], S(2)).await;
        }
        // Evicted: once the churn stops, every shard has an owner.
        if let Some(p) = previous.take() {
            p.shutdown(S(1)).await;
        }
        let stopped = tokio::time::Instant::now();
        while held(&[&a, &b]).iter().flatten().count() < 12 {
            assert!(
                stopped.elapsed() < S(10),
                "not every shard owned 10 s after the churn stopped: {:?}, roster {:?}",
                held(&[&a, &b]),
                roster_members(&fake)
            );
            never_shared(&[&a, &b], Duration::from_millis(100)).await;
        }
    });
}

/// Tests: actions run when a shard's campaign has won (its `acquire`
/// returned) and has not yet taken the state's lock: between two statements
/// with no `.await`, where on a multi-threaded runtime another thread may
/// act (the balancer dropped, a shutdown). As the elector's `test_hooks`.
pub(super) mod hooks {
    use std::sync::{Arc, Weak};

    use parking_lot::Mutex;

    use super::super::{Inner, ShardedElector};

    type Action = Box<dyn FnOnce(u16) + Send>;

    static ACQUIRED: Mutex<Vec<(Weak<Inner>, Action)>> = Mutex::new(Vec::new());

    /// Runs `action` (with the shard) when a campaign of `elector` next wins.
    pub(crate) fn on_acquired(elector: &ShardedElector, action: Action) {
        ACQUIRED.lock().push((Arc::downgrade(&elector.inner), action));
    }

    /// A campaign of `inner` won `shard`: runs what is registered, once,
    /// with no lock held.
    pub(crate) fn acquired(inner: &Inner, shard: u16) {
        let taken = {
            let mut hooks = ACQUIRED.lock();
            hooks.retain(|(i, _)| i.strong_count() > 0);
            let Some(i) = hooks.iter().position(|(i, _)| std::ptr::eq(i.as_ptr(), inner)) else {
                return;
            };
            hooks.remove(i)
        };
        (taken.1)(shard);
    }
}

/// The shard Leases held now, with their holder.
fn shard_holders(fake: &FakeLeaseApi) -> Vec<(String, String)> {
    fake.leases()
        .into_iter()
        .filter(|l| l.metadata.name.as_deref().is_some_and(|n| n.contains("-shard-")))
        .filter_map(|l| {
            let holder = crate::record::holder(l.spec.as_ref()?)?.to_owned();
            Some((l.metadata.name?, holder))
        })
        .collect()
}

/// A balancer dropped (its controller's stream dropped) just as one of its
/// campaigns won a shard, after `give_up_all` but before the campaign's task
/// stored its guard (on a multi-threaded runtime the task runs on another
/// thread past its last `.await`, so the abort does not stop it): the guard
/// is not kept, and every shard is released, none renewed with no work.
/// (Before, the task stored the guard after the balancer had given every
/// shard up, and nothing dropped it: the replica renewed that shard for
/// ever, and no other replica could take it.)
#[test]
fn a_shard_won_as_the_balancer_is_dropped_is_given_up_too() {
    use std::{sync::Arc, task::Poll};

    use futures::{FutureExt, future::BoxFuture};
    use parking_lot::Mutex;

    paused(async {
        let fake = FakeLeaseApi::default();
        let a = replica(&fake, "a");
        // The balancer, polled by a task, and dropped from inside the hook:
        // exactly where another thread could drop it.
        let balancer: Arc<Mutex<Option<BoxFuture<'static, ()>>>> = Arc::new(Mutex::new(Some({
            let a = a.clone();
            async move { a.run().await }.boxed()
        })));
        let won = Arc::new(Mutex::new(None));
        hooks::on_acquired(&a, {
            let (balancer, won) = (balancer.clone(), won.clone());
            Box::new(move |s| {
                *won.lock() = Some(s);
                let dropped = balancer.lock().take();
                drop(dropped);
            })
        });
        tokio::spawn({
            let balancer = balancer.clone();
            futures::future::poll_fn(move |cx| match balancer.lock().as_mut() {
                Some(run) => run.as_mut().poll(cx),
                None => Poll::Ready(()),
            })
        });
        tokio::time::timeout(S(30), async {
            while won.lock().is_none() {
                sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("a campaign won a shard within 30 s");
        let s = won.lock().expect("set");
        let dropped = tokio::time::Instant::now();
        loop {
            let holders = shard_holders(&fake);
            let mine = a.held().borrow().clone();
            if holders.is_empty() && mine.is_empty() {
                break;
            }
            assert!(
                dropped.elapsed() < S(2),
                "{:?} after the balancer was dropped as it won shard {s}: Leases still held {holders:?}, \
                 held() {mine:?}",
                dropped.elapsed()
            );
            sleep(Duration::from_millis(100)).await;
        }
        // And none is taken again: nothing of the balancer runs.
        sleep(S(10)).await;
        assert!(shard_holders(&fake).is_empty(), "{:?}", shard_holders(&fake));
        assert!(a.status().values().all(|st| !st.is_leader), "a leads a shard");
    });
}

/// A replica evicted by a peer joins the roster again in the background; if
/// it leaves (shutdown, or its balancer dropped) while that write is in
/// flight, it leaves after the write, not before it: no entry of a replica
/// that no longer takes part is left on the roster, so its shards stay with
/// the others, none handed over to it and left free until it is evicted
/// again two lease durations later. (Before, `leave` read the entry while
/// the join was in flight, found it not its own and left it; the join then
/// wrote it: a member that never campaigns.)
#[test]
fn a_replica_that_leaves_while_joining_again_is_not_left_on_the_roster() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, b) = (replica(&fake, "a"), replica(&fake, "b"));
        let (client, id) = fake.client();
        let lease = LeaseConfig::new("default", "ctl", "c")
            .lease_duration(S(4))
            .renew_deadline(S(3))
            .retry_period(S(1));
        let config = ShardConfig::new(lease, 12);
        let entry = config.member_lease().name;
        let c = ShardedElector::new(client, config).unwrap();
        for r in [&a, &b, &c] {
            let r = r.clone();
            tokio::spawn(async move { r.run().await });
        }
        never_shared(&[&a, &b, &c], S(30)).await;
        assert_eq!(sizes(&held(&[&a, &b, &c])), [4, 4, 4]);
        // c's requests take a second each; a peer evicts it.
        fake.set_latency(id, S(1));
        let (peer, _) = fake.client();
        let api: kube_client::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube_client::Api::namespaced(peer, "default");
        let seen = fake.lease_in("default", &entry).expect("c's entry");
        super::roster::clear(&api, &seen).await.unwrap();
        // c sees it and joins again (a read, then a write: 2 s); it shuts
        // down meanwhile.
        never_shared(&[&a, &b, &c], Duration::from_millis(300)).await;
        c.shutdown(S(1)).await;
        let stopped = tokio::time::Instant::now();
        while stopped.elapsed() < S(30) {
            let roster = roster_members(&fake);
            assert!(
                !roster.contains("c"),
                "c on the roster {:?} after its shutdown returned: {roster:?}; shards held {:?}",
                stopped.elapsed(),
                held(&[&a, &b])
            );
            if stopped.elapsed() >= S(3) {
                let h = held(&[&a, &b]);
                assert_eq!(
                    h.iter().flatten().count(),
                    12,
                    "{:?} after c's shutdown: {h:?}, roster {roster:?}",
                    stopped.elapsed()
                );
            }
            never_shared(&[&a, &b], Duration::from_millis(100)).await;
        }
    });
}

/// A member that dies is judged by the members watching over its shards,
/// on the observed-change clock of their shard watch. A re-list of that
/// watch served by a watch cache one change behind (kube-runtime's watcher
/// lists with `resourceVersion=0`: after a 410, or at every reselection)
/// shows the dead member's previous record, then the watch delivers its
/// last record again (A-B-A): that is no change since the record was last
/// seen, and must not restart its clock, or the dead member's shards stay
/// without an owner up to a lease duration longer (the elector's own rule,
/// `Observed::update`, regressions section 23). Here `a` owns the one shard
/// and `b` watches over it; `a` is cut off just after a renewal, and `b`'s
/// shard watch re-lists stale 3 s later: `b` must hold the shard within a
/// lease duration and a retry period of `a`'s last renewal.
#[test]
fn a_stale_re_list_of_the_shard_watch_does_not_restart_a_dead_owners_clock() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let with = |identity: &str| {
            let (client, id) = fake.client();
            let lease = LeaseConfig::new("default", "ctl", identity)
                .lease_duration(S(4))
                .renew_deadline(S(3))
                .retry_period(S(1));
            (
                ShardedElector::new(client, ShardConfig::new(lease, 1)).unwrap(),
                id,
            )
        };
        let ((a, ida), (b, idb)) = (with("a"), with("b"));
        // `b` joins last: the roster's last change is its own entry (a stale
        // list of the roster only hides `b` from itself, which it counts anyway).
        for r in [&a, &b] {
            let r = r.clone();
            tokio::spawn(async move { r.run().await });
            sleep(S(1)).await;
        }
        never_shared(&[&a, &b], S(20)).await;
        assert_eq!(held(&[&a, &b]), [BTreeSet::from([0]), BTreeSet::new()]);
        // Cut `a` off just after one of its renewals lands.
        let renewals = |fake: &FakeLeaseApi| {
            fake.requests()
                .into_iter()
                .filter(|r| r.client == ida && r.verb == "update")
                .count()
        };
        let before = renewals(&fake);
        while renewals(&fake) == before {
            sleep(Duration::from_millis(10)).await;
        }
        fake.partition(ida, true);
        let last_renewal = tokio::time::Instant::now();
        never_shared(&[&a, &b], S(1)).await;
        // `b`'s lists from now on are served one change behind; its watches
        // end with a 410 and re-list.
        for _ in 0..4 {
            fake.fault(idb, Some("list"), crate::test_util::Fault::StaleList);
        }
        fake.expire_watches();
        let bound = S(4) + S(1);
        while !b.held().borrow().contains(&0) {
            assert!(
                last_renewal.elapsed() <= bound,
                "b does not hold the dead a's shard {:?} after a's last renewal (bound {bound:?}: a lease \
                 duration and a retry period); roster {:?}",
                last_renewal.elapsed(),
                roster_members(&fake)
            );
            never_shared(&[&a, &b], Duration::from_millis(100)).await;
        }
    });
}

/// A replica shut down while its first join is in flight (a slow API
/// server; a pod terminated just after it started), whose process then
/// ends (its balancer dropped right after `shutdown` returned), leaves no
/// entry on the roster: `leave` waits for that write before it reads the
/// entry, as it does for a join again after an eviction (section 20).
/// Otherwise the others count, and hand shards over to, a member that no
/// longer exists: those shards stay without an owner until it is evicted,
/// two lease durations after their release.
#[test]
fn a_replica_shut_down_during_its_first_join_is_not_left_on_the_roster() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, b) = (replica(&fake, "a"), replica(&fake, "b"));
        for r in [&a, &b] {
            let r = r.clone();
            tokio::spawn(async move { r.run().await });
        }
        never_shared(&[&a, &b], S(30)).await;
        let (client, id) = fake.client();
        let lease = LeaseConfig::new("default", "ctl", "c")
            .lease_duration(S(4))
            .renew_deadline(S(3))
            .retry_period(S(1));
        let c = ShardedElector::new(client, ShardConfig::new(lease, 12)).unwrap();
        // Its entry's create arrives 2 s after it is sent.
        fake.fault(id, Some("create"), crate::test_util::Fault::DelayRequest(S(2)));
        let run = {
            let c = c.clone();
            tokio::spawn(async move { c.run().await })
        };
        sleep(S(1)).await;
        c.shutdown(S(1)).await;
        // The process ends: its balancer goes with it.
        run.abort();
        let stopped = tokio::time::Instant::now();
        while stopped.elapsed() < S(20) {
            let roster = roster_members(&fake);
            assert!(
                !roster.contains("c"),
                "c on the roster {:?} after its shutdown returned: {roster:?}; shards held {:?}",
                stopped.elapsed(),
                held(&[&a, &b])
            );
            never_shared(&[&a, &b], Duration::from_millis(100)).await;
        }
        assert_eq!(held(&[&a, &b]).iter().flatten().count(), 12);
    });
}

/// A replica whose balancer is dropped (its controller's stream dropped)
/// while work it runs under `ShardedElector::guard` goes on (work that ends
/// only when its shard is lost, as the guard's docs suggest): the replica
/// no longer takes part, so that work is stopped at the end of the
/// reconcile grace, as for a shard handed over, and the others take the
/// shard when its Lease expires. Before, the live guard kept the shard
/// renewed for as long as the work ran, by a replica off the roster.
#[test]
fn work_under_a_shard_guard_does_not_keep_the_shard_once_the_balancer_is_dropped() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, b) = (replica(&fake, "a"), replica(&fake, "b"));
        let run_a = {
            let a = a.clone();
            tokio::spawn(async move { a.run().await })
        };
        {
            let b = b.clone();
            tokio::spawn(async move { b.run().await });
        }
        never_shared(&[&a, &b], S(60)).await;
        let s = *a.held().borrow().first().expect("a holds a shard");
        let work = hung_reconcile(&a, s);
        let stopped = tokio::time::Instant::now();
        run_a.abort();
        // The grace (the renew deadline, 3 s), the lease duration, a retry period.
        let bound = S(3) + S(4) + S(1);
        while held(&[&b])[0].len() < 12 {
            assert!(
                stopped.elapsed() <= bound,
                "{:?} after a's balancer was dropped, b holds {:?}: shard {s} still held by a ({:?}), its work \
                 running: {}",
                stopped.elapsed(),
                held(&[&b])[0],
                a.status().get(&s).map(|st| st.is_leader),
                !work.is_finished()
            );
            never_shared(&[&a, &b], Duration::from_millis(100)).await;
        }
        assert!(work.is_finished(), "the work was stopped");
    });
}

/// A replica of an election of `shards` shards, with `replica`'s timings
/// (lease duration 4 s, renew deadline 3 s, retry period 1 s).
fn replica_of(fake: &FakeLeaseApi, identity: &str, shards: u16) -> (ShardedElector, usize) {
    let (client, id) = fake.client();
    let lease = LeaseConfig::new("default", "ctl", identity)
        .lease_duration(S(4))
        .renew_deadline(S(3))
        .retry_period(S(1));
    (
        ShardedElector::new(client, ShardConfig::new(lease, shards)).unwrap(),
        id,
    )
}

fn start(replicas: &[&ShardedElector]) {
    for r in replicas {
        let r = (*r).clone();
        tokio::spawn(async move { r.run().await });
    }
}

/// The shards `r` owns now: held, with a term still valid (as `owns_uid`
/// tells).
fn owned(r: &ShardedElector) -> BTreeSet<u16> {
    r.owned_now()
}

/// 1,000 object UIDs.
fn uids() -> Vec<String> {
    (0..1000)
        .map(|i| format!("4a1b2c3d-0000-4000-8000-{i:012}"))
        .collect()
}

/// Whether one of `replicas` owns the object `uid` now.
fn owned_by(replicas: &[(&ShardedElector, BTreeSet<u16>)], uid: &str) -> bool {
    replicas
        .iter()
        .any(|(r, shards)| shards.contains(&r.shard_of(uid)))
}

/// The objects of `uids` owned now by a replica of `old` and one of `new` at
/// once (two shard counts), and those owned by none.
fn two_and_none<'u>(
    uids: &'u [String],
    old: &[&ShardedElector],
    new: &[&ShardedElector],
) -> (Vec<&'u str>, Vec<&'u str>) {
    let (old, new): (Vec<_>, Vec<_>) = (
        old.iter().map(|r| (*r, owned(r))).collect(),
        new.iter().map(|r| (*r, owned(r))).collect(),
    );
    let mut two = Vec::new();
    let mut none = Vec::new();
    for uid in uids {
        match (owned_by(&old, uid), owned_by(&new, uid)) {
            (true, true) => two.push(uid.as_str()),
            (false, false) => none.push(uid.as_str()),
            _ => {}
        }
    }
    (two, none)
}

/// Samples for `span` (every 100 ms) that no object is owned by a replica
/// of each count at once, and no shard by two replicas of one count.
async fn never_two_counts(old: &[&ShardedElector], new: &[&ShardedElector], span: Duration) {
    let uids = uids();
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        let (two, _) = two_and_none(&uids, old, new);
        assert!(
            two.is_empty(),
            "{} of 1000 objects owned by a replica of each shard count at once (old: {:?}, new: {:?}), e.g. {:?}",
            two.len(),
            old.iter().map(|r| owned(r)).collect::<Vec<_>>(),
            new.iter().map(|r| owned(r)).collect::<Vec<_>>(),
            two.first()
        );
        for rs in [old, new] {
            let each: Vec<BTreeSet<u16>> = rs.iter().map(|r| owned(r)).collect();
            let total: usize = each.iter().map(BTreeSet::len).sum();
            let union: BTreeSet<u16> = each.iter().flatten().copied().collect();
            assert_eq!(total, union.len(), "a shard held twice: {each:?}");
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// A rolling update that changes the shard count (12 → 15: the natural way
/// to change a Deployment's setting) runs replicas of both counts side by
/// side on one roster. Each object must still have one owner at most, and
/// each count's shards an owner: no object is reconciled by a replica of
/// each count at once, and no replica is handed shards it never takes.
/// (Started at once, with nothing held: the higher count keeps the shards.)
#[test]
fn replicas_of_two_shard_counts_never_both_own_an_object() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let ((old, _), (new, _)) = (replica_of(&fake, "a", 12), replica_of(&fake, "b", 15));
        start(&[&old, &new]);
        sleep(S(60)).await;
        let uids = uids();
        let (both, none) = two_and_none(&uids, &[&old], &[&new]);
        assert!(
            both.is_empty(),
            "{} of 1000 objects owned by a replica of each shard count at once (a holds {:?} of 12, \
             b {:?} of 15), e.g. {:?}",
            both.len(),
            old.held().borrow(),
            new.held().borrow(),
            both.first()
        );
        assert!(
            none.is_empty(),
            "{} of 1000 objects owned by nobody (a holds {:?} of 12, b {:?} of 15), e.g. {:?}",
            none.len(),
            old.held().borrow(),
            new.held().borrow(),
            none.first()
        );
    });
}

/// A rolling update of the shard count: three replicas of 12 shards run,
/// three of 15 start (they join the roster and wait, holding nothing, while
/// the old count's shards are held), then the old ones shut down one by
/// one (the old count's shards move among the old replicas left). At no
/// instant is an object owned by a replica of each count, every object has
/// an owner throughout, and once the last old replica is gone the new count
/// owns each of its shards within a lease duration and a retry period of
/// the last release (released Leases of the other count are waited for one
/// lease duration: an old replica taking a shard an old peer released
/// makes it held again well within it).
#[test]
fn a_rolling_update_of_the_shard_count_never_has_two_owners_or_none() {
    paused(async {
        let fake = FakeLeaseApi::default().with_request_budget(200_000);
        let old: Vec<ShardedElector> = ["a", "b", "c"]
            .iter()
            .map(|i| replica_of(&fake, i, 12).0)
            .collect();
        let old: Vec<&ShardedElector> = old.iter().collect();
        start(&old);
        never_shared(&old, S(30)).await;
        assert_eq!(sizes(&held(&old)), [4, 4, 4]);
        let new: Vec<ShardedElector> = ["d", "e", "f"]
            .iter()
            .map(|i| replica_of(&fake, i, 15).0)
            .collect();
        let new: Vec<&ShardedElector> = new.iter().collect();
        start(&new);
        let uids = uids();
        never_two_counts(&old, &new, S(20)).await;
        // The old count still owns everything: the new count waits.
        assert_eq!(sizes(&held(&old)), [4, 4, 4], "{:?}", held(&old));
        assert!(held(&new).iter().all(BTreeSet::is_empty), "{:?}", held(&new));
        for (i, r) in old.iter().enumerate() {
            let released = tokio::time::Instant::now();
            r.shutdown(S(1)).await;
            if i + 1 < old.len() {
                never_two_counts(&old, &new, S(10)).await;
                let (_, none) = two_and_none(&uids, &old, &new);
                assert!(
                    none.is_empty(),
                    "{} objects owned by nobody after {i} shutdowns",
                    none.len()
                );
                continue;
            }
            // The last old replica is gone: the new count owns each of its
            // shards within a lease duration and a retry period.
            while held(&new).iter().flatten().count() < 15 {
                assert!(
                    released.elapsed() <= S(5),
                    "the new count owns {:?} of 15 {:?} after the last old replica's release",
                    held(&new),
                    released.elapsed()
                );
                never_two_counts(&old, &new, Duration::from_millis(100)).await;
            }
        }
        never_two_counts(&old, &new, S(30)).await;
        assert_eq!(sizes(&held(&new)), [5, 5, 5], "{:?}", held(&new));
        let (_, none) = two_and_none(&uids, &old, &new);
        assert!(none.is_empty());
    });
}

/// A replica of the old count that crashes (cut off: its shard Leases stay
/// held, no longer renewed) during a rolling update of the shard count: the
/// new count campaigns a lease duration after the crashed replica's last
/// renewal, not before, and owns every shard a lease duration later (the
/// creation hold of its Leases, created then: a count that never ran), so
/// within `2 LD + RP` of the crash; no object has an owner of each count
/// at once.
#[test]
fn the_new_shard_count_takes_over_from_a_crashed_old_replica_within_its_lease_duration() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, id) = replica_of(&fake, "a", 12);
        start(&[&a]);
        never_shared(&[&a], S(20)).await;
        assert_eq!(held(&[&a])[0].len(), 12);
        let ((b, _), (c, _)) = (replica_of(&fake, "b", 15), replica_of(&fake, "c", 15));
        start(&[&b, &c]);
        never_two_counts(&[&a], &[&b, &c], S(20)).await;
        assert!(
            held(&[&b, &c]).iter().all(BTreeSet::is_empty),
            "{:?}",
            held(&[&b, &c])
        );
        let cut = tokio::time::Instant::now();
        fake.partition(id, true);
        let mut campaigned: Option<Duration> = None;
        while held(&[&b, &c]).iter().flatten().count() < 15 {
            let created = fake.leases().iter().any(|l| {
                l.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.contains("-s15-shard-"))
            });
            if created && campaigned.is_none() {
                campaigned = Some(cut.elapsed());
            }
            assert!(
                cut.elapsed() <= S(9),
                "the new count owns {:?} of 15 {:?} after the old replica's crash",
                held(&[&b, &c]),
                cut.elapsed()
            );
            never_two_counts(&[&a], &[&b, &c], Duration::from_millis(100)).await;
        }
        // Its last renewal was at most a retry period before the cut.
        assert!(
            campaigned.is_some_and(|at| at >= S(3)),
            "the new count campaigned {campaigned:?} after the crash, before a lease duration after \
             the crashed replica's last renewal"
        );
        never_two_counts(&[&a], &[&b, &c], S(30)).await;
        let mut now = sizes(&held(&[&b, &c]));
        now.sort_unstable();
        assert_eq!(now, [7, 8]);
    });
}

/// Both counts started at once, with nothing held (a misconfiguration, not a
/// rolling update): both may take shards; a replica holding shards that sees
/// a held Lease of a higher count gives its shards up, so the higher count
/// owns everything, and objects have an owner of each count only briefly
/// (a watch event, and the reconcile grace at most: here no work runs, so a
/// write).
#[test]
fn two_shard_counts_started_at_once_leave_the_shards_to_the_higher_count() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let ((a, _), (b, _)) = (replica_of(&fake, "a", 12), replica_of(&fake, "b", 12));
        let ((c, _), (d, _)) = (replica_of(&fake, "c", 15), replica_of(&fake, "d", 15));
        let t0 = tokio::time::Instant::now();
        start(&[&a, &b, &c, &d]);
        let uids = uids();
        let (mut first_two, mut last_two): (Option<Duration>, Option<Duration>) = (None, None);
        while t0.elapsed() < S(40) {
            let (two, _) = two_and_none(&uids, &[&a, &b], &[&c, &d]);
            if !two.is_empty() {
                first_two = first_two.or(Some(t0.elapsed()));
                last_two = Some(t0.elapsed());
            }
            never_shared(&[&a, &b], Duration::ZERO).await;
            never_shared(&[&c, &d], Duration::from_millis(100)).await;
        }
        // (Nobody leads before the creation hold's end, a lease duration
        // after the Leases were created; then the overlap lasts a watch event
        // and a write.)
        if let (Some(first), Some(last)) = (first_two, last_two) {
            assert!(
                last.saturating_sub(first) < S(1),
                "objects owned by a replica of each count from {first:?} to {last:?} after both started"
            );
        }
        assert!(
            held(&[&a, &b]).iter().all(BTreeSet::is_empty),
            "{:?}",
            held(&[&a, &b])
        );
        let mut now = sizes(&held(&[&c, &d]));
        now.sort_unstable();
        assert_eq!(now, [7, 8], "{:?}", held(&[&c, &d]));
        never_two_counts(&[&a, &b], &[&c, &d], S(20)).await;
    });
}

/// A roster entry carries its replica's shard count, and an identity that
/// joins again with another count (a `StatefulSet`'s pod restarted by a
/// rolling update of the count, its previous process's entry still naming
/// it) has its entry relabelled, so that the others count it with its new
/// count.
#[test]
fn a_roster_entry_carries_its_replicas_shard_count() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (client, _) = fake.client();
        let api: kube_client::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube_client::Api::namespaced(client, "default");
        let count = |fake: &FakeLeaseApi| -> Vec<Option<String>> {
            roster_leases(fake)
                .iter()
                .map(|l| l.metadata.labels.as_ref()?.get(super::SHARDS_LABEL).cloned())
                .collect()
        };
        for shards in [12, 15] {
            let lease = LeaseConfig::new("default", "ctl", "ctl-0");
            let member = ShardConfig::new(lease, shards).member_lease();
            super::roster::join(&api, &member).await.unwrap();
            assert_eq!(
                count(&fake),
                [Some(shards.to_string())],
                "after a join with {shards} shards"
            );
        }
        assert_eq!(roster_members(&fake), BTreeSet::from(["ctl-0".to_owned()]));
    });
}

/// Replicas `a` to `d` of a 12-shard election on `fake` (started with
/// [`start`]; once settled they hold 3 shards each).
fn four_of_twelve(fake: &FakeLeaseApi) -> Vec<(ShardedElector, usize)> {
    ["a", "b", "c", "d"]
        .iter()
        .map(|id| replica_of(fake, id, 12))
        .collect()
}

/// The `shard` label removed from every shard Lease while they are held
/// (`kubectl label leases -l leases.kube-runtime-lease/role=shard
/// leases.kube-runtime-lease/shard-`), then a replica dies (cut off for
/// good). Its peers select the shards they watch over by that label
/// (`shard in (...)`, four replicas of twelve shards: not all of them), so
/// they no longer see its Leases; they must still evict it and take its
/// shards within a bound (the crash bound with an eviction is about
/// 2 LD + RP; 30 s here is generous).
/// Before: the holders' renewals kept the labels as edited, the peers saw
/// the dead member's shards as absent, and each eviction's confirming read
/// found its Lease held with a resourceVersion the watch never saw
/// ("moved"): nobody was ever evicted, its shards had no owner for good.
#[test]
fn a_dead_members_shards_whose_labels_were_removed_get_owners() {
    paused(async {
        let fake = FakeLeaseApi::default().with_request_budget(200_000);
        let rs = four_of_twelve(&fake);
        let all: Vec<&ShardedElector> = rs.iter().map(|(r, _)| r).collect();
        start(&all);
        never_shared(&all, S(30)).await;
        assert_eq!(sizes(&held(&all)), [3, 3, 3, 3]);
        for lease in fake.leases() {
            let shard = lease
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(super::SHARD_LABEL));
            if shard.is_some() {
                let mut lease = lease.clone();
                lease.metadata.labels.as_mut().unwrap().remove(super::SHARD_LABEL);
                fake.put(lease);
            }
        }
        // The holders renew on (their renewals keep the labels as edited);
        // then `a` dies.
        never_shared(&all, S(5)).await;
        let lost = a_shards(&all);
        fake.partition(rs[0].1, true);
        let died = tokio::time::Instant::now();
        let rest = &all[1..];
        while !lost.iter().all(|s| rest.iter().any(|r| owned(r).contains(s))) {
            assert!(
                died.elapsed() < S(30),
                "a's shards {lost:?} have no owner {:?} after its death (their `shard` label removed); \
                 held {:?}, roster {:?}",
                died.elapsed(),
                held(rest),
                roster_members(&fake)
            );
            never_shared(rest, Duration::from_millis(100)).await;
        }
    });
}

fn a_shards(all: &[&ShardedElector]) -> BTreeSet<u16> {
    all[0].held().borrow().clone()
}

/// A shard Lease whose `shards` label someone removed while it is held (or
/// wrote with a typo): it then matches the other counts' selector
/// (`shards!=12` selects Leases without the label), reads as count 0, and
/// every replica holding nothing waits for it "to be released or to expire",
/// which it never is while its holder renews it. A replica that joins must
/// still get its share (4 of 12 among three) within a bound (30 s).
/// Before: `c` held nothing for good; the shards the others handed over to
/// it had no owner until `c` was evicted, then again each time it rejoined.
#[test]
fn a_shard_lease_without_its_count_label_does_not_keep_a_joiner_out() {
    paused(async {
        let fake = FakeLeaseApi::default().with_request_budget(200_000);
        let (a, _) = replica_of(&fake, "a", 12);
        let (b, _) = replica_of(&fake, "b", 12);
        start(&[&a, &b]);
        never_shared(&[&a, &b], S(20)).await;
        assert_eq!(sizes(&held(&[&a, &b])), [6, 6]);
        let shard = *a.held().borrow().first().unwrap();
        let name = format!("ctl-s12-shard-{shard:02}");
        let mut lease = fake.lease_in("default", &name).unwrap();
        lease
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(super::SHARDS_LABEL);
        fake.put(lease);
        never_shared(&[&a, &b], S(3)).await;
        let (c, _) = replica_of(&fake, "c", 12);
        start(&[&c]);
        let joined = tokio::time::Instant::now();
        while sizes(&held(&[&a, &b, &c])) != [4, 4, 4] {
            assert!(
                joined.elapsed() < S(30),
                "not balanced {:?} after c joined (one shard Lease without its `shards` label): {:?}",
                joined.elapsed(),
                held(&[&a, &b, &c])
            );
            never_shared(&[&a, &b, &c], Duration::from_millis(100)).await;
        }
    });
}

/// As above, but the replica dies right after the labels were removed,
/// before its next renewal could write them back: its peers' watches never
/// see its shard Leases again. They must judge them by reading them (a
/// record read unchanged for its lease duration), evict it and take its
/// shards within a bound (30 s here, about 6 LD).
/// Before: the confirming read found each Lease held with a resourceVersion
/// the watch never saw ("moved"): nobody was ever evicted.
#[test]
fn a_member_dying_as_its_shard_labels_are_removed_is_still_evicted() {
    paused(async {
        let fake = FakeLeaseApi::default().with_request_budget(200_000);
        let rs = four_of_twelve(&fake);
        let all: Vec<&ShardedElector> = rs.iter().map(|(r, _)| r).collect();
        start(&all);
        never_shared(&all, S(30)).await;
        assert_eq!(sizes(&held(&all)), [3, 3, 3, 3]);
        let lost = a_shards(&all);
        fake.partition(rs[0].1, true);
        for lease in fake.leases() {
            let shard = lease
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(super::SHARD_LABEL));
            if shard.is_some() {
                let mut lease = lease.clone();
                lease.metadata.labels.as_mut().unwrap().remove(super::SHARD_LABEL);
                fake.put(lease);
            }
        }
        let died = tokio::time::Instant::now();
        let rest = &all[1..];
        while !lost.iter().all(|s| rest.iter().any(|r| owned(r).contains(s))) {
            assert!(
                died.elapsed() < S(30),
                "a's shards {lost:?} have no owner {:?} after its death (their `shard` label removed \
                 as it died); held {:?}, roster {:?}",
                died.elapsed(),
                held(rest),
                roster_members(&fake)
            );
            never_shared(rest, Duration::from_millis(100)).await;
        }
    });
}

/// The `shards` label of one held shard Lease edited to another count
/// (`kubectl label --overwrite lease ... leases.kube-runtime-lease/shards=13`,
/// a typo, or a tool): no replica of a count 13 runs (the roster has none).
/// The election must not drop its shards for it: 10 s after the edit, no
/// shard Lease has changed hands (each term goes on: the same
/// `leaseTransitions`), and every shard is owned.
/// Before: every replica read it as a fresh Lease of a higher count ("both
/// counts started at once"), gave every shard up (each held shard's work
/// stopped at the reconcile grace) and took them again.
#[test]
fn a_shard_lease_labelled_with_another_count_does_not_drop_every_shard() {
    paused(async {
        let fake = FakeLeaseApi::default().with_request_budget(200_000);
        let (a, _) = replica_of(&fake, "a", 12);
        let (b, _) = replica_of(&fake, "b", 12);
        start(&[&a, &b]);
        never_shared(&[&a, &b], S(20)).await;
        assert_eq!(sizes(&held(&[&a, &b])), [6, 6]);
        let transitions = || {
            fake.leases()
                .into_iter()
                .filter(|l| l.metadata.name.as_deref().is_some_and(|n| n.contains("-shard-")))
                .map(|l| {
                    let spec = l.spec.unwrap_or_default();
                    (
                        l.metadata.name.unwrap_or_default(),
                        spec.holder_identity,
                        spec.lease_transitions,
                    )
                })
                .collect::<Vec<_>>()
        };
        let before = transitions();
        let shard = *a.held().borrow().first().unwrap();
        let name = format!("ctl-s12-shard-{shard:02}");
        let mut lease = fake.lease_in("default", &name).unwrap();
        lease
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(super::SHARDS_LABEL.to_owned(), "13".to_owned());
        fake.put(lease);
        never_shared(&[&a, &b], S(10)).await;
        assert_eq!(sizes(&held(&[&a, &b])), [6, 6]);
        let after = transitions();
        assert_eq!(
            before, after,
            "shard Leases changed hands after one shard Lease's `shards` label was edited to 13"
        );
    });
}

/// Members joining and leaving (shut down, aborted, cut off) leave nothing
/// running in the replicas that stay: once the departed are gone for a few
/// lease durations, the runtime's tasks are back at their number before the
/// churn, and so is the rate of requests of the members that stayed.
#[test]
fn members_joining_and_leaving_leave_no_tasks_or_requests_behind() {
    paused(async {
        let fake = FakeLeaseApi::default().with_request_budget(400_000);
        let (a, b) = (replica(&fake, "a"), replica(&fake, "b"));
        for r in [&a, &b] {
            let r = r.clone();
            tokio::spawn(async move { r.run().await });
        }
        never_shared(&[&a, &b], S(30)).await;
        let metrics = tokio::runtime::Handle::current().metrics();
        let rate = |fake: &FakeLeaseApi| {
            let (fake, a, b) = (fake.clone(), a.clone(), b.clone());
            async move {
                let before = fake.requests().len();
                never_shared(&[&a, &b], S(60)).await;
                fake.requests().len() - before
            }
        };
        let baseline = (metrics.num_alive_tasks(), rate(&fake).await);
        for i in 0..12 {
            let (client, id) = fake.client();
            let lease = LeaseConfig::new("default", "ctl", format!("r{i:02}"))
                .lease_duration(S(4))
                .renew_deadline(S(3))
                .retry_period(S(1));
            let r = ShardedElector::new(client, ShardConfig::new(lease, 12)).unwrap();
            let run = {
                let r = r.clone();
                tokio::spawn(async move { r.run().await })
            };
            sleep(S(8)).await;
            match i % 3 {
                0 => r.shutdown(S(1)).await,
                1 => run.abort(),
                _ => {
                    fake.partition(id, true);
                    run.abort();
                }
            }
            sleep(S(4)).await;
        }
        // Three lease durations after the last departure, and more.
        sleep(S(30)).await;
        let after = (metrics.num_alive_tasks(), rate(&fake).await);
        assert!(
            after.0 <= baseline.0 && after.1 <= baseline.1 + baseline.1 / 10,
            "(tasks, requests a minute) before the churn {baseline:?}, after it {after:?}"
        );
    });
}

/// A replica of a new shard count (a rolling update from 15 shards down to
/// 12) whose watch of the other counts' shard Leases stalls (open, silent:
/// a dead connection behind a proxy) while it waits for the old count: the
/// old count's records, renewed every retry period, look unchanged to it,
/// and after their lease duration expired. It must not take its shards
/// while the old count still holds and renews its own (never two: an
/// object owned by a replica of each count). (From 12 up to 15 the same
/// stall makes the new count start early and push the old count out, as if
/// both had started at once.)
#[test]
fn a_new_count_whose_watch_of_the_old_count_stalls_does_not_take_its_shards() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = replica_of(&fake, "a", 15);
        start(&[&a]);
        never_shared(&[&a], S(20)).await;
        assert_eq!(held(&[&a])[0].len(), 15);
        let (b, b_id) = replica_of(&fake, "b", 12);
        start(&[&b]);
        never_two_counts(&[&a], &[&b], S(10)).await;
        assert!(held(&[&b])[0].is_empty(), "{:?}", held(&[&b]));
        // Every watch b has open now stalls (its roster, shard and
        // other-count watches); those it opens later work.
        fake.stall_watches(b_id);
        never_two_counts(&[&a], &[&b], S(30)).await;
        assert_eq!(held(&[&a])[0].len(), 15, "a still holds its 15 shards");
    });
}

/// A member dies while its backup's watch of its shards is stalled (open,
/// silent): the backup's view shows the member's last renewal before the
/// stall, so its eviction's confirming read finds a newer record (the
/// renewals the watch missed) and takes that for a live owner, at every
/// try. The dead member's shards must still get an owner (never none)
/// within the eviction's bound, `2 LD + RP` of the death: the reads
/// themselves tell that the record no longer changes, and a read that
/// shows what the watch did not starts the watches again.
#[test]
fn a_dead_members_shards_get_owners_though_the_backups_watch_is_stalled() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, a_id) = replica_of(&fake, "a", 12);
        let (b, b_id) = replica_of(&fake, "b", 12);
        start(&[&a, &b]);
        never_shared(&[&a, &b], S(30)).await;
        assert_eq!(sizes(&held(&[&a, &b])), [6, 6]);
        let a_shards = held(&[&a])[0].clone();
        // b's watches stall; a renews twice more, then dies.
        fake.stall_watches(b_id);
        never_shared(&[&a, &b], Duration::from_millis(2500)).await;
        fake.partition(a_id, true);
        let died = tokio::time::Instant::now();
        while !a_shards.is_subset(&held(&[&b])[0]) {
            assert!(
                died.elapsed() <= S(9),
                "a's shards {a_shards:?} have no owner {:?} after its death (b's watches stalled; b holds {:?}, \
                 roster {:?})",
                died.elapsed(),
                held(&[&b])[0],
                roster_leases(&fake)
                    .iter()
                    .filter_map(|l| l.spec.as_ref()?.holder_identity.clone())
                    .collect::<Vec<_>>()
            );
            never_shared(&[&a, &b], Duration::from_millis(100)).await;
        }
    });
}

/// A member leaves (shut down: it leaves the roster and releases its
/// shards) while its peer's watches are stalled (open, silent): the peer's
/// roster still names it, so the assignment still gives it its shards; the
/// peer's eviction of it meets a conflict (the entry changed since the
/// watch showed it), which said nothing and changed nothing, at every try.
/// Its shards must still get an owner (never none) within the eviction's
/// bound, `2 LD + RP`: a conflict starts the roster watch again.
#[test]
fn a_members_shards_get_owners_after_it_leaves_though_its_peers_roster_watch_is_stalled() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = replica_of(&fake, "a", 12);
        let (b, b_id) = replica_of(&fake, "b", 12);
        start(&[&a, &b]);
        never_shared(&[&a, &b], S(30)).await;
        assert_eq!(sizes(&held(&[&a, &b])), [6, 6]);
        fake.stall_watches(b_id);
        let left = tokio::time::Instant::now();
        a.shutdown(S(1)).await;
        while held(&[&b])[0].len() < 12 {
            assert!(
                left.elapsed() <= S(9),
                "{} of 12 shards owned {:?} after a left (b's watches stalled; b holds {:?})",
                held(&[&b])[0].len(),
                left.elapsed(),
                held(&[&b])[0],
            );
            never_shared(&[&a, &b], Duration::from_millis(100)).await;
        }
    });
}

/// A member dies while its backup's watches lag a lease duration (every
/// event delivered 4 s late: a slow watch cache): the backup must still own
/// the dead member's shards within the eviction's bound, `2 LD + RP` of the
/// death. Its eviction's own write is taken into its view at once, not
/// when the lagging roster watch delivers it (before, the lag counted
/// twice). (A lag well beyond a lease duration still passes the bound: the
/// shard watch delivers the last renewal that late.)
#[test]
fn a_dead_members_shards_get_owners_though_the_backups_watches_lag_a_lease_duration() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, a_id) = replica_of(&fake, "a", 12);
        let (b, b_id) = replica_of(&fake, "b", 12);
        fake.set_watch_latency(b_id, S(4));
        start(&[&a, &b]);
        never_shared(&[&a, &b], S(30)).await;
        assert_eq!(sizes(&held(&[&a, &b])), [6, 6]);
        let a_shards = held(&[&a])[0].clone();
        fake.partition(a_id, true);
        let died = tokio::time::Instant::now();
        while !a_shards.is_subset(&held(&[&b])[0]) {
            assert!(
                died.elapsed() <= S(9),
                "a's shards {a_shards:?} have no owner {:?} after its death (b's watches 4 s late; b holds {:?})",
                died.elapsed(),
                held(&[&b])[0],
            );
            never_shared(&[&a, &b], Duration::from_millis(100)).await;
        }
    });
}

/// A plain elector in the election's namespace configured with the labels
/// the sharded election finds its roster by (`LeaseConfig::label`, keys of
/// the crate's own): its Lease, held and relabelled at every renewal, reads
/// as a roster entry of a member that never campaigns for its share. Such
/// labels must be refused (as the fencing token's annotation key is), or the
/// shards must still all get an owner.
#[cfg(feature = "lease-metadata")]
#[test]
fn a_plain_lease_labelled_with_the_roster_labels_does_not_leave_shards_without_an_owner() {
    paused(async {
        let fake = FakeLeaseApi::default().with_request_budget(200_000);
        let plain = LeaseConfig::new("default", "other", "x")
            .creation_hold(false)
            .label(super::OF_LABEL, "ctl")
            .label(super::ROLE_LABEL, "member");
        if let Err(e) = plain.validate() {
            assert!(
                matches!(&e, crate::ConfigError::InvalidLabel { key, .. } if key.starts_with("leases.kube-runtime-lease/")),
                "{e}"
            );
            return;
        }
        let (client, _) = fake.client();
        let x = crate::LeaderElector::new(client, plain).unwrap();
        let guard = tokio::time::timeout(S(10), x.acquire())
            .await
            .expect("x leads its own Lease")
            .unwrap();
        let (a, _) = replica_of(&fake, "a", 12);
        let (b, _) = replica_of(&fake, "b", 12);
        start(&[&a, &b]);
        never_shared(&[&a, &b], S(120)).await;
        let now = held(&[&a, &b]);
        let other = fake
            .lease_in("default", "other")
            .map(|l| l.spec.unwrap_or_default().holder_identity);
        assert!(
            now.iter().flatten().count() == 12
                && guard.lost().is_none()
                && other == Some(Some("x".to_owned())),
            "120 s after a and b started beside x's plain Lease labelled as a roster entry: shards held {now:?}; \
             x's term ended: {:?}; x's Lease's holder: {other:?} (None: deleted)",
            guard.lost()
        );
    });
}

/// The prefix `validate` refuses in configured labels covers every label the
/// sharded election finds its roster and its shards by: a new label under
/// another prefix would let a plain elector's Lease pass for a roster entry.
#[test]
fn every_roster_and_shard_label_is_under_the_prefix_configured_labels_may_not_use() {
    use crate::config::extras::metadata::RESERVED_LABEL_PREFIX;
    for key in [
        super::OF_LABEL,
        super::ROLE_LABEL,
        super::SHARD_LABEL,
        super::SHARDS_LABEL,
    ] {
        assert!(
            key.starts_with(RESERVED_LABEL_PREFIX),
            "{key} is not under {RESERVED_LABEL_PREFIX}"
        );
    }
}

/// A replica of a 12-shard election with its own timings.
fn timed_replica(
    fake: &FakeLeaseApi,
    identity: &str,
    (lease, renew, retry): (Duration, Duration, Duration),
) -> (ShardedElector, usize) {
    let (client, id) = fake.client();
    let lease = LeaseConfig::new("default", "ctl", identity)
        .lease_duration(lease)
        .renew_deadline(renew)
        .retry_period(retry);
    (
        ShardedElector::new(client, ShardConfig::new(lease, 12)).unwrap(),
        id,
    )
}

/// Samples for `span` (every 100 ms of paused time) that no shard is owned
/// (held, its term valid) by two of `replicas` at once.
async fn never_owned_twice(replicas: &[&ShardedElector], span: Duration, what: &str) {
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        let each: Vec<BTreeSet<u16>> = replicas.iter().map(|r| owned(r)).collect();
        let total: usize = each.iter().map(BTreeSet::len).sum();
        let union: BTreeSet<u16> = each.iter().flatten().copied().collect();
        assert_eq!(
            total,
            union.len(),
            "{what}: a shard owned by two replicas at once: {each:?}"
        );
        sleep(Duration::from_millis(100)).await;
    }
}

/// A rolling update that changes the timings and not the shard count:
/// three replicas of the old timings are replaced one by one by three of
/// the new (the old one shut down gracefully, or cut off as in a crash),
/// for client-go's defaults next to longer timings, both ways, and for a
/// short lease duration next to a retry period longer than it, both ways.
/// Every shard Lease is an ordinary election, judged by the duration on its
/// record; the roster, the evictions and the handovers mix both timings:
/// no shard is ever owned twice, no new (live) replica is ever evicted, and
/// the new replicas own every shard within the bound of members gone
/// together with their backups (evicted one after the other, each within
/// two of the records' lease durations).
#[test]
fn a_rolling_update_of_the_timings_never_has_two_owners_and_ends_with_every_shard_owned() {
    let defaults = (S(15), S(10), S(2));
    let long = (S(60), S(40), S(5));
    let short = (S(2), Duration::from_millis(1900), Duration::from_millis(1500));
    let slow = (S(20), S(17), S(14));
    for (old_timings, new_timings) in [(defaults, long), (long, defaults), (short, slow), (slow, short)] {
        for crash in [false, true] {
            let what = format!("{old_timings:?} -> {new_timings:?}, crash: {crash}");
            let logs = crate::tests::support::logs_during(tracing::Level::INFO, || {
                paused(async {
                    let fake = FakeLeaseApi::default().with_request_budget(400_000);
                    let old: Vec<(ShardedElector, usize)> = ["a", "b", "c"]
                        .iter()
                        .map(|i| timed_replica(&fake, i, old_timings))
                        .collect();
                    let new: Vec<(ShardedElector, usize)> = ["d", "e", "f"]
                        .iter()
                        .map(|i| timed_replica(&fake, i, new_timings))
                        .collect();
                    let all: Vec<&ShardedElector> = old.iter().chain(&new).map(|(r, _)| r).collect();
                    start(&all[..3]);
                    never_owned_twice(&all, old_timings.0 * 2, &what).await;
                    for i in 0..3 {
                        start(&all[3 + i..=3 + i]);
                        never_owned_twice(&all, new_timings.0 * 2, &what).await;
                        let (r, id) = &old[i];
                        if crash {
                            fake.partition(*id, true);
                        } else {
                            r.shutdown(S(1)).await;
                        }
                        never_owned_twice(&all, new_timings.0 * 2, &what).await;
                    }
                    let over = tokio::time::Instant::now();
                    let bound = old_timings.0 * 2 + new_timings.0;
                    loop {
                        let owned_now: BTreeSet<u16> = all[3..].iter().flat_map(|r| owned(r)).collect();
                        if owned_now.len() == 12 {
                            break;
                        }
                        assert!(
                            over.elapsed() <= bound,
                            "{what}: the new replicas own only {owned_now:?} {:?} after the update ended",
                            over.elapsed()
                        );
                        never_owned_twice(&all, Duration::from_millis(100), &what).await;
                    }
                    never_owned_twice(&all, new_timings.0 * 2, &what).await;
                });
            });
            let evicted: Vec<&str> = logs
                .lines()
                .filter(|l| l.contains("evicted the member from the roster") || l.contains("joining again"))
                .filter(|l| {
                    ["member=d ", "member=e ", "member=f "]
                        .iter()
                        .any(|m| l.contains(m))
                })
                .collect();
            assert!(
                evicted.is_empty(),
                "{what}: a live new replica was evicted: {evicted:#?}"
            );
        }
    }
}

/// A rolling update that shortens the timings (old replicas `a` and `b`
/// with a 12 s lease duration, new `c` and `d` with 4 s), and the two old
/// replicas die together (a node lost): a shard whose backup died with its
/// owner is reassigned, once the dead are evicted, to a live new member
/// that never watched it, which must then see the dead owner's record
/// unchanged for its lease duration (12 s, the record's) before it may take
/// it. Its peer, watching over the shard, gave it two of its own lease
/// durations (8 s) and evicted it, a live member: it joined again, and the
/// shards moved about once more. Now the peer gives the owner two lease
/// durations of the record's, if longer than its own: nobody alive is
/// evicted, and the new members own every shard within two old lease
/// durations of the crash.
#[test]
fn a_live_member_waiting_out_a_dead_old_members_longer_lease_is_not_evicted() {
    let old = (S(12), S(9), S(2));
    let new = (S(4), S(3), S(1));
    let mut took = None;
    let logs = crate::tests::support::logs_during(tracing::Level::INFO, || {
        paused(async {
            let fake = FakeLeaseApi::default();
            let (a, a_id) = timed_replica(&fake, "a", old);
            let (b, b_id) = timed_replica(&fake, "b", old);
            start(&[&a, &b]);
            never_owned_twice(&[&a, &b], S(30), "old").await;
            let (c, _) = timed_replica(&fake, "c", new);
            let (d, _) = timed_replica(&fake, "d", new);
            let all = [&a, &b, &c, &d];
            start(&[&c, &d]);
            never_owned_twice(&all, S(40), "old and new").await;
            fake.partition(a_id, true);
            fake.partition(b_id, true);
            let cut = tokio::time::Instant::now();
            while owned(&c).len() + owned(&d).len() < 12 {
                assert!(
                    cut.elapsed() <= S(60),
                    "the new members own {:?} 60 s after the old ones died",
                    [owned(&c), owned(&d)]
                );
                never_owned_twice(&all, Duration::from_millis(100), "after the crash").await;
            }
            took = Some(cut.elapsed());
            never_owned_twice(&all, S(10), "after the takeover").await;
        });
    });
    let evicted: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("evicted the member from the roster") || l.contains("joining again"))
        .filter(|l| !l.contains("member=a ") && !l.contains("member=b "))
        .collect();
    assert!(evicted.is_empty(), "a live member was evicted: {evicted:#?}");
    let took = took.expect("the test ran");
    assert!(
        took <= old.0 * 2,
        "the new members owned every shard only {took:?} after the old ones died (two old lease durations: {:?})",
        old.0 * 2
    );
}

/// Waits (at most 60 s) until `a` holds every shard and its Controller's
/// `store` was first filled.
async fn holds_every_shard_with_its_store(
    a: &ShardedElector,
    store: &kube_runtime::reflector::Store<k8s_openapi::api::coordination::v1::Lease>,
) {
    let ready = tokio::time::timeout(S(60), async {
        while a.held().borrow().len() < 12 {
            sleep(Duration::from_millis(100)).await;
        }
        store.wait_until_ready().await
    })
    .await;
    assert!(
        matches!(ready, Ok(Ok(()))),
        "a never held every shard: {:?}",
        held(&[a])
    );
}

/// A sharded Controller whose Controller kube-runtime ends on its own
/// trigger (its own `graceful_shutdown_on`, `shutdown_on_signal`) ends its
/// stream, and the balancer with it: its shards are given up. The balancer
/// ran on beside the ended Controller, so the stream never ended (a
/// `for_each` on it never returned) and the replica kept its shards,
/// reconciling none.
#[test]
fn a_sharded_controller_ended_by_its_own_graceful_shutdown_ends_and_gives_its_shards_up() {
    use std::sync::Arc;

    use futures::{FutureExt, channel::oneshot};
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_runtime::{Controller, controller::Action, watcher};

    paused(async {
        let fake = FakeLeaseApi::default();
        let a = replica(&fake, "a");
        let (client, _) = fake.client();
        let (stop, stopped) = oneshot::channel::<()>();
        let controller = Controller::new(
            kube_client::Api::<Lease>::namespaced(client, "default"),
            watcher::Config::default(),
        );
        let store = controller.store();
        let run = a
            .controller(controller.graceful_shutdown_on(stopped.map(drop)))
            .run(
                |_, _: Arc<()>| async { Ok::<_, kube_client::Error>(Action::await_change()) },
                |_, _, _| Action::await_change(),
                Arc::new(()),
            );
        let ended_rx = crate::tests::support::kept_once_ended(run);
        holds_every_shard_with_its_store(&a, &store).await;
        stop.send(()).unwrap();
        let ended = tokio::time::timeout(S(30), ended_rx).await;
        sleep(S(10)).await;
        let holders = shard_holders(&fake);
        assert!(
            ended.is_ok() && holders.is_empty(),
            "ended by its own graceful shutdown, the sharded Controller's stream ended: {}; a holds \
             {:?}, the shard Leases' holders: {holders:?}",
            ended.is_ok(),
            held(&[&a])
        );
    });
}

/// `ShardedElector::shutdown` ends the sharded Controller's stream, as
/// `LeaderElector::shutdown` ends a guarded or warm one (a reconcile in
/// flight finishing within the grace), and not before every shard Lease
/// is released and the roster left: a `select!` of the stream and the
/// shutdown, as `examples/sharded.rs` has, returns from `main` when either
/// ends, and a release still in flight then is cut by the runtime's
/// shutdown (the shards expire for the others). The stream did not end: a
/// consumer awaiting it before its handover (as the other examples do)
/// waited for ever.
#[test]
fn a_sharded_controller_ends_at_shutdown_once_its_shards_are_released() {
    use std::sync::Arc;

    use futures::{StreamExt, channel::oneshot};
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_runtime::{Controller, controller::Action, watcher};

    paused(async {
        let fake = FakeLeaseApi::default();
        let a = replica(&fake, "a");
        let (client, _) = fake.client();
        let controller = Controller::new(
            kube_client::Api::<Lease>::namespaced(client, "default"),
            watcher::Config::default(),
        );
        let store = controller.store();
        let run = a.controller(controller).run(
            |_, _: Arc<()>| async {
                sleep(S(2)).await;
                Ok::<_, kube_client::Error>(Action::requeue(S(1)))
            },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        );
        // What the shard Leases and the roster say as the stream ends.
        let (ended_tx, ended_rx) = oneshot::channel();
        let f = fake.clone();
        tokio::spawn(async move {
            let mut run = std::pin::pin!(run);
            while run.next().await.is_some() {}
            let _ = ended_tx.send((shard_holders(&f), roster_members(&f)));
            futures::future::pending::<()>().await;
        });
        holds_every_shard_with_its_store(&a, &store).await;
        let shutdown = tokio::spawn({
            let a = a.clone();
            async move { a.shutdown(S(10)).await }
        });
        let ended = tokio::time::timeout(S(30), ended_rx).await;
        assert!(
            matches!(&ended, Ok(Ok((holders, members))) if holders.is_empty() && members.is_empty()),
            "shut down, the sharded Controller's stream ended (and the shard Leases' holders, the roster's \
             members then): {ended:?}; the shutdown finished: {}",
            shutdown.is_finished()
        );
    });
}

/// As [`a_new_count_whose_watch_of_the_old_count_stalls_does_not_take_its_shards`],
/// with the reads that confirm the old count's records (lapsed on the
/// stalled watch) answered oddly: a 404 that names no Lease (an API server
/// that does not serve the group: kube's `get_opt` takes any `NotFound` for
/// a missing object), or a `200` whose body is not the Lease (its record
/// then stayed lapsed). Neither says the old count's Lease is gone or
/// unchanged: a failed read, and the new count waits. It wrote its own
/// shard Leases (and got guards for them, until the restarted watch showed
/// the old count again) while the old count held all of its own.
#[test]
fn a_new_count_does_not_take_an_odd_answer_for_the_old_counts_lease_gone() {
    for fault in [
        crate::test_util::Fault::NoSuchResource,
        crate::test_util::Fault::Body(200, "{}"),
    ] {
        paused(async {
            let fake = FakeLeaseApi::default();
            let (a, _) = replica_of(&fake, "a", 15);
            start(&[&a]);
            never_shared(&[&a], S(20)).await;
            let (b, b_id) = replica_of(&fake, "b", 12);
            start(&[&b]);
            never_two_counts(&[&a], &[&b], S(10)).await;
            assert!(held(&[&b])[0].is_empty(), "{:?}", held(&[&b]));
            // b's watches stall; its next 15 reads (those of the old
            // count's 15 Leases, once lapsed) are answered oddly.
            fake.stall_watches(b_id);
            for _ in 0..15 {
                fake.fault(b_id, Some("get"), fault);
            }
            let stalled = tokio::time::Instant::now();
            never_two_counts(&[&a], &[&b], S(30)).await;
            let writes = fake
                .requests()
                .into_iter()
                .filter(|r| r.client == b_id && r.at >= stalled)
                .filter(|r| {
                    r.verb == "create" || r.name.as_deref().is_some_and(|n| n.starts_with("ctl-s12-shard"))
                })
                .filter(|r| r.verb != "get")
                .count();
            assert_eq!(
                writes, 0,
                "b wrote its count's shard Leases {writes} times while a held all of its 15, after b's reads of a's \
                 Leases were answered {fault:?}"
            );
            assert_eq!(
                held(&[&a])[0].len(),
                15,
                "a still holds its 15 shards ({fault:?})"
            );
        });
    }
}

/// A live member's backup whose watches stall (open, silent) sees its
/// shards' records stop changing, and confirms with a read before evicting
/// it (the read shows the renewals the watch missed). That read answered
/// oddly (a 404 that names no Lease, which kube's `get_opt` takes for a
/// missing object; a `200` whose body is not the Lease, which read as a
/// free record) evicted the live member, logged as "its shard's record has
/// not changed for a lease duration". Neither is the shard free: a failed
/// read, no eviction, said so.
#[test]
fn a_live_member_is_not_evicted_on_an_odd_answer_to_the_confirming_read() {
    for fault in [
        crate::test_util::Fault::NoSuchResource,
        crate::test_util::Fault::Body(200, "{}"),
    ] {
        let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
            paused(async {
                let fake = FakeLeaseApi::default();
                let (a, _) = replica_of(&fake, "a", 12);
                let (b, b_id) = replica_of(&fake, "b", 12);
                start(&[&a, &b]);
                never_shared(&[&a, &b], S(30)).await;
                assert_eq!(sizes(&held(&[&a, &b])), [6, 6]);
                fake.stall_watches(b_id);
                fake.fault(b_id, Some("get"), fault);
                let stalled = tokio::time::Instant::now();
                never_shared(&[&a, &b], S(20)).await;
                let evictions: Vec<_> = fake
                    .requests()
                    .into_iter()
                    .filter(|r| r.client == b_id && r.at >= stalled && r.verb == "update")
                    .filter_map(|r| r.name.filter(|n| n.contains("-member-")))
                    .collect();
                assert!(
                    evictions.is_empty(),
                    "b evicted a live member ({evictions:?}) after its confirming read was answered {fault:?}"
                );
                assert_eq!(sizes(&held(&[&a, &b])), [6, 6], "{fault:?}");
            });
        });
        assert!(
            logs.contains("could not evict the member"),
            "no line naming the failed read ({fault:?}):\n{logs}"
        );
    }
}
