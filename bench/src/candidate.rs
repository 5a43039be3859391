use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use kube::Client;
use kube_runtime_lease_harness::{
    Entry, EventLog, Flavor, Kind, LeaseRef, Outputs, Process, Sig, TestEnv, go_candidate, rust_candidate,
};

use crate::impls::{Impl, Timing};

/// The candidate binaries, private copies of the ones built.
pub struct Bins {
    pub ours: PathBuf,
    pub goelect: PathBuf,
    pub kc: PathBuf,
}

/// A candidate process: a harness [`Process`] with a log of its own.
pub struct Candidate {
    pub imp: Impl,
    pub id: String,
    pub pid: u32,
    process: Process,
    log: EventLog,
}

/// What every scenario needs: the control plane, an admin client, the
/// candidates and where their stderr goes.
pub struct Ctx {
    pub env: TestEnv,
    pub client: Client,
    pub bins: Bins,
    pub stderr_log: PathBuf,
}

impl Ctx {
    pub fn spawn(&self, imp: Impl, ns: &str, lease: &str, id: &str, t: Timing) -> Result<Candidate> {
        self.spawn_env(imp, ns, lease, id, t, &[])
    }

    /// [`Ctx::spawn`] with more environment for the candidate (`CANDIDATE_MODE`).
    pub fn spawn_env(
        &self,
        imp: Impl,
        ns: &str,
        lease: &str,
        id: &str,
        t: Timing,
        env: &[(&str, &str)],
    ) -> Result<Candidate> {
        let kubeconfig = self.env.kubeconfig_path();
        let lease = LeaseRef {
            namespace: ns.to_owned(),
            name: lease.to_owned(),
        };
        let mut cmd = match imp {
            Impl::Ours | Impl::OursKubeDefault | Impl::K8sController => {
                let bin = if imp == Impl::K8sController {
                    &self.bins.kc
                } else {
                    &self.bins.ours
                };
                let mut c = rust_candidate(bin, kubeconfig, &lease, id, t.timings());
                // The example candidate's guarded work: once per term only,
                // so that every implementation is equally idle.
                c.env("WORK_INTERVAL_MS", "86400000")
                    .env("EXIT_ON_STDIN_EOF", "1")
                    .env_remove("RUST_LOG")
                    .env_remove("NO_COLOR");
                if imp == Impl::OursKubeDefault {
                    c.env("KUBE_TCP_NODELAY", "0");
                }
                // Diagnostics: KRL_BENCH_CANDIDATE_LOG becomes the candidates' RUST_LOG
                // (their stderr goes to results/logs/).
                if let Ok(filter) = std::env::var("KRL_BENCH_CANDIDATE_LOG") {
                    c.env("RUST_LOG", filter);
                }
                c
            }
            Impl::ClientGo => go_candidate(&self.bins.goelect, kubeconfig, &lease, id, t.timings()),
        };
        cmd.envs(env.iter().copied());
        let flavor = if imp == Impl::ClientGo {
            Flavor::Go
        } else {
            Flavor::Rust
        };
        let log = EventLog::new();
        let process = self
            .spawn_into(&log, id, flavor, cmd)
            .with_context(|| format!("spawning {} candidate", imp.name()))?;
        Ok(Candidate {
            imp,
            id: id.to_owned(),
            pid: process.pid(),
            process,
            log,
        })
    }

    /// Our candidate named `id` on the Lease (or sharded election) `lease` of
    /// `ns`, with more environment, its lines going into the shared `log`:
    /// for scenarios that judge several candidates in one log.
    pub fn spawn_process(
        &self,
        log: &EventLog,
        ns: &str,
        lease: &str,
        id: &str,
        timings: kube_runtime_lease_harness::Timings,
        env: &[(&str, String)],
    ) -> Result<Process> {
        let lease = LeaseRef {
            namespace: ns.to_owned(),
            name: lease.to_owned(),
        };
        let mut cmd = rust_candidate(&self.bins.ours, self.env.kubeconfig_path(), &lease, id, timings);
        cmd.env("EXIT_ON_STDIN_EOF", "1")
            .env_remove("RUST_LOG")
            .env_remove("NO_COLOR");
        if let Ok(filter) = std::env::var("KRL_BENCH_CANDIDATE_LOG") {
            cmd.env("RUST_LOG", filter);
        }
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        self.spawn_into(log, id, Flavor::Rust, cmd)
            .context("spawning our candidate")
    }

    /// Spawns `cmd` as `id` into `log`: killed with the driver, its stderr
    /// into the candidates' stderr log.
    fn spawn_into(
        &self,
        log: &EventLog,
        id: &str,
        flavor: Flavor,
        mut cmd: tokio::process::Command,
    ) -> Result<Process> {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr_log)?;
        // SAFETY: only an async-signal-safe prctl between fork and exec. (It
        // stays here, on the command given to the harness: pre_exec is unsafe,
        // and the harness forbids unsafe code.)
        unsafe {
            cmd.pre_exec(|| {
                rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                    .map_err(std::io::Error::from)
            });
        }
        let outputs = Outputs {
            stderr_to: Some(stderr),
            // Diagnostics: with KRL_BENCH_CANDIDATE_LOG set, the stdout lines
            // go to the stderr log too, marked with the candidate.
            copy_stdout_to: std::env::var_os("KRL_BENCH_CANDIDATE_LOG")
                .is_some()
                .then(|| self.stderr_log.clone()),
        };
        Process::spawn_with(id, flavor, cmd, log, outputs)
    }
}

impl Candidate {
    /// When it first printed a line of `kind`, if it did yet.
    pub fn find(&self, kind: Kind) -> Option<u64> {
        self.log.find(|e| e.kind == kind).map(|e| e.at)
    }

    pub async fn wait_event(&self, kind: Kind, timeout: Duration) -> Result<u64> {
        self.wait_for(&format!("{kind:?}"), timeout, |lines| {
            lines.iter().find(|e| e.kind == kind).map(|e| e.at)
        })
        .await
    }

    /// Waits until `ready` finds what it looks for in its log so far (the
    /// lines it printed, stamped with CLOCK_MONOTONIC ns, and what the driver
    /// did to it), or fails after `timeout` or when its stdout closes first.
    /// `ready` runs under the log's lock: it must not call back into this
    /// candidate.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        ready: impl Fn(&[Entry]) -> Option<T>,
    ) -> Result<T> {
        let (imp, id) = (self.imp.name(), &self.id);
        self.log
            .wait_until(&format!("{imp} {id}: {what}"), timeout, |lines| {
                if let Some(found) = ready(lines) {
                    return Some(Ok(found));
                }
                lines
                    .iter()
                    .any(|e| e.kind == Kind::StdoutClosed)
                    .then(|| Err(anyhow!("{imp} {id} exited before {what}")))
            })
            .await?
    }

    /// Sends `sig` (recorded in its log).
    pub fn signal(&self, sig: Sig) -> Result<()> {
        self.process.signal(sig)?;
        Ok(())
    }

    /// Waits for the process to exit (SIGKILL after `timeout`); whether it
    /// exited on its own.
    pub async fn reap(&mut self, timeout: Duration) -> bool {
        self.process.reap(timeout).await.unwrap_or(false)
    }

    pub async fn stop(mut self) {
        let _ = self.signal(Sig::Term);
        self.reap(Duration::from_secs(10)).await;
    }

    /// utime + stime in ms, and VmRSS in KiB, from /proc.
    pub fn cpu_rss(&self) -> Result<(f64, u64)> {
        proc_cpu_rss(self.pid)
    }
}

pub fn proc_cpu_rss(pid: u32) -> Result<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name "(...)": state is field 3; utime 14, stime 15.
    let rest = stat.rsplit_once(')').ok_or_else(|| anyhow!("bad stat"))?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f[11].parse()?;
    let stime: u64 = f[12].parse()?;
    let hz = rustix::param::clock_ticks_per_second() as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok(((utime + stime) as f64 * 1000.0 / hz, rss))
}

/// On-CPU time in ms of every live thread, from /proc/<pid>/task/*/schedstat
/// (nanosecond resolution; a thread that exits takes its time with it).
pub fn proc_sched_ms(pid: u32) -> f64 {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return f64::NAN;
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()))
        .sum::<f64>()
        / 1e6
}
