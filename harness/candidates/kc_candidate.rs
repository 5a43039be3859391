//! A `k8s-controller` 0.15 `LeaderElection` candidate with the stdout protocol
//! of `candidate.rs` and `goelect`, for the benchmarks (built by `bench/`).
//!
//! Environment: `KUBECONFIG`, `LEASE_NAMESPACE`, `LEASE_NAME`, `IDENTITY`,
//! `LEASE_DURATION`, `RENEW_DEADLINE`, `RETRY_PERIOD` (seconds).
//!
//! ```text
//! READY <ns> <identity>
//! EVENT started-leading <ns> <identity>
//! EVENT stopped-leading <ns> <identity> <reason>
//! EXIT <ns>
//! ```
//!
//! `<ns>` is `CLOCK_MONOTONIC` in nanoseconds. k8s-controller has no leadership
//! observability, so there is no `new-leader` line. On SIGTERM (or EOF on stdin,
//! the parent-death watchdog) the guarded future is dropped and the Lease is
//! released with `LeaderElection::release`, as k8s-controller's docs advise.
//! When leadership is lost the candidate campaigns again.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_controller::LeaderElection;
use kube_runtime_lease_examples::env_seconds as secs;
use kube_runtime_lease_harness::now_ns as mono;
use kube_runtime_lease_harness::parent_exit::stdin_closed;

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// SIGTERM, Ctrl+C or (with `EXIT_ON_STDIN_EOF`) the driver's death.
async fn shutdown_signal() {
    tokio::select! {
        () = kube_runtime_lease_examples::shutdown_signal() => {}
        () = stdin_closed() => {}
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let namespace = std::env::var("LEASE_NAMESPACE").unwrap_or_else(|_| "default".into());
    let name = std::env::var("LEASE_NAME").unwrap_or_else(|_| "kc-candidate".into());
    let identity = std::env::var("IDENTITY")
        .unwrap_or_else(|_| format!("kc-{}", rustix::process::getpid().as_raw_nonzero()));
    let client = kube::Client::try_default().await?;
    // k8s-controller writes leaseDurationSeconds = lease_duration.as_secs()
    // (whole seconds, truncated); every other setting is a Duration.
    let election = LeaderElection::new(client, &namespace, &name, &identity)
        .with_lease_duration(secs("LEASE_DURATION", 15.0)?)
        .with_renew_deadline(secs("RENEW_DEADLINE", 10.0)?)
        .with_retry_period(secs("RETRY_PERIOD", 2.0)?);

    emit(&format!("READY {} {identity}", mono()));
    let mut shutdown = std::pin::pin!(shutdown_signal());
    loop {
        let leading = Arc::new(AtomicBool::new(false));
        let flag = leading.clone();
        let id = identity.clone();
        let work = async move {
            flag.store(true, Ordering::SeqCst);
            emit(&format!("EVENT started-leading {} {id}", mono()));
            std::future::pending::<()>().await;
        };
        tokio::select! {
            _ = election.with_lease(work) => {
                // with_lease returned None: leadership was lost. Campaign again.
                emit(&format!("EVENT stopped-leading {} {identity} lost", mono()));
            }
            () = &mut shutdown => {
                // The with_lease future (and the guarded work) is dropped here.
                if leading.load(Ordering::SeqCst) {
                    emit(&format!("EVENT stopped-leading {} {identity} shutdown", mono()));
                }
                if tokio::time::timeout(Duration::from_secs(5), election.release()).await.is_err() {
                    eprintln!("kc-candidate: release timed out");
                }
                emit(&format!("EXIT {}", mono()));
                return Ok(());
            }
        }
    }
}
