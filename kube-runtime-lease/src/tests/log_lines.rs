//! What the logs say when several elections run in one process: each line
//! names the Lease it is about, and a healthy election's normal events
//! (a first election, a handover, a follower waiting, a watch re-listed
//! after `410 Gone`, a crash failover) log nothing at WARN or above.

use std::time::Duration;

use futures::stream;
use tokio::time::{sleep, timeout};

use crate::{
    LeaseConfig, LeaseObserver, Lost,
    test_util::FakeLeaseApi,
    tests::support::{config, elector, logs_during, paused},
};

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

/// The lines of `logs` that name none of `names` (the Leases, or the base
/// name of a sharded election), whether in a span's fields or their own.
fn unnamed<'a>(logs: &'a str, names: &[&str]) -> Vec<&'a str> {
    logs.lines()
        .filter(|line| !names.iter().any(|name| line.contains(name)))
        .collect()
}

/// Two electors on two Leases (one with Events its Role refuses, one
/// rejoining after a takeover through `run_each_term`), an observer whose
/// watch stalls and an elected-shards election, all in one process: every
/// line, at each level an operator may filter at, names the Lease (or the
/// sharded election) it is about. A line from a task the crate spawns does
/// not inherit its caller's span, and a span below the filter's level is
/// dropped. (Before: the Events publisher's warning, the observer's lines,
/// the rejoin's warning, the shard balancer's lines and the guarded
/// stream's named none; at WARN, no line of the election task named its
/// Lease, its span being at INFO.)
#[test]
fn every_line_of_several_elections_in_one_process_names_its_lease() {
    let names = ["alpha", "beta", "gamma"];
    // At WARN too: a span below the filter's level is dropped, and with it
    // the names of the lines in it.
    for level in [tracing::Level::DEBUG, tracing::Level::INFO, tracing::Level::WARN] {
        let logs = logs_during(level, several_elections);
        if level == tracing::Level::INFO {
            for name in names {
                #[cfg(not(feature = "unstable-shards"))]
                if name == "gamma" {
                    continue;
                }
                assert!(logs.contains(name), "no line about {name}; logs:\n{logs}");
            }
        }
        let unnamed = unnamed(&logs, &names);
        assert!(
            unnamed.is_empty(),
            "{} lines at {level} and above name no Lease:\n{}\n\nlogs:\n{logs}",
            unnamed.len(),
            unnamed.join("\n")
        );
    }
}

/// The scenario of [`every_line_of_several_elections_in_one_process_names_its_lease`].
fn several_elections() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = elector(&fake, LeaseConfig::new("default", "alpha", "one"));
        #[cfg(feature = "events")]
        let a = a.with_events(kube_runtime::events::Reporter {
            controller: "test".into(),
            instance: None,
        });
        #[cfg(feature = "events")]
        fake.forbid_events(true);
        let (b, _) = elector(&fake, LeaseConfig::new("other", "beta", "two"));
        let (client, observer_id) = fake.client();
        let observer = LeaseObserver::new(client, "default", "alpha").unwrap();
        #[cfg(feature = "unstable-shards")]
        let sharded = {
            let (client, _) = fake.client();
            let lease = LeaseConfig::new("default", "gamma", "three")
                .lease_duration(S(4))
                .renew_deadline(S(3))
                .retry_period(S(1));
            let sharded =
                crate::shard::ShardedElector::new(client, crate::shard::ShardConfig::new(lease, 2)).unwrap();
            let run = sharded.clone();
            tokio::spawn(async move { run.run().await });
            sharded
        };
        let rejoining = {
            let b = b.clone();
            tokio::spawn(async move { b.run_each_term(stream::pending::<()>).await })
        };
        let guard = a.acquire().await.unwrap();
        timeout(S(60), async {
            while !b.is_leader() {
                sleep(MS(100)).await;
            }
        })
        .await
        .expect("beta led within 60 s");
        #[cfg(feature = "unstable-shards")]
        timeout(S(60), sharded.held().wait_for(|h| h.len() == 2))
            .await
            .expect("both shards held within 60 s")
            .unwrap();
        // The observer's watch stalls while alpha is renewed: warned.
        fake.stall_watches(observer_id);
        sleep(S(40)).await;
        // beta is taken over: its term is lost, and it rejoins.
        fake.take_over_in("other", "beta", "intruder");
        sleep(S(1)).await;
        timeout(S(60), async {
            while !b.is_leader() {
                sleep(MS(100)).await;
            }
        })
        .await
        .expect("beta led again within 60 s");
        drop(guard);
        a.shutdown(S(1)).await.unwrap();
        b.shutdown(S(1)).await.unwrap();
        #[cfg(feature = "unstable-shards")]
        sharded.shutdown(S(1)).await;
        rejoining.await.unwrap();
        drop(observer);
        sleep(S(10)).await;
    });
}

/// A healthy election's normal events log nothing at WARN or above: a
/// first election (the creation hold), followers waiting, the watches
/// re-listed after `410 Gone` (etcd compacted past them, or an API server
/// restarted: kube-runtime's watcher re-lists, as client-go's reflector
/// does, which says so at V(4)), a graceful handover by `shutdown`, and a
/// crash failover as the follower that takes over sees it (the crashed
/// leader's own lines are a fault's, and left out), a follower shut down
/// while it waits, and the last leader shut down. (Before: each watch's
/// `410 Gone` was warned as `lease watch failed; polling every retry period
/// until it recovers`.)
#[test]
fn a_healthy_elections_normal_events_log_no_warning() {
    let crashed = std::cell::Cell::new("");
    let logs = logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default();
            let (first, _) = elector(&fake, config("first"));
            let guard = first.acquire().await.unwrap();
            let mut followers = Vec::new();
            for identity in ["second", "third"] {
                let (e, id) = elector(&fake, config(identity));
                let task = tokio::spawn({
                    let e = e.clone();
                    // (In an `Option`: a guard is a future itself.)
                    async move { Some(e.acquire().await.unwrap()) }
                });
                followers.push((identity, e, id, task));
            }
            sleep(S(30)).await;
            fake.expire_watches();
            sleep(S(30)).await;
            assert!(followers.iter().all(|f| !f.3.is_finished()), "the followers wait");
            drop(guard);
            first.shutdown(S(1)).await.unwrap();
            timeout(S(10), async {
                while !followers.iter().any(|f| f.3.is_finished()) {
                    sleep(MS(10)).await;
                }
            })
            .await
            .expect("a follower took over within 10 s of the handover");
            let won = followers.iter().position(|f| f.3.is_finished()).unwrap();
            let (identity, _, id, task) = followers.remove(won);
            crashed.set(identity);
            let _guard = task.await.unwrap();
            sleep(S(10)).await;
            // The new leader crashes (cut off for good).
            fake.partition(id, true);
            let (_, other, _, task) = followers.pop().unwrap();
            let led = timeout(S(60), task)
                .await
                .expect("the other follower took over within 60 s of the crash")
                .unwrap();
            assert!(other.is_leader());
            sleep(S(10)).await;
            // A follower shut down while it waits (a rollout's old standby),
            // then the leader, gracefully.
            let (fourth, _) = elector(&fake, config("fourth"));
            let waiting = tokio::spawn({
                let fourth = fourth.clone();
                async move { fourth.acquire().await.is_err() }
            });
            sleep(S(10)).await;
            fourth.shutdown(S(1)).await.unwrap();
            assert!(
                waiting.await.unwrap(),
                "the waiting acquire failed at the shutdown"
            );
            drop(led);
            other.shutdown(S(1)).await.unwrap();
            sleep(S(10)).await;
        });
    });
    let warned: Vec<&str> = logs
        .lines()
        .filter(|l| !l.contains(&format!("identity={}", crashed.get())))
        .collect();
    assert!(
        warned.is_empty(),
        "warnings in a healthy election (but for the crashed {}):\n{}",
        crashed.get(),
        warned.join("\n")
    );
}

/// A follower whose runtime shuts down (a `#[tokio::main]` returning, a
/// test's runtime dropped) while it waits for the Lease never led: its
/// election task is dropped unfinished, and that drop says `leadership
/// lost` only when it ended a term. A follower saying it lost a
/// leadership it never had sends an operator after a failover that did
/// not happen.
#[test]
fn a_follower_whose_runtime_shuts_down_logs_no_loss() {
    let logs = logs_during(tracing::Level::WARN, || {
        let runtime = crate::tests::runtime::paused_runtime();
        let elector = runtime.block_on(async {
            let fake = FakeLeaseApi::default();
            fake.put(crate::tests::support::held_by("other", 3600));
            let (e, _) = elector(&fake, config("follower"));
            let waiting = tokio::spawn({
                let e = e.clone();
                async move { e.acquire().await.map(drop) }
            });
            sleep(S(30)).await;
            assert!(!waiting.is_finished() && !e.is_leader(), "the follower waits");
            e
        });
        drop(runtime);
        drop(elector);
    });
    assert!(
        !logs.contains("leadership lost"),
        "a follower that never led, its runtime shut down, logs a loss:\n{logs}"
    );
}

/// A Lease written free by someone else while we lead: the release of
/// kube-lease-manager and kubert removes `holderIdentity`, the duration and
/// the times (kube-lease-manager's standby also does it to a record it
/// judges expired by `renewTime` against its own clock), and an admin or an
/// Argo CD sync may write `holderIdentity: ""`. The term ends on the watch
/// event, and its reason, logged and handed to the guard, says the Lease was
/// written free. (Before: "the lease was taken over by \"\"", an empty
/// holder named as the new leader, once a second beside a skewed
/// kube-lease-manager standby.)
#[test]
fn a_lease_written_free_by_someone_else_is_not_logged_as_taken_over_by_an_empty_holder() {
    let logs = logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default();
            let (e, _) = elector(&fake, config("me"));
            let guard = e.acquire().await.unwrap();
            sleep(S(1)).await;
            let mut vacated = fake.lease().unwrap();
            let spec = vacated.spec.as_mut().unwrap();
            spec.holder_identity = None;
            spec.lease_duration_seconds = None;
            spec.acquire_time = None;
            spec.renew_time = None;
            fake.put(vacated);
            let lost = timeout(S(5), guard)
                .await
                .expect("the term did not end on the free record");
            assert_eq!(
                lost,
                Lost::TakenOver {
                    holder: String::new()
                }
            );
            assert_eq!(
                lost.to_string(),
                "leadership lost: the lease was written free by someone else"
            );
        });
    });
    assert!(
        logs.contains("leadership lost: the lease was written free by someone else"),
        "{logs}"
    );
    assert!(!logs.contains("taken over by \"\""), "{logs}");
}

/// Elected shards through a rolling update (a replica joins, then one
/// leaves by `shutdown`, its shards handed over) log nothing at WARN or
/// above.
#[cfg(feature = "unstable-shards")]
#[test]
fn a_rolling_update_of_elected_shards_logs_no_warning() {
    use crate::shard::{ShardConfig, ShardedElector};
    let logs = logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default();
            let replica = |identity: &str| {
                let (client, _) = fake.client();
                let lease = LeaseConfig::new("default", "ctl", identity)
                    .lease_duration(S(4))
                    .renew_deadline(S(3))
                    .retry_period(S(1));
                let sharded = ShardedElector::new(client, ShardConfig::new(lease, 12)).unwrap();
                let run = sharded.clone();
                tokio::spawn(async move { run.run().await });
                sharded
            };
            let (a, b) = (replica("a"), replica("b"));
            all_held(&[&a, &b]).await;
            let c = replica("c");
            sleep(S(30)).await;
            all_held(&[&a, &b, &c]).await;
            assert!(c.held().borrow().len() >= 3, "c took its share");
            a.shutdown(S(1)).await;
            all_held(&[&b, &c]).await;
            sleep(S(30)).await;
            b.shutdown(S(1)).await;
            c.shutdown(S(1)).await;
        });
    });
    assert!(
        logs.is_empty(),
        "warnings in a rolling update of elected shards:\n{logs}"
    );
}

/// Waits until `replicas` hold every one of 12 shards.
#[cfg(feature = "unstable-shards")]
async fn all_held(replicas: &[&crate::shard::ShardedElector]) {
    timeout(S(60), async {
        while replicas.iter().map(|r| r.held().borrow().len()).sum::<usize>() < 12 {
            sleep(MS(100)).await;
        }
    })
    .await
    .expect("every shard held within 60 s");
}
