//! Chaos on a highly available control plane, judged by what the guarded
//! work wrote: [`run`].
//!
//! A run starts a [`HaControlPlane`] (three etcd members, two apiservers)
//! and two groups of candidates side by side, one per implementation: this
//! crate's `candidate` and client-go's `goelect`, [`Config::slots`] of each,
//! on a Lease of their own. Slot `k` talks to apiserver `k % 2`; the last
//! [`Config::proxied`] slots reach it through a fault [`Proxy`]. Every
//! candidate authenticates as one user of group [`GROUP`], which RBAC lets
//! use Leases and `ConfigMaps` in the run's namespace.
//!
//! While it leads, a candidate appends to its group's ledger `ConfigMap`
//! every [`Config::work_interval`] (see [`ledger`] for the format): ours
//! through `kube_runtime_lease_examples::ledger` (read, check
//! `LeaseGuard::is_valid` and the stored fencing token, write with the
//! resourceVersion read), client-go's the way a client-go user does (read,
//! check the leading context, write with the resourceVersion read; it has
//! no token). The run watches both ledgers through both apiservers.
//!
//! Faults come from a seeded [`Schedule`], one at a time with quiet time in
//! between, each applied to both groups at once (a candidate fault hits the
//! same slot, or each group's leader): SIGKILL, SIGTERM and SIGSTOP (past the
//! lease) of candidates, partitions and latency of a proxied candidate's
//! path, an apiserver restart, SIGKILL (and restart) of the etcd leader,
//! deletion of the Leases, and a burst of load that API Priority and Fairness
//! answers with 429: for the burst, a `FlowSchema` routes [`GROUP`] to the
//! priority level [`APF_LEVEL`] (one share, reject when busy), created at
//! the start of the run, and is deleted when the burst ends, so that outside
//! the fault the candidates are served as usual. The load is
//! [`Config::burst_load`] loops of LIST as the candidates' user, without
//! kube's retry layer; the apiservers' own count of rejected requests
//! (`apiserver_flowcontrol_rejected_requests_total`) is reported.
//!
//! The verdict ([`Report`]), per implementation, from the ledger
//! ([`ledger::check`]): stale writes (a term writing after a later term's
//! first write) and lost updates, fencing tokens that go backwards, gaps with
//! no write longer than lease duration + renew deadline + [`Config::gap_slack`]
//! once the faults had healed; and from the candidates' own account of when
//! they led ([`leadership_intervals`]), overlapping terms.

pub mod ledger;
pub mod schedule;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};

use self::ledger::{Checked, Seen, Window};
use self::schedule::{Fault, Schedule, Target};
use crate::candidates::{candidate_bin, go_candidate, rust_candidate};
use crate::clock::{fmt_ms, now_ns, ns};
use crate::control_plane::{APISERVERS, GOELECT_BIN, HaControlPlane, bin_dir};
use crate::events::{EventLog, Flavor, Kind, Sig};
use crate::intervals::{check_no_overlap, leadership_intervals};
use crate::lease::LeaseRef;
use crate::process::{Outputs, Process};
use crate::proxy::{Partition, Proxy};
use crate::timings::Timings;

/// The namespace of a run.
pub const NAMESPACE: &str = "chaos";
/// The group of the candidates' user (RBAC and the APF fault match it).
pub const GROUP: &str = "krl-chaos";
/// The candidates' user.
pub const USER: &str = "krl-chaos-candidate";
/// The priority level of the APF fault.
pub const APF_LEVEL: &str = "krl-chaos-tiny";

/// What a run does.
#[derive(Clone, Debug)]
pub struct Config {
    /// How long faults are injected.
    pub duration: Duration,
    /// The schedule's seed.
    pub seed: u64,
    /// Every candidate's timings.
    pub timings: Timings,
    /// Candidates per implementation.
    pub slots: usize,
    /// Of those, how many reach their apiserver through a fault proxy (the last ones).
    pub proxied: usize,
    /// How often a leader appends to its ledger.
    pub work_interval: Duration,
    /// Added to lease duration + renew deadline for the longest gap with no
    /// write once the faults have healed: a write interval, the requests of a
    /// takeover and the write on a loaded machine.
    pub gap_slack: Duration,
    /// Concurrent requests of the APF burst.
    pub burst_load: usize,
    /// Where candidates' stderr and the run's log go (default: a temporary
    /// directory, removed at the end).
    pub log_dir: Option<PathBuf>,
}

impl Config {
    /// The defaults: [`Timings::FAST`], 4 candidates per implementation, 2 of
    /// them proxied, a write every 100 ms, 1 s of slack, 64 requests in the burst.
    #[must_use]
    pub fn new(duration: Duration, seed: u64) -> Self {
        Self {
            duration,
            seed,
            timings: Timings::FAST,
            slots: 4,
            proxied: 2,
            work_interval: Duration::from_millis(100),
            gap_slack: Duration::from_secs(1),
            burst_load: 64,
            log_dir: None,
        }
    }

    /// The longest gap allowed once faults have healed.
    #[must_use]
    pub fn gap_bound(&self) -> Duration {
        self.timings.lease_duration + self.timings.renew_deadline + self.gap_slack
    }
}

/// Which implementation a group of candidates runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Implementation {
    /// This crate (the `candidate` binary).
    Ours,
    /// client-go (`goelect`).
    ClientGo,
}

impl Implementation {
    /// Both, in report order.
    pub const ALL: [Self; 2] = [Self::Ours, Self::ClientGo];

    /// The name in the report.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Ours => "kube-runtime-lease",
            Self::ClientGo => "client-go",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Self::Ours => "rust",
            Self::ClientGo => "go",
        }
    }
}

/// One fault as it happened.
#[derive(Clone, Debug)]
pub struct Injected {
    /// What the schedule drew.
    pub fault: Fault,
    /// What it hit, per group, and what it saw (e.g. how many 429s the burst got).
    pub note: String,
    /// From its start to its healing.
    pub window: Window,
}

/// One implementation's verdict.
#[derive(Clone, Debug)]
pub struct Column {
    /// Which.
    pub implementation: Implementation,
    /// The ledger's verdict.
    pub ledger: Checked,
    /// Overlapping terms by the candidates' own account, one line each.
    pub overlaps: Vec<String>,
    /// The candidates' `LEDGER` outcomes (`written`, `term-ended`, `fenced`,
    /// `conflict`, `error`), counted.
    pub outcomes: BTreeMap<String, usize>,
    /// Candidate processes started (the first ones and replacements).
    pub processes: usize,
}

impl Column {
    /// What fails the run for this implementation.
    #[must_use]
    pub fn failures(&self) -> Vec<String> {
        let l = &self.ledger;
        let mut out: Vec<String> = l
            .stale
            .iter()
            .chain(&l.tokens_backwards)
            .chain(&self.overlaps)
            .chain(&l.unbounded_gaps)
            .cloned()
            .collect();
        if l.unobserved > 0 {
            out.push(format!(
                "{} write(s) of the ledger were never seen: cannot judge them",
                l.unobserved
            ));
        }
        out
    }
}

/// The result of a run.
#[derive(Clone, Debug)]
pub struct Report {
    /// The seed (replay with it).
    pub seed: u64,
    /// How long faults were injected.
    pub duration: Duration,
    /// The gap bound used.
    pub gap_bound: Duration,
    /// Every fault, in order.
    pub faults: Vec<Injected>,
    /// Per implementation, in [`Implementation::ALL`] order.
    pub columns: Vec<Column>,
}

impl Report {
    /// The column of `implementation`.
    ///
    /// # Panics
    /// Never: a report has both columns.
    #[must_use]
    pub fn column(&self, implementation: Implementation) -> &Column {
        self.columns
            .iter()
            .find(|c| c.implementation == implementation)
            .expect("a report has a column per implementation")
    }

    /// Faults by kind.
    #[must_use]
    pub fn fault_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for f in &self.faults {
            *counts.entry(f.fault.name()).or_insert(0) += 1;
        }
        counts
    }

    /// The side-by-side table (Markdown).
    #[must_use]
    pub fn table(&self) -> String {
        let mut s = String::new();
        let counts = self
            .fault_counts()
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            s,
            "seed {} ({} s of faults; replay: scripts/chaos.sh --seconds {} --seed {})",
            self.seed,
            self.duration.as_secs(),
            self.duration.as_secs(),
            self.seed
        );
        let _ = writeln!(s, "faults injected: {} ({counts})\n", self.faults.len());
        let _ = writeln!(
            s,
            "| | {} |",
            self.columns
                .iter()
                .map(|c| c.implementation.label())
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let _ = writeln!(s, "|---|{}", "---:|".repeat(self.columns.len()));
        let row = |s: &mut String, name: &str, f: &dyn Fn(&Column) -> String| {
            let _ = writeln!(
                s,
                "| {name} | {} |",
                self.columns.iter().map(f).collect::<Vec<_>>().join(" | ")
            );
        };
        let outcome = |c: &Column, k: &str| c.outcomes.get(k).copied().unwrap_or(0).to_string();
        row(&mut s, "ledger writes", &|c| c.ledger.writes.to_string());
        row(&mut s, "leader changes (terms that wrote − 1)", &|c| {
            c.ledger.terms.saturating_sub(1).to_string()
        });
        row(&mut s, "**stale writes** (and lost updates)", &|c| {
            format!("{} (in {} terms)", c.ledger.stale_writes, c.ledger.stale.len())
        });
        row(&mut s, "fencing tokens backwards", &|c| {
            if c.implementation == Implementation::ClientGo {
                "n/a (no token)".to_owned()
            } else {
                c.ledger.tokens_backwards.len().to_string()
            }
        });
        row(&mut s, "**overlapping terms**", &|c| c.overlaps.len().to_string());
        row(&mut s, "longest gap between writes", &|c| {
            fmt_ms(c.ledger.longest_gap)
        });
        row(&mut s, "longest gap once faults healed", &|c| {
            fmt_ms(c.ledger.longest_unexplained_gap)
        });
        row(
            &mut s,
            &format!(
                "gaps above the bound ({})",
                fmt_ms(u64::try_from(self.gap_bound.as_nanos()).unwrap_or(0))
            ),
            &|c| c.ledger.unbounded_gaps.len().to_string(),
        );
        row(&mut s, "writes refused: term ended", &|c| {
            outcome(c, "term-ended")
        });
        row(&mut s, "writes refused: fenced (newer token stored)", &|c| {
            outcome(c, "fenced")
        });
        row(&mut s, "writes refused: conflict (409)", &|c| {
            outcome(c, "conflict")
        });
        row(&mut s, "writes failed (other errors)", &|c| outcome(c, "error"));
        row(&mut s, "writes never seen by the checker", &|c| {
            c.ledger.unobserved.to_string()
        });
        row(&mut s, "candidate processes", &|c| c.processes.to_string());
        s
    }

    /// What each column's failures were (client-go's too), one line each;
    /// a stale write names the last fault begun before it.
    #[must_use]
    pub fn details(&self) -> String {
        let fault_before = |at: u64| {
            self.faults.iter().rfind(|f| f.window.start <= at).map_or_else(
                || "before any fault".to_owned(),
                |f| format!("after: {}", f.fault),
            )
        };
        self.columns.iter().fold(String::new(), |mut s, c| {
            for (line, at) in c.ledger.stale.iter().zip(&c.ledger.stale_at) {
                let _ = writeln!(s, "{}: {line} ({})", c.implementation.label(), fault_before(*at));
            }
            for line in c.failures().iter().skip(c.ledger.stale.len()) {
                let _ = writeln!(s, "{}: {line}", c.implementation.label());
            }
            s
        })
    }

    /// Stale writes by the kind of the last fault begun before each, per column.
    #[must_use]
    pub fn stale_by_fault(&self, implementation: Implementation) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for at in &self.column(implementation).ledger.stale_at {
            let kind = self
                .faults
                .iter()
                .rfind(|f| f.window.start <= *at)
                .map_or("none", |f| f.fault.name());
            *out.entry(kind).or_insert(0) += 1;
        }
        out
    }

    /// Every fault, one line each, with times from the first.
    #[must_use]
    pub fn fault_log(&self) -> String {
        let base = self.faults.first().map_or(0, |f| f.window.start);
        self.faults.iter().fold(String::new(), |mut s, f| {
            let _ = writeln!(
                s,
                "{:>10} +{:<9} {}: {}",
                fmt_ms(f.window.start - base),
                fmt_ms(f.window.healed - f.window.start),
                f.fault,
                f.note
            );
            s
        })
    }
}

/// One candidate slot of a group.
struct Slot {
    index: usize,
    kubeconfig: PathBuf,
    proxy: Option<Proxy>,
    process: Option<Process>,
    incarnation: u32,
}

/// One implementation's candidates, Lease and ledger.
struct Group {
    implementation: Implementation,
    lease: LeaseRef,
    ledger: String,
    log: EventLog,
    slots: Vec<Slot>,
    seen: Arc<Mutex<Seen>>,
    spawned: usize,
}

/// What every fault needs.
struct World<'a> {
    cfg: &'a Config,
    ha: &'a HaControlPlane,
    admin: Vec<Client>,
    candidate: PathBuf,
    goelect: PathBuf,
    logs: PathBuf,
}

/// Runs the schedule of `cfg` on a new HA control plane and judges it.
///
/// # Errors
/// When the control plane or a candidate cannot be started, or the run's
/// own API calls fail; not on what the candidates do (that is the report).
pub async fn run(cfg: &Config) -> Result<Report> {
    let ha = HaControlPlane::start().await?;
    let tmp = tempfile::Builder::new().prefix("krl-chaos-").tempdir()?;
    let logs = cfg.log_dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    std::fs::create_dir_all(&logs)?;
    let mut admin = Vec::new();
    for i in 0..APISERVERS {
        admin.push(ha.client(i).await?);
    }
    let world = World {
        cfg,
        ha: &ha,
        admin,
        candidate: candidate_bin().await?,
        goelect: bin_dir().await?.join(GOELECT_BIN),
        logs,
    };
    setup(&world.admin[0]).await?;
    let mut groups = Vec::new();
    for implementation in Implementation::ALL {
        groups.push(world.group(implementation, tmp.path()).await?);
    }
    let mut watchers = Vec::new();
    for g in &groups {
        for client in &world.admin {
            watchers.push(tokio::spawn(watch_ledger(
                client.clone(),
                g.ledger.clone(),
                Arc::clone(&g.seen),
            )));
        }
    }
    for g in &mut groups {
        for k in 0..g.slots.len() {
            world.spawn(g, k)?;
        }
    }
    let started = now_ns();
    for g in &groups {
        wait_for_write(g, started, Duration::from_secs(60)).await?;
    }
    let faults = world.run_schedule(&mut groups).await?;
    // Room for the last recovery, then judge.
    world.supervise(&mut groups, cfg.gap_bound()).await?;
    let end = now_ns();
    for g in &mut groups {
        for slot in &mut g.slots {
            if let Some(mut p) = slot.process.take() {
                let _ = p.kill().await;
            }
        }
    }
    for w in watchers {
        w.abort();
    }
    let windows: Vec<Window> = faults.iter().map(|f| f.window).collect();
    let mut columns = Vec::new();
    for g in &groups {
        columns.push(world.judge(g, &windows, started, end).await?);
    }
    Ok(Report {
        seed: cfg.seed,
        duration: cfg.duration,
        gap_bound: cfg.gap_bound(),
        faults,
        columns,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The namespace, the candidates' RBAC, and the APF fault's priority level.
async fn setup(admin: &Client) -> Result<()> {
    let create = |what: &str| format!("creating {what}");
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(NAMESPACE.to_owned()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .with_context(|| create("the namespace"))?;
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "candidate"},
        "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
        ],
    }))?;
    Api::<Role>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &role)
        .await
        .with_context(|| create("the candidates' Role"))?;
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "candidate"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "candidate"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": GROUP}],
    }))?;
    Api::<RoleBinding>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &binding)
        .await
        .with_context(|| create("the candidates' RoleBinding"))?;
    let level: PriorityLevelConfiguration = serde_json::from_value(serde_json::json!({
        "metadata": {"name": APF_LEVEL},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 1,
            "lendablePercent": 0,
            "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Reject"},
        }},
    }))?;
    Api::<PriorityLevelConfiguration>::all(admin.clone())
        .create(&PostParams::default(), &level)
        .await
        .with_context(|| create("the APF priority level"))?;
    Ok(())
}

/// The `FlowSchema` that sends the candidates' group to [`APF_LEVEL`].
fn flow_schema() -> Result<FlowSchema> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": APF_LEVEL},
        "spec": {
            "priorityLevelConfiguration": {"name": APF_LEVEL},
            "matchingPrecedence": 100,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "Group", "group": {"name": GROUP}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"], "clusterScope": true}],
            }],
        },
    }))?)
}

/// Collects every version of a ledger through one apiserver.
async fn watch_ledger(client: Client, name: String, seen: Arc<Mutex<Seen>>) {
    let api: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
    while let Some(next) = events.next().await {
        if let Ok(cm) = next
            && let Some(text) = cm.data.as_ref().and_then(|d| d.get("ledger"))
        {
            lock(&seen).add_version(text);
        }
    }
}

/// Waits until the ledger holds a write made after `after`.
async fn wait_for_write(g: &Group, after: u64, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if lock(&g.seen).lines.values().any(|l| l.at > after) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(anyhow!(
                "{}: no ledger write within {} s of the start; the log:\n{}",
                g.implementation.label(),
                timeout.as_secs(),
                g.log.dump_events()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl World<'_> {
    /// Draws and injects faults for the run's duration, one at a time.
    async fn run_schedule(&self, groups: &mut [Group]) -> Result<Vec<Injected>> {
        let cfg = self.cfg;
        let mut schedule = Schedule::new(cfg.seed, cfg.slots, cfg.proxied, cfg.timings);
        let mut faults = Vec::new();
        let deadline = Instant::now() + cfg.duration;
        while Instant::now() < deadline {
            let quiet = schedule.quiet();
            self.supervise(groups, quiet).await?;
            let fault = schedule.next_fault();
            let start = now_ns();
            for g in groups.iter() {
                g.log.note(&format!("fault: {fault}"));
            }
            let note = self.inject(&fault, groups).await?;
            let healed = now_ns();
            for g in groups.iter() {
                g.log.note(&format!("healed: {fault}"));
            }
            eprintln!("chaos: {fault}: {note} ({} to heal)", fmt_ms(healed - start));
            faults.push(Injected {
                fault,
                note,
                window: Window { start, healed },
            });
        }
        Ok(faults)
    }

    /// One group's column: its ledger (with a last read) and its log.
    async fn judge(&self, g: &Group, windows: &[Window], started: u64, end: u64) -> Result<Column> {
        let cms: Api<ConfigMap> = Api::namespaced(self.admin[0].clone(), NAMESPACE);
        if let Ok(cm) = cms.get(&g.ledger).await
            && let Some(text) = cm.data.as_ref().and_then(|d| d.get("ledger"))
        {
            lock(&g.seen).add_version(text);
        }
        let seen = lock(&g.seen).clone();
        let checked = ledger::check(&seen, windows, started, end, ns(self.cfg.gap_bound()));
        let entries = g.log.entries();
        let overlaps = match check_no_overlap(&leadership_intervals(&entries, end), started) {
            Ok(()) => Vec::new(),
            Err(e) => format!("{e:#}")
                .lines()
                .filter(|l| l.starts_with("OVERLAP"))
                .map(str::to_owned)
                .collect(),
        };
        let mut outcomes = BTreeMap::new();
        for e in entries.iter().filter(|e| e.kind == Kind::Ledger) {
            *outcomes.entry(e.who.clone()).or_insert(0) += 1;
        }
        std::fs::write(
            self.logs
                .join(format!("{}.events.log", g.implementation.prefix())),
            g.log.dump(),
        )?;
        Ok(Column {
            implementation: g.implementation,
            ledger: checked,
            overlaps,
            outcomes,
            processes: g.spawned,
        })
    }

    async fn group(&self, implementation: Implementation, dir: &Path) -> Result<Group> {
        let prefix = implementation.prefix();
        let ledger = format!("{prefix}-ledger");
        Api::<ConfigMap>::namespaced(self.admin[0].clone(), NAMESPACE)
            .create(
                &PostParams::default(),
                &ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(ledger.clone()),
                        ..ObjectMeta::default()
                    },
                    ..ConfigMap::default()
                },
            )
            .await
            .with_context(|| format!("creating the ledger {ledger}"))?;
        let mut slots = Vec::new();
        for index in 0..self.cfg.slots {
            let apiserver = index % APISERVERS;
            let direct = self.ha.user_kubeconfig(apiserver, USER, &[GROUP])?;
            let (kubeconfig, proxy) = if index >= self.cfg.slots - self.cfg.proxied {
                let proxy = Proxy::start(self.ha.apiserver_port(apiserver)).await?;
                let slot_dir = dir.join(format!("{prefix}-{index}"));
                std::fs::create_dir_all(&slot_dir)?;
                (proxy.kubeconfig(&direct, &slot_dir)?, Some(proxy))
            } else {
                (direct, None)
            };
            slots.push(Slot {
                index,
                kubeconfig,
                proxy,
                process: None,
                incarnation: 0,
            });
        }
        Ok(Group {
            implementation,
            lease: LeaseRef {
                namespace: NAMESPACE.to_owned(),
                name: format!("{prefix}-lease"),
            },
            ledger,
            log: EventLog::new(),
            slots,
            seen: Arc::default(),
            spawned: 0,
        })
    }

    /// Starts a new candidate in slot `k` (a new identity per incarnation,
    /// as a restarted Deployment pod gets a new name).
    fn spawn(&self, g: &mut Group, k: usize) -> Result<()> {
        let slot = &mut g.slots[k];
        slot.incarnation += 1;
        let identity = format!(
            "{}-{}.{}",
            g.implementation.prefix(),
            slot.index,
            slot.incarnation
        );
        let stderr = std::fs::File::create(self.logs.join(format!("{identity}.log")))?;
        let t = self.cfg.timings;
        let (flavor, cmd) = match g.implementation {
            Implementation::Ours => {
                let mut cmd = rust_candidate(&self.candidate, &slot.kubeconfig, &g.lease, &identity, t);
                cmd.env("LEDGER", &g.ledger)
                    .env("EXIT_ON_STDIN_EOF", "1")
                    .env("WORK_INTERVAL_MS", self.cfg.work_interval.as_millis().to_string())
                    .env("RUST_LOG", "info,kube_runtime_lease=debug");
                (Flavor::Rust, cmd)
            }
            Implementation::ClientGo => {
                let mut cmd = go_candidate(&self.goelect, &slot.kubeconfig, &g.lease, &identity, t);
                cmd.arg("--rejoin")
                    .arg(format!("--ledger={}", g.ledger))
                    .arg(format!(
                        "--work-interval={}ms",
                        self.cfg.work_interval.as_millis()
                    ));
                (Flavor::Go, cmd)
            }
        };
        let outputs = Outputs {
            stderr_to: Some(stderr),
            copy_stdout_to: None,
        };
        slot.process = Some(Process::spawn_with(&identity, flavor, cmd, &g.log, outputs)?);
        g.spawned += 1;
        Ok(())
    }

    /// Waits `quiet`, replacing candidates that exited on their own.
    async fn supervise(&self, groups: &mut [Group], quiet: Duration) -> Result<()> {
        let until = Instant::now() + quiet;
        loop {
            for g in groups.iter_mut() {
                for k in 0..g.slots.len() {
                    let exited = g.slots[k].process.as_ref().is_some_and(|p| {
                        g.log
                            .find(|e| e.process == p.name() && e.kind == Kind::StdoutClosed)
                            .is_some()
                    });
                    if exited {
                        if let Some(mut p) = g.slots[k].process.take() {
                            let _ = p.reap(Duration::from_secs(5)).await;
                        }
                        self.spawn(g, k)?;
                    }
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            tokio::time::sleep(left.min(Duration::from_millis(200))).await;
        }
    }

    /// The Lease of `g` as an admin reads it through any apiserver.
    async fn lease(&self, g: &Group) -> Option<Lease> {
        for client in &self.admin {
            let api = g.lease.api(client.clone());
            if let Ok(Ok(lease)) =
                tokio::time::timeout(Duration::from_secs(2), api.get_opt(&g.lease.name)).await
            {
                return lease;
            }
        }
        None
    }

    /// The slot `target` names in `g`; `proxied_only` falls back to the first
    /// proxied slot when the leader's is direct.
    async fn resolve(&self, g: &Group, target: Target, proxied_only: bool) -> usize {
        let first_proxied = self.cfg.slots - self.cfg.proxied;
        let slot = match target {
            Target::Slot(k) => k,
            Target::Leader => self
                .lease(g)
                .await
                .and_then(|l| l.spec?.holder_identity)
                .and_then(|holder| {
                    let rest = holder
                        .strip_prefix(g.implementation.prefix())?
                        .strip_prefix('-')?;
                    rest.split('.').next()?.parse().ok()
                })
                .unwrap_or(0),
        };
        if proxied_only && slot < first_proxied {
            first_proxied
        } else {
            slot.min(self.cfg.slots - 1)
        }
    }

    /// Applies `fault` to every group and returns once it has healed.
    async fn inject(&self, fault: &Fault, groups: &mut [Group]) -> Result<String> {
        match fault {
            Fault::Kill {
                target,
                restart_after,
            } => self.replace(groups, *target, true, *restart_after).await,
            Fault::Term {
                target,
                restart_after,
            } => self.replace(groups, *target, false, *restart_after).await,
            Fault::Stop { target, frozen } => {
                let mut hit = Vec::new();
                let mut notes = Vec::new();
                for g in groups.iter() {
                    let k = self.resolve(g, *target, false).await;
                    if let Some(p) = g.slots[k].process.as_ref() {
                        notes.push(p.name().to_owned());
                        p.signal(Sig::Stop)?;
                    }
                    hit.push(k);
                }
                tokio::time::sleep(*frozen).await;
                for (g, k) in groups.iter().zip(hit) {
                    if let Some(p) = g.slots[k].process.as_ref() {
                        p.signal(Sig::Cont)?;
                    }
                }
                Ok(notes.join(", "))
            }
            Fault::Partition {
                target,
                silent,
                lasting,
            } => {
                let how = if *silent {
                    Partition::BlackHole
                } else {
                    Partition::Refuse
                };
                self.on_proxies(groups, *target, *lasting, |p| p.partition(how), Proxy::heal)
                    .await
            }
            Fault::Latency {
                target,
                latency,
                lasting,
            } => {
                self.on_proxies(
                    groups,
                    *target,
                    *lasting,
                    |p| p.set_latency(*latency),
                    |p| p.set_latency(Duration::ZERO),
                )
                .await
            }
            Fault::RestartApiserver { index, down } => {
                self.ha.stop_apiserver(*index);
                tokio::time::sleep(*down).await;
                self.ha.start_apiserver(*index).await?;
                Ok(format!("apiserver {index}"))
            }
            Fault::KillEtcdLeader { down } => match self.ha.etcd_leader().await {
                Some(leader) => {
                    self.ha.kill_etcd(leader);
                    tokio::time::sleep(*down).await;
                    self.ha.start_etcd(leader).await?;
                    Ok(format!("etcd{leader}"))
                }
                None => Ok("no etcd leader to kill".to_owned()),
            },
            Fault::DeleteLease => {
                let mut notes = Vec::new();
                for g in groups.iter() {
                    let mut deleted = false;
                    for client in &self.admin {
                        let api = g.lease.api(client.clone());
                        let params = DeleteParams::default();
                        let delete = api.delete(&g.lease.name, &params);
                        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), delete).await {
                            deleted = true;
                            break;
                        }
                    }
                    notes.push(format!(
                        "{} {}",
                        g.lease.name,
                        if deleted { "deleted" } else { "not found" }
                    ));
                }
                Ok(notes.join(", "))
            }
            Fault::ApfBurst { lasting } => self.apf_burst(*lasting).await,
        }
    }

    /// SIGKILLs (or SIGTERMs, and reaps) each group's `target`, and starts a
    /// replacement after `restart_after`.
    async fn replace(
        &self,
        groups: &mut [Group],
        target: Target,
        kill: bool,
        restart_after: Duration,
    ) -> Result<String> {
        let mut hit = Vec::new();
        let mut notes = Vec::new();
        for g in groups.iter_mut() {
            let k = self.resolve(g, target, false).await;
            if let Some(p) = g.slots[k].process.as_mut() {
                notes.push(p.name().to_owned());
                if kill {
                    p.kill().await?;
                } else {
                    p.signal(Sig::Term)?;
                }
            }
            hit.push(k);
        }
        for (g, k) in groups.iter_mut().zip(&hit) {
            if let Some(mut p) = g.slots[*k].process.take() {
                let _ = p.reap(Duration::from_secs(10)).await;
            }
        }
        tokio::time::sleep(restart_after).await;
        for (g, k) in groups.iter_mut().zip(hit) {
            self.spawn(g, k)?;
        }
        Ok(notes.join(", "))
    }

    /// Applies `begin` to the proxy of each group's (proxied) `target`, and
    /// `end` after `lasting`.
    async fn on_proxies(
        &self,
        groups: &[Group],
        target: Target,
        lasting: Duration,
        begin: impl Fn(&Proxy),
        end: impl Fn(&Proxy),
    ) -> Result<String> {
        let mut hit = Vec::new();
        for g in groups {
            let k = self.resolve(g, target, true).await;
            if let Some(proxy) = &g.slots[k].proxy {
                begin(proxy);
                hit.push((proxy, format!("{}-{k}", g.implementation.prefix())));
            }
        }
        tokio::time::sleep(lasting).await;
        for (proxy, _) in &hit {
            end(proxy);
        }
        Ok(hit
            .into_iter()
            .map(|(_, name)| name)
            .collect::<Vec<_>>()
            .join(", "))
    }

    /// Routes the candidates' group to the tiny priority level, loads it as
    /// their user for `lasting`, and routes it back.
    async fn apf_burst(&self, lasting: Duration) -> Result<String> {
        let schemas: Api<FlowSchema> = Api::all(self.admin[0].clone());
        schemas
            .create(&PostParams::default(), &flow_schema()?)
            .await
            .context("creating the APF FlowSchema")?;
        let before = self.apf_rejections().await;
        let served = Arc::new(AtomicU64::new(0));
        let mut load = Vec::new();
        for i in 0..self.cfg.burst_load {
            let kubeconfig = self.ha.user_kubeconfig(i % APISERVERS, USER, &[GROUP])?;
            // No retries: the load does not back off, as a runaway client would not.
            let client = crate::control_plane::client_without_retries(&kubeconfig).await?;
            let served = Arc::clone(&served);
            load.push(tokio::spawn(async move {
                let api: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
                loop {
                    if api.list_metadata(&ListParams::default()).await.is_ok() {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        tokio::time::sleep(lasting).await;
        for task in load {
            task.abort();
        }
        let mut removed = false;
        for client in &self.admin {
            let api: Api<FlowSchema> = Api::all(client.clone());
            if api.delete(APF_LEVEL, &DeleteParams::default()).await.is_ok() {
                removed = true;
                break;
            }
        }
        anyhow::ensure!(removed, "could not delete the APF FlowSchema");
        let rejected = self.apf_rejections().await.saturating_sub(before);
        Ok(format!(
            "the apiservers rejected {rejected} requests of the candidates' user (429), served {} of the load",
            served.load(Ordering::Relaxed)
        ))
    }

    /// Requests the apiservers have rejected at [`APF_LEVEL`] so far.
    async fn apf_rejections(&self) -> u64 {
        let mut total = 0.0;
        for i in 0..APISERVERS {
            if let Ok(text) = self.ha.metrics_text(i).await {
                total +=
                    crate::metrics::metric_samples(&text, "apiserver_flowcontrol_rejected_requests_total")
                        .filter(|(l, _)| crate::metrics::metric_label(l, "priority_level") == Some(APF_LEVEL))
                        .map(|(_, v)| v)
                        .sum::<f64>();
            }
        }
        // A count of requests: whole, small and non-negative.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a whole count of requests"
        )]
        let total = total as u64;
        total
    }
}
