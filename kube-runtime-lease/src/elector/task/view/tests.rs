//! The watch's transitions ([`Watch::step`]), without I/O: what each item
//! does to its state.

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::core::Status;
use kube_runtime::watcher;
use tokio::time::Instant;

use super::{Delivered, Sync, Watch};
use crate::tests::support::logs_during;

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

/// A refused watch (403, 401) stays open, out of sync: the watcher retries
/// it with kube-runtime's backoff while the task polls. One warning per
/// outage, with the RBAC hint; a refusal after the watch delivered again is
/// a new outage. A watch that ended is not opened again: the task polls.
#[test]
fn a_refused_watch_is_left_to_the_watchers_backoff_and_warned_once() {
    let now = Instant::now();
    let mut watch = open(Sync::Synced);
    let logs = logs_during(tracing::Level::WARN, || {
        for code in [403, 401, 403] {
            assert_eq!(watch.step(Some(Err(refused(code))), now), None);
            assert_eq!(sync_of(&watch), Some(Sync::Failing), "after a {code}");
        }
    });
    assert_eq!(logs.matches("cannot watch leases").count(), 1, "{logs}");
    assert!(logs.contains("grant `list` and `watch`"), "{logs}");
    let delivered = watch.step(Some(Ok(None)), now);
    assert_eq!(
        delivered,
        Some(Delivered {
            lease: None,
            news: true
        })
    );
    let logs = logs_during(tracing::Level::WARN, || {
        watch.step(Some(Err(refused(403))), now);
    });
    assert_eq!(logs.matches("cannot watch leases").count(), 1, "{logs}");
    assert_eq!(watch.step(None, now), None);
    assert!(
        watch.stream.is_none() && !synced(&watch),
        "an ended watch is closed"
    );
}

/// "lease watch recovered" is logged once when a watch that failed delivers
/// again, and not at its first sync nor for later items (mutation testing:
/// `== Sync::Failing -> !=` logged it at every sync but the recovery).
#[test]
fn a_recovery_is_logged_once_and_the_first_sync_is_not_a_recovery() {
    let now = Instant::now();
    let mut watch = open(Sync::Listing);
    let logs = logs_during(tracing::Level::INFO, || {
        watch.step(Some(Ok(None)), now);
        watch.step(Some(Ok(None)), now);
    });
    assert!(
        !logs.contains("recovered"),
        "the first sync is no recovery: {logs}"
    );
    watch.step(Some(Err(broken())), now);
    let logs = logs_during(tracing::Level::INFO, || {
        watch.step(Some(Ok(None)), now);
        watch.step(Some(Ok(None)), now);
    });
    assert_eq!(logs.matches("lease watch recovered").count(), 1, "{logs}");
}
