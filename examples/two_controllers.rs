//! Two controllers under one Lease: one renewal loop, one set of API calls.
//! Acquiring starts both; losing stops both, and both run again when the
//! Lease is won again. On SIGTERM the process exits after the handover.
//!
//! ```sh
//! KUBECONFIG=... cargo run -p kube-runtime-lease-examples --example two_controllers
//! ```

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, ResourceExt,
    runtime::{Controller, controller::Action, watcher},
};
use kube_runtime_lease::{LeaderElectionControllerExt, LeaderElector};
use kube_runtime_lease_examples::{SHUTDOWN_GRACE, client, handover_on_signal, init_tracing, lease_config};
use tracing::info;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let client = client().await?;
    let elector = LeaderElector::new(client.clone(), lease_config("two-controllers")?)?;

    // SIGTERM: finish reconciles in flight (up to 20 s), release; main awaits it.
    let handover = handover_on_signal(&elector, SHUTDOWN_GRACE);

    // Both controllers run while this replica leads, and are built again for
    // each term: a loss stops both, and they rejoin the election together.
    let ended = elector
        .run_each_term(|| {
            let configmaps =
                Controller::new(Api::<ConfigMap>::all(client.clone()), watcher::Config::default())
                    .with_leader_election(&elector)
                    .run(
                        |cm, _| async move {
                            info!(configmap = %cm.name_any(), "reconciling configmap");
                            Ok::<_, kube::Error>(Action::await_change())
                        },
                        |_, _, _| Action::requeue(Duration::from_secs(5)),
                        Arc::new(()),
                    )
                    .map(drop);
            let secrets = Controller::new(Api::<Secret>::all(client.clone()), watcher::Config::default())
                .with_leader_election(&elector)
                .run(
                    |s, _| async move {
                        info!(secret = %s.name_any(), "reconciling secret");
                        Ok::<_, kube::Error>(Action::await_change())
                    },
                    |_, _, _| Action::requeue(Duration::from_secs(5)),
                    Arc::new(()),
                )
                .map(drop);
            futures::stream::select(configmaps, secrets)
        })
        .await;
    info!(?ended, "both controllers stopped; election left");
    // The handover (the release) has run to its end before the process exits.
    handover.await??;
    Ok(())
}
