//! Two controllers under one Lease: one renewal loop, one set of API calls.
//! Acquiring starts both; losing stops both.
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
use kube_runtime_lease_examples::{client, init_tracing, lease_config, shutdown_signal};
use tracing::info;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let client = client().await?;
    let elector = LeaderElector::new(client.clone(), lease_config("two-controllers")?)?;

    let configmaps = Controller::new(Api::<ConfigMap>::all(client.clone()), watcher::Config::default())
        .with_leader_election(&elector)
        .run(
            |cm, _| async move {
                info!(configmap = %cm.name_any(), "reconciling configmap");
                Ok::<_, kube::Error>(Action::await_change())
            },
            |_, _, _| Action::requeue(Duration::from_secs(5)),
            Arc::new(()),
        );
    let secrets = Controller::new(Api::<Secret>::all(client.clone()), watcher::Config::default())
        .with_leader_election(&elector)
        .run(
            |s, _| async move {
                info!(secret = %s.name_any(), "reconciling secret");
                Ok::<_, kube::Error>(Action::await_change())
            },
            |_, _, _| Action::requeue(Duration::from_secs(5)),
            Arc::new(()),
        );

    let on_signal = elector.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.shutdown(Duration::from_secs(20)).await
    });

    let mut configmaps = std::pin::pin!(configmaps);
    let mut secrets = std::pin::pin!(secrets);
    let ((), ()) = futures::join!(
        configmaps.as_mut().for_each(|_| async {}),
        secrets.as_mut().for_each(|_| async {}),
    );
    info!(configmaps = ?configmaps.lost(), secrets = ?secrets.lost(), "both controllers stopped");
    Ok(())
}
