//! The sharded election on the Lease double, with paused time.

use std::{collections::BTreeSet, time::Duration};

use tokio::time::sleep;

use super::{ShardConfig, ShardedElector};
use crate::{LeaseConfig, test_support::paused, test_util::FakeLeaseApi};

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
        assert!(fake.seen().is_empty(), "no API call: {:?}", fake.seen());
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
        // Each of the three handed one shard over to balance; d none.
        let rebalances = |rs: &[&ShardedElector]| rs.iter().map(|r| r.rebalances()).collect::<Vec<_>>();
        assert_eq!(rebalances(&[&a, &b, &c, &d]), [1, 1, 1, 0]);
        // It leaves: its shards are taken again (4 each), each within a
        // watch event and a write (paused time: within a second).
        let left = tokio::time::Instant::now();
        d.shutdown(S(1)).await;
        while sizes(&held(&[&a, &b, &c])) != [4, 4, 4] {
            assert!(
                left.elapsed() < S(1),
                "not re-owned within 1 s: {:?}",
                held(&[&a, &b, &c])
            );
            never_shared(&[&a, &b, &c], Duration::from_millis(10)).await;
        }
        never_shared(&[&a, &b, &c], S(30)).await;
        let now = held(&[&a, &b, &c]);
        assert_eq!(sizes(&now), [4, 4, 4], "{now:?}");
        // Taking a leaver's shards is no rebalance, nor is leaving.
        assert_eq!(rebalances(&[&a, &b, &c, &d]), [1, 1, 1, 0]);
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
/// Healed, it takes its membership Lease again (its term there ended too) and
/// the shards are balanced again: 4 each.
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
        // retry period (membership is judged by the same rule).
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
        // Healed: c is a member again, and the shards are shared by three.
        fake.partition(ids[2], false);
        never_shared(&[a, b, c], S(60)).await;
        assert_eq!(sizes(&held(&[a, b, c])), [4, 4, 4], "{:?}", held(&[a, b, c]));
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

/// Every shard's election is in the metrics, one series per shard Lease: the
/// shards a replica holds are their sum.
#[cfg(feature = "metrics")]
#[test]
fn the_metrics_have_one_series_per_shard() {
    paused(async {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = crate::LeaseMetrics::register(&mut registry);
        let fake = FakeLeaseApi::default();
        let a = replica(&fake, "a").with_metrics(&metrics);
        let run = a.clone();
        tokio::spawn(async move { run.run().await });
        never_shared(&[&a], S(30)).await;
        assert_eq!(a.held().borrow().len(), 12);
        let text = crate::test_support::scrape(&registry);
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
