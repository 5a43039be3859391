//! The handover and failover scenarios: chains of candidates on one Lease,
//! each trial signalling the leader and timing its successor.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, anyhow};
use kube::Client;
use kube_runtime_lease_harness::{Kind, LeaseRef, Sig, now_ns, watch_lease};
use serde::{Deserialize, Serialize};

use crate::candidate::{Candidate, Ctx};
use crate::impls::{HANDOVER_IMPLS, IMPLS, Impl, TIMINGS, Timing};
use crate::machine::loadavg;
use crate::{create_free_lease, ms_between};

/// Every version of the Lease the driver's own watch saw: (mono ns, holder).
/// Every version of the Lease the driver's own watch saw: (mono ns, holder).
#[derive(Clone, Default)]
struct LeaseLog(Arc<Mutex<Vec<(u64, String)>>>);

impl LeaseLog {
    fn start(client: &Client, lease: &LeaseRef) -> (Self, tokio::task::JoinHandle<()>) {
        let log = LeaseLog::default();
        let l = log.clone();
        let task = watch_lease(client.clone(), lease, move |at, lease| {
            let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            l.0.lock().unwrap().push((at, holder));
        });
        (log, task)
    }

    /// First time after `after` at which the Lease was seen free.
    fn released_after(&self, after: u64) -> Option<u64> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|(t, h)| *t >= after && h.is_empty())
            .map(|(t, _)| *t)
    }

    /// Last time before `before` at which the Lease was seen written by `holder`.
    fn last_write_by(&self, holder: &str, before: u64) -> Option<u64> {
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
        create_free_lease(&ctx.client, &ns, &lease).await?;
        let (log, watch) = LeaseLog::start(
            &ctx.client,
            &LeaseRef {
                namespace: ns.clone(),
                name: lease.clone(),
            },
        );
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
            .wait_event(Kind::StartedLeading, t.lease() * 2 + Duration::from_secs(30))
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
        follower.wait_event(Kind::Ready, Duration::from_secs(30)).await?;
        // Settle: the follower reaches its steady state (first read done, watch
        // open), then a random phase against its poll cycle and the leader's
        // renewals.
        let settle = Duration::from_millis(1500) + self.t.retry().mul_f64(2.2 * fastrand::f64());
        tokio::time::sleep(settle).await;
        let mut leader = self.leader.take().ok_or_else(|| anyhow!("chain has no leader"))?;
        let t0 = now_ns();
        leader.signal(if kill { Sig::Kill } else { Sig::Term })?;
        let timeout = self.t.lease() * 2 + self.t.retry() * 3 + Duration::from_secs(20);
        let result = follower.wait_event(Kind::StartedLeading, timeout).await;
        let old_id = leader.id.clone();
        let stopped = leader.find(Kind::StoppedLeading);
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

/// One trial of `scenario` on `chain` (started first if there is none: the
/// first trial, or the one after a failure, which finishes the chain).
async fn chain_trial(
    ctx: &Ctx,
    chain: &mut Option<Chain>,
    imp: Impl,
    t: Timing,
    scenario: &str,
    trial: usize,
    kill: bool,
) -> Trial {
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
            *chain = Some(Chain::new(ctx, imp, t, scenario).await?);
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
    record
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
        let record = chain_trial(ctx, &mut chain, imp, t, scenario, trial, kill).await;
        results.lock().unwrap().push(record);
    }
    if let Some(c) = chain.take() {
        c.finish().await;
    }
}

pub async fn scenario_handover(ctx: &Ctx, trials: usize) -> Vec<Trial> {
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
                let record = chain_trial(ctx, &mut chains[i], imp, t, "handover", trial, false).await;
                results.lock().unwrap().push(record);
            }
        }
        for c in chains.into_iter().flatten() {
            c.finish().await;
        }
    }
    results.into_inner().unwrap()
}

pub async fn scenario_failover(ctx: &Ctx, trials: usize) -> Vec<Trial> {
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
