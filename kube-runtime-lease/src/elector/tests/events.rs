//! The elector's Kubernetes Events (`LeaderElector::with_events`), on the
//! in-memory Lease API double with paused tokio time.

use std::time::Duration;

use tokio::time::sleep;

use crate::{
    LeaderElector,
    test_util::FakeLeaseApi,
    tests::support::{config, elector, free, paused},
};

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

/// Every transition is published as an Event on the Lease, and the end of a
/// term names its kind as the action (type `Warning` for a loss, `Normal`
/// for giving up, stepping down or shutting down): one case per kind.
#[test]
fn each_kind_of_end_is_published_with_its_own_action() {
    async fn leader(fake: &FakeLeaseApi) -> (LeaderElector, usize, crate::LeaseGuard) {
        let (e, id) = elector(fake, config("me"));
        let e = e.with_events(kube_runtime::events::Reporter {
            controller: "test".into(),
            instance: None,
        });
        let guard = e.acquire().await.expect("leads");
        (e, id, guard)
    }
    /// The (action, type) of the Events published so far.
    fn published(fake: &FakeLeaseApi) -> Vec<(String, String)> {
        fake.events()
            .iter()
            .map(|e| {
                (
                    e["action"].as_str().unwrap_or_default().to_owned(),
                    e["type"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
    paused(async {
        // (the kind of end, the Event type expected, the Events published)
        let mut cases = Vec::new();
        for case in [
            "TakenOver",
            "Deleted",
            "RenewDeadlineExceeded",
            "SteppedDown",
            "GivenUp",
            "Shutdown",
        ] {
            let fake = free();
            let (e, id, guard) = leader(&fake).await;
            match case {
                "TakenOver" => fake.take_over("other"),
                "Deleted" => fake.delete(),
                "RenewDeadlineExceeded" => fake.partition(id, true),
                "SteppedDown" => {
                    let mut lease = fake.lease().expect("a lease");
                    let spec = lease.spec.as_mut().expect("a spec");
                    spec.strategy = Some("OldestEmulationVersion".into());
                    spec.preferred_holder = Some("better".into());
                    fake.put(lease);
                }
                "GivenUp" => drop(guard),
                _ => e.shutdown(S(5)).await.expect("shuts down"),
            }
            sleep(S(20)).await;
            let expected = if matches!(case, "TakenOver" | "Deleted" | "RenewDeadlineExceeded") {
                "Warning"
            } else {
                "Normal"
            };
            cases.push((case, expected, published(&fake)));
        }
        for (case, expected_type, events) in &cases {
            assert_eq!(
                events.first().map(|(a, t)| (a.as_str(), t.as_str())),
                Some(("BecameLeader", "Normal")),
                "{case}: {events:?}"
            );
            assert_eq!(
                events.get(1).map(|(a, t)| (a.as_str(), t.as_str())),
                Some((*case, *expected_type)),
                "{case}: {events:?}"
            );
        }
    });
}

/// An Event of a transition is about the Lease itself (`regarding`: its API
/// version, kind, namespace, name and uid), so that `kubectl describe lease`
/// shows it (mutation testing: kills the deleted fields of the reference).
#[test]
fn events_are_about_the_lease_object() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let e = e.with_events(kube_runtime::events::Reporter {
            controller: "test".into(),
            instance: None,
        });
        let _guard = e.acquire().await.unwrap();
        sleep(MS(10)).await;
        let uid = fake.lease().unwrap().metadata.uid.unwrap();
        let events = fake.events();
        assert_eq!(events.len(), 1, "{events:?}");
        let regarding = &events[0]["regarding"];
        assert_eq!(
            (
                &regarding["apiVersion"],
                &regarding["kind"],
                &regarding["namespace"],
                &regarding["name"],
                &regarding["uid"]
            ),
            (
                &serde_json::json!("coordination.k8s.io/v1"),
                &serde_json::json!("Lease"),
                &serde_json::json!("default"),
                &serde_json::json!("lease"),
                &serde_json::json!(uid)
            ),
            "{regarding}"
        );
    });
}

/// Each transition is an Event of its own, naming its own cause: a second
/// takeover within minutes of the first names its new holder, and a second
/// term is published too. (kube-runtime's `Recorder` folds a repeat of one
/// type, reason and action on one object into the first Event's series,
/// which keeps the first note: the second takeover read "taken over by
/// \"b\"" though `c` took it.)
#[test]
fn each_transition_is_an_event_naming_its_own_cause() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let e = e.with_events(kube_runtime::events::Reporter {
            controller: "test".into(),
            instance: None,
        });
        for holder in ["b", "c"] {
            let guard = tokio::time::timeout(S(60), e.acquire())
                .await
                .expect("leads within 60 s")
                .expect("leads");
            fake.take_over(holder);
            assert_eq!(
                tokio::time::timeout(S(5), guard)
                    .await
                    .expect("the loss seen within 5 s"),
                crate::tests::support::taken_by(holder)
            );
            sleep(MS(10)).await;
        }
        let events: Vec<(String, String)> = fake
            .events()
            .iter()
            .map(|e| {
                (
                    e["action"].as_str().unwrap_or_default().to_owned(),
                    e["note"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let actions: Vec<&str> = events.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(
            actions,
            ["BecameLeader", "TakenOver", "BecameLeader", "TakenOver"],
            "one Event per transition: {events:?}"
        );
        assert!(
            events[3].1.contains(r#""c""#),
            "the second takeover's Event names another holder than `c`: {events:?}"
        );
    });
}
