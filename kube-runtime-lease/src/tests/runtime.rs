//! The runtimes the unit tests run on: [`paused`], the paused-time runner
//! that bounds every test, and the paused runtime a test builds itself.

use std::{future::Future, io::Write as _, time::Duration};

/// How much paused time a unit test may take before it fails as hung. The
/// longest test waits a few simulated minutes; a wait that never ends (a bug,
/// or a mutant) reaches this bound in well under a second of real time,
/// because paused time jumps from timer to timer.
pub(crate) const PAUSED_TEST_BOUND: Duration = Duration::from_secs(3600);

/// A current-thread runtime with paused time, as `#[tokio::test(start_paused
/// = true)]` builds it.
pub(crate) fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// How much real time a unit test may take. Paused time advances only while
/// the runtime is idle, so a loop that never yields to a timer (against the
/// instant double) keeps a test from ever reaching [`PAUSED_TEST_BOUND`]; this
/// bound catches that. Generous: the longest test takes about 70 s of real
/// time alone on 2 cores, and near twice that beside the other long tests on
/// a machine busy with builds (120 s was seen to abort it there).
pub(crate) const REAL_TEST_BOUND: Duration = Duration::from_secs(300);

/// Runs a test body on a paused runtime and fails it if it has not finished
/// within [`PAUSED_TEST_BOUND`] of paused time, so that a wait that never ends
/// fails with a message instead of spinning until a real-time timeout; a test
/// still running after [`REAL_TEST_BOUND`] of real time (a loop that never
/// yields) aborts the test binary with a message.
#[track_caller]
pub(crate) fn paused(test: impl Future<Output = ()>) {
    let caller = std::panic::Location::caller();
    let (finished_tx, finished_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if finished_rx.recv_timeout(REAL_TEST_BOUND) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            // To stderr itself: the test harness captures `eprintln!`, and
            // its capture is lost with the process.
            let _ = writeln!(
                std::io::stderr(),
                "the test at {caller} still runs after {REAL_TEST_BOUND:?} of real time: \
                 a loop that never yields to paused time (or a machine far too busy); aborting"
            );
            std::process::abort();
        }
    });
    paused_runtime().block_on(async {
        let finished = tokio::time::timeout(PAUSED_TEST_BOUND, test).await;
        assert!(
            finished.is_ok(),
            "the test at {caller} did not finish within {PAUSED_TEST_BOUND:?} of paused time: \
             something it waits for never happens"
        );
    });
    drop(finished_tx);
}
