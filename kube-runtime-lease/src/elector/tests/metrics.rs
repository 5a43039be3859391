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

/// Metrics given to an elector that already leads start at the truth: the
/// leader gauges say 1, for the first metrics given and for later ones alike
/// (`with_metrics` is a builder on a cloneable handle: a replica may add its
/// metrics after it began leading).
#[test]
fn metrics_given_to_an_elector_that_already_leads_start_at_the_truth() {
    paused(async {
        use crate::tests::support::assert_scraped;
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let _guard = e.acquire().await.unwrap();
        assert!(e.is_leader());
        for _ in 0..2 {
            let mut registry = prometheus_client::registry::Registry::default();
            let metrics = crate::metrics::LeaseMetrics::register(&mut registry);
            let _ = e.clone().with_metrics(&metrics);
            assert_scraped(
                &registry,
                r#"leader_election_is_leader{namespace="default",lease="lease"} 1"#,
            );
            assert_scraped(&registry, r#"leader_election_master_status{name="lease"} 1"#);
            // Not coordinated: the truth is 0 there (a mutant told 1).
            assert_scraped(
                &registry,
                r#"leader_election_coordinated{namespace="default",lease="lease"} 0"#,
            );
        }
    });
}

/// `leader_election_seconds_since_last_renewal` is there exactly while this
/// replica leads: from the write that began the term (a leader stuck before
/// its first renewal is the one its alert is for), and not during the
/// creation hold, when it renews but does not lead.
#[test]
fn seconds_since_last_renewal_is_reported_exactly_while_leading() {
    paused(async {
        use crate::tests::support::scrape;
        const SERIES: &str =
            r#"leader_election_seconds_since_last_renewal{namespace="default",lease="lease"}"#;
        const LEADER: &str = r#"leader_election_is_leader{namespace="default",lease="lease"} 1"#;
        {
            // A term taken at once: from its first write.
            let mut registry = prometheus_client::registry::Registry::default();
            let metrics = crate::metrics::LeaseMetrics::register(&mut registry);
            let fake = free();
            let (e, _) = elector(&fake, config("me"));
            let _guard = e.with_metrics(&metrics).acquire().await.unwrap();
            let text = scrape(&registry);
            assert!(text.contains(LEADER), "{text}");
            assert!(
                text.contains(&format!("{SERIES} 0")),
                "no seconds since the last renewal at the start of a term:\n{text}"
            );
            // Counted from the write that began the term (the first renewal
            // comes a retry period, 2 s, after it).
            sleep(Duration::from_millis(1500)).await;
            let text = scrape(&registry);
            assert!(
                text.contains(&format!("{SERIES} 1")),
                "not 1.5 s since the write that began the term, 1.5 s after it:\n{text}"
            );
        }
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = crate::metrics::LeaseMetrics::register(&mut registry);
        // No Lease: the candidate creates it, and holds it one lease
        // duration (renewing it) before it leads.
        let fake = FakeLeaseApi::default();
        let (e, _) = elector(&fake, config("me"));
        let e = e.with_metrics(&metrics);
        let acquire = tokio::spawn({
            let e = e.clone();
            async move { e.acquire().await }
        });
        sleep(S(5)).await;
        let text = scrape(&registry);
        assert!(
            !e.is_leader() && !text.contains(LEADER),
            "leading during the hold:\n{text}"
        );
        assert!(
            !text.contains(SERIES),
            "seconds since the last renewal reported during the creation hold, while not leading:\n{text}"
        );
        let guard = tokio::time::timeout(S(20), acquire)
            .await
            .expect("no term 20 s after the creation hold began")
            .unwrap()
            .unwrap();
        let text = scrape(&registry);
        assert!(text.contains(LEADER), "{text}");
        assert!(
            text.contains(SERIES),
            "no seconds since the last renewal at the start of a term:\n{text}"
        );
        drop(guard);
        e.shutdown(S(1)).await.unwrap();
        let text = scrape(&registry);
        assert!(!text.contains(SERIES), "{text}");
    });
}

/// `leader_election_transitions_total` counts changes of holder, not the
/// first look at the Lease: a replica started beside a leader has seen no
/// change (a rollout of N replicas would otherwise count N); the takeover it
/// makes later is one.
#[test]
fn the_first_look_at_the_lease_is_no_transition() {
    paused(async {
        use crate::tests::support::{assert_scraped, held_by};
        const SERIES: &str = r#"leader_election_transitions_total{namespace="default",lease="lease"}"#;
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = crate::metrics::LeaseMetrics::register(&mut registry);
        let fake = FakeLeaseApi::default();
        fake.put(held_by("other", 15));
        let (e, _) = elector(&fake, config("me"));
        let e = e.with_metrics(&metrics);
        let acquire = tokio::spawn({
            let e = e.clone();
            async move { e.acquire().await }
        });
        sleep(S(5)).await;
        assert_eq!(e.status().holder.as_deref(), Some("other"));
        assert_scraped(&registry, &format!("{SERIES} 0"));
        let _guard = tokio::time::timeout(S(30), acquire)
            .await
            .expect("takes the expired record within 30 s")
            .unwrap()
            .unwrap();
        assert_scraped(&registry, &format!("{SERIES} 1"));
    });
}
