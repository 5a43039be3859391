//! Elected shards (the `unstable-shards` feature; experimental): one
//! `ConfigMap` controller across several replicas, each of `SHARDS` shards
//! (default 12) behind its own Lease. Every replica watches every `ConfigMap`;
//! each `ConfigMap` is reconciled only by the replica holding its shard
//! (FNV-1a over its UID), and a reconcile knows its shard and that term's
//! fencing token. Start more replicas and they share the shards (within one
//! of each other); stop one with SIGTERM and the others take its shards at
//! once; kill one and they take them after the lease duration.
//!
//! ```sh
//! KUBECONFIG=... cargo run -p kube-runtime-lease-examples --example sharded
//! ```
//!
//! `deploy/sharded.yaml` runs three replicas (with the RBAC of `deploy/rbac.yaml`).

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    runtime::{Controller, controller::Action, watcher},
};
use kube_runtime_lease::shard::{ShardConfig, ShardedElector, current_shard};
use kube_runtime_lease_examples::{
    SHUTDOWN_GRACE, client, env_count, error_policy, init_tracing, lease_config, shutdown_signal,
};
use tracing::info;

async fn reconcile(cm: Arc<ConfigMap>, _ctx: Arc<()>) -> Result<Action, kube::Error> {
    // Write `fencing_token` beside the reconcile's side effects, so that a
    // reader can reject an older term's writes.
    let current = current_shard();
    info!(
        configmap = %cm.name_any(),
        shard = ?current.map(|c| c.shard),
        fencing_token = ?current.map(|c| c.fencing_token),
        "reconciling"
    );
    Ok(Action::requeue(Duration::from_secs(300)))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let client = client().await?;
    let shards = env_count("SHARDS", 12)?;
    let config = ShardConfig::new(lease_config("sharded-controller")?, shards);
    let sharded = ShardedElector::new(client.clone(), config)?;

    // Which shards this replica holds, and every change.
    let mut held = sharded.held();
    tokio::spawn(async move {
        while held.changed().await.is_ok() {
            let now = held.borrow_and_update().clone();
            info!(count = now.len(), shards = ?now, "holding");
        }
    });

    // SIGTERM: hand every shard over (reconciles in flight finish within 20 s).
    let on_signal = sharded.clone();
    let handover = tokio::spawn(async move {
        shutdown_signal().await;
        info!("SIGTERM: handing the shards over");
        on_signal.shutdown(SHUTDOWN_GRACE).await;
    });

    let controller = Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default());
    let run = sharded
        .controller(controller)
        .run(reconcile, error_policy, Arc::new(()))
        .for_each(|_| async {});
    tokio::select! {
        () = run => {}
        _ = handover => {}
    }
    Ok(())
}
