//! Warm standby: every replica runs the controller's watches and keeps its
//! cache current, leader or not; only the leader reconciles. When a standby
//! wins the Lease it reconciles everything in its cache at once, with no
//! LIST: a failover costs the lease duration, not the lease duration plus a
//! full LIST and cache fill.
//!
//! `with_leader_election_warm` gates the reconciler by leadership and asks
//! for every object to be reconciled when a term begins; caches the
//! reconciler reads besides the controller's own (here, Secrets) are kept warm
//! the same way, by running their reflector outside the controller.
//!
//! ```sh
//! KUBECONFIG=... cargo run -p kube-runtime-lease-examples --example warm_standby
//! ```

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use kube_runtime_lease::{LeaderElectionControllerExt, LeaderElector};
use kube_runtime_lease_examples::{SHUTDOWN_GRACE, client, handover_on_signal, init_tracing, lease_config};
use tracing::info;

struct Ctx {
    secrets: Store<Secret>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let client = client().await?;
    let elector = LeaderElector::new(client.clone(), lease_config("warm-standby")?)?;

    // Always on, leader or standby: a cache the reconciler reads.
    let (secrets, writer) = reflector::store();
    let warm = watcher(Api::<Secret>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    tokio::spawn(warm.for_each(|_| async {}));
    secrets.wait_until_ready().await?;
    info!(cached = secrets.state().len(), "secret cache warm");

    // SIGTERM: finish reconciles in flight, release, exit.
    let handover = handover_on_signal(&elector, SHUTDOWN_GRACE);

    // The controller's own watch runs on every replica too; leadership gates
    // only its reconciles.
    Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
        .with_leader_election_warm(&elector)
        .run(
            |cm, ctx: Arc<Ctx>| async move {
                let ns = cm.namespace().unwrap_or_default();
                let secret = ctx.secrets.get(&ObjectRef::new(&cm.name_any()).within(&ns));
                info!(configmap = %cm.name_any(), has_secret = secret.is_some(), "reconciled from the warm cache");
                Ok::<_, kube::Error>(Action::await_change())
            },
            |_, _, _| Action::requeue(Duration::from_secs(5)),
            Arc::new(Ctx { secrets }),
        )
        .for_each(|_| async {})
        .await;
    // The warm Controller ends only when the elector is shut down: the
    // handover (the release) runs to its end before the process exits.
    handover.await??;
    Ok(())
}
