use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::time::{Instant, sleep, timeout};

use crate::{
    Lost,
    tests::support::{config, elector, free, holder, paused, taken_by},
};

const S: fn(u64) -> Duration = Duration::from_secs;

/// Sets its flag when dropped: proves that a future was dropped.
struct Dropped(Arc<AtomicBool>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Work that completes within the term returns its output; the guard is
/// dropped after it, so the Lease is released.
#[test]
fn work_that_completes_while_leading_returns_its_output_and_the_lease_is_released() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let led = Arc::new(AtomicBool::new(false));
        let out = timeout(
            S(10),
            e.with_lease({
                let (e, led) = (e.clone(), led.clone());
                async move {
                    led.store(e.is_leader(), Ordering::SeqCst);
                    sleep(S(5)).await;
                    42
                }
            }),
        )
        .await
        .expect("the work ended");
        assert_eq!(out, Ok(42));
        assert!(led.load(Ordering::SeqCst), "polled only while leading");
        sleep(Duration::from_millis(10)).await;
        assert_eq!(holder(&fake).as_deref(), Some(""), "released after the work");
    });
}

/// A term that ends first drops the work at once and says why.
#[test]
fn work_is_dropped_when_the_term_ends_and_says_why() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let dropped = Arc::new(AtomicBool::new(false));
        let run = tokio::spawn({
            let (e, dropped) = (e.clone(), Dropped(dropped.clone()));
            async move {
                e.with_lease(async move {
                    let _alive = dropped;
                    std::future::pending::<()>().await;
                })
                .await
            }
        });
        sleep(S(1)).await;
        assert!(e.is_leader());
        fake.take_over("other");
        let out = timeout(S(5), run).await.expect("ended with the term").unwrap();
        assert_eq!(out, Err(taken_by("other")));
        assert!(dropped.load(Ordering::SeqCst), "the work was dropped");
        assert_eq!(holder(&fake).as_deref(), Some("other"));
    });
}

/// After a shutdown there is nothing to lead: `Lost::Shutdown`, at once.
#[test]
fn work_under_a_shut_down_elector_is_not_run() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        e.shutdown(S(1)).await.unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let out = timeout(
            S(1),
            e.with_lease({
                let ran = ran.clone();
                async move { ran.store(true, Ordering::SeqCst) }
            }),
        )
        .await
        .expect("answered at once");
        assert_eq!(out, Err(Lost::Shutdown));
        assert!(!ran.load(Ordering::SeqCst));
    });
}

/// Tasks of a term end with it, each with the reason; the Lease is not
/// released (they were stopped); none can be spawned on the ended term.
#[test]
fn term_tasks_end_with_the_term() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        let mut tasks = guard.tasks::<u32>();
        let dropped = Arc::new(AtomicBool::new(false));
        tasks
            .spawn({
                let alive = Dropped(dropped.clone());
                async move {
                    let _alive = alive;
                    std::future::pending::<u32>().await
                }
            })
            .unwrap();
        tasks.spawn(async { 7 }).unwrap();
        let first = timeout(S(1), tasks.join_next()).await.unwrap().unwrap().unwrap();
        assert_eq!(first, Ok(7), "a task that completes within the term");
        drop(guard);
        sleep(S(5)).await;
        assert!(e.is_leader(), "a running task keeps the term wanted");
        fake.take_over("other");
        let second = timeout(S(5), tasks.join_next()).await.unwrap().unwrap().unwrap();
        assert_eq!(second, Err(taken_by("other")));
        assert!(dropped.load(Ordering::SeqCst));
        assert!(tasks.is_empty());
        assert!(
            tasks.spawn(async { 1 }).is_err(),
            "nothing spawned on an ended term"
        );
        assert_eq!(holder(&fake).as_deref(), Some("other"));
    });
}

/// `shutdown` waits (within its grace) for the term's tasks, and releases
/// the Lease when they finished in time.
#[test]
fn shutdown_waits_for_term_tasks_and_then_releases() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        let mut tasks = guard.tasks::<()>();
        let finished = Arc::new(AtomicBool::new(false));
        tasks
            .spawn({
                let finished = finished.clone();
                async move {
                    sleep(S(3)).await;
                    finished.store(true, Ordering::SeqCst);
                }
            })
            .unwrap();
        drop(guard);
        let began = Instant::now();
        e.shutdown(S(10)).await.unwrap();
        assert!(finished.load(Ordering::SeqCst), "shutdown waited for the task");
        assert!(
            began.elapsed() >= S(3) && began.elapsed() < S(10),
            "{:?}",
            began.elapsed()
        );
        assert_eq!(
            holder(&fake).as_deref(),
            Some(""),
            "released: the task had finished"
        );
        assert_eq!(
            timeout(S(1), tasks.join_next()).await.unwrap().unwrap().unwrap(),
            Ok(())
        );
    });
}

/// Dropping the scope aborts its tasks.
#[test]
fn dropping_term_tasks_aborts_them() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        let mut tasks = guard.tasks::<()>();
        let dropped = Arc::new(AtomicBool::new(false));
        tasks
            .spawn({
                let alive = Dropped(dropped.clone());
                async move {
                    let _alive = alive;
                    std::future::pending::<()>().await;
                }
            })
            .unwrap();
        assert_eq!(tasks.len(), 1);
        drop(tasks);
        sleep(Duration::from_millis(10)).await;
        assert!(dropped.load(Ordering::SeqCst));
        assert!(guard.is_valid());
    });
}

/// Once `shutdown` began, a term's `TermTasks` spawns nothing more, as
/// `acquire` and `current_guard` hand out no guard then: a task spawned
/// during the shutdown's grace is new work begun after the shutdown began,
/// keeps the shutdown waiting for its whole grace, and is stopped at its
/// end, so the Lease is left to expire instead of released.
#[test]
fn term_tasks_spawn_nothing_once_the_shutdown_began() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        let mut tasks = guard.tasks::<()>();
        // Work in flight when the shutdown begins: it finishes within the grace.
        tasks.spawn(async { sleep(S(2)).await }).unwrap();
        drop(guard);
        let began = Instant::now();
        let shutdown = tokio::spawn({
            let e = e.clone();
            async move { e.shutdown(S(10)).await }
        });
        sleep(Duration::from_millis(100)).await;
        assert!(!e.is_leader(), "the shutdown began");
        // More work arrives: it must not start under the term being shut down.
        let late = tasks.spawn(async { sleep(S(60)).await });
        let result = timeout(S(30), shutdown)
            .await
            .expect("shutdown is bounded")
            .unwrap();
        let took = began.elapsed();
        assert!(
            late.is_err(),
            "a task was spawned after the shutdown began (the shutdown took {took:?}, the holder is then {:?})",
            holder(&fake)
        );
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(
            holder(&fake).as_deref(),
            Some(""),
            "released once the work in flight finished"
        );
    });
}
