//! The watch's transitions ([`Watch::step`]), without I/O: what each item
//! does to its state, and the backoff before it is opened again.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::core::Status;
use kube_runtime::watcher;
use tokio::time::Instant;

use super::{Delivered, Sync, WATCH_REOPEN_MAX, WATCH_REOPEN_MIN, Watch};
use crate::tests::support::paused;

fn open(sync: Sync) -> Watch {
    Watch {
        sync,
        ..Watch::new(Some(futures::stream::empty().boxed()))
    }
}

fn refused(code: u16) -> watcher::Error {
    let status = Status::failure("refused by the test", "Forbidden").with_code(code);
    watcher::Error::InitialListFailed(kube_client::Error::Api(Box::new(status)))
}

fn broken() -> watcher::Error {
    let status = Status::failure("broken by the test", "InternalError").with_code(500);
    watcher::Error::WatchFailed(kube_client::Error::Api(Box::new(status)))
}

/// How far the watch got, while it is open.
fn sync_of(watch: &Watch) -> Option<Sync> {
    watch.stream.is_some().then_some(watch.sync)
}

/// Whether the watch delivered the Lease's state and has not failed since.
fn synced(watch: &Watch) -> bool {
    watch.sync == Sync::Synced
}

/// The first item syncs the watch (news: re-evaluate); later ones are news
/// only for what they carry, and a Lease gone is delivered as `None`.
#[test]
fn the_first_item_syncs_the_watch() {
    let now = Instant::now();
    let mut watch = open(Sync::Listing);
    assert!(!synced(&watch));
    let step = watch.step(Some(Ok(Some(Lease::default()))), now);
    assert_eq!(
        step,
        Some(Delivered {
            lease: Some(Lease::default()),
            news: true
        })
    );
    assert!(synced(&watch));
    assert_eq!(
        watch.step(Some(Ok(None)), now),
        Some(Delivered {
            lease: None,
            news: false
        })
    );
    assert!(synced(&watch));
}

/// A failure that the watcher retries on its own leaves the watch open but
/// out of sync, until it delivers again (news: re-evaluate).
#[test]
fn a_failure_unsyncs_the_watch_until_it_delivers() {
    let now = Instant::now();
    let mut watch = open(Sync::Synced);
    assert_eq!(watch.step(Some(Err(broken())), now), None);
    assert_eq!(sync_of(&watch), Some(Sync::Failing));
    assert!(!synced(&watch));
    assert_eq!(watch.step(Some(Err(broken())), now), None);
    assert_eq!(
        watch.step(Some(Ok(None)), now),
        Some(Delivered {
            lease: None,
            news: true
        })
    );
    assert!(synced(&watch));
}

/// A refused watch (403, 401) or one that ended is closed and opened again
/// after a backoff that doubles with each failure in a row, up to its
/// maximum, and starts over once a watch delivered.
#[test]
fn a_refused_or_ended_watch_is_reopened_with_a_doubling_backoff() {
    paused(async {
        let mut watch = open(Sync::Listing);
        let mut waits = Vec::new();
        for code in [403, 401, 403, 403, 403, 403, 403] {
            let now = Instant::now();
            assert_eq!(watch.step(Some(Err(refused(code))), now), None);
            let (None, Some(reopen_at)) = (&watch.stream, watch.reopen_at) else {
                panic!("not closed after a {code}");
            };
            let backoff = reopen_at - now;
            waits.push(backoff.as_secs());
            // Opened again when it is due, not before.
            tokio::time::advance(backoff.saturating_sub(Duration::from_millis(1))).await;
            watch.reopen_if_due(|| unreachable!("opened again before it was due"));
            tokio::time::advance(Duration::from_millis(1)).await;
            watch.reopen_if_due(|| futures::stream::empty().boxed());
            assert_eq!(sync_of(&watch), Some(Sync::Listing));
        }
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(WATCH_REOPEN_MAX, Duration::from_secs(300));
        let now = Instant::now();
        assert_eq!(
            watch.step(Some(Ok(None)), now),
            Some(Delivered {
                lease: None,
                news: true
            })
        );
        assert_eq!(watch.step(None, now), None);
        assert!(
            watch.stream.is_none() && watch.reopen_at == Some(now + WATCH_REOPEN_MIN),
            "the backoff did not start over after the watch delivered"
        );
    });
}

/// "lease watch recovered" is logged once when a watch that failed delivers
/// again, and not at its first sync nor for later items (mutation testing:
/// `== Sync::Failing -> !=` logged it at every sync but the recovery).
#[test]
fn a_recovery_is_logged_once_and_the_first_sync_is_not_a_recovery() {
    let now = Instant::now();
    let mut watch = open(Sync::Listing);
    let logs = crate::tests::support::logs_during(tracing::Level::INFO, || {
        watch.step(Some(Ok(None)), now);
        watch.step(Some(Ok(None)), now);
    });
    assert!(
        !logs.contains("recovered"),
        "the first sync is no recovery: {logs}"
    );
    watch.step(Some(Err(broken())), now);
    let logs = crate::tests::support::logs_during(tracing::Level::INFO, || {
        watch.step(Some(Ok(None)), now);
        watch.step(Some(Ok(None)), now);
    });
    assert_eq!(logs.matches("lease watch recovered").count(), 1, "{logs}");
}
