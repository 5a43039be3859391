//! Any stream of work, run only while leading: here, a periodic job.
//!
//! ```sh
//! KUBECONFIG=... cargo run -p kube-runtime-lease-examples --example stream
//! ```

use std::time::Duration;

use futures::StreamExt;
use kube_runtime_lease::{LeaderElectionStreamExt, LeaderElector, Lost};
use kube_runtime_lease_examples::{client, init_tracing, lease_config, shutdown_signal};
use tracing::info;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let elector = LeaderElector::new(client().await?, lease_config("periodic-job")?)?;
    // SIGTERM: the job takes no next step, the Lease is released; main awaits it.
    let on_signal = elector.clone();
    let handover = tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.shutdown(Duration::from_secs(5)).await
    });
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
    match guarded.lost() {
        // Shut down: the job ended when the shutdown began; the handover ran.
        None | Some(Lost::Shutdown) => {
            handover.await??;
            info!("stopped: shut down, lease handed over");
            Ok(())
        }
        // Leadership lost: exit non-zero (a pod restarts and campaigns again;
        // `run_each_term` would rejoin in process).
        Some(lost) => {
            info!(%lost, "stopped: leadership lost");
            Err(lost.into())
        }
    }
}
