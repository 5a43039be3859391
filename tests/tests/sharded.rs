//! Elected shards against a real kube-apiserver and etcd (issue 12, work in
//! progress): three replicas (each with a client of its own) share 12 shards
//! of one Controller of 600 ConfigMaps: every shard has one holder, each
//! replica holds 4, every ConfigMap is reconciled by the replica that holds
//! its shard; a fourth joins (3 each, by graceful handover) and leaves by
//! shutdown (its shards re-owned within 1 s); and no object is ever
//! reconciled by two replicas at once.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::{ObjectMeta, PostParams},
    runtime::{Controller, controller::Action, watcher},
};
use kube_runtime_lease::{LeaseConfig, ShardConfig, ShardedElector};
use kube_runtime_lease_harness::shared_env;
use tokio::time::Instant;

/// Reconciles: (uid, replica, start, end).
type Log = Arc<Mutex<Vec<(String, String, Instant, Instant)>>>;

/// Starts replica `name` of the sharded Controller of `ns`'s ConfigMaps,
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
                let current = kube_runtime_lease::current_shard();
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
    let cms = Api::<ConfigMap>::namespaced(admin, &ns);
    for i in 0..600 {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i:03}")),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        cms.create(&PostParams::default(), &cm).await?;
    }
    let log: Log = Arc::default();
    assert_eq!(kube_runtime_lease::current_shard(), None, "outside a reconcile");
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
    // within a second, each by one watch event and one write.
    let left = Instant::now();
    d.shutdown(Duration::from_secs(5)).await;
    while sizes() != [4, 4, 4] {
        ensure!(
            left.elapsed() < Duration::from_secs(1),
            "the leaver's shards not re-owned within 1 s: {:?}",
            sizes()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
