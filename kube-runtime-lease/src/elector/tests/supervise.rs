//! The supervision of election tasks (one at a time, their end and
//! shutdown) at the interleavings a multi-threaded runtime produces between
//! two statements with no `.await`: a test hook ([`Point`]) runs the
//! other thread's action there.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::Context,
    time::Duration,
};

use futures::{future::MaybeDone, task::noop_waker_ref};
use tokio::time::{Instant, sleep, timeout};

use crate::{
    AcquireError,
    elector::{Acquire, test_hooks::Point},
    tests::support::{config, elector, free, paused},
};

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

/// A future first polled inside an interleaving, to be awaited by the test.
type Begun<F> = Arc<Mutex<Option<Pin<Box<MaybeDone<F>>>>>>;

/// Polls `future` once (no waker: the test polls it again), and keeps it.
fn begin<F: Future>(slot: &Begun<F>, future: F) {
    let mut future = Box::pin(futures::future::maybe_done(future));
    let _ = future.as_mut().poll(&mut Context::from_waker(noop_waker_ref()));
    *slot.lock().unwrap() = Some(future);
}

/// A waiter that registers as the task, nobody wanting it any more, leaves
/// the election (between the campaign's last count of demand and `end`: on a
/// multi-threaded runtime, another thread's `acquire`) is served by that task
/// at once: it finds the task still running, so it starts none, and `end`
/// counts it. Kills `end -> true`.
#[test]
fn a_waiter_arriving_as_the_task_exits_is_served_at_once() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let late: Begun<Acquire> = Arc::default();
        {
            let (e2, late) = (e.clone(), late.clone());
            e.interleave_for_test(Point::Exiting, move || begin(&late, e2.acquire()));
        }
        // Nobody wants leadership after this guard: released, the task
        // lingers one retry period, then exits.
        drop(e.acquire().await.unwrap());
        timeout(S(60), async {
            while late.lock().unwrap().is_none() {
                sleep(MS(100)).await;
            }
        })
        .await
        .expect("the task left the election");
        let asked = Instant::now();
        let mut acquire = late.lock().unwrap().take().unwrap();
        timeout(S(60), acquire.as_mut())
            .await
            .expect("the waiter was served");
        let guard = acquire.as_mut().take_output().unwrap().unwrap();
        assert!(guard.is_valid());
        assert!(
            asked.elapsed() < S(1),
            "served {:?} after it asked",
            asked.elapsed()
        );
    });
}

/// `shutdown` returns only once no election task runs and
/// the last one was awaited, also for a task spawned as it began (its handle
/// stored only after `shutdown` took the last one: on a multi-threaded
/// runtime, another thread's `acquire`). Kills `idle -> ()` and its
/// `&& -> ||`.
#[test]
fn shutdown_awaits_a_task_spawned_as_it_began() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let shutdown: Begun<_> = Arc::default();
        {
            let (e2, shutdown) = (e.clone(), shutdown.clone());
            e.interleave_for_test(Point::Spawned, move || {
                begin(&shutdown, async move { e2.shutdown(S(1)).await });
            });
        }
        let acquired = timeout(S(60), e.acquire()).await.expect("the acquire ended");
        assert!(matches!(acquired, Err(AcquireError::Shutdown)), "{acquired:?}");
        let mut shutdown = shutdown.lock().unwrap().take().expect("the shutdown began");
        timeout(S(60), shutdown.as_mut())
            .await
            .expect("the shutdown ended");
        shutdown.as_mut().take_output().unwrap().unwrap();
        assert_eq!(
            e.tasks_for_test(),
            (false, false),
            "shutdown returned with a task running, or not awaited"
        );
    });
}

/// A task dropped in the middle of a term (its runtime shut down, or a
/// panic), after renewals, leaves the next task an exact memory of its
/// record: the record, renewed by us last, is taken back at once, not
/// waited out as another process's. (Before: the memory kept the
/// `renewTime` of the term's first write only, so the next task waited a
/// lease duration.)
#[test]
fn a_task_dropped_mid_term_leaves_the_next_one_its_record() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        sleep(S(5)).await;
        assert!(guard.is_valid(), "renewed twice");
        e.abort_task_for_test();
        let lost = timeout(S(1), guard).await.expect("the term ends with its task");
        assert_eq!(lost, crate::Lost::ElectorStopped);
        let again = timeout(S(1), e.acquire())
            .await
            .expect("its own record, taken back at once")
            .unwrap();
        assert!(again.is_valid());
    });
}

/// Ends when no election task runs, within `bound` of paused time.
async fn task_ended(e: &crate::LeaderElector, bound: Duration, what: &str) {
    timeout(bound, async {
        while e.tasks_for_test().0 {
            sleep(MS(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: the election task still runs {bound:?} later"));
}

/// Leadership acquired and given up many times over leaves nothing behind:
/// after each cycle (the task lingers a retry period, releases and ends) the
/// runtime's tasks are back at their baseline, and each cycle costs the
/// same requests as the one before.
#[test]
fn acquire_and_drop_many_times_returns_to_a_baseline() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let metrics = tokio::runtime::Handle::current().metrics();
        let baseline = metrics.num_alive_tasks();
        let mut costs = Vec::new();
        for cycle in 0..300 {
            let before = fake.requests().len();
            let guard = timeout(S(30), e.acquire())
                .await
                .unwrap_or_else(|_| panic!("cycle {cycle}: not leading 30s later"))
                .unwrap();
            drop(guard);
            task_ended(&e, S(30), &format!("cycle {cycle}")).await;
            costs.push(fake.requests().len() - before);
            assert_eq!(
                metrics.num_alive_tasks(),
                baseline,
                "cycle {cycle}: tasks alive after the election task ended"
            );
        }
        let (first, last) = (costs[10], costs[costs.len() - 1]);
        assert!(
            last <= first,
            "requests per cycle grew from {first} to {last}: {costs:?}"
        );
    });
}

/// A read that outlives its bound is left to finish in the background, one
/// at a time (`LeaseApi::get`: a slow credential plugin's refresh is kept
/// only by a request still awaited). One such read that panics (a layer of
/// the user's Client stack, a body that panics: its future runs in the
/// detached task) must not stop the next from being detached: the
/// one-at-a-time flag was cleared only when the detached task completed,
/// so every later timed-out read was dropped.
#[test]
fn a_detached_read_that_panics_does_not_stop_the_next_from_being_detached() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    paused(async {
        let (calls, answered) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (c, a) = (calls.clone(), answered.clone());
        // Every request is answered 5 s late; the first one panics instead.
        let service = tower::service_fn(move |_: http::Request<kube_client::client::Body>| {
            let (n, answered) = (c.fetch_add(1, Ordering::SeqCst), a.clone());
            async move {
                sleep(S(5)).await;
                assert_ne!(n, 0, "injected: the first read panics in its detached task");
                answered.fetch_add(1, Ordering::SeqCst);
                Err::<http::Response<kube_client::client::Body>, _>(std::io::Error::other("answered"))
            }
        });
        let api = crate::elector::api::LeaseApi {
            api: kube_client::Api::namespaced(kube_client::Client::new(service, "default"), "default"),
            name: "lease".into(),
            contact: Arc::default(),
            detached: Arc::default(),
        };
        for read in 0..2 {
            let got = api.get(S(1)).await;
            assert!(
                matches!(got, Err(crate::ApiError::Timeout { .. })),
                "read {read}: {got:?}"
            );
            sleep(S(10)).await;
        }
        assert_eq!(
            (calls.load(Ordering::SeqCst), answered.load(Ordering::SeqCst)),
            (2, 1),
            "(reads sent, reads answered): the second read, timed out after the first panicked in its \
             detached task, was dropped instead of left to finish"
        );
    });
}
