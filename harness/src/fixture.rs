//! [`Fixture`]: what every failover test needs.

use std::path::{Path, PathBuf};

use anyhow::Result;
use kube::Client;

use crate::TestEnv;
use crate::candidates::{candidate_bin, go_candidate, rust_candidate};
use crate::events::{EventLog, Flavor};
use crate::lease::{LeaseRecorder, LeaseRef, new_free_lease};
use crate::process::Process;
use crate::shared::shared_env;
use crate::timings::Timings;

/// What every failover test needs: the shared control plane, an admin
/// client, the candidate binaries and a scratch directory.
pub struct Fixture {
    /// The shared control plane ([`shared_env`]).
    pub env: &'static TestEnv,
    /// An admin client.
    pub client: Client,
    /// The Rust `candidate` binary.
    pub candidate: PathBuf,
    /// client-go's `goelect`.
    pub goelect: PathBuf,
    /// Scratch space (kubeconfigs), removed on drop.
    pub dir: tempfile::TempDir,
}

impl std::fmt::Debug for Fixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixture")
            .field("env", &self.env)
            .field("candidate", &self.candidate)
            .field("goelect", &self.goelect)
            .finish_non_exhaustive()
    }
}

impl Fixture {
    /// Starts (or reuses) the control plane and builds (or reuses) the
    /// candidate binary; prints how long that took.
    ///
    /// # Errors
    /// When either fails.
    pub async fn new() -> Result<Self> {
        let started = std::time::Instant::now();
        let env = shared_env().await?;
        let env_ready = started.elapsed();
        let candidate = candidate_bin().await?;
        println!(
            "setup: control plane {:.1} s, candidate binary {:.1} s",
            env_ready.as_secs_f64(),
            started.elapsed().saturating_sub(env_ready).as_secs_f64()
        );
        Ok(Self {
            env,
            client: env.client().await?,
            candidate,
            goelect: env.goelect_path().await?,
            dir: tempfile::Builder::new().prefix("failover-").tempdir()?,
        })
    }

    /// A fresh namespace with a free Lease ([`new_free_lease`]), watched by
    /// a [`LeaseRecorder`] into `log` (which [`check_log`](crate::check_log) then checks).
    ///
    /// # Errors
    /// When an API call fails or the watch does not start.
    pub async fn lease(&self, log: &EventLog, prefix: &str) -> Result<LeaseRecorder> {
        let lease = new_free_lease(self.env, &self.client, prefix).await?;
        LeaseRecorder::start(self.client.clone(), lease, log).await
    }

    /// A Rust candidate named `name` (also its identity) on `lease` with
    /// `timings`, talking to the apiserver directly, or through `kubeconfig`
    /// if given.
    ///
    /// # Errors
    /// When it cannot be spawned.
    pub fn spawn_rust(
        &self,
        log: &EventLog,
        lease: &LeaseRef,
        name: &str,
        timings: Timings,
        kubeconfig: Option<&Path>,
    ) -> Result<Process> {
        let kubeconfig = kubeconfig.unwrap_or_else(|| self.env.kubeconfig_path());
        Process::spawn(
            name,
            Flavor::Rust,
            rust_candidate(&self.candidate, kubeconfig, lease, name, timings),
            log,
        )
    }

    /// A Rust candidate in warm-standby mode (`CANDIDATE_MODE=warm`): a
    /// Controller of the `ConfigMaps` in the Lease's namespace, whose
    /// reconciles are its work, run only while it leads (see the candidate's
    /// docs).
    ///
    /// # Errors
    /// When it cannot be spawned.
    pub fn spawn_rust_warm(
        &self,
        log: &EventLog,
        lease: &LeaseRef,
        name: &str,
        timings: Timings,
    ) -> Result<Process> {
        let mut command = rust_candidate(&self.candidate, self.env.kubeconfig_path(), lease, name, timings);
        command.env("CANDIDATE_MODE", "warm");
        Process::spawn(name, Flavor::Rust, command, log)
    }

    /// A Rust candidate in sharded mode (`CANDIDATE_MODE=sharded`): one
    /// replica of a Controller of the `ConfigMaps` of `lease`'s namespace,
    /// sharded over `shards` shards whose Leases are named from `lease`'s
    /// name, talking to the apiserver directly or through `kubeconfig`; it
    /// prints `SHARDS` and `RECONCILE` lines ([`shards`](crate::shards)).
    /// Each reconcile works for 2 × 10 ms and is requeued after
    /// `WORK_INTERVAL_MS` (100).
    ///
    /// # Errors
    /// When it cannot be spawned.
    pub fn spawn_rust_sharded(
        &self,
        log: &EventLog,
        lease: &LeaseRef,
        name: &str,
        timings: Timings,
        shards: u16,
        kubeconfig: Option<&Path>,
    ) -> Result<Process> {
        let kubeconfig = kubeconfig.unwrap_or_else(|| self.env.kubeconfig_path());
        let mut command = rust_candidate(&self.candidate, kubeconfig, lease, name, timings);
        command
            .env("CANDIDATE_MODE", "sharded")
            .env("SHARDS", shards.to_string())
            .env("WORK_INTERVAL_MS", "100");
        Process::spawn(name, Flavor::Rust, command, log)
    }

    /// A candidate of `flavor` in Coordinated Leader Election, binary
    /// version 1.37.0 emulating `emulation` (the Rust candidate's
    /// `COORDINATED_*` variables; goelect's `--coordinated`, which campaigns
    /// again after each term, as a coordinated candidate must).
    ///
    /// # Errors
    /// When it cannot be spawned.
    pub fn spawn_coordinated(
        &self,
        flavor: Flavor,
        log: &EventLog,
        lease: &LeaseRef,
        name: &str,
        timings: Timings,
        emulation: &str,
    ) -> Result<Process> {
        let command = match flavor {
            Flavor::Go => {
                let mut c = go_candidate(&self.goelect, self.env.kubeconfig_path(), lease, name, timings);
                c.args([
                    "--coordinated",
                    "--rejoin",
                    "--binary-version=1.37.0",
                    &format!("--emulation-version={emulation}"),
                ]);
                c
            }
            Flavor::Rust => {
                let mut c = rust_candidate(&self.candidate, self.env.kubeconfig_path(), lease, name, timings);
                c.env("COORDINATED_BINARY_VERSION", "1.37.0")
                    .env("COORDINATED_EMULATION_VERSION", emulation);
                c
            }
        };
        Process::spawn(name, flavor, command, log)
    }

    /// A client-go candidate (`goelect`) named `name` (also its identity) on
    /// `lease` with `timings`, talking to the apiserver directly.
    ///
    /// # Errors
    /// When it cannot be spawned.
    pub fn spawn_go(
        &self,
        log: &EventLog,
        lease: &LeaseRef,
        name: &str,
        timings: Timings,
    ) -> Result<Process> {
        Process::spawn(
            name,
            Flavor::Go,
            go_candidate(&self.goelect, self.env.kubeconfig_path(), lease, name, timings),
            log,
        )
    }
}
