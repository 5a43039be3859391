use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use kube::Client;
use kube_runtime_lease_harness::{Kind, LeaseRef, TestEnv, go_candidate, parse_line, rust_candidate};
use tokio::io::AsyncBufReadExt as _;
use tokio::sync::Notify;

use crate::impls::{Impl, Timing};

/// The candidate binaries, private copies of the ones built.
pub struct Bins {
    pub ours: PathBuf,
    pub goelect: PathBuf,
    pub kc: PathBuf,
}

/// What a candidate printed: (kind, CLOCK_MONOTONIC ns, who) in arrival order.
#[derive(Default)]
struct Printed {
    events: Vec<(Kind, u64, String)>,
    closed: bool,
}

pub struct Candidate {
    pub imp: Impl,
    pub id: String,
    pub pid: u32,
    child: tokio::process::Child,
    log: Arc<Mutex<Printed>>,
    notify: Arc<Notify>,
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
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr_log)?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true);
        // SAFETY: only an async-signal-safe prctl between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                    .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawning {} candidate", imp.name()))?;
        let pid = child.id().ok_or_else(|| anyhow!("no pid"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let log = Arc::new(Mutex::new(Printed::default()));
        let notify = Arc::new(Notify::new());
        {
            let log = log.clone();
            let notify = notify.clone();
            // Diagnostics: with KRL_BENCH_CANDIDATE_LOG set, the stdout lines
            // go to the stderr log too, marked with the candidate.
            let echo = std::env::var_os("KRL_BENCH_CANDIDATE_LOG")
                .is_some()
                .then(|| (self.stderr_log.clone(), id.to_owned()));
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some((path, id)) = &echo
                        && let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(path)
                    {
                        use std::io::Write as _;
                        let _ = writeln!(f, "[{id} stdout] {line}");
                    }
                    if let Some((kind, at, who, _)) = parse_line(&line) {
                        log.lock().unwrap().events.push((kind, at, who));
                        notify.notify_waiters();
                    }
                }
                log.lock().unwrap().closed = true;
                notify.notify_waiters();
            });
        }
        Ok(Candidate {
            imp,
            id: id.to_owned(),
            pid,
            child,
            log,
            notify,
        })
    }
}

impl Candidate {
    pub fn find(&self, kind: Kind) -> Option<u64> {
        self.log
            .lock()
            .unwrap()
            .events
            .iter()
            .find(|(k, _, _)| *k == kind)
            .map(|(_, t, _)| *t)
    }

    pub async fn wait_event(&self, kind: Kind, timeout: Duration) -> Result<u64> {
        self.wait_for(&format!("{kind:?}"), timeout, |lines| {
            lines.iter().find(|(k, _, _)| *k == kind).map(|(_, t, _)| *t)
        })
        .await
    }

    /// Waits until `ready` finds what it looks for in the lines printed so
    /// far (kind, CLOCK_MONOTONIC ns, who), or fails after `timeout`. `ready`
    /// runs under the log's lock: it must not call back into this candidate.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        ready: impl Fn(&[(Kind, u64, String)]) -> Option<T>,
    ) -> Result<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.notify.notified();
            {
                let log = self.log.lock().unwrap();
                if let Some(found) = ready(&log.events) {
                    return Ok(found);
                }
                if log.closed {
                    bail!("{} {} exited before {what}", self.imp.name(), self.id);
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                bail!("{} {}: no {what} within {timeout:?}", self.imp.name(), self.id);
            }
        }
    }

    pub fn signal(&self, sig: rustix::process::Signal) -> Result<()> {
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.pid)?).ok_or_else(|| anyhow!("pid 0"))?;
        rustix::process::kill_process(pid, sig)?;
        Ok(())
    }

    /// Waits for the process to exit (SIGKILL after `timeout`).
    pub async fn reap(&mut self, timeout: Duration) -> bool {
        if tokio::time::timeout(timeout, self.child.wait()).await.is_ok() {
            return true;
        }
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        false
    }

    pub async fn stop(mut self) {
        let _ = self.signal(rustix::process::Signal::TERM);
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
