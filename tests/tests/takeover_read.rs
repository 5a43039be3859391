//! What a new leader's first reconcile reads: a cold guarded Controller
//! LISTs at the takeover, so it sees the old leader's last write (warm
//! standby reconciles from its store as it is: see `WarmController::run`).

mod support;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Result;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::PostParams,
    runtime::{Controller, controller::Action, watcher},
};
use kube_runtime_lease::{LeaderElectionControllerExt, LeaderElector};
use kube_runtime_lease_harness::shared_env;
use support::{configmap, fast_config, wait_until};
use tokio::time::{Instant, timeout};

type Seen = Arc<Mutex<Vec<(String, String)>>>;

fn v_of(cm: &ConfigMap) -> String {
    cm.data
        .as_ref()
        .and_then(|d| d.get("v"))
        .cloned()
        .unwrap_or_default()
}

/// The old leader writes `v: 2` and then hands the Lease over: a cold
/// guarded Controller's first reconcile reads `v: 2`, since its watch starts
/// (with a consistent LIST) only once the Lease is won.
#[tokio::test]
async fn a_cold_guarded_controller_reads_the_old_leaders_last_write_at_takeover() -> Result<()> {
    let env = shared_env().await?;
    let ns = env.new_namespace("cold-takeover").await?;
    let admin = env.client().await?;
    let cms = Api::<ConfigMap>::namespaced(admin.clone(), &ns);
    let cm = configmap("cm-0", "1");
    cms.create(&PostParams::default(), &cm).await?;
    let other = LeaderElector::new(env.client().await?, fast_config(&ns, "other"))?;
    let other_guard = timeout(Duration::from_secs(10), other.acquire()).await??;
    let elector = LeaderElector::new(env.client().await?, fast_config(&ns, "cold"))?;
    let seen: Seen = Arc::default();
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(env.client().await?, &ns),
        watcher::Config::default(),
    );
    let running = tokio::spawn({
        let (elector, seen) = (elector.clone(), seen.clone());
        async move {
            controller
                .with_leader_election(&elector)
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
    // The old leader's last write, then its handover.
    let mut cm = cms.get("cm-0").await?;
    cm.data = Some(BTreeMap::from([("v".to_owned(), "2".to_owned())]));
    cms.replace("cm-0", &PostParams::default(), &cm).await?;
    drop(other_guard);
    other.shutdown(Duration::from_secs(5)).await?;
    let handed = Instant::now();
    wait_until("the standby leads", Duration::from_secs(10), || {
        elector.is_leader()
    })
    .await?;
    let first = timeout(Duration::from_secs(15), async {
        loop {
            if let Some(first) = seen.lock().expect("lock").first().cloned() {
                return first;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let result = match first {
        Ok((name, v)) => {
            if v == "2" {
                Ok(())
            } else {
                Err(anyhow::anyhow!(
                    "the new leader reconciled {name} at v={v} {:?} after the handover, though v=2 was written before the old leader released the Lease a stale read",
                    handed.elapsed()
                ))
            }
        }
        Err(_) => Err(anyhow::anyhow!(
            "the new leader reconciled nothing within 15 s of the handover"
        )),
    };
    elector.shutdown(Duration::from_secs(5)).await?;
    timeout(Duration::from_secs(10), running).await??;
    result
}
