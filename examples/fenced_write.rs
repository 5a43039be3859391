//! Writes fenced by the term: a periodic job that appends to a `ConfigMap`
//! only while it leads, so that no write of an old term lands after a newer
//! term's, even when this process is paused or partitioned past its lease
//! (the pattern: `kube_runtime_lease_examples::ledger`).
//!
//! ```sh
//! KUBECONFIG=... cargo run -p kube-runtime-lease-examples --example fenced_write
//! ```

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube_runtime_lease::{LeaderElectionStreamExt, LeaderElector};
use kube_runtime_lease_examples::ledger::{Appended, append};
use kube_runtime_lease_examples::{client, exit_after_work, handover_on_signal, init_tracing, lease_config};
use tracing::{info, warn};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let config = lease_config("fenced-write")?;
    let identity = config.identity().to_owned();
    let client = client().await?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), config.namespace());
    let ledger = "fenced-write-ledger";
    let empty = ConfigMap {
        metadata: ObjectMeta {
            name: Some(ledger.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    match api.create(&PostParams::default(), &empty).await {
        Err(kube::Error::Api(status)) if status.code == 409 => {} // it exists
        created => drop(created?),
    }
    let elector = LeaderElector::new(client, config)?;
    // SIGTERM: no next write, the Lease is released; main awaits it.
    let handover = handover_on_signal(&elector, Duration::from_secs(5));
    let ticks = futures::stream::unfold(1u64, |n| async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Some((n, n + 1))
    })
    .take_until(elector.shutdown_requested());
    let mut guarded = std::pin::pin!(ticks.with_leader_election(&elector));
    while let Some(n) = guarded.next().await {
        // The guard of the term that handed out this item.
        let Some(guard) = guarded.guard() else { continue };
        match append(&api, ledger, guard, &format!("{identity} {n}")).await {
            Ok(Appended::Written { n }) => info!(n, token = guard.fencing_token(), "appended"),
            Ok(refused) => warn!(?refused, "not appended"),
            Err(e) => warn!(error = %e, "ledger write failed"),
        }
    }
    exit_after_work(guarded.lost(), handover).await
}
