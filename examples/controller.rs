//! A `ConfigMap` controller that reconciles only while it leads.
//!
//! Run several replicas against one cluster; one reconciles, the others
//! stand by. Kill the leader and a standby takes over after the lease
//! duration; send it SIGTERM and it hands over at once.
//!
//! It serves Kubernetes probes on `PROBE_ADDR` (default `0.0.0.0:8080`):
//! `/livez` fails when this replica believes it leads but its renewals are
//! overdue, or has heard nothing from the API server for 5 minutes, and
//! `/readyz` is ready always, or only while leading with
//! `READY_WHEN=leading` (see `probes.rs`; `deploy/deployment.yaml` wires both).
//! With `WARM=1` it runs in warm standby (`with_leader_election_warm`); with
//! `EVENTS=1` it publishes its transitions as Events on the Lease; with
//! `LEADER_ELECT=false` it runs no election at all (the off switch: it leads
//! at once and needs no Lease permission); `POD_NAME` and `NODE_NAME` are
//! written on the Lease by its holder (see `common.rs` for every variable).
//!
//! ```sh
//! KUBECONFIG=... cargo run -p kube-runtime-lease-examples --example controller
//! ```

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    runtime::{Controller, controller::Action, events::Reporter, watcher},
};
use kube_runtime_lease::{LeaderElectionControllerExt, LeaderElector};
use kube_runtime_lease_examples::{
    SHUTDOWN_GRACE, client, error_policy, init_tracing, lease_config,
    probes::{self, Readiness},
    shutdown_signal,
};
use tracing::{info, warn};

async fn reconcile(cm: Arc<ConfigMap>, _ctx: Arc<()>) -> Result<Action, kube::Error> {
    info!(configmap = %cm.name_any(), namespace = cm.namespace().unwrap_or_default(), "reconciling");
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(Action::requeue(Duration::from_secs(300)))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let client = client().await?;
    let config = lease_config("configmap-controller")?;
    info!(identity = config.identity(), "starting");
    let mut elector = LeaderElector::new(client.clone(), config)?;
    // EVENTS=1: "became leader" / "stopped leading" as Events on the Lease.
    if std::env::var("EVENTS").as_deref() == Ok("1") {
        elector = elector.with_events(Reporter {
            controller: "configmap-controller".into(),
            instance: std::env::var("POD_NAME").ok(),
        });
    }

    // Show who leads, and every change.
    let mut status = elector.subscribe();
    tokio::spawn(async move {
        while status.changed().await.is_ok() {
            let s = status.borrow_and_update().clone();
            info!(
                leading = s.is_leader,
                holder = s.holder.as_deref().unwrap_or("<none>"),
                "leadership"
            );
        }
    });

    // Probes: /livez (a stuck leader is restarted), /readyz.
    let addr = std::env::var("PROBE_ADDR").unwrap_or_else(|_| "0.0.0.0:8080".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    info!(%addr, "serving /livez and /readyz");
    tokio::spawn(probes::serve(listener, elector.clone(), Readiness::from_env()));

    // SIGTERM: finish reconciles in flight (up to 20 s), release, exit.
    let on_signal = elector.clone();
    let handover = tokio::spawn(async move {
        shutdown_signal().await;
        info!("SIGTERM: handing over");
        on_signal.shutdown(SHUTDOWN_GRACE).await
    });

    // WARM=1: warm standby, the watch and its store run on every replica.
    if std::env::var("WARM").as_deref() == Ok("1") {
        info!("warm standby: watching on every replica, reconciling only while leading");
        Controller::new(Api::<ConfigMap>::all(client.clone()), watcher::Config::default())
            .with_leader_election_warm(&elector)
            .run(reconcile, error_policy, Arc::new(()))
            .for_each(|_| async {})
            .await;
        if let Ok(result) = handover.await {
            result?;
        }
        return Ok(());
    }

    // Lead, and lead again after a loss, until shut down.
    let ended = elector
        .run_each_term(|| {
            Controller::new(Api::<ConfigMap>::all(client.clone()), watcher::Config::default())
                .with_leader_election(&elector)
                .run(reconcile, error_policy, Arc::new(()))
                .inspect(|result| {
                    if let Err(e) = result {
                        warn!(error = %e, "controller error");
                    }
                })
        })
        .await;
    info!(?ended, "election left");
    if let Ok(result) = handover.await {
        result?;
    }
    Ok(())
}
