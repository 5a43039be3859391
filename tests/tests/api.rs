//! The election against a real kube-apiserver and etcd.
//!
//! One control plane is shared by every test of this file (a `OnceCell` in a
//! static; its processes exit with the test process); each test works in a
//! namespace of its own, with its own clients (a kube `Client` is bound to the
//! runtime that created it, and each `#[tokio::test]` has its own runtime).
//!
//! Timings are short: 2 s lease duration, 1.5 s renew deadline, 0.5 s retry
//! period. Tests wait for what they can observe (a guard, a status, a watch
//! event) with bounds, never for a fixed time, except to measure a rate.
#![allow(
    clippy::too_many_lines,
    reason = "each test follows one scenario from start to end"
)]

mod support;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use futures::{StreamExt, future::select_all};
use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::ConfigMap,
        rbac::v1::{PolicyRule, Role},
    },
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, PostParams},
    runtime::{Controller, controller::Action, watcher},
};
use kube_runtime_lease::{
    LeaderElectionControllerExt, LeaderElectionStreamExt, LeaderElector, LeaderStatus, LeaseConfig,
    LeaseGuard, Lost,
};
use kube_runtime_lease_harness::{
    LeaseEvent, TestEnv, Timings, create_lease, free_spec, shared_env, watch_lease_events,
};
use support::LogBuf;
use tokio::{
    sync::watch,
    task::JoinHandle,
    time::{Instant, timeout},
};

const LEASE_DURATION: Duration = Timings::FAST.lease_duration;
const RENEW_DEADLINE: Duration = Timings::FAST.renew_deadline;
const RETRY_PERIOD: Duration = Timings::FAST.retry_period;
const LEASE: &str = "lease";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---------------------------------------------------------------------------
// Fixture
// ---------------------------------------------------------------------------

/// One test's namespace and admin client.
struct Fx {
    env: &'static TestEnv,
    ns: String,
    admin: Client,
    leases: Api<Lease>,
}

async fn fixture(prefix: &str) -> Result<Fx> {
    let env = shared_env().await?;
    let ns = env.new_namespace(prefix).await?;
    let admin = env.client().await?;
    let leases = Api::namespaced(admin.clone(), &ns);
    Ok(Fx {
        env,
        ns,
        admin,
        leases,
    })
}

impl Fx {
    fn config(&self, identity: &str) -> LeaseConfig {
        support::fast_config(&self.ns, identity).release_timeout(Duration::from_secs(2))
    }

    /// A candidate with a client of its own, as if in a process of its own.
    async fn candidate(&self, config: LeaseConfig) -> Result<LeaderElector> {
        let client = self.env.client().await?;
        Ok(LeaderElector::new(client, config)?)
    }

    /// Creates the Lease free (released): holder `""`, 1 s, no transitions yet.
    async fn free_lease(&self, edit: impl FnOnce(&mut LeaseSpec)) -> Result<Lease> {
        let mut spec = free_spec();
        edit(&mut spec);
        self.create_lease(spec).await
    }

    async fn create_lease(&self, spec: LeaseSpec) -> Result<Lease> {
        create_lease(&self.leases, LEASE, spec).await
    }

    async fn spec(&self) -> Result<LeaseSpec> {
        self.leases.get(LEASE).await?.spec.context("lease without spec")
    }

    /// Read-modify-write of the Lease as admin, retried on conflicts with the
    /// elector's own writes.
    async fn modify(&self, edit: impl Fn(&mut LeaseSpec)) -> Result<Lease> {
        for _ in 0..50 {
            let mut lease = self.leases.get(LEASE).await?;
            edit(lease.spec.get_or_insert_with(LeaseSpec::default));
            match self.leases.replace(LEASE, &PostParams::default(), &lease).await {
                Ok(lease) => return Ok(lease),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        bail!("50 conflicts in a row modifying the lease")
    }

    /// Starts recording every version of the Lease (as seen by the admin).
    async fn recorder(&self) -> Result<Recorder> {
        Recorder::start(self.leases.clone()).await
    }
}

// ---------------------------------------------------------------------------
// Observation helpers
// ---------------------------------------------------------------------------

/// One version of the Lease seen by the admin's watch.
#[derive(Clone, Debug)]
struct Seen {
    /// Its position in the history.
    n: usize,
    /// When the test process received it.
    at: Instant,
    rv: String,
    /// `None` for a deletion.
    spec: Option<LeaseSpec>,
}

impl Seen {
    fn holder(&self) -> Option<&str> {
        self.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
    }

    fn spec(&self) -> &LeaseSpec {
        self.spec.as_ref().expect("not a deletion")
    }
}

/// Records every version of the Lease, in order, without duplicates.
struct Recorder {
    seen: watch::Receiver<Vec<Seen>>,
    task: JoinHandle<()>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Recorder {
    /// Returns once the watch has listed the current state.
    async fn start(api: Api<Lease>) -> Result<Self> {
        let (tx, seen) = watch::channel(Vec::<Seen>::new());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let mut ready = Some(ready_tx);
        let task = watch_lease_events(api, LEASE, move |_, event| {
            let at = Instant::now();
            let (lease, deleted) = match event {
                LeaseEvent::Applied(l) => (l, false),
                LeaseEvent::Deleted(l) => (l, true),
                LeaseEvent::Listed => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(());
                    }
                    return;
                }
            };
            let rv = lease.metadata.resource_version.clone().unwrap_or_default();
            tx.send_modify(|v| {
                let dup = v
                    .last()
                    .is_some_and(|last| last.rv == rv && last.spec.is_none() == deleted);
                if !dup {
                    v.push(Seen {
                        n: v.len(),
                        at,
                        rv,
                        spec: if deleted { None } else { lease.spec },
                    });
                }
            });
        });
        timeout(Duration::from_secs(10), ready_rx)
            .await
            .context("lease watch not synced within 10 s")??;
        Ok(Self { seen, task })
    }

    fn all(&self) -> Vec<Seen> {
        self.seen.borrow().clone()
    }

    /// Asserts that no version after the `n`th is free: the leader let the
    /// Lease expire instead of releasing it.
    fn assert_never_written_free_after(&self, n: usize) {
        let all = self.all();
        assert!(
            all.iter().all(|v| v.n <= n || v.holder() != Some("")),
            "never written free: {all:#?}"
        );
    }

    /// The first version (in the whole history) that matches.
    async fn first(&self, within: Duration, pred: impl Fn(&Seen) -> bool) -> Result<Seen> {
        let mut rx = self.seen.clone();
        let found = timeout(within, rx.wait_for(|v| v.iter().any(&pred)))
            .await
            .with_context(|| {
                format!(
                    "no matching lease version within {within:?}; seen: {:#?}",
                    self.all()
                )
            })??;
        Ok(found.iter().find(|s| pred(s)).cloned().expect("matched"))
    }
}

/// Waits until the candidate's status matches.
async fn status_where(
    elector: &LeaderElector,
    within: Duration,
    pred: impl Fn(&LeaderStatus) -> bool,
) -> Result<LeaderStatus> {
    let mut rx = elector.subscribe();
    let status = timeout(within, rx.wait_for(|s| pred(s)))
        .await
        .with_context(|| format!("status not reached within {within:?}; now {:?}", elector.status()))??
        .clone();
    Ok(status)
}

/// Acquires with a bound; returns the guard and the instant it was received.
async fn acquire_within(elector: &LeaderElector, within: Duration) -> Result<(LeaseGuard, Instant)> {
    let guard = timeout(within, elector.acquire()).await.with_context(|| {
        format!(
            "{} did not lead within {within:?}; status {:?}",
            elector.config().identity(),
            elector.status()
        )
    })??;
    Ok((guard, Instant::now()))
}

/// Acquires in a task of its own: the instant the guard arrived, and the guard.
fn spawn_acquire(
    elector: &LeaderElector,
) -> JoinHandle<(Instant, Result<LeaseGuard, kube_runtime_lease::AcquireError>)> {
    let elector = elector.clone();
    tokio::spawn(async move {
        let guard = elector.acquire().await;
        (Instant::now(), guard)
    })
}

fn micros(t: Option<&MicroTime>) -> i64 {
    t.expect("timestamp set").0.as_microsecond()
}

fn micros_or_zero(t: Option<&MicroTime>) -> i64 {
    t.map_or(0, |t| t.0.as_microsecond())
}

fn wall_micros() -> i64 {
    Timestamp::now().as_microsecond()
}

/// Sets a flag when dropped: proves that a closure or a stream is gone.
struct DropFlag(Arc<AtomicBool>);

impl DropFlag {
    fn alive(&self) -> bool {
        !self.0.load(Ordering::SeqCst)
    }
}

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------
// 1. Acquire and renew
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_a_free_lease_at_once_and_writes_the_record() -> Result<()> {
    let fx = fixture("acquire-free").await?;
    let created = fx.free_lease(|_| {}).await?;
    let a = fx.candidate(fx.config("a")).await?;
    assert_eq!(a.status(), LeaderStatus::default());

    let before = wall_micros();
    let start = Instant::now();
    let (guard, _) = acquire_within(&a, Duration::from_secs(5)).await?;
    let took = start.elapsed();
    let after = wall_micros();
    assert!(took < ms(1000), "a free lease is taken at once, took {took:?}");

    let lease = fx.leases.get(LEASE).await?;
    assert_eq!(lease.metadata.uid, created.metadata.uid, "same object");
    let s = lease.spec.context("spec")?;
    assert_eq!(s.holder_identity.as_deref(), Some("a"));
    assert_eq!(s.lease_duration_seconds, Some(2), "our duration, in seconds");
    assert_eq!(s.lease_transitions, Some(1), "free -> a is a transition");
    let acquired = micros(s.acquire_time.as_ref());
    assert!(
        (before..=after).contains(&acquired),
        "acquireTime {acquired} written during the acquisition [{before}, {after}]"
    );
    assert!(micros(s.renew_time.as_ref()) >= acquired);
    assert_eq!(guard.fencing_token(), 1);
    assert!(guard.is_valid());
    assert!(guard.time_left() <= RENEW_DEADLINE && guard.time_left() > ms(500));
    // The status follows the guard (not necessarily before it arrives).
    let st = status_where(&a, ms(500), |s| s.is_leader).await?;
    assert_eq!(st.holder.as_deref(), Some("a"));
    assert_eq!(st.transitions, Some(1));
    assert!(a.health_check(Duration::ZERO).is_ok());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_a_missing_lease_and_leads_one_lease_duration_later() -> Result<()> {
    let fx = fixture("acquire-create").await?;
    let rec = fx.recorder().await?;
    let a = fx.candidate(fx.config("a")).await?;
    let start = Instant::now();
    let before = wall_micros();
    let acquiring = spawn_acquire(&a);

    // The Lease appears at once, held by `a`, but `a` does not lead yet.
    let created = rec.first(Duration::from_secs(5), |s| s.spec.is_some()).await?;
    assert!(
        created.at - start < ms(1000),
        "created after {:?}",
        created.at - start
    );
    let s = created.spec();
    assert_eq!(s.holder_identity.as_deref(), Some("a"));
    assert_eq!(s.lease_duration_seconds, Some(2));
    assert_eq!(s.lease_transitions, Some(0), "a new Lease starts at 0");
    assert_eq!(s.acquire_time, s.renew_time);
    assert!(micros(s.acquire_time.as_ref()) >= before);
    assert!(!a.is_leader(), "held, not led, right after creating");

    let (at, guard) = timeout(Duration::from_secs(6), acquiring).await??;
    let guard = guard?;
    let waited = at - start;
    assert!(
        waited >= LEASE_DURATION,
        "led after {waited:?}, before one lease duration"
    );
    assert!(waited < LEASE_DURATION + ms(1500), "led only after {waited:?}");
    assert!(at - created.at >= ms(1900));
    assert_eq!(guard.fencing_token(), 0);
    status_where(&a, ms(500), |s| s.is_leader).await?;

    // It renewed the Lease while holding it, keeping acquireTime and transitions.
    let s = fx.spec().await?;
    assert_eq!(s.holder_identity.as_deref(), Some("a"));
    assert_eq!(s.lease_transitions, Some(0));
    assert_eq!(s.acquire_time, created.spec().acquire_time);
    assert!(micros(s.renew_time.as_ref()) - micros(s.acquire_time.as_ref()) >= 1_000_000);
    let renewals_while_held = rec
        .all()
        .iter()
        .filter(|v| v.at <= at && v.holder() == Some("a"))
        .count();
    assert!(
        (3..=6).contains(&renewals_while_held),
        "{renewals_while_held} versions while held (create + renewals every 0.5 s)"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_renews_once_per_retry_period() -> Result<()> {
    let fx = fixture("renew").await?;
    fx.free_lease(|_| {}).await?;
    let rec = fx.recorder().await?;
    let a = fx.candidate(fx.config("a")).await?;
    let (guard, _) = acquire_within(&a, Duration::from_secs(5)).await?;
    let first = fx.leases.get(LEASE).await?;
    let first_spec = first.spec.clone().context("spec")?;
    let first_rv = first.metadata.resource_version.clone().context("rv")?;

    // A rate: observe a fixed window.
    let window = Duration::from_secs(3);
    tokio::time::sleep(window).await;
    let first_renew = micros(first_spec.renew_time.as_ref());
    let versions: Vec<Seen> = rec
        .all()
        .into_iter()
        .filter(|v| v.rv != first_rv && micros_or_zero(v.spec().renew_time.as_ref()) > first_renew)
        .collect();
    let n = versions.len();
    assert!(
        (4..=8).contains(&n),
        "{n} renewals in {window:?} at a 500 ms retry period: {versions:#?}"
    );
    let mut last_renew = first_renew;
    let mut gaps = Vec::new();
    for v in &versions {
        let s = v.spec();
        assert_eq!(s.holder_identity.as_deref(), Some("a"));
        assert_eq!(s.acquire_time, first_spec.acquire_time, "acquireTime kept");
        assert_eq!(
            s.lease_transitions, first_spec.lease_transitions,
            "transitions kept"
        );
        assert_eq!(s.lease_duration_seconds, Some(2));
        let renew = micros(s.renew_time.as_ref());
        assert!(renew > last_renew, "renewTime advances");
        gaps.push(renew - last_renew);
        last_renew = renew;
    }
    let rvs: std::collections::HashSet<_> = versions.iter().map(|v| &v.rv).collect();
    assert_eq!(rvs.len(), n, "one new resourceVersion per renewal");
    let mean = gaps.iter().sum::<i64>() / i64::try_from(gaps.len())?;
    assert!(
        (400_000..=650_000).contains(&mean),
        "mean renewal interval {mean} us, gaps {gaps:?}"
    );
    assert!(
        gaps.iter().all(|g| (150_000..=1_000_000).contains(g)),
        "renewal gaps {gaps:?} us"
    );
    assert!(guard.is_valid() && guard.lost().is_none());
    assert!(a.health_check(Duration::ZERO).is_ok());
    Ok(())
}

// ---------------------------------------------------------------------------
// 2. Takeover after expiry
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_after_expiry_waits_one_lease_duration_from_the_last_renewal() -> Result<()> {
    let fx = fixture("takeover").await?;
    fx.free_lease(|_| {}).await?;
    let rec = fx.recorder().await?;
    let a = fx.candidate(fx.config("a").release_on_drop(false)).await?;
    let (guard_a, _) = acquire_within(&a, Duration::from_secs(5)).await?;
    let acquired = rec
        .first(Duration::from_secs(2), |v| v.holder() == Some("a"))
        .await?;
    let b = fx.candidate(fx.config("b")).await?;
    let b_acquiring = spawn_acquire(&b);
    status_where(&b, Duration::from_secs(5), |s| s.holder.as_deref() == Some("a")).await?;
    // Let `a` renew a couple of times while `b` watches.
    rec.first(Duration::from_secs(5), |v| {
        v.holder() == Some("a") && v.spec().renew_time != v.spec().acquire_time
    })
    .await?;

    // `a` stops renewing without releasing: its process "dies".
    drop(guard_a);
    drop(a);
    let dropped = Instant::now();

    let (b_at, guard_b) = timeout(Duration::from_secs(6), b_acquiring).await??;
    let guard_b = guard_b?;
    let first_b = rec
        .first(Duration::from_secs(2), |v| v.holder() == Some("b"))
        .await?;
    let all = rec.all();
    let last_a = all[..first_b.n]
        .iter()
        .rfind(|v| v.holder() == Some("a"))
        .context("no record of a")?;
    assert!(
        !all.iter()
            .any(|v| v.n > acquired.n && v.holder() != Some("a") && v.n < first_b.n),
        "a must not release: {all:#?}"
    );
    // Wall clocks of one machine: the record's own times.
    let gap = micros(first_b.spec().acquire_time.as_ref()) - micros(last_a.spec().renew_time.as_ref());
    assert!(
        gap >= 2_000_000,
        "b took over {gap} us after a's last renewal, before the lease duration"
    );
    assert!(
        gap <= 2_700_000,
        "b took over only {gap} us after a's last renewal"
    );
    // Monotonic: from when the admin saw a's last write.
    assert!(b_at >= last_a.at + LEASE_DURATION - ms(100));
    assert!(b_at - dropped <= LEASE_DURATION + ms(800));
    assert_eq!(
        first_b.spec().lease_transitions,
        last_a.spec().lease_transitions.map(|t| t + 1)
    );
    assert_eq!(guard_b.fencing_token(), 2);
    assert_eq!(b.status().holder.as_deref(), Some("b"));
    Ok(())
}

// ---------------------------------------------------------------------------
// 3. Release and immediate takeover
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_is_taken_over_at_once() -> Result<()> {
    let fx = fixture("release").await?;
    fx.free_lease(|_| {}).await?;
    let rec = fx.recorder().await?;
    let a = fx.candidate(fx.config("a")).await?;
    let (guard_a, _) = acquire_within(&a, Duration::from_secs(5)).await?;
    let acquired = rec
        .first(Duration::from_secs(2), |v| v.holder() == Some("a"))
        .await?;
    let b = fx.candidate(fx.config("b")).await?;
    let b_acquiring = spawn_acquire(&b);
    status_where(&b, Duration::from_secs(5), |s| s.holder.as_deref() == Some("a")).await?;
    let held = fx.spec().await?;

    let dropped = Instant::now();
    drop(guard_a);
    let (b_at, guard_b) = timeout(Duration::from_secs(5), b_acquiring).await??;
    let guard_b = guard_b?;
    let took = b_at - dropped;
    assert!(took < ms(300), "b led {took:?} after a's guard was dropped");
    assert!(!a.is_leader());

    let released = rec
        .first(Duration::from_secs(2), |v| {
            v.n > acquired.n && v.holder() == Some("")
        })
        .await
        .context("a's release")?;
    let r = released.spec();
    assert_eq!(r.lease_duration_seconds, Some(1), "released with 1 s");
    assert_eq!(
        r.lease_transitions, held.lease_transitions,
        "release keeps transitions"
    );
    assert!(micros(r.acquire_time.as_ref()) >= micros(held.renew_time.as_ref()));
    let s = fx.spec().await?;
    assert_eq!(s.holder_identity.as_deref(), Some("b"));
    assert_eq!(s.lease_transitions, Some(2), "free -> a -> b");
    assert_eq!(s.lease_duration_seconds, Some(2));
    assert_eq!(guard_b.fencing_token(), 2);
    assert!(micros(s.acquire_time.as_ref()) >= micros(r.renew_time.as_ref()));
    Ok(())
}

// ---------------------------------------------------------------------------
// 4. Create race
// ---------------------------------------------------------------------------

/// Counts the candidates that claim to lead after each status change; returns the maximum.
fn watch_leaders(electors: &[LeaderElector]) -> (Arc<AtomicUsize>, JoinHandle<()>) {
    let max = Arc::new(AtomicUsize::new(0));
    let mut rxs: Vec<_> = electors.iter().map(LeaderElector::subscribe).collect();
    let m = max.clone();
    let task = tokio::spawn(async move {
        loop {
            let leaders = rxs.iter().filter(|rx| rx.borrow().is_leader).count();
            m.fetch_max(leaders, Ordering::SeqCst);
            let changed = rxs.iter_mut().map(|rx| Box::pin(rx.changed()));
            let (result, _, _) = select_all(changed).await;
            if result.is_err() {
                return;
            }
        }
    });
    (max, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_racing_to_create_the_lease_elect_exactly_one() -> Result<()> {
    let fx = fixture("race").await?;
    let rec = fx.recorder().await?;
    let ids = ["a", "b", "c", "d"];
    let mut electors = Vec::new();
    for id in ids {
        electors.push(fx.candidate(fx.config(id)).await?);
    }
    let (max_leaders, monitor) = watch_leaders(&electors);
    let acquires: Vec<_> = electors.iter().map(LeaderElector::acquire).collect();
    let (won, winner, rest) = timeout(Duration::from_secs(6), select_all(acquires))
        .await
        .context("nobody won")?;
    let guard = won?;
    let winner_id = ids[winner];
    status_where(&electors[winner], ms(500), |s| s.is_leader).await?;
    assert_eq!(guard.fencing_token(), 0);

    // Exactly one create succeeded, and nobody else wrote the Lease.
    let all = rec.all();
    assert!(!all.is_empty());
    assert!(
        all.iter().all(|v| v.holder() == Some(winner_id)),
        "only {winner_id} wrote: {all:#?}"
    );
    assert!(all.iter().all(|v| v.spec().lease_transitions == Some(0)));

    // The others keep waiting while the winner renews.
    let still = timeout(LEASE_DURATION + ms(500), select_all(rest)).await;
    assert!(still.is_err(), "a second candidate led: {:?}", still.map(|r| r.1));
    for (i, e) in electors.iter().enumerate() {
        assert_eq!(e.is_leader(), i == winner, "{}", ids[i]);
        assert_eq!(e.status().holder.as_deref(), Some(winner_id));
    }

    // Hand over: one of the others, and only one, leads next.
    let others: Vec<&LeaderElector> = electors
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != winner)
        .map(|(_, e)| e)
        .collect();
    let next: Vec<_> = others.iter().map(|e| e.acquire()).collect();
    drop(guard);
    let (next_guard, second, rest) = timeout(Duration::from_secs(3), select_all(next))
        .await
        .context("no candidate took the released lease")?;
    let next_guard = next_guard?;
    assert_eq!(next_guard.fencing_token(), 1);
    status_where(others[second], ms(500), |s| s.is_leader).await?;
    let leaders: Vec<_> = electors.iter().filter(|e| e.is_leader()).collect();
    assert_eq!(leaders.len(), 1, "{leaders:?}");
    drop(rest);
    monitor.abort();
    assert_eq!(
        max_leaders.load(Ordering::SeqCst),
        1,
        "two candidates led at once"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 5. Deleted while held
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_ends_the_term_and_can_be_created_again() -> Result<()> {
    let fx = fixture("deleted").await?;
    let original = fx.free_lease(|_| {}).await?;
    let a = fx.candidate(fx.config("a")).await?;
    let (guard, _) = acquire_within(&a, Duration::from_secs(5)).await?;
    let first_token = guard.fencing_token();

    let deleted = Instant::now();
    fx.leases.delete(LEASE, &DeleteParams::default()).await?;
    let lost = timeout(Duration::from_secs(3), guard)
        .await
        .context("guard did not resolve after the lease was deleted")?;
    assert_eq!(lost, Lost::Deleted);
    let took = deleted.elapsed();
    assert!(took < ms(1000), "loss noticed after {took:?}");
    status_where(&a, ms(500), |s| !s.is_leader).await?;

    // Campaigning again re-creates the Lease, and leads one lease duration later.
    let start = Instant::now();
    let (guard, _) = acquire_within(&a, Duration::from_secs(6)).await?;
    assert!(start.elapsed() >= LEASE_DURATION, "{:?}", start.elapsed());
    let lease = fx.leases.get(LEASE).await?;
    assert_ne!(lease.metadata.uid, original.metadata.uid, "a new object");
    let s = lease.spec.context("spec")?;
    assert_eq!(s.holder_identity.as_deref(), Some("a"));
    // The new object's counter goes on from the deleted one's: a fencing
    // token never goes back.
    assert_eq!(s.lease_transitions.map(i64::from), Some(first_token + 1));
    assert_eq!(guard.fencing_token(), first_token + 1);
    assert!(guard.is_valid());
    Ok(())
}

// ---------------------------------------------------------------------------
// 6. RBAC
// ---------------------------------------------------------------------------

impl LogBuf {
    fn lines_with(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Waits until `n` lines contain `needle`.
    async fn wait_lines(&self, needle: &str, n: usize, within: Duration) -> Result<Vec<String>> {
        let deadline = Instant::now() + within;
        loop {
            let lines = self.lines_with(needle);
            if lines.len() >= n {
                return Ok(lines);
            }
            ensure!(
                Instant::now() < deadline,
                "{n} log lines with {needle:?} not seen within {within:?}; logs:\n{}",
                self.text()
            );
            tokio::time::sleep(ms(20)).await;
        }
    }
}

/// Review (operator first hour): credentials the API server does not accept
/// (an expired kubeconfig token, a revoked service-account token) are answered
/// 401 Unauthorized. That is authentication, not RBAC: the log must not send
/// the user to grant `get` on `leases` (which cannot help), and must say the
/// credentials were refused.
#[tokio::test]
async fn rejected_credentials_are_not_reported_as_a_missing_rbac_verb() -> Result<()> {
    let (logs, _default) = LogBuf::capture(tracing::Level::INFO);

    let fx = fixture("unauth").await?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(fx.env.kubeconfig_path())?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    // A bearer token the API server never issued, and no client certificate.
    config.auth_info = kube::config::AuthInfo {
        token: Some("not-a-token-the-api-server-issued".to_owned().into()),
        ..kube::config::AuthInfo::default()
    };
    let a = LeaderElector::new(Client::try_from(config)?, fx.config("a"))?;
    let mut acquiring = std::pin::pin!(a.acquire());
    // Two attempts, both refused with 401.
    tokio::select! {
        guard = &mut acquiring => bail!("led with rejected credentials: {guard:?}"),
        lines = logs.wait_lines("code: 401", 2, Duration::from_secs(10)) => {
            let lines = lines?;
            for line in &lines {
                ensure!(
                    !line.contains("RBAC needs") && !line.contains("is missing"),
                    "a 401 (credentials refused) is reported as a missing RBAC verb:\n{line}"
                );
            }
            ensure!(
                lines.iter().any(|l| l.contains("credentials")),
                "no line says the credentials were refused:\n{}",
                lines.join("\n")
            );
        }
    }
    ensure!(!a.is_leader());
    Ok(())
}

/// A Client that impersonates another user (`Impersonate-User`: the
/// kubeconfig's `as:`, kube's `AuthInfo::impersonate`, `Config::headers` or
/// a layer of the user's stack) while its own identity, here the service
/// account `elector` granted every verb on `leases`, may not impersonate.
/// The API server refuses every request with authorization's 403 about
/// `impersonate` on `users`: the log must quote that refusal, not send the
/// operator to grant a verb on `leases` that is there.
#[tokio::test]
async fn a_refused_impersonation_is_not_reported_as_a_missing_lease_verb() -> Result<()> {
    let (logs, _default) = LogBuf::capture(tracing::Level::INFO);
    let fx = fixture("impersonate").await?;
    let token = service_account_token(&fx).await?;
    let client = client_with_auth(
        &fx,
        kube::config::AuthInfo {
            token: Some(token.into()),
            impersonate: Some("someone".to_owned()),
            ..kube::config::AuthInfo::default()
        },
    )
    .await?;
    let a = LeaderElector::new(client, fx.config("a"))?;
    let mut acquiring = std::pin::pin!(a.acquire());
    tokio::select! {
        guard = &mut acquiring => bail!("led through a refused impersonation: {guard:?}"),
        lines = logs.wait_lines("cannot impersonate", 2, Duration::from_secs(10)) => {
            let lines = lines?;
            for line in &lines {
                ensure!(
                    !line.contains("RBAC needs") && !line.contains("is missing") && !line.contains("grant "),
                    "a refused impersonation is reported as a missing verb on leases:\n{line}"
                );
            }
        }
    }
    ensure!(!a.is_leader());
    Ok(())
}

/// Creates the service account `elector` (again, if it was deleted),
/// grants it the Lease's verbs, and returns a token of it for an hour.
async fn service_account_token(fx: &Fx) -> Result<String> {
    use k8s_openapi::api::{
        authentication::v1::{TokenRequest, TokenRequestSpec},
        core::v1::ServiceAccount,
    };
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("elector".to_owned()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(fx.admin.clone(), &fx.ns);
    accounts.create(&PostParams::default(), &sa).await?;
    let user = format!("system:serviceaccount:{}:elector", fx.ns);
    if Api::<Role>::namespaced(fx.admin.clone(), &fx.ns)
        .get_opt("leases-partial")
        .await?
        .is_none()
    {
        fx.grant_leases(&user, &["get", "list", "watch", "create", "update"])
            .await?;
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    accounts
        .create_token_request("elector", &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .context("a token")
}

/// A client of the admin kubeconfig's cluster with `auth_info` instead.
async fn client_with_auth(fx: &Fx, auth_info: kube::config::AuthInfo) -> Result<Client> {
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(fx.env.kubeconfig_path())?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    config.auth_info = auth_info;
    Ok(Client::try_from(config)?)
}

/// A client authenticated by an exec credential plugin (as `aws eks
/// get-token` or `gke-gcloud-auth-plugin` in a kubeconfig), as the service
/// account `elector` granted the Lease's verbs. The plugin is a script in
/// `dir`: it sleeps the seconds in `dir/delay` (0), then prints the token
/// with an expiry the seconds in `dir/valid` ahead (61: kube runs the
/// plugin again once the expiry is within 60 s, so from one second after
/// each run).
async fn exec_client(fx: &Fx, dir: &std::path::Path) -> Result<Client> {
    let token = service_account_token(fx).await?;
    std::fs::write(dir.join("token"), token)?;
    std::fs::write(dir.join("delay"), "0")?;
    std::fs::write(dir.join("valid"), "61")?;
    let script = dir.join("get-token");
    let d = dir.display();
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nsleep \"$(cat {d}/delay)\"\nexp=$(date -u -d \"+$(cat {d}/valid) seconds\" \
             +%Y-%m-%dT%H:%M:%SZ)\nprintf '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\
             \"kind\":\"ExecCredential\",\"status\":{{\"token\":\"%s\",\"expirationTimestamp\":\"%s\"}}}}' \
             \"$(cat {d}/token)\" \"$exp\"\n"
        ),
    )?;
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let exec: kube::config::ExecConfig = serde_json::from_value(serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": script,
        "interactiveMode": "Never",
    }))?;
    let auth = kube::config::AuthInfo {
        exec: Some(exec),
        ..kube::config::AuthInfo::default()
    };
    client_with_auth(fx, auth).await
}

/// Review (credentials during a term): an exec credential plugin that
/// takes longer than the renew deadline (a cloud provider's token service
/// slow for a while) when the token is due for refresh. The term may end
/// (no renewal can be sent in time), but the refresh itself must complete:
/// kube keeps a refreshed token only if the request that ran the plugin is
/// still awaited when it answers, and every request of the elector is
/// bounded by the renew deadline, so each one dropped the plugin's answer
/// and started it again; the established watch needed no token. client-go
/// runs the plugin to its end under its lock whatever the request's
/// deadline, keeps the token and leads again.
#[tokio::test]
async fn a_credential_plugin_slower_than_the_renew_deadline_still_refreshes_the_token() -> Result<()> {
    let (logs, _default) = LogBuf::capture(tracing::Level::INFO);
    let fx = fixture("execslow").await?;
    let dir = tempfile::tempdir()?;
    let client = exec_client(&fx, dir.path()).await?;
    let a = LeaderElector::new(client, fx.config("a"))?;
    let (guard, _) = acquire_within(&a, Duration::from_secs(20)).await?;
    // The plugin slows down to twice the renew deadline; the token it
    // gives now is good for an hour.
    std::fs::write(
        dir.path().join("delay"),
        format!("{}", RENEW_DEADLINE.as_secs_f64() * 2.0),
    )?;
    std::fs::write(dir.path().join("valid"), "3600")?;
    let slowed = Instant::now();
    let lost = timeout(Duration::from_secs(10), guard).await;
    let lost = format!("{lost:?}");
    // Once one run of the plugin has answered, every request has its
    // token: the candidate leads again within a few runs of the plugin.
    let within = Duration::from_secs(30);
    let _guard = timeout(within, a.acquire()).await.with_context(|| {
        format!(
            "not leading {:?} after the credential plugin slowed down to {:?} (the term: {lost}); logs:\n{}",
            slowed.elapsed(),
            RENEW_DEADLINE * 2,
            logs.text()
        )
    })??;
    Ok(())
}

/// Review (credentials during a term): a client of one cluster used with
/// a Lease namespace that does not exist there (another context's, or a
/// typo). The read says the Lease is missing, and the create is answered
/// 404 for the namespace: the log names the namespace, not RBAC, and the
/// candidate retries (every jittered retry period) without leading.
#[tokio::test]
async fn a_lease_namespace_that_does_not_exist_is_named_in_the_log() -> Result<()> {
    let (logs, _default) = LogBuf::capture(tracing::Level::INFO);
    let fx = fixture("nons").await?;
    let missing = format!("{}-missing", fx.ns);
    let config = support::fast_config(&missing, "a");
    let a = LeaderElector::new(fx.admin.clone(), config)?;
    let mut acquiring = std::pin::pin!(a.acquire());
    tokio::select! {
        guard = &mut acquiring => bail!("led in a namespace that does not exist: {guard:?}"),
        lines = logs.wait_lines("acquiring the lease failed", 2, Duration::from_secs(10)) => {
            for line in lines? {
                ensure!(
                    line.contains(&format!("namespaces \"{missing}\" not found")) && !line.contains("RBAC"),
                    "the line does not name the missing namespace:\n{line}"
                );
            }
        }
    }
    Ok(())
}

/// Review (credentials during a term): the credential plugin hangs (a
/// cloud provider's token service unreachable) while the leader shuts
/// down. `shutdown` must return within its budget, the term over, whatever
/// the plugin does. (The plugin's run itself is kube's blocking task: a
/// runtime dropped after `shutdown` waits for it, so the plugin here hangs
/// only a few seconds.)
#[tokio::test]
async fn a_hung_credential_plugin_does_not_hold_shutdown_past_its_budget() -> Result<()> {
    let fx = fixture("exechung").await?;
    let dir = tempfile::tempdir()?;
    let a = LeaderElector::new(exec_client(&fx, dir.path()).await?, fx.config("a"))?;
    let (guard, _) = acquire_within(&a, Duration::from_secs(20)).await?;
    std::fs::write(dir.path().join("delay"), "8")?;
    std::fs::write(dir.path().join("valid"), "3600")?;
    // The next renewal runs the plugin (the token is due a second after
    // each run); the shutdown begins while it hangs.
    tokio::time::sleep(RETRY_PERIOD * 2).await;
    let grace = Duration::from_secs(1);
    let budget = a.config().shutdown_budget(grace);
    let started = Instant::now();
    let result = timeout(budget + Duration::from_secs(1), a.shutdown(grace))
        .await
        .with_context(|| {
            format!(
                "shutdown({grace:?}) still running {:?} after it began",
                started.elapsed()
            )
        })?;
    ensure!(!a.is_leader(), "still leading after shutdown: {result:?}");
    ensure!(guard.lost().is_some(), "the guard's term goes on after shutdown");
    Ok(())
}

/// Review (credentials during a term): the service account token a pod
/// reads from its projected file is revoked mid-term (its service account
/// deleted: every request answered 401). The term must end by the renew
/// deadline, saying that the credentials were refused; once a new token is
/// written to the file (the kubelet rotates it in place), the candidate must
/// lead again without a restart (kube rereads the file at least once a
/// minute).
#[tokio::test]
async fn a_revoked_token_ends_the_term_and_a_rotated_token_file_is_taken_up_without_a_restart() -> Result<()>
{
    use k8s_openapi::api::core::v1::ServiceAccount;
    let (logs, _default) = LogBuf::capture(tracing::Level::INFO);
    let fx = fixture("tokenfile").await?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("token");
    std::fs::write(&file, service_account_token(&fx).await?)?;
    let auth = kube::config::AuthInfo {
        token_file: Some(file.display().to_string()),
        ..kube::config::AuthInfo::default()
    };
    let a = LeaderElector::new(client_with_auth(&fx, auth).await?, fx.config("a"))?;
    let (guard, _) = acquire_within(&a, Duration::from_secs(20)).await?;
    // Revoked: the API server's token cache (10 s) may accept it a little
    // longer; from the first refusal, the term ends by the renew deadline.
    let accounts: Api<ServiceAccount> = Api::namespaced(fx.admin.clone(), &fx.ns);
    accounts.delete("elector", &DeleteParams::default()).await?;
    let mut guard = std::pin::pin!(guard);
    tokio::select! {
        lost = &mut guard => bail!("the term ended ({lost:?}) before any request was refused"),
        lines = logs.wait_lines("did not accept this client's credentials (401)", 1, Duration::from_secs(20)) => {
            lines.with_context(|| format!("no line says the credentials were refused; logs:\n{}", logs.text()))?;
        }
    }
    let refused = Instant::now();
    let lost = timeout(RENEW_DEADLINE + Duration::from_secs(1), guard)
        .await
        .with_context(|| format!("the term went on {:?} after the first 401", refused.elapsed()))?;
    ensure!(lost == Lost::RenewDeadlineExceeded, "{lost:?}");
    ensure!(!a.is_leader());
    // Rotated: a new token in the same file.
    std::fs::write(&file, service_account_token(&fx).await?)?;
    let rotated = Instant::now();
    let within = Duration::from_secs(90);
    let _guard = timeout(within, a.acquire()).await.with_context(|| {
        format!(
            "not leading {:?} after the token file was rewritten; status {:?}",
            rotated.elapsed(),
            a.status()
        )
    })??;
    Ok(())
}

/// The Lease's namespace being deleted: creating the Lease is refused with a
/// 403 of admission (cause `NamespaceTerminating`), not of authorization. The
/// candidate, and its Events, must not send the operator to grant an RBAC
/// verb that is there. (No namespace controller runs here: the namespace
/// stays terminating for the test.)
#[tokio::test]
async fn a_namespace_being_deleted_is_not_reported_as_a_missing_rbac_verb() -> Result<()> {
    let (logs, _default) = LogBuf::capture(tracing::Level::INFO);
    let fx = fixture("terminating").await?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(fx.env.client().await?);
    namespaces.delete(&fx.ns, &DeleteParams::default()).await?;
    let a = LeaderElector::new(fx.env.client().await?, fx.config("a"))?.with_events(
        kube::runtime::events::Reporter {
            controller: "kube-runtime-lease-tests".into(),
            instance: None,
        },
    );
    let mut acquiring = std::pin::pin!(a.acquire());
    tokio::select! {
        guard = &mut acquiring => bail!("led in a namespace being deleted: {guard:?}"),
        lines = logs.wait_lines("being terminated", 2, Duration::from_secs(10)) => {
            for line in lines? {
                ensure!(
                    !line.contains("RBAC"),
                    "a create refused because the namespace is being deleted is reported as RBAC's:\n{line}"
                );
            }
        }
    }
    Ok(())
}

/// Review (beyond RBAC): a `ResourceQuota` on `count/leases.coordination.k8s.io`
/// refuses the create with a 403 of admission that names no cause and denies
/// nothing: "status unknown for quota" until the quota controller has counted,
/// "exceeded quota" once the count is at the limit. No RBAC verb is missing:
/// the log must say so, and once the quota allows one more Lease the pending
/// candidate creates it and leads. (No quota controller runs here: the test
/// writes the quota's status as it would.)
#[tokio::test]
async fn a_lease_quota_is_not_reported_as_a_missing_rbac_verb_and_the_lease_is_created_once_allowed()
-> Result<()> {
    use k8s_openapi::{
        api::core::v1::{ResourceQuota, ResourceQuotaSpec, ResourceQuotaStatus},
        apimachinery::pkg::api::resource::Quantity,
    };
    const COUNT: &str = "count/leases.coordination.k8s.io";
    let (logs, _default) = LogBuf::capture(tracing::Level::INFO);
    let fx = fixture("quota").await?;
    let quotas: Api<ResourceQuota> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let limit = |n: &str| Some([(COUNT.to_owned(), Quantity(n.to_owned()))].into());
    let mut quota = quotas
        .create(
            &PostParams::default(),
            &ResourceQuota {
                metadata: ObjectMeta {
                    name: Some("leases".to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(ResourceQuotaSpec {
                    hard: limit("0"),
                    ..ResourceQuotaSpec::default()
                }),
                ..ResourceQuota::default()
            },
        )
        .await?;
    // Not counted yet: the quota controller has not written `used`.
    quota.status = Some(ResourceQuotaStatus {
        hard: limit("0"),
        used: None,
    });
    let quota = quotas
        .replace_status("leases", &PostParams::default(), &quota)
        .await?;

    let a = fx.candidate(fx.config("a")).await?;
    let mut acquiring = std::pin::pin!(a.acquire());
    let no_rbac = |lines: Vec<String>| -> Result<()> {
        for line in lines {
            ensure!(
                !line.contains("RBAC") && !line.contains("is missing"),
                "a create refused by a ResourceQuota is reported as a missing RBAC verb:\n{line}"
            );
        }
        Ok(())
    };
    tokio::select! {
        guard = &mut acquiring => bail!("led past a quota of 0 Leases: {guard:?}"),
        lines = logs.wait_lines("status unknown for quota", 2, Duration::from_secs(10)) => no_rbac(lines?)?,
    }

    // Counted, and at the limit.
    let mut counted = quota;
    counted.status = Some(ResourceQuotaStatus {
        hard: limit("0"),
        used: limit("0"),
    });
    let counted = quotas
        .replace_status("leases", &PostParams::default(), &counted)
        .await?;
    tokio::select! {
        guard = &mut acquiring => bail!("led past a quota of 0 Leases: {guard:?}"),
        lines = logs.wait_lines("exceeded quota", 2, Duration::from_secs(10)) => no_rbac(lines?)?,
    }
    ensure!(!a.is_leader());
    ensure!(fx.leases.get_opt(LEASE).await?.is_none(), "nothing created");

    // One Lease allowed: the pending acquisition creates it and leads (after
    // the creation hold of one lease duration), within a few retry periods.
    let mut raised = counted;
    raised.spec = Some(ResourceQuotaSpec {
        hard: limit("1"),
        ..ResourceQuotaSpec::default()
    });
    let mut raised = quotas.replace("leases", &PostParams::default(), &raised).await?;
    raised.status = Some(ResourceQuotaStatus {
        hard: limit("1"),
        used: limit("0"),
    });
    quotas
        .replace_status("leases", &PostParams::default(), &raised)
        .await?;
    let _guard = timeout(Duration::from_secs(10), &mut acquiring)
        .await
        .with_context(|| {
            format!(
                "no leadership once the quota allowed the Lease; logs:\n{}",
                logs.text()
            )
        })??;
    assert_eq!(fx.spec().await?.holder_identity.as_deref(), Some("a"));
    Ok(())
}

// A current-thread runtime: the elector's tasks run on the test's thread, where
// the scoped subscriber is the default.
#[tokio::test]
async fn without_rbac_a_candidate_never_leads_and_says_which_rule_is_missing() -> Result<()> {
    let (logs, _default) = LogBuf::capture(tracing::Level::INFO);

    let fx = fixture("rbac").await?;
    let user = format!("lease-user-{}", fx.ns);
    let a = LeaderElector::new(fx.env.user_client(&user, &[]).await?, fx.config("a"))?;
    let mut acquiring = std::pin::pin!(a.acquire());
    let missing_get = format!(
        "forbidden to get lease {}/{LEASE}: RBAC needs verbs get, create, update",
        fx.ns
    );
    // Two attempts, both refused, and no leadership.
    tokio::select! {
        guard = &mut acquiring => bail!("led without any permission: {guard:?}"),
        lines = logs.wait_lines(&missing_get, 2, Duration::from_secs(10)) => {
            let lines = lines?;
            assert!(lines[0].contains("`get` is missing"), "{}", lines[0]);
            assert!(lines[0].contains("ERROR"), "{}", lines[0]);
            assert!(lines[0].contains("identity=a"), "{}", lines[0]);
            assert!(lines[0].contains("code: 403"), "{}", lines[0]);
            let refused = format!("User \"{user}\" cannot get resource \"leases\"");
            assert!(lines[0].contains(&refused), "{}", lines[0]);
        }
    }
    assert!(!a.is_leader());
    assert!(fx.leases.get_opt(LEASE).await?.is_none(), "nothing created");

    // Grant get, create and update, but not list and watch.
    let role = Role {
        metadata: ObjectMeta {
            name: Some("lease-rw".to_owned()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".to_owned()]),
            resources: Some(vec!["leases".to_owned()]),
            verbs: vec!["get".to_owned(), "create".to_owned(), "update".to_owned()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(fx.admin.clone(), &fx.ns)
        .create(&PostParams::default(), &role)
        .await?;
    TestEnv::bind_role(&fx.admin, &fx.ns, "lease-rw", &user).await?;

    // The pending acquisition now creates the Lease and leads (after holding it
    // for one lease duration), polling since it cannot watch.
    let guard = timeout(Duration::from_secs(10), &mut acquiring)
        .await
        .with_context(|| format!("no leadership after the grant; logs:\n{}", logs.text()))??;
    status_where(&a, ms(500), |s| s.is_leader).await?;
    assert_eq!(fx.spec().await?.holder_identity.as_deref(), Some("a"));
    let fallback = logs.lines_with("cannot watch leases");
    assert_eq!(fallback.len(), 1, "one warning: {fallback:?}");
    assert!(fallback[0].contains("WARN") && fallback[0].contains("identity=a"));
    assert!(fallback[0].contains("falling back to polling"));

    // A second candidate of the same user also falls back to polling, and
    // takes the released Lease within a jittered retry period.
    let b = LeaderElector::new(fx.env.user_client(&user, &[]).await?, fx.config("b"))?;
    let b_acquiring = spawn_acquire(&b);
    status_where(&b, Duration::from_secs(5), |s| s.holder.as_deref() == Some("a")).await?;
    let released = Instant::now();
    drop(guard);
    let (b_at, guard_b) = timeout(Duration::from_secs(5), b_acquiring).await??;
    let guard_b = guard_b?;
    let took = b_at - released;
    assert!(
        took <= RETRY_PERIOD.mul_f64(2.2) + ms(300),
        "polling b led {took:?} after the release"
    );
    assert_eq!(guard_b.fencing_token(), 1);
    let fallback = logs.lines_with("cannot watch leases");
    assert_eq!(fallback.len(), 2, "one warning per candidate: {fallback:?}");
    assert!(fallback[1].contains("identity=b"), "{}", fallback[1]);
    Ok(())
}

impl Fx {
    /// Grants `user` exactly `verbs` on `leases` in the test's namespace.
    async fn grant_leases(&self, user: &str, verbs: &[&str]) -> Result<()> {
        let name = "leases-partial".to_owned();
        let role = Role {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            rules: Some(vec![PolicyRule {
                api_groups: Some(vec!["coordination.k8s.io".to_owned()]),
                resources: Some(vec!["leases".to_owned()]),
                verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
                ..PolicyRule::default()
            }]),
        };
        Api::<Role>::namespaced(self.admin.clone(), &self.ns)
            .create(&PostParams::default(), &role)
            .await?;
        TestEnv::bind_role(&self.admin, &self.ns, &name, user).await?;
        Ok(())
    }
}

/// Review (RBAC verb by verb): each verb of the documented Role on `leases`
/// missing alone, the others granted, on the real API server's RBAC. A
/// candidate without `get`, or without `create` while the Lease is missing,
/// or without `update` (with the creation hold: its renewals during the
/// hold are refused) never leads; without `update` and without the hold it
/// leads one term, which ends at its renew deadline, and is left to
/// expire. Each says which verb is missing, naming that one only. A
/// `LeaseObserver` (`get`, `list`, `watch`) without `list`/`watch` reports
/// the holder from its reads and says the watch is refused; without `get`
/// it says so.
#[tokio::test]
async fn each_lease_verb_missing_alone_is_named_and_never_leads_past_the_renew_deadline() -> Result<()> {
    let (logs, _default) = LogBuf::capture(tracing::Level::INFO);
    let all = ["get", "create", "update", "list", "watch"];
    for (missing, hold) in [
        ("get", true),
        ("create", true),
        ("update", true),
        ("update", false),
    ] {
        let fx = fixture(&format!("rbac-no-{missing}")).await?;
        let user = format!("lease-user-{}", fx.ns);
        let granted: Vec<_> = all.iter().copied().filter(|v| *v != missing).collect();
        fx.grant_leases(&user, &granted).await?;
        let config = fx.config("a").creation_hold(hold);
        let a = LeaderElector::new(fx.env.user_client(&user, &[]).await?, config)?;
        let needle = format!("forbidden to {missing} lease {}/{LEASE}", fx.ns);
        let mut acquiring = std::pin::pin!(a.acquire());
        if missing == "update" && !hold {
            // Created and led at once; the first renewal is refused.
            let guard = timeout(Duration::from_secs(10), &mut acquiring)
                .await
                .with_context(|| format!("no term without the creation hold; logs:\n{}", logs.text()))??;
            let led = Instant::now();
            let lost = timeout(RENEW_DEADLINE + Duration::from_secs(5), guard)
                .await
                .context("the term outlived its renew deadline without `update`")?;
            ensure!(lost == Lost::RenewDeadlineExceeded, "{lost:?}");
            ensure!(
                led.elapsed() <= RENEW_DEADLINE + Duration::from_secs(2),
                "the guard ended {:?} after the term began",
                led.elapsed()
            );
            ensure!(!a.is_leader());
            let mut again = std::pin::pin!(a.acquire());
            tokio::select! {
                guard = &mut again => bail!("led again without `update`: {guard:?}"),
                lines = logs.wait_lines(&needle, 2, Duration::from_secs(10)) => drop(lines?),
            }
            ensure!(
                fx.spec().await?.holder_identity.as_deref() == Some("a"),
                "left to expire, not released"
            );
        } else {
            tokio::select! {
                guard = &mut acquiring => bail!("led without `{missing}`: {guard:?}"),
                lines = logs.wait_lines(&needle, 2, Duration::from_secs(10)) => drop(lines?),
            }
            ensure!(!a.is_leader(), "leads without `{missing}`");
        }
        let lease = fx.leases.get_opt(LEASE).await?;
        ensure!(
            lease.is_some() == (missing == "update"),
            "without `{missing}`: Lease {lease:?}"
        );
        let in_ns = format!("lease {}/{LEASE}", fx.ns);
        for line in logs.lines_with(&in_ns).iter().filter(|l| l.contains("RBAC")) {
            ensure!(
                line.contains(&needle) && line.contains(&format!("`{missing}` is missing")),
                "without `{missing}` a line names another verb:\n{line}"
            );
        }
    }

    // A LeaseObserver without `list`/`watch`, then without `get`.
    for (missing, granted) in [("watch", &["get"][..]), ("get", &["list", "watch"][..])] {
        let fx = fixture(&format!("rbac-observer-no-{missing}")).await?;
        let user = format!("lease-user-{}", fx.ns);
        fx.grant_leases(&user, granted).await?;
        // Without `get`, no Lease: its watch is silent, and the read after
        // the silence (15 s) is refused. (A held Lease's renewals keep a
        // watch from falling silent: no read is needed.)
        let leader = fx.candidate(fx.config("leader").creation_hold(false)).await?;
        let _guard = if missing == "watch" {
            Some(acquire_within(&leader, Duration::from_secs(10)).await?)
        } else {
            None
        };
        let observer =
            kube_runtime_lease::LeaseObserver::new(fx.env.user_client(&user, &[]).await?, &fx.ns, LEASE)?;
        let needle = format!("lease observer: forbidden to {missing} lease {}/{LEASE}", fx.ns);
        let lines = logs.wait_lines(&needle, 1, Duration::from_secs(30)).await?;
        ensure!(
            lines[0].contains("RBAC needs verbs get, list, watch"),
            "{}",
            lines[0]
        );
        if missing == "watch" {
            let mut status = observer.subscribe();
            timeout(
                Duration::from_secs(30),
                status.wait_for(|s| s.holder.as_deref() == Some("leader")),
            )
            .await
            .context("an observer without list/watch never reported the holder")??;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 7. Coordinated Leader Election fields
// ---------------------------------------------------------------------------

const STRATEGY: &str = "OldestEmulationVersion";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strategy_and_preferred_holder_are_kept_and_honoured() -> Result<()> {
    let fx = fixture("cle").await?;
    // The apiserver persists the fields only with the CoordinatedLeaderElection gate.
    let created = fx.free_lease(|s| s.strategy = Some(STRATEGY.to_owned())).await?;
    assert_eq!(
        created.spec.as_ref().and_then(|s| s.strategy.as_deref()),
        Some(STRATEGY),
        "the apiserver dropped spec.strategy: is CoordinatedLeaderElection enabled?"
    );
    let rec = fx.recorder().await?;
    let a = fx.candidate(fx.config("a")).await?;
    let (guard, _) = acquire_within(&a, Duration::from_secs(5)).await?;
    let acquired = rec
        .first(Duration::from_secs(2), |v| v.holder() == Some("a"))
        .await?;
    assert_eq!(
        acquired.spec().strategy.as_deref(),
        Some(STRATEGY),
        "kept on acquire"
    );

    // Set during leadership: preferredHolder naming the leader itself.
    let edited = fx.modify(|s| s.preferred_holder = Some("a".to_owned())).await?;
    let edited_rv = edited.metadata.resource_version.clone().context("rv")?;
    let edited_renew = micros(edited.spec.as_ref().and_then(|s| s.renew_time.as_ref()));
    // A renewal after the edit.
    let renewed = rec
        .first(Duration::from_secs(3), |v| {
            v.rv != edited_rv
                && v.spec
                    .as_ref()
                    .is_some_and(|s| micros_or_zero(s.renew_time.as_ref()) > edited_renew)
        })
        .await?;
    let s = renewed.spec();
    assert_eq!(s.holder_identity.as_deref(), Some("a"));
    assert_eq!(s.strategy.as_deref(), Some(STRATEGY), "kept on renew");
    assert_eq!(s.preferred_holder.as_deref(), Some("a"), "kept on renew");
    assert!(guard.is_valid() && a.is_leader(), "a is preferred: it stays");

    // Every write so far kept strategy; every write after the edit kept preferredHolder.
    let edit = rec.first(Duration::ZERO, |v| v.rv == edited_rv).await?;
    for v in rec.all() {
        let s = v.spec();
        assert_eq!(s.strategy.as_deref(), Some(STRATEGY), "{v:?}");
        if v.n >= edit.n {
            assert_eq!(s.preferred_holder.as_deref(), Some("a"), "{v:?}");
        }
    }

    // Preferring someone else: the leader steps down. Its guard was still
    // held when the term ended (the work was stopped, not finished), so the
    // Lease is not written free: it expires, and the preferred holder takes it.
    let b = fx.candidate(fx.config("b")).await?;
    let b_acquiring = spawn_acquire(&b);
    status_where(&b, Duration::from_secs(5), |s| s.holder.as_deref() == Some("a")).await?;
    let preferred_at = Instant::now();
    fx.modify(|s| s.preferred_holder = Some("b".to_owned())).await?;
    let lost = timeout(Duration::from_secs(3), guard)
        .await
        .context("a did not step down")?;
    assert_eq!(
        lost,
        Lost::SteppedDown {
            preferred_holder: "b".to_owned()
        }
    );
    let stepped_down = preferred_at.elapsed();
    assert!(
        stepped_down <= RETRY_PERIOD + ms(500),
        "stepped down {stepped_down:?} after the edit"
    );
    let taken = rec
        .first(LEASE_DURATION + RETRY_PERIOD + ms(1500), |v| {
            v.n > acquired.n && v.holder() == Some("b")
        })
        .await?;
    rec.assert_never_written_free_after(acquired.n);
    let (b_at, guard_b) = timeout(Duration::from_secs(5), b_acquiring).await??;
    let guard_b = guard_b?;
    let s = fx.spec().await?;
    assert_eq!(s.holder_identity.as_deref(), Some("b"));
    assert_eq!(s.preferred_holder.as_deref(), Some("b"));
    assert_eq!(s.strategy.as_deref(), Some(STRATEGY));
    assert_eq!(guard_b.fencing_token(), 2);
    // How soon is checked by `a_released_lease_goes_to_its_preferred_holder_first`.
    assert!(b_at - taken.at < Duration::from_secs(3));
    assert!(!a.is_leader());
    Ok(())
}

/// After stepping down for a preferred holder with work in flight (its guard
/// still held), the leader lets the Lease expire instead of writing it free,
/// and the expired Lease is left to the preferred holder, which takes it at
/// expiry, and not to any other candidate (they wait one more lease duration).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_goes_to_its_preferred_holder_first() -> Result<()> {
    let fx = fixture("cle-preferred").await?;
    fx.free_lease(|s| s.strategy = Some(STRATEGY.to_owned())).await?;
    let rec = fx.recorder().await?;
    let a = fx.candidate(fx.config("a")).await?;
    let (guard, _) = acquire_within(&a, Duration::from_secs(5)).await?;
    let acquired = rec
        .first(Duration::from_secs(2), |v| v.holder() == Some("a"))
        .await?;
    // `c` is a candidate too, but not the preferred one.
    let b = fx.candidate(fx.config("b")).await?;
    let c = fx.candidate(fx.config("c")).await?;
    let b_acquiring = spawn_acquire(&b);
    let c_acquiring = spawn_acquire(&c);
    for e in [&b, &c] {
        status_where(e, Duration::from_secs(5), |s| s.holder.as_deref() == Some("a")).await?;
    }
    fx.modify(|s| s.preferred_holder = Some("b".to_owned())).await?;
    let lost = timeout(Duration::from_secs(3), guard)
        .await
        .context("a did not step down")?;
    assert!(matches!(lost, Lost::SteppedDown { .. }), "{lost:?}");
    let stepped_down = Instant::now();
    let taken = rec
        .first(LEASE_DURATION + RETRY_PERIOD + ms(1500), |v| {
            v.n > acquired.n && v.holder().is_some_and(|h| h != "a")
        })
        .await?;
    let (b_at, guard_b) = timeout(Duration::from_secs(5), b_acquiring).await??;
    let guard_b = guard_b?;
    assert_eq!(
        taken.holder(),
        Some("b"),
        "the preferred holder takes it, not c: {taken:?}"
    );
    rec.assert_never_written_free_after(acquired.n);
    let took = b_at - stepped_down;
    assert!(
        took <= LEASE_DURATION + ms(1500),
        "the preferred holder led {took:?} after the step-down: more than the lease duration"
    );
    assert_eq!(guard_b.fencing_token(), 2);
    // `c` keeps waiting: `b` leads and is the preferred holder.
    let c_led = timeout(LEASE_DURATION + ms(500), c_acquiring).await;
    assert!(c_led.is_err(), "c led while b is preferred: {c_led:?}");
    assert!(
        rec.all().iter().all(|v| v.holder() != Some("c")),
        "{:#?}",
        rec.all()
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 8. Guarded stream and Controller
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_stream_runs_only_while_leading() -> Result<()> {
    let fx = fixture("stream").await?;
    // Held by a candidate that has stopped renewing.
    let created_at = Instant::now();
    fx.create_lease(LeaseSpec {
        holder_identity: Some("gone".to_owned()),
        lease_duration_seconds: Some(2),
        lease_transitions: Some(3),
        acquire_time: Some(MicroTime(Timestamp::now())),
        renew_time: Some(MicroTime(Timestamp::now())),
        ..LeaseSpec::default()
    })
    .await?;
    let a = fx.candidate(fx.config("a")).await?;

    let items = Arc::new(AtomicUsize::new(0));
    let polled_while_not_leading = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let first_item: Arc<Mutex<Option<Instant>>> = Arc::default();
    let work = {
        let (items, bad, first, e) = (
            items.clone(),
            polled_while_not_leading.clone(),
            first_item.clone(),
            a.clone(),
        );
        let flag = DropFlag(dropped.clone());
        futures::stream::unfold(flag, move |flag| {
            let (items, bad, first, e) = (items.clone(), bad.clone(), first.clone(), e.clone());
            async move {
                assert!(flag.alive());
                if !e.is_leader() {
                    bad.fetch_add(1, Ordering::SeqCst);
                }
                first.lock().expect("lock").get_or_insert_with(Instant::now);
                tokio::time::sleep(ms(20)).await;
                // Counted when yielded: a drop during the sleep yields nothing.
                let n = items.fetch_add(1, Ordering::SeqCst);
                Some((n, flag))
            }
        })
    };
    let guarded = work.with_leader_election(&a);
    let consumer = tokio::spawn(async move {
        let mut guarded = std::pin::pin!(guarded);
        let mut seen = 0;
        while guarded.next().await.is_some() {
            seen += 1;
        }
        (seen, guarded.lost())
    });

    status_where(&a, Duration::from_secs(5), |s| {
        s.holder.as_deref() == Some("gone")
    })
    .await?;
    assert!(
        first_item.lock().expect("lock").is_none(),
        "polled before leading"
    );
    status_where(&a, Duration::from_secs(5), |s| s.is_leader).await?;
    let led_at = Instant::now();
    assert!(led_at - created_at >= LEASE_DURATION, "took an unexpired lease");
    // The work runs.
    let deadline = Instant::now() + Duration::from_secs(3);
    while items.load(Ordering::SeqCst) < 10 {
        ensure!(Instant::now() < deadline, "the guarded stream does not run");
        tokio::time::sleep(ms(20)).await;
    }
    let first = first_item.lock().expect("lock").context("no item")?;
    assert!(first >= led_at - ms(50), "polled before leading");

    // Another candidate takes the Lease by force: the stream is dropped.
    let forced = Instant::now();
    fx.modify(|s| {
        s.holder_identity = Some("thief".to_owned());
        s.lease_transitions = s.lease_transitions.map(|t| t + 1);
        s.acquire_time = Some(MicroTime(Timestamp::now()));
        s.renew_time = s.acquire_time.clone();
        s.lease_duration_seconds = Some(30);
    })
    .await?;
    let (seen, lost) = timeout(Duration::from_secs(3), consumer)
        .await
        .context("guarded stream still running after a takeover")??;
    let took = forced.elapsed();
    assert!(took < ms(1000), "stopped {took:?} after the takeover");
    assert_eq!(
        lost,
        Some(Lost::TakenOver {
            holder: "thief".to_owned()
        })
    );
    assert!(dropped.load(Ordering::SeqCst), "the inner stream was dropped");
    assert!(seen >= 10);
    assert_eq!(items.load(Ordering::SeqCst), seen);
    assert_eq!(polled_while_not_leading.load(Ordering::SeqCst), 0);
    assert!(!a.is_leader());
    assert_eq!(
        fx.spec().await?.holder_identity.as_deref(),
        Some("thief"),
        "not released"
    );
    Ok(())
}

struct Ctx {
    elector: LeaderElector,
    reconciled: AtomicUsize,
    not_leading: AtomicUsize,
    names: tokio::sync::mpsc::UnboundedSender<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_reconciles_only_while_leading() -> Result<()> {
    let fx = fixture("controller").await?;
    fx.free_lease(|_| {}).await?;
    let cms: Api<ConfigMap> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let configmap = |name: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    for name in ["cm-1", "cm-2"] {
        cms.create(&PostParams::default(), &configmap(name)).await?;
    }
    // Someone else leads first.
    let other = fx.candidate(fx.config("other")).await?;
    let (other_guard, _) = acquire_within(&other, Duration::from_secs(5)).await?;

    let client = fx.env.client().await?;
    let a = LeaderElector::new(client.clone(), fx.config("a"))?;
    let (tx, mut names) = tokio::sync::mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx {
        elector: a.clone(),
        reconciled: AtomicUsize::new(0),
        not_leading: AtomicUsize::new(0),
        names: tx,
    });
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = DropFlag(dropped.clone());
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(client, &fx.ns),
        watcher::Config::default(),
    )
    .with_leader_election(&a)
    .run(
        move |cm: Arc<ConfigMap>, ctx: Arc<Ctx>| {
            assert!(flag.alive());
            async move {
                if !ctx.elector.is_leader() {
                    ctx.not_leading.fetch_add(1, Ordering::SeqCst);
                }
                ctx.reconciled.fetch_add(1, Ordering::SeqCst);
                let _ = ctx.names.send(cm.metadata.name.clone().unwrap_or_default());
                Ok::<_, kube::Error>(Action::await_change())
            }
        },
        |_cm, _err: &kube::Error, _ctx| Action::requeue(ms(500)),
        ctx.clone(),
    );
    let running = tokio::spawn(async move {
        let mut controller = std::pin::pin!(controller);
        while controller.next().await.is_some() {}
        controller.lost()
    });

    status_where(&a, Duration::from_secs(5), |s| {
        s.holder.as_deref() == Some("other")
    })
    .await?;
    assert_eq!(
        ctx.reconciled.load(Ordering::SeqCst),
        0,
        "reconciled before leading"
    );
    assert!(names.try_recv().is_err());

    // `other` hands over: the controller starts and reconciles what exists.
    drop(other_guard);
    status_where(&a, Duration::from_secs(5), |s| s.is_leader).await?;
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 2 {
        let name = timeout(Duration::from_secs(5), names.recv())
            .await
            .context("no reconcile after acquisition")?
            .context("controller gone")?;
        seen.insert(name);
    }
    assert_eq!(seen, ["cm-1".to_owned(), "cm-2".to_owned()].into());
    // And what changes while it leads.
    cms.create(&PostParams::default(), &configmap("cm-3")).await?;
    loop {
        let name = timeout(Duration::from_secs(5), names.recv())
            .await
            .context("cm-3 not reconciled")?
            .context("controller gone")?;
        if name == "cm-3" {
            break;
        }
    }
    assert!(!dropped.load(Ordering::SeqCst));

    // The Lease is deleted: the controller stops at once.
    let deleted = Instant::now();
    fx.leases.delete(LEASE, &DeleteParams::default()).await?;
    let lost = timeout(Duration::from_secs(3), running)
        .await
        .context("controller still running after the lease was deleted")??;
    assert!(deleted.elapsed() < ms(1000), "{:?}", deleted.elapsed());
    assert_eq!(lost, Some(Lost::Deleted));
    assert!(dropped.load(Ordering::SeqCst), "the reconciler was dropped");
    let count = ctx.reconciled.load(Ordering::SeqCst);
    cms.create(&PostParams::default(), &configmap("cm-4")).await?;
    tokio::time::sleep(ms(300)).await;
    assert_eq!(
        ctx.reconciled.load(Ordering::SeqCst),
        count,
        "reconciled after the loss"
    );
    assert_eq!(ctx.not_leading.load(Ordering::SeqCst), 0);
    assert!(!a.is_leader());
    Ok(())
}

// ---------------------------------------------------------------------------
// 9. Handover latency: watch vs polling
// ---------------------------------------------------------------------------

/// `a` leads, `b` waits; returns how long after `a`'s guard is dropped `b` leads.
async fn handover(prefix: &str, watch: bool) -> Result<Duration> {
    let fx = fixture(prefix).await?;
    fx.free_lease(|_| {}).await?;
    let a = fx.candidate(fx.config("a").watch(watch)).await?;
    let (guard_a, _) = acquire_within(&a, Duration::from_secs(5)).await?;
    let b = fx.candidate(fx.config("b").watch(watch)).await?;
    let b_acquiring = spawn_acquire(&b);
    status_where(&b, Duration::from_secs(5), |s| s.holder.as_deref() == Some("a")).await?;
    // Let `b` settle into waiting (its watch synced, or its polling cadence).
    let rec = fx.recorder().await?;
    let renewed = fx.spec().await?.renew_time;
    rec.first(Duration::from_secs(3), |v| v.spec().renew_time != renewed)
        .await?;
    let released = Instant::now();
    drop(guard_a);
    let (b_at, guard_b) = timeout(Duration::from_secs(5), b_acquiring).await??;
    let guard_b = guard_b?;
    assert_eq!(guard_b.fencing_token(), 2);
    assert_eq!(fx.spec().await?.holder_identity.as_deref(), Some("b"));
    Ok(b_at - released)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_watch_a_released_lease_is_taken_within_150ms() -> Result<()> {
    let took = handover("handover-watch", true).await?;
    eprintln!("watch handover: {took:?}");
    assert!(took <= ms(150), "handover took {took:?} with a watch");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_takes_a_released_lease_within_a_jittered_retry_period() -> Result<()> {
    let took = handover("handover-poll", false).await?;
    eprintln!("polling handover: {took:?}");
    assert!(
        took <= RETRY_PERIOD.mul_f64(2.2) + ms(250),
        "handover took {took:?} while polling"
    );
    Ok(())
}

/// Lease metadata on a real apiserver: the configured labels, annotation and
/// owner reference are accepted and stored, `kubectl get lease -l ...` (a
/// label selector) finds the Lease, and labels someone else set are kept.
/// (Garbage collection itself needs kube-controller-manager, which the test
/// control plane does not run: the owner reference is checked as stored.)
#[tokio::test]
async fn the_configured_lease_metadata_is_stored_and_selectable() -> Result<()> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ListParams;

    let fx = fixture("metadata").await?;
    // An owner in the Lease's namespace, as the operator's Deployment would be.
    let owner = Api::<ConfigMap>::namespaced(fx.admin.clone(), &fx.ns)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("operator".into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await?;
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "operator".into(),
        uid: owner.metadata.uid.context("no uid")?,
        ..OwnerReference::default()
    };
    let mut lease = fx.free_lease(|_| {}).await?;
    lease.metadata.labels = Some([("team".to_owned(), "platform".to_owned())].into());
    fx.leases.replace(LEASE, &PostParams::default(), &lease).await?;
    let config = fx
        .config("pod-a")
        .label("example.com/holder", "pod-a")
        .annotation("example.com/node", "node-1")
        .owner_reference(owner.clone());
    let a = fx.candidate(config).await?;
    let _guard = timeout(Duration::from_secs(10), a.acquire()).await??;
    let found = fx
        .leases
        .list(&ListParams::default().labels("example.com/holder=pod-a"))
        .await?;
    ensure!(
        found.items.len() == 1,
        "the label selector found {} leases",
        found.items.len()
    );
    let meta = &found.items[0].metadata;
    let labels = meta.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("team").map(String::as_str),
        Some("platform"),
        "{labels:?}"
    );
    assert_eq!(
        meta.annotations
            .clone()
            .unwrap_or_default()
            .get("example.com/node")
            .map(String::as_str),
        Some("node-1")
    );
    assert_eq!(meta.owner_references.clone().unwrap_or_default(), vec![owner]);
    Ok(())
}
