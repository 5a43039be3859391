//! Shared helpers of the integration tests (in `tests/tests/`).
//!
//! The failover tests run real candidate processes (the Rust `candidate` binary
//! of `kube-runtime-lease-examples`, and client-go's `goelect` from the test
//! harness) against a real kube-apiserver, and judge them from what they print:
//!
//! - [`Process`] spawns a candidate and feeds every line of its stdout (parsed)
//!   and stderr into a shared [`EventLog`], under the process's name; the test
//!   adds what it does itself (signals, exits) to the same log, stamped with
//!   the same clock (`CLOCK_MONOTONIC`, see [`now_ns`]).
//! - [`leadership_intervals`] turns a log into `[started-leading,
//!   stopped-leading]` intervals per process, and [`check_no_overlap`] checks
//!   that no two of them overlap; [`check_log`] does both, plus the check that
//!   every `WORK` line lies inside an interval of its process.
//! - [`Proxy`] is a TCP proxy to the apiserver that can partition, delay and
//!   drop the connections of the candidates behind it.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use kube_lease_testenv::TestEnv;
use rustix::process::{Pid, Signal};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

// ---------------------------------------------------------------------------
// Time
// ---------------------------------------------------------------------------

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock of every timestamp that the
/// candidates print, so the test's own records compare with theirs.
pub fn now_ns() -> u64 {
    u64::try_from(kube_runtime_lease_examples::monotonic_nanos()).unwrap_or(u64::MAX)
}

/// A duration in nanoseconds (saturating).
pub fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Formats a nanosecond quantity as milliseconds with three decimals.
pub fn fmt_ms(ns: u64) -> String {
    format!("{}.{:03} ms", ns / 1_000_000, (ns / 1_000) % 1_000)
}

/// Formats `b - a` (nanoseconds, either sign) as milliseconds.
pub fn fmt_delta(a: u64, b: u64) -> String {
    if b >= a {
        format!("+{}", fmt_ms(b - a))
    } else {
        format!("-{}", fmt_ms(a - b))
    }
}

/// The election timings given to every candidate of a test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// Lease duration (whole seconds: the Lease stores seconds).
    pub lease_duration: Duration,
    /// Renew deadline.
    pub renew_deadline: Duration,
    /// Retry period.
    pub retry_period: Duration,
}

impl Timings {
    /// The short timings of the failover tests: 2 s / 1.5 s / 0.5 s.
    pub const FAST: Self = Self {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(500),
    };
}

// ---------------------------------------------------------------------------
// Shared environment
// ---------------------------------------------------------------------------

/// The control plane shared by every test of one test binary (one per file),
/// started on first use and never stopped: its processes exit with the test
/// process (the harness's stdin watchdog).
///
/// # Errors
/// When the control plane does not start; later callers get the same error.
pub async fn shared_env() -> Result<&'static TestEnv> {
    static ENV: tokio::sync::OnceCell<std::result::Result<TestEnv, String>> =
        tokio::sync::OnceCell::const_new();
    ENV.get_or_init(|| async { TestEnv::start().await.map_err(|e| format!("{e:#}")) })
        .await
        .as_ref()
        .map_err(|e| anyhow!("starting the test control plane: {e}"))
}

/// Serialises the tests of one binary: they share one apiserver, and some of
/// them restart it or depend on timing. Hold the guard for the whole test.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// A Lease used by one scenario run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// Creates a fresh namespace (named after `prefix`) holding a *free* Lease:
/// holder `""` and a 1 s duration, as a release leaves it.
///
/// Candidates then take it at once. (A candidate that *creates* the Lease
/// holds it for one lease duration before leading, a safety measure after
/// deletions; pre-creating avoids that delay.)
///
/// # Errors
/// When an API call fails.
pub async fn new_free_lease(env: &TestEnv, client: &Client, prefix: &str) -> Result<LeaseRef> {
    let namespace = env.new_namespace(prefix).await?;
    let lease = LeaseRef {
        namespace,
        name: "failover".to_owned(),
    };
    let api: Api<Lease> = Api::namespaced(client.clone(), &lease.namespace);
    api.create(
        &PostParams::default(),
        &Lease {
            metadata: ObjectMeta {
                name: Some(lease.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        },
    )
    .await
    .with_context(|| format!("creating lease {}/{}", lease.namespace, lease.name))?;
    Ok(lease)
}

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
    /// a [`LeaseRecorder`] into `log` (which [`check_log`] then checks).
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

/// The test's own watch on a Lease: records every new version of it (by
/// resourceVersion) into an [`EventLog`] as [`Kind::Record`] entries, stamped
/// when seen. Stops when dropped.
#[derive(Debug)]
pub struct LeaseRecorder {
    /// The Lease watched.
    pub lease: LeaseRef,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LeaseRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::ops::Deref for LeaseRecorder {
    type Target = LeaseRef;

    fn deref(&self) -> &LeaseRef {
        &self.lease
    }
}

impl LeaseRecorder {
    /// Starts watching `lease` and waits for its first version.
    ///
    /// # Errors
    /// When the first version is not seen within 10 s.
    pub async fn start(client: Client, lease: LeaseRef, log: &EventLog) -> Result<Self> {
        use futures::StreamExt as _;
        use kube::runtime::{WatchStreamExt as _, watcher};

        let api: Api<Lease> = Api::namespaced(client, &lease.namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", lease.name));
        let started = now_ns();
        let l = log.clone();
        let task = tokio::spawn(async move {
            let mut last_rv = None;
            let mut events = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
            while let Some(event) = events.next().await {
                let Ok(object) = event else { continue };
                let at = now_ns();
                // A re-list replays the current version: record versions once.
                if object.metadata.resource_version == last_rv {
                    continue;
                }
                last_rv.clone_from(&object.metadata.resource_version);
                let spec = object.spec.unwrap_or_default();
                l.record(
                    "lease",
                    Kind::Record,
                    at,
                    spec.holder_identity.as_deref().unwrap_or(""),
                    &format!(
                        "duration={} transitions={} rv={} acquire={} renew={}",
                        spec.lease_duration_seconds.unwrap_or(0),
                        spec.lease_transitions.unwrap_or(0),
                        last_rv.as_deref().unwrap_or(""),
                        spec.acquire_time.map_or_else(String::new, |t| t.0.to_string()),
                        spec.renew_time.map_or_else(String::new, |t| t.0.to_string()),
                    ),
                );
            }
        });
        let recorder = Self { lease, task };
        log.wait_for("the test's watch on the lease", Duration::from_secs(10), |e| {
            e.kind == Kind::Record && e.at >= started
        })
        .await?;
        Ok(recorder)
    }
}

/// How much earlier than the protocol allows a takeover may *appear* in the
/// records of a [`LeaseRecorder`]: the test sees each write a little after it
/// happened, the old holder's last renewal possibly later than the takeover.
pub const RECORD_SLACK: Duration = Duration::from_millis(100);

/// A field `name=value` of a record's `detail`.
fn record_field<'a>(record: &'a Entry, name: &str) -> &'a str {
    record
        .detail
        .split_whitespace()
        .find_map(|f| f.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        .unwrap_or("")
}

/// A record as client-go compares records: its `LeaderElectionRecord` as
/// JSON, in which times are `metav1.Time`, with whole seconds (RFC 3339).
fn client_go_view(record: &Entry) -> String {
    let seconds = |t: &str| t.split('.').next().unwrap_or("").trim_end_matches('Z').to_owned();
    format!(
        "{}|{}|{}|{}|{}",
        record.who,
        record_field(record, "duration"),
        record_field(record, "transitions"),
        seconds(record_field(record, "acquire")),
        seconds(record_field(record, "renew"))
    )
}

/// Checks the Lease records of `entries` ([`Kind::Record`]): whenever the
/// holder changes from one candidate to another without a release in
/// between, the takeover was seen no earlier than the old holder's record
/// duration after its last renewal was seen (less [`RECORD_SLACK`]). That is,
/// nobody took a Lease before it expired.
///
/// For a client-go taker ([`Flavor::Go`]), "its last renewal" is what
/// client-go can see: it notices a change of the record only when the record
/// differs with its times cut to whole seconds (it compares the JSON of a
/// `LeaderElectionRecord`, whose times are `metav1.Time`), so renewals within
/// the same wall-clock second as the previous version do not restart its
/// clock. Such takeovers pass, and are described in the returned notes.
///
/// # Errors
/// One line per early takeover (times relative to `base`).
pub fn check_takeovers(entries: &[Entry], base: u64) -> Result<Vec<String>> {
    let is_go = |name: &str| {
        entries
            .iter()
            .any(|e| e.kind == Kind::Spawned && e.process == name && e.detail.starts_with("Go"))
    };
    let records: Vec<&Entry> = entries.iter().filter(|e| e.kind == Kind::Record).collect();
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    for (i, r) in records.iter().enumerate() {
        // The previous record: a takeover is a change between two holders.
        let Some(prev) = i.checked_sub(1).map(|j| records[j]) else {
            continue;
        };
        if r.who.is_empty() || prev.who.is_empty() || prev.who == r.who {
            continue;
        }
        // The old holder's last renewal as the taker could see it: client-go
        // sees the first of a run of versions that look alike to it.
        let mut seen = prev;
        if is_go(&r.who) {
            let view = client_go_view(prev);
            for earlier in records[..i].iter().rev() {
                if client_go_view(earlier) != view {
                    break;
                }
                seen = earlier;
            }
        }
        let seconds: u64 = record_field(prev, "duration").parse().unwrap_or(0);
        let lease = ns(Duration::from_secs(seconds));
        let allowed = seen.at + lease.saturating_sub(ns(RECORD_SLACK));
        if r.at < allowed {
            problems.push(format!(
                "{} took the lease from {} {} after {}'s last renewal was seen ({}), before its {seconds} s lease duration expired ({} {} -> {})",
                r.who,
                prev.who,
                fmt_ms(r.at.saturating_sub(seen.at)),
                prev.who,
                fmt_delta(base, seen.at),
                fmt_delta(base, r.at),
                seen.detail,
                r.detail
            ));
        } else if r.at < prev.at + lease.saturating_sub(ns(RECORD_SLACK)) {
            notes.push(format!(
                "client-go candidate {} took the lease {} after {}'s last renewal: that renewal fell in the same second as the version before it ({} earlier), which client-go's one-second record comparison cannot tell apart",
                r.who,
                fmt_ms(r.at.saturating_sub(prev.at)),
                prev.who,
                fmt_ms(prev.at - seen.at)
            ));
        }
    }
    if problems.is_empty() {
        Ok(notes)
    } else {
        bail!("a lease was taken before it expired:\n{}", problems.join("\n"))
    }
}

// ---------------------------------------------------------------------------
// Candidate binaries
// ---------------------------------------------------------------------------

/// The path of the Rust `candidate` binary, built once per test process with
/// `cargo build -p kube-runtime-lease-examples --bin candidate`.
///
/// Blocks while cargo runs: call [`candidate_bin`] from async code.
///
/// # Errors
/// When the build fails (the message holds cargo's last lines).
pub fn candidate_path() -> Result<PathBuf> {
    static PATH: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(build_candidate).clone().map_err(|e| anyhow!(e))
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

fn build_candidate() -> std::result::Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from(env!("CARGO")), PathBuf::from);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("the tests crate has no parent directory")?;
    let output = std::process::Command::new(&cargo)
        .current_dir(root)
        .args([
            "build",
            "-p",
            "kube-runtime-lease-examples",
            "--bin",
            "candidate",
            "--message-format=json",
        ])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cargo.display()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "building the candidate failed ({}):\n{}",
            output.status,
            tail.join("\n")
        ));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "candidate")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo reported no executable for the candidate binary".to_owned())
}

/// The command line of a Rust candidate (`candidate` binary) for `lease`,
/// named `identity`, with `timings`, talking to the cluster of `kubeconfig`.
/// Its stderr carries its `info` logs (they land in the event log).
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

// ---------------------------------------------------------------------------
// Event log
// ---------------------------------------------------------------------------

/// A signal the test sends to a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sig {
    /// SIGKILL: dies at once.
    Kill,
    /// SIGTERM: hands over and exits.
    Term,
    /// SIGSTOP: frozen.
    Stop,
    /// SIGCONT: resumed.
    Cont,
}

impl Sig {
    fn signal(self) -> Signal {
        match self {
            Sig::Kill => Signal::KILL,
            Sig::Term => Signal::TERM,
            Sig::Stop => Signal::STOP,
            Sig::Cont => Signal::CONT,
        }
    }
}

/// Which implementation a candidate process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// The Rust `candidate` binary (this crate's library).
    Rust,
    /// client-go's `goelect`. It prints `stopped-leading` only after its
    /// release on SIGTERM (client-go calls `OnStoppedLeading` when `Run`
    /// returns), although it cancels the leading context before releasing:
    /// see [`leadership_intervals`].
    Go,
}

/// What an [`Entry`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The test spawned the process (`detail` is its [`Flavor`]).
    Spawned,
    /// `READY`: the candidate runs.
    Ready,
    /// `EVENT started-leading`.
    StartedLeading,
    /// `EVENT stopped-leading` (`detail` holds the reason, if printed).
    StoppedLeading,
    /// `EVENT new-leader` (`who` is the holder it observed, `""` when free).
    NewLeader,
    /// `WORK`: one piece of guarded work.
    Work,
    /// `EXIT`: the Rust candidate is about to exit.
    Exit,
    /// The test sent this signal (stamped after sending, except SIGCONT:
    /// before sending).
    Signal(Sig),
    /// The test reaped the process (`detail` is the exit status).
    Exited,
    /// The process's stdout reached EOF (it exited, or at least closed it).
    StdoutClosed,
    /// A line of stderr (stamped when the test read it).
    Stderr,
    /// A note by the test.
    Note,
    /// A new version of the Lease, seen by the test's own watch
    /// ([`LeaseRecorder`]): `who` is the holder (`""` when free), `detail`
    /// `duration=<s> transitions=<n> rv=<resourceVersion> acquire=<RFC 3339>
    /// renew=<RFC 3339>`.
    Record,
    /// A stdout line that is none of the above.
    Other,
}

/// One record of the [`EventLog`].
#[derive(Clone, Debug)]
pub struct Entry {
    /// Position in the log.
    pub seq: usize,
    /// The process it is about.
    pub process: String,
    /// What happened.
    pub kind: Kind,
    /// When (`CLOCK_MONOTONIC` ns): printed by the process for its own lines,
    /// taken by the test for the rest.
    pub at: u64,
    /// The identity named by the line (the leader for `new-leader`), or `""`.
    pub who: String,
    /// The rest: a stop reason, a signal, an exit status, a raw line.
    pub detail: String,
}

impl Entry {
    /// Whether this is a line the process printed on stdout itself.
    pub fn is_own_line(&self) -> bool {
        matches!(
            self.kind,
            Kind::Ready
                | Kind::StartedLeading
                | Kind::StoppedLeading
                | Kind::NewLeader
                | Kind::Work
                | Kind::Exit
                | Kind::Other
        )
    }
}

/// Parses a candidate's stdout line into `(kind, at, who, detail)`.
///
/// Knows both formats: the Rust candidate's (`READY <ns> <id>`, `EVENT <kind>
/// <ns> <id> [reason]`, `WORK <ns>`, `EXIT <ns>`) and goelect's (`READY <ns>`,
/// `EVENT <kind> <ns> <id>`, the identity possibly empty).
pub fn parse_line(line: &str) -> Option<(Kind, u64, String, String)> {
    let mut parts = line.split_whitespace();
    let head = parts.next()?;
    let (kind, at) = match head {
        "READY" => (Kind::Ready, parts.next()?.parse().ok()?),
        "WORK" => (Kind::Work, parts.next()?.parse().ok()?),
        "EXIT" => (Kind::Exit, parts.next()?.parse().ok()?),
        "EVENT" => {
            let kind = match parts.next()? {
                "started-leading" => Kind::StartedLeading,
                "stopped-leading" => Kind::StoppedLeading,
                "new-leader" => Kind::NewLeader,
                _ => return None,
            };
            (kind, parts.next()?.parse().ok()?)
        }
        _ => return None,
    };
    let who = parts.next().unwrap_or("").to_owned();
    let detail = parts.collect::<Vec<_>>().join(" ");
    Some((kind, at, who, detail))
}

struct LogInner {
    entries: Mutex<Vec<Entry>>,
    changed: watch::Sender<usize>,
}

/// The shared, append-only log of everything candidates print and the test
/// does, with waiting on conditions.
#[derive(Clone)]
pub struct EventLog {
    inner: Arc<LogInner>,
}

impl Default for EventLog {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog")
            .field("entries", &self.lock().len())
            .finish()
    }
}

impl EventLog {
    /// An empty log.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(LogInner {
                entries: Mutex::new(Vec::new()),
                changed: watch::Sender::new(0),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Entry>> {
        self.inner
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends an entry; returns its `at`.
    pub fn record(&self, process: &str, kind: Kind, at: u64, who: &str, detail: &str) -> u64 {
        let len = {
            let mut entries = self.lock();
            let seq = entries.len();
            entries.push(Entry {
                seq,
                process: process.to_owned(),
                kind,
                at,
                who: who.to_owned(),
                detail: detail.to_owned(),
            });
            entries.len()
        };
        self.inner.changed.send_replace(len);
        at
    }

    /// Appends a note by the test, stamped now; returns the stamp.
    pub fn note(&self, text: &str) -> u64 {
        self.record("test", Kind::Note, now_ns(), "", text)
    }

    /// A copy of every entry so far.
    pub fn entries(&self) -> Vec<Entry> {
        self.lock().clone()
    }

    /// The first entry (in log order) matching `pred`, if any yet.
    pub fn find(&self, mut pred: impl FnMut(&Entry) -> bool) -> Option<Entry> {
        self.lock().iter().find(|e| pred(e)).cloned()
    }

    /// Every entry matching `pred`.
    pub fn filter(&self, mut pred: impl FnMut(&Entry) -> bool) -> Vec<Entry> {
        self.lock().iter().filter(|e| pred(e)).cloned().collect()
    }

    /// Waits until an entry matches `pred` (checking those already there
    /// first) and returns the first that does.
    ///
    /// # Errors
    /// After `timeout`, with `what` and the whole log in the message.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&Entry) -> bool,
    ) -> Result<Entry> {
        let mut rx = self.inner.changed.subscribe();
        let deadline = Instant::now() + timeout;
        let mut checked = 0;
        loop {
            rx.borrow_and_update();
            {
                let entries = self.lock();
                if let Some(e) = entries[checked..].iter().find(|e| pred(e)) {
                    return Ok(e.clone());
                }
                checked = entries.len();
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
    }

    /// Waits until `check`, given every entry so far, returns `Some` (checked
    /// at once, then on every new entry) and returns its value.
    ///
    /// # Errors
    /// After `timeout`, with `what` in the message.
    pub async fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&[Entry]) -> Option<T>,
    ) -> Result<T> {
        let mut rx = self.inner.changed.subscribe();
        let deadline = Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            if let Some(found) = check(&self.lock()) {
                return Ok(found);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
    }

    /// Waits for the first `started-leading` stamped after `after` by any
    /// process but `not`.
    ///
    /// # Errors
    /// After `timeout`.
    pub async fn next_leader(&self, after: u64, not: &str, timeout: Duration) -> Result<Entry> {
        self.wait_for(
            &format!("someone other than {not} to start leading"),
            timeout,
            |e| e.kind == Kind::StartedLeading && e.at > after && e.process != not,
        )
        .await
    }

    /// Waits for `process`'s first `stopped-leading` stamped after `after`.
    ///
    /// # Errors
    /// After `timeout`.
    pub async fn stopped_leading(&self, process: &str, after: u64, timeout: Duration) -> Result<Entry> {
        self.wait_for(&format!("{process} to stop leading"), timeout, |e| {
            e.kind == Kind::StoppedLeading && e.process == process && e.at > after
        })
        .await
    }

    /// The flavor `process` was spawned with, if it was.
    pub fn flavor_of(&self, process: &str) -> Option<Flavor> {
        self.lock()
            .iter()
            .find(|e| e.kind == Kind::Spawned && e.process == process)
            .map(|e| {
                if e.detail.starts_with("Go") {
                    Flavor::Go
                } else {
                    Flavor::Rust
                }
            })
    }

    /// The time the test's watch saw `holder`'s last write to the Lease
    /// before `before` ([`Kind::Record`] entries), if any.
    pub fn last_write_seen(&self, holder: &str, before: u64) -> Option<u64> {
        self.lock()
            .iter()
            .filter(|e| e.kind == Kind::Record && e.who == holder && e.at < before)
            .map(|e| e.at)
            .max()
    }

    /// The log as text, times relative to its first entry, runs of `WORK`
    /// lines of one process folded into one line.
    pub fn dump(&self) -> String {
        let entries = self.entries();
        let base = entries.iter().map(|e| e.at).min().unwrap_or(0);
        let mut out = String::new();
        let mut i = 0;
        while i < entries.len() {
            let e = &entries[i];
            if e.kind == Kind::Work {
                // Fold this process's consecutive WORK lines (others' lines in
                // between end the run).
                let mut j = i;
                while j + 1 < entries.len()
                    && entries[j + 1].kind == Kind::Work
                    && entries[j + 1].process == e.process
                {
                    j += 1;
                }
                let _ = writeln!(
                    out,
                    "{:>14}  {:<10} WORK x{} (last at {})",
                    fmt_delta(base, e.at),
                    e.process,
                    j - i + 1,
                    fmt_delta(base, entries[j].at)
                );
                i = j + 1;
                continue;
            }
            let what = match e.kind {
                Kind::Signal(s) => format!("<test sent {s:?}>"),
                Kind::Exited => format!("<reaped: {}>", e.detail),
                Kind::StdoutClosed => "<stdout closed>".to_owned(),
                Kind::Spawned => format!("<spawned, {}>", e.detail),
                Kind::Stderr => format!("stderr: {}", e.detail),
                Kind::Note => format!("NOTE {}", e.detail),
                Kind::Record => format!("RECORD holder={:?} {}", e.who, e.detail),
                Kind::Other => format!("? {}", e.detail),
                k => format!("{k:?} {} {}", e.who, e.detail),
            };
            let _ = writeln!(out, "{:>14}  {:<10} {what}", fmt_delta(base, e.at), e.process);
            i += 1;
        }
        out
    }

    /// The log as text without stderr lines (see [`EventLog::dump`]).
    pub fn dump_events(&self) -> String {
        self.dump()
            .lines()
            .filter(|l| !l.contains(" stderr: "))
            .fold(String::new(), |mut s, l| {
                s.push_str(l);
                s.push('\n');
                s
            })
    }
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// A candidate process whose output feeds an [`EventLog`]. Killed on drop.
#[derive(Debug)]
pub struct Process {
    name: String,
    flavor: Flavor,
    pid: Pid,
    child: Child,
    /// Held open: goelect exits when it closes (`--exit-on-stdin-eof`).
    _stdin: Option<ChildStdin>,
    log: EventLog,
    status: Option<ExitStatus>,
}

impl Process {
    /// Spawns `cmd` (stdin, stdout and stderr piped, killed on drop) under
    /// `name`; a task per output stream appends its lines to `log`.
    ///
    /// # Errors
    /// When the process cannot be started.
    pub fn spawn(name: &str, flavor: Flavor, mut cmd: Command, log: &EventLog) -> Result<Self> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning candidate {name}"))?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw)
            .ok_or_else(|| anyhow!("candidate {name} has no pid"))?;
        log.record(
            name,
            Kind::Spawned,
            now_ns(),
            "",
            &format!("{flavor:?}, pid {}", pid.as_raw_pid()),
        );
        let stdout = child.stdout.take().context("stdout")?;
        let stderr = child.stderr.take().context("stderr")?;
        let (l, n) = (log.clone(), name.to_owned());
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match parse_line(&line) {
                    Some((kind, at, who, detail)) => l.record(&n, kind, at, &who, &detail),
                    None => l.record(&n, Kind::Other, now_ns(), "", &line),
                };
            }
            l.record(&n, Kind::StdoutClosed, now_ns(), "", "");
        });
        let (l, n) = (log.clone(), name.to_owned());
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                l.record(&n, Kind::Stderr, now_ns(), "", line.trim_end());
            }
        });
        Ok(Self {
            name: name.to_owned(),
            flavor,
            pid,
            _stdin: child.stdin.take(),
            child,
            log: log.clone(),
            status: None,
        })
    }

    /// Its name in the log (also its identity, for the helpers of this crate).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Which implementation it runs.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// Sends `sig` and records it in the log; returns the recorded time.
    ///
    /// The stamp is taken after sending (the process can no longer act on its
    /// own after it), except for SIGCONT, stamped before sending (the process
    /// cannot act before it).
    ///
    /// # Errors
    /// When `kill(2)` fails.
    pub fn signal(&self, sig: Sig) -> Result<u64> {
        let before = now_ns();
        rustix::process::kill_process(self.pid, sig.signal())
            .with_context(|| format!("sending {sig:?} to {}", self.name))?;
        // SIGKILL and SIGSTOP take effect at some point before `kill` returns:
        // the later reading is the conservative one. SIGCONT and SIGTERM start
        // something in the process, which may react (and print a timestamp)
        // before `kill` returns: the earlier reading is the right one.
        let at = if matches!(sig, Sig::Cont | Sig::Term) {
            before
        } else {
            now_ns()
        };
        Ok(self
            .log
            .record(&self.name, Kind::Signal(sig), at, "", &format!("{sig:?}")))
    }

    /// SIGKILL, then reaps the process. Returns the time of the kill.
    ///
    /// # Errors
    /// When the signal cannot be sent or the process is not reaped within 10 s.
    pub async fn kill(&mut self) -> Result<u64> {
        let at = self.signal(Sig::Kill)?;
        self.wait_exit(Duration::from_secs(10)).await?;
        Ok(at)
    }

    /// Waits for the process to exit and records it.
    ///
    /// # Errors
    /// After `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .with_context(|| format!("{} did not exit within {timeout:?}", self.name))?
            .with_context(|| format!("waiting for {}", self.name))?;
        self.log
            .record(&self.name, Kind::Exited, now_ns(), "", &status.to_string());
        self.status = Some(status);
        Ok(status)
    }
}

// ---------------------------------------------------------------------------
// Leadership intervals
// ---------------------------------------------------------------------------

/// One term of one process: from its `started-leading` to its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    /// The process.
    pub process: String,
    /// Its `started-leading` time.
    pub start: u64,
    /// Its end (see [`leadership_intervals`]).
    pub end: u64,
    /// Whether the process still leads (the end is the time of the check).
    pub open: bool,
    /// How the end was determined.
    pub end_note: String,
}

impl Interval {
    fn describe(&self, base: u64) -> String {
        format!(
            "{} [{} .. {}] ({}{})",
            self.process,
            fmt_delta(base, self.start),
            fmt_delta(base, self.end),
            self.end_note,
            if self.open { ", still open" } else { "" }
        )
    }
}

/// The leadership intervals of every process of `entries`, in log order per
/// process. `now` ends the intervals of processes still leading.
///
/// An interval runs from a `started-leading` line to the process's next
/// `stopped-leading`; without one, to the process's death: the time the test
/// sent SIGKILL, reaped it or saw its stdout close (the earliest), or its last
/// line if later. Two refinements, both of which only shorten an interval to
/// when the process demonstrably could not act any more:
///
/// - **Frozen**: a process SIGSTOPped while leading cannot act until SIGCONT.
///   If it prints no `WORK` line stamped after the SIGSTOP before its
///   `stopped-leading`, its interval ends at the SIGSTOP. A `WORK` line after
///   the resume keeps the whole interval, so that acting on a stale term still
///   shows as an overlap.
/// - **client-go release**: `goelect` ([`Flavor::Go`]) prints `stopped-leading`
///   after releasing on SIGTERM, but client-go cancels the leading context
///   (ends the leader's work) before it writes the release, so a SIGTERMed
///   goelect's interval ends at the SIGTERM.
pub fn leadership_intervals(entries: &[Entry], now: u64) -> Vec<Interval> {
    let mut order: Vec<&str> = Vec::new();
    let mut by_process: HashMap<&str, Vec<&Entry>> = HashMap::new();
    for e in entries {
        if !by_process.contains_key(e.process.as_str()) {
            order.push(&e.process);
        }
        by_process.entry(&e.process).or_default().push(e);
    }
    let mut out = Vec::new();
    for process in order {
        let own = &by_process[process];
        let flavor_go = own
            .iter()
            .any(|e| e.kind == Kind::Spawned && e.detail.starts_with("Go"));
        let death = own
            .iter()
            .filter(|e| {
                matches!(
                    e.kind,
                    Kind::Signal(Sig::Kill) | Kind::Exited | Kind::StdoutClosed
                )
            })
            .map(|e| e.at)
            .min();
        let last_line = own
            .iter()
            .filter(|e| e.is_own_line())
            .map(|e| e.at)
            .max()
            .unwrap_or(0);
        let mut raw = Vec::new();
        let mut start = None;
        for e in own {
            match e.kind {
                Kind::StartedLeading => start = Some(e.at),
                Kind::StoppedLeading => {
                    if let Some(s) = start.take() {
                        raw.push(Interval {
                            process: process.to_owned(),
                            start: s,
                            end: e.at,
                            open: false,
                            end_note: format!("stopped-leading {}", e.detail),
                        });
                    }
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            let (end, open, note) = match death {
                Some(d) => (d.max(last_line), false, "died while leading".to_owned()),
                None => (now.max(last_line), true, "leading".to_owned()),
            };
            raw.push(Interval {
                process: process.to_owned(),
                start: s,
                end,
                open,
                end_note: note,
            });
        }
        for mut iv in raw {
            refine(&mut iv, own, flavor_go);
            out.push(iv);
        }
    }
    out
}

/// Applies the refinements documented on [`leadership_intervals`].
fn refine(iv: &mut Interval, own: &[&Entry], flavor_go: bool) {
    let (start, end) = (iv.start, iv.end);
    let in_term = move |at: u64| at >= start && at < end;
    if let Some(stop) = own
        .iter()
        .find(|e| e.kind == Kind::Signal(Sig::Stop) && in_term(e.at))
    {
        let worked_after = own
            .iter()
            .any(|e| e.kind == Kind::Work && e.at > stop.at && e.at <= iv.end);
        if !worked_after {
            let resumed = own
                .iter()
                .find(|e| e.kind == Kind::Signal(Sig::Cont) && e.at > stop.at)
                .map_or_else(
                    || "not resumed".to_owned(),
                    |c| format!("resumed {}", fmt_delta(stop.at, c.at)),
                );
            iv.end_note = format!(
                "frozen by SIGSTOP, no WORK after it ({resumed} after the stop; then {})",
                iv.end_note
            );
            iv.end = stop.at;
            iv.open = false;
        }
    }
    if flavor_go
        && let Some(term) = own
            .iter()
            .find(|e| e.kind == Kind::Signal(Sig::Term) && in_term(e.at))
    {
        iv.end_note = format!(
            "client-go leading context cancelled on SIGTERM (then {} at {})",
            iv.end_note,
            fmt_delta(term.at, iv.end)
        );
        iv.end = iv.end.min(term.at);
        iv.open = false;
    }
}

/// Checks that no two intervals overlap: sorted by start, each interval's end
/// is at or before the next one's start.
///
/// # Errors
/// One line per overlap, naming both intervals (times relative to `base`).
pub fn check_no_overlap(intervals: &[Interval], base: u64) -> Result<()> {
    let mut sorted: Vec<&Interval> = intervals.iter().collect();
    sorted.sort_by_key(|iv| (iv.start, iv.end));
    let mut problems = Vec::new();
    let mut latest: Option<&Interval> = None;
    for iv in sorted {
        if let Some(prev) = latest {
            if prev.end > iv.start {
                problems.push(format!(
                    "OVERLAP by {}: {}  and  {}",
                    fmt_ms(prev.end.min(iv.end) - iv.start),
                    prev.describe(base),
                    iv.describe(base)
                ));
            }
            if iv.end > prev.end {
                latest = Some(iv);
            }
        } else {
            latest = Some(iv);
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        bail!("two candidates led at once:\n{}", problems.join("\n"))
    }
}

/// The result of [`check_log`].
#[derive(Clone, Debug)]
pub struct Checked {
    /// The leadership intervals.
    pub intervals: Vec<Interval>,
    /// Remarks of [`check_takeovers`] (client-go takeovers that relied on its
    /// one-second record comparison).
    pub notes: Vec<String>,
}

/// Checks `log` (now): no two leadership intervals overlap
/// ([`check_no_overlap`]), no takeover of an unexpired Lease in the test's
/// own records ([`check_takeovers`]), and every `WORK` line lies inside an
/// interval of its own process.
///
/// # Errors
/// Every violation, with the intervals.
pub fn check_log(log: &EventLog) -> Result<Checked> {
    let entries = log.entries();
    let base = entries.iter().map(|e| e.at).min().unwrap_or(0);
    let intervals = leadership_intervals(&entries, now_ns());
    check_no_overlap(&intervals, base)?;
    let notes = check_takeovers(&entries, base)?;
    let stray: Vec<String> = entries
        .iter()
        .filter(|e| e.kind == Kind::Work)
        .filter(|e| {
            !intervals
                .iter()
                .any(|iv| iv.process == e.process && iv.start <= e.at && e.at <= iv.end)
        })
        .map(|e| format!("{} WORK at {}", e.process, fmt_delta(base, e.at)))
        .collect();
    if !stray.is_empty() {
        bail!(
            "WORK outside its process's leadership intervals: {}\nintervals:\n{}",
            stray.join(", "),
            describe_intervals(&intervals, base)
        );
    }
    Ok(Checked { intervals, notes })
}

/// The intervals as text, one per line, times relative to `base`.
pub fn describe_intervals(intervals: &[Interval], base: u64) -> String {
    intervals
        .iter()
        .map(|iv| iv.describe(base))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until the election has settled among the live processes `live`:
/// exactly one of them leads, and every other one's last `new-leader` line
/// names it. Returns the leader's name.
///
/// # Errors
/// After `timeout`.
pub async fn wait_settled(log: &EventLog, live: &[&str], timeout: Duration) -> Result<String> {
    log.wait_until("exactly one leader, seen by all the others", timeout, |entries| {
        let intervals = leadership_intervals(entries, now_ns());
        let leading: Vec<&Interval> = intervals
            .iter()
            .filter(|iv| iv.open && live.contains(&iv.process.as_str()))
            .collect();
        let [leader] = leading.as_slice() else {
            return None;
        };
        let seen_by_all = live.iter().filter(|p| **p != leader.process).all(|p| {
            entries
                .iter()
                .rev()
                .find(|e| e.process == *p && e.kind == Kind::NewLeader)
                .is_some_and(|e| e.who == leader.process)
        });
        seen_by_all.then(|| leader.process.clone())
    })
    .await
}

/// Waits until each of `observers` has printed a `new-leader` line naming
/// `leader`, stamped at or after `after`.
///
/// # Errors
/// After `timeout` (for all of them together).
pub async fn wait_seen_by(
    log: &EventLog,
    observers: &[&str],
    leader: &str,
    after: u64,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    for observer in observers {
        log.wait_for(
            &format!("{observer} to see {leader} lead"),
            deadline.saturating_duration_since(Instant::now()),
            |e| e.process == *observer && e.kind == Kind::NewLeader && e.who == leader && e.at >= after,
        )
        .await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Scenario runs
// ---------------------------------------------------------------------------

/// Runs of one scenario: prints each run's outcome, counts them, and fails at
/// the end if any run failed.
#[derive(Debug)]
pub struct Runs {
    scenario: String,
    total: usize,
    failures: Vec<String>,
    started: Instant,
}

impl Runs {
    /// Starts counting runs of `scenario`.
    pub fn new(scenario: &str) -> Self {
        println!("== {scenario}");
        Self {
            scenario: scenario.to_owned(),
            total: 0,
            failures: Vec::new(),
            started: Instant::now(),
        }
    }

    /// Records run `run`: its result (a summary of its measurements) and the
    /// check of its log by [`check_log`], which applies to every run, failed
    /// or not. On failure the whole log is printed; with `KRL_FAILOVER_VERBOSE`
    /// set, the logs of passing runs too.
    pub fn record(&mut self, run: usize, result: Result<String>, log: &EventLog) {
        self.total += 1;
        let checked = check_log(log);
        let failure = match (&result, &checked) {
            (Ok(_), Ok(_)) => None,
            (Err(e), Ok(_)) => Some(format!("{e:#}")),
            (Ok(_), Err(c)) => Some(format!("{c:#}")),
            (Err(e), Err(c)) => Some(format!("{e:#}\nand: {c:#}")),
        };
        match (failure, result) {
            (None, Ok(summary)) => {
                println!("[{} #{run}] ok: {summary}", self.scenario);
                for note in checked.iter().flat_map(|c| &c.notes) {
                    println!("[{} #{run}] note: {note}", self.scenario);
                }
                if std::env::var_os("KRL_FAILOVER_VERBOSE").is_some() {
                    println!("--- log of the run ---\n{}--- end ---", log.dump());
                }
            }
            (failure, _) => {
                let f = failure.unwrap_or_default();
                println!(
                    "[{} #{run}] FAILED: {f}\n--- event log of the run ---\n{}--- end of log ---",
                    self.scenario,
                    log.dump()
                );
                self.failures.push(format!("run #{run}: {f}"));
            }
        }
    }

    /// Prints the count of runs that passed.
    ///
    /// # Errors
    /// When any run failed: every failure.
    pub fn finish(self) -> Result<()> {
        let passed = self.total - self.failures.len();
        println!(
            "== {}: {passed}/{} runs passed ({:.1} s)",
            self.scenario,
            self.total,
            self.started.elapsed().as_secs_f64()
        );
        if self.failures.is_empty() {
            Ok(())
        } else {
            bail!(
                "{}: {} of {} runs failed:\n{}",
                self.scenario,
                self.failures.len(),
                self.total,
                self.failures.join("\n")
            )
        }
    }
}

// ---------------------------------------------------------------------------
// Proxy
// ---------------------------------------------------------------------------

const PASS: u8 = 0;
const BLACK_HOLE: u8 = 1;
const REFUSE: u8 = 2;

/// A network partition mode of the [`Proxy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Partition {
    /// Silence: bytes on existing connections are swallowed in both directions
    /// (the peers see nothing, not even a reset); new connections are accepted
    /// and swallowed too. Clients find out only through their own timeouts.
    BlackHole,
    /// Refusal: existing connections are reset at once, new ones are reset
    /// right after they are accepted.
    Refuse,
}

/// Counters of a [`Proxy`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections reset on accept (refused).
    pub refused: u64,
    /// Connections closed by [`Proxy::drop_connections`], [`Proxy::partition`]
    /// (refuse) or [`Proxy::heal`].
    pub dropped: u64,
    /// Of those, connections with a request in flight: bytes forwarded to the
    /// apiserver and no answer forwarded back yet, on an established
    /// connection (past the TLS handshake).
    pub dropped_in_flight: u64,
    /// Chunks swallowed by a black hole.
    pub swallowed_chunks: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Control {
    drop_all: u64,
    heal: u64,
}

#[derive(Default)]
struct ConnState {
    /// A request was forwarded and no answer forwarded back yet.
    in_flight: AtomicBool,
    /// Chunks forwarded to the client so far (2+ means past the TLS handshake).
    to_client_chunks: AtomicU64,
    /// Bytes were swallowed: the stream is corrupt, never forward again.
    poisoned: AtomicBool,
}

impl ConnState {
    fn request_in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) && self.to_client_chunks.load(Ordering::Acquire) >= 2
    }
}

struct ProxyShared {
    upstream: SocketAddr,
    mode: AtomicU8,
    latency_us: AtomicU64,
    control: watch::Receiver<Control>,
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
    next_id: AtomicU64,
    stats: Mutex<ProxyStats>,
    request_sent: Notify,
}

impl ProxyShared {
    fn stats(&self) -> MutexGuard<'_, ProxyStats> {
        self.stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn conns(&self) -> MutexGuard<'_, HashMap<u64, Arc<ConnState>>> {
        self.conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn black_holed(&self) -> bool {
        self.mode.load(Ordering::Acquire) == BLACK_HOLE
    }

    fn latency(&self) -> Duration {
        Duration::from_micros(self.latency_us.load(Ordering::Acquire))
    }
}

/// A TCP proxy on `127.0.0.1:<free port>` to the apiserver, for the
/// candidates whose network is to fail. Point a candidate at it with
/// [`Proxy::kubeconfig`] (the apiserver's certificate is for `127.0.0.1`, so
/// TLS still verifies through it). Dropping it closes every connection.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<ProxyShared>,
    control: watch::Sender<Control>,
    accept: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Connections end when the control channel closes.
        self.control.send_modify(|c| c.drop_all += 1);
    }
}

impl Proxy {
    /// Starts a proxy to `127.0.0.1:upstream_port`.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(upstream_port: u16) -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .context("binding the proxy")?;
        let addr = listener.local_addr()?;
        let (control, control_rx) = watch::channel(Control::default());
        let shared = Arc::new(ProxyShared {
            upstream: SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port)),
            mode: AtomicU8::new(PASS),
            latency_us: AtomicU64::new(0),
            control: control_rx,
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            stats: Mutex::new(ProxyStats::default()),
            request_sent: Notify::new(),
        });
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(s.clone(), stream));
            }
        });
        Ok(Self {
            addr,
            shared,
            control,
            accept,
        })
    }

    /// Its URL, `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Writes a copy of the kubeconfig at `source` into `dir`, its server URL
    /// replaced by this proxy's, and returns its path.
    ///
    /// # Errors
    /// When the kubeconfig cannot be read or written.
    pub fn kubeconfig(&self, source: &Path, dir: &Path) -> Result<PathBuf> {
        let mut kc = kube::config::Kubeconfig::read_from(source)
            .with_context(|| format!("reading {}", source.display()))?;
        for named in &mut kc.clusters {
            if let Some(cluster) = named.cluster.as_mut() {
                cluster.server = Some(self.url());
            }
        }
        let path = dir.join(format!("proxy-{}.kubeconfig", self.addr.port()));
        std::fs::write(&path, serde_json::to_vec_pretty(&kc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Cuts the network between the clients and the apiserver (see
    /// [`Partition`]) until [`Proxy::heal`].
    pub fn partition(&self, how: Partition) {
        match how {
            Partition::BlackHole => self.shared.mode.store(BLACK_HOLE, Ordering::Release),
            Partition::Refuse => {
                self.shared.mode.store(REFUSE, Ordering::Release);
                self.drop_connections();
            }
        }
    }

    /// Ends a partition: forwards again, and closes the connections that lost
    /// bytes to a black hole (their TLS streams are broken) so that clients
    /// reconnect at once.
    pub fn heal(&self) {
        self.shared.mode.store(PASS, Ordering::Release);
        let poisoned = self
            .shared
            .conns()
            .values()
            .filter(|c| c.poisoned.load(Ordering::Acquire))
            .count();
        self.shared.stats().dropped += poisoned as u64;
        self.control.send_modify(|c| c.heal += 1);
    }

    /// Delays every chunk, in both directions, by `latency` (order kept; no
    /// throughput limit). Applies to chunks read from now on.
    pub fn set_latency(&self, latency: Duration) {
        self.shared.latency_us.store(
            u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
            Ordering::Release,
        );
    }

    /// Closes (resets) every open connection now; returns how many there were
    /// and how many had a request in flight.
    pub fn drop_connections(&self) -> (u64, u64) {
        let (all, in_flight) = {
            let conns = self.shared.conns();
            let in_flight = conns.values().filter(|c| c.request_in_flight()).count();
            (conns.len() as u64, in_flight as u64)
        };
        {
            let mut stats = self.shared.stats();
            stats.dropped += all;
            stats.dropped_in_flight += in_flight;
        }
        self.control.send_modify(|c| c.drop_all += 1);
        (all, in_flight)
    }

    /// Waits until a request is in flight on an established connection (see
    /// [`ProxyStats::dropped_in_flight`]).
    ///
    /// # Errors
    /// After `timeout`.
    pub async fn wait_request_in_flight(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.shared.request_sent.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shared.conns().values().any(|c| c.request_in_flight()) {
                return Ok(());
            }
            tokio::time::timeout_at(deadline, notified)
                .await
                .map_err(|_| anyhow!("no request in flight through the proxy within {timeout:?}"))?;
        }
    }

    /// Its counters.
    pub fn stats(&self) -> ProxyStats {
        *self.shared.stats()
    }
}

/// Serves one accepted connection.
async fn serve(shared: Arc<ProxyShared>, client: TcpStream) {
    // Reset rather than FIN when closing: a dropped connection looks dropped.
    let _ = client.set_zero_linger();
    let _ = client.set_nodelay(true);
    shared.stats().accepted += 1;
    if shared.mode.load(Ordering::Acquire) == REFUSE {
        shared.stats().refused += 1;
        return;
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let state = Arc::new(ConnState::default());
    shared.conns().insert(id, state.clone());
    let mut control = shared.control.clone();
    let start = *control.borrow_and_update();

    let black_holed = shared.black_holed();
    let upstream = if black_holed {
        state.poisoned.store(true, Ordering::Release);
        None
    } else if let Ok(up) = TcpStream::connect(shared.upstream).await {
        let _ = up.set_zero_linger();
        let _ = up.set_nodelay(true);
        Some(up)
    } else {
        // The apiserver is down: reset the client, as it would be.
        shared.conns().remove(&id);
        return;
    };
    let (client_r, client_w) = client.into_split();
    let ended = ended_by_control(&mut control, &state, start);
    if let Some(up) = upstream {
        let (up_r, up_w) = up.into_split();
        let to_server = pump(client_r, up_w, shared.clone(), state.clone(), true);
        let to_client = pump(up_r, client_w, shared.clone(), state.clone(), false);
        tokio::select! {
            ((), ()) = async { tokio::join!(to_server, to_client) } => {}
            () = ended => {}
        }
    } else {
        tokio::select! {
            () = swallow(client_r, &shared) => {}
            () = ended => {}
        }
        drop(client_w);
    }
    shared.conns().remove(&id);
}

/// Resolves when the connection must be closed: every connection on
/// `drop_all` (or when the proxy is gone), poisoned ones on `heal`.
async fn ended_by_control(control: &mut watch::Receiver<Control>, state: &ConnState, start: Control) {
    loop {
        if control.changed().await.is_err() {
            return;
        }
        let now = *control.borrow_and_update();
        if now.drop_all != start.drop_all {
            return;
        }
        if now.heal != start.heal && state.poisoned.load(Ordering::Acquire) {
            return;
        }
    }
}

/// Reads and discards everything (a black-holed connection).
async fn swallow(mut r: impl AsyncRead + Unpin, shared: &ProxyShared) {
    let mut buf = vec![0; 16 * 1024];
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        shared.stats().swallowed_chunks += 1;
    }
}

/// Forwards one direction, each chunk delayed by the latency in force when it
/// was read, swallowing chunks while black-holed.
async fn pump(
    mut r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    shared: Arc<ProxyShared>,
    state: Arc<ConnState>,
    to_server: bool,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Option<Vec<u8>>)>();
    let reader = {
        let (shared, state) = (shared.clone(), state.clone());
        async move {
            let mut buf = vec![0; 16 * 1024];
            loop {
                let n = match r.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = tx.send((Instant::now(), None));
                        break;
                    }
                    Ok(n) => n,
                };
                if shared.black_holed() || state.poisoned.load(Ordering::Acquire) {
                    state.poisoned.store(true, Ordering::Release);
                    shared.stats().swallowed_chunks += 1;
                    continue;
                }
                if tx
                    .send((Instant::now() + shared.latency(), Some(buf[..n].to_vec())))
                    .is_err()
                {
                    break;
                }
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            let Some(bytes) = chunk else {
                let _ = w.shutdown().await;
                break;
            };
            // A partition that began while the chunk waited swallows it too.
            if shared.black_holed() || state.poisoned.load(Ordering::Acquire) {
                state.poisoned.store(true, Ordering::Release);
                shared.stats().swallowed_chunks += 1;
                continue;
            }
            if w.write_all(&bytes).await.is_err() {
                break;
            }
            if to_server {
                state.in_flight.store(true, Ordering::Release);
                if state.to_client_chunks.load(Ordering::Acquire) >= 2 {
                    shared.request_sent.notify_waiters();
                }
            } else {
                state.in_flight.store(false, Ordering::Release);
                state.to_client_chunks.fetch_add(1, Ordering::AcqRel);
            }
        }
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn log_of(lines: &[(&str, &str)]) -> EventLog {
        let log = EventLog::new();
        for (process, line) in lines {
            if let Some(rest) = line.strip_prefix("spawned ") {
                log.record(process, Kind::Spawned, 0, "", rest);
            } else if let Some((sig, at)) = line.strip_prefix("signal ").and_then(|r| r.split_once(' ')) {
                let sig = match sig {
                    "KILL" => Sig::Kill,
                    "TERM" => Sig::Term,
                    "STOP" => Sig::Stop,
                    _ => Sig::Cont,
                };
                log.record(
                    process,
                    Kind::Signal(sig),
                    at.parse::<u64>().unwrap() * MS,
                    "",
                    "",
                );
            } else {
                let (kind, at, who, detail) = parse_line(line).expect("a candidate line");
                log.record(process, kind, at * MS, &who, &detail);
            }
        }
        log
    }

    #[test]
    fn parses_both_formats() {
        assert_eq!(
            parse_line("EVENT stopped-leading 12 a TakenOver { holder: \"b\" }"),
            Some((
                Kind::StoppedLeading,
                12,
                "a".to_owned(),
                "TakenOver { holder: \"b\" }".to_owned()
            ))
        );
        assert_eq!(
            parse_line("EVENT new-leader 7 "),
            Some((Kind::NewLeader, 7, String::new(), String::new()))
        );
        assert_eq!(
            parse_line("READY 5"),
            Some((Kind::Ready, 5, String::new(), String::new()))
        );
        assert_eq!(parse_line("WORK x"), None);
    }

    #[test]
    fn overlap_is_reported_with_both_intervals() {
        let log = log_of(&[
            ("a", "EVENT started-leading 100 a"),
            ("b", "EVENT started-leading 250 b"),
            ("a", "EVENT stopped-leading 300 a RenewDeadlineExceeded"),
        ]);
        let err = check_log(&log).unwrap_err().to_string();
        assert!(err.contains("OVERLAP by 50.000 ms"), "{err}");
        assert!(err.contains("a [") && err.contains("b ["), "{err}");
    }

    #[test]
    fn back_to_back_terms_pass() {
        let log = log_of(&[
            ("a", "EVENT started-leading 100 a"),
            ("a", "WORK 150"),
            ("a", "EVENT stopped-leading 300 a Released"),
            ("b", "EVENT started-leading 300 b"),
            ("b", "signal KILL 400"),
            ("c", "EVENT started-leading 2400 c"),
        ]);
        let intervals = check_log(&log).unwrap().intervals;
        assert_eq!(intervals.len(), 3);
        assert_eq!(intervals[1].end, 400 * MS);
        assert!(intervals[2].open);
    }

    #[test]
    fn a_killed_leader_leads_until_its_kill() {
        let log = log_of(&[
            ("a", "EVENT started-leading 100 a"),
            ("a", "signal KILL 1000"),
            ("b", "EVENT started-leading 900 b"),
        ]);
        assert!(check_log(&log).is_err());
    }

    #[test]
    fn a_frozen_leader_ends_at_the_freeze_unless_it_works_after() {
        let frozen = [
            ("a", "EVENT started-leading 100 a"),
            ("a", "WORK 150"),
            ("a", "signal STOP 200"),
            ("b", "EVENT started-leading 2300 b"),
            ("a", "signal CONT 4200"),
            ("a", "EVENT stopped-leading 4201 a RenewDeadlineExceeded"),
        ];
        let intervals = check_log(&log_of(&frozen)).unwrap().intervals;
        assert_eq!(intervals[0].end, 200 * MS);

        let mut worked = frozen.to_vec();
        worked.insert(5, ("a", "WORK 4200"));
        let err = check_log(&log_of(&worked)).unwrap_err().to_string();
        assert!(err.contains("OVERLAP"), "{err}");
    }

    #[test]
    fn work_outside_a_term_is_reported() {
        let log = log_of(&[
            ("a", "EVENT started-leading 100 a"),
            ("a", "EVENT stopped-leading 200 a Released"),
            ("a", "WORK 250"),
        ]);
        let err = check_log(&log).unwrap_err().to_string();
        assert!(err.contains("WORK outside"), "{err}");
    }

    #[test]
    fn a_sigtermed_goelect_ends_at_the_signal_but_a_rust_candidate_does_not() {
        let lines = |flavor: &'static str| {
            log_of(&[
                ("g", flavor),
                ("g", "EVENT started-leading 100 g"),
                ("g", "signal TERM 500"),
                ("r", "EVENT started-leading 520 r"),
                ("g", "EVENT stopped-leading 530 g"),
            ])
        };
        assert!(check_log(&lines("spawned Go, pid 1")).is_ok());
        assert!(check_log(&lines("spawned Rust, pid 1")).is_err());
    }

    /// An echo server on loopback; returns its port.
    async fn echo_server() -> u16 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        port
    }

    async fn round_trip(s: &mut TcpStream, timeout: Duration) -> std::io::Result<usize> {
        s.write_all(b"ping").await?;
        let mut buf = [0; 4];
        match tokio::time::timeout(timeout, s.read(&mut buf)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
        }
    }

    #[tokio::test]
    async fn proxy_forwards_delays_partitions_and_drops() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut s, Duration::from_secs(5)).await.unwrap(), 4);

        proxy.set_latency(Duration::from_millis(100));
        let t = Instant::now();
        assert_eq!(round_trip(&mut s, Duration::from_secs(5)).await.unwrap(), 4);
        assert!(t.elapsed() >= Duration::from_millis(200), "{:?}", t.elapsed());
        proxy.set_latency(Duration::ZERO);

        // Black hole: silence on the old connection and on a new one.
        proxy.partition(Partition::BlackHole);
        let err = round_trip(&mut s, Duration::from_millis(300)).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        let mut fresh = TcpStream::connect(proxy.addr).await.unwrap();
        let err = round_trip(&mut fresh, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        // Healing closes both (their bytes were lost); new ones work.
        proxy.heal();
        assert!(matches!(
            round_trip(&mut s, Duration::from_secs(5)).await,
            Ok(0) | Err(_)
        ));
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut s, Duration::from_secs(5)).await.unwrap(), 4);

        // Refuse: the old connection is reset, and so is a new one.
        proxy.partition(Partition::Refuse);
        assert!(matches!(
            round_trip(&mut s, Duration::from_secs(5)).await,
            Ok(0) | Err(_)
        ));
        let mut fresh = TcpStream::connect(proxy.addr).await.unwrap();
        assert!(matches!(
            round_trip(&mut fresh, Duration::from_secs(5)).await,
            Ok(0) | Err(_)
        ));
        proxy.heal();

        // Drop: open connections are closed at once.
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut s, Duration::from_secs(5)).await.unwrap(), 4);
        let (dropped, _) = proxy.drop_connections();
        assert_eq!(dropped, 1);
        assert!(matches!(
            round_trip(&mut s, Duration::from_secs(5)).await,
            Ok(0) | Err(_)
        ));
        let stats = proxy.stats();
        assert!(stats.refused >= 1 && stats.swallowed_chunks >= 2, "{stats:?}");
    }

    #[test]
    fn takeovers_of_unexpired_leases_are_reported() {
        let record = |log: &EventLog, at: u64, who: &str, rv: u32, renew: &str| {
            log.record(
                "lease",
                Kind::Record,
                at * MS,
                who,
                &format!("duration=2 transitions=0 rv={rv} acquire=2026-01-01T00:00:10.1Z renew=2026-01-01T00:00:{renew}Z"),
            );
        };
        // a renews at 0 and 500; b takes over at 2450 (in time, within the
        // slack) after a's last renewal; c after a release at once.
        let log = EventLog::new();
        record(&log, 0, "a", 1, "10.1");
        record(&log, 500, "a", 2, "10.6");
        record(&log, 2450, "b", 3, "12.5");
        record(&log, 2600, "", 4, "12.7");
        record(&log, 2610, "c", 5, "12.7");
        assert!(check_log(&log).is_ok());
        // b takes over 1.5 s after a's last renewal.
        let log = EventLog::new();
        record(&log, 0, "a", 1, "10.1");
        record(&log, 500, "a", 2, "10.6");
        record(&log, 2000, "b", 3, "12.1");
        let err = check_log(&log).unwrap_err().to_string();
        assert!(err.contains("b took the lease from a 1500.000 ms"), "{err}");
        // A client-go taker cannot see a renewal in the same second as the
        // version before it: allowed, with a note; not across seconds.
        let go = |second_renewal: &str| {
            let log = EventLog::new();
            log.record("g", Kind::Spawned, 0, "", "Go, pid 1");
            record(&log, 0, "a", 1, "10.1");
            record(&log, 500, "a", 2, second_renewal);
            record(&log, 2100, "g", 3, "12.2");
            check_log(&log)
        };
        let notes = go("10.6").unwrap().notes;
        assert!(notes[0].contains("same second"), "{notes:?}");
        assert!(go("11.0").is_err());
    }

    #[tokio::test]
    async fn wait_for_sees_later_entries_and_times_out() {
        let log = EventLog::new();
        let l = log.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            l.record("a", Kind::StartedLeading, 5, "a", "");
        });
        let e = log
            .wait_for("a leads", Duration::from_secs(5), |e| {
                e.kind == Kind::StartedLeading
            })
            .await
            .unwrap();
        assert_eq!(e.process, "a");
        assert!(
            log.wait_for("never", Duration::from_millis(20), |_| false)
                .await
                .is_err()
        );
    }
}
