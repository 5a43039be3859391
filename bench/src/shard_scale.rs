//! The shard-scale scenario: elected shards over a grid of cells, each cell
//! (replicas M, shards S, timing set), to see what the election costs the
//! apiserver, etcd and the replicas as M and S grow, and how fast it
//! rebalances. The reconcile model is `sharded.rs`'s ([`OBJECTS`] ConfigMaps,
//! [`RECONCILE_MS`] ms reconciles, at most [`CONCURRENCY`] in flight per
//! replica). Per cell:
//! - **idle**: a window before the cell's replicas start (the control plane's
//!   own Lease traffic, subtracted from the watch events);
//! - **settle**: M replicas spawned → the S shards held, balanced; then the
//!   first pass (every object once);
//! - **quiet window**: Lease writes (PUT, POST, PATCH, DELETE) and reads (GET,
//!   LIST) per second, Lease watch events delivered per replica per second
//!   (`apiserver_watch_events_total`, less the idle rate, / M), Lease watches
//!   open, CPU seconds per minute of kube-apiserver, etcd and the replicas,
//!   the replicas' RSS;
//! - **pass**: SIGUSR1 to every replica → every object reconciled once:
//!   objects per second, the speed-up over the one-replica cell of the same S
//!   and timing set, double reconciles;
//! - **rebalance**: one more replica joins → balanced; one replica gets
//!   SIGTERM → balanced over the rest; one gets SIGKILL → balanced over the
//!   rest (not in a one-replica cell: none would be left);
//! - **one owner**: `check_reconciles` over the cell's whole log.
//!
//! A cell that cannot run (the machine saturated before it starts, or it
//! fails before its quiet window) is recorded with `ran: false` and why; a
//! cell that ran on a saturated machine (loadavg above twice the cores, or a
//! pass that kept every core busy) is flagged `saturated`.
//!
//! ```text
//! bench-driver run --only shard-scale [--label before] [--cells SPEC]...
//!     [--window-fast S] [--window-default S] [--idle-window S] [--add]
//! ```
//!
//! `--add` runs the given cells into the label's existing results (a cell
//! of the same M, S and timing set is replaced, the others kept, and a
//! one-replica baseline already there is not run again); the results list
//! each run that added cells.
//!
//! `--cells` (repeatable; each adds the product of its lists, plus the
//! one-replica baseline of each (S, timing set)):
//! `M=2,4,8,16;S=16,64,256;timings=fast`. Default: every cell of
//! M ∈ {2, 4, 8, 16} × S ∈ {16, 64, 256} at both timing sets. Results:
//! `shard_scale-<label>.json` (a `meta` and one object per cell, rewritten
//! after every cell) and `shard_scale-<label>.md`.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ListParams};
use kube_runtime_lease_harness::{
    EventLog, Process, Timings, metric_label, metric_samples, now_ns, requests_served, take_process,
    wait_balanced,
};
use serde::{Deserialize, Serialize};

use crate::candidate::{Ctx, proc_cpu_rss};
use crate::machine::{Meta, loadavg};
use crate::ms_between;
use crate::sharded::{
    CONCURRENCY, OBJECTS, RECONCILE_MS, lease_requests, lease_watches, measured_pass, one_owner, replica_env,
    wait_first_pass,
};

/// The timing sets: (name, timings).
const TIMING_SETS: [(&str, Timings); 2] = [
    (
        "fast",
        Timings {
            lease_duration: Duration::from_secs(2),
            renew_deadline: Duration::from_millis(1500),
            retry_period: Duration::from_millis(500),
        },
    ),
    (
        "default",
        Timings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        },
    ),
];

/// The grid run when no `--cells` is given.
pub const DEFAULT_CELLS: [&str; 2] = [
    "M=2,4,8,16;S=16,64,256;timings=fast",
    "M=2,4,8,16;S=16,64,256;timings=default",
];

/// What a run of the scenario is given (`bench-driver` flags).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Options {
    pub label: String,
    /// The `--cells` specs.
    pub cells: Vec<String>,
    pub window_fast_s: u64,
    pub window_default_s: u64,
    pub idle_window_s: u64,
    /// Bounds of the waits for a balanced election, overriding the timing
    /// set's (settling: 60 s + 4 lease durations for `fast`, 120 s + 4 for
    /// `default`; rebalancing: 60 s / 120 s).
    #[serde(default)]
    pub settle_timeout_s: Option<u64>,
    #[serde(default)]
    pub rebalance_timeout_s: Option<u64>,
    /// `--add`: run the cells into the label's existing results, replacing
    /// the cells of the same (M, S, timing set) and keeping the others; a
    /// one-replica baseline already there is kept, not run again.
    #[serde(default)]
    pub add: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            label: "run".to_owned(),
            cells: Vec::new(),
            window_fast_s: 20,
            window_default_s: 30,
            idle_window_s: 10,
            settle_timeout_s: None,
            rebalance_timeout_s: None,
            add: false,
        }
    }
}

/// One cell of the grid to run.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CellSpec {
    /// Index into [`TIMING_SETS`] (first: the order cells run in).
    timing: usize,
    shards: u16,
    replicas: usize,
}

fn list<T: std::str::FromStr>(v: &str, what: &str) -> Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    v.split(',')
        .map(|x| x.trim().parse().map_err(|e| anyhow::anyhow!("{what} {x:?}: {e}")))
        .collect()
}

/// The cells of `specs` (each `M=..;S=..;timings=..`), with the one-replica
/// baseline of every (S, timing set), in the order they run: by timing set,
/// then S, then M.
///
/// # Errors
/// On a malformed spec or an unknown timing set.
pub fn parse_cells(specs: &[String]) -> Result<Vec<CellSpec>> {
    let mut cells = BTreeSet::new();
    for spec in specs {
        let (mut ms, mut ss, mut ts) = (None, None, None);
        for part in spec.split(';').filter(|p| !p.trim().is_empty()) {
            let (k, v) = part
                .split_once('=')
                .with_context(|| format!("--cells {spec:?}: {part:?} is not KEY=LIST"))?;
            match k.trim() {
                "M" | "replicas" => ms = Some(list::<usize>(v, "replicas")?),
                "S" | "shards" => ss = Some(list::<u16>(v, "shards")?),
                "timings" | "T" => {
                    ts = Some(
                        v.split(',')
                            .map(|t| {
                                TIMING_SETS
                                    .iter()
                                    .position(|(n, _)| *n == t.trim())
                                    .with_context(|| format!("unknown timing set {t:?} (fast, default)"))
                            })
                            .collect::<Result<Vec<_>>>()?,
                    );
                }
                other => bail!("--cells {spec:?}: unknown key {other:?} (M, S, timings)"),
            }
        }
        let (Some(ms), Some(ss), Some(ts)) = (ms, ss, ts) else {
            bail!("--cells {spec:?}: needs M=, S= and timings=");
        };
        for &timing in &ts {
            for &shards in &ss {
                for &replicas in ms.iter().chain(&[1]) {
                    if replicas == 0 || shards == 0 {
                        bail!("--cells {spec:?}: replicas and shards must be positive");
                    }
                    cells.insert(CellSpec {
                        timing,
                        shards,
                        replicas,
                    });
                }
            }
        }
    }
    Ok(cells.into_iter().collect())
}

/// One cell's results. Every measurement is `None` when the cell did not
/// get that far.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Cell {
    pub replicas: usize,
    pub shards: u16,
    pub timing: String,
    pub lease_duration_s: f64,
    pub renew_deadline_s: f64,
    pub retry_period_s: f64,
    /// Whether it ran (false: skipped, or failed before its quiet window).
    pub ran: bool,
    /// Why it did not run, or what failed after it did.
    pub reason: Option<String>,
    /// The machine was saturated while it ran (see `saturated_why`).
    pub saturated: bool,
    pub saturated_why: Option<String>,
    /// 1-minute load average: before the cell, at the end of its window, after its pass.
    pub loadavg_before: f64,
    pub loadavg_window: Option<f64>,
    pub loadavg_pass: Option<f64>,
    pub window_s: f64,
    pub idle_window_s: f64,
    /// Spawned → the shards held, balanced.
    pub settle_ms: Option<f64>,
    /// Lease PUT + POST + PATCH + DELETE per second over the window (all
    /// clients: the control plane's own included, see `idle_*`).
    pub lease_writes_per_s: Option<f64>,
    /// Lease GET + LIST per second over the window.
    pub lease_reads_per_s: Option<f64>,
    /// The same before the cell's replicas started.
    pub idle_lease_writes_per_s: Option<f64>,
    pub idle_lease_reads_per_s: Option<f64>,
    /// Lease watch events delivered per second over the window, all watchers.
    pub watch_events_per_s: Option<f64>,
    pub idle_watch_events_per_s: Option<f64>,
    /// (window − idle) / M.
    pub watch_events_per_replica_per_s: Option<f64>,
    /// (window − idle watch events) / (window − idle Lease writes): the
    /// fan-out of a write to the watchers (M replicas, plus any of the
    /// control plane's own that watch every Lease).
    pub events_per_write: Option<f64>,
    /// Lease watches open at the end of the window (the control plane's own included).
    pub lease_watches: Option<f64>,
    /// Lease requests, every verb but WATCH, per minute (as `sharded.rs` counts them).
    pub lease_requests_per_min: Option<f64>,
    pub apiserver_cpu_s_per_min: Option<f64>,
    pub etcd_cpu_s_per_min: Option<f64>,
    pub replica_cpu_s_per_min_mean: Option<f64>,
    pub replica_cpu_s_per_min_max: Option<f64>,
    /// VmRSS at the end of the window.
    pub replica_rss_mib_mean: Option<f64>,
    pub replica_rss_mib_max: Option<f64>,
    /// SIGUSR1 → the last of the pass's reconciles ended.
    pub pass_ms: Option<f64>,
    pub per_second: Option<f64>,
    /// `per_second` over the one-replica cell's of the same S and timing set.
    pub speedup: Option<f64>,
    pub double_reconciles: Option<usize>,
    /// CPU time of the replicas, kube-apiserver and etcd over the pass, over
    /// (the pass × the cores).
    pub pass_cpu_fraction: Option<f64>,
    /// `check_reconciles` over the cell's whole log.
    pub one_owner: Option<bool>,
    /// One more replica spawned → balanced over M + 1.
    pub join_rebalance_ms: Option<f64>,
    /// SIGTERM to one → balanced over the other M.
    pub term_rebalance_ms: Option<f64>,
    /// SIGKILL to one → balanced over the other M − 1.
    pub kill_rebalance_ms: Option<f64>,
    pub duration_s: f64,
}

/// The results file: the run and every cell.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ScaleResults {
    pub meta: ScaleMeta,
    pub cells: Vec<Cell>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ScaleMeta {
    pub label: String,
    /// The `scripts/bench.sh` command line, when run through it (`command`
    /// is the driver's).
    pub script_command: Option<String>,
    /// UTC, when the run started.
    pub date: String,
    pub objects: usize,
    pub reconcile_ms: u64,
    pub concurrency: u16,
    pub options: Option<Options>,
    #[serde(flatten)]
    pub run: Meta,
    /// Cells added to these results by later runs (`--add`).
    #[serde(default)]
    pub added: Vec<Added>,
}

/// A later run that added cells to a label's results (`--add`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Added {
    pub commit: String,
    /// UTC, when it started.
    pub date: String,
    pub command: String,
    /// The cells it ran, `M×S timing`.
    pub cells: Vec<String>,
}

/// Lease watch events delivered so far, all watchers
/// (`apiserver_watch_events_total` of coordination.k8s.io Leases: labelled by
/// `kind` or, in newer apiservers, by `resource`).
fn lease_watch_events(metrics: &str) -> f64 {
    metric_samples(metrics, "apiserver_watch_events_total")
        .filter(|(l, _)| {
            metric_label(l, "group") == Some("coordination.k8s.io")
                && (metric_label(l, "kind") == Some("Lease") || metric_label(l, "resource") == Some("leases"))
        })
        .map(|(_, v)| v)
        .sum()
}

fn lease_writes(metrics: &str) -> f64 {
    ["PUT", "POST", "PATCH", "DELETE"]
        .iter()
        .map(|v| requests_served(metrics, "leases", v))
        .sum()
}

fn lease_reads(metrics: &str) -> f64 {
    ["GET", "LIST"]
        .iter()
        .map(|v| requests_served(metrics, "leases", v))
        .sum()
}

/// CPU ms (utime + stime) of `pid`, 0 if it is gone.
fn cpu_ms(pid: Option<u32>) -> f64 {
    pid.and_then(|p| proc_cpu_rss(p).ok()).map_or(0.0, |(ms, _)| ms)
}

fn mean_max(v: &[f64]) -> (Option<f64>, Option<f64>) {
    if v.is_empty() {
        return (None, None);
    }
    (
        Some(v.iter().sum::<f64>() / v.len() as f64),
        v.iter().copied().reduce(f64::max),
    )
}

/// Runs the cells of `opts`, writing `shard_scale-<label>.json` and `.md`
/// into `out` after every cell.
///
/// # Errors
/// When the cells cannot be parsed, the namespace or its ConfigMaps cannot
/// be made, or the results cannot be written (a failing cell is recorded,
/// not returned).
pub async fn scenario_shard_scale(ctx: &Ctx, opts: &Options, mut meta: Meta, out: &Path) -> Result<()> {
    let specs = if opts.cells.is_empty() {
        DEFAULT_CELLS.iter().map(|s| (*s).to_owned()).collect()
    } else {
        opts.cells.clone()
    };
    let mut cells = parse_cells(&specs)?;
    meta.scenarios = vec!["shard-scale".to_owned()];
    let previous = if opts.add {
        let name = format!("shard_scale-{}.json", opts.label);
        let text =
            std::fs::read_to_string(out.join(&name)).with_context(|| format!("--add: reading {name}"))?;
        Some(serde_json::from_str::<ScaleResults>(&text).with_context(|| format!("--add: parsing {name}"))?)
    } else {
        None
    };
    let same = |c: &Cell, s: &CellSpec| {
        c.replicas == s.replicas && c.shards == s.shards && c.timing == TIMING_SETS[s.timing].0
    };
    if let Some(previous) = &previous {
        // A baseline that ran is kept: the cells added are compared with it.
        cells.retain(|s| s.replicas != 1 || !previous.cells.iter().any(|c| c.ran && same(c, s)));
    }
    let mut results = ScaleResults {
        meta: ScaleMeta {
            label: opts.label.clone(),
            script_command: std::env::var("KRL_BENCH_COMMAND").ok(),
            date: crate::report::jiff_like_utc(meta.started_unix),
            objects: OBJECTS,
            reconcile_ms: RECONCILE_MS,
            concurrency: CONCURRENCY,
            added: Vec::new(),
            options: Some(Options {
                cells: specs,
                ..opts.clone()
            }),
            run: meta,
        },
        cells: Vec::new(),
    };
    if let Some(previous) = previous {
        let added = Added {
            commit: results.meta.run.commit.clone(),
            date: results.meta.date.clone(),
            command: results
                .meta
                .script_command
                .clone()
                .unwrap_or_else(|| results.meta.run.command.clone()),
            cells: cells
                .iter()
                .map(|s| format!("{}×{} {}", s.replicas, s.shards, TIMING_SETS[s.timing].0))
                .collect(),
        };
        results.meta = previous.meta;
        results.meta.added.push(added);
        results.cells = previous
            .cells
            .into_iter()
            .filter(|c| !cells.iter().any(|s| same(c, s)))
            .collect();
    }
    let ns = ctx.env.new_namespace("bench-scale").await?;
    eprintln!(
        "shard-scale: {} cells; creating {OBJECTS} ConfigMaps in {ns}",
        cells.len()
    );
    kube_runtime_lease_harness::create_configmaps(&ctx.client, &ns, OBJECTS, 0).await?;
    let started = std::time::Instant::now();
    for (i, spec) in cells.iter().enumerate() {
        let (timing_name, timings) = TIMING_SETS[spec.timing];
        let window = Duration::from_secs(if timing_name == "fast" {
            opts.window_fast_s
        } else {
            opts.window_default_s
        });
        eprintln!(
            "shard-scale: cell {}/{}: M={} S={} {timing_name} ({:.0} min in)",
            i + 1,
            cells.len(),
            spec.replicas,
            spec.shards,
            started.elapsed().as_secs_f64() / 60.0
        );
        let mut cell = Cell {
            replicas: spec.replicas,
            shards: spec.shards,
            timing: timing_name.to_owned(),
            lease_duration_s: timings.lease_duration.as_secs_f64(),
            renew_deadline_s: timings.renew_deadline.as_secs_f64(),
            retry_period_s: timings.retry_period.as_secs_f64(),
            window_s: window.as_secs_f64(),
            idle_window_s: opts.idle_window_s as f64,
            ..Cell::default()
        };
        let t0 = std::time::Instant::now();
        let lease = format!("scale-{}-{}-{timing_name}", spec.replicas, spec.shards);
        match calm_machine().await {
            Err(why) => {
                cell.loadavg_before = loadavg();
                cell.reason = Some(why);
            }
            Ok(load) => {
                cell.loadavg_before = load;
                let idle = Duration::from_secs(opts.idle_window_s);
                let bounds = bounds(opts, timings);
                if let Err(e) = run_cell(ctx, &ns, &lease, timings, (window, idle), bounds, &mut cell).await {
                    cell.reason = Some(format!("{e:#}"));
                }
            }
        }
        // The cell's Leases go, so that the next cell starts from the same
        // namespace (its watches list no leftovers).
        let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &ns);
        if let Err(e) = leases
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
        {
            eprintln!("shard-scale: deleting the cell's Leases: {e}");
        }
        cell.duration_s = t0.elapsed().as_secs_f64();
        results.cells.push(cell);
        fill_speedups(&mut results.cells);
        if let Some(cell) = results.cells.last() {
            eprintln!("shard-scale: {}", summary_line(cell));
        }
        write(out, &results)?;
    }
    Ok(())
}

fn summary_line(c: &Cell) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    format!(
        "M={} S={} {}: ran {} {}; writes/s {}, watch ev/s/replica {}, apiserver {} etcd {} cpu-s/min; pass {}/s ×{}; join {} term {} kill {} ms; one owner {:?}; load {:.1}→{}{}",
        c.replicas,
        c.shards,
        c.timing,
        c.ran,
        c.reason.as_deref().unwrap_or(""),
        f(c.lease_writes_per_s),
        f(c.watch_events_per_replica_per_s),
        f(c.apiserver_cpu_s_per_min),
        f(c.etcd_cpu_s_per_min),
        f(c.per_second),
        f(c.speedup),
        f(c.join_rebalance_ms),
        f(c.term_rebalance_ms),
        f(c.kill_rebalance_ms),
        c.one_owner,
        c.loadavg_before,
        f(c.loadavg_window),
        if c.saturated { " SATURATED" } else { "" },
    )
}

/// Waits (up to a minute) for the 1-minute loadavg to fall under 1.5 × the
/// cores; the loadavg then, or why the cell cannot run (still above 3 × the
/// cores).
async fn calm_machine() -> std::result::Result<f64, String> {
    let cores = nproc();
    for _ in 0..12 {
        if loadavg() < 1.5 * cores {
            break;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let load = loadavg();
    if load > 3.0 * cores {
        return Err(format!(
            "not run: loadavg {load:.1} on {cores} cores after a minute's wait (saturated before the cell)"
        ));
    }
    Ok(load)
}

fn nproc() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// The speed-up of every cell over the one-replica cell of its S and timing set.
fn fill_speedups(cells: &mut [Cell]) {
    let bases: Vec<(u16, String, f64)> = cells
        .iter()
        .filter(|c| c.replicas == 1)
        .filter_map(|c| Some((c.shards, c.timing.clone(), c.per_second?)))
        .collect();
    for c in cells.iter_mut() {
        c.speedup = bases
            .iter()
            .find(|(s, t, _)| *s == c.shards && *t == c.timing)
            .zip(c.per_second)
            .map(|((_, _, b), r)| r / b);
    }
}

/// The replicas of a cell, named `r0`, `r1`, ... in one log.
struct Replicas<'a> {
    ctx: &'a Ctx,
    ns: &'a str,
    lease: &'a str,
    timings: Timings,
    shards: u16,
    log: EventLog,
    procs: Vec<Process>,
    next: usize,
}

impl Replicas<'_> {
    fn spawn(&mut self) -> Result<u64> {
        let name = format!("r{}", self.next);
        self.next += 1;
        let at = now_ns();
        let env = replica_env(self.shards);
        self.procs.push(
            self.ctx
                .spawn_process(&self.log, self.ns, self.lease, &name, self.timings, &env)?,
        );
        Ok(at)
    }

    fn live(&self) -> Vec<String> {
        self.procs.iter().map(|p| p.name().to_owned()).collect()
    }

    async fn balanced(&self, timeout: Duration) -> Result<u64> {
        let live = self.live();
        let live: Vec<&str> = live.iter().map(String::as_str).collect();
        let quiet = (self.timings.retry_period * 2).max(Duration::from_secs(2));
        wait_balanced(&self.log, &live, self.shards, quiet, timeout).await
    }

    /// CPU ms of each live replica.
    fn cpu(&self) -> Vec<f64> {
        self.procs.iter().map(|p| cpu_ms(Some(p.pid()))).collect()
    }

    async fn stop(mut self) {
        for p in &self.procs {
            let _ = p.signal(kube_runtime_lease_harness::Sig::Term);
        }
        for mut p in self.procs.drain(..) {
            let _ = p.reap(Duration::from_secs(10)).await;
        }
    }
}

/// The bounds of the waits for a balanced election: (settling, rebalancing).
fn bounds(opts: &Options, timings: Timings) -> (Duration, Duration) {
    let bound = if timings.lease_duration <= Duration::from_secs(5) {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(120)
    };
    (
        opts.settle_timeout_s
            .map_or(bound + timings.lease_duration * 4, Duration::from_secs),
        opts.rebalance_timeout_s.map_or(bound, Duration::from_secs),
    )
}

/// Runs one cell into `cell` (windows: quiet, idle; bounds: settling,
/// rebalancing); on an error, what it measured so far stays.
async fn run_cell(
    ctx: &Ctx,
    ns: &str,
    lease: &str,
    timings: Timings,
    (window, idle): (Duration, Duration),
    bounds: (Duration, Duration),
    cell: &mut Cell,
) -> Result<()> {
    // Idle: the control plane's own Lease traffic.
    let before = ctx.env.metrics_text().await?;
    tokio::time::sleep(idle).await;
    let after = ctx.env.metrics_text().await?;
    let per_s = |f: fn(&str) -> f64, a: &str, b: &str, d: Duration| (f(b) - f(a)) / d.as_secs_f64();
    let idle_events = per_s(lease_watch_events, &before, &after, idle);
    cell.idle_watch_events_per_s = Some(idle_events);
    cell.idle_lease_writes_per_s = Some(per_s(lease_writes, &before, &after, idle));
    cell.idle_lease_reads_per_s = Some(per_s(lease_reads, &before, &after, idle));

    let mut replicas = Replicas {
        ctx,
        ns,
        lease,
        timings,
        shards: cell.shards,
        log: EventLog::new(),
        procs: Vec::new(),
        next: 0,
    };
    let res = measure(&mut replicas, window, idle_events, bounds, cell).await;
    cell.one_owner = Some(one_owner(&replicas.log, "shard-scale"));
    replicas.stop().await;
    res
}

async fn measure(
    r: &mut Replicas<'_>,
    window: Duration,
    idle_events: f64,
    (settle_bound, bound): (Duration, Duration),
    cell: &mut Cell,
) -> Result<()> {
    let m = cell.replicas;
    let ctx = r.ctx;
    let spawned = now_ns();
    for _ in 0..m {
        r.spawn()?;
    }
    // Settling: the creation hold of each new Lease, then the balancing.
    let balanced = r.balanced(settle_bound).await.context("settling")?;
    cell.settle_ms = Some(ms_between(spawned, balanced));
    wait_first_pass(&r.log).await.context("the first pass")?;

    // The quiet window.
    let (api, etcd) = (ctx.env.apiserver_pid(), ctx.env.etcd_pid());
    let cpu0 = (cpu_ms(api), cpu_ms(etcd), r.cpu());
    let before = ctx.env.metrics_text().await?;
    tokio::time::sleep(window).await;
    let after = ctx.env.metrics_text().await?;
    let cpu1 = (cpu_ms(api), cpu_ms(etcd), r.cpu());
    cell.ran = true;
    let secs = window.as_secs_f64();
    let per_min = |a: f64, b: f64| (b - a) / 1000.0 * 60.0 / secs;
    cell.lease_writes_per_s = Some((lease_writes(&after) - lease_writes(&before)) / secs);
    cell.lease_reads_per_s = Some((lease_reads(&after) - lease_reads(&before)) / secs);
    cell.lease_requests_per_min = Some((lease_requests(&after) - lease_requests(&before)) * 60.0 / secs);
    let events = (lease_watch_events(&after) - lease_watch_events(&before)) / secs;
    cell.watch_events_per_s = Some(events);
    cell.watch_events_per_replica_per_s = Some((events - idle_events) / m as f64);
    let writes = cell.lease_writes_per_s.unwrap_or(0.0) - cell.idle_lease_writes_per_s.unwrap_or(0.0);
    cell.events_per_write = (writes > 0.0).then(|| (events - idle_events) / writes);
    cell.lease_watches = Some(lease_watches(&after));
    cell.apiserver_cpu_s_per_min = api.map(|_| per_min(cpu0.0, cpu1.0));
    cell.etcd_cpu_s_per_min = etcd.map(|_| per_min(cpu0.1, cpu1.1));
    let replica_cpu: Vec<f64> = cpu0.2.iter().zip(&cpu1.2).map(|(a, b)| per_min(*a, *b)).collect();
    (cell.replica_cpu_s_per_min_mean, cell.replica_cpu_s_per_min_max) = mean_max(&replica_cpu);
    let rss: Vec<f64> = r
        .procs
        .iter()
        .filter_map(|p| proc_cpu_rss(p.pid()).ok())
        .map(|(_, kib)| kib as f64 / 1024.0)
        .collect();
    (cell.replica_rss_mib_mean, cell.replica_rss_mib_max) = mean_max(&rss);
    let load = loadavg();
    cell.loadavg_window = Some(load);

    // The pass.
    let total_cpu = |r: &Replicas<'_>| cpu_ms(api) + cpu_ms(etcd) + r.cpu().iter().sum::<f64>();
    let cpu_before = total_cpu(r);
    let pass = measured_pass(&r.log, &r.procs).await.context("the pass")?;
    let pass_ms = ms_between(pass.start, pass.end);
    // (The half second after the pass's end, waiting for stragglers, is idle.)
    let pass_cpu = total_cpu(r) - cpu_before;
    let fraction = pass_cpu / ((pass_ms + 500.0) * nproc());
    cell.pass_cpu_fraction = Some(fraction);
    cell.pass_ms = Some(pass_ms);
    cell.per_second = Some(OBJECTS as f64 * 1000.0 / pass_ms);
    cell.double_reconciles = Some(pass.double_reconciles);
    cell.loadavg_pass = Some(loadavg());
    let cores = nproc();
    let mut why = Vec::new();
    if load > 2.0 * cores {
        why.push(format!(
            "loadavg {load:.1} on {cores} cores at the end of the window"
        ));
    }
    if fraction > 0.9 {
        why.push(format!(
            "the pass kept {:.0}% of the cores busy",
            fraction * 100.0
        ));
    }
    if !why.is_empty() {
        cell.saturated = true;
        cell.saturated_why = Some(why.join("; "));
    }
    if pass.distinct != OBJECTS {
        bail!("{} of {OBJECTS} objects in the pass", pass.distinct);
    }

    // One more replica joins.
    let joined = r.spawn()?;
    let at = r.balanced(bound).await.context("rebalancing after a join")?;
    cell.join_rebalance_ms = Some(ms_between(joined, at).max(0.0));

    // One leaves gracefully (the first, a long-time holder).
    let first = r.live()[0].clone();
    let mut leaving = take_process(&mut r.procs, &first)?;
    let termed = leaving.signal(kube_runtime_lease_harness::Sig::Term)?;
    let at = r.balanced(bound).await.context("rebalancing after a SIGTERM");
    let _ = leaving.reap(Duration::from_secs(10)).await;
    cell.term_rebalance_ms = Some(ms_between(termed, at?).max(0.0));

    // One crashes, if one would be left.
    if r.procs.len() >= 2 {
        let victim = r.live()[0].clone();
        let mut victim = take_process(&mut r.procs, &victim)?;
        let killed = victim.kill().await?;
        let at = r.balanced(bound).await.context("rebalancing after a SIGKILL")?;
        cell.kill_rebalance_ms = Some(ms_between(killed, at).max(0.0));
    }
    Ok(())
}

fn write(out: &Path, results: &ScaleResults) -> Result<()> {
    let label = &results.meta.label;
    crate::write_json(out, &format!("shard_scale-{label}.json"), results)?;
    let md = crate::report::shard_scale::markdown(results);
    let path = out.join(format!("shard_scale-{label}.md"));
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))
}
