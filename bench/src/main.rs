//! Benchmark driver: kube-runtime-lease side by side with client-go's
//! leaderelection (`goelect`) and k8s-controller 0.15 (`kc-candidate`), against
//! one real etcd + kube-apiserver started by `kube-runtime-lease-harness`.
//!
//! ```text
//! bench-driver run [--quick] [--only handover,failover,api,warm,sharded,shard-scale] [--trials N] [--out DIR]
//!                  [--ours-bin PATH] [--benchmarks-md PATH]
//!                  [--label L] [--cells SPEC]... [--window-fast S] [--window-default S] [--idle-window S]
//!                  [--settle-timeout S] [--rebalance-timeout S] [--add]
//! bench-driver report [--out DIR] [--benchmarks-md PATH]
//! ```
//!
//! `shard-scale` (not in the default set: it is long) runs the grid of
//! `shard_scale.rs` into `shard_scale-<label>.json` and `.md`; its flags are
//! the last line above (see that module).
//!
//! `run` writes raw results (`handover.json`, `failover.json`, `api_load.json`,
//! `idle.json`, `warm.json`, `sharded.json`, `meta-*.json`) under `--out` (default `bench/results`), then
//! does what `report` does: `summary.md`, `failover.svg`, and the tables of
//! `BENCHMARKS.md` between its `<!-- BEGIN RESULTS -->` / `<!-- END RESULTS -->`
//! markers. A run with `--only` rewrites only the files of those scenarios.
//! `BENCHMARKS.md` is only touched when `--out` is the default or
//! `--benchmarks-md` names it.

mod api_load;
mod candidate;
mod chain;
mod impls;
mod machine;
mod report;
mod shard_scale;
mod sharded;
mod warm;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use kube::Client;
use kube_runtime_lease_harness::{TestEnv, create_lease, free_spec, workspace_root};
use serde::Serialize;

use crate::api_load::scenario_api;
use crate::candidate::{Bins, Ctx};
use crate::chain::{scenario_failover, scenario_handover};
use crate::machine::{Meta, loadavg, machine};
use crate::warm::scenario_warm;

/// Milliseconds from `from` to `to` (CLOCK_MONOTONIC ns, either order).
fn ms_between(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / 1e6
}

/// Creates the free Lease `name` in `ns`, so that the first candidate leads
/// at once.
async fn create_free_lease(client: &Client, ns: &str, name: &str) -> Result<()> {
    let api = kube::Api::namespaced(client.clone(), ns);
    create_lease(&api, name, free_spec())
        .await
        .context("pre-creating the Lease")?;
    Ok(())
}

// ---------------------------------------------------------------------------

fn write_json<T: Serialize>(dir: &Path, name: &str, value: &T) -> Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", path.display()))
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
    /// The shard-scale scenario's options.
    scale: shard_scale::Options,
}

fn parse_args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let root = workspace_root();
    let mut a = Args {
        cmd: it.next().unwrap_or_else(|| "run".into()),
        quick: false,
        only: vec![
            "handover".into(),
            "failover".into(),
            "api".into(),
            "warm".into(),
            "sharded".into(),
        ],
        trials: None,
        out: root.join("bench/results"),
        benchmarks_md: None,
        ours_bin: root.join("bench/target/release/candidate"),
        scale: shard_scale::Options::default(),
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
            "--label" => a.scale.label = it.next().context("--label needs a value")?,
            "--cells" => a.scale.cells.push(it.next().context("--cells needs a value")?),
            "--window-fast" => {
                a.scale.window_fast_s = it.next().context("--window-fast needs seconds")?.parse()?
            }
            "--window-default" => {
                a.scale.window_default_s = it.next().context("--window-default needs seconds")?.parse()?
            }
            "--settle-timeout" => {
                a.scale.settle_timeout_s = Some(it.next().context("--settle-timeout needs seconds")?.parse()?)
            }
            "--rebalance-timeout" => {
                a.scale.rebalance_timeout_s =
                    Some(it.next().context("--rebalance-timeout needs seconds")?.parse()?)
            }
            "--add" => a.scale.add = true,
            "--idle-window" => {
                a.scale.idle_window_s = it.next().context("--idle-window needs seconds")?.parse()?
            }
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
            "usage: bench-driver run|report [--quick] [--only handover,failover,api,warm,sharded,shard-scale] [--trials N] [--out DIR] [--label L] [--cells M=..;S=..;timings=..]... [--window-fast S] [--window-default S] [--idle-window S] [--settle-timeout S] [--rebalance-timeout S] [--add]"
        );
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    std::fs::create_dir_all(&args.out)?;
    if args.cmd == "report" {
        report::shard_scale::regenerate(&args.out)?;
        return report::report(&args.out, args.benchmarks_md.as_deref());
    }
    // Fail on a malformed --cells before starting anything.
    if args.only.iter().any(|s| s == "shard-scale") {
        shard_scale::parse_cells(&args.scale.cells)?;
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
    machine(&mut meta, &workspace_root());
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
    if args.only.iter().any(|s| s == "warm") {
        // Five takeovers per mode (one with --quick): each lists thousands of
        // objects, so fewer trials than the handover's.
        let mut r = Vec::new();
        // KRL_BENCH_WARM_OBJECTS: fewer objects, for trying the scenario out.
        let objects = std::env::var("KRL_BENCH_WARM_OBJECTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(warm::OBJECTS);
        let res = scenario_warm(&ctx, if args.quick { 1 } else { 5 }, objects, &mut r).await;
        write_json(&args.out, "warm.json", &r)?;
        res?;
    }
    if args.only.iter().any(|s| s == "sharded") {
        // Three trials of each replica count (one with --quick); the
        // apiserver cost over a 30 s quiet window (10 s with --quick).
        let mut r = Vec::new();
        let (trials, window) = if args.quick { (1, 10) } else { (3, 30) };
        let res = sharded::scenario_sharded(&ctx, trials, Duration::from_secs(window), &mut r).await;
        write_json(&args.out, "sharded.json", &r)?;
        res?;
    }
    if args.only.iter().any(|s| s == "shard-scale") {
        shard_scale::scenario_shard_scale(&ctx, &args.scale, meta.clone(), &args.out).await?;
    }
    sampler.abort();
    // shard-scale alone: its results file holds its meta, and the tables of
    // BENCHMARKS.md stay as they are.
    if args.only.iter().all(|s| s == "shard-scale") {
        eprintln!("done in {:.0} s", started.elapsed().as_secs_f64());
        let _ = std::fs::remove_dir_all(&private);
        return Ok(());
    }
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
