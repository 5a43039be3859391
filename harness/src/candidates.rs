//! The candidate processes' command lines: the Rust `candidate` binary
//! (`harness/candidates/candidate.rs`, built on demand) and client-go's
//! `goelect` (`harness/go/cmd/goelect`, built with the control plane).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context as _, Result, anyhow};
use tokio::process::Command;

use crate::cargo::Target;
use crate::lease::LeaseRef;
use crate::timings::Timings;

/// The package of the Rust `candidate` binary.
pub const CANDIDATE_PACKAGE: &str = "kube-runtime-lease-candidate";

/// The path of the Rust `candidate` binary, built once per test process with
/// `cargo build -p kube-runtime-lease-candidate --bin candidate`.
///
/// Blocks while cargo runs: call [`candidate_bin`] from async code.
///
/// # Errors
/// When the build fails (the message holds cargo's last lines).
pub fn candidate_path() -> Result<PathBuf> {
    static PATH: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        crate::cargo::build(CANDIDATE_PACKAGE, Target::Bin("candidate"), false).map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// [`candidate_path`] on a blocking thread.
///
/// # Errors
/// As [`candidate_path`].
pub async fn candidate_bin() -> Result<PathBuf> {
    tokio::task::spawn_blocking(candidate_path)
        .await
        .context("the build task panicked")?
}

/// The command line of a Rust candidate (`candidate` binary) for `lease`,
/// named `identity`, with `timings`, talking to the cluster of `kubeconfig`.
/// Its stderr carries its `info` logs (they land in the event log).
#[must_use]
pub fn rust_candidate(
    bin: &Path,
    kubeconfig: &Path,
    lease: &LeaseRef,
    identity: &str,
    timings: Timings,
) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env("KUBECONFIG", kubeconfig)
        .env("LEASE_NAMESPACE", &lease.namespace)
        .env("LEASE_NAME", &lease.name)
        .env("LEASE_DURATION", timings.lease_duration.as_secs_f64().to_string())
        .env("RENEW_DEADLINE", timings.renew_deadline.as_secs_f64().to_string())
        .env("RETRY_PERIOD", timings.retry_period.as_secs_f64().to_string())
        .env("IDENTITY", identity)
        .env("WORK_INTERVAL_MS", "50")
        .env("RUST_LOG", "info,kube_runtime_lease=debug")
        .env("NO_COLOR", "1");
    cmd
}

/// The command line of a client-go candidate (`goelect`), like
/// [`rust_candidate`]. It releases on SIGTERM and exits when its stdin closes.
#[must_use]
pub fn go_candidate(
    bin: &Path,
    kubeconfig: &Path,
    lease: &LeaseRef,
    identity: &str,
    timings: Timings,
) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--namespace={}", lease.namespace))
        .arg(format!("--name={}", lease.name))
        .arg(format!("--identity={identity}"))
        .arg(format!(
            "--lease-duration={}ms",
            timings.lease_duration.as_millis()
        ))
        .arg(format!(
            "--renew-deadline={}ms",
            timings.renew_deadline.as_millis()
        ))
        .arg(format!("--retry-period={}ms", timings.retry_period.as_millis()))
        .arg("--release-on-cancel=true")
        .arg("--exit-on-stdin-eof");
    cmd
}
