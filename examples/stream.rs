//! Any stream of work, run only while leading: here, a periodic job.
//!
//! ```sh
//! KUBECONFIG=... cargo run -p kube-runtime-lease-examples --example stream
//! ```

use std::time::Duration;

use futures::StreamExt;
use kube_runtime_lease::{LeaderElectionStreamExt, LeaderElector};
use kube_runtime_lease_examples::{client, init_tracing, lease_config};
use tracing::info;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let elector = LeaderElector::new(client().await?, lease_config("periodic-job")?)?;
    let job = futures::stream::unfold(0u64, |n| async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Some((n, n + 1))
    });
    let mut guarded = std::pin::pin!(job.with_leader_election(&elector));
    while let Some(n) = guarded.next().await {
        let token = guarded.guard().map(kube_runtime_lease::LeaseGuard::fencing_token);
        info!(n, ?token, "job step");
    }
    if let Some(lost) = guarded.lost() {
        info!(%lost, "stopped: leadership lost");
    } else {
        info!("stopped: the job ended");
    }
    Ok(())
}
