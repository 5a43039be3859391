//! Any stream of work, run only while leading: here, a periodic job.
//!
//! ```sh
//! KUBECONFIG=... cargo run -p kube-runtime-lease-examples --example stream
//! ```

use std::time::Duration;

use futures::StreamExt;
use kube_runtime_lease::{LeaderElectionStreamExt, LeaderElector};
use kube_runtime_lease_examples::{client, exit_after_work, handover_on_signal, init_tracing, lease_config};
use tracing::info;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let elector = LeaderElector::new(client().await?, lease_config("periodic-job")?)?;
    // SIGTERM: the job takes no next step, the Lease is released; main awaits it.
    let handover = handover_on_signal(&elector, Duration::from_secs(5));
    let job = futures::stream::unfold(0u64, |n| async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Some((n, n + 1))
    })
    // A stream ends when the shutdown begins (a Controller does so through
    // `graceful_shutdown_on`): its guard is dropped, not stopped, so the
    // Lease is released.
    .take_until(elector.shutdown_requested());
    let mut guarded = std::pin::pin!(job.with_leader_election(&elector));
    while let Some(n) = guarded.next().await {
        let token = guarded.guard().map(kube_runtime_lease::LeaseGuard::fencing_token);
        info!(n, ?token, "job step");
    }
    exit_after_work(guarded.lost(), handover).await
}
