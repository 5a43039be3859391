//! The watch's transitions ([`Watch::step`]), without I/O: what each item
//! does to its state.

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::core::Status;
use kube_runtime::watcher;
use tokio::time::Instant;

use super::{Delivered, Silence, Sync, Watch};
use crate::tests::support::logs_during;

fn open(sync: Sync) -> Watch {
    Watch {
        sync,
        ..Watch::new(
            Some(futures::stream::empty().boxed()),
            std::time::Duration::from_secs(2),
        )
    }
}

fn refused(code: u16) -> watcher::Error {
    // Authorization's words (`error::refused_by_rbac`).
    let message = r#"leases.coordination.k8s.io is forbidden: User "u" cannot list resource "leases""#;
    let status = Status::failure(message, "Forbidden").with_code(code);
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
/// A stall is taken at the second read in a row that shows a change the
/// watch had not delivered, told once, and forgotten when it delivers.
#[test]
fn a_stall_is_the_second_changed_read_in_a_row_told_once_until_the_watch_delivers() {
    let mut silence = Silence::Heard;
    assert!(!silence.heard(), "nothing was warned");
    assert_eq!(silence.changed(), None, "one changed read is only suspected");
    assert_eq!(
        silence.changed(),
        Some(true),
        "the second in a row is a stall, to warn"
    );
    assert_eq!(silence.changed(), Some(false), "a stall is warned once");
    assert!(silence.heard(), "the delivery after a warned stall is told");
    assert_eq!(silence.changed(), None, "a delivery starts the count again");
    assert!(!silence.heard(), "a suspicion alone was never warned");
    assert_eq!(silence.changed(), None, "a delivery forgets a suspicion");
}

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

/// A Lease renewed `ago` before now (by this node's clock).
fn renewed_ago(ago: std::time::Duration) -> Lease {
    use k8s_openapi::{api::coordination::v1::LeaseSpec, apimachinery::pkg::apis::meta::v1::MicroTime};
    let at = crate::record::now() - ago;
    Lease {
        spec: Some(LeaseSpec {
            holder_identity: Some("a".into()),
            renew_time: Some(MicroTime(at)),
            ..LeaseSpec::default()
        }),
        ..Lease::default()
    }
}

/// A watch that delivers records late (more than a retry period after their
/// `renewTime`: a lagging watch keeps a follower seeing a dead holder's last
/// renewals as news) is not trusted, warned once, until a record comes in
/// time again; a record without `renewTime`, or one renewed "in the future"
/// (a clock behind the holder's), is in time.
#[test]
fn a_watch_that_delivers_late_is_not_trusted_until_it_delivers_in_time() {
    use std::time::Duration;
    let now = Instant::now();
    let silence = Duration::from_secs(4);
    let mut watch = open(Sync::Listing);
    watch.step(Some(Ok(Some(renewed_ago(Duration::from_millis(10))))), now);
    assert!(watch.trusted(silence), "a record delivered in time");
    let logs = logs_during(tracing::Level::INFO, || {
        watch.step(Some(Ok(Some(renewed_ago(Duration::from_secs(5))))), now);
        watch.step(Some(Ok(Some(renewed_ago(Duration::from_secs(4))))), now);
    });
    assert!(!watch.trusted(silence), "a record delivered 5 s late is trusted");
    assert_eq!(
        logs.matches("lease watch delivered a record late").count(),
        1,
        "{logs}"
    );
    let logs = logs_during(tracing::Level::INFO, || {
        watch.step(Some(Ok(Some(renewed_ago(Duration::from_millis(1_900))))), now);
    });
    assert!(
        watch.trusted(silence),
        "a record delivered within the retry period is not trusted"
    );
    assert_eq!(
        logs.matches("lease watch delivers in time again").count(),
        1,
        "{logs}"
    );
    watch.step(Some(Ok(Some(renewed_ago(Duration::from_secs(5))))), now);
    watch.step(Some(Ok(Some(Lease::default()))), now);
    assert!(watch.trusted(silence), "a record without renewTime");
    let ahead = Lease {
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                crate::record::now() + Duration::from_secs(60),
            )),
            ..Default::default()
        }),
        ..Lease::default()
    };
    watch.step(Some(Ok(Some(renewed_ago(Duration::from_secs(5))))), now);
    watch.step(Some(Ok(Some(ahead))), now);
    assert!(
        watch.trusted(silence),
        "a record renewed ahead of this node's clock"
    );
}

/// A lateness that hovers around the retry period (renewals whose writes
/// take about that long, a clock offset close to it) is warned once, not at
/// every crossing: the watch is still untrusted whenever the last record
/// came late. (Before: a warning and an info line for every crossing, 10 of
/// each for 20 records.)
#[test]
fn a_lateness_around_the_retry_period_is_warned_once_not_in_a_loop() {
    use std::time::Duration;
    let now = Instant::now();
    let silence = Duration::from_secs(4);
    let mut watch = open(Sync::Listing);
    watch.step(Some(Ok(Some(renewed_ago(Duration::from_millis(10))))), now);
    let logs = logs_during(tracing::Level::INFO, || {
        for i in 0..20 {
            let late = if i % 2 == 0 { 2_100 } else { 1_900 };
            watch.step(Some(Ok(Some(renewed_ago(Duration::from_millis(late))))), now);
            assert_eq!(
                watch.trusted(silence),
                i % 2 == 1,
                "after a record {late} ms late"
            );
        }
    });
    assert_eq!(
        logs.matches("lease watch delivered a record late").count(),
        1,
        "{logs}"
    );
    assert_eq!(
        logs.matches("lease watch delivers in time again").count(),
        1,
        "{logs}"
    );
}

/// The first item after a (re-)list is the Lease as it is, not a renewal
/// delivered late; an edit that keeps `renewTime` is no renewal either.
#[test]
fn only_renewals_delivered_after_the_sync_are_judged_late() {
    use std::time::Duration;
    let now = Instant::now();
    let silence = Duration::from_secs(4);
    let mut watch = open(Sync::Listing);
    let old = renewed_ago(Duration::from_secs(3600));
    watch.step(Some(Ok(Some(old.clone()))), now);
    assert!(watch.trusted(silence), "a record an hour old, listed");
    let mut edited = old;
    edited.metadata.labels = Some([("edited".to_owned(), "yes".to_owned())].into());
    watch.step(Some(Ok(Some(edited))), now);
    assert!(watch.trusted(silence), "an edit of it keeping its renewTime");
    watch.step(Some(Ok(Some(renewed_ago(Duration::from_secs(5))))), now);
    assert!(!watch.trusted(silence), "a renewal delivered 5 s late");
}

/// A version a read showed, delivered by the watch more than a retry period
/// after that read, is a lag on this node's monotonic clock, however fresh
/// its `renewTime` looks (a holder's clock ahead by about the lag): the
/// watch is not trusted, warned once, until a read finds it up to date. A
/// failure drops the read: the recovery, after the watcher's backoff, is no
/// lag.
#[test]
fn a_version_read_then_delivered_late_is_a_lag_whatever_its_renew_time_says() {
    use std::time::Duration;
    let versioned = |rv: &str| {
        let mut lease = renewed_ago(Duration::from_millis(10));
        lease.metadata.resource_version = Some(rv.into());
        lease
    };
    let silence = Duration::from_secs(4);
    let mut watch = open(Sync::Listing);
    watch.step(Some(Ok(Some(versioned("10")))), Instant::now());
    watch.saw_read(Some(10));
    watch.saw_read(Some(11));
    assert!(
        watch.trusted(silence),
        "a version read just now, not delivered yet"
    );
    let logs = logs_during(tracing::Level::INFO, || {
        watch.step(
            Some(Ok(Some(versioned("11")))),
            Instant::now() + Duration::from_secs(3),
        );
    });
    assert!(
        !watch.trusted(silence),
        "a version delivered 3 s after a read showed it (its renewTime fresh) is trusted"
    );
    assert_eq!(
        logs.matches("lease watch delivered a record late").count(),
        1,
        "{logs}"
    );
    watch.saw_read(Some(11));
    assert!(
        watch.trusted(silence),
        "a watch a read finds up to date is not trusted"
    );
    watch.saw_read(Some(12));
    watch.step(Some(Err(broken())), Instant::now());
    watch.step(
        Some(Ok(Some(versioned("12")))),
        Instant::now() + Duration::from_secs(30),
    );
    assert!(
        watch.trusted(silence),
        "a watch recovered after its backoff is judged late"
    );
}

/// The lag is measured from the first read whose version the watch has not
/// delivered yet: a newer read meanwhile (a follower reading before each
/// attempt, every retry period, while the watch lags by more) does not move
/// it, or a watch always behind the latest read would never be judged; and
/// a read while the watch is not in sync (failed, waiting out its backoff)
/// is not judged against its recovery. Mutation testing: kills `&&` as `||`
/// in `saw_read`.
#[test]
fn a_newer_read_keeps_the_older_reads_lag_and_a_read_out_of_sync_is_not_judged() {
    use std::time::Duration;
    crate::tests::support::paused(async {
        let versioned = |rv: &str| {
            let mut lease = renewed_ago(Duration::from_millis(10));
            lease.metadata.resource_version = Some(rv.into());
            lease
        };
        let silence = Duration::from_secs(10);
        let mut watch = open(Sync::Listing);
        watch.step(Some(Ok(Some(versioned("10")))), Instant::now());
        watch.saw_read(Some(11));
        tokio::time::advance(Duration::from_secs(1)).await;
        watch.saw_read(Some(12));
        tokio::time::advance(Duration::from_secs(2)).await;
        watch.step(Some(Ok(Some(versioned("11")))), Instant::now());
        assert!(
            !watch.trusted(silence),
            "a version delivered 3 s after the first read that showed it is trusted (a newer read came between)"
        );
        watch.saw_read(Some(11));
        watch.step(Some(Err(broken())), Instant::now());
        watch.saw_read(Some(13));
        tokio::time::advance(Duration::from_secs(30)).await;
        watch.step(Some(Ok(Some(versioned("13")))), Instant::now());
        assert!(
            watch.trusted(silence),
            "a watch recovered after its backoff is judged late against a read made while it was out of sync"
        );
    });
}
