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
            "ElectorStopped",
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
                // The election task panics: its own, caught and resumed.
                "ElectorStopped" => e.interleave_for_test(crate::elector::test_hooks::Point::Recount, || {
                    panic!("injected: the election task panics")
                }),
                _ => e.shutdown(S(5)).await.expect("shuts down"),
            }
            sleep(S(20)).await;
            if case == "ElectorStopped" {
                // About the Lease object, as `kubectl describe lease` finds it (by uid).
                let uid = fake.lease().and_then(|l| l.metadata.uid);
                let last = fake.events().last().map(|e| e["regarding"]["uid"].clone());
                assert_eq!(last, Some(serde_json::json!(uid)), "{:?}", fake.events());
            }
            let expected = if matches!(
                case,
                "TakenOver" | "Deleted" | "RenewDeadlineExceeded" | "ElectorStopped"
            ) {
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

/// The Events of a Lease whose name is as long as the API allows (253
/// characters, which `LeaseConfig::validate` accepts): each Event is named
/// after the Lease (`<name>.<hex>`), and an Event's name is a DNS subdomain
/// of at most 253 characters too, so the API server refuses a name made of
/// the whole Lease name and a suffix (422), and no transition of such a Lease
/// is ever published. (Before: kube-runtime's `Recorder` named them so: 269
/// characters.)
#[test]
fn the_events_of_a_lease_with_the_longest_name_have_names_the_api_server_accepts() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let name = ["a".repeat(62), "b".repeat(62), "c".repeat(62), "d".repeat(64)].join(".");
        assert_eq!(name.len(), 253);
        let config = crate::LeaseConfig::new("default", name.clone(), "me").creation_hold(false);
        config
            .validate()
            .expect("a Lease name of 253 characters is valid");
        let (e, _) = elector(&fake, config);
        let e = e.with_events(kube_runtime::events::Reporter {
            controller: "test".into(),
            instance: None,
        });
        let guard = tokio::time::timeout(S(10), e.acquire())
            .await
            .expect("leads within 10 s")
            .expect("leads");
        drop(guard);
        sleep(S(5)).await;
        let names: Vec<String> = fake
            .events()
            .iter()
            .map(|e| e["metadata"]["name"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(names.len(), 2, "BecameLeader and GivenUp: {names:?}");
        for event in &names {
            assert!(
                crate::config::names::dns1123_subdomain(event).is_none(),
                "an Event named {event:?} ({} characters): the API server refuses it",
                event.len()
            );
            assert_eq!(
                fake.events()
                    .iter()
                    .filter(|e| e["metadata"]["name"] == event.as_str())
                    .count(),
                1,
                "two Events named {event:?}"
            );
        }
        assert!(
            fake.events()
                .iter()
                .all(|e| e["regarding"]["name"] == name.as_str()),
            "every Event is about the Lease"
        );
    });
}

/// Each Event carries what the API server requires of an `events.k8s.io/v1`
/// Event (it refuses one without `eventTime`, `reportingController`,
/// `reportingInstance`, `action` or `reason`, 422), as kube-runtime's
/// `Recorder` fills them: the reporter's controller, its instance (the
/// controller when it names none), the time it was published, about the
/// Lease in its namespace. The test double keeps what it is sent and checks
/// none of it.
#[test]
fn each_event_carries_every_field_the_api_server_requires() {
    for instance in [Some("pod-a"), None] {
        paused(async move {
            let fake = free();
            let (e, _) = elector(&fake, config("me"));
            let e = e.with_events(kube_runtime::events::Reporter {
                controller: "test-controller".into(),
                instance: instance.map(Into::into),
            });
            let before = k8s_openapi::jiff::Timestamp::now();
            drop(e.acquire().await.expect("leads"));
            sleep(S(5)).await;
            let events = fake.events();
            assert_eq!(events.len(), 2, "BecameLeader and GivenUp: {events:?}");
            for event in &events {
                let time = event["eventTime"]
                    .as_str()
                    .map(str::parse::<k8s_openapi::jiff::Timestamp>);
                assert!(
                    matches!(time, Some(Ok(t)) if t >= before && t <= k8s_openapi::jiff::Timestamp::now()),
                    "eventTime {:?} is not the time it was published: {event}",
                    event["eventTime"]
                );
                assert_eq!(event["reportingController"], "test-controller", "{event}");
                assert_eq!(
                    event["reportingInstance"],
                    instance.unwrap_or("test-controller"),
                    "{event}"
                );
                assert_eq!(event["metadata"]["namespace"], "default", "{event}");
                assert_eq!(event["regarding"]["kind"], "Lease", "{event}");
                for field in ["action", "reason", "type"] {
                    assert!(
                        event[field].as_str().is_some_and(|v| !v.is_empty()),
                        "no {field}: {event}"
                    );
                }
            }
        });
    }
}

/// A Role without `create` on `events` is
/// warned once per outage, naming the rule: once while it lasts (then at
/// debug level), and again when it is taken away again after Events were
/// published meanwhile (the warning was once per elector: a second outage
/// was logged at debug level only).
#[test]
fn a_refused_event_is_warned_once_per_outage() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = free();
            let (e, _) = elector(&fake, config("me"));
            let e = e.with_events(kube_runtime::events::Reporter {
                controller: "test".into(),
                instance: None,
            });
            fake.forbid_events(true);
            for _ in 0..2 {
                drop(e.acquire().await.unwrap());
                sleep(S(5)).await;
            }
            fake.forbid_events(false);
            drop(e.acquire().await.unwrap());
            sleep(S(5)).await;
            assert!(!fake.events().is_empty(), "published once allowed");
            fake.forbid_events(true);
            drop(e.acquire().await.unwrap());
            sleep(S(5)).await;
        });
    });
    let warned: Vec<_> = logs
        .lines()
        .filter(|l| l.contains("publishing a leader election event failed"))
        .collect();
    assert_eq!(warned.len(), 2, "one warning per outage; logs:\n{logs}");
    for line in warned {
        assert!(line.contains("RBAC: create on `events`"), "{line}");
    }
}
