//! The elector's metrics (`metrics::LeaseMetrics`), on the in-memory Lease
//! API double with paused tokio time.

use std::time::Duration;

use tokio::time::{advance, sleep};

use crate::{
    Lost,
    test_util::{FakeLeaseApi, Fault},
    tests::support::{config, elector, free, paused},
};

const S: fn(u64) -> Duration = Duration::from_secs;

#[test]
fn metrics_are_read_back_from_a_registry() {
    paused(async {
        use prometheus_client::registry::Registry;

        use crate::tests::support::scrape;

        let mut registry = Registry::default();
        let metrics = crate::metrics::LeaseMetrics::register(&mut registry);
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let e = e.with_metrics(&metrics);
        let text = scrape(&registry);
        assert!(
            text.contains(r#"leader_election_is_leader{namespace="default",lease="lease"} 0"#),
            "{text}"
        );
        let guard = e.acquire().await.unwrap();
        sleep(S(4) + Duration::from_millis(500)).await;
        let text = scrape(&registry);
        assert!(
            text.contains(r#"leader_election_is_leader{namespace="default",lease="lease"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"leader_election_renewals_total{namespace="default",lease="lease",outcome="success"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"leader_election_seconds_since_last_renewal{namespace="default",lease="lease"} 0.5"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"leader_election_renew_duration_seconds_count{namespace="default",lease="lease"} 2"#
            ),
            "{text}"
        );
        // client-go's names, labelled by the Lease's name only.
        assert!(
            text.contains(r#"leader_election_master_status{name="lease"} 1"#),
            "{text}"
        );
        // free -> me: one change of holder seen.
        assert!(
            text.contains(r#"leader_election_transitions_total{namespace="default",lease="lease"} 1"#),
            "{text}"
        );
        // A renewal that meets a conflict falls to a read: client-go's slow path.
        fake.fault(id, Some("update"), Fault::Status(409));
        sleep(S(2)).await;
        let text = scrape(&registry);
        assert!(
            text.contains(r#"leader_election_slowpath_total{name="lease"} 1"#),
            "{text}"
        );
        fake.partition(id, true);
        assert_eq!(guard.await, Lost::RenewDeadlineExceeded);
        // The guard may resolve on its own timer, in the instant before the
        // elector task ends the term (and updates the metrics).
        advance(Duration::from_millis(1)).await;
        let text = scrape(&registry);
        assert!(
            text.contains(r#"leader_election_is_leader{namespace="default",lease="lease"} 0"#),
            "{text}"
        );
        assert!(text.contains(r#"outcome="error"} 4"#), "{text}");
        assert!(
            text.contains(r#"leader_election_master_status{name="lease"} 0"#),
            "{text}"
        );
        assert!(
            !text.contains("leader_election_seconds_since_last_renewal{"),
            "{text}"
        );
    });
}

/// The off switch's leader gauge drops at shutdown, with no task to drop it
/// (mutation testing: kills `delete !` in `shutdown`).
#[test]
fn a_disabled_election_stops_leading_in_its_metrics_at_shutdown() {
    paused(async {
        use crate::tests::support::assert_scraped;
        const SERIES: &str = r#"leader_election_master_status{name="lease"}"#;
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = crate::metrics::LeaseMetrics::register(&mut registry);
        let fake = FakeLeaseApi::default();
        let (e, _) = elector(&fake, config("me").enabled(false));
        let e = e.with_metrics(&metrics);
        let guard = e.acquire().await.unwrap();
        assert_scraped(&registry, &format!("{SERIES} 1"));
        drop(guard);
        e.shutdown(S(1)).await.unwrap();
        assert_scraped(&registry, &format!("{SERIES} 0"));
    });
}
