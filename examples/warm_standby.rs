//! Warm standby: every replica keeps the caches its reconciler reads filled,
//! leader or not, so that a new leader reconciles without waiting for a list.
//!
//! The reflector for Secrets runs outside the guarded stream, on every
//! replica; only the controller is guarded. The reconciler reads Secrets from
//! the warm store instead of the API. (kube-runtime's
//! `Controller::for_shared_stream`, behind its `unstable-runtime-subscribe`
//! feature, extends the same idea to the controller's own watch.)
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
use kube_runtime_lease_examples::{client, init_tracing, lease_config};
use tracing::info;

struct Ctx {
    secrets: Store<Secret>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let client = client().await?;
    let elector = LeaderElector::new(client.clone(), lease_config("warm-standby")?)?;

    // Always on, leader or standby: the Secret cache.
    let (secrets, writer) = reflector::store();
    let warm = watcher(Api::<Secret>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    tokio::spawn(warm.for_each(|_| async {}));
    secrets.wait_until_ready().await?;
    info!(cached = secrets.state().len(), "secret cache warm");

    let controller = Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
        .with_leader_election(&elector)
        .run(
            |cm, ctx: Arc<Ctx>| async move {
                let ns = cm.namespace().unwrap_or_default();
                let secret = ctx.secrets.get(&ObjectRef::new(&cm.name_any()).within(&ns));
                info!(configmap = %cm.name_any(), has_secret = secret.is_some(), "reconciled from the warm cache");
                Ok::<_, kube::Error>(Action::await_change())
            },
            |_, _, _| Action::requeue(Duration::from_secs(5)),
            Arc::new(Ctx { secrets }),
        );
    controller.for_each(|_| async {}).await;
    Ok(())
}
