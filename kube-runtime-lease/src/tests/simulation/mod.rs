//! A deterministic simulation: several candidates on one Lease, thousands of
//! random schedules of delays, failures, partitions, latency spikes, deletions,
//! foreign writes, writes applied but answered 409, watches expired and
//! re-listed from a lagging cache, voluntary releases, acquisitions given up,
//! shutdowns (with guarded work that finishes in its grace or has to be
//! stopped) and restarts, on paused time; in a third of the
//! schedules two candidates share one identity. Asserts that no two candidates
//! ever act as leader at the same virtual instant, counting, for guarded work
//! that was stopped rather than finished, a tail of [`TAIL`] after the stop
//! during which requests it sent may still land; that someone leads once
//! faults stop, and that once they have healed no gap without a leader is
//! longer than the crate docs' bound with a margin ([`leaderless_bound`]; the faults
//! include 404s that are not deletions, a `preferredHolder` that may never
//! come, and `leaseTransitions` at the top of its range or edited down); that
//! a guard is valid when handed out; and that no term ends as
//! [`Lost::Shutdown`] without a shutdown.
//!
//! Three schedules in four draw, besides, what was found since the first
//! draws (from a generator of their own, [`Newer`], so that a schedule that
//! draws none of it replays as before): candidates with timings of their own
//! on one Lease, as a rolling update that changes them has
//! ([`Timings::ALL`]: the usual, twice slower, three times faster); and
//! requests that outlive their bound (a `get`, `create` or `update` arriving
//! after the renew deadline, as behind a slow credential plugin), watches
//! that stall, lag or are refused (403) for a while, every watch expired
//! (410, a normal re-list), admission's 403 and a proxy's plain-text 5xx.
//! One hazard documented and left is excused, and counted: a deleted Lease
//! created again by a candidate that never saw its record, with its own
//! creation hold shorter than the old holder's renew deadline, beside the
//! old holder (regressions section 55). etcd restored from a snapshot
//! (`FakeLeaseApi::restore`) is not drawn: the double restores without
//! `--bump-revision`, reusing resourceVersions, so that a write prepared
//! before the restore passes its precondition against another record.
//!
//! `KRL_SIM_SCHEDULES` sets the number of schedules (default 1000);
//! `KRL_SIM_SEED` replays one schedule.

#[cfg(feature = "unstable-shards")]
mod sharded;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::{Instant, sleep, timeout};

use crate::{
    LeaderElector, LeaseConfig, LeaseGuard, Lost,
    test_util::{FakeLeaseApi, Fault},
};

const CANDIDATES: usize = 3;
const CHAOS: Duration = Duration::from_secs(60);
/// How long after guarded work is stopped its requests may still land: less
/// than lease duration − renew deadline of every candidate's timings (1 s,
/// 2 s and 333 ms here), the margin the protocol leaves for it.
const TAIL: Duration = Duration::from_millis(300);
const _: () = {
    let mut i = 0;
    while i < Timings::ALL.len() {
        assert!(TAIL.as_nanos() < Timings::ALL[i].margin().as_nanos());
        i += 1;
    }
};

/// A candidate's lease duration, renew deadline and retry period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Timings {
    lease: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
}

impl Timings {
    /// Every schedule's, until candidates had timings of their own.
    const USUAL: Self = Self {
        lease: LEASE,
        renew_deadline: RENEW_DEADLINE,
        retry_period: Duration::from_millis(800),
    };
    /// The usual, twice slower, three times faster.
    const ALL: [Self; 3] = [
        Self::USUAL,
        Self {
            lease: Duration::from_secs(6),
            renew_deadline: Duration::from_secs(4),
            retry_period: Duration::from_millis(1600),
        },
        Self {
            lease: Duration::from_secs(1),
            renew_deadline: Duration::from_millis(667),
            retry_period: Duration::from_millis(267),
        },
    ];

    /// Lease duration − renew deadline: the margin for stopping guarded work.
    const fn margin(self) -> Duration {
        self.lease.saturating_sub(self.renew_deadline)
    }
}

#[derive(Clone, Copy, Debug)]
struct Interval {
    who: usize,
    start: Instant,
    end: Option<Instant>,
}

fn config(identity: &str, watch: bool, release_timeout: Duration, timings: Timings) -> LeaseConfig {
    LeaseConfig::new("default", "lease", identity)
        .lease_duration(timings.lease)
        .renew_deadline(timings.renew_deadline)
        .retry_period(timings.retry_period)
        .release_timeout(release_timeout)
        .watch(watch)
}

const RENEW_DEADLINE: Duration = Duration::from_secs(2);

/// Resolves once `guard`'s renew deadline has passed (or its term ended).
async fn past_deadline(guard: &LeaseGuard) {
    while !guard.time_left().is_zero() {
        sleep(guard.time_left()).await;
    }
}

fn ms(rng: &mut fastrand::Rng, max: u64) -> Duration {
    Duration::from_millis(rng.u64(0..=max))
}

/// How a term of a simulated candidate ended.
enum End {
    /// Lost (or its renew deadline passed): the work was stopped.
    Lost,
    /// Given up after the work finished.
    Voluntary,
    /// The candidate shuts down.
    Shutdown,
}

/// One candidate process, and the processes that replace it when it shuts
/// down (a restart, with the same identity).
struct Candidate {
    seed: u64,
    i: usize,
    identity: String,
    watch: bool,
    timings: Timings,
    fake: FakeLeaseApi,
    client: kube_client::Client,
    intervals: Arc<Mutex<Vec<Interval>>>,
    rng: fastrand::Rng,
    /// Random shutdowns, restarts and acquisitions given up stop then.
    chaos_until: Instant,
    /// A release may take this long: longer than lease duration − renew
    /// deadline, a release can land after a takeover.
    release_timeout: Duration,
    /// Shut down now, if leading (a fault: a release racing a takeover).
    poke: Arc<tokio::sync::Notify>,
}

impl Candidate {
    fn elector(&self) -> LeaderElector {
        LeaderElector::new(
            self.client.clone(),
            config(&self.identity, self.watch, self.release_timeout, self.timings),
        )
        .unwrap()
    }

    fn chaos(&self) -> bool {
        Instant::now() < self.chaos_until
    }

    fn start(&self) -> usize {
        tracing::info!(candidate = self.i, "SIM leads");
        let mut intervals = self.intervals.lock().unwrap();
        intervals.push(Interval {
            who: self.i,
            start: Instant::now(),
            end: None,
        });
        intervals.len() - 1
    }

    fn end(&self, at: usize, end: Instant) {
        tracing::info!(candidate = self.i, "SIM stops leading");
        self.intervals.lock().unwrap()[at].end = Some(end);
    }

    /// Leads whenever it can, until aborted; records its terms.
    async fn run(mut self) {
        let _ = &self.fake;
        let mut elector = self.elector();
        loop {
            // Sometimes give up waiting (a `timeout(acquire)`), or shut down
            // while waiting (a rollout), possibly during a creation hold.
            let give_up = if self.chaos() && self.rng.u8(0..4) == 0 {
                ms(&mut self.rng, 4000)
            } else {
                Duration::from_secs(3600)
            };
            let shut_down = self.chaos() && self.rng.u8(0..3) == 0;
            let guard = match timeout(give_up, elector.acquire()).await {
                Ok(Ok(guard)) => guard,
                Ok(Err(_)) => return,
                Err(_) if shut_down => {
                    let _ = elector.shutdown(ms(&mut self.rng, 2000)).await;
                    elector = self.elector();
                    continue;
                }
                Err(_) => continue,
            };
            // Valid when handed out: if it is no longer valid when this task
            // runs, the term was ended in between by what the elector task saw
            // next (a takeover, a deletion queued on its watch), never by a
            // renew deadline that had passed before (or a release).
            assert!(
                guard.is_valid()
                    || !matches!(
                        guard.lost(),
                        None | Some(Lost::RenewDeadlineExceeded | Lost::Shutdown)
                    ),
                "seed {}: c{} was handed a guard of an ended term: {:?}",
                self.seed,
                self.i,
                guard.lost()
            );
            let at = self.start();
            // Sometimes give leadership up after a while, or shut down.
            let hold = if self.rng.u8(0..4) == 0 {
                ms(&mut self.rng, 5000)
            } else {
                Duration::from_secs(3600)
            };
            let shutdown_at = if self.chaos() && self.rng.u8(0..4) == 0 {
                ms(&mut self.rng, 5000)
            } else {
                Duration::from_secs(3600)
            };
            let poke = self.poke.clone();
            let end = tokio::select! {
                () = poke.notified() => End::Shutdown,
                () = guard.lost_signal() => {
                    assert_ne!(
                        guard.lost(),
                        Some(Lost::Shutdown),
                        "seed {}: c{}'s term ended as Shutdown without a shutdown",
                        self.seed, self.i
                    );
                    End::Lost
                }
                // Noticing the renew deadline before the elector task
                // does, as `WithLeaderElection` may.
                () = past_deadline(&guard) => End::Lost,
                () = sleep(hold) => End::Voluntary,
                () = sleep(shutdown_at) => End::Shutdown,
            };
            match end {
                // Work stopped in flight: its requests may land a while later,
                // unless someone else wrote the record free (an admin): a
                // follower takes that at once, and nothing can tell it from a
                // release; the term ends on the event itself.
                End::Lost if matches!(guard.lost(), Some(Lost::TakenOver { holder }) if holder.is_empty()) => {
                    self.end(at, Instant::now());
                }
                End::Lost => self.end(at, Instant::now() + TAIL),
                // Work finished: nothing more lands.
                End::Voluntary => self.end(at, Instant::now()),
                End::Shutdown => {
                    let grace = ms(&mut self.rng, 2000);
                    let shutting = tokio::spawn({
                        let elector = elector.clone();
                        async move { elector.shutdown(grace).await }
                    });
                    if self.rng.bool() {
                        // The work finishes within its grace.
                        let finish = ms(&mut self.rng, grace.as_millis().try_into().unwrap_or(0));
                        tokio::select! {
                            () = guard.lost_signal() => self.end(at, Instant::now() + TAIL),
                            () = past_deadline(&guard) => self.end(at, Instant::now() + TAIL),
                            () = sleep(finish) => self.end(at, Instant::now()),
                        }
                    } else {
                        // The work ignores the request; it is stopped when
                        // the grace runs out (or the term ends first).
                        tokio::select! {
                            () = guard.lost_signal() => {}
                            () = past_deadline(&guard) => {}
                        }
                        self.end(at, Instant::now() + TAIL);
                    }
                    drop(guard);
                    let _ = shutting.await;
                    elector = self.elector();
                    continue;
                }
            }
            drop(guard);
            // Often campaign again at once, as a guarded stream in a loop does.
            if self.rng.bool() {
                sleep(ms(&mut self.rng, 1500)).await;
            }
        }
    }
}

async fn schedule(seed: u64) -> Run {
    let mut rng = fastrand::Rng::with_seed(seed);
    seed_this_thread(seed);
    let mut newer = Newer::draw(seed);
    let fake = FakeLeaseApi::default();
    let intervals = Arc::new(Mutex::new(Vec::<Interval>::new()));
    let shared_identity = rng.u8(0..3) == 0;
    let start = Instant::now();
    let mut ids = Vec::new();
    let mut latency = Vec::new();
    let mut tasks = Vec::new();
    let pokes: Vec<_> = (0..CANDIDATES)
        .map(|_| Arc::new(tokio::sync::Notify::new()))
        .collect();
    let mut foreign_free = Vec::new();
    let mut deleted = Vec::new();
    let timings: Vec<Timings> = (0..CANDIDATES).map(|_| newer.timings()).collect();
    tracing::info!(?timings, "SIM timings");
    for i in 0..CANDIDATES {
        let (client, id) = fake.client();
        ids.push(id);
        // Every request takes a little while: a read to confirm is never free.
        latency.push(ms(&mut rng, 20));
        fake.set_latency(id, latency[i]);
        let identity = if shared_identity && i == CANDIDATES - 1 {
            "c0".to_owned()
        } else {
            format!("c{i}")
        };
        let candidate = Candidate {
            seed,
            i,
            identity,
            watch: rng.bool(),
            timings: timings[i],
            fake: fake.clone(),
            client,
            intervals: intervals.clone(),
            rng: fastrand::Rng::with_seed(seed.wrapping_mul(31).wrapping_add(i as u64)),
            chaos_until: start + CHAOS,
            release_timeout: if rng.bool() {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(6)
            },
            poke: pokes[i].clone(),
        };
        tasks.push(tokio::spawn(candidate.run()));
    }
    while start.elapsed() < CHAOS {
        sleep(ms(&mut rng, 1500)).await;
        let k = rng.usize(0..CANDIDATES);
        let victim = ids[k];
        let action = rng.u8(0..18);
        tracing::info!(victim, action, "SIM fault");
        inject(
            &fake,
            &mut rng,
            victim,
            latency[k],
            timings[k],
            action,
            &mut foreign_free,
        );
        if action == 11 {
            // The victim's next write (its release, if it leads) lands only
            // after another candidate may have taken over.
            pokes[k].notify_one();
        }
        if action == 5 {
            deleted.push(Instant::now());
        }
        if let Some((k, action)) = newer.fault() {
            tracing::info!(victim = ids[k], action, "SIM newer fault");
            newer.inject(&fake, ids[k], timings[k], action);
        }
    }
    heal(&fake, &newer, &ids);
    never_none(seed, start, &intervals, &timings).await;
    for t in tasks {
        t.abort();
    }
    let now = Instant::now();
    let intervals = intervals
        .lock()
        .unwrap()
        .iter()
        .map(|iv| Interval {
            end: Some(iv.end.unwrap_or(now)),
            ..*iv
        })
        .collect();
    Run {
        intervals,
        foreign_free,
        deleted,
        timings,
        newer,
    }
}

/// Heals every fault: faults still queued are dropped (a queued late answer
/// or late request would otherwise disrupt each new term); partitions and
/// latency end within 6 s; watches lag and are refused no more (a stalled
/// one stays stalled: kube-runtime's watcher reconnects it only after
/// minutes).
fn heal(fake: &FakeLeaseApi, newer: &Newer, ids: &[usize]) {
    fake.clear_faults();
    if newer.faults {
        for &id in ids {
            fake.set_watch_latency(id, Duration::ZERO);
            fake.allow_watch(id);
        }
        fake.expire_watches();
    }
}

/// Runs 30 s more after the chaos (`start` + [`CHAOS`]), and asserts that
/// someone led once every fault had healed, with no gap longer than
/// [`leaderless_bound`].
async fn never_none(seed: u64, start: Instant, intervals: &Mutex<Vec<Interval>>, timings: &[Timings]) {
    sleep(Duration::from_secs(30)).await;
    // Someone led once every fault had healed: at the very end is not asked
    // (a candidate may be between terms then, one it gave up or shut down on
    // a fault's late poke); how long nobody leads is bounded below.
    let healed = start + CHAOS + HEALED;
    let healed_leader = intervals
        .lock()
        .unwrap()
        .iter()
        .any(|iv| iv.end.is_none_or(|end| end > healed));
    assert!(
        healed_leader,
        "seed {seed}: nobody led in the 30 s after the faults stopped"
    );
    // Never none: once every fault has healed, no gap without a leader is
    // longer than the stated bound (candidates still give leadership up
    // now and then, and campaign again), the gap before the end included.
    let (gap, at) = longest_gap(&intervals.lock().unwrap(), healed, Instant::now());
    let bound = leaderless_bound(timings);
    assert!(
        gap <= bound,
        "seed {seed}: nobody led for {gap:?} from {:?} after the faults healed (bound {bound:?}; timings {timings:?})",
        at - healed
    );
}

/// What a schedule did, for [`check`].
struct Run {
    intervals: Vec<Interval>,
    /// When someone else wrote the record free.
    foreign_free: Vec<Instant>,
    /// When the Lease was deleted.
    deleted: Vec<Instant>,
    /// Each candidate's timings.
    timings: Vec<Timings>,
    /// What it drew of the newer kinds.
    newer: Newer,
}

/// The draws of the kinds added since the first schedules, from a generator
/// of their own: a schedule that draws neither replays as before.
struct Newer {
    rng: fastrand::Rng,
    /// Candidates with timings of their own.
    mixed: bool,
    /// The newer faults, one step in three.
    faults: bool,
    /// The newer faults injected, by action.
    injected: [usize; NEWER_FAULTS as usize],
}

/// How many kinds of newer faults [`Newer::inject`] draws from.
const NEWER_FAULTS: u8 = 7;

impl Newer {
    fn draw(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x9e37_79b9_7f4a_7c15);
        let (mixed, faults) = (rng.bool(), rng.bool());
        Self {
            rng,
            mixed,
            faults,
            injected: [0; NEWER_FAULTS as usize],
        }
    }

    /// A candidate's timings.
    fn timings(&mut self) -> Timings {
        if self.mixed {
            Timings::ALL[self.rng.usize(0..Timings::ALL.len())]
        } else {
            Timings::USUAL
        }
    }

    /// A newer fault for this step of the chaos, if any: its victim and kind.
    fn fault(&mut self) -> Option<(usize, u8)> {
        (self.faults && self.rng.u8(0..3) == 0)
            .then(|| (self.rng.usize(0..CANDIDATES), self.rng.u8(0..NEWER_FAULTS)))
    }

    /// Injects newer fault `action` on the client `victim` (whose timings are
    /// `timings`).
    fn inject(&mut self, fake: &FakeLeaseApi, victim: usize, timings: Timings, action: u8) {
        self.injected[usize::from(action)] += 1;
        let rng = &mut self.rng;
        match action {
            // Requests that outlive their bound, and arrive: after the
            // renew deadline (a credential plugin slower than it; a read is
            // left to finish, a write lands late).
            0 => {
                for _ in 0..rng.usize(1..3) {
                    let verb = ["get", "create", "update"][rng.usize(0..3)];
                    let late = timings.renew_deadline + ms(rng, 2000);
                    fake.fault(victim, Some(verb), Fault::DelayRequest(late));
                }
            }
            // The victim's watches stall (no event, no error, no end).
            1 => fake.stall_watches(victim),
            // Every watch expires (410, a normal re-list), and the
            // victim's new watches lag for a while.
            2 => {
                fake.set_watch_latency(victim, ms(rng, 4000));
                fake.expire_watches();
                let (f, d) = (fake.clone(), ms(rng, 5000));
                tokio::spawn(async move {
                    sleep(d).await;
                    f.set_watch_latency(victim, Duration::ZERO);
                });
            }
            // Every watch expires, and the victim's lists and watches are
            // refused (403) for a while.
            3 => {
                fake.forbid_watch(victim);
                fake.expire_watches();
                let (f, d) = (fake.clone(), ms(rng, 6000));
                tokio::spawn(async move {
                    sleep(d).await;
                    f.allow_watch(victim);
                });
            }
            // Admission refuses a write (a quota, a policy).
            4 => {
                let verb = ["create", "update"][rng.usize(0..2)];
                fake.fault(victim, Some(verb), Fault::Admission);
            }
            // A proxy's plain-text 5xx.
            5 => {
                let code = [502, 503, 504][rng.usize(0..3)];
                fake.fault(victim, None, Fault::PlainText(code));
            }
            // Every watch expires, with no stale list: a normal re-list.
            _ => fake.expire_watches(),
        }
    }
}

/// The simulated lease duration.
const LEASE: Duration = Duration::from_secs(3);

/// Injects fault `action` on the client `victim` (whose usual latency is
/// `base_latency`, and timings `timings`).
fn inject(
    fake: &FakeLeaseApi,
    rng: &mut fastrand::Rng,
    victim: usize,
    base_latency: Duration,
    timings: Timings,
    action: u8,
    foreign_free: &mut Vec<Instant>,
) {
    match action {
        0 => fake.fault(
            victim,
            None,
            Fault::Status(*[500u16, 503, 409, 429, 403].get(rng.usize(0..5)).unwrap()),
        ),
        1 => fake.fault(victim, Some("update"), Fault::DelayResponse(ms(rng, 4000))),
        2 => fake.fault(victim, None, Fault::DelayRequest(ms(rng, 4000))),
        3 => {
            fake.partition(victim, true);
            let (f, d) = (fake.clone(), ms(rng, 6000));
            tokio::spawn(async move {
                sleep(d).await;
                f.partition(victim, false);
            });
        }
        4 => {
            fake.set_latency(victim, ms(rng, 2500));
            let (f, d) = (fake.clone(), ms(rng, 5000));
            tokio::spawn(async move {
                sleep(d).await;
                f.set_latency(victim, base_latency);
            });
        }
        5 => fake.delete(),
        // Someone else (an admin, client-go >= 0.34's release path)
        // writes the record free.
        6 => {
            foreign_free.push(Instant::now());
            if let Some(mut lease) = fake.lease() {
                if let Some(spec) = lease.spec.as_mut() {
                    spec.holder_identity = Some(String::new());
                }
                fake.put(lease);
            }
        }
        // A write applied, answered 504, retried, answered 409.
        7 => fake.fault(victim, Some("update"), Fault::AppliedThenStatus(409)),
        8 => fake.fault(victim, Some("create"), Fault::AppliedThenStatus(409)),
        // Writes applied at once but answered late: later than lease
        // duration − renew deadline, within the renew deadline's bound.
        9 => {
            for _ in 0..3 {
                let within = (timings.renew_deadline.saturating_sub(timings.margin()))
                    .saturating_sub(Duration::from_millis(100));
                let late = timings.margin() + ms(rng, within.as_millis().try_into().unwrap_or(0));
                fake.fault(victim, Some("update"), Fault::DelayResponse(late));
            }
        }
        // An answer lost after the write was applied.
        10 => fake.fault(
            victim,
            Some(if rng.bool() { "update" } else { "create" }),
            Fault::AppliedThenLost,
        ),
        // A release racing a takeover (the victim is poked to shut down):
        // its write arrives late, after a follower may have taken over.
        11 => fake.fault(
            victim,
            Some("update"),
            Fault::DelayRequest(timings.margin() + ms(rng, 4000)),
        ),
        // Every watch expires (410 Gone: etcd compacted), and the victim's
        // re-list comes from a watch cache one change behind.
        12 => {
            fake.fault(victim, Some("list"), Fault::StaleList);
            fake.expire_watches();
        }
        // 404s that are not the API server's word that the Lease is gone:
        // its `NotFound` for a path it does not serve (still starting), a
        // proxy's plain-text 404, a `Status` with another reason.
        13 => {
            for _ in 0..rng.usize(1..4) {
                let fault = *[Fault::NoSuchResource, Fault::PlainText(404), Fault::Status(404)]
                    .get(rng.usize(0..3))
                    .unwrap();
                let verb = *[None, Some("get"), Some("update"), Some("create")]
                    .get(rng.usize(0..4))
                    .unwrap();
                fake.fault(victim, verb, fault);
            }
        }
        // The end of the term marked for a preferred holder: one of the
        // candidates (it may share an identity) or one that never comes.
        14 => {
            if let Some(mut lease) = fake.lease()
                && let Some(spec) = lease.spec.as_mut()
            {
                let preferred = ["c0", "c1", "c2", "ghost"][rng.usize(0..4)];
                spec.preferred_holder = Some(preferred.to_owned());
                // The API server accepts a preferred holder only with a strategy.
                spec.strategy = Some("OldestEmulationVersion".to_owned());
                fake.put(lease);
            }
        }
        // The transitions counter at the top of its range, or edited down.
        15 => {
            if let Some(mut lease) = fake.lease()
                && let Some(spec) = lease.spec.as_mut()
            {
                spec.lease_transitions = Some(if rng.bool() { i32::MAX } else { 1 });
                fake.put(lease);
            }
        }
        _ => {}
    }
}

/// How long after the last fault healed (`HEALED` after the chaos ends:
/// partitions, latency and requests delayed in flight are over by then) a
/// Lease may be without a leader: the crate docs' bound (*Liveness*: 2 ×
/// lease duration + 2.2 × retry period) with a margin, 2 × lease duration +
/// 4 × retry period: a candidate's retry (at most 2.2
/// retry periods, as client-go's) and then a record whose end was marked
/// for a preferred holder that never comes (two lease durations), or a
/// creation hold (one), plus the reads and retries that confirm it; of the
/// slowest candidate's timings (a record is waited out for its writer's
/// lease duration).
fn leaderless_bound(timings: &[Timings]) -> Duration {
    let slowest = |t: fn(&Timings) -> Duration| timings.iter().map(t).max().unwrap_or_default();
    2 * slowest(|t| t.lease) + 4 * slowest(|t| t.retry_period)
}
/// When every fault injected during the chaos has ended: partitions (6 s),
/// latency spikes (5 s), requests delayed past the margin (5 s, 6 s for the
/// slower timings) or past the renew deadline (by 2 s at most: 6 s).
const HEALED: Duration = Duration::from_secs(6);

/// The longest time within `[from, to]` during which nobody led.
fn longest_gap(intervals: &[Interval], from: Instant, to: Instant) -> (Duration, Instant) {
    let mut terms: Vec<(Instant, Instant)> = intervals
        .iter()
        .map(|iv| (iv.start, iv.end.unwrap_or(to)))
        .filter(|(_, end)| *end > from)
        .collect();
    terms.sort();
    let (mut covered, mut longest, mut at) = (from, Duration::ZERO, from);
    for (start, end) in terms {
        if start > covered && start - covered > longest {
            (longest, at) = (start - covered, covered);
        }
        covered = covered.max(end);
    }
    if to > covered && to - covered > longest {
        (longest, at) = (to - covered, covered);
    }
    (longest, at)
}

/// Asserts that no two candidates led at once; the number of overlaps
/// excused as the documented re-creation of a deleted Lease (see below).
fn check(seed: u64, run: &Run) -> usize {
    let mut recreations = 0;
    let intervals = &run.intervals;
    for (k, a) in intervals.iter().enumerate() {
        // A candidate's own next term may begin within its last one's tail:
        // one process, whose fencing token tells its terms apart.
        for b in intervals[k + 1..].iter().filter(|b| b.who != a.who) {
            let (a_end, b_end) = (a.end.unwrap(), b.end.unwrap());
            let disjoint = a_end <= b.start || b_end <= a.start;
            // A free record written by someone else (an admin) while `a`
            // led: a follower takes it within one event and one write, and
            // the leader ends its term on that event only if its watch had
            // delivered its own last write and it was not waiting on a
            // request of its own (a renewal in flight answers 409 first): an
            // overlap right after such a write is the writer's doing, and the
            // unit suite pins down the caught-up case
            // (`regressions::a_free_record_written_by_someone_else_ends_the_term_on_the_event`).
            let (first, second) = if a.start <= b.start { (a, b) } else { (b, a) };
            // (`first` may hold a guard of a term begun before the write.)
            let lease = run.timings.iter().map(|t| t.lease).max().unwrap_or(LEASE);
            let freed = run
                .foreign_free
                .iter()
                .any(|&w| first.start < w + lease && w <= second.start && second.start < w + lease);
            // The Lease deleted while `old` held it (or had a write of its
            // takeover applied, answered later), and created again by `new`,
            // whose creation hold (its own lease duration: it never saw
            // `old`'s record) is shorter than `old`'s renew deadline:
            // documented, not changed (regressions section 55; the README's
            // *Changing the election's settings in a rolling update*).
            let recreated = |old: &Interval, new: &Interval| {
                let (o, n) = (run.timings[old.who], run.timings[new.who]);
                let within = |w: Instant, t: Instant| w <= t && t < w + o.renew_deadline;
                n.lease < o.renew_deadline
                    && run
                        .deleted
                        .iter()
                        .any(|&w| old.start < w + o.renew_deadline && within(w, new.start))
            };
            let recreation = !disjoint && !freed && (recreated(a, b) || recreated(b, a));
            recreations += usize::from(recreation);
            assert!(
                disjoint || freed || recreation,
                "seed {seed}: c{} and c{} both led: {a:?} {b:?}",
                a.who,
                b.who
            );
        }
    }
    recreations
}

thread_local! {
    /// Whether this thread runs schedules ([`seed_this_thread`]).
    static SEEDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Seeds this thread's random draws for a schedule: fastrand's thread-local
/// generator (which kube-runtime's watcher backoff forks, through backon) and
/// the election's own jitter ([`seeded_bits`]), so that a seed replays every
/// one of them.
pub(crate) fn seed_this_thread(seed: u64) {
    fastrand::seed(seed);
    SEEDED.set(true);
}

/// The election's random bits (`config::random_u64`: its retry jitter) on a
/// thread that runs schedules: from the seeded generator. `None` elsewhere:
/// std's randomly keyed hasher, as in production.
pub(crate) fn seeded_bits() -> Option<u64> {
    SEEDED.get().then(|| fastrand::u64(..))
}

/// The schedules to run: the one of `KRL_SIM_SEED` when set (replayed with
/// debug logs stamped in virtual time), else seeds `0..n`, `n` from the
/// variable `count_var` or `default`.
pub(crate) fn seeds(count_var: &str, default: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("KRL_SIM_SEED").ok().and_then(|v| v.parse().ok()) {
        trace_in_virtual_time();
        return vec![seed];
    }
    let count = std::env::var(count_var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    (0..count).collect()
}

/// Runs `schedule(seed)` for every seed, on every core, each on its own
/// single-threaded runtime with paused time (deterministic per seed: the
/// schedules are independent); their results, in no particular order. A
/// schedule that panics does not stop the others: once all have run, this
/// panics naming every seed that failed (each one's message printed above).
pub(crate) fn on_every_core<T: Send, F: Future<Output = T>>(
    seeds: &[u64],
    schedule: impl Fn(u64) -> F + Sync,
) -> Vec<T> {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let chunk = seeds.len().div_ceil(threads).max(1);
    let schedule = &schedule;
    std::thread::scope(|scope| {
        let workers: Vec<_> = seeds
            .chunks(chunk)
            .map(|seeds| {
                scope.spawn(move || {
                    seeds
                        .iter()
                        .map(|&seed| {
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                tokio::runtime::Builder::new_current_thread()
                                    .enable_time()
                                    .start_paused(true)
                                    .build()
                                    .unwrap()
                                    .block_on(schedule(seed))
                            }))
                            .map_err(|_| seed)
                        })
                        .collect::<Vec<Result<T, u64>>>()
                })
            })
            .collect();
        let (mut done, mut failed) = (Vec::new(), Vec::new());
        for result in workers.into_iter().flat_map(|w| w.join().unwrap()) {
            match result {
                Ok(t) => done.push(t),
                Err(seed) => failed.push(seed),
            }
        }
        failed.sort_unstable();
        assert!(failed.is_empty(), "schedules failed: seeds {failed:?}");
        done
    })
}

/// Logs at debug level, stamped with virtual time: for replaying one seed.
fn trace_in_virtual_time() {
    fn virtual_time(w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        let now = tokio::runtime::Handle::try_current().map(|_| Instant::now().into_std());
        write!(w, "{now:?}")
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter("kube_runtime_lease=debug")
        .with_timer(virtual_time as fn(&mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result)
        .with_test_writer()
        .try_init();
}

#[test]
fn no_two_candidates_ever_lead_at_the_same_instant() {
    let seeds = seeds("KRL_SIM_SCHEDULES", 1000);
    let runs = on_every_core(&seeds, |seed| async move {
        let run = schedule(seed).await;
        let recreations = check(seed, &run);
        let handovers = run.intervals.windows(2).filter(|w| w[0].who != w[1].who).count();
        (run.intervals.len(), handovers, run.newer, recreations)
    });
    let terms: usize = runs.iter().map(|r| r.0).sum();
    let handovers: usize = runs.iter().map(|r| r.1).sum();
    let mixed = runs.iter().filter(|r| r.2.mixed).count();
    let newer = runs.iter().filter(|r| r.2.faults).count();
    let injected = runs.iter().fold([0; NEWER_FAULTS as usize], |mut sum, r| {
        for (s, n) in sum.iter_mut().zip(r.2.injected) {
            *s += n;
        }
        sum
    });
    let recreations: Vec<_> = runs.iter().map(|r| r.3).filter(|&n| n > 0).collect();
    eprintln!(
        "{} schedules: {mixed} with timings of their own, {newer} with the newer faults \
         (injected, by kind: {injected:?}); {} overlaps excused as a deleted Lease created \
         again with a shorter creation hold, in {} schedules",
        seeds.len(),
        recreations.iter().sum::<usize>(),
        recreations.len()
    );
    // The schedules exercise what they claim to: many terms and changes of
    // leader, and the newer kinds.
    assert!(terms >= 2 * seeds.len().min(1000), "{terms} terms");
    assert!(handovers > 0);
    if seeds.len() >= 100 {
        assert!(mixed > 0 && newer > 0, "{mixed} mixed, {newer} with newer faults");
        assert!(
            injected.iter().all(|&n| n > 0),
            "newer faults injected: {injected:?}"
        );
    }
}

#[test]
fn a_seed_replays_its_schedule() {
    // One seed, twice, each run on its own runtime (and thread, with two
    // cores): the same terms at the same virtual instants after its start.
    // Every random draw is the seed's, the election's jitter and the
    // watcher's backoff included, so that `KRL_SIM_SEED` replays a failure.
    let runs = on_every_core(&[7, 7], |seed| async move {
        let start = Instant::now();
        let run = schedule(seed).await;
        let since = |t: Instant| t - start;
        let term = |iv: &Interval| (iv.who, since(iv.start), iv.end.map(since));
        run.intervals.iter().map(term).collect::<Vec<_>>()
    });
    assert!(runs[0].len() >= 2, "{} terms", runs[0].len());
    assert_eq!(runs[0], runs[1], "the seed's two runs differ");
}
