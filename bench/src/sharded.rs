//! The elected-shards scenario (ours only: neither reference has sharding):
//! one Controller of [`OBJECTS`] ConfigMaps across 1, 2 and 4 replicas of the
//! sharded candidate (`CANDIDATE_MODE=sharded`) over [`SHARDS`] shards, each
//! reconcile a simulated external call of [`RECONCILE_MS`] with at most
//! [`CONCURRENCY`] in flight per replica (the external API's limit per
//! client). Per trial:
//! - **settle**: replicas spawned → the shards held, balanced;
//! - **pass**: every replica gets SIGUSR1 (`reconcile_all_on`) → every object
//!   reconciled once (by the replica that holds its shard): the time to the
//!   last reconcile's end, and objects per second;
//! - **double reconciles**: reconciles in the pass beyond one per object, and
//!   the one-owner-per-shard check of the whole log (`check_reconciles`);
//! - **apiserver cost** (first trial of each size): Lease requests per
//!   minute over a quiet window, and the Lease watches open;
//! - **rebalance after a join**: one more replica spawned → balanced again.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use kube_runtime_lease_harness::{
    EventLog, Kind, Process, Reconcile, Sig, Timings, check_reconciles, metric_label, metric_samples, now_ns,
    requests_served, wait_balanced,
};
use serde::{Deserialize, Serialize};

use crate::candidate::Ctx;
use crate::machine::loadavg;
use crate::ms_between;

/// ConfigMaps reconciled.
pub const OBJECTS: usize = 2_000;
/// Shards of the election.
pub const SHARDS: u16 = 16;
/// The simulated external call of each reconcile.
pub const RECONCILE_MS: u64 = 20;
/// Reconciles in flight per replica.
pub const CONCURRENCY: u16 = 4;
/// Replica counts, in the order of even trials (odd trials reverse it).
const REPLICAS: [usize; 3] = [1, 2, 4];
/// The election's timings: short, so that settling (a creation hold of one
/// lease duration on each new Lease) does not dominate the run.
pub const TIMINGS: Timings = Timings {
    lease_duration: Duration::from_secs(4),
    renew_deadline: Duration::from_secs(3),
    retry_period: Duration::from_secs(1),
};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardedTrial {
    pub replicas: usize,
    pub trial: usize,
    pub shards: u16,
    pub objects: usize,
    pub reconcile_ms: u64,
    pub concurrency: u16,
    /// Spawned → the shards held, balanced.
    pub settle_ms: f64,
    /// SIGUSR1 → the last of `objects` reconciles ended.
    pub pass_ms: f64,
    /// `objects` / the pass, per second.
    pub per_second: f64,
    /// Reconciles in the pass beyond one per object.
    pub double_reconciles: usize,
    /// Whether the whole log kept one owner per shard (`check_reconciles`).
    pub one_owner: bool,
    /// Lease requests (every verb but WATCH) per minute, quiet, settled
    /// (first trial of each size only).
    pub lease_requests_per_min: Option<f64>,
    /// Lease watches open then.
    pub lease_watches: Option<f64>,
    /// One more replica spawned → balanced again.
    pub join_rebalance_ms: f64,
    pub loadavg: f64,
}

/// Lease requests served so far, every verb but WATCH.
pub fn lease_requests(metrics: &str) -> f64 {
    ["GET", "PUT", "POST", "LIST", "PATCH", "DELETE"]
        .iter()
        .map(|v| requests_served(metrics, "leases", v))
        .sum()
}

/// Lease watches open now.
pub fn lease_watches(metrics: &str) -> f64 {
    metric_samples(metrics, "apiserver_longrunning_requests")
        .filter(|(l, _)| {
            metric_label(l, "resource") == Some("leases") && metric_label(l, "verb") == Some("WATCH")
        })
        .map(|(_, v)| v)
        .sum()
}

/// The environment of a sharded replica over `shards` shards: this
/// scenario's reconcile model ([`RECONCILE_MS`], [`CONCURRENCY`], no requeue).
pub fn replica_env(shards: u16) -> [(&'static str, String); 5] {
    [
        ("CANDIDATE_MODE", "sharded".to_owned()),
        ("SHARDS", shards.to_string()),
        ("WORK_INTERVAL_MS", "0".to_owned()),
        ("RECONCILE_MS", RECONCILE_MS.to_string()),
        ("CONCURRENCY", CONCURRENCY.to_string()),
    ]
}

/// Waits for the first pass (each replica reconciles what it holds as it
/// gains it): every object once, then a second of quiet.
pub async fn wait_first_pass(log: &EventLog) -> Result<()> {
    log.wait_until(
        "every object reconciled once",
        Duration::from_secs(300),
        |entries| {
            let objects: BTreeSet<&str> = entries
                .iter()
                .filter(|e| e.kind == Kind::Reconcile)
                .map(|e| e.who.as_str())
                .collect();
            (objects.len() >= OBJECTS).then_some(())
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

/// A measured pass ([`measured_pass`]).
pub struct Pass {
    /// SIGUSR1 sent (CLOCK_MONOTONIC ns).
    pub start: u64,
    /// The last of the pass's reconciles ended.
    pub end: u64,
    /// Reconciles in the pass beyond one per object.
    pub double_reconciles: usize,
    /// Objects reconciled in the pass.
    pub distinct: usize,
}

/// SIGUSR1 to every one of `procs` (`reconcile_all_on`), then waits until
/// every object was reconciled after it (and half a second for stragglers).
pub async fn measured_pass(log: &EventLog, procs: &[Process]) -> Result<Pass> {
    let pass_start = now_ns();
    for p in procs {
        p.signal(Sig::Usr1)?;
    }
    let pass_end = log
        .wait_until(
            &format!("{OBJECTS} reconciles after SIGUSR1"),
            Duration::from_secs(300),
            |entries| {
                let pass: Vec<Reconcile> = entries
                    .iter()
                    .filter(|e| e.at >= pass_start)
                    .filter_map(Reconcile::of)
                    .collect();
                let objects: BTreeSet<&str> = pass.iter().map(|r| r.object.as_str()).collect();
                (objects.len() >= OBJECTS).then(|| pass.iter().map(|r| r.end).max().unwrap_or(pass_start))
            },
        )
        .await?;
    // Stragglers (a second reconcile of an object) would come within a reconcile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pass: Vec<Reconcile> = log
        .entries()
        .iter()
        .filter(|e| e.at >= pass_start)
        .filter_map(Reconcile::of)
        .collect();
    let distinct = pass
        .iter()
        .map(|r| r.object.as_str())
        .collect::<BTreeSet<_>>()
        .len();
    Ok(Pass {
        start: pass_start,
        end: pass_end,
        double_reconciles: pass.len() - distinct,
        distinct,
    })
}

/// Whether the whole log kept one owner per shard ([`check_reconciles`]);
/// the violations go to stderr, after `what`.
pub fn one_owner(log: &EventLog, what: &str) -> bool {
    match check_reconciles(&log.entries()) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("{what}: {e:#}");
            false
        }
    }
}

/// Runs `trials` trials of each replica count, appending to `out`;
/// `window` is the quiet window of the apiserver-cost measurement.
pub async fn scenario_sharded(
    ctx: &Ctx,
    trials: usize,
    window: Duration,
    out: &mut Vec<ShardedTrial>,
) -> Result<()> {
    let ns = ctx.env.new_namespace("bench-sharded").await?;
    eprintln!("sharded: creating {OBJECTS} ConfigMaps in {ns}");
    kube_runtime_lease_harness::create_configmaps(&ctx.client, &ns, OBJECTS, 0).await?;
    for trial in 0..trials {
        let mut order = REPLICAS;
        if trial % 2 == 1 {
            order.reverse();
        }
        for replicas in order {
            let measure_api = trial == 0;
            let t = one(ctx, &ns, replicas, trial, measure_api.then_some(window))
                .await
                .with_context(|| format!("sharded: {replicas} replicas, trial {trial}"))?;
            eprintln!(
                "sharded: {replicas} replicas #{trial}: settled {:.0} ms, pass {:.0} ms ({:.0}/s), {} double, one owner: {}, join rebalanced {:.0} ms",
                t.settle_ms, t.pass_ms, t.per_second, t.double_reconciles, t.one_owner, t.join_rebalance_ms
            );
            out.push(t);
        }
    }
    Ok(())
}

async fn one(
    ctx: &Ctx,
    ns: &str,
    replicas: usize,
    trial: usize,
    api_window: Option<Duration>,
) -> Result<ShardedTrial> {
    let lease = format!("shards-{replicas}-{trial}");
    let log = EventLog::new();
    let names: Vec<String> = (0..=replicas).map(|i| format!("r{i}")).collect();
    let env = replica_env(SHARDS);
    let spawn = |name: &str| -> Result<Process> { ctx.spawn_process(&log, ns, &lease, name, TIMINGS, &env) };
    let spawned = now_ns();
    let mut procs = Vec::new();
    for name in &names[..replicas] {
        procs.push(spawn(name)?);
    }
    let live: Vec<&str> = names[..replicas].iter().map(String::as_str).collect();
    let balanced = wait_balanced(
        &log,
        &live,
        SHARDS,
        Duration::from_secs(2),
        Duration::from_secs(120),
    )
    .await?;
    wait_first_pass(&log).await?;

    let (lease_requests_per_min, watches) = match api_window {
        Some(window) => {
            let before = ctx.env.metrics_text().await?;
            tokio::time::sleep(window).await;
            let after = ctx.env.metrics_text().await?;
            let per_min = (lease_requests(&after) - lease_requests(&before)) * 60.0 / window.as_secs_f64();
            (Some(per_min), Some(lease_watches(&after)))
        }
        None => (None, None),
    };

    // The measured pass.
    let pass = measured_pass(&log, &procs).await?;
    let (pass_start, pass_end, double_reconciles, distinct) =
        (pass.start, pass.end, pass.double_reconciles, pass.distinct);

    // One more replica joins.
    let joined = now_ns();
    procs.push(spawn(&names[replicas])?);
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    let rebalanced = wait_balanced(
        &log,
        &all,
        SHARDS,
        Duration::from_secs(2),
        Duration::from_secs(120),
    )
    .await?;
    let one_owner = one_owner(&log, "sharded");
    for p in &procs {
        let _ = p.signal(Sig::Term);
    }
    for mut p in procs {
        let _ = p.reap(Duration::from_secs(10)).await;
    }
    ensure!(distinct == OBJECTS, "{distinct} of {OBJECTS} objects in the pass");
    let pass_ms = ms_between(pass_start, pass_end);
    Ok(ShardedTrial {
        replicas,
        trial,
        shards: SHARDS,
        objects: OBJECTS,
        reconcile_ms: RECONCILE_MS,
        concurrency: CONCURRENCY,
        settle_ms: ms_between(spawned, balanced),
        pass_ms,
        per_second: OBJECTS as f64 * 1000.0 / pass_ms,
        double_reconciles,
        one_owner,
        lease_requests_per_min,
        lease_watches: watches,
        join_rebalance_ms: ms_between(joined, rebalanced),
        loadavg: loadavg(),
    })
}
