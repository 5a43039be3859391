//! The deterministic simulation's sharded mode: up to [`SLOTS`] replicas of
//! one sharded election ([`SHARDS`] shards) on the Lease double, with paused
//! time, through random joins, leaves (`shutdown`, with work that finishes in
//! its grace), crashes (cut off for good, restarted later, sometimes with the
//! same identity), pauses (cut off for a while, then back), latency spikes and
//! API faults (5xx, 409, 429, 403, requests and answers delayed, writes
//! applied but answered 409, watches expired and re-listed from a lagging
//! cache).
//!
//! Every replica does the work of each shard it holds as a Controller of
//! [`ShardedController`](crate::shard::ShardedController) does: units of work one
//! after another, each begun only while the shard's term holds, stopped when
//! the term ends; one unit in 25 never returns (a request with no timeout),
//! stopped only by the end of the term. Invariant: at no virtual instant do
//! two replicas work on one shard, counting for work that was stopped (not
//! finished) a tail of [`TAIL`] during which its requests may still land.
//! Once faults heal, every shard has an owner among the live replicas within
//! [`healed_bound`]; a minute later every shard has exactly one holder among
//! the live replicas, the shares are within one of each other, and the
//! roster names exactly the live replicas (the gone evicted by the members
//! watching over them: the selection of watched shards and the evictions are
//! what this checks beyond safety) and holds no other entry (departed
//! members' entries deleted).
//!
//! In half of the schedules each replica has timings of its own (drawn from
//! a generator of their own, so that the other half replays as before):
//! the single-Lease simulation's [`Timings::ALL`], as a rolling update that
//! changes them has; [`healed_bound`] is then the slowest's.
//!
//! `KRL_SIM_SHARDED_SCHEDULES` sets the number of schedules (default 60);
//! `KRL_SIM_SEED` replays one (see the single-Lease simulation).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    task::JoinHandle,
    time::{Instant, sleep, timeout},
};

use super::Timings;
use crate::{
    LeaseConfig, LeaseGuard,
    shard::{ShardConfig, ShardedElector},
    test_util::{FakeLeaseApi, Fault},
};

/// Replica slots.
const SLOTS: usize = 4;
const SHARDS: u16 = 6;
const CHAOS: Duration = Duration::from_secs(60);
/// Once faults heal (the last cut-off replica reconnected), every shard has
/// an owner among the live replicas within this long: the bound of the
/// `shard` module docs with the slowest timings of any replica started:
/// the roster watch of a replica cut off for up to 6 s back within
/// kube-runtime's backoff (6.4 s), two dead members evicted one after the
/// other (2 × (2 LD + RP): 13.6 s at the usual timings), and a shard whose
/// work hangs handed over (grace + LD + RP: 5.8 s). The worst seen over 300
/// schedules of the usual timings: 15.4 s.
fn healed_bound(timings: &[Timings]) -> Duration {
    let slowest = |t: fn(&Timings) -> Duration| timings.iter().map(t).max().unwrap_or_default();
    let (lease, retry) = (slowest(|t| t.lease), slowest(|t| t.retry_period));
    Duration::from_millis(6400) + 2 * (2 * lease + retry) + Duration::from_secs(2) + lease + retry
}
/// How long after work was stopped its requests may still land: less than
/// lease duration − renew deadline of every replica's timings, the margin
/// the protocol leaves (the single-Lease simulation's `TAIL`).
const TAIL: Duration = Duration::from_millis(300);

fn ms(rng: &mut fastrand::Rng, max: u64) -> Duration {
    Duration::from_millis(rng.u64(0..=max))
}

/// One replica's work on one shard, from its first unit to its last (plus the
/// tail when stopped).
#[derive(Clone, Copy, Debug)]
struct Work {
    /// The replica process (a restart is another one).
    process: usize,
    shard: u16,
    token: i64,
    start: Instant,
    end: Option<Instant>,
}

type Log = Arc<Mutex<Vec<Work>>>;

/// Resolves once `guard`'s renew deadline has passed (or its term ended).
async fn past_deadline(guard: &LeaseGuard) {
    while !guard.time_left().is_zero() {
        sleep(guard.time_left()).await;
    }
}

/// Works on `shard` whenever `replica` holds it: units of up to 300 ms, the
/// next begun only while the shard's term holds (the Controller's gate);
/// stopped at once when the term ends.
async fn work(replica: ShardedElector, shard: u16, process: usize, log: Log, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed ^ ((process as u64) << 16) ^ u64::from(shard));
    let mut held = replica.held();
    loop {
        let guard = loop {
            if let Some(g) = replica.guard(shard).filter(LeaseGuard::is_valid) {
                break g;
            }
            let _ = timeout(Duration::from_millis(800), held.changed()).await;
        };
        let token = guard.fencing_token();
        let at = {
            let mut log = log.lock().unwrap();
            log.push(Work {
                process,
                shard,
                token,
                start: Instant::now(),
                end: None,
            });
            log.len() - 1
        };
        let end = loop {
            let unit = ms(&mut rng, 300);
            // One unit in 25 never returns (a request with no timeout): only
            // the end of the term stops it.
            let hangs = rng.u8(0..25) == 0;
            let unit = async move {
                if hangs {
                    std::future::pending::<()>().await;
                }
                sleep(unit).await;
            };
            tokio::select! {
                biased;
                () = guard.lost_signal() => break Instant::now() + TAIL,
                () = past_deadline(&guard) => break Instant::now() + TAIL,
                () = unit => {
                    // A unit finished; the next one begins only in this term.
                    let holds = replica
                        .guard(shard)
                        .is_some_and(|g| g.is_valid() && g.fencing_token() == token);
                    if !holds {
                        break Instant::now();
                    }
                }
            }
        };
        log.lock().unwrap()[at].end = Some(end);
        drop(guard);
    }
}

/// A running replica process.
struct Replica {
    process: usize,
    identity: String,
    client: usize,
    elector: ShardedElector,
    tasks: Vec<JoinHandle<()>>,
}

struct Sim {
    seed: u64,
    fake: FakeLeaseApi,
    log: Log,
    rng: fastrand::Rng,
    slots: Vec<Option<Replica>>,
    processes: usize,
    /// Every client ever made: (id, usual latency).
    clients: Vec<(usize, Duration)>,
    /// The clients of crashed replicas: cut off for good (a pause that
    /// began before the crash does not bring them back).
    dead: Arc<Mutex<BTreeSet<usize>>>,
    /// Draws each replica's timings, when they have their own.
    timings_rng: Option<fastrand::Rng>,
    /// The timings of every replica started.
    timings: Vec<Timings>,
}

impl Sim {
    fn start(&mut self, slot: usize, identity: String) {
        let (client, id) = self.fake.client();
        let latency = ms(&mut self.rng, 20);
        self.fake.set_latency(id, latency);
        self.clients.push((id, latency));
        let timings = self.timings_rng.as_mut().map_or(Timings::USUAL, |rng| {
            Timings::ALL[rng.usize(0..Timings::ALL.len())]
        });
        self.timings.push(timings);
        let lease = LeaseConfig::new("default", "ctl", identity.clone())
            .lease_duration(timings.lease)
            .renew_deadline(timings.renew_deadline)
            .retry_period(timings.retry_period)
            .release_timeout(Duration::from_secs(1));
        let elector = ShardedElector::new(client, ShardConfig::new(lease, SHARDS)).unwrap();
        let process = self.processes;
        self.processes += 1;
        let mut tasks = vec![tokio::spawn({
            let e = elector.clone();
            async move { e.run().await }
        })];
        for shard in 0..SHARDS {
            tasks.push(tokio::spawn(work(
                elector.clone(),
                shard,
                process,
                self.log.clone(),
                self.seed,
            )));
        }
        tracing::info!(slot, process, identity, "SIM replica starts");
        self.slots[slot] = Some(Replica {
            process,
            identity,
            client: id,
            elector,
            tasks,
        });
    }

    /// The replica in `slot` dies: cut off for good (nothing it sends lands
    /// any more), its work stopped now (plus the tail).
    fn crash(&mut self, slot: usize) {
        let Some(r) = self.slots[slot].take() else { return };
        tracing::info!(slot, process = r.process, "SIM replica crashes");
        self.dead.lock().unwrap().insert(r.client);
        self.fake.partition(r.client, true);
        for t in &r.tasks {
            t.abort();
        }
        let end = Instant::now() + TAIL;
        for w in self.log.lock().unwrap().iter_mut() {
            if w.process == r.process && w.end.is_none() {
                w.end = Some(end);
            }
        }
    }

    /// The replica in `slot` leaves (`shutdown`): its work finishes within
    /// the grace or is stopped.
    fn leave(&mut self, slot: usize) {
        let Some(r) = self.slots[slot].take() else { return };
        tracing::info!(slot, process = r.process, "SIM replica leaves");
        let grace = ms(&mut self.rng, 2000);
        let log = self.log.clone();
        tokio::spawn(async move {
            r.elector.shutdown(grace).await;
            for t in &r.tasks {
                t.abort();
            }
            // The process exits: work still open is stopped now.
            let end = Instant::now() + TAIL;
            for w in log.lock().unwrap().iter_mut() {
                if w.process == r.process && w.end.is_none() {
                    w.end = Some(end);
                }
            }
        });
    }

    /// Fault `action` on the replica in `slot` (its client `client`).
    fn inject(&mut self, rng: &mut fastrand::Rng, slot: usize, client: usize, action: u8) {
        let fake = self.fake.clone();
        match action {
            0 => self.crash(slot),
            1 => self.leave(slot),
            // A pause: cut off for a while, then back.
            2 | 3 => {
                fake.partition(client, true);
                let d = ms(rng, 6000);
                let dead = self.dead.clone();
                tokio::spawn(async move {
                    sleep(d).await;
                    if !dead.lock().unwrap().contains(&client) {
                        fake.partition(client, false);
                    }
                });
            }
            4 => {
                let base = self
                    .clients
                    .iter()
                    .find(|c| c.0 == client)
                    .map_or(Duration::ZERO, |c| c.1);
                fake.set_latency(client, ms(rng, 2500));
                let d = ms(rng, 5000);
                tokio::spawn(async move {
                    sleep(d).await;
                    fake.set_latency(client, base);
                });
            }
            5 => fake.fault(
                client,
                None,
                Fault::Status(*[500u16, 503, 409, 429, 403].get(rng.usize(0..5)).unwrap()),
            ),
            6 => fake.fault(client, Some("update"), Fault::DelayResponse(ms(rng, 4000))),
            7 => fake.fault(client, None, Fault::DelayRequest(ms(rng, 4000))),
            8 => fake.fault(client, Some("update"), Fault::AppliedThenStatus(409)),
            9 => {
                fake.fault(client, Some("list"), Fault::StaleList);
                fake.expire_watches();
            }
            _ => {}
        }
    }

    fn live(&self) -> Vec<&Replica> {
        self.slots.iter().flatten().collect()
    }
}

async fn schedule(seed: u64) -> Vec<Work> {
    let mut rng = fastrand::Rng::with_seed(seed);
    super::seed_this_thread(seed);
    let mut sim = Sim {
        seed,
        fake: FakeLeaseApi::default(),
        log: Log::default(),
        rng: fastrand::Rng::with_seed(seed.wrapping_mul(7919)),
        slots: (0..SLOTS).map(|_| None).collect(),
        processes: 0,
        clients: Vec::new(),
        dead: Arc::default(),
        timings_rng: {
            let mut rng = fastrand::Rng::with_seed(seed ^ 0x9e37_79b9_7f4a_7c15);
            rng.bool().then_some(rng)
        },
        timings: Vec::new(),
    };
    let first = rng.usize(1..=SLOTS);
    for slot in 0..first {
        sim.start(slot, format!("r{slot}"));
    }
    let start = Instant::now();
    while start.elapsed() < CHAOS {
        sleep(ms(&mut rng, 2000)).await;
        let slot = rng.usize(0..SLOTS);
        let action = rng.u8(0..12);
        let Some(client) = sim.slots[slot].as_ref().map(|r| r.client) else {
            // An empty slot: a replica joins (a restart keeps the identity
            // half of the time, as a StatefulSet's pod does).
            let identity = if rng.bool() {
                format!("r{slot}")
            } else {
                format!("r{slot}-{}", sim.processes)
            };
            sim.start(slot, identity);
            continue;
        };
        tracing::info!(slot, action, "SIM fault");
        sim.inject(&mut rng, slot, client, action);
    }
    // Heal: no more faults; at least one replica runs.
    sim.fake.clear_faults();
    for &(id, latency) in &sim.clients {
        sim.fake.set_latency(id, latency);
    }
    sleep(Duration::from_secs(7)).await;
    for r in sim.live() {
        sim.fake.partition(r.client, false);
    }
    if sim.live().is_empty() {
        sim.start(0, "r0-last".to_owned());
    }
    owners_within_the_bound(&sim, seed).await;
    // Settled: one holder per shard among the live replicas, within one.
    let live = sim.live();
    let held: BTreeMap<&str, BTreeSet<u16>> = live
        .iter()
        .map(|r| (r.identity.as_str(), r.elector.held().borrow().clone()))
        .collect();
    let total: usize = held.values().map(BTreeSet::len).sum();
    let union: BTreeSet<u16> = held.values().flatten().copied().collect();
    assert!(
        total == usize::from(SHARDS) && union.len() == usize::from(SHARDS),
        "seed {seed}: 60 s after faults stopped, the shards are not each held once: {held:?}"
    );
    let (min, max) = (
        held.values().map(BTreeSet::len).min().unwrap_or(0),
        held.values().map(BTreeSet::len).max().unwrap_or(0),
    );
    assert!(
        max - min <= 1,
        "seed {seed}: unbalanced after faults stopped: {held:?}"
    );
    roster_is_the_live_replicas(&sim, seed);
    let now = Instant::now();
    let work = sim
        .log
        .lock()
        .unwrap()
        .iter()
        .map(|w| Work {
            end: Some(w.end.unwrap_or(now)),
            ..*w
        })
        .collect();
    for r in sim.slots.iter_mut().flatten() {
        for t in &r.tasks {
            t.abort();
        }
    }
    work
}

/// Once faults healed: every shard has an owner among the live replicas
/// within [`healed_bound`] (each shard's first instant held, sampled every
/// 50 ms for a minute).
async fn owners_within_the_bound(sim: &Sim, seed: u64) {
    let bound = healed_bound(&sim.timings);
    let healed = Instant::now();
    let mut first_owned: BTreeMap<u16, Instant> = BTreeMap::new();
    while healed.elapsed() < Duration::from_secs(60) {
        for r in sim.live() {
            for s in r.elector.held().borrow().iter() {
                first_owned.entry(*s).or_insert_with(Instant::now);
            }
        }
        sleep(Duration::from_millis(50)).await;
    }
    for shard in 0..SHARDS {
        let after = first_owned.get(&shard).map(|at| at.duration_since(healed));
        assert!(
            after.is_some_and(|a| a <= bound),
            "seed {seed}: shard {shard} has no owner within {bound:?} of the faults healing: first held after {after:?} (timings {:?})",
            sim.timings
        );
    }
}

/// The roster names exactly the live replicas, and holds no other entry.
fn roster_is_the_live_replicas(sim: &Sim, seed: u64) {
    let live = sim.live();
    // The roster names exactly the live replicas: the gone ones evicted
    // (each by the member watching over its shards, or over the next
    // member's), every live one joined (again, if it was evicted while cut
    // off).
    let roster: BTreeSet<String> = sim
        .fake
        .leases()
        .iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("ctl-member-"))
        })
        .filter_map(|l| crate::record::holder(l.spec.as_ref()?).map(str::to_owned))
        .collect();
    let identities: BTreeSet<String> = live.iter().map(|r| r.identity.clone()).collect();
    assert_eq!(
        roster, identities,
        "seed {seed}: 60 s after faults stopped, the roster is not the live replicas"
    );
    // And it holds no entry of a departed member: each was deleted.
    let entries = sim
        .fake
        .leases()
        .iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("ctl-member-"))
        })
        .count();
    assert_eq!(
        entries,
        identities.len(),
        "seed {seed}: 60 s after faults stopped, departed members' roster entries are left"
    );
}

fn check(seed: u64, work: &[Work]) {
    let mut by_shard: BTreeMap<u16, Vec<&Work>> = BTreeMap::new();
    for w in work {
        by_shard.entry(w.shard).or_default().push(w);
    }
    for (shard, runs) in by_shard {
        for (k, a) in runs.iter().enumerate() {
            for b in runs[k + 1..].iter().filter(|b| b.process != a.process) {
                let (a_end, b_end) = (a.end.unwrap(), b.end.unwrap());
                assert!(
                    a_end <= b.start || b_end <= a.start,
                    "seed {seed}: shard {shard} worked on by two replicas at once: {a:?} {b:?}"
                );
                // The later term's fencing token is larger.
                let (first, second) = if a.start <= b.start { (a, b) } else { (b, a) };
                assert!(
                    second.token > first.token,
                    "seed {seed}: shard {shard}: a later term with a token not larger: {first:?} {second:?}"
                );
            }
        }
    }
}

#[test]
fn no_shard_is_ever_worked_on_by_two_replicas() {
    let seeds = crate::tests::simulation::seeds("KRL_SIM_SHARDED_SCHEDULES", 60);
    let (terms, moves) = crate::tests::simulation::on_every_core(&seeds, |seed| async move {
        let mut work = schedule(seed).await;
        check(seed, &work);
        work.sort_by_key(|w| (w.shard, w.start));
        let moves = work
            .windows(2)
            .filter(|w| w[0].shard == w[1].shard && w[0].process != w[1].process)
            .count();
        (work.len(), moves)
    })
    .into_iter()
    .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    // The schedules exercise what they claim to: many terms, shards moving
    // between replicas.
    let n = seeds.len();
    assert!(terms >= n * usize::from(SHARDS), "{terms} terms");
    assert!(moves >= n, "{moves} moves of a shard between replicas");
}
