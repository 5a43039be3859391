//! Elected shards through process faults, against a real kube-apiserver:
//! three sharded candidate processes (`CANDIDATE_MODE=sharded`,
//! the timings of [`Timings::FAST`]) share [`SHARDS`] shards of a Controller
//! of [`OBJECTS`] `ConfigMaps`, each reconcile requeued every 100 ms, while one
//! of them is sent SIGTERM, SIGKILL or SIGSTOP, partitioned from the
//! apiserver through the test proxy, or the apiserver itself restarts.
//!
//! Every run's log is checked by `check_log`: each reconcile prints its first
//! and last points of work, each stamped before a check that its shard's term
//! holds, and no object (nor any shard) may be worked on by two processes at
//! once, nor a shard's fencing token go backwards (see
//! `kube_runtime_lease_harness::shards`). Each scenario also asserts its
//! bound: a SIGTERM'd replica's shards are re-owned within 1 s, a killed,
//! frozen or cut-off one's within the lease duration + 1 s; afterwards the
//! shards are balanced again (within one of each other). A fourth replica
//! joining gets its share by graceful handover.
//!
//! The scenarios run one at a time (`serial`): one of them restarts the
//! apiserver.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use kube_runtime_lease_harness::{
    EventLog, Fixture, Kind, LeaseRef, Partition, Process, Proxy, Reconcile, Runs, Sig, Timings,
    check_reconciles, create_configmaps, fmt_ms, held_by, ns, serial, take_process, wait_balanced,
    wait_covered,
};

const T: Timings = Timings::FAST;
/// Shards of the election.
const SHARDS: u16 = 6;
/// `ConfigMaps` reconciled.
const OBJECTS: usize = 24;
/// How long the balance must hold to count as settled.
const QUIET: Duration = Duration::from_millis(1500);
/// How long a settling may take.
const SETTLE: Duration = Duration::from_secs(40);
/// Scheduling slack allowed around the bounds.
const SLACK: Duration = Duration::from_millis(250);

/// Runs one scenario alone on the shared control plane; its log is checked
/// by `check_log` (one owner per shard throughout).
async fn scenario(name: &str, run: impl AsyncFn(&Fixture, &EventLog) -> Result<String>) -> Result<()> {
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let mut runs = Runs::new(name);
    let log = EventLog::new();
    let result = run(&ctx, &log).await;
    runs.record(0, result, &log);
    runs.finish()
}

/// A fresh namespace with [`OBJECTS`] `ConfigMaps`, and the base name of the
/// election's Leases in it.
async fn election(ctx: &Fixture, prefix: &str) -> Result<LeaseRef> {
    let namespace = ctx.env.new_namespace(prefix).await?;
    create_configmaps(&ctx.client, &namespace, OBJECTS, 0).await?;
    Ok(LeaseRef {
        namespace,
        name: "ctl".to_owned(),
    })
}

/// Spawns replicas `names` (`a` through `proxy` when given) and waits until
/// they hold the shards, balanced, and every `ConfigMap` was reconciled;
/// returns the election's base Lease and the processes.
async fn start(
    ctx: &Fixture,
    log: &EventLog,
    prefix: &str,
    names: &[&str],
    proxy: Option<&Proxy>,
) -> Result<(LeaseRef, Vec<Process>)> {
    let lease = election(ctx, prefix).await?;
    let through = match proxy {
        Some(p) => Some(p.kubeconfig(ctx.env.kubeconfig_path(), ctx.dir.path())?),
        None => None,
    };
    let mut procs = Vec::new();
    for name in names {
        let kubeconfig = if *name == "a" { through.as_deref() } else { None };
        procs.push(ctx.spawn_rust_sharded(log, &lease, name, T, SHARDS, kubeconfig)?);
    }
    wait_balanced(log, names, SHARDS, QUIET, SETTLE)
        .await
        .context("at the start")?;
    let reconciled = check_reconciles(&log.entries())?.objects;
    ensure!(
        reconciled == OBJECTS,
        "{reconciled} of {OBJECTS} ConfigMaps reconciled once settled"
    );
    Ok((lease, procs))
}

/// The shards `a` holds now (by its last `SHARDS` line).
fn held_by_a(log: &EventLog) -> Vec<u16> {
    held_by(&log.entries(), &["a"])
        .remove("a")
        .unwrap_or_default()
        .into_iter()
        .collect()
}

/// After `fault` at `at` removed `a`'s work: `b` and `c` hold every shard
/// within `bound`; returns how long it took.
async fn re_owned(log: &EventLog, at: u64, bound: Duration) -> Result<u64> {
    let covered = wait_covered(log, &["b", "c"], SHARDS, bound + Duration::from_secs(5)).await?;
    let took = covered.saturating_sub(at);
    ensure!(
        took <= ns(bound),
        "a's shards re-owned by b and c {} after the fault, more than {bound:?}",
        fmt_ms(took)
    );
    Ok(took)
}

/// The number of `RECONCILE` lines of `process` stamped after `after`.
fn reconciles_after(log: &EventLog, process: &str, after: u64) -> usize {
    log.filter(|e| e.kind == Kind::Reconcile && e.process == process && e.at > after)
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_the_shards_over_within_a_second() -> Result<()> {
    scenario("sharded: SIGTERM a replica", async |ctx, log| {
        let (_, mut procs) = start(ctx, log, "shards-term", &["a", "b", "c"], None).await?;
        let mut a = take_process(&mut procs, "a")?;
        let had = held_by_a(log);
        let termed = a.signal(Sig::Term)?;
        let took = re_owned(log, termed, Duration::from_secs(1)).await?;
        let status = a.wait_exit(Duration::from_secs(10)).await?;
        ensure!(status.success(), "a exited with {status}");
        wait_balanced(log, &["b", "c"], SHARDS, QUIET, SETTLE).await?;
        Ok(format!(
            "a held {had:?}; b and c held all {SHARDS} shards {} after SIGTERM",
            fmt_ms(took)
        ))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_replica_joins_by_graceful_handover() -> Result<()> {
    scenario("sharded: a fourth replica joins", async |ctx, log| {
        let (lease, mut procs) = start(ctx, log, "shards-join", &["a", "b", "c"], None).await?;
        let joined = log.note("d joins");
        procs.push(ctx.spawn_rust_sharded(log, &lease, "d", T, SHARDS, None)?);
        let balanced = wait_balanced(log, &["a", "b", "c", "d"], SHARDS, QUIET, SETTLE).await?;
        // d joins the roster at once (no creation hold: the entry is not an
        // election); the others hand shards over by release once the roster
        // has been stable for a retry period, none held for less than a
        // lease duration: within LD + 2 RP (and 1 s for the process to start).
        let took = balanced.saturating_sub(joined);
        ensure!(
            took <= ns(T.lease_duration + 2 * T.retry_period + Duration::from_secs(1)),
            "balanced over four only {} after d joined",
            fmt_ms(took)
        );
        let d = held_by(&log.entries(), &["d"]).remove("d").unwrap_or_default();
        // d reconciles the objects of its shards (unless, by the hash, they
        // have none: every object was reconciled at the start, so its shard
        // is known).
        let objects_of_d = log
            .entries()
            .iter()
            .filter_map(Reconcile::of)
            .filter(|r| d.contains(&r.shard))
            .count();
        if objects_of_d > 0 {
            log.wait_for("d to reconcile in its shards", Duration::from_secs(5), |e| {
                e.kind == Kind::Reconcile && e.process == "d"
            })
            .await?;
        }
        Ok(format!(
            "d joined and holds {d:?}: balanced over four {} after",
            fmt_ms(took)
        ))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_shards_are_taken_after_the_lease_duration() -> Result<()> {
    scenario("sharded: SIGKILL a replica", async |ctx, log| {
        let (_, mut procs) = start(ctx, log, "shards-kill", &["a", "b", "c"], None).await?;
        let mut a = take_process(&mut procs, "a")?;
        let had = held_by_a(log);
        let killed = a.kill().await?;
        let took = re_owned(log, killed, T.lease_duration + Duration::from_secs(1)).await?;
        // Not before the lease duration since a's last renewal (a retry
        // period before the kill at most).
        ensure!(
            took + ns(T.retry_period + SLACK) >= ns(T.lease_duration),
            "a's shards taken {} after the kill: before they expired",
            fmt_ms(took)
        );
        wait_balanced(log, &["b", "c"], SHARDS, QUIET, SETTLE).await?;
        Ok(format!(
            "a held {had:?}; b and c held all {SHARDS} shards {} after SIGKILL",
            fmt_ms(took)
        ))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_shards_are_taken_and_the_frozen_replica_never_works_on_them_again() -> Result<()> {
    scenario("sharded: SIGSTOP a replica, then SIGCONT", async |ctx, log| {
        let (_, procs) = start(ctx, log, "shards-stop", &["a", "b", "c"], None).await?;
        let a = procs.iter().find(|p| p.name() == "a").context("a")?;
        let had = held_by_a(log);
        let frozen = a.signal(Sig::Stop)?;
        let took = re_owned(log, frozen, T.lease_duration + Duration::from_secs(1)).await?;
        // Frozen a while longer, then resumed: it must find its terms ended
        // (its renew deadline passed) before any further work on them.
        tokio::time::sleep(T.lease_duration).await;
        let resumed = a.signal(Sig::Cont)?;
        wait_balanced(log, &["a", "b", "c"], SHARDS, QUIET, SETTLE)
            .await
            .context("after SIGCONT")?;
        ensure!(
            reconciles_after(log, "a", resumed) > 0,
            "a reconciled nothing after it rejoined"
        );
        Ok(format!(
            "a held {had:?}; b and c held all {SHARDS} shards {} after SIGSTOP; rebalanced after SIGCONT",
            fmt_ms(took)
        ))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_replica_stops_before_its_shards_are_taken() -> Result<()> {
    scenario("sharded: partition a replica from the apiserver", async |ctx, log| {
        let proxy = Proxy::start(ctx.env.apiserver_port()).await?;
        let _procs = start(ctx, log, "shards-cut", &["a", "b", "c"], Some(&proxy)).await?;
        let had = held_by_a(log);
        let cut = log.note("partition a (BlackHole)");
        proxy.partition(Partition::BlackHole);
        let took = re_owned(log, cut, T.lease_duration + Duration::from_secs(1)).await?;
        // a's own view: it holds nothing within its renew deadline.
        let dropped = log
            .wait_for("a to hold no shard", T.renew_deadline + Duration::from_secs(2), |e| {
                e.kind == Kind::Shards && e.process == "a" && e.at > cut && e.detail == "-"
            })
            .await?;
        ensure!(
            dropped.at - cut <= ns(T.renew_deadline + SLACK),
            "a still held shards {} after the cut, past its renew deadline",
            fmt_ms(dropped.at - cut)
        );
        let healed = log.note("heal");
        proxy.heal();
        wait_balanced(log, &["a", "b", "c"], SHARDS, QUIET, SETTLE)
            .await
            .context("after the heal")?;
        ensure!(
            reconciles_after(log, "a", healed) > 0,
            "a reconciled nothing after the heal"
        );
        Ok(format!(
            "a held {had:?}, gave them up {} after the cut; b and c held all {SHARDS} {} after it; proxy {:?}",
            fmt_ms(dropped.at - cut),
            fmt_ms(took),
            proxy.stats()
        ))
    })
    .await
}

/// `b`'s watches lag (every chunk of its watch streams delivered [`LAG`]
/// late, its requests answered at once), then `a` is killed: `b` takes `a`'s
/// shards within the lease duration and 2.2 retry periods of the kill, the
/// bound of a client-go follower, which polls: the last renewal read within
/// a (jittered) retry period of the kill, expired a lease duration later,
/// the eviction's read and write and the takeover's write at once after it.
/// Never before that renewal expired (`check_log`: one owner per shard). A
/// lease duration of 4 s: a lag of most of it never leaves the watch silent
/// for a lease duration (which an eviction's confirming reads would catch),
/// and still takes a renewal more than a retry period to arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_members_shards_are_taken_in_time_though_the_backups_watches_lag() -> Result<()> {
    const T: Timings = Timings {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(500),
    };
    const LAG: Duration = Duration::from_secs(3);
    scenario("sharded: the backup's watches lag, then a is killed", async |ctx, log| {
        let lease = election(ctx, "shards-lag").await?;
        let proxy = Proxy::start(ctx.env.apiserver_port()).await?;
        let through = proxy.kubeconfig(ctx.env.kubeconfig_path(), ctx.dir.path())?;
        let mut a = ctx.spawn_rust_sharded(log, &lease, "a", T, SHARDS, None)?;
        let _b = ctx.spawn_rust_sharded(log, &lease, "b", T, SHARDS, Some(&through))?;
        wait_balanced(log, &["a", "b"], SHARDS, QUIET, SETTLE)
            .await
            .context("at the start")?;
        let had = held_by_a(log);
        log.note(&format!("b's watches {LAG:?} late"));
        proxy.set_stream_latency(LAG);
        // The lag holds long enough for b's view to be all under it.
        tokio::time::sleep(LAG + Duration::from_secs(2)).await;
        let killed = a.kill().await?;
        let bound = T.lease_duration + T.retry_period.mul_f64(2.2) + 2 * SLACK;
        let covered = wait_covered(log, &["b"], SHARDS, bound + LAG + Duration::from_secs(10)).await?;
        let took = covered.saturating_sub(killed);
        ensure!(
            took <= ns(bound),
            "a's shards {had:?} taken by b only {} after a was killed (b's watches {LAG:?} late; expected \
             within {bound:?}: the lease duration and 2.2 retry periods, as a polling client-go follower); \
             proxy {:?}",
            fmt_ms(took),
            proxy.stats()
        );
        ensure!(
            took + ns(T.retry_period + SLACK) >= ns(T.lease_duration),
            "a's shards taken {} after the kill: before they expired",
            fmt_ms(took)
        );
        Ok(format!(
            "a held {had:?}; b held all {SHARDS} shards {} after SIGKILL, its watches {LAG:?} late; proxy {:?}",
            fmt_ms(took),
            proxy.stats()
        ))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart_leaves_one_owner_per_shard() -> Result<()> {
    scenario("sharded: restart the apiserver", async |ctx, log| {
        let _procs = start(ctx, log, "shards-restart", &["a", "b", "c"], None).await?;
        let down = log.note("stopping the apiserver");
        ctx.env.stop_apiserver()?;
        // Nobody can renew: every replica holds nothing within its renew deadline.
        let emptied = log
            .wait_until(
                "every replica to hold no shard",
                T.renew_deadline + Duration::from_secs(3),
                |entries| {
                    let said: Vec<u64> = ["a", "b", "c"]
                        .iter()
                        .filter_map(|p| {
                            entries
                                .iter()
                                .filter(|e| e.kind == Kind::Shards && e.process == *p && e.at > down)
                                .map(|e| e.at)
                                .max()
                        })
                        .collect();
                    let held = held_by(entries, &["a", "b", "c"]);
                    (said.len() == 3 && held.values().all(std::collections::BTreeSet::is_empty))
                        .then(|| said.iter().copied().max().unwrap_or(down))
                },
            )
            .await?;
        ensure!(
            emptied - down <= ns(T.renew_deadline + SLACK),
            "a replica still held shards {} after the apiserver went down, past the renew deadline",
            fmt_ms(emptied - down)
        );
        // The fault: the apiserver stays down a while longer.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let restarting = log.note("starting the apiserver");
        ctx.env.start_apiserver().await?;
        wait_balanced(log, &["a", "b", "c"], SHARDS, QUIET, SETTLE)
            .await
            .context("after the restart")?;
        Ok(format!(
            "every replica held no shard {} after the apiserver went down; balanced again after the restart ({} down)",
            fmt_ms(emptied - down),
            fmt_ms(restarting - down)
        ))
    })
    .await
}
