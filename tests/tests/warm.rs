//! Warm standby (`with_leader_election_warm`) against a real kube-apiserver:
//! no reconcile on a follower; after a takeover, every object in the store is
//! reconciled without a LIST from the new leader (counted from the
//! apiserver's `apiserver_request_total`); and the store stays consistent
//! across a lost-then-rejoined term. One test, so that nothing else in this
//! binary lists `ConfigMaps` while the LISTs are counted.

mod support;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, Result};
use futures::StreamExt;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, PostParams},
    runtime::{Controller, controller::Action, watcher},
};
use kube_runtime_lease::{LeaderElectionControllerExt, LeaderElector};
use kube_runtime_lease_harness::{Timings, configmap_lists, shared_env};
use support::{configmap, fast_config, wait_until};
use tokio::time::timeout;

/// Reconciles seen: name → the `data.v` value the reconcile read.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Its `data.v`, or `""`.
fn v_of(cm: &ConfigMap) -> String {
    cm.data
        .as_ref()
        .and_then(|d| d.get("v"))
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
#[allow(clippy::too_many_lines, reason = "one scenario, phase by phase")]
async fn a_warm_standby_reconciles_its_store_at_takeover_without_a_list() -> Result<()> {
    let env = shared_env().await?;
    let ns = env.new_namespace("warm").await?;
    let admin = env.client().await?;
    let cms = Api::<ConfigMap>::namespaced(admin.clone(), &ns);
    for i in 0..20 {
        cms.create(&PostParams::default(), &configmap(&format!("cm-{i}"), "1"))
            .await?;
    }
    // Another candidate leads first.
    let other = LeaderElector::new(env.client().await?, fast_config(&ns, "other"))?;
    let other_guard = timeout(Duration::from_secs(10), other.acquire()).await??;

    let client = env.client().await?;
    let elector = LeaderElector::new(client.clone(), fast_config(&ns, "warm"))?;
    let seen: Seen = Arc::default();
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(client, &ns),
        watcher::Config::default(),
    );
    let store = controller.store();
    let running = tokio::spawn({
        let (elector, seen) = (elector.clone(), seen.clone());
        async move {
            controller
                .with_leader_election_warm(&elector)
                .run(
                    |cm: Arc<ConfigMap>, seen: Seen| async move {
                        seen.lock().expect("lock").push((cm.name_any(), v_of(&cm)));
                        Ok::<_, kube::Error>(Action::await_change())
                    },
                    |_cm, _err: &kube::Error, _seen| Action::requeue(Duration::from_millis(500)),
                    seen,
                )
                .for_each(|_| async {})
                .await;
        }
    });

    // Following: the store fills (and follows changes), nothing reconciles.
    wait_until("the follower's store fills", Duration::from_secs(10), || {
        store.state().len() == 20
    })
    .await?;
    cms.replace("cm-0", &PostParams::default(), &{
        let mut cm = cms.get("cm-0").await?;
        cm.data = Some(BTreeMap::from([("v".to_owned(), "2".to_owned())]));
        cm
    })
    .await?;
    wait_until(
        "the follower's store has cm-0 at v=2",
        Duration::from_secs(10),
        || {
            store
                .state()
                .iter()
                .any(|cm| cm.name_any() == "cm-0" && v_of(cm) == "2")
        },
    )
    .await?;
    // An observation window: nothing reconciles while following.
    tokio::time::sleep(Timings::FAST.retry_period * 2).await;
    assert!(
        seen.lock().expect("lock").is_empty(),
        "a follower reconciled: {:?}",
        seen.lock()
    );

    // Takeover: everything in the store is reconciled, with no new LIST.
    let lists_before = configmap_lists(&env.metrics_text().await?);
    // The follower's own initial LIST is counted: the measure can see one.
    assert!(lists_before >= 1.0, "no configmap LIST counted at all");
    drop(other_guard);
    other.shutdown(Duration::from_secs(5)).await?;
    wait_until(
        "every object reconciled after the takeover",
        Duration::from_secs(10),
        || seen.lock().expect("lock").len() >= 20,
    )
    .await?;
    let lists_after = configmap_lists(&env.metrics_text().await?);
    assert!(
        (lists_after - lists_before).abs() < f64::EPSILON,
        "LISTs of configmaps at the takeover: {lists_before} -> {lists_after}"
    );
    {
        let seen = seen.lock().expect("lock");
        let names: std::collections::BTreeSet<_> = seen.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(names.len(), 20, "{seen:?}");
        assert!(
            seen.contains(&("cm-0".to_owned(), "2".to_owned())),
            "the change made while following: {seen:?}"
        );
    }

    // Lose the term (the Lease is deleted), change things while following,
    // lead again: the store saw every change.
    let leases = Api::<Lease>::namespaced(admin, &ns);
    leases.delete("lease", &DeleteParams::default()).await?;
    wait_until("the term ends", Duration::from_secs(10), || !elector.is_leader()).await?;
    seen.lock().expect("lock").clear();
    cms.create(&PostParams::default(), &configmap("cm-new", "1"))
        .await?;
    cms.delete("cm-1", &DeleteParams::default()).await?;
    let mut cm = cms.get("cm-2").await?;
    cm.data = Some(BTreeMap::from([("v".to_owned(), "3".to_owned())]));
    cms.replace("cm-2", &PostParams::default(), &cm).await?;
    // The candidate re-creates the Lease and leads after the creation hold.
    wait_until("leads again", Duration::from_secs(20), || elector.is_leader()).await?;
    wait_until(
        "every object reconciled in the new term",
        Duration::from_secs(10),
        || seen.lock().expect("lock").len() >= 20,
    )
    .await?;
    wait_until(
        "cm-new and cm-2's change reconciled in the new term",
        Duration::from_secs(10),
        || {
            let seen = seen.lock().expect("lock");
            seen.contains(&("cm-new".to_owned(), "1".to_owned()))
                && seen.contains(&("cm-2".to_owned(), "3".to_owned()))
        },
    )
    .await?;
    // An observation window: a late reconcile of the deleted cm-1 would show.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = seen.lock().expect("lock").clone();
    assert!(seen.contains(&("cm-new".to_owned(), "1".to_owned())), "{seen:?}");
    assert!(seen.contains(&("cm-2".to_owned(), "3".to_owned())), "{seen:?}");
    assert!(
        !seen.iter().any(|(n, _)| n == "cm-1"),
        "a deleted object was reconciled: {seen:?}"
    );

    elector
        .shutdown(Duration::from_secs(5))
        .await
        .context("shutdown")?;
    timeout(Duration::from_secs(10), running).await??;
    Ok(())
}
