//! SIGTERM handover, step by step, each step bounded so that the whole fits
//! `LeaseConfig::shutdown_budget(GRACE)`, the figure for the pod's
//! `terminationGracePeriodSeconds` (47 s here; Kubernetes' default, 30 s, is
//! too short for it: `deploy/` sets 60 s):
//!
//! 1. SIGTERM arrives: `shutdown` stops campaigning and signals the controller
//!    (through `graceful_shutdown_on`) to take no new work;
//! 2. reconciles in flight finish, for up to `GRACE` (20 s);
//! 3. what still runs is aborted, and the Lease is released (bounded by the
//!    release timeout, 5 s), so that a standby takes over at once; a campaign
//!    whose requests were in flight when SIGTERM came is waited for too (two
//!    requests, each bounded by the renew deadline);
//! 4. the process exits.
//!
//! A loss of the Lease (taken over, renew deadline missed) ends the program
//! at once with an error, so that the pod restarts and campaigns again
//! (`examples/rejoin.rs` rejoins in process instead).
//!
//! ```sh
//! KUBECONFIG=... cargo run -p kube-runtime-lease-examples --example sigterm_handover
//! ```

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    runtime::{Controller, controller::Action, watcher},
};
use kube_runtime_lease::{LeaderElectionControllerExt, LeaderElector};
use kube_runtime_lease_examples::{
    SHUTDOWN_GRACE as GRACE, client, exit_after_work, init_tracing, lease_config, shutdown_signal,
};
use tracing::info;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let client = client().await?;
    let elector = LeaderElector::new(
        client.clone(),
        lease_config("sigterm-handover")?.release_timeout(Duration::from_secs(5)),
    )?;
    let controller = Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
        .with_leader_election(&elector)
        .run(
            |cm, _| async move {
                info!(configmap = %cm.name_any(), "reconciling (takes 3 s)");
                tokio::time::sleep(Duration::from_secs(3)).await;
                info!(configmap = %cm.name_any(), "reconciled");
                Ok::<_, kube::Error>(Action::await_change())
            },
            |_, _, _| Action::requeue(Duration::from_secs(5)),
            Arc::new(()),
        );
    let handover = {
        let elector = elector.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            let started = tokio::time::Instant::now();
            info!("SIGTERM: no new work; finishing reconciles in flight");
            let result = elector.shutdown(GRACE).await;
            info!(took = ?started.elapsed(), ?result, "handed over");
            result
        })
    };
    let mut controller = std::pin::pin!(controller);
    while controller.next().await.is_some() {}
    info!(lost = ?controller.lost(), "controller stopped");
    // After a shutdown, once the handover has run to its end; after any other
    // loss, an error at once: the pod restarts and campaigns again (waiting
    // for SIGTERM here would keep a replica up that never leads again).
    exit_after_work(controller.lost(), handover).await
}
