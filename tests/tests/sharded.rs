//! Elected shards against a real kube-apiserver and etcd: three
//! replicas (each with a client of its own) share 12 shards
//! of one Controller of 600 `ConfigMaps`: every shard has one holder, each
//! replica holds 4, every `ConfigMap` is reconciled by the replica that holds
//! its shard; a fourth joins (3 each, by graceful handover) and leaves by
//! shutdown (its shards re-owned within 1 s, balanced within 2 s); and no object is ever
//! reconciled by two replicas at once. And a shard lost while its reconciles
//! run: only that shard's are dropped, the others finish, and none of it runs
//! again until the shard is held again.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::PostParams,
    runtime::{Controller, controller::Action, watcher},
};
use kube_runtime_lease::{
    LeaseConfig,
    shard::{ShardConfig, ShardedElector},
};
use kube_runtime_lease_harness::{create_configmaps, shared_env};
use tokio::time::Instant;

/// Reconciles: (uid, replica, start, end).
type Log = Arc<Mutex<Vec<(String, String, Instant, Instant)>>>;

/// Starts replica `name` of the sharded Controller of `ns`'s `ConfigMaps`,
/// recording its reconciles in `log` and counting in `wrong` those that did
/// not know their shard.
async fn start_replica(
    env: &kube_runtime_lease_harness::TestEnv,
    ns: &str,
    name: &'static str,
    log: &Log,
    wrong_shard: &Arc<std::sync::atomic::AtomicUsize>,
) -> Result<ShardedElector> {
    let client = env.client().await?;
    let lease = LeaseConfig::new(ns, "ctl", name)
        .lease_duration(Duration::from_secs(4))
        .renew_deadline(Duration::from_secs(3))
        .retry_period(Duration::from_secs(1));
    let sharded = ShardedElector::new(client.clone(), ShardConfig::new(lease, 12))?;
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(client, ns),
        watcher::Config::default(),
    );
    let (log, wrong, shards) = (log.clone(), wrong_shard.clone(), sharded.clone());
    let run = sharded.controller(controller).run(
        move |cm: Arc<ConfigMap>, who: Arc<String>| {
            let (log, wrong, shards) = (log.clone(), wrong.clone(), shards.clone());
            async move {
                // The reconcile knows its object's shard and that term's token.
                let current = kube_runtime_lease::shard::current_shard();
                let expected = shards.shard_of(&cm.uid().unwrap_or_default());
                if current.map(|c| c.shard) != Some(expected) || current.is_some_and(|c| c.fencing_token < 0)
                {
                    wrong.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                let start = Instant::now();
                tokio::time::sleep(Duration::from_millis(5)).await;
                log.lock().expect("log").push((
                    cm.uid().unwrap_or_default(),
                    (*who).clone(),
                    start,
                    Instant::now(),
                ));
                Ok::<_, kube::Error>(Action::await_change())
            }
        },
        |_cm, _err: &kube::Error, _who| Action::requeue(Duration::from_secs(1)),
        Arc::new(name.to_owned()),
    );
    tokio::spawn(run.for_each(|_| async {}));
    Ok(sharded)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines, reason = "one scenario, phase by phase")]
async fn replicas_share_twelve_shards_of_600_configmaps_and_rebalance_on_join_and_leave() -> Result<()> {
    let env = shared_env().await?;
    let ns = env.new_namespace("sharded").await?;
    let admin = env.client().await?;
    create_configmaps(&admin, &ns, 600, 0).await?;
    let log: Log = Arc::default();
    assert_eq!(
        kube_runtime_lease::shard::current_shard(),
        None,
        "outside a reconcile"
    );
    let wrong_shard = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        replicas.push((name, start_replica(env, &ns, name, &log, &wrong_shard).await?));
    }
    // Settled (within a minute: creation holds, then the balance): every
    // ConfigMap reconciled, each replica holding 4 shards, and no reconcile
    // for two seconds (the last shard moves reconcile their stores).
    let sizes = || {
        replicas
            .iter()
            .map(|(_, r)| r.held().borrow().len())
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut quiet_since = (Instant::now(), 0);
    loop {
        let (done, count) = {
            let log = log.lock().expect("log");
            (
                log.iter()
                    .map(|r| r.0.clone())
                    .collect::<BTreeSet<String>>()
                    .len(),
                log.len(),
            )
        };
        if count != quiet_since.1 {
            quiet_since = (Instant::now(), count);
        }
        if done == 600 && sizes() == [4, 4, 4] && quiet_since.0.elapsed() >= Duration::from_secs(2) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "not settled in 60 s: {done} of 600 ConfigMaps reconciled, shards held {:?}",
            sizes()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        wrong_shard.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "reconciles that did not know their shard"
    );
    let held: Vec<BTreeSet<u16>> = replicas.iter().map(|(_, r)| r.held().borrow().clone()).collect();
    assert_eq!(
        held.iter().flatten().collect::<BTreeSet<_>>().len(),
        12,
        "{held:?}"
    );
    let snapshot = log.lock().expect("log").clone();
    // Each ConfigMap reconciled by the replica that holds its shard.
    let owner = |uid: &str| {
        replicas
            .iter()
            .filter(|(_, r)| r.owns_uid(uid))
            .map(|(n, _)| (*n).to_owned())
            .collect::<Vec<_>>()
    };
    let mut last: BTreeMap<&str, &str> = BTreeMap::new();
    for (uid, who, _, _) in &snapshot {
        last.insert(uid, who);
    }
    for (uid, who) in &last {
        assert_eq!(owner(uid), [(*who).to_owned()], "{uid} reconciled last by {who}");
    }

    // A fourth replica joins: shards move to it by graceful handover, 3 each.
    let d = start_replica(env, &ns, "d", &log, &wrong_shard).await?;
    let all_sizes = || {
        let mut v = sizes();
        v.push(d.held().borrow().len());
        v
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while all_sizes() != [3, 3, 3, 3] {
        ensure!(
            Instant::now() < deadline,
            "no rebalance to 3 each in 60 s: {:?}",
            all_sizes()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // It leaves (the SIGTERM path: `shutdown`): its shards are re-owned
    // within a second, each by one watch event and one write; the few the
    // assignment moves between the others once the roster has been stable
    // for a retry period (1 s) follow by handover: 4 each within 2 s.
    let left = Instant::now();
    d.shutdown(Duration::from_secs(5)).await;
    while sizes().iter().sum::<usize>() < 12 {
        ensure!(
            left.elapsed() < Duration::from_secs(1),
            "the leaver's shards not re-owned within 1 s: {:?}",
            sizes()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    while sizes() != [4, 4, 4] {
        ensure!(
            left.elapsed() < Duration::from_secs(2),
            "not balanced again within 2 s of the leave: {:?}",
            sizes()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // An observation window: the reconciles of the last moves are in the log checked below.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Through all of it, no object reconciled by two replicas at once.
    let log = log.lock().expect("log").clone();
    let mut by_object: BTreeMap<&str, Vec<(&str, Instant, Instant)>> = BTreeMap::new();
    for (uid, who, start, end) in &log {
        by_object.entry(uid).or_default().push((who, *start, *end));
    }
    for (uid, runs) in &by_object {
        for (i, a) in runs.iter().enumerate() {
            for b in &runs[i + 1..] {
                assert!(
                    a.0 == b.0 || a.2 <= b.1 || b.2 <= a.1,
                    "{uid} reconciled by {} and {} at once",
                    a.0,
                    b.0
                );
            }
        }
    }
    Ok(())
}

/// A reconcile of the shard-loss test: (object, shard, start, end or `None`
/// when it was dropped, the fencing token of the shard's term it ran in).
type Runs = Arc<Mutex<Vec<(String, u16, Instant, Option<Instant>, i64)>>>;

/// Records its reconcile's end, or that it was dropped, when it goes away.
struct Running {
    runs: Runs,
    at: usize,
    done: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.done {
            self.runs.lock().expect("runs")[self.at].3 = Some(Instant::now());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines, reason = "one scenario, phase by phase")]
async fn a_lost_shard_drops_only_its_own_reconciles_until_it_is_held_again() -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let env = shared_env().await?;
    let ns = env.new_namespace("shard-loss").await?;
    let admin = env.client().await?;
    create_configmaps(&admin, &ns, 16, 0).await?;
    // One replica, 4 shards: it holds them all; each reconcile takes 4 s.
    let client = env.client().await?;
    let lease = LeaseConfig::new(&ns, "ctl", "a")
        .lease_duration(Duration::from_secs(2))
        .renew_deadline(Duration::from_millis(1500))
        .retry_period(Duration::from_millis(500));
    let sharded = ShardedElector::new(client.clone(), ShardConfig::new(lease, 4))?;
    let runs: Runs = Arc::default();
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(client, &ns),
        watcher::Config::default(),
    );
    let run = sharded.controller(controller).run(
        |cm: Arc<ConfigMap>, runs: Arc<Runs>| async move {
            let current = kube_runtime_lease::shard::current_shard();
            let shard = current.map_or(u16::MAX, |c| c.shard);
            let token = current.map_or(i64::MIN, |c| c.fencing_token);
            let at = {
                let mut r = runs.lock().expect("runs");
                r.push((cm.name_any(), shard, Instant::now(), None, token));
                r.len() - 1
            };
            let mut running = Running {
                runs: (*runs).clone(),
                at,
                done: false,
            };
            tokio::time::sleep(Duration::from_secs(4)).await;
            running.done = true;
            drop(running);
            Ok::<_, kube::Error>(Action::await_change())
        },
        |_cm, _err: &kube::Error, _runs| Action::requeue(Duration::from_secs(1)),
        Arc::new(runs.clone()),
    );
    let task = tokio::spawn(run.for_each(|_| async {}));
    let started = Instant::now();
    // All 16 reconciles in flight.
    while runs.lock().expect("runs").len() < 16 {
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "not every ConfigMap's reconcile started: {:?}",
            runs.lock().expect("runs")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (lost, lost_term) = {
        let r = runs.lock().expect("runs");
        (r[0].1, r[0].4)
    };
    ensure!(lost < 4, "a reconcile without its shard");
    // Someone else writes the lost shard's Lease (a foreign holder, renewed
    // now, for 3 s): the replica's term on it ends at that watch event.
    let leases = Api::<Lease>::namespaced(admin, &ns);
    let name = format!("ctl-s4-shard-{lost:02}");
    let mut record = leases.get(&name).await?;
    if let Some(spec) = record.spec.as_mut() {
        spec.holder_identity = Some("intruder".to_owned());
        spec.lease_duration_seconds = Some(3);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    }
    leases.replace(&name, &PostParams::default(), &record).await?;
    let taken = Instant::now();
    // When the replica holds the shard again: first it lets it go, then
    // (once the intruder's record expired) takes it again.
    let reheld = {
        let mut held = sharded.held();
        tokio::spawn(async move {
            while held.borrow_and_update().contains(&lost) {
                held.changed().await.ok()?;
            }
            while !held.borrow_and_update().contains(&lost) {
                held.changed().await.ok()?;
            }
            Some(Instant::now())
        })
    };
    // Within a second the lost shard's reconciles are gone (dropped, no
    // end), and none of it starts again while the intruder holds it.
    tokio::time::timeout(
        Duration::from_secs(1),
        sharded.held().wait_for(|held| !held.contains(&lost)),
    )
    .await
    .with_context(|| format!("still holds shard {lost} 1 s after the foreign write"))??;
    // The other shards' reconciles finish their 4 s.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let done = runs
            .lock()
            .expect("runs")
            .iter()
            .filter(|r| r.1 != lost && r.3.is_some())
            .count();
        let others = runs.lock().expect("runs").iter().filter(|r| r.1 != lost).count();
        if done == others {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{done} of {others} other reconciles finished"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let snapshot = runs.lock().expect("runs").clone();
    let of_lost: Vec<_> = snapshot.iter().filter(|r| r.1 == lost && r.2 < taken).collect();
    ensure!(!of_lost.is_empty(), "no reconcile of shard {lost} was in flight");
    ensure!(
        of_lost.iter().all(|r| r.3.is_none()),
        "a reconcile of the lost shard ran to its end: {of_lost:?}"
    );
    // Nothing of the lost shard started while it was someone else's.
    let held_again = tokio::time::timeout(Duration::from_secs(15), reheld)
        .await
        .ok()
        .and_then(Result::ok)
        .flatten()
        .with_context(|| format!("shard {lost} not held again after the intruder's expiry"))?;
    ensure!(
        held_again.duration_since(taken) >= Duration::from_secs(3),
        "shard {lost} taken back {:?} after the foreign write, before the intruder's 3 s",
        held_again.duration_since(taken)
    );
    // Once held again, its objects are reconciled again (a gained shard
    // reconciles its objects, in its new term), and none started in between
    // in the term that was lost. (By the term's token: the reconciles of the
    // new term may start a moment before the task above wakes to stamp
    // `held_again`.)
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let snapshot = runs.lock().expect("runs").clone();
        let between: Vec<_> = snapshot
            .iter()
            .filter(|r| r.1 == lost && r.2 > taken && r.4 <= lost_term)
            .collect();
        ensure!(
            between.is_empty(),
            "reconciles of shard {lost} started in the term it lost: {between:?}"
        );
        let again = snapshot.iter().filter(|r| r.1 == lost && r.4 > lost_term).count();
        if again >= of_lost.len() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "shard {lost}'s objects not reconciled again once held"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    task.abort();
    sharded.shutdown(Duration::from_secs(1)).await;
    Ok(())
}

/// Someone removes the `shards` label from a shard Lease while it is held
/// (`kubectl label lease ... leases.kube-runtime-lease/shards-`): the API
/// server's `shards!=12` selector (the watch of the other counts' shard
/// Leases) selects a Lease without the label, which then read as "another
/// shard count" held fresh, and a replica holding nothing waited for it for
/// as long as its holder renewed it (its renewals kept the labels as
/// edited). A third replica joining must still get its share (4 of 12)
/// within 30 s. Before: it held nothing, and the shards handed over to it
/// had no owner until it was evicted (and again each time it rejoined).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_lease_stripped_of_its_count_label_does_not_keep_a_joiner_out() -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Patch, PatchParams};
    let env = shared_env().await?;
    let ns = env.new_namespace("sharded-label").await?;
    let admin = env.client().await?;
    let replica = |name: &'static str| {
        let ns = ns.clone();
        async move {
            let client = env.client().await?;
            let lease = LeaseConfig::new(&ns, "ctl", name)
                .lease_duration(Duration::from_secs(4))
                .renew_deadline(Duration::from_secs(3))
                .retry_period(Duration::from_secs(1));
            let r = ShardedElector::new(client, ShardConfig::new(lease, 12))?;
            let run = r.clone();
            tokio::spawn(async move { run.run().await });
            anyhow::Ok(r)
        }
    };
    let (a, b) = (replica("a").await?, replica("b").await?);
    let sizes = |rs: &[&ShardedElector]| rs.iter().map(|r| r.held().borrow().len()).collect::<Vec<_>>();
    let deadline = Instant::now() + Duration::from_secs(60);
    while sizes(&[&a, &b]) != [6, 6] {
        ensure!(
            Instant::now() < deadline,
            "not 6 and 6 within 60 s: {:?}",
            sizes(&[&a, &b])
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shard = *a.held().borrow().first().context("a holds a shard")?;
    let leases: Api<Lease> = Api::namespaced(admin, &ns);
    let patch = serde_json::json!({"metadata": {"labels": {"leases.kube-runtime-lease/shards": null}}});
    leases
        .patch(
            &format!("ctl-s12-shard-{shard:02}"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    let c = replica("c").await?;
    let joined = Instant::now();
    while sizes(&[&a, &b, &c]) != [4, 4, 4] {
        ensure!(
            joined.elapsed() < Duration::from_secs(30),
            "not balanced 30 s after c joined (one shard Lease without its `shards` label): {:?}",
            [&a, &b, &c].map(|r| r.held().borrow().clone())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for r in [&a, &b, &c] {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}
