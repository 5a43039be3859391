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
//! longer than the crate docs' bound with a margin ([`LEADERLESS_BOUND`]; the faults
//! include 404s that are not deletions, a `preferredHolder` that may never
//! come, and `leaseTransitions` at the top of its range or edited down); that
//! a guard is valid when handed out; and that no term ends as
//! [`Lost::Shutdown`] without a shutdown.
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
/// than lease duration − renew deadline (1 s here), the margin the protocol
/// leaves for it.
const TAIL: Duration = Duration::from_millis(300);

#[derive(Clone, Copy, Debug)]
struct Interval {
    who: usize,
    start: Instant,
    end: Option<Instant>,
}

fn config(identity: &str, watch: bool, release_timeout: Duration) -> LeaseConfig {
    LeaseConfig::new("default", "lease", identity)
        .lease_duration(LEASE)
        .renew_deadline(RENEW_DEADLINE)
        .retry_period(Duration::from_millis(800))
        .release_timeout(release_timeout)
        .watch(watch)
}

const RENEW_DEADLINE: Duration = Duration::from_secs(2);
/// Lease duration − renew deadline: the margin for stopping guarded work.
const MARGIN: Duration = Duration::from_secs(1);

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
            config(&self.identity, self.watch, self.release_timeout),
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
        inject(&fake, &mut rng, victim, latency[k], action, &mut foreign_free);
        if action == 11 {
            // The victim's next write (its release, if it leads) lands only
            // after another candidate may have taken over.
            pokes[k].notify_one();
        }
    }
    // Heal: faults still queued are dropped (a queued late answer or late
    // request would otherwise disrupt each new term); partitions and latency
    // end within 6 s.
    fake.clear_faults();
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
    assert!(
        gap <= LEADERLESS_BOUND,
        "seed {seed}: nobody led for {gap:?} from {:?} after the faults healed (bound {LEADERLESS_BOUND:?})",
        at - healed
    );
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
    }
}

/// What a schedule did, for [`check`].
struct Run {
    intervals: Vec<Interval>,
    /// When someone else wrote the record free.
    foreign_free: Vec<Instant>,
}

/// The simulated lease duration.
const LEASE: Duration = Duration::from_secs(3);

/// Injects fault `action` on the client `victim` (whose usual latency is
/// `base_latency`).
fn inject(
    fake: &FakeLeaseApi,
    rng: &mut fastrand::Rng,
    victim: usize,
    base_latency: Duration,
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
                let late = MARGIN + ms(rng, 900);
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
            Fault::DelayRequest(MARGIN + ms(rng, 4000)),
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
/// creation hold (one), plus the reads and retries that confirm it.
const LEADERLESS_BOUND: Duration = Duration::from_millis(2 * 3000 + 4 * 800);
/// When every fault injected during the chaos has ended: partitions (6 s),
/// latency spikes (5 s) and requests delayed past the margin (5 s).
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

fn check(seed: u64, run: &Run) {
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
            let excused = run
                .foreign_free
                .iter()
                .any(|&w| first.start < w + LEASE && w <= second.start && second.start < w + LEASE);
            assert!(
                disjoint || excused,
                "seed {seed}: c{} and c{} both led: {a:?} {b:?}",
                a.who,
                b.who
            );
        }
    }
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
/// schedules are independent); their results, in no particular order.
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
                            tokio::runtime::Builder::new_current_thread()
                                .enable_time()
                                .start_paused(true)
                                .build()
                                .unwrap()
                                .block_on(schedule(seed))
                        })
                        .collect::<Vec<T>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
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
    let (terms, handovers) = on_every_core(&seeds, |seed| async move {
        let run = schedule(seed).await;
        check(seed, &run);
        let intervals = run.intervals;
        let handovers = intervals.windows(2).filter(|w| w[0].who != w[1].who).count();
        (intervals.len(), handovers)
    })
    .into_iter()
    .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    // The schedules exercise what they claim to: many terms and changes of leader.
    assert!(terms >= 2 * seeds.len().min(1000), "{terms} terms");
    assert!(handovers > 0);
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
