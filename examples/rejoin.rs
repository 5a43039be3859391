//! Rejoin the election after every loss without restarting the process:
//! the guarded work is built again from a factory for each term.
//!
//! ```sh
//! KUBECONFIG=... cargo run -p kube-runtime-lease-examples --example rejoin
//! ```

use std::time::Duration;

use futures::StreamExt;
use kube_runtime_lease::LeaderElector;
use kube_runtime_lease_examples::{client, handover_on_signal, init_tracing, lease_config};
use tracing::info;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let elector = LeaderElector::new(client().await?, lease_config("rejoin")?)?;
    let handover = handover_on_signal(&elector, Duration::from_secs(5));
    let mut term = 0;
    let ended = elector
        .run_each_term(|| {
            term += 1;
            let this_term = term;
            info!(term = this_term, "campaigning");
            futures::stream::repeat(())
                .then(|()| tokio::time::sleep(Duration::from_secs(1)))
                .inspect(move |()| info!(term = this_term, "working"))
                // The work ends when the shutdown begins, so that it counts
                // as finished (not stopped) and the Lease is released.
                .take_until(elector.shutdown_requested())
        })
        .await;
    info!(?ended, "left the election");
    // The handover (the release) runs to its end before the process exits.
    handover.await??;
    Ok(())
}
