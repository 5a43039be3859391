//! Benchmark driver: kube-runtime-lease side by side with client-go's
//! leaderelection (`goelect`) and k8s-controller 0.15 (`kc-candidate`), against
//! one real etcd + kube-apiserver started by `kube-runtime-lease-harness`.
//!
//! ```text
//! bench-driver run [--quick] [--only handover,failover,api] [--trials N] [--out DIR]
//!                  [--ours-bin PATH] [--benchmarks-md PATH]
//! bench-driver report [--out DIR] [--benchmarks-md PATH]
//! ```
//!
//! `run` writes raw results (`handover.json`, `failover.json`, `api_load.json`,
//! `idle.json`, `meta-*.json`) under `--out` (default `bench/results`), then
//! does what `report` does: `summary.md`, `failover.svg`, and the tables of
//! `BENCHMARKS.md` between its `<!-- BEGIN RESULTS -->` / `<!-- END RESULTS -->`
//! markers. A run with `--only` rewrites only the files of those scenarios.
//! `BENCHMARKS.md` is only touched when `--out` is the default or
//! `--benchmarks-md` names it.

mod report;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use kube_runtime_lease_harness::TestEnv;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt as _;
use tokio::sync::Notify;

/// `CLOCK_MONOTONIC` in nanoseconds, as the candidates print it.
pub fn mono() -> u128 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u128::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u128::try_from(ts.tv_nsec).unwrap_or(0)
}

fn ms_between(from: u128, to: u128) -> f64 {
    (to as f64 - from as f64) / 1e6
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Impl {
    #[serde(rename = "kube-runtime-lease")]
    Ours,
    #[serde(rename = "client-go")]
    ClientGo,
    #[serde(rename = "k8s-controller")]
    K8sController,
    /// Our candidate on kube's default client (`KUBE_TCP_NODELAY=0`): Nagle
    /// on, as kube-client 5 leaves it. Handover only.
    #[serde(rename = "kube-runtime-lease, kube default client")]
    OursKubeDefault,
}

pub const IMPLS: [Impl; 3] = [Impl::Ours, Impl::ClientGo, Impl::K8sController];
/// The handover scenario also runs our candidate on kube's default client,
/// to show what TCP_NODELAY is worth (see BENCHMARKS.md).
pub const HANDOVER_IMPLS: [Impl; 4] = [
    Impl::Ours,
    Impl::OursKubeDefault,
    Impl::ClientGo,
    Impl::K8sController,
];

impl Impl {
    pub fn name(self) -> &'static str {
        match self {
            Impl::Ours => "kube-runtime-lease",
            Impl::ClientGo => "client-go",
            Impl::K8sController => "k8s-controller",
            Impl::OursKubeDefault => "kube-runtime-lease, kube default client",
        }
    }
    fn short(self) -> &'static str {
        match self {
            Impl::Ours => "krl",
            Impl::ClientGo => "go",
            Impl::K8sController => "kc",
            Impl::OursKubeDefault => "krl-dflt",
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Timing {
    pub name: &'static str,
    pub lease_ms: u64,
    pub renew_ms: u64,
    pub retry_ms: u64,
}

pub const TIMINGS: [Timing; 2] = [
    Timing {
        name: "15/10/2",
        lease_ms: 15_000,
        renew_ms: 10_000,
        retry_ms: 2_000,
    },
    Timing {
        name: "2/1.5/0.5",
        lease_ms: 2_000,
        renew_ms: 1_500,
        retry_ms: 500,
    },
];

impl Timing {
    fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
    fn retry(&self) -> Duration {
        Duration::from_millis(self.retry_ms)
    }
}

// ---------------------------------------------------------------------------
// Candidate processes

struct Bins {
    ours: PathBuf,
    goelect: PathBuf,
    kc: PathBuf,
}

#[derive(Default)]
struct EventLog {
    /// (kind, CLOCK_MONOTONIC ns) in arrival order; kind is READY, EXIT or the EVENT kind.
    events: Vec<(String, u128)>,
    closed: bool,
}

struct Candidate {
    imp: Impl,
    id: String,
    pid: u32,
    child: tokio::process::Child,
    log: Arc<Mutex<EventLog>>,
    notify: Arc<Notify>,
}

struct Ctx {
    env: TestEnv,
    client: Client,
    bins: Bins,
    stderr_log: PathBuf,
}

impl Ctx {
    fn spawn(&self, imp: Impl, ns: &str, lease: &str, id: &str, t: Timing) -> Result<Candidate> {
        let secs = |ms: u64| format!("{}", ms as f64 / 1000.0);
        let mut cmd = match imp {
            Impl::Ours | Impl::OursKubeDefault | Impl::K8sController => {
                let bin = if imp == Impl::K8sController {
                    &self.bins.kc
                } else {
                    &self.bins.ours
                };
                let mut c = tokio::process::Command::new(bin);
                c.env("KUBECONFIG", self.env.kubeconfig_path())
                    .env("LEASE_NAMESPACE", ns)
                    .env("LEASE_NAME", lease)
                    .env("IDENTITY", id)
                    .env("LEASE_DURATION", secs(t.lease_ms))
                    .env("RENEW_DEADLINE", secs(t.renew_ms))
                    .env("RETRY_PERIOD", secs(t.retry_ms))
                    // The example candidate's guarded work: once per term only,
                    // so that every implementation is equally idle.
                    .env("WORK_INTERVAL_MS", "86400000")
                    .env("EXIT_ON_STDIN_EOF", "1")
                    .env_remove("RUST_LOG");
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
            Impl::ClientGo => {
                let mut c = tokio::process::Command::new(&self.bins.goelect);
                c.arg(format!("--kubeconfig={}", self.env.kubeconfig_path().display()))
                    .arg(format!("--namespace={ns}"))
                    .arg(format!("--name={lease}"))
                    .arg(format!("--identity={id}"))
                    .arg(format!("--lease-duration={}ms", t.lease_ms))
                    .arg(format!("--renew-deadline={}ms", t.renew_ms))
                    .arg(format!("--retry-period={}ms", t.retry_ms))
                    .arg("--exit-on-stdin-eof");
                c
            }
        };
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
        let log = Arc::new(Mutex::new(EventLog::default()));
        let notify = Arc::new(Notify::new());
        {
            let log = log.clone();
            let notify = notify.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let parsed = match f.as_slice() {
                        ["READY", ns, ..] => Some(("READY".to_owned(), ns)),
                        ["EXIT", ns, ..] => Some(("EXIT".to_owned(), ns)),
                        ["EVENT", kind, ns, ..] => Some(((*kind).to_owned(), ns)),
                        _ => None,
                    };
                    if let Some((kind, ns)) = parsed
                        && let Ok(ns) = ns.parse::<u128>()
                    {
                        log.lock().unwrap().events.push((kind, ns));
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
    fn find(&self, kind: &str) -> Option<u128> {
        self.log
            .lock()
            .unwrap()
            .events
            .iter()
            .find(|(k, _)| k == kind)
            .map(|(_, t)| *t)
    }

    async fn wait_event(&self, kind: &str, timeout: Duration) -> Result<u128> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.notify.notified();
            if let Some(t) = self.find(kind) {
                return Ok(t);
            }
            if self.log.lock().unwrap().closed {
                bail!("{} {} exited before {kind}", self.imp.name(), self.id);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                bail!("{} {}: no {kind} within {timeout:?}", self.imp.name(), self.id);
            }
        }
    }

    fn signal(&self, sig: rustix::process::Signal) -> Result<()> {
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.pid)?).ok_or_else(|| anyhow!("pid 0"))?;
        rustix::process::kill_process(pid, sig)?;
        Ok(())
    }

    /// Waits for the process to exit (SIGKILL after `timeout`).
    async fn reap(&mut self, timeout: Duration) -> bool {
        if tokio::time::timeout(timeout, self.child.wait()).await.is_ok() {
            return true;
        }
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        false
    }

    async fn stop(mut self) {
        let _ = self.signal(rustix::process::Signal::TERM);
        self.reap(Duration::from_secs(10)).await;
    }

    /// utime + stime in ms, and VmRSS in KiB, from /proc.
    fn cpu_rss(&self) -> Result<(f64, u64)> {
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

// ---------------------------------------------------------------------------
// Lease helpers

async fn precreate_free_lease(client: &Client, ns: &str, name: &str) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), ns);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    };
    api.create(&PostParams::default(), &lease)
        .await
        .context("pre-creating the Lease")?;
    Ok(())
}

/// Every version of the Lease the driver's own watch saw: (mono ns, holder).
#[derive(Clone, Default)]
struct LeaseLog(Arc<Mutex<Vec<(u128, String)>>>);

impl LeaseLog {
    fn start(client: &Client, ns: &str, name: &str) -> (Self, tokio::task::JoinHandle<()>) {
        let log = LeaseLog::default();
        let api: Api<Lease> = Api::namespaced(client.clone(), ns);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let l = log.clone();
        let task = tokio::spawn(async move {
            use futures::StreamExt as _;
            let mut s = std::pin::pin!(watcher(api, cfg).default_backoff().applied_objects());
            while let Some(ev) = s.next().await {
                if let Ok(lease) = ev {
                    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
                    l.0.lock().unwrap().push((mono(), holder));
                }
            }
        });
        (log, task)
    }

    /// First time after `after` at which the Lease was seen free.
    fn released_after(&self, after: u128) -> Option<u128> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|(t, h)| *t >= after && h.is_empty())
            .map(|(t, _)| *t)
    }

    /// Last time before `before` at which the Lease was seen written by `holder`.
    fn last_write_by(&self, holder: &str, before: u128) -> Option<u128> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(t, h)| *t <= before && h == holder)
            .map(|(t, _)| *t)
    }
}

// ---------------------------------------------------------------------------
// Handover and failover

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Trial {
    pub scenario: String,
    pub implementation: Impl,
    pub timing: String,
    pub lease_ms: u64,
    pub trial: usize,
    /// Signal (SIGTERM or SIGKILL) sent to the leader -> new leader's started-leading.
    pub signal_to_leader_ms: Option<f64>,
    /// Handover: release observed by the driver's watch -> new leader.
    /// Failover: last renewal observed by the driver's watch -> new leader.
    pub lease_event_to_leader_ms: Option<f64>,
    /// Handover: SIGTERM -> old leader's stopped-leading.
    pub old_leader_stopped_ms: Option<f64>,
    /// Failed trial: what went wrong.
    pub error: Option<String>,
    pub loadavg: f64,
}

struct Chain {
    imp: Impl,
    t: Timing,
    ns: String,
    lease: String,
    seq: usize,
    leader: Option<Candidate>,
    log: LeaseLog,
    watch: tokio::task::JoinHandle<()>,
}

impl Chain {
    async fn new(ctx: &Ctx, imp: Impl, t: Timing, scenario: &str) -> Result<Self> {
        let ns = ctx
            .env
            .new_namespace(&format!("{scenario}-{}", imp.short()))
            .await?;
        let lease = "bench".to_owned();
        precreate_free_lease(&ctx.client, &ns, &lease).await?;
        let (log, watch) = LeaseLog::start(&ctx.client, &ns, &lease);
        let mut chain = Chain {
            imp,
            t,
            ns,
            lease,
            seq: 0,
            leader: None,
            log,
            watch,
        };
        let first = chain.spawn_next(ctx)?;
        first
            .wait_event("started-leading", t.lease() * 2 + Duration::from_secs(30))
            .await?;
        chain.leader = Some(first);
        Ok(chain)
    }

    fn spawn_next(&mut self, ctx: &Ctx) -> Result<Candidate> {
        let id = format!("{}-{}", self.imp.short(), self.seq);
        self.seq += 1;
        ctx.spawn(self.imp, &self.ns, &self.lease, &id, self.t)
    }

    /// One trial: a new follower joins, settles, then the leader gets `sig`.
    async fn step(&mut self, ctx: &Ctx, kill: bool) -> Result<(f64, Option<f64>, Option<f64>)> {
        let follower = self.spawn_next(ctx)?;
        follower.wait_event("READY", Duration::from_secs(30)).await?;
        // Settle: the follower reaches its steady state (first read done, watch
        // open), then a random phase against its poll cycle and the leader's
        // renewals.
        let settle = Duration::from_millis(1500) + self.t.retry().mul_f64(2.2 * fastrand::f64());
        tokio::time::sleep(settle).await;
        let mut leader = self.leader.take().ok_or_else(|| anyhow!("chain has no leader"))?;
        let t0 = mono();
        leader.signal(if kill {
            rustix::process::Signal::KILL
        } else {
            rustix::process::Signal::TERM
        })?;
        let timeout = self.t.lease() * 2 + self.t.retry() * 3 + Duration::from_secs(20);
        let result = follower.wait_event("started-leading", timeout).await;
        let old_id = leader.id.clone();
        let stopped = leader.find("stopped-leading");
        leader.reap(Duration::from_secs(10)).await;
        drop(leader);
        self.leader = Some(follower);
        let t1 = result?;
        let event = if kill {
            self.log.last_write_by(&old_id, t1).map(|t| ms_between(t, t1))
        } else {
            self.log
                .released_after(t0)
                .filter(|t| *t <= t1)
                .map(|t| ms_between(t, t1))
        };
        Ok((ms_between(t0, t1), event, stopped.map(|s| ms_between(t0, s))))
    }

    async fn finish(mut self) {
        if let Some(l) = self.leader.take() {
            l.stop().await;
        }
        self.watch.abort();
    }
}

pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

async fn run_chain_trials(
    ctx: &Ctx,
    imp: Impl,
    t: Timing,
    scenario: &str,
    trials: usize,
    results: &Mutex<Vec<Trial>>,
) {
    let kill = scenario == "failover";
    let mut chain: Option<Chain> = None;
    for trial in 0..trials {
        let mut record = Trial {
            scenario: scenario.to_owned(),
            implementation: imp,
            timing: t.name.to_owned(),
            lease_ms: t.lease_ms,
            trial,
            signal_to_leader_ms: None,
            lease_event_to_leader_ms: None,
            old_leader_stopped_ms: None,
            error: None,
            loadavg: loadavg(),
        };
        let outcome = async {
            if chain.is_none() {
                chain = Some(Chain::new(ctx, imp, t, scenario).await?);
            }
            chain.as_mut().unwrap().step(ctx, kill).await
        }
        .await;
        match outcome {
            Ok((sig, ev, stopped)) => {
                record.signal_to_leader_ms = Some(sig);
                record.lease_event_to_leader_ms = ev;
                record.old_leader_stopped_ms = stopped;
                eprintln!(
                    "  {scenario} {} {} #{trial}: {sig:.1} ms after the signal, {} ms after the lease event",
                    imp.name(),
                    t.name,
                    ev.map_or("?".to_owned(), |e| format!("{e:.1}"))
                );
            }
            Err(e) => {
                eprintln!("  {scenario} {} {} #{trial}: FAILED: {e:#}", imp.name(), t.name);
                record.error = Some(format!("{e:#}"));
                if let Some(c) = chain.take() {
                    c.finish().await;
                }
            }
        }
        results.lock().unwrap().push(record);
    }
    if let Some(c) = chain.take() {
        c.finish().await;
    }
}

async fn scenario_handover(ctx: &Ctx, trials: usize) -> Vec<Trial> {
    // Sequential, the implementations interleaved trial by trial: handover
    // latencies are milliseconds for a watching candidate, so the chains
    // must not compete for the CPU at the measured instant.
    let results = Mutex::new(Vec::new());
    for t in TIMINGS {
        eprintln!(
            "handover, {}: {trials} trials per implementation, interleaved",
            t.name
        );
        let mut chains: Vec<Option<Chain>> = Vec::new();
        for imp in HANDOVER_IMPLS {
            chains.push(
                Chain::new(ctx, imp, t, "handover")
                    .await
                    .map_err(|e| eprintln!("  chain {}: {e:#}", imp.name()))
                    .ok(),
            );
        }
        for trial in 0..trials {
            for (i, imp) in HANDOVER_IMPLS.into_iter().enumerate() {
                let mut record = Trial {
                    scenario: "handover".into(),
                    implementation: imp,
                    timing: t.name.into(),
                    lease_ms: t.lease_ms,
                    trial,
                    signal_to_leader_ms: None,
                    lease_event_to_leader_ms: None,
                    old_leader_stopped_ms: None,
                    error: None,
                    loadavg: loadavg(),
                };
                let outcome = async {
                    if chains[i].is_none() {
                        chains[i] = Some(Chain::new(ctx, imp, t, "handover").await?);
                    }
                    chains[i].as_mut().unwrap().step(ctx, false).await
                }
                .await;
                match outcome {
                    Ok((sig, ev, stopped)) => {
                        record.signal_to_leader_ms = Some(sig);
                        record.lease_event_to_leader_ms = ev;
                        record.old_leader_stopped_ms = stopped;
                        eprintln!(
                            "  handover {} {} #{trial}: release->leader {} ms, SIGTERM->leader {sig:.1} ms",
                            imp.name(),
                            t.name,
                            ev.map_or("?".to_owned(), |e| format!("{e:.1}"))
                        );
                    }
                    Err(e) => {
                        eprintln!("  handover {} {} #{trial}: FAILED: {e:#}", imp.name(), t.name);
                        record.error = Some(format!("{e:#}"));
                        if let Some(c) = chains[i].take() {
                            c.finish().await;
                        }
                    }
                }
                results.lock().unwrap().push(record);
            }
        }
        for c in chains.into_iter().flatten() {
            c.finish().await;
        }
    }
    results.into_inner().unwrap()
}

async fn scenario_failover(ctx: &Ctx, trials: usize) -> Vec<Trial> {
    // The three chains run concurrently (each in its own namespace): a failover
    // takes a lease duration of waiting, and the waits dominate the latency.
    let results = Mutex::new(Vec::new());
    for t in TIMINGS {
        eprintln!(
            "failover, {}: {trials} trials per implementation, the 3 chains concurrently",
            t.name
        );
        futures::future::join_all(
            IMPLS.map(|imp| run_chain_trials(ctx, imp, t, "failover", trials, &results)),
        )
        .await;
    }
    results.into_inner().unwrap()
}

// ---------------------------------------------------------------------------
// API load and idle cost

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Scrape {
    pub at_ns: u128,
    /// apiserver_request_total{resource="leases"} summed by verb.
    pub requests: BTreeMap<String, f64>,
    /// apiserver_longrunning_requests{resource="leases",verb="WATCH"}.
    pub watches_open: f64,
}

fn parse_label<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    let key = format!("{label}=\"");
    let start = line.find(&key)? + key.len();
    let end = line[start..].find('"')?;
    Some(&line[start..start + end])
}

async fn scrape(env: &TestEnv) -> Result<Scrape> {
    let text = env.metrics_text().await?;
    let at_ns = mono();
    let mut s = Scrape {
        at_ns,
        ..Scrape::default()
    };
    for line in text.lines() {
        let is_total = line.starts_with("apiserver_request_total{");
        let is_lr = line.starts_with("apiserver_longrunning_requests{");
        if !(is_total || is_lr) || parse_label(line, "resource") != Some("leases") {
            continue;
        }
        let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        let verb = parse_label(line, "verb").unwrap_or("?").to_owned();
        if is_total {
            *s.requests.entry(verb).or_default() += value;
        } else if verb == "WATCH" {
            s.watches_open += value;
        }
    }
    Ok(s)
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Window {
    /// None for the baseline (no candidates).
    pub implementation: Option<Impl>,
    pub timing: Option<String>,
    pub candidates: usize,
    pub seconds: f64,
    /// Requests per minute by verb over the window (baseline not subtracted).
    pub per_minute: BTreeMap<String, f64>,
    /// Watches open on leases at the end of the window.
    pub watches_open: f64,
    pub loadavg: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Idle {
    pub implementation: Impl,
    pub timing: String,
    pub role: String,
    pub seconds: f64,
    pub cpu_ms: f64,
    /// The same from schedstat (ns resolution).
    #[serde(default)]
    pub sched_cpu_ms: f64,
    pub rss_kib: u64,
    pub loadavg: f64,
}

fn rate(a: &Scrape, b: &Scrape) -> (f64, BTreeMap<String, f64>) {
    let secs = ms_between(a.at_ns, b.at_ns) / 1000.0;
    let mut out = BTreeMap::new();
    for (verb, v) in &b.requests {
        let d = v - a.requests.get(verb).copied().unwrap_or(0.0);
        out.insert(verb.clone(), d / secs * 60.0);
    }
    (secs, out)
}

/// Measures one window: scrapes around it, and CPU/RSS of `watched`.
#[allow(
    clippy::too_many_arguments,
    reason = "one call site per scenario phase; a struct would only rename them"
)]
async fn window(
    ctx: &Ctx,
    imp: Option<Impl>,
    t: Option<Timing>,
    candidates: usize,
    len: Duration,
    watched: &[(&Candidate, &str)],
    windows: &mut Vec<Window>,
    idle: &mut Vec<Idle>,
) -> Result<()> {
    let cpu0: Vec<_> = watched.iter().map(|(c, _)| c.cpu_rss()).collect::<Result<_>>()?;
    let sched0: Vec<f64> = watched.iter().map(|(c, _)| proc_sched_ms(c.pid)).collect();
    let a = scrape(&ctx.env).await?;
    tokio::time::sleep(len).await;
    let b = scrape(&ctx.env).await?;
    let cpu1: Vec<_> = watched.iter().map(|(c, _)| c.cpu_rss()).collect::<Result<_>>()?;
    let sched1: Vec<f64> = watched.iter().map(|(c, _)| proc_sched_ms(c.pid)).collect();
    let (secs, per_minute) = rate(&a, &b);
    let la = loadavg();
    eprintln!(
        "  window {} {} n={candidates}: {:?} req/min, {} watches open (load {la})",
        imp.map_or("baseline", Impl::name),
        t.map_or("-", |t| t.name),
        per_minute
            .iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(k, v)| format!("{k}={v:.1}"))
            .collect::<Vec<_>>(),
        b.watches_open
    );
    windows.push(Window {
        implementation: imp,
        timing: t.map(|t| t.name.to_owned()),
        candidates,
        seconds: secs,
        per_minute,
        watches_open: b.watches_open,
        loadavg: la,
    });
    for (i, (((c, role), (c0, _)), (c1, rss))) in watched.iter().zip(&cpu0).zip(&cpu1).enumerate() {
        idle.push(Idle {
            implementation: c.imp,
            timing: t.map_or(String::new(), |t| t.name.to_owned()),
            role: (*role).to_owned(),
            seconds: secs,
            cpu_ms: c1 - c0,
            sched_cpu_ms: sched1[i] - sched0[i],
            rss_kib: *rss,
            loadavg: la,
        });
    }
    Ok(())
}

async fn scenario_api(ctx: &Ctx, quick: bool, windows: &mut Vec<Window>, idle: &mut Vec<Idle>) -> Result<()> {
    let base_len = Duration::from_secs(if quick { 10 } else { 60 });
    // Let the apiserver's start-up traffic settle before the baseline.
    tokio::time::sleep(Duration::from_secs(if quick { 5 } else { 20 })).await;
    eprintln!("api load: baseline window ({base_len:?}, no candidates)");
    window(ctx, None, None, 0, base_len, &[], windows, idle).await?;
    for t in TIMINGS {
        let len = Duration::from_secs(match (quick, t.lease_ms >= 15_000) {
            (true, _) => 10,
            (false, true) => 60,
            (false, false) => 30,
        });
        let settle = t.retry() * 3 + Duration::from_secs(2);
        for imp in IMPLS {
            eprintln!("api load: {} {} ({len:?} windows)", imp.name(), t.name);
            let ns = ctx.env.new_namespace(&format!("api-{}", imp.short())).await?;
            precreate_free_lease(&ctx.client, &ns, "bench").await?;
            let spawn = |i: usize| ctx.spawn(imp, &ns, "bench", &format!("{}-{i}", imp.short()), t);
            let leader = spawn(0)?;
            leader
                .wait_event("started-leading", t.lease() * 2 + Duration::from_secs(30))
                .await?;
            tokio::time::sleep(settle).await;
            window(
                ctx,
                Some(imp),
                Some(t),
                1,
                len,
                &[(&leader, "leader")],
                windows,
                idle,
            )
            .await?;
            let mut followers = Vec::new();
            for n in [3usize, 10] {
                while followers.len() + 1 < n {
                    followers.push(spawn(followers.len() + 1)?);
                }
                for f in &followers {
                    f.wait_event("READY", Duration::from_secs(30)).await?;
                }
                tokio::time::sleep(settle).await;
                if followers.iter().any(|f| f.find("started-leading").is_some()) {
                    bail!(
                        "a follower of {} took the lease during the api-load scenario",
                        imp.name()
                    );
                }
                let watched: Vec<(&Candidate, &str)> = if n == 3 {
                    vec![(&followers[0], "follower")]
                } else {
                    vec![]
                };
                window(ctx, Some(imp), Some(t), n, len, &watched, windows, idle).await?;
            }
            for f in followers {
                f.stop().await;
            }
            leader.stop().await;
        }
    }
    eprintln!("api load: baseline window again");
    window(ctx, None, None, 0, base_len, &[], windows, idle).await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Machine and versions

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Meta {
    pub command: String,
    pub quick: bool,
    pub scenarios: Vec<String>,
    pub started_unix: u64,
    pub duration_s: f64,
    pub nproc: usize,
    pub mem_total_kib: u64,
    pub cpu_model: String,
    pub kernel: String,
    pub rustc: String,
    pub go: String,
    pub kube_apiserver: String,
    pub client_go: String,
    pub k8s_controller: String,
    /// 1-minute load average, sampled every 10 s during the run.
    pub loadavg_samples: Vec<f64>,
    pub commit: String,
}

fn cmd_out(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn machine(meta: &mut Meta, root: &Path) {
    meta.nproc = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meta.mem_total_kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    meta.cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_default();
    meta.kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    meta.rustc = cmd_out("rustc", &["--version"]);
    meta.go = cmd_out("go", &["version"]);
    let gomod = std::fs::read_to_string(root.join("harness/go/go.mod")).unwrap_or_default();
    meta.client_go = gomod
        .lines()
        .find(|l| l.trim_start().starts_with("k8s.io/client-go "))
        .map(|l| l.trim().to_owned())
        .unwrap_or_default();
    meta.k8s_controller = "k8s-controller 0.15.0".into();
    meta.commit = cmd_out(
        "git",
        &["-C", &root.display().to_string(), "rev-parse", "--short", "HEAD"],
    );
    // The candidates are built from the working tree: say when it differs.
    let dirty = cmd_out(
        "git",
        &[
            "-C",
            &root.display().to_string(),
            "status",
            "--porcelain",
            "--",
            "kube-runtime-lease",
            "examples",
            "harness/candidates",
        ],
    );
    if !dirty.is_empty() {
        meta.commit
            .push_str(" (+ uncommitted changes in kube-runtime-lease/, examples/ or harness/candidates/)");
    }
}

// ---------------------------------------------------------------------------

fn write_json<T: Serialize>(dir: &Path, name: &str, value: &T) -> Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

struct Args {
    cmd: String,
    quick: bool,
    only: Vec<String>,
    trials: Option<usize>,
    out: PathBuf,
    /// `None`: leave BENCHMARKS.md alone (a run into another `--out`).
    benchmarks_md: Option<PathBuf>,
    ours_bin: PathBuf,
}

fn parse_args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let root = repo_root();
    let mut a = Args {
        cmd: it.next().unwrap_or_else(|| "run".into()),
        quick: false,
        only: vec!["handover".into(), "failover".into(), "api".into()],
        trials: None,
        out: root.join("bench/results"),
        benchmarks_md: None,
        ours_bin: root.join("bench/target/release/candidate"),
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--only" => {
                a.only = it
                    .next()
                    .context("--only needs a value")?
                    .split(',')
                    .map(str::to_owned)
                    .collect()
            }
            "--trials" => a.trials = Some(it.next().context("--trials needs a value")?.parse()?),
            "--out" => a.out = it.next().context("--out needs a value")?.into(),
            "--benchmarks-md" => {
                a.benchmarks_md = Some(it.next().context("--benchmarks-md needs a value")?.into())
            }
            "--ours-bin" => a.ours_bin = it.next().context("--ours-bin needs a value")?.into(),
            other => bail!("unknown argument {other}"),
        }
    }
    // The tables in BENCHMARKS.md come from bench/results only: a run into
    // another directory (diagnostics, experiments) must not overwrite them.
    if a.benchmarks_md.is_none() && a.out == root.join("bench/results") {
        a.benchmarks_md = Some(root.join("BENCHMARKS.md"));
    }
    if !matches!(a.cmd.as_str(), "run" | "report") {
        bail!(
            "usage: bench-driver run|report [--quick] [--only handover,failover,api] [--trials N] [--out DIR]"
        );
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    std::fs::create_dir_all(&args.out)?;
    if args.cmd == "report" {
        return report::report(&args.out, args.benchmarks_md.as_deref());
    }
    let started = std::time::Instant::now();
    let mut meta = Meta {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        quick: args.quick,
        scenarios: args.only.clone(),
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs(),
        ..Meta::default()
    };
    machine(&mut meta, &repo_root());
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let samples = samples.clone();
        tokio::spawn(async move {
            loop {
                samples.lock().unwrap().push(loadavg());
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        })
    };

    let kc = std::env::current_exe()?.with_file_name("kc-candidate");
    for bin in [&args.ours_bin, &kc] {
        if !bin.is_file() {
            bail!(
                "{} is missing: build it first (scripts/bench.sh does)",
                bin.display()
            );
        }
    }
    // Run private copies: a rebuild in bench/target during the run (another
    // bench.sh, a cargo build) must not change the candidates half-way.
    let private = tempfile_dir()?;
    let ours_copy = private.join("candidate");
    let kc_copy = private.join("kc-candidate");
    std::fs::copy(&args.ours_bin, &ours_copy)?;
    std::fs::copy(&kc, &kc_copy)?;
    let kc = kc_copy;
    eprintln!("starting the control plane");
    let env = TestEnv::start().await?;
    let client = env.client().await?;
    meta.kube_apiserver = client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .unwrap_or_default();
    let goelect_copy = private.join("goelect");
    std::fs::copy(env.goelect_path().await?, &goelect_copy)?;
    let bins = Bins {
        ours: ours_copy,
        goelect: goelect_copy,
        kc,
    };
    let logs = args.out.join("logs");
    std::fs::create_dir_all(&logs)?;
    let ctx = Ctx {
        env,
        client,
        bins,
        stderr_log: logs.join("candidates.stderr.log"),
    };
    let _ = std::fs::remove_file(&ctx.stderr_log);

    // API load first: before any of the driver's own Lease watches exist
    // (their ends would count as WATCH requests in the windows).
    if args.only.iter().any(|s| s == "api") {
        let mut windows = Vec::new();
        let mut idle = Vec::new();
        let res = scenario_api(&ctx, args.quick, &mut windows, &mut idle).await;
        write_json(&args.out, "api_load.json", &windows)?;
        write_json(&args.out, "idle.json", &idle)?;
        res?;
    }
    let trials = args.trials.unwrap_or(if args.quick { 3 } else { 20 });
    if args.only.iter().any(|s| s == "handover") {
        let r = scenario_handover(&ctx, trials).await;
        write_json(&args.out, "handover.json", &r)?;
    }
    if args.only.iter().any(|s| s == "failover") {
        let r = scenario_failover(&ctx, trials).await;
        write_json(&args.out, "failover.json", &r)?;
    }
    sampler.abort();
    meta.loadavg_samples = samples.lock().unwrap().clone();
    meta.duration_s = started.elapsed().as_secs_f64();
    let meta_name = format!("meta-{}.json", args.only.join("-"));
    write_json(&args.out, &meta_name, &meta)?;
    eprintln!("done in {:.0} s", meta.duration_s);
    let _ = std::fs::remove_dir_all(&private);
    report::report(&args.out, args.benchmarks_md.as_deref())
}

/// A fresh private directory under the system temp dir.
fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("krl-bench-bins-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
