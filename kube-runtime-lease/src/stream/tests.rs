//! Tests of the stream adapter, shared leases, rejoining and shutdown, on the
//! in-memory Lease API double with paused time.

use std::{
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::{FutureExt, Stream, StreamExt, poll, stream};
use tokio::time::{Instant, sleep};

use crate::{
    LeaderElectionStreamExt, Lost, WithLeaderElection,
    test_util::FakeLeaseApi,
    tests::{
        runtime::paused_runtime,
        support::{busy, config, count, elector, free, paused, taken_by},
    },
};

const S: fn(u64) -> Duration = Duration::from_secs;

/// A stream of ticks that counts its polls and flags its drop.
struct Probe {
    polls: Arc<AtomicUsize>,
    dropped: Arc<AtomicBool>,
}

impl Probe {
    fn start() -> (
        impl Stream<Item = usize> + Send + 'static,
        Arc<AtomicUsize>,
        Arc<AtomicBool>,
    ) {
        let polls = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicBool::new(false));
        let probe = Probe {
            polls: polls.clone(),
            dropped: dropped.clone(),
        };
        let s = stream::unfold(probe, |p| async move {
            let n = p.polls.fetch_add(1, Ordering::SeqCst);
            sleep(Duration::from_millis(100)).await;
            Some((n, p))
        });
        (s, polls, dropped)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

fn assert_send<T: Send>(_: &T) {}

#[test]
fn the_inner_stream_is_not_polled_before_acquisition() {
    paused(async {
        let fake = free();
        let (holder, _) = elector(&fake, config("holder"));
        let held = holder.acquire().await.unwrap();
        let (e, _) = elector(&fake, config("me"));
        let (probe, polls, _) = Probe::start();
        let mut guarded = pin!(probe.with_leader_election(&e));
        assert!(tokio::time::timeout(S(30), guarded.next()).await.is_err());
        assert_eq!(polls.load(Ordering::SeqCst), 0);
        assert!(!guarded.is_leading());
        drop(held);
        assert_eq!(guarded.next().await, Some(0));
        assert!(guarded.is_leading());
        assert!(guarded.guard().unwrap().is_valid());
    });
}

#[test]
fn the_inner_stream_is_dropped_as_soon_as_leadership_is_lost() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let (probe, _, dropped) = Probe::start();
        let guarded = probe.with_leader_election(&e);
        assert_send(&guarded);
        let mut guarded = pin!(guarded);
        let start = Instant::now();
        assert_eq!(guarded.next().await, Some(0));
        fake.partition(id, true);
        let mut items = 0;
        while guarded.next().await.is_some() {
            items += 1;
        }
        assert_eq!(
            start.elapsed(),
            S(10),
            "at the renew deadline after the acquisition was sent"
        );
        assert!(items >= 90, "ran until then: {items}");
        assert!(dropped.load(Ordering::SeqCst));
        assert!(guarded.get_ref().is_none());
        assert!(guarded.is_stopped());
        assert_eq!(guarded.lost(), Some(Lost::RenewDeadlineExceeded));
        assert_eq!(guarded.next().await, None, "fused");
    });
}

#[test]
fn a_takeover_drops_the_inner_stream_in_the_same_instant() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let (probe, _, dropped) = Probe::start();
        let mut guarded = pin!(probe.with_leader_election(&e));
        guarded.next().await;
        sleep(Duration::from_millis(350)).await;
        let mut l = fake.lease().unwrap();
        l.spec.as_mut().unwrap().holder_identity = Some("thief".into());
        fake.put(l);
        let start = Instant::now();
        while guarded.next().await.is_some() {}
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(dropped.load(Ordering::SeqCst));
        assert_eq!(guarded.lost(), Some(taken_by("thief")));
    });
}

/// Counts its wakes.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl futures::task::ArcWake for CountingWaker {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The adapter skips re-registering with the guard when polled again with the
/// same waker; a new waker must still be registered, and woken at the loss.
#[test]
fn an_idle_stream_is_woken_at_the_loss_by_the_waker_it_was_last_polled_with() {
    paused(async {
        for switch_waker in [false, true] {
            let fake = free();
            let (e, _) = elector(&fake, config("me"));
            let mut guarded = pin!(stream::pending::<()>().with_leader_election(&e));
            let (a, b) = (
                Arc::new(CountingWaker::default()),
                Arc::new(CountingWaker::default()),
            );
            let (wa, wb) = (futures::task::waker(a.clone()), futures::task::waker(b.clone()));
            for _ in 0..100 {
                if guarded.is_leading() {
                    break;
                }
                assert!(
                    guarded
                        .as_mut()
                        .poll_next(&mut Context::from_waker(&wa))
                        .is_pending()
                );
                sleep(Duration::from_millis(1)).await;
            }
            assert!(guarded.is_leading());
            let (last, last_count) = if switch_waker { (&wb, &b) } else { (&wa, &a) };
            assert!(
                guarded
                    .as_mut()
                    .poll_next(&mut Context::from_waker(&wa))
                    .is_pending()
            );
            assert!(
                guarded
                    .as_mut()
                    .poll_next(&mut Context::from_waker(last))
                    .is_pending()
            );
            let before = last_count.0.load(Ordering::SeqCst);
            let mut l = fake.lease().unwrap();
            l.spec.as_mut().unwrap().holder_identity = Some("thief".into());
            fake.put(l);
            let start = Instant::now();
            for _ in 0..1000 {
                if last_count.0.load(Ordering::SeqCst) > before {
                    break;
                }
                sleep(Duration::from_millis(1)).await;
            }
            assert!(
                last_count.0.load(Ordering::SeqCst) > before,
                "woken at the loss (switch_waker: {switch_waker})"
            );
            assert!(
                start.elapsed() <= Duration::from_millis(1),
                "{:?}",
                start.elapsed()
            );
            assert_eq!(
                guarded.as_mut().poll_next(&mut Context::from_waker(last)),
                Poll::Ready(None)
            );
            assert_eq!(guarded.lost(), Some(taken_by("thief")));
        }
    });
}

#[test]
fn a_slow_consumer_keeps_the_lease() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let (probe, polls, dropped) = Probe::start();
        let mut guarded = pin!(probe.with_leader_election(&e));
        guarded.next().await;
        sleep(S(31)).await; // three renew deadlines without a poll
        assert!(e.is_leader());
        assert!(guarded.guard().unwrap().is_valid());
        assert_eq!(guarded.next().await, Some(1));
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        assert!(!dropped.load(Ordering::SeqCst));
    });
}

#[test]
fn streams_sharing_a_lease_start_and_stop_together_with_one_renewal_loop() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let (holder, _) = elector(&fake, config("holder"));
        let held = holder.acquire().await.unwrap();
        let (a, a_polls, a_dropped) = Probe::start();
        let (b, b_polls, b_dropped) = Probe::start();
        let a = a.with_leader_election(&e);
        let b = b.with_leader_election(&e);
        let (a_task, b_task) = (
            tokio::spawn(async move {
                let mut a = pin!(a);
                while a.next().await.is_some() {}
                a.lost()
            }),
            tokio::spawn(async move {
                let mut b = pin!(b);
                while b.next().await.is_some() {}
                b.lost()
            }),
        );
        sleep(S(5)).await;
        assert_eq!(
            a_polls.load(Ordering::SeqCst) + b_polls.load(Ordering::SeqCst),
            0,
            "neither starts before acquisition"
        );
        drop(held);
        sleep(Duration::from_millis(50)).await;
        assert_eq!(
            (a_polls.load(Ordering::SeqCst), b_polls.load(Ordering::SeqCst)),
            (1, 1),
            "both start together"
        );
        let since = Instant::now();
        sleep(S(20)).await;
        let updates = fake
            .requests()
            .iter()
            .filter(|s| s.client == id && s.verb == "update" && s.at > since)
            .count();
        assert_eq!(updates, 10, "one renewal loop for both streams");
        fake.delete();
        let (a_lost, b_lost) = (a_task.await.unwrap(), b_task.await.unwrap());
        assert_eq!(a_lost, Some(Lost::Deleted));
        assert_eq!(b_lost, Some(Lost::Deleted));
        assert!(a_dropped.load(Ordering::SeqCst) && b_dropped.load(Ordering::SeqCst));
    });
}

#[test]
fn a_second_lease_in_the_same_process_is_independent() {
    paused(async {
        let (fake1, fake2) = (free(), free());
        let (e1, id1) = elector(&fake1, config("me"));
        let (e2, _) = elector(&fake2, config("me"));
        let (p1, _, d1) = Probe::start();
        let (p2, _, d2) = Probe::start();
        let mut s1 = pin!(p1.with_leader_election(&e1));
        let mut s2 = pin!(p2.with_leader_election(&e2));
        s1.next().await;
        s2.next().await;
        fake1.partition(id1, true);
        while s1.next().await.is_some() {}
        assert!(d1.load(Ordering::SeqCst));
        assert!(s2.next().await.is_some());
        assert!(!d2.load(Ordering::SeqCst));
        assert!(e2.is_leader() && !e1.is_leader());
    });
}

#[test]
fn the_inner_stream_ending_releases_the_lease() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let mut guarded = pin!(stream::iter([1, 2, 3]).with_leader_election(&e));
        let items: Vec<_> = guarded.as_mut().collect().await;
        assert_eq!(items, [1, 2, 3]);
        assert_eq!(guarded.lost(), None, "ended on its own, not lost");
        assert!(guarded.is_stopped());
        sleep(Duration::from_millis(1)).await;
        let spec = fake.lease().unwrap().spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(""));
        assert!(!e.is_leader());
    });
}

/// `run_each_term` of the work `make` builds, spawned: how many times the
/// work was built (once per campaign), and the task.
fn run_counting_terms<S: Stream + Send + 'static>(
    e: &crate::LeaderElector,
    make: impl Fn() -> S + Send + Sync + 'static,
) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<crate::RunEnded>) {
    let terms = Arc::new(AtomicUsize::new(0));
    let runner = tokio::spawn({
        let (e, terms) = (e.clone(), terms.clone());
        async move {
            e.run_each_term(|| {
                terms.fetch_add(1, Ordering::SeqCst);
                make()
            })
            .await
        }
    });
    (terms, runner)
}

#[test]
fn run_each_term_rejoins_after_a_loss_and_returns_on_shutdown() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let (terms, runner) = run_counting_terms(&e, || {
            stream::repeat(()).then(|()| sleep(Duration::from_millis(100)))
        });
        sleep(S(1)).await;
        assert!(e.is_leader());
        assert_eq!(terms.load(Ordering::SeqCst), 1);
        fake.partition(id, true);
        sleep(S(10)).await;
        assert!(!e.is_leader(), "lost at the renew deadline");
        fake.partition(id, false);
        let start = Instant::now();
        let mut rx = e.subscribe();
        rx.wait_for(|s| s.is_leader).await.unwrap();
        assert!(
            start.elapsed() <= S(15),
            "rejoined after a bounded backoff: {:?}",
            start.elapsed()
        );
        assert_eq!(terms.load(Ordering::SeqCst), 2, "the work was built again");
        e.shutdown(S(1)).await.unwrap();
        assert_eq!(runner.await.unwrap(), crate::RunEnded::Shutdown);
    });
}

/// After a loss, `run_each_term` waits its backoff (at least the retry
/// period, its first delay) before it builds the work again and campaigns,
/// so that a candidate losing again and again does not hammer the API
/// server (mutation testing: kills `wait_to_rejoin -> true`).
#[test]
fn run_each_term_waits_its_backoff_before_rejoining() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let (terms, runner) = run_counting_terms(&e, stream::pending::<()>);
        let mut status = e.subscribe();
        tokio::time::timeout(S(5), status.wait_for(|s| s.is_leader))
            .await
            .expect("led")
            .unwrap();
        fake.partition(id, true);
        tokio::time::timeout(S(15), status.wait_for(|s| !s.is_leader))
            .await
            .expect("lost at the renew deadline")
            .unwrap();
        fake.partition(id, false);
        // Less than the retry period (2 s), the backoff's shortest delay.
        sleep(Duration::from_millis(1900)).await;
        assert_eq!(
            terms.load(Ordering::SeqCst),
            1,
            "built the work again within 1.9 s of the loss, before the backoff's first delay"
        );
        tokio::time::timeout(S(30), status.wait_for(|s| s.is_leader))
            .await
            .expect("rejoined after its backoff")
            .unwrap();
        assert_eq!(terms.load(Ordering::SeqCst), 2, "the work was built again");
        runner.abort();
    });
}

/// The rejoin's backoff keeps its documented bound: no wait longer than the
/// lease duration. backon's jitter adds up to 100 % to each delay, so once
/// the delays reached their cap (the lease duration) they were drawn from
/// one to two lease durations: a single replica that lost a few terms in a
/// row left the Lease without a leader up to twice as long as documented.
#[test]
fn the_rejoin_backoff_waits_at_most_the_lease_duration() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let lease_duration = e.config().lease_duration;
        let mut backoff = e.config().retry_backoff();
        // The first delays grow from the retry period; the rest are capped.
        let mut waited = Duration::ZERO;
        for draw in 0..20 {
            let start = Instant::now();
            assert!(e.wait_to_rejoin(&mut backoff, &"a loss").await, "no shutdown");
            waited = start.elapsed();
            assert!(
                waited <= lease_duration,
                "delay {draw} of the rejoin backoff was {waited:?}, longer than the lease duration {lease_duration:?}"
            );
        }
        // And they reach it (mutation testing: kills a cap at the retry period).
        assert!(
            waited >= lease_duration,
            "the last delay of the rejoin backoff was {waited:?}, short of the lease duration {lease_duration:?}"
        );
    });
}

/// A shutdown while `run_each_term` waits to rejoin after a loss ends the
/// wait: it returns at once, not after the backoff.
#[test]
fn run_each_term_returns_at_once_on_a_shutdown_during_its_backoff() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let runner = tokio::spawn({
            let e = e.clone();
            async move { e.run_each_term(stream::pending::<()>).await }
        });
        sleep(S(1)).await;
        assert!(e.is_leader());
        fake.partition(id, true);
        // Lost at the renew deadline (10 s); the backoff then runs.
        sleep(Duration::from_millis(10_500)).await;
        assert!(!e.is_leader());
        // Less than the shortest backoff (the retry period, 2 s) has passed.
        let shutting = tokio::spawn({
            let e = e.clone();
            async move { e.shutdown(S(1)).await }
        });
        let ended = tokio::time::timeout(Duration::from_millis(100), runner)
            .await
            .expect("run_each_term still waits out its backoff after the shutdown")
            .unwrap();
        assert_eq!(ended, crate::RunEnded::Shutdown);
        fake.partition(id, false);
        tokio::time::timeout(S(60), shutting)
            .await
            .expect("shutdown is bounded")
            .unwrap()
            .unwrap();
    });
}

#[test]
fn run_each_term_returns_when_the_work_ends() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        assert_eq!(
            e.run_each_term(|| stream::iter([1, 2])).await,
            crate::RunEnded::WorkEnded
        );
    });
}

#[test]
fn graceful_shutdown_lets_work_finish_then_hands_over_at_once() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let finished = Arc::new(AtomicBool::new(false));
        // Work that stops taking new items on the shutdown signal and finishes the one in flight.
        let work = {
            let finished = finished.clone();
            stream::repeat(())
                .then(|()| sleep(S(1)))
                .take_until(e.shutdown_requested())
                .chain(stream::once(async move {
                    sleep(S(2)).await;
                    finished.store(true, Ordering::SeqCst);
                }))
        };
        let mut guarded = Box::pin(work.with_leader_election(&e));
        guarded.next().await;
        let consumer = tokio::spawn(async move { while guarded.next().await.is_some() {} });
        let (standby, _) = elector(&fake, config("standby"));
        let mut standby_acquire = Box::pin(standby.acquire());
        assert!(poll!(&mut standby_acquire).is_pending());
        let start = Instant::now();
        e.shutdown(S(20)).await.unwrap();
        assert_eq!(
            start.elapsed(),
            S(2),
            "work in flight finished within the grace period"
        );
        assert!(finished.load(Ordering::SeqCst));
        consumer.await.unwrap();
        let g = standby_acquire.await.unwrap();
        assert_eq!(start.elapsed(), S(2), "standby took over at once");
        assert!(g.is_valid());
    });
}

// Compile-time: the adapters are Send where their inner streams are (never
// run: `the_adapters_are_send` names them, so they are type-checked).
#[allow(clippy::needless_pass_by_value)]
fn adapters_are_send(e: crate::LeaderElector, s: impl Stream<Item = ()> + Send) {
    fn is_send<T: Send>(_: T) {}
    is_send(s.with_leader_election(&e));
}

#[allow(unused_must_use)]
fn controller_adapter_is_send(
    e: &crate::LeaderElector,
    api: kube_client::Api<k8s_openapi::api::core::v1::ConfigMap>,
) {
    use kube_runtime::{Controller, controller::Action, watcher};

    use crate::LeaderElectionControllerExt;
    fn is_send<T: Send>(t: T) -> T {
        t
    }
    let s: WithLeaderElection<_> = Controller::new(api, watcher::Config::default())
        .with_leader_election(e)
        .run(
            |_, _| async { Ok::<_, std::io::Error>(Action::await_change()) },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        );
    is_send(s);
}

/// `T` can be given to `tokio::spawn` (as kube-runtime's own Controller
/// stream can).
fn spawnable<T: Send + 'static>(t: T) -> T {
    t
}

// Compile-time: the rest of the public futures and streams are `Send` where
// their inputs are (`Send + 'static` too where they own what they use, so
// that `tokio::spawn` takes them), the handles are `Send + Sync + Unpin`,
// and the errors are `Send + Sync + 'static` (`anyhow`, `Box<dyn Error +
// Send + Sync>`). Never run: `the_adapters_are_send` names it.
#[allow(unused_must_use, clippy::needless_pass_by_value)]
fn the_public_futures_are_send(
    e: crate::LeaderElector,
    guard: crate::LeaseGuard,
    api: kube_client::Api<k8s_openapi::api::core::v1::ConfigMap>,
    client: kube_client::Client,
) {
    use kube_runtime::{Controller, controller::Action, watcher};

    use crate::{
        AcquireError, ApiError, ConfigError, HealthError, LeaderElectionControllerExt, LeaseObserver,
        ShutdownError,
    };
    fn is_send<T: Send>(t: T) -> T {
        t
    }
    fn handle<T: Send + Sync + Unpin + std::fmt::Debug + 'static>(_: &T) {}
    fn error<E: std::error::Error + Send + Sync + 'static>() {}
    fn reconcile<K>(_: Arc<K>, _: Arc<()>) -> futures::future::Ready<Result<Action, std::io::Error>> {
        futures::future::ok(Action::await_change())
    }
    fn policy<K>(_: Arc<K>, _: &std::io::Error, _: Arc<()>) -> Action {
        Action::await_change()
    }
    let controller = || Controller::new(api.clone(), watcher::Config::default());

    handle(&e);
    handle(&spawnable(e.acquire()));
    spawnable(e.shutdown_requested());
    is_send(e.shutdown(Duration::ZERO));
    is_send(e.with_lease(std::future::ready(())));
    is_send(e.run_each_term(stream::pending::<()>));
    is_send(e.run_each_term(|| stream::repeat_with(|| std::rc::Rc::new(()))));
    is_send(e.with_lease(async { std::rc::Rc::new(()) }));
    handle(&guard);
    spawnable(guard.lost_signal());
    let mut tasks = spawnable(guard.tasks::<()>());
    is_send(tasks.join_next());
    is_send(tasks.shutdown());
    spawnable(guard);
    handle(&LeaseObserver::new(client.clone(), "default", "lease").unwrap());
    // As kube-runtime's own, for every resource a Controller runs on:
    // dynamic objects too.
    let resource = kube_client::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
    let dynamic = kube_client::Api::<kube_client::api::DynamicObject>::all_with(client.clone(), &resource);
    spawnable(
        Controller::new_with(dynamic, watcher::Config::default(), resource)
            .with_leader_election(&e)
            .run(reconcile, policy, Arc::new(())),
    );
    #[cfg(feature = "warm-standby")]
    spawnable(
        controller()
            .with_leader_election_warm(&e)
            .run(reconcile, policy, Arc::new(())),
    );
    #[cfg(feature = "unstable-shards")]
    {
        let config = crate::shard::ShardConfig::new(config("me"), 2);
        let sharded = crate::shard::ShardedElector::new(client.clone(), config).unwrap();
        handle(&sharded);
        is_send(sharded.run());
        is_send(sharded.shutdown(Duration::ZERO));
        let _: &dyn std::fmt::Debug = &spawnable(sharded.controller(controller()));
        spawnable(
            sharded
                .controller(controller())
                .run(reconcile, policy, Arc::new(())),
        );
    }
    #[cfg(feature = "metrics")]
    handle(&crate::metrics::LeaseMetrics::register(
        &mut prometheus_client::registry::Registry::default(),
    ));
    handle(&FakeLeaseApi::default());
    error::<AcquireError>();
    error::<ShutdownError>();
    error::<ApiError>();
    error::<ConfigError>();
    error::<HealthError>();
    error::<Lost>();
    let _ = (controller, client);
}

#[test]
fn the_adapters_are_send() {
    let _: fn(crate::LeaderElector, futures::stream::Pending<()>) = adapters_are_send;
    let _: fn(&crate::LeaderElector, kube_client::Api<k8s_openapi::api::core::v1::ConfigMap>) =
        controller_adapter_is_send;
    let _: fn(
        crate::LeaderElector,
        crate::LeaseGuard,
        kube_client::Api<k8s_openapi::api::core::v1::ConfigMap>,
        kube_client::Client,
    ) = the_public_futures_are_send;
}

/// The election task stops without a shutdown when the runtime it was spawned
/// on shuts down: every guard of the term ends as `ElectorStopped`, and what
/// waited to lead ends with `ElectorStopped` too, not as if shut down (which
/// `run_each_term` and a campaign loop read as "leave the election").
#[test]
fn a_runtime_shut_down_under_the_election_ends_everything_as_elector_stopped() {
    let fake = free();
    let first = paused_runtime();
    let (leader, guard, acquiring, mut guarded) = first.block_on(async {
        let (leader, _) = elector(&fake, config("leader"));
        let guard = leader.acquire().await.unwrap();
        let (follower, _) = elector(&fake, config("follower"));
        let mut acquiring = Box::pin(follower.acquire());
        assert!(poll!(&mut acquiring).is_pending());
        let mut guarded = Box::pin(stream::pending::<()>().with_leader_election(&follower));
        assert!(poll!(guarded.next()).is_pending());
        (leader, guard, acquiring, guarded)
    });
    assert!(leader.is_leader() && guard.is_valid());
    drop(first);
    assert!(!leader.is_leader());
    assert_eq!(guard.lost(), Some(Lost::ElectorStopped));
    // Everything is ready at once (polled once each: a regression fails
    // instead of hanging).
    let second = tokio::runtime::Builder::new_current_thread().build().unwrap();
    second.block_on(async {
        let mut guard = guard;
        assert_eq!(poll!(&mut guard), Poll::Ready(Lost::ElectorStopped));
        let mut acquiring = acquiring;
        assert!(matches!(
            poll!(&mut acquiring),
            Poll::Ready(Err(crate::AcquireError::ElectorStopped))
        ));
        assert_eq!(poll!(guarded.next()), Poll::Ready(None));
    });
    assert_eq!(guarded.lost(), Some(Lost::ElectorStopped));
}

/// Polling `acquire` outside a runtime is a programming error (the elector
/// spawns its task on the runtime that polls it): it panics, as `tokio::spawn`
/// does, with a message that says so, and leaves the elector usable.
#[test]
fn acquire_polled_outside_a_runtime_panics_and_leaves_the_elector_usable() {
    let fake = free();
    let rt = paused_runtime();
    let (e, _) = rt.block_on(async { elector(&fake, config("me")) });
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut acquire = pin!(e.acquire());
        let _ = acquire
            .as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()));
    }))
    .unwrap_err();
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("within a Tokio runtime"), "{message:?}");
    let guard = rt
        .block_on(async { tokio::time::timeout(S(60), e.acquire()).await })
        .expect("no waiter left behind for a task that never ran")
        .unwrap();
    assert!(guard.is_valid());
}

/// A runtime that shut down must not let the next election task start before
/// the previous one finished releasing, on whichever runtimes they run: two
/// tasks of one identity at once could each believe the Lease theirs, and
/// the old one's release would free the new one's term.
#[test]
fn a_task_lost_with_its_runtime_does_not_let_the_next_one_overtake_a_release() {
    let fake = free();
    let main = paused_runtime();
    let (e, id) = main.block_on(async {
        let (e, id) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        // The release's read takes 3 s (within the release timeout).
        fake.fault(id, Some("get"), crate::test_util::Fault::DelayRequest(S(3)));
        drop(guard);
        sleep(Duration::from_millis(1)).await;
        (e, id)
    });
    let released_from = fake.requests().len();
    // Leadership wanted on another runtime, which shuts down before its task runs.
    let other = paused_runtime();
    other.block_on(async {
        let mut acquire = pin!(e.acquire());
        assert!(poll!(&mut acquire).is_pending());
    });
    drop(other);
    // Wanted again: the new task waits for the release still in flight.
    let valid = main.block_on(async { e.acquire().await.unwrap().is_valid() });
    assert!(valid);
    let verbs: Vec<&str> = fake.requests()[released_from..]
        .iter()
        .filter(|s| s.client == id)
        .map(|s| s.verb)
        .collect();
    assert_eq!(
        verbs.first(),
        Some(&"update"),
        "the release's write comes before any request of the next task: {verbs:?}"
    );
    assert_eq!(
        fake.lease().unwrap().spec.unwrap().lease_transitions,
        Some(2),
        "released, then taken again"
    );
}

/// Polled in the context of a runtime that has shut down (a handle that
/// outlived it), `acquire` cannot start its task: the runtime drops it at once.
/// It fails with `ElectorStopped` instead of deadlocking on its own state.
#[test]
fn acquire_on_a_runtime_that_shut_down_fails_instead_of_deadlocking() {
    let fake = free();
    let rt = paused_runtime();
    let (e, _) = rt.block_on(async { elector(&fake, config("me")) });
    let handle = rt.handle().clone();
    drop(rt);
    // On its own thread, so that a deadlock fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _runtime = handle.enter();
        let mut acquire = pin!(e.acquire());
        let polled = acquire
            .as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()));
        let _ = tx.send(matches!(
            polled,
            Poll::Ready(Err(crate::AcquireError::ElectorStopped))
        ));
    });
    let failed = rx
        .recv_timeout(S(30))
        .expect("acquire deadlocked on a runtime that shut down");
    assert!(failed, "acquire must fail with ElectorStopped");
}

/// An idle guarded stream ends on the guard's own timer at the renew
/// deadline, also after a renewal moved the deadline and when no elector
/// task will ever end the term (the term is set by hand: no task runs): the
/// timer set for the old deadline must be set again for the new one.
#[test]
fn an_idle_guarded_stream_ends_at_a_moved_deadline_on_its_own_timer() {
    paused(async {
        use crate::term::Term;

        let (e, _) = elector(&free(), config("me"));
        let started = Instant::now();
        let term = Arc::new(Term::new(1, started, S(10)));
        e.set_term_for_test(term.clone());
        let mut guarded = pin!(stream::pending::<()>().with_leader_election(&e));
        assert!(poll!(guarded.next()).is_pending(), "leads, idle");
        sleep(S(5)).await;
        assert!(
            term.renewed(Instant::now(), S(10)),
            "renewed: the deadline is now +15 s"
        );
        let ended = tokio::time::timeout(S(30), guarded.next()).await;
        assert_eq!(ended, Ok(None), "the stream did not end at the renew deadline");
        assert_eq!(started.elapsed(), S(15));
        assert_eq!(guarded.lost(), Some(Lost::RenewDeadlineExceeded));
    });
}

/// The check before each poll of the inner stream reads no clock: an idle
/// guarded stream whose guard's timer fired at the renew deadline ends
/// without polling its inner stream again (no elector task ends the term
/// here: it is set by hand). A timer that fired at a deadline a renewal has
/// since moved does not end it.
#[test]
fn a_fired_timer_ends_an_idle_stream_without_polling_its_inner_stream_again() {
    paused(async {
        use crate::term::Term;

        let (e, _) = elector(&free(), config("me"));
        let term = Arc::new(Term::new(1, Instant::now(), S(10)));
        e.set_term_for_test(term.clone());
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = {
            let polls = polls.clone();
            stream::poll_fn(move |_| {
                polls.fetch_add(1, Ordering::SeqCst);
                Poll::<Option<()>>::Pending
            })
        };
        let mut guarded = pin!(counted.with_leader_election(&e));
        assert!(poll!(guarded.next()).is_pending(), "leads, idle");
        sleep(S(5)).await;
        assert!(term.renewed(Instant::now(), S(10)), "the deadline is now +15 s");
        // The timer set for the old deadline fires at +10 s: not the end.
        sleep(S(6)).await;
        assert!(
            poll!(guarded.next()).is_pending(),
            "ended at a deadline a renewal had moved"
        );
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        // Its timer, set again for +15 s, fires: the end, the inner stream
        // not polled again.
        sleep(S(5)).await;
        assert_eq!(poll!(guarded.next()), Poll::Ready(None));
        assert_eq!(
            polls.load(Ordering::SeqCst),
            2,
            "the inner stream was polled after the deadline"
        );
        assert_eq!(guarded.lost(), Some(Lost::RenewDeadlineExceeded));
    });
}

/// A guard polled by hand outside any runtime (no timers to set) waits for
/// the elector task instead of panicking; its `Debug` names its term.
#[test]
fn a_guard_polled_outside_a_runtime_is_pending_and_debug_names_its_term() {
    let rt = paused_runtime();
    let (e, _) = rt.block_on(async { elector(&free(), config("me")) });
    let mut guard = rt.block_on(e.acquire()).unwrap();
    assert!(format!("{guard:?}").contains("fencing_token: 1"), "{guard:?}");
    let polled = std::thread::spawn(move || {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let pending = std::pin::Pin::new(&mut guard).poll(&mut cx).is_pending();
        (pending, guard)
    })
    .join()
    .expect("polling a guard outside a runtime panicked");
    assert!(polled.0);
    drop(rt);
}

/// A pause inside the inner stream's poll (SIGSTOP, a frozen VM: seen in the
/// failover suite) can let the renew deadline pass while the inner stream
/// makes an item: the item is not handed out, the stream ends.
#[test]
fn an_item_made_while_the_deadline_passed_is_not_handed_out() {
    paused(async {
        use crate::term::Term;

        let (e, _) = elector(&free(), config("me"));
        let term = Arc::new(Term::new(1, Instant::now(), S(10)));
        e.set_term_for_test(term.clone());
        let pausing = {
            let term = term.clone();
            stream::poll_fn(move |_| {
                term.expire_for_test();
                Poll::Ready(Some(1))
            })
        };
        let mut guarded = pin!(pausing.with_leader_election(&e));
        assert_eq!(
            guarded.next().await,
            None,
            "handed out an item made after the deadline"
        );
        assert_eq!(guarded.lost(), Some(Lost::RenewDeadlineExceeded));
    });
}

/// The accessors follow the stream's life: the inner stream is there until
/// it is dropped, and `is_stopped` turns true only at the end.
#[test]
fn the_accessors_follow_the_streams_life() {
    paused(async {
        let (e, _) = elector(&free(), config("me"));
        let mut guarded = pin!(stream::iter([1, 2]).with_leader_election(&e));
        assert!(!guarded.is_stopped() && !guarded.is_leading());
        assert!(guarded.get_ref().is_some());
        assert!(guarded.as_mut().get_pin_mut().is_some());
        assert_eq!(guarded.next().await, Some(1));
        assert!(guarded.is_leading() && !guarded.is_stopped());
        assert!(guarded.guard().is_some());
        assert_eq!(guarded.next().await, Some(2));
        assert_eq!(guarded.next().await, None);
        assert!(guarded.is_stopped() && !guarded.is_leading());
        assert!(
            guarded.get_ref().is_none(),
            "the inner stream is dropped at the end"
        );
        assert!(guarded.as_mut().get_pin_mut().is_none());
    });
}

/// `get_mut` reaches the inner stream itself while it lives: what is taken
/// from it there is not handed out again.
#[test]
fn get_mut_reaches_the_inner_stream_itself() {
    paused(async {
        let (e, _) = elector(&free(), config("me"));
        let mut guarded = stream::iter([1, 2, 3]).with_leader_election(&e);
        let taken = guarded
            .get_mut()
            .expect("the inner stream lives before the first poll")
            .next()
            .now_or_never();
        assert_eq!(taken, Some(Some(1)), "get_mut gave the inner stream itself");
        let mut guarded = pin!(guarded);
        assert_eq!(
            guarded.next().await,
            Some(2),
            "the item taken through get_mut is gone"
        );
        assert_eq!(guarded.next().await, Some(3));
        assert_eq!(guarded.next().await, None);
    });
}

/// `into_inner` gives the inner stream back, where it stands, until the
/// guarded stream dropped it (mutation testing: kills `into_inner -> None`).
#[test]
fn into_inner_gives_the_inner_stream_back_until_it_was_dropped() {
    paused(async {
        let (e, _) = elector(&free(), config("me"));
        let mut guarded = stream::iter([1, 2, 3]).with_leader_election(&e);
        assert_eq!(guarded.next().await, Some(1));
        let mut inner = guarded.into_inner().expect("the inner stream, not dropped yet");
        assert_eq!(inner.next().await, Some(2), "where the guarded stream left it");
        let mut ended = stream::iter([1]).with_leader_election(&e);
        assert_eq!(ended.next().await, Some(1));
        assert_eq!(ended.next().await, None);
        assert!(ended.into_inner().is_none(), "dropped when it ended");
    });
}

/// A guarded stream is a `FusedStream` that is terminated exactly once it
/// stopped (what `select!` relies on to skip it), not before.
#[test]
fn a_guarded_stream_is_terminated_only_once_it_stopped() {
    use futures::stream::FusedStream;

    paused(async {
        let (e, _) = elector(&free(), config("me"));
        let mut guarded = pin!(stream::iter([1]).with_leader_election(&e));
        assert!(!guarded.is_terminated(), "terminated before the first poll");
        assert_eq!(guarded.next().await, Some(1));
        assert!(!guarded.is_terminated(), "terminated while leading");
        assert_eq!(guarded.next().await, None);
        assert!(guarded.is_terminated(), "not terminated after it ended");
    });
}

/// `Debug` shows whether the stream leads, whether it stopped, and why
/// leadership ended.
#[test]
fn debug_shows_whether_a_guarded_stream_leads_and_why_it_stopped() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let mut guarded = pin!(stream::pending::<()>().with_leader_election(&e));
        let before = format!("{guarded:?}");
        assert!(
            before.starts_with("WithLeaderElection") && before.contains("leading: false"),
            "{before}"
        );
        assert!(poll!(guarded.next()).is_pending());
        sleep(S(1)).await;
        assert!(poll!(guarded.next()).is_pending());
        let leading = format!("{guarded:?}");
        assert!(
            leading.contains("leading: true") && leading.contains("stopped: false"),
            "{leading}"
        );
        fake.take_over("other");
        assert_eq!(guarded.next().await, None);
        let ended = format!("{guarded:?}");
        assert!(
            ended.contains("stopped: true") && ended.contains("TakenOver") && ended.contains("other"),
            "{ended}"
        );
    });
}

/// The off switch (`LeaseConfig::enabled(false)`): leads at once, for ever,
/// with no API call, until shutdown.
#[test]
fn a_disabled_election_leads_at_once_without_any_api_call_until_shutdown() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (e, _) = elector(&fake, config("me").enabled(false));
        assert!(!e.is_leader(), "not before it is wanted");
        let guard = e.acquire().await.unwrap();
        assert!(e.is_leader());
        assert_eq!(guard.fencing_token(), 0);
        assert_eq!(e.status().holder.as_deref(), Some("me"));
        // Half an hour later: still the same term, and healthy; the guard has
        // no deadline for paused time to jump to.
        let mut guard = guard;
        assert!(tokio::time::timeout(S(1800), &mut guard).await.is_err());
        assert!(guard.is_valid() && guard.lost().is_none());
        assert_eq!(guard.time_left(), Duration::MAX);
        assert!(e.health_check(Duration::ZERO).is_ok());
        let again = e.acquire().await.unwrap();
        drop(again);
        // A guarded stream runs, and a dropped guard gives nothing up.
        let items: Vec<_> = stream::iter([1, 2, 3]).with_leader_election(&e).collect().await;
        assert_eq!(items, [1, 2, 3]);
        drop(guard);
        sleep(S(60)).await;
        assert!(e.is_leader());
        let guard = e.acquire().await.unwrap();
        let run = tokio::spawn({
            let e = e.clone();
            async move { e.run_each_term(stream::pending::<()>).await }
        });
        e.shutdown(S(1)).await.unwrap();
        assert_eq!(guard.await, Lost::Shutdown);
        assert_eq!(run.await.unwrap(), crate::RunEnded::Shutdown);
        assert!(!e.is_leader());
        assert!(matches!(e.acquire().await, Err(crate::AcquireError::Shutdown)));
        assert!(fake.requests().is_empty(), "{:?}", fake.requests());
        assert!(fake.lease().is_none());
    });
}

/// `run_each_term` over a guarded stream (what its docs recommend
/// for a Controller, and what the operator example does): the inner adapter
/// sees the renew deadline pass on its clock (a pause while its stream made
/// an item) and ends, with its `lost`; the outer one must not take that end
/// for work that ended on its own (`WorkEnded`, the election left for good),
/// but campaign again.
#[test]
fn run_each_term_over_a_guarded_stream_rejoins_when_the_inner_adapter_sees_the_deadline() {
    paused(async {
        use crate::term::Term;

        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let term = Arc::new(Term::new(1, Instant::now(), S(10)));
        e.set_term_for_test(term.clone());
        let built = Arc::new(AtomicUsize::new(0));
        let run = tokio::spawn({
            let (e, built) = (e.clone(), built.clone());
            async move {
                e.run_each_term(|| {
                    let first = built.fetch_add(1, Ordering::SeqCst) == 0;
                    let term = term.clone();
                    let pausing = stream::poll_fn(move |_| {
                        if first {
                            term.expire_for_test();
                            Poll::Ready(Some(1))
                        } else {
                            Poll::Pending
                        }
                    });
                    pausing.with_leader_election(&e)
                })
                .await
            }
        });
        sleep(S(30)).await;
        assert!(
            !run.is_finished(),
            "run_each_term returned {:?} after a loss (the renew deadline passed), \
             instead of campaigning again; built {} time(s)",
            run.await.unwrap(),
            built.load(Ordering::SeqCst)
        );
        assert_eq!(built.load(Ordering::SeqCst), 2, "campaigned again");
        assert!(e.is_leader(), "leads again");
    });
}

/// `run_each_term` through many terms, each taken over by someone else
/// (who then stops renewing), leaves nothing behind: each term costs the
/// same tasks as the one before it.
#[test]
fn run_each_term_through_many_takeovers_keeps_its_tasks_at_a_baseline() {
    paused(async {
        let fake = free();
        let (e, _) = elector(
            &fake,
            config("me")
                .lease_duration(S(4))
                .renew_deadline(S(3))
                .retry_period(S(1)),
        );
        let (terms, _runner) = run_counting_terms(&e, || {
            stream::repeat(()).then(|()| sleep(Duration::from_millis(100)))
        });
        let metrics = tokio::runtime::Handle::current().metrics();
        let mut status = e.subscribe();
        let mut tasks = Vec::new();
        for cycle in 0..150 {
            tokio::time::timeout(S(60), status.wait_for(|s| s.is_leader))
                .await
                .unwrap_or_else(|_| panic!("cycle {cycle}: not leading 60s later"))
                .unwrap();
            sleep(S(2)).await;
            tasks.push(metrics.num_alive_tasks());
            fake.take_over("other");
            tokio::time::timeout(S(10), status.wait_for(|s| !s.is_leader))
                .await
                .unwrap_or_else(|_| panic!("cycle {cycle}: still leading 10s after a takeover"))
                .unwrap();
        }
        assert!(terms.load(Ordering::SeqCst) >= 150);
        assert_eq!(tasks[5], tasks[149], "tasks alive in each term: {tasks:?}");
    });
}

/// `is_leading` is false once the term is over, even before the stream is
/// polled again (a consumer busy elsewhere): past the renew deadline, and
/// after a takeover the elector task saw.
#[test]
fn is_leading_is_false_once_the_term_is_over_even_before_the_stream_is_polled_again() {
    for case in ["deadline", "takeover"] {
        paused(async {
            let fake = free();
            let (e, id) = elector(&fake, config("me"));
            let (probe, _, _) = Probe::start();
            let mut guarded = pin!(probe.with_leader_election(&e));
            assert_eq!(guarded.next().await, Some(0));
            assert!(guarded.is_leading());
            match case {
                "deadline" => fake.partition(id, true),
                _ => fake.take_over("other"),
            }
            // Not polled meanwhile.
            sleep(S(11)).await;
            let valid = guarded.guard().is_some_and(crate::LeaseGuard::is_valid);
            assert!(
                !guarded.is_leading(),
                "{case}: is_leading() says true though the term is over (guard valid: {valid}, e.is_leader(): {})",
                e.is_leader()
            );
        });
    }
}

/// A guarded stream that is always ready (every item made without waiting,
/// as the adapter's own example `stream::iter(0..).then(..)`), consumed by a
/// loop that never waits either: on a current-thread runtime (the default of
/// `#[tokio::main(flavor = "current_thread")]` and of `#[tokio::test]`) the
/// election task runs only when this task yields, so the adapter yields
/// within tokio's cooperative budget, as tokio's own streams do, and the
/// term is renewed while the stream runs.
#[test]
fn an_always_ready_guarded_stream_lets_the_election_task_renew_on_a_current_thread_runtime() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let busy_items = stream::repeat_with(|| busy(Duration::from_millis(1)));
        let mut guarded = pin!(busy_items.with_leader_election(&e));
        let mut start = None;
        while let Some(()) = guarded.next().await {
            let start = *start.get_or_insert_with(Instant::now);
            if start.elapsed() >= S(40) {
                break;
            }
        }
        let renewals = count(&fake, id, "update", start.unwrap());
        assert!(
            guarded.is_leading() && e.is_leader(),
            "the always-ready stream stopped ({:?}) after {:?} of work: {renewals} renewals meanwhile",
            guarded.lost(),
            start.unwrap().elapsed()
        );
        assert!(renewals >= 15, "{renewals} renewals in 40 s");
    });
}

/// Two electors (two Leases) on one `kube::Client` and one current-thread
/// runtime: a renewal of one that hangs (its answer never comes in time)
/// costs that elector its term at its renew deadline, and nothing else: the
/// other's renewals go out on time (each elector bounds its own requests,
/// and a request in flight holds no lock or slot the other needs).
#[test]
fn a_hung_renewal_of_one_elector_does_not_delay_another_on_the_same_client() {
    paused(async {
        let fake = free();
        let mut other = crate::tests::support::held_by("", 1);
        other.metadata.name = Some("other".into());
        fake.put(other);
        let (client, id) = fake.client();
        let new = |name: &str| {
            crate::LeaderElector::new(client.clone(), crate::LeaseConfig::new("default", name, "me"))
        };
        let (e1, e2) = (new("lease").unwrap(), new("other").unwrap());
        let (g1, g2) = (e1.acquire().await.unwrap(), e2.acquire().await.unwrap());
        let start = Instant::now();
        // The next renewal, whichever elector sends it, is answered after 60 s.
        fake.fault(id, Some("update"), crate::test_util::Fault::DelayResponse(S(60)));
        sleep(S(40)).await;
        let renewals = |name: &str| {
            fake.requests()
                .iter()
                .filter(|r| r.verb == "update" && r.at > start && r.name.as_deref() == Some(name))
                .count()
        };
        let (hung, fine, held) = if g1.is_valid() {
            ("other", "lease", &g1)
        } else {
            ("lease", "other", &g2)
        };
        assert!(
            held.is_valid() && renewals(fine) >= 15,
            "{fine}: valid {}, {} renewals in 40 s beside the hung renewal of {hung} ({} renewals)",
            held.is_valid(),
            renewals(fine),
            renewals(hung)
        );
        assert!(!g1.is_valid() || !g2.is_valid(), "the hung renewal cost its term");
    });
}

/// After a step of its consumer that blocked the (current-thread) runtime
/// past the renew deadline, and past the lease duration, the guarded stream
/// ends at its next poll without polling its inner stream again: its own
/// timer has not fired yet (the runtime has not driven it since), so the
/// check before the inner stream's poll reads the clock. Before, the inner
/// stream took one more step (a request begun, a Controller's reconciles
/// started without a guard, `current_guard` being `None`) while another
/// candidate could already lead; only its item was dropped.
#[test]
fn a_guarded_stream_does_not_poll_its_inner_stream_after_a_step_that_blocked_the_runtime() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = {
            let polls = polls.clone();
            stream::poll_fn(move |_| {
                polls.fetch_add(1, Ordering::SeqCst);
                Poll::Ready(Some(()))
            })
        };
        let mut guarded = pin!(counted.with_leader_election(&e));
        assert_eq!(guarded.next().await, Some(()));
        busy(S(20));
        assert_eq!(guarded.next().await, None);
        assert_eq!(
            polls.load(Ordering::SeqCst),
            1,
            "the inner stream was polled 20 s after its last item, past the renew deadline"
        );
        assert_eq!(guarded.lost(), Some(Lost::RenewDeadlineExceeded));
    });
}
