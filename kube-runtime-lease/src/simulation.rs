//! A deterministic simulation: several candidates on one Lease, thousands of
//! random schedules of delays, failures, partitions, latency spikes, deletions
//! and voluntary releases, on paused time. Asserts that no two candidates ever
//! lead at the same virtual instant, that someone leads once faults stop, that
//! a guard is valid when handed out, and that no term ends as
//! [`Lost::Released`] (which only a shutdown may cause).
//!
//! `KRL_SIM_SCHEDULES` sets the number of schedules (default 1000);
//! `KRL_SIM_SEED` replays one schedule.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::{Instant, sleep};

use crate::{
    LeaderElector, LeaseConfig, LeaseGuard, Lost,
    fake::{FakeApi, Fault},
};

const CANDIDATES: usize = 3;
const CHAOS: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
struct Interval {
    who: usize,
    start: Instant,
    end: Option<Instant>,
}

fn config(i: usize, watch: bool) -> LeaseConfig {
    LeaseConfig::new("default", "lease", format!("c{i}"))
        .lease_duration(Duration::from_secs(3))
        .renew_deadline(Duration::from_secs(2))
        .retry_period(Duration::from_millis(800))
        .release_timeout(Duration::from_secs(1))
        .watch(watch)
}

/// Resolves once `guard`'s renew deadline has passed (or its term ended).
async fn past_deadline(guard: &LeaseGuard) {
    while !guard.time_left().is_zero() {
        sleep(guard.time_left()).await;
    }
}

fn ms(rng: &mut fastrand::Rng, max: u64) -> Duration {
    Duration::from_millis(rng.u64(0..=max))
}

/// One candidate: leads whenever it can, until aborted; records its terms.
async fn candidate(
    seed: u64,
    i: usize,
    elector: LeaderElector,
    intervals: Arc<Mutex<Vec<Interval>>>,
    mut crng: fastrand::Rng,
) {
    loop {
        let Ok(guard) = elector.acquire().await else {
            return;
        };
        assert!(
            guard.is_valid(),
            "seed {seed}: c{i} was handed a guard of an ended term"
        );
        let at = intervals.lock().unwrap().len();
        tracing::info!(candidate = i, "SIM leads");
        intervals.lock().unwrap().push(Interval {
            who: i,
            start: Instant::now(),
            end: None,
        });
        // Sometimes give leadership up voluntarily after a while.
        let hold = if crng.u8(0..4) == 0 {
            ms(&mut crng, 5000)
        } else {
            Duration::from_secs(3600)
        };
        tokio::select! {
            () = guard.lost_signal() => assert_ne!(
                guard.lost(),
                Some(Lost::Released),
                "seed {seed}: c{i}'s term ended as Released without a shutdown"
            ),
            // Noticing the renew deadline before the elector task
            // does, as `WithLeaderElection` may.
            () = past_deadline(&guard) => {}
            () = sleep(hold) => {}
        }
        intervals.lock().unwrap()[at].end = Some(Instant::now());
        tracing::info!(candidate = i, "SIM stops leading");
        drop(guard);
        // Often campaign again at once, as a guarded stream in a loop does.
        if crng.bool() {
            sleep(ms(&mut crng, 1500)).await;
        }
    }
}

async fn schedule(seed: u64) -> Vec<Interval> {
    let mut rng = fastrand::Rng::with_seed(seed);
    // The library's own jitter draws from the thread-local generator: seed it too.
    fastrand::seed(seed);
    let fake = FakeApi::default();
    let intervals = Arc::new(Mutex::new(Vec::<Interval>::new()));
    let mut ids = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..CANDIDATES {
        let (client, id) = fake.client();
        ids.push(id);
        let elector = LeaderElector::new(client, config(i, rng.bool())).unwrap();
        let intervals = intervals.clone();
        let crng = fastrand::Rng::with_seed(seed.wrapping_mul(31).wrapping_add(i as u64));
        tasks.push(tokio::spawn(candidate(seed, i, elector, intervals, crng)));
    }
    let start = Instant::now();
    while start.elapsed() < CHAOS {
        sleep(ms(&mut rng, 1500)).await;
        let victim = ids[rng.usize(0..CANDIDATES)];
        let action = rng.u8(0..10);
        tracing::info!(victim, action, "SIM fault");
        match action {
            0 => fake.fault(
                victim,
                None,
                Fault::Status(*[500u16, 503, 409, 429, 403].get(rng.usize(0..5)).unwrap()),
            ),
            1 => fake.fault(victim, Some("update"), Fault::DelayResponse(ms(&mut rng, 4000))),
            2 => fake.fault(victim, None, Fault::DelayRequest(ms(&mut rng, 4000))),
            3 => {
                fake.partition(victim, true);
                let (f, d) = (fake.clone(), ms(&mut rng, 6000));
                tokio::spawn(async move {
                    sleep(d).await;
                    f.partition(victim, false);
                });
            }
            4 => {
                fake.set_latency(victim, ms(&mut rng, 2500));
                let (f, d) = (fake.clone(), ms(&mut rng, 5000));
                tokio::spawn(async move {
                    sleep(d).await;
                    f.set_latency(victim, Duration::ZERO);
                });
            }
            5 => fake.delete(),
            _ => {}
        }
    }
    // Heal; partitions and latency end within 6 s, queued faults are few.
    sleep(Duration::from_secs(30)).await;
    let healed_leader = intervals.lock().unwrap().iter().any(|iv| iv.end.is_none());
    assert!(
        healed_leader,
        "seed {seed}: nobody leads 30 s after faults stopped"
    );
    for t in tasks {
        t.abort();
    }
    let now = Instant::now();
    intervals
        .lock()
        .unwrap()
        .iter()
        .map(|iv| Interval {
            end: Some(iv.end.unwrap_or(now)),
            ..*iv
        })
        .collect()
}

fn check(seed: u64, intervals: &[Interval]) {
    for (k, a) in intervals.iter().enumerate() {
        for b in &intervals[k + 1..] {
            let (a_end, b_end) = (a.end.unwrap(), b.end.unwrap());
            let disjoint = a_end <= b.start || b_end <= a.start;
            assert!(
                disjoint,
                "seed {seed}: c{} and c{} both led: {a:?} {b:?}",
                a.who, b.who
            );
        }
    }
}

#[test]
fn no_two_candidates_ever_lead_at_the_same_instant() {
    let schedules: u64 = std::env::var("KRL_SIM_SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let seeds: Vec<u64> = match std::env::var("KRL_SIM_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(seed) => {
            fn virtual_time(w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
                let now = tokio::runtime::Handle::try_current().map(|_| Instant::now().into_std());
                write!(w, "{now:?}")
            }
            let _ = tracing_subscriber::fmt()
                .with_env_filter("kube_runtime_lease=debug")
                .with_timer(
                    virtual_time as fn(&mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result,
                )
                .with_test_writer()
                .try_init();
            vec![seed]
        }
        None => (0..schedules).collect(),
    };
    // Schedules are independent: run them on every core, each on its own
    // single-threaded runtime with paused time (deterministic per seed).
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let chunk = seeds.len().div_ceil(threads).max(1);
    let (terms, handovers) = std::thread::scope(|scope| {
        let workers: Vec<_> = seeds
            .chunks(chunk)
            .map(|seeds| {
                scope.spawn(move || {
                    let (mut terms, mut handovers) = (0, 0);
                    for &seed in seeds {
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .enable_time()
                            .start_paused(true)
                            .build()
                            .unwrap();
                        let intervals = rt.block_on(schedule(seed));
                        check(seed, &intervals);
                        terms += intervals.len();
                        handovers += intervals.windows(2).filter(|w| w[0].who != w[1].who).count();
                    }
                    (terms, handovers)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    // The schedules exercise what they claim to: many terms and changes of leader.
    assert!(
        terms >= 2 * usize::try_from(schedules.min(1000)).unwrap_or(0),
        "{terms} terms"
    );
    assert!(handovers > 0);
}
