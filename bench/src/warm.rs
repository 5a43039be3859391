//! The warm-standby scenario: with thousands of ConfigMaps, a
//! standby Controller takes over from a leader that hands over on SIGTERM,
//! cold (`with_leader_election`: it lists once it leads) and warm
//! (`with_leader_election_warm`: its store was filled while following),
//! trials alternating. Measured per trial: the time from the moment the
//! standby wins the Lease (its elector's status names it holder: the
//! candidate's `EVENT new-leader <ns> <itself>`) to its first reconcile and to
//! every object reconciled once; the ConfigMap LISTs the apiserver served
//! during the takeover (`apiserver_request_total`); and the standby's
//! resident memory (VmRSS) while it follows.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use kube_runtime_lease_harness::{Kind, Sig, configmap_lists, create_configmaps};
use serde::{Deserialize, Serialize};

use crate::candidate::Ctx;
use crate::create_free_lease;
use crate::impls::{Impl, TIMINGS};
use crate::machine::loadavg;
use crate::ms_between;

/// ConfigMaps in the namespace the standby reconciles.
pub const OBJECTS: usize = 5_000;
/// Bytes of data per ConfigMap (one key): a small object.
const VALUE_BYTES: usize = 256;
/// The order of trial 0's takeovers.
const MODES: [&str; 2] = ["cold", "warm"];

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WarmTrial {
    /// `"cold"` or `"warm"`.
    pub mode: String,
    pub trial: usize,
    pub objects: usize,
    /// SIGTERM to the old leader → the standby holds the Lease.
    pub signal_to_win_ms: f64,
    /// The standby holds the Lease → its first reconcile starts.
    pub win_to_first_reconcile_ms: f64,
    /// The standby holds the Lease → every object reconciled once.
    pub win_to_all_reconciled_ms: f64,
    /// ConfigMap LISTs served between the SIGTERM and the last reconcile.
    pub lists_at_takeover: f64,
    /// The standby's VmRSS while following (warm: once its store is synced).
    pub follower_rss_kib: u64,
    /// The standby's VmRSS once every object was reconciled as leader.
    pub leader_rss_kib: u64,
    pub loadavg: f64,
}

/// Runs `trials` takeovers per mode (cold, warm, warm, cold, ...) over
/// `objects` ConfigMaps, appending to `out`.
pub async fn scenario_warm(ctx: &Ctx, trials: usize, objects: usize, out: &mut Vec<WarmTrial>) -> Result<()> {
    let ns = ctx.env.new_namespace("bench-warm").await?;
    eprintln!("warm: creating {objects} ConfigMaps in {ns}");
    create_configmaps(&ctx.client, &ns, objects, VALUE_BYTES).await?;
    for trial in 0..trials {
        // The order flips every trial, so that neither mode always runs first.
        let modes = if trial % 2 == 0 {
            MODES
        } else {
            [MODES[1], MODES[0]]
        };
        for mode in modes {
            let t = one(ctx, &ns, mode, trial, objects)
                .await
                .with_context(|| format!("warm: {mode} trial {trial}"))?;
            eprintln!(
                "warm: {mode} #{trial}: win→first reconcile {:.1} ms, win→all {objects} {:.0} ms, {} LISTs, follower {} KiB",
                t.win_to_first_reconcile_ms,
                t.win_to_all_reconciled_ms,
                t.lists_at_takeover,
                t.follower_rss_kib
            );
            out.push(t);
        }
    }
    Ok(())
}

async fn one(ctx: &Ctx, ns: &str, mode: &str, trial: usize, objects: usize) -> Result<WarmTrial> {
    let timing = TIMINGS[0];
    let lease = format!("warm-{mode}-{trial}");
    create_free_lease(&ctx.client, ns, &lease).await?;
    let leader = ctx.spawn(Impl::Ours, ns, &lease, "leader", timing)?;
    leader
        .wait_event(Kind::StartedLeading, Duration::from_secs(30))
        .await?;
    let standby = ctx.spawn_env(
        Impl::Ours,
        ns,
        &lease,
        "standby",
        timing,
        &[("CANDIDATE_MODE", mode)],
    )?;
    // Following: a warm standby's store is synced; a cold one has seen the leader.
    if mode == "warm" {
        let synced = standby
            .wait_for("a synced store", Duration::from_secs(120), |lines| {
                lines
                    .iter()
                    .find(|e| e.kind == Kind::Synced)
                    .map(|e| e.who.clone())
            })
            .await?;
        ensure!(
            synced == objects.to_string(),
            "the store synced {synced} objects, not {objects}"
        );
    }
    standby
        .wait_for("the leader seen", Duration::from_secs(30), |lines| {
            lines
                .iter()
                .any(|e| e.kind == Kind::NewLeader && e.who == "leader")
                .then_some(())
        })
        .await?;
    let follower_rss_kib = standby.cpu_rss()?.1;
    ensure!(
        standby.find(Kind::Work).is_none(),
        "the standby reconciled while following"
    );

    let lists_before = configmap_lists(&ctx.env.metrics_text().await?);
    let signalled = kube_runtime_lease_harness::now_ns();
    leader.signal(Sig::Term)?;
    let won = standby
        .wait_for("the Lease won", Duration::from_secs(30), |lines| {
            lines
                .iter()
                .find(|e| e.kind == Kind::NewLeader && e.who == "standby")
                .map(|e| e.at)
        })
        .await?;
    let (first, last) = standby
        .wait_for(
            &format!("{objects} reconciles"),
            Duration::from_secs(300),
            |lines| {
                let work: Vec<u64> = lines
                    .iter()
                    .filter(|e| e.kind == Kind::Work)
                    .map(|e| e.at)
                    .collect();
                (work.len() >= objects).then(|| (work[0], work[objects - 1]))
            },
        )
        .await?;
    let lists_after = configmap_lists(&ctx.env.metrics_text().await?);
    let leader_rss_kib = standby.cpu_rss()?.1;
    standby.stop().await;
    let mut leader = leader;
    leader.reap(Duration::from_secs(10)).await;
    Ok(WarmTrial {
        mode: mode.to_owned(),
        trial,
        objects,
        signal_to_win_ms: ms_between(signalled, won),
        win_to_first_reconcile_ms: ms_between(won, first),
        win_to_all_reconciled_ms: ms_between(won, last),
        lists_at_takeover: lists_after - lists_before,
        follower_rss_kib,
        leader_rss_kib,
        loadavg: loadavg(),
    })
}
