//! Election tests on the in-memory Lease API double, with paused tokio time.

mod campaign;
mod contact;
#[cfg(feature = "coordinated")]
mod coordinated;
#[cfg(feature = "events")]
mod events;
#[cfg(feature = "lease-metadata")]
mod metadata;
#[cfg(feature = "metrics")]
mod metrics;
mod supervise;

use std::time::Duration;

use futures::{FutureExt, poll};
use tokio::time::{Instant, advance, sleep};

use crate::{
    ConfigError, LeaderElector, Lost,
    test_util::{FakeLeaseApi, Fault},
    tests::support::{config, count, elector, first_after, free, held_by, holder, paused, spec, taken_by},
};

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

/// A candidate whose first renewal comes only 20 s after its term began
/// (lease 40 s, renew deadline 30 s): for tests of what the watch shows
/// between a term's first write and its next.
fn unhurried(identity: &str) -> crate::LeaseConfig {
    config(identity)
        .lease_duration(S(40))
        .renew_deadline(S(30))
        .retry_period(S(20))
}

fn assert_send_sync_static<T: Send + Sync + 'static>(_: &T) {}

/// The watch's first two lists fail, so `me` (unhurried) leads on a polled
/// read before its watch is in sync: its elector, its client and its guard.
async fn leading_before_the_watch_synced(fake: &FakeLeaseApi) -> (LeaderElector, usize, crate::LeaseGuard) {
    let (e, id) = elector(fake, unhurried("me"));
    fake.fault(id, Some("list"), Fault::Status(500));
    fake.fault(id, Some("list"), Fault::Status(500));
    let guard = e.acquire().await.unwrap();
    assert!(lists(fake) < 3, "the term began before the watch synced");
    (e, id, guard)
}

/// The lists the double has answered (or refused), of every client.
fn lists(fake: &FakeLeaseApi) -> usize {
    fake.requests().iter().filter(|s| s.verb == "list").count()
}

#[test]
fn invalid_config_is_an_error_before_any_api_call() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (client, _) = fake.client();
        let err = LeaderElector::new(client, config("me").renew_deadline(S(20))).unwrap_err();
        assert_eq!(err, ConfigError::LeaseDurationNotGreaterThanRenewDeadline);
        assert!(fake.requests().is_empty());
    });
}

#[test]
fn creates_a_missing_lease_and_leads() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (e, _) = elector(&fake, config("me"));
        assert!(!e.is_leader());
        let start = Instant::now();
        let mut acquire = Box::pin(e.acquire());
        assert!(tokio::time::timeout(S(1), &mut acquire).await.is_err());
        assert_eq!(
            spec(&fake).holder_identity.as_deref(),
            Some("me"),
            "created at once"
        );
        assert!(!e.is_leader(), "but held one lease duration before leading");
        let guard = acquire.await.unwrap();
        assert_eq!(start.elapsed(), S(15));
        assert_send_sync_static(&guard);
        assert!(e.is_leader());
        assert!(guard.is_valid());
        assert_eq!(guard.fencing_token(), 0);
        let s = spec(&fake);
        assert_eq!(s.holder_identity.as_deref(), Some("me"));
        assert_eq!(s.lease_duration_seconds, Some(15));
        assert_eq!(s.lease_transitions, Some(0));
        assert!(
            s.acquire_time.is_some() && s.acquire_time < s.renew_time,
            "renewed while held"
        );
        let st = e.status();
        assert_eq!(st.holder.as_deref(), Some("me"));
        assert!(st.is_leader);
    });
}

#[test]
fn leader_renews_with_one_write_per_retry_period_and_no_reads() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        let start = Instant::now();
        let acquire_time = spec(&fake).acquire_time;
        sleep(S(60) + Duration::from_millis(1)).await;
        assert_eq!(count(&fake, id, "update", start), 30, "one renewal every 2 s");
        assert_eq!(
            count(&fake, id, "get", start),
            0,
            "fast path: no reads: {:?}",
            fake.requests()
        );
        assert_eq!(count(&fake, id, "create", start), 0);
        let s = spec(&fake);
        assert_eq!(s.acquire_time, acquire_time, "renewals keep acquireTime");
        assert_eq!(s.lease_transitions, Some(1));
        assert!(guard.is_valid());
        assert_eq!(guard.time_left(), Duration::from_millis(9999));
    });
}

#[test]
fn renewal_cadence_does_not_drift_when_a_request_is_slow() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me").watch(false));
        let _guard = e.acquire().await.unwrap();
        let start = Instant::now();
        fake.fault(
            id,
            Some("update"),
            Fault::DelayRequest(Duration::from_millis(1500)),
        );
        sleep(S(20) + Duration::from_millis(1)).await;
        let times: Vec<_> = fake
            .requests()
            .iter()
            .filter(|s| s.verb == "update" && s.at > start)
            .map(|s| s.at - start)
            .collect();
        assert_eq!(times, (1..=10).map(|k| S(2 * k)).collect::<Vec<_>>());
    });
}

#[test]
fn takeover_waits_exactly_one_lease_duration_after_the_last_observed_change() {
    paused(async {
        for watch in [true, false] {
            let fake = FakeLeaseApi::default();
            fake.put(held_by("other", 7));
            let (e, _) = elector(&fake, config("me").watch(watch));
            let start = Instant::now();
            let guard = e.acquire().await.unwrap();
            let waited = start.elapsed();
            assert!(waited >= S(7), "took over after {waited:?}");
            if watch {
                assert_eq!(waited, S(7), "on a timer, at the exact expiry");
            } else {
                assert!(
                    waited <= S(7) + Duration::from_secs_f64(2.0 * 2.2),
                    "polling: {waited:?}"
                );
            }
            let s = spec(&fake);
            assert_eq!(s.holder_identity.as_deref(), Some("me"));
            assert_eq!(s.lease_transitions, Some(5), "a change of holder");
            assert_eq!(guard.fencing_token(), 5);
            assert_eq!(
                fake.lease().unwrap().metadata.labels.unwrap()["app"],
                "x",
                "metadata kept"
            );
        }
    });
}

/// A record this process saw elsewhere (a sharded election's own watch) is
/// the campaign's first observation: an unchanged record expires a lease
/// duration after it was seen there; a record that changed since restarts
/// the clock at the campaign's own read, and so does another object.
#[cfg(feature = "unstable-shards")]
#[test]
fn a_seeded_observation_counts_only_for_the_same_record() {
    paused(async {
        for (case, change) in [("same record", 0), ("renewed since", 1), ("re-created", 2)] {
            let fake = FakeLeaseApi::default();
            fake.put(held_by("other", 7));
            let seen_at = Instant::now();
            let seen = fake.lease().unwrap();
            sleep(S(5)).await;
            match change {
                1 => {
                    let mut l = fake.lease().unwrap();
                    l.spec.as_mut().unwrap().renew_time =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                            k8s_openapi::jiff::Timestamp::now(),
                        ));
                    fake.put(l);
                }
                2 => {
                    fake.delete();
                    fake.put(held_by("other", 7));
                }
                _ => {}
            }
            let (e, _) = elector(&fake, config("me"));
            e.hand_over_record(seen.clone(), seen_at);
            let start = Instant::now();
            let guard = e.acquire().await.unwrap();
            let waited = start.elapsed();
            let expected = if change == 0 { S(2) } else { S(7) };
            assert_eq!(waited, expected, "{case}: took over after {waited:?}");
            assert!(guard.is_valid(), "{case}");
        }
    });
}

#[test]
fn a_renewing_holder_is_never_taken_over() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("other", 3));
        let (e, _) = elector(&fake, config("me"));
        let mut acquire = e.acquire();
        for _ in 0..30 {
            sleep(S(2)).await;
            let mut l = fake.lease().unwrap();
            l.spec.as_mut().unwrap().renew_time = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now()),
            );
            fake.put(l);
            assert!(poll!(&mut acquire).is_pending());
        }
        assert!(!e.is_leader());
        assert_eq!(e.status().holder.as_deref(), Some("other"));
        sleep(S(3)).await;
        assert!(acquire.await.is_ok(), "taken once the holder stops renewing");
    });
}

#[test]
fn leader_gives_up_at_the_renew_deadline_after_its_last_successful_renewal_was_sent() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        sleep(S(3)).await; // one renewal at +2 s
        let last_sent = Instant::now() - S(1);
        fake.partition(id, true);
        let lost = guard.await;
        assert_eq!(lost, Lost::RenewDeadlineExceeded);
        assert_eq!(Instant::now(), last_sent + S(10));
        assert!(!e.is_leader());
    });
}

#[test]
fn a_slow_response_does_not_stretch_the_renew_deadline() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me").watch(false));
        let guard = e.acquire().await.unwrap();
        let start = Instant::now();
        // The renewal at +2 s takes effect at once but its answer takes 60 s.
        fake.fault(id, Some("update"), Fault::DelayResponse(S(60)));
        let lost = guard.await;
        assert_eq!(lost, Lost::RenewDeadlineExceeded);
        assert_eq!(
            start.elapsed(),
            S(10),
            "bounded from the acquisition, not from the slow write"
        );
    });
}

#[test]
fn transient_errors_and_timeouts_are_retried_until_the_deadline() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me").watch(false));
        let guard = e.acquire().await.unwrap();
        fake.fault(id, Some("update"), Fault::Status(500));
        fake.fault(id, Some("update"), Fault::Status(503));
        fake.fault(id, Some("update"), Fault::DelayRequest(S(3)));
        sleep(S(20)).await;
        assert!(
            guard.is_valid(),
            "renewed after two errors and one slow request within the deadline"
        );
        assert!(e.is_leader());
        // A request that hangs is cut at the deadline: one renewal at +22 s hangs, the term ends at +30 s.
        let start = Instant::now();
        fake.fault(id, Some("update"), Fault::DelayRequest(S(3600)));
        fake.fault(id, Some("update"), Fault::DelayRequest(S(3600)));
        fake.fault(id, Some("update"), Fault::DelayRequest(S(3600)));
        let lost = guard.await;
        assert_eq!(lost, Lost::RenewDeadlineExceeded);
        assert!(start.elapsed() <= S(10), "{:?}", start.elapsed());
    });
}

#[test]
fn conflict_falls_to_a_read_and_keeps_a_lease_still_ours() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me").watch(false));
        let guard = e.acquire().await.unwrap();
        // Someone touches the object (say, a label) without taking it.
        let mut l = fake.lease().unwrap();
        l.metadata.labels = Some([("touched".to_owned(), "yes".to_owned())].into());
        fake.put(l);
        let start = Instant::now();
        sleep(S(5)).await;
        assert_eq!(count(&fake, id, "get", start), 1, "one read after the conflict");
        assert!(guard.is_valid());
        assert_eq!(fake.lease().unwrap().metadata.labels.unwrap()["touched"], "yes");
    });
}

#[test]
fn a_takeover_is_noticed_at_once_with_a_watch_and_at_the_next_renewal_without() {
    paused(async {
        for watch in [true, false] {
            let fake = free();
            let (e, _) = elector(&fake, config("me").watch(watch));
            let guard = e.acquire().await.unwrap();
            sleep(Duration::from_millis(500)).await;
            let mut l = fake.lease().unwrap();
            l.spec.as_mut().unwrap().holder_identity = Some("intruder".into());
            let start = Instant::now();
            fake.put(l);
            assert_eq!(guard.await, taken_by("intruder"));
            let took = start.elapsed();
            if watch {
                assert_eq!(took, Duration::ZERO);
            } else {
                assert_eq!(took, Duration::from_millis(1500));
            }
            assert_eq!(e.status().holder.as_deref(), Some("intruder"));
        }
    });
}

#[test]
fn a_lease_deleted_while_held_ends_the_term_and_can_be_recreated() {
    paused(async {
        for watch in [true, false] {
            let fake = free();
            let (e, _) = elector(&fake, config("me").watch(watch));
            let guard = e.acquire().await.unwrap();
            sleep(Duration::from_millis(500)).await;
            let deleted = Instant::now();
            fake.delete();
            assert_eq!(guard.await, Lost::Deleted);
            assert_eq!(
                deleted.elapsed(),
                if watch {
                    Duration::ZERO
                } else {
                    Duration::from_millis(1500)
                }
            );
            let lost_at = deleted.elapsed();
            let again = e.acquire().await.unwrap();
            // Re-created at once, led one lease duration later: whoever might have
            // held another incarnation meanwhile has given up by then.
            assert_eq!(deleted.elapsed(), lost_at + S(15));
            assert!(again.is_valid());
            assert_eq!(spec(&fake).holder_identity.as_deref(), Some("me"));
            assert_eq!(
                spec(&fake).lease_transitions,
                Some(2),
                "re-created, with more transitions than the deleted object had (a fencing token never goes back)"
            );
        }
    });
}

#[test]
fn a_candidate_that_saw_the_lease_waits_a_lease_duration_after_its_deletion() {
    paused(async {
        let fake = free();
        let (leader, _) = elector(&fake, config("leader"));
        let g = leader.acquire().await.unwrap();
        let (f, _) = elector(&fake, config("follower"));
        let mut acquire = Box::pin(f.acquire());
        assert!(tokio::time::timeout(S(5), &mut acquire).await.is_err());
        let deleted = Instant::now();
        fake.delete();
        assert_eq!(g.await, Lost::Deleted);
        drop(leader);
        let _g = acquire.await.unwrap();
        assert_eq!(
            deleted.elapsed(),
            S(15),
            "created at once, led after one lease duration"
        );
        assert_eq!(spec(&fake).holder_identity.as_deref(), Some("follower"));
    });
}

/// A failed request is logged with what failed, and a refused one (401,
/// 403) at error level with the RBAC rule, naming the verb that is missing
/// (mutation testing: `Task::log_error` replaced with `()` was missed).
#[test]
fn a_failed_request_is_logged_and_a_forbidden_one_names_the_missing_verb() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = free();
            let (e, id) = elector(&fake, config("me").watch(false));
            fake.fault(id, Some("get"), Fault::Status(403));
            fake.fault(id, Some("update"), Fault::Status(500));
            let guard = tokio::time::timeout(S(60), e.acquire()).await.expect("leads");
            assert!(guard.unwrap().is_valid());
        });
    });
    let forbidden: Vec<_> = logs.lines().filter(|l| l.contains("forbidden to")).collect();
    assert_eq!(forbidden.len(), 1, "{logs}");
    assert!(forbidden[0].contains("ERROR"), "{logs}");
    assert!(
        forbidden[0].contains("forbidden to get lease default/lease: RBAC needs verbs get, create, update")
    );
    assert!(forbidden[0].contains("`get` is missing"), "{logs}");
    let failed: Vec<_> = logs
        .lines()
        .filter(|l| l.contains("acquiring the lease failed"))
        .collect();
    assert_eq!(failed.len(), 1, "{logs}");
    assert!(failed[0].contains("WARN") && failed[0].contains("500"), "{logs}");
}

/// A create refused by admission (a `ResourceQuota` at
/// its limit: a 403 that names no cause) is no missing RBAC verb: each
/// refusal is logged as a failed attempt with the API server's message, the
/// create is retried every jittered retry period, and the candidate leads
/// once admission lets the Lease be created.
#[test]
fn a_create_refused_by_admission_is_not_logged_as_a_missing_rbac_verb_and_is_retried() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default();
            let (e, id) = elector(&fake, config("me").watch(false));
            for _ in 0..3 {
                fake.fault(id, Some("create"), Fault::Admission);
            }
            let guard = tokio::time::timeout(S(60), e.acquire())
                .await
                .expect("leads once admission lets the Lease be created")
                .unwrap();
            assert!(guard.is_valid());
            let creates = fake
                .requests()
                .iter()
                .filter(|r| r.client == id && r.verb == "create")
                .count();
            assert_eq!(creates, 4, "three refused, then the one that made the Lease");
        });
    });
    let refused: Vec<_> = logs.lines().filter(|l| l.contains("exceeded quota")).collect();
    assert_eq!(refused.len(), 3, "{logs}");
    for line in refused {
        assert!(!line.contains("RBAC") && !line.contains("is missing"), "{line}");
        assert!(
            line.contains("WARN") && line.contains("acquiring the lease failed"),
            "{line}"
        );
    }
}

/// One verb on `leases` missing at a time,
/// the others granted. Without `get` or `create` (no Lease yet) the
/// candidate never leads; without `update` it creates the Lease and, with
/// the creation hold, never leads (its renewals during the hold are
/// refused, and the hold outlasts the renew deadline), or, without the
/// hold, leads one term that ends at the renew deadline after the
/// creation, is never led again, and is left to expire; every refusal's
/// line names that verb, and no other.
#[test]
fn each_lease_verb_missing_alone_is_named_and_never_leads_past_the_renew_deadline() {
    for (verb, hold, leads) in [
        ("get", true, false),
        ("create", true, false),
        ("update", true, false),
        ("update", false, true),
    ] {
        let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
            paused(async {
                let fake = FakeLeaseApi::default().with_request_budget(5_000);
                let (e, id) = elector(&fake, config("me").creation_hold(hold));
                for _ in 0..1_000 {
                    fake.fault(id, Some(verb), Fault::Status(403));
                }
                let start = Instant::now();
                let mut acquire = std::pin::pin!(e.acquire());
                let led = tokio::time::timeout(S(120), &mut acquire).await;
                assert_eq!(led.is_ok(), leads, "{verb} missing (hold {hold}): led {led:?}");
                if let Ok(guard) = led {
                    let guard = guard.unwrap();
                    let lost = tokio::time::timeout(S(11), guard).await;
                    assert_eq!(lost, Ok(Lost::RenewDeadlineExceeded), "{verb} missing");
                    assert!(
                        start.elapsed() <= S(10),
                        "led {:?} after the creation",
                        start.elapsed()
                    );
                    let mut again = std::pin::pin!(e.acquire());
                    assert!(
                        tokio::time::timeout(S(120), &mut again).await.is_err(),
                        "led again without `update`"
                    );
                    assert_eq!(
                        spec(&fake).holder_identity.as_deref(),
                        Some("me"),
                        "left to expire: no release without `update`"
                    );
                }
                assert!(!e.is_leader());
            });
        });
        let forbidden: Vec<_> = logs.lines().filter(|l| l.contains("forbidden to")).collect();
        assert!(
            !forbidden.is_empty(),
            "{verb} missing: nothing names it; logs:\n{logs}"
        );
        for line in forbidden {
            assert!(
                line.contains(&format!("forbidden to {verb} lease default/lease"))
                    && line.contains(&format!("`{verb}` is missing")),
                "{verb} missing: {line}"
            );
        }
    }
}

#[test]
fn forbidden_and_unreachable_api_servers_are_retried_every_jittered_retry_period_and_never_lead() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me").watch(false));
        for _ in 0..1000 {
            fake.fault(id, None, Fault::Status(403));
        }
        let mut acquire = std::pin::pin!(e.acquire());
        let start = Instant::now();
        assert!(tokio::time::timeout(S(120), &mut acquire).await.is_err());
        assert!(!e.is_leader());
        let gets = count(&fake, id, "get", start);
        // Every 2 to 4.4 s: client-go's jittered retry period, whatever
        // failed (no backoff that would outlast the outage).
        assert!((27..=61).contains(&gets), "{gets} reads in 120 s");
        let seen = fake.requests();
        let gaps: Vec<_> = seen.windows(2).map(|w| w[1].at - w[0].at).collect();
        assert!(gaps.iter().all(|g| (S(2)..=MS(4_400)).contains(g)), "{gaps:?}");
        // Jittered: spread over that range, not one fixed period (candidates
        // that failed together would retry together).
        let spread = gaps
            .iter()
            .max()
            .zip(gaps.iter().min())
            .map(|(max, min)| max.saturating_sub(*min));
        assert!(spread > Some(S(1)), "{gaps:?}");
        // Unreachable for a minute (a partition): still retried, never leads.
        fake.partition(id, true);
        assert!(tokio::time::timeout(S(60), &mut acquire).await.is_err());
        assert!(!e.is_leader());
        // The API server comes back and RBAC is fixed: the same call leads
        // at its next attempt, within one jittered retry period (a refused or
        // unreachable request fails at once).
        fake.partition(id, false);
        fake.clear_faults();
        let guard = tokio::time::timeout(MS(4_400), &mut acquire)
            .await
            .expect("no lead within 4.4 s of the recovery")
            .unwrap();
        assert!(guard.is_valid());
        assert!(e.is_leader());
    });
}

#[test]
fn malformed_records_have_defined_outcomes() {
    paused(async {
        // (spec, how long until we may take it)
        let mut no_spec = held_by("x", 1);
        no_spec.spec = None;
        let mut no_holder = held_by("x", 1);
        no_holder.spec.as_mut().unwrap().holder_identity = None;
        let mut no_times = held_by("x", 5);
        no_times.spec.as_mut().unwrap().acquire_time = None;
        no_times.spec.as_mut().unwrap().renew_time = None;
        let mut no_duration = held_by("x", 1);
        no_duration.spec.as_mut().unwrap().lease_duration_seconds = None;
        let cases = [
            ("no spec: free", no_spec, S(0), Some(1)),
            ("no holder: free", no_holder, S(0), Some(5)),
            ("zero duration: ours (15 s)", held_by("x", 0), S(15), Some(5)),
            ("negative duration: ours (15 s)", held_by("x", -5), S(15), Some(5)),
            ("missing duration: ours (15 s)", no_duration, S(15), Some(5)),
            ("missing times: record's duration", no_times, S(5), Some(5)),
        ];
        for (what, lease, after, transitions) in cases {
            let fake = FakeLeaseApi::default();
            fake.put(lease);
            let (e, _) = elector(&fake, config("me"));
            let start = Instant::now();
            let _guard = e.acquire().await.unwrap();
            assert_eq!(start.elapsed(), after, "{what}");
            let s = spec(&fake);
            assert_eq!(s.holder_identity.as_deref(), Some("me"), "{what}");
            assert_eq!(s.lease_duration_seconds, Some(15), "{what}");
            assert_eq!(s.lease_transitions, transitions, "{what}");
        }
    });
}

#[test]
fn strategy_and_preferred_holder_are_kept_and_a_preferred_holder_is_honoured() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let mut lease = held_by("", 1);
        lease.spec.as_mut().unwrap().strategy = Some("OldestEmulationVersion".into());
        fake.put(lease);
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        sleep(S(5)).await;
        assert_eq!(
            spec(&fake).strategy.as_deref(),
            Some("OldestEmulationVersion"),
            "kept on acquire and renew"
        );
        // The coordinated leader election controller prefers someone else.
        let mut l = fake.lease().unwrap();
        l.spec.as_mut().unwrap().preferred_holder = Some("pref".into());
        fake.put(l);
        let lost = tokio::time::timeout(S(5), guard)
            .await
            .expect("stepped down for the preferred holder");
        assert_eq!(
            lost,
            Lost::SteppedDown {
                preferred_holder: "pref".into()
            }
        );
        sleep(Duration::from_millis(1)).await;
        let s = spec(&fake);
        assert_eq!(
            s.holder_identity.as_deref(),
            Some("me"),
            "the guarded work was stopped, not finished: left to expire, not released"
        );
        assert_eq!(s.preferred_holder.as_deref(), Some("pref"), "kept");
        assert_eq!(s.strategy.as_deref(), Some("OldestEmulationVersion"));
        // The expired lease is reserved for the preferred holder: it takes it at
        // expiry, while anyone else would wait one more lease duration.
        let (other, _) = elector(&fake, config("other"));
        let mut other_acquire = Box::pin(other.acquire());
        assert!(poll!(&mut other_acquire).is_pending());
        let (pref, _) = elector(&fake, config("pref"));
        let start = Instant::now();
        let g = pref.acquire().await.unwrap();
        assert_eq!(
            start.elapsed(),
            S(15),
            "the preferred holder takes it one lease duration after it first saw it"
        );
        assert!(g.is_valid());
        assert_eq!(spec(&fake).holder_identity.as_deref(), Some("pref"));
        assert!(
            tokio::time::timeout(S(30), &mut other_acquire).await.is_err(),
            "pref keeps it"
        );
    });
}

#[test]
fn dropping_the_last_guard_releases_the_lease() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        sleep(S(3)).await;
        let before = spec(&fake);
        drop(guard);
        sleep(Duration::from_millis(1)).await;
        let s = spec(&fake);
        assert_eq!(s.holder_identity.as_deref(), Some(""));
        assert_eq!(s.lease_duration_seconds, Some(1));
        assert_eq!(s.lease_transitions, before.lease_transitions);
        assert!(!e.is_leader());
        // A standby takes it over at once.
        let (b, _) = elector(&fake, config("b"));
        let start = Instant::now();
        let _g = b.acquire().await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(spec(&fake).lease_transitions, Some(2));
    });
}

/// A re-acquisition by the holder that released is a change of holder
/// (`""` to it), as client-go counts it: transitions one more, a new
/// `acquireTime = renewTime`, and a larger fencing token.
#[test]
fn a_holder_that_released_and_takes_the_lease_again_counts_a_transition() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let first = e.acquire().await.unwrap();
        let (token, held) = (first.fencing_token(), spec(&fake));
        sleep(S(3)).await;
        drop(first);
        sleep(Duration::from_millis(1)).await;
        let released = spec(&fake);
        assert_eq!(released.holder_identity.as_deref(), Some(""));
        assert_eq!(released.lease_transitions, held.lease_transitions);
        let again = e.acquire().await.unwrap();
        let s = spec(&fake);
        assert_eq!(s.holder_identity.as_deref(), Some("me"));
        assert_eq!(s.lease_transitions, held.lease_transitions.map(|t| t + 1));
        assert_eq!(s.acquire_time, s.renew_time);
        assert!(s.acquire_time >= released.renew_time);
        assert!(again.fencing_token() > token);
    });
}

#[test]
fn release_off_lets_the_lease_expire() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me").release_on_drop(false));
        drop(e.acquire().await.unwrap());
        sleep(S(1)).await;
        assert_eq!(spec(&fake).holder_identity.as_deref(), Some("me"));
    });
}

#[test]
fn release_never_clears_a_lease_someone_else_took() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me").watch(false));
        let guard = e.acquire().await.unwrap();
        // Our renewals fail; meanwhile another candidate legitimately takes the lease.
        fake.partition(id, true);
        assert_eq!(guard.await, Lost::RenewDeadlineExceeded);
        fake.partition(id, false);
        fake.put(held_by("new-leader", 15));
        e.shutdown(S(1)).await.unwrap();
        assert_eq!(spec(&fake).holder_identity.as_deref(), Some("new-leader"));
    });
}

#[test]
fn a_guard_never_polled_keeps_the_lease_for_many_renew_deadlines() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        sleep(S(35)).await;
        assert!(guard.is_valid());
        assert!(e.is_leader());
        assert!(guard.lost().is_none());
    });
}

#[test]
fn every_waiter_gets_a_guard_of_the_same_term() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let (a, b) = tokio::join!(e.acquire(), e.acquire());
        let (a, b) = (a.unwrap(), b.unwrap());
        let c = e
            .acquire()
            .now_or_never()
            .expect("already leading: at once")
            .unwrap();
        assert_eq!(
            count(&fake, id, "update", Instant::now() - S(100)),
            1,
            "one acquisition for all waiters"
        );
        drop(a);
        drop(b);
        sleep(S(5)).await;
        assert!(c.is_valid(), "one guard left keeps leadership");
        drop(c);
        sleep(Duration::from_millis(1)).await;
        assert_eq!(spec(&fake).holder_identity.as_deref(), Some(""));
    });
}

#[test]
fn shutdown_waits_for_guards_then_releases_and_fails_pending_acquires() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        let signal = e.shutdown_requested();
        assert_send_sync_static(&signal);
        let worker = tokio::spawn(async move {
            signal.await;
            sleep(S(2)).await; // finishing work in flight
            drop(guard);
        });
        let start = Instant::now();
        e.shutdown(S(30)).await.unwrap();
        assert_eq!(start.elapsed(), S(2));
        worker.await.unwrap();
        assert_eq!(spec(&fake).holder_identity.as_deref(), Some(""));
        assert!(matches!(e.acquire().await, Err(crate::AcquireError::Shutdown)));
    });
}

#[test]
fn shutdown_is_bounded_when_guarded_work_does_not_stop() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        let start = Instant::now();
        e.shutdown(S(3)).await.unwrap();
        // The grace, then the term ends and the work is stopped: no release, so
        // nothing more to wait for.
        assert_eq!(start.elapsed(), S(3));
        assert_eq!(guard.lost(), Some(Lost::Shutdown));
        assert!(!guard.is_valid());
        assert_eq!(
            spec(&fake).holder_identity.as_deref(),
            Some("me"),
            "not released under live work"
        );
    });
}

#[test]
fn an_unwanted_election_stops_campaigning() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("other", 15));
        let (e, id) = elector(&fake, config("me").watch(false));
        let mut acquire = Box::pin(e.acquire());
        assert!(tokio::time::timeout(S(5), &mut acquire).await.is_err());
        drop(acquire);
        sleep(Duration::from_millis(1)).await;
        let since = Instant::now();
        sleep(S(60)).await;
        assert_eq!(
            fake.requests()
                .iter()
                .filter(|s| s.client == id && s.at >= since)
                .count(),
            0
        );
    });
}

#[test]
fn health_check_fails_only_for_an_overdue_leader() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        assert!(e.health_check(S(20)).is_ok(), "healthy while not leading");
        let guard = e.acquire().await.unwrap();
        sleep(S(100)).await;
        assert!(e.health_check(S(0)).is_ok(), "renewing on time");
        assert!(guard.is_valid());
        // A leader whose election task is stuck (its renewals stopped without the
        // term ending): overdue past lease duration + tolerance.
        let stuck = std::sync::Arc::new(crate::term::Term::new(1, Instant::now() - S(40), S(10)));
        e.set_term_for_test(stuck);
        let err = e.health_check(S(20)).unwrap_err();
        assert_eq!(
            err,
            crate::HealthError::RenewalOverdue {
                since: S(40),
                limit: S(35)
            }
        );
        assert!(e.health_check(S(30)).is_ok(), "within a larger tolerance");
        // As client-go's: overdue only once strictly past the limit
        // (mutation testing: kills `> -> >=`).
        assert!(e.health_check(S(25)).is_ok(), "exactly at the limit");
        assert!(e.health_check(Duration::from_nanos(24_999_999_999)).is_err());
    });
}

/// Subscribers are told of every change of status, and only of changes
/// (mutation testing: kills `!= -> ==` in `update_status`).
#[test]
fn subscribers_are_told_of_changes_only() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let mut status = e.subscribe();
        status.borrow_and_update();
        let guard = e.acquire().await.unwrap();
        assert!(status.has_changed().unwrap(), "not told it leads");
        assert!(status.borrow_and_update().is_leader);
        // Renewals leave the status as it was.
        sleep(S(30)).await;
        assert!(guard.is_valid());
        assert!(
            !status.has_changed().unwrap(),
            "told of renewals: {:?}",
            *status.borrow()
        );
        fake.take_over("other");
        assert_eq!(guard.await, taken_by("other"));
        assert!(status.has_changed().unwrap());
        assert_eq!(status.borrow_and_update().holder.as_deref(), Some("other"));
    });
}

#[test]
fn followers_make_no_requests_beyond_their_watch() {
    paused(async {
        let fake = free();
        let (leader, _) = elector(&fake, config("leader"));
        let _g = leader.acquire().await.unwrap();
        let (f, id) = elector(&fake, config("follower"));
        let mut acquire = std::pin::pin!(f.acquire());
        assert!(tokio::time::timeout(S(1), &mut acquire).await.is_err());
        let since = Instant::now();
        assert!(tokio::time::timeout(S(600), &mut acquire).await.is_err());
        let requests: Vec<_> = fake
            .requests()
            .into_iter()
            .filter(|s| s.client == id && s.at >= since)
            .collect();
        assert!(requests.is_empty(), "{requests:?}");
        assert_eq!(f.status().holder.as_deref(), Some("leader"));
    });
}

#[test]
fn a_forbidden_watch_falls_back_to_polling() {
    paused(async {
        let fake = free();
        let (leader, _) = elector(&fake, config("leader"));
        let g = leader.acquire().await.unwrap();
        let (f, id) = elector(&fake, config("follower"));
        fake.forbid_watch(id);
        let mut acquire = std::pin::pin!(f.acquire());
        let since = Instant::now();
        assert!(tokio::time::timeout(S(60), &mut acquire).await.is_err());
        let gets = count(&fake, id, "get", since);
        assert!(
            (13..=31).contains(&gets),
            "polls every jittered retry period: {gets}"
        );
        drop(g);
        let start = Instant::now();
        let guard = acquire.await.unwrap();
        assert!(guard.is_valid());
        assert!(
            start.elapsed() <= Duration::from_secs_f64(4.4),
            "next poll after the release"
        );
    });
}

/// A 403 on the watch that passes (an apiserver just restarted serves
/// before its authorization cache has synced, and RBAC denies what it will
/// allow seconds later) does not leave the elector polling for good: the
/// watcher retries with kube-runtime's backoff (at most 30 s, jittered up to
/// twice that), and the polling ends. The chaos run found candidates polling
/// for the rest of their lives after one.
#[test]
fn a_watch_forbidden_for_a_while_is_opened_again_and_the_polling_ends() {
    paused(async {
        let fake = free();
        let (leader, _) = elector(&fake, config("leader"));
        let _guard = leader.acquire().await.unwrap();
        let (f, id) = elector(&fake, config("follower"));
        fake.forbid_watch(id);
        let mut acquire = std::pin::pin!(f.acquire());
        assert!(tokio::time::timeout(S(30), &mut acquire).await.is_err());
        assert!(
            count(&fake, id, "get", Instant::now() - S(30)) >= 6,
            "polls while forbidden"
        );
        fake.allow_watch(id);
        // Within the watcher's longest backoff, the watch is back and the
        // polling ends.
        assert!(tokio::time::timeout(S(60), &mut acquire).await.is_err());
        let since = Instant::now();
        assert!(tokio::time::timeout(S(60), &mut acquire).await.is_err());
        let gets = count(&fake, id, "get", since);
        assert!(
            gets <= 1,
            "{gets} reads in the 60 s after the watch was allowed again: still polling"
        );
    });
}

#[test]
fn a_release_is_taken_within_one_watch_event_and_one_write() {
    paused(async {
        let fake = free();
        let (leader, _) = elector(&fake, config("leader"));
        let g = leader.acquire().await.unwrap();
        let (f, id) = elector(&fake, config("follower"));
        let mut acquire = std::pin::pin!(f.acquire());
        assert!(tokio::time::timeout(S(30), &mut acquire).await.is_err());
        let since = Instant::now();
        drop(g);
        let guard = acquire.await.unwrap();
        assert_eq!(since.elapsed(), Duration::ZERO);
        let requests: Vec<_> = fake
            .requests()
            .into_iter()
            .filter(|s| s.client == id && s.at >= since)
            .map(|s| s.verb)
            .collect();
        assert_eq!(requests, ["update"]);
        assert_eq!(guard.fencing_token(), 2);
        advance(Duration::from_millis(1)).await;
    });
}

#[test]
fn fencing_helpers_follow_the_renew_deadline() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        assert_eq!(guard.fencing_token(), 1);
        assert_eq!(guard.time_left(), S(10));
        sleep(Duration::from_millis(2500)).await;
        assert_eq!(guard.time_left(), Duration::from_millis(9500), "renewed at +2 s");
        fake.partition(id, true);
        sleep(S(9)).await;
        assert_eq!(guard.time_left(), Duration::from_millis(500));
        assert!(guard.is_valid());
        sleep(Duration::from_millis(500)).await;
        assert!(!guard.is_valid(), "not valid from the deadline on");
        assert_eq!(guard.time_left(), Duration::ZERO);
        sleep(Duration::from_millis(1)).await;
        assert_eq!(guard.lost(), Some(Lost::RenewDeadlineExceeded));
        // The next term has a larger token.
        fake.partition(id, false);
        let (other, _) = elector(&fake, config("other"));
        let g2 = other.acquire().await.unwrap();
        assert!(g2.fencing_token() > guard.fencing_token());
    });
}

/// A caller that acquires again as soon as its guard ends (a guarded stream
/// re-created in a loop) waits for the next term. Were it handed a guard of
/// the term whose renew deadline just passed (the elector task not having
/// noticed yet), the guard would end at once, the caller would spin, and the
/// elector, finding neither guard nor waiter in between, would give the lease
/// up as if shut down.
#[test]
fn acquiring_at_the_renew_deadline_waits_for_the_next_term() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me").watch(false));
        let guard = e.acquire().await.unwrap();
        fake.partition(id, true);
        sleep(guard.time_left()).await;
        assert!(!guard.is_valid());
        let mut again = Box::pin(e.acquire());
        assert!(
            poll!(&mut again).is_pending(),
            "no guard of a term past its renew deadline"
        );
        assert_eq!(guard.await, Lost::RenewDeadlineExceeded);
        sleep(S(1)).await;
        assert!(poll!(&mut again).is_pending(), "partitioned: no new term");
        fake.partition(id, false);
        let next = again.await.unwrap();
        assert!(next.is_valid());
        assert_eq!(next.time_left(), S(10), "a fresh term");
        assert_eq!(
            spec(&fake).holder_identity.as_deref(),
            Some("me"),
            "never released"
        );
        assert!(e.is_leader());
    });
}

/// A renewal sent in time but answered only at the renew deadline does not
/// bring the term back: guards (and guarded streams) read the deadline on
/// their own and may already have stopped, and a waiter would otherwise wait
/// for a term that is never handed out again.
#[test]
fn a_renewal_answered_at_the_renew_deadline_does_not_revive_the_term() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me").watch(false));
        let guard = e.acquire().await.unwrap();
        // The renewal at +2 s takes effect at once; its answer comes at +10 s,
        // the renew deadline counted from the acquisition.
        fake.fault(id, Some("update"), Fault::DelayResponse(S(8)));
        sleep(S(10)).await;
        assert!(!guard.is_valid());
        sleep(Duration::from_millis(1)).await;
        assert_eq!(guard.lost(), Some(Lost::RenewDeadlineExceeded));
        assert!(!guard.is_valid() && !e.is_leader());
    });
}

/// A renewal answered only at the renew deadline gives the term up in its
/// own words (and as a `late` renewal to the observers), not merely as a
/// term whose deadline passed with nothing said of the write that came too
/// late. Kills the late branch skipped (the loop then ends the term at its
/// next turn, silently).
#[test]
fn a_renewal_answered_at_the_renew_deadline_says_so() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = free();
            let (e, id) = elector(&fake, config("me").watch(false));
            let guard = e.acquire().await.unwrap();
            // The renewal at +2 s is answered at +10 s (the guard, not
            // polled, sets no timer of its own).
            fake.fault(id, Some("update"), Fault::DelayResponse(S(8)));
            sleep(S(11)).await;
            assert_eq!(guard.lost(), Some(Lost::RenewDeadlineExceeded));
            drop(guard);
            e.shutdown(S(1)).await.unwrap();
        });
    });
    assert!(
        logs.contains("the renewal succeeded only after the renew deadline; giving the term up"),
        "logs at WARN and above:\n{logs}"
    );
}

/// `shutdown` while a renewal is in flight: the renewal's answer, arriving
/// after the term was ended for the shutdown, is not mistaken for a late
/// renewal, and the Lease is still released.
#[test]
fn shutdown_during_a_renewal_in_flight_still_releases() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me").watch(false));
        let guard = e.acquire().await.unwrap();
        // The renewal at +2 s is answered at +3 s.
        fake.fault(id, Some("update"), Fault::DelayResponse(S(1)));
        sleep(Duration::from_millis(2500)).await;
        drop(guard);
        e.shutdown(S(5)).await.unwrap();
        assert_eq!(spec(&fake).holder_identity.as_deref(), Some(""), "released");
    });
}

/// The renew deadline counts from the instant before the successful request
/// was sent, not from its answer: a renewal applied at once but answered late
/// extends the term only from when it was sent. (Counted from the answer, a
/// leader would believe it leads up to the response delay longer than any
/// follower allows.)
#[test]
fn the_renew_deadline_counts_from_before_the_request_not_from_its_answer() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me").watch(false));
        let guard = e.acquire().await.unwrap();
        // The renewal at +2 s takes effect at once and is answered at +3.5 s.
        fake.fault(
            id,
            Some("update"),
            Fault::DelayResponse(Duration::from_millis(1500)),
        );
        sleep(Duration::from_millis(3600)).await;
        assert!(guard.is_valid());
        assert_eq!(
            guard.time_left(),
            Duration::from_millis(8400),
            "deadline = sent (+2 s) + 10 s, not answered (+3.5 s) + 10 s"
        );
    });
}

/// Releasing never clears a record that is not our term's, even when our own
/// term ends as a release (a shutdown) and we never saw the other record: it
/// was written after our last renewal, and we poll.
#[test]
fn a_release_reads_first_and_never_frees_another_candidates_record() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me").watch(false));
        let guard = e.acquire().await.unwrap();
        sleep(Duration::from_millis(500)).await;
        // Someone else's record lands (a forced takeover) between our renewals.
        let mut lease = fake.lease().unwrap();
        lease.spec.as_mut().unwrap().holder_identity = Some("other".into());
        fake.put(lease);
        drop(guard);
        e.shutdown(S(1)).await.unwrap();
        assert_eq!(spec(&fake).holder_identity.as_deref(), Some("other"));
    });
}

/// A `preferredHolder` naming this leader itself (set during its term: the
/// coordinated election picked it) is no reason to step down.
#[test]
fn a_leader_preferred_during_its_term_keeps_leading() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let mut lease = held_by("", 1);
        lease.spec.as_mut().unwrap().strategy = Some("OldestEmulationVersion".into());
        fake.put(lease);
        let (e, _) = elector(&fake, config("me"));
        let mut guard = e.acquire().await.unwrap();
        let mut l = fake.lease().unwrap();
        l.spec.as_mut().unwrap().preferred_holder = Some("me".into());
        fake.put(l);
        assert!(
            tokio::time::timeout(S(30), &mut guard).await.is_err(),
            "stepped down for itself: {:?}",
            guard.lost()
        );
        assert!(guard.is_valid());
        assert_eq!(spec(&fake).holder_identity.as_deref(), Some("me"));
    });
}

/// A takeover made while the leader's watch was broken ends the term as soon
/// as the watch is back (on its event, or the read that confirms it), not one
/// renewal later.
#[test]
fn a_takeover_made_while_the_watch_was_broken_ends_the_term_when_it_is_back() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me").retry_period(S(4)));
        let guard = e.acquire().await.unwrap();
        // Just after a renewal (at +4 s): the watch breaks (its restart fails
        // while partitioned), someone takes the Lease, the watch comes back.
        sleep(Duration::from_millis(4100)).await;
        fake.partition(id, true);
        sleep(Duration::from_millis(100)).await;
        let mut taken = fake.lease().unwrap();
        let spec = taken.spec.as_mut().unwrap();
        spec.holder_identity = Some("other".into());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        fake.put(taken);
        sleep(Duration::from_millis(100)).await;
        fake.partition(id, false);
        let back = Instant::now();
        let lost = tokio::time::timeout(S(10), guard)
            .await
            .expect("the term never ended");
        assert_eq!(lost, taken_by("other"));
        // The next renewal would be at +8 s, 3.7 s after the watch came back.
        assert!(
            back.elapsed() < Duration::from_millis(3500),
            "ended only after {:?}",
            back.elapsed()
        );
    });
}

/// A foreign record delivered by the watch before it showed our own last
/// write may be older than that write: it is confirmed by a read, and the
/// term ends on that read, not one renewal later (mutation testing: kills
/// `verify -> Ok(())`). Here the watch's first list fails twice, so the term
/// begins on a polled read with the watch not yet in sync; the Lease is taken
/// over; the list that then succeeds shows the new holder.
#[test]
fn a_foreign_record_seen_before_our_write_was_is_confirmed_by_a_read() {
    paused(async {
        let fake = free();
        let (_e, _, guard) = leading_before_the_watch_synced(&fake).await;
        fake.take_over("other");
        let taken = Instant::now();
        let lost = tokio::time::timeout(S(60), guard)
            .await
            .expect("the term never ended");
        assert_eq!(lost, taken_by("other"));
        assert_eq!(lists(&fake), 3, "ended once the third list succeeded");
        // The next renewal (which would meet a conflict) is 20 s after the
        // term began.
        assert!(
            taken.elapsed() < S(15),
            "ended {:?} after the takeover, at a renewal, not on the read",
            taken.elapsed()
        );
    });
}

/// A foreign record the leader could not confirm (the read failed, so the
/// term went on) is no news when the watch delivers it again unchanged (here
/// a third party edits its labels): it is not read again, and the term ends
/// at its next renewal, which meets the conflict. Mutation testing: kills
/// `on_watch_event`'s `_ if !changed` guard replaced by `false`, which read
/// again at every such delivery.
#[test]
fn an_unchanged_foreign_record_delivered_again_is_not_read_again() {
    paused(async {
        let fake = free();
        let (_e, id, guard) = leading_before_the_watch_synced(&fake).await;
        // The read that would confirm the takeover fails: the term goes on.
        fake.fault(id, Some("get"), Fault::Status(500));
        fake.take_over("other");
        let taken = Instant::now();
        tokio::time::timeout(S(15), async {
            while count(&fake, id, "get", taken) == 0 {
                sleep(MS(50)).await;
            }
        })
        .await
        .expect("the watch never showed the takeover, or it was not read");
        sleep(MS(100)).await;
        assert_eq!(guard.lost(), None, "the term ended though the read failed");
        assert_eq!(count(&fake, id, "get", taken), 1);
        let mut edited = fake.lease().unwrap();
        edited.metadata.labels = Some([("edited".to_owned(), "yes".to_owned())].into());
        fake.put(edited);
        sleep(MS(100)).await;
        assert_eq!(
            count(&fake, id, "get", taken),
            1,
            "the unchanged record was read again"
        );
        assert_eq!(guard.lost(), None, "the term ended on a record already judged");
        let lost = tokio::time::timeout(S(30), guard)
            .await
            .expect("the term never ended");
        assert_eq!(lost, taken_by("other"));
    });
}

/// A watch error or a re-list does not make the leader "caught up" with its
/// own last write: only the watch delivering that write does. A re-list
/// served by a lagging watch cache shows the record before our write (here
/// the free one we took): that is confirmed by a read, which shows our term,
/// and the term goes on. Found by mutation testing: every event,
/// an error included, used to compare the last object *observed* (our own
/// write's answer) with our write, and claim the watch had caught up; the
/// stale record then ended the term at once, as taken over.
#[test]
fn a_re_list_from_a_lagging_cache_does_not_end_the_term() {
    paused(async {
        let fake = free();
        // No renewal before the re-list (retry period 20 s): the stale
        // record the re-list shows is the free one the term began on.
        let (e, id) = elector(&fake, unhurried("me"));
        let guard = e.acquire().await.unwrap();
        sleep(MS(100)).await;
        // The watch expires (410 Gone), so the watcher re-lists, and the
        // list comes from a cache one change behind.
        let lists = |fake: &FakeLeaseApi| fake.requests().iter().filter(|s| s.verb == "list").count();
        let before = lists(&fake);
        let gets = |fake: &FakeLeaseApi| fake.requests().iter().filter(|s| s.verb == "get").count();
        let gets_before = gets(&fake);
        fake.fault(id, Some("list"), Fault::StaleList);
        fake.expire_watches();
        // The watcher re-lists after its backoff (jittered).
        tokio::time::timeout(S(60), async {
            while lists(&fake) == before {
                sleep(MS(50)).await;
            }
        })
        .await
        .expect("the watcher re-listed");
        sleep(MS(100)).await;
        assert_eq!(guard.lost(), None, "the term ended on a stale record");
        assert_eq!(
            gets(&fake),
            gets_before + 1,
            "the stale record was confirmed by one read"
        );
        assert!(e.is_leader());
        assert_eq!(spec(&fake).holder_identity.as_deref(), Some("me"));
        // Still renewing, in a term that holds.
        sleep(S(30)).await;
        assert!(guard.is_valid());
    });
}

/// Work stopped at the end of a term may still land for lease duration −
/// renew deadline: a later term of the same elector that ends cleanly inside
/// that margin does not release either (a survivor of the
/// mutation run, `> -> <` in `end_term`'s margin check).
#[test]
fn a_clean_term_inside_the_margin_of_stopped_work_does_not_release() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        fake.partition(id, true);
        // The term ends at its renew deadline with its work still running.
        assert_eq!(guard.await, Lost::RenewDeadlineExceeded);
        fake.partition(id, false);
        let again = e.acquire().await.unwrap();
        let began = Instant::now();
        drop(again);
        sleep(Duration::from_millis(1500)).await;
        assert!(began.elapsed() < S(5), "still inside the 5 s margin");
        assert_eq!(
            spec(&fake).holder_identity.as_deref(),
            Some("me"),
            "released inside the margin of the stopped work"
        );
        // Once the margin has passed, a clean term releases again.
        sleep(S(5)).await;
        let last = e.acquire().await.unwrap();
        drop(last);
        sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            spec(&fake).holder_identity.as_deref(),
            Some(""),
            "released after the margin"
        );
    });
}

/// The margin of stopped work ends exactly lease duration − renew deadline
/// after the term that stopped it: a clean term ending at that instant
/// releases (a survivor of the mutation run, `> -> >=` in the same check).
#[test]
fn a_clean_term_ending_as_the_margin_of_stopped_work_passes_releases() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        fake.partition(id, true);
        assert_eq!(guard.await, Lost::RenewDeadlineExceeded);
        // Paused time: the task ended the term at this same instant.
        let ended = Instant::now();
        fake.partition(id, false);
        let again = e.acquire().await.unwrap();
        tokio::time::sleep_until(ended + S(5)).await;
        drop(again);
        sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            spec(&fake).holder_identity.as_deref(),
            Some(""),
            "not released once the margin had passed"
        );
    });
}

/// Releasing retries a conflict once, after a fresh read, as client-go does,
/// and no other error: a second conflict, or a 500, is the release's error.
#[test]
fn a_release_retries_one_conflict_and_nothing_else() {
    paused(async {
        for (faults, updates, fails) in [
            (&[409_u16, 409][..], 2, true),
            (&[500][..], 1, true),
            (&[409][..], 2, false),
        ] {
            let fake = free();
            let (e, id) = elector(&fake, config("me"));
            let guard = e.acquire().await.unwrap();
            let updates_so_far = |fake: &FakeLeaseApi| {
                fake.requests()
                    .iter()
                    .filter(|r| r.client == id && r.verb == "update")
                    .count()
            };
            let before = updates_so_far(&fake);
            drop(guard);
            // The guard is gone: the release comes once nobody wants the
            // term (after one retry period); fail its writes first.
            for code in faults {
                fake.fault(id, Some("update"), Fault::Status(*code));
            }
            sleep(S(10)).await;
            assert_eq!(updates_so_far(&fake) - before, updates, "{faults:?}");
            let released = spec(&fake).holder_identity.as_deref() == Some("");
            assert_eq!(released, !fails, "{faults:?}");
        }
    });
}

/// Log lines written while `body` runs on this thread (the paused runtime's),
/// at `WARN` and above.
fn warnings_during(body: impl FnOnce()) -> String {
    crate::tests::support::logs_during(tracing::Level::WARN, body)
}

/// A broken watch is warned about once per outage, not once per retry of
/// the watch: the first failure says the candidate polls until it recovers,
/// the retries say nothing more.
#[test]
fn a_broken_watch_is_warned_about_once_per_outage_not_per_retry() {
    let logs = warnings_during(|| {
        paused(async {
            let fake = FakeLeaseApi::default();
            fake.put(held_by("other", 3600));
            let (f, id) = elector(&fake, config("follower"));
            let mut acquire = std::pin::pin!(f.acquire());
            assert!(tokio::time::timeout(S(5), &mut acquire).await.is_err());
            let cut = Instant::now();
            fake.partition(id, true);
            assert!(tokio::time::timeout(S(30), &mut acquire).await.is_err());
            let watches = count(&fake, id, "watch", cut);
            assert!(
                watches >= 3,
                "the watch was retried {watches} times during the outage"
            );
        });
    });
    let warned = logs.matches("lease watch failed").count();
    assert_eq!(
        warned, 1,
        "warnings about the broken watch in one outage (expected one):\n{logs}"
    );
}

/// A watch that resumes after an outage from its last resourceVersion (no
/// re-list, so no `InitDone`) is trusted again at its first event: the
/// follower stops polling with a read every retry period.
#[test]
fn a_watch_resumed_after_an_outage_ends_the_polling_at_its_first_event() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (leader, _) = elector(&fake, config("leader"));
        let _guard = leader.acquire().await.unwrap();
        let (f, id) = elector(&fake, config("follower"));
        let mut acquire = std::pin::pin!(f.acquire());
        assert!(tokio::time::timeout(S(5), &mut acquire).await.is_err());
        fake.partition(id, true);
        assert!(tokio::time::timeout(S(30), &mut acquire).await.is_err());
        fake.partition(id, false);
        let healed = Instant::now();
        // Back: the watch resumes (after the watcher's jittered backoff, up
        // to 30 s), and the leader's next renewal arrives on it.
        let deadline = healed + S(120);
        while count(&fake, id, "watch", healed) == 0 {
            assert!(
                Instant::now() < deadline,
                "the watch never came back: {:?}",
                fake.requests()
            );
            assert!(tokio::time::timeout(S(1), &mut acquire).await.is_err());
        }
        assert!(tokio::time::timeout(S(5), &mut acquire).await.is_err());
        let since = Instant::now();
        assert!(tokio::time::timeout(S(60), &mut acquire).await.is_err());
        let (gets, lists) = (count(&fake, id, "get", since), count(&fake, id, "list", since));
        assert!(
            gets <= 1 && lists == 0,
            "{gets} reads and {lists} lists in the 60 s after the watch came back: still polling"
        );
        assert!(
            count(&fake, id, "watch", since) <= 1,
            "the watch keeps failing: {:?}",
            fake.requests()
        );
    });
}

/// Invariant 1: a task is spawned only while none runs. Acquisitions that
/// wait together share one task; once it ended (nobody wanted leadership),
/// the next acquisition starts a new one.
#[test]
fn one_election_task_at_a_time() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let (a, b) = tokio::join!(e.acquire(), e.acquire());
        assert_eq!(e.tasks_for_test(), (true, true));
        assert_eq!(e.inner.lock().spawned, 1, "two tasks for one election");
        drop((a.unwrap(), b.unwrap()));
        // Released; the task lingers one retry period, then ends.
        sleep(S(5)).await;
        assert!(!e.tasks_for_test().0, "the task still runs");
        let _again = e.acquire().await.unwrap();
        assert_eq!(e.inner.lock().spawned, 2);
    });
}

/// A release that fails is what `shutdown` returns (the API's answer
/// attached), and the Lease is left to expire.
#[test]
fn a_failed_release_is_the_error_of_shutdown() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        drop(e.acquire().await.unwrap());
        fake.fault(id, Some("update"), Fault::Status(500));
        match e.shutdown(S(5)).await {
            Err(crate::ShutdownError::Release(error)) => assert_eq!(error.status(), Some(500), "{error:?}"),
            other => panic!("shutdown after a failed release: {other:?}"),
        }
        assert_eq!(
            spec(&fake).holder_identity.as_deref(),
            Some("me"),
            "released after all"
        );
    });
}

/// A waiter that gives up (its `acquire` dropped) tells the task at once:
/// with nobody left wanting leadership, the task leaves the election after
/// its linger (one retry period), instead of campaigning for nobody until
/// the Lease it waits for expires.
#[test]
fn a_dropped_acquire_lets_the_task_leave_after_its_linger() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("other", 3600));
        let (e, _) = elector(&fake, config("me"));
        let mut acquire = Box::pin(e.acquire());
        assert!(tokio::time::timeout(S(5), &mut acquire).await.is_err());
        assert!(e.inner.lock().running, "a task campaigns");
        assert!(format!("{acquire:?}").contains("Acquire"), "{acquire:?}");
        drop(acquire);
        sleep(S(10)).await;
        assert!(!e.inner.lock().running, "the task still campaigns for nobody");
    });
}

/// An `acquire` dropped before the task it spawned first ran leaves that
/// task nothing to do: it ends at once, with no request (as a task spawned
/// just before a shutdown does), instead of lingering with a watch for
/// nobody.
#[test]
fn a_task_whose_acquire_was_dropped_before_it_ran_makes_no_request() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let polled_once = futures::FutureExt::now_or_never(e.acquire());
        assert!(polled_once.is_none(), "nobody leads yet");
        assert!(e.inner.lock().running, "the first poll spawned a task");
        sleep(S(10)).await;
        assert!(!e.inner.lock().running, "the task still runs for nobody");
        let requests = fake.requests().iter().filter(|r| r.client == id).count();
        assert_eq!(requests, 0, "the task made requests for nobody");
    });
}

/// An elector's `Debug` names its Lease and identity, and what it observed
/// (mutation testing: kills `Debug::fmt -> Ok(..)`).
#[test]
fn debug_shows_the_lease_the_identity_and_the_status() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let _guard = e.acquire().await.unwrap();
        let debug = format!("{e:?}");
        for part in ["LeaderElector", "\"lease\"", "\"me\"", "holder: Some(\"me\")"] {
            assert!(debug.contains(part), "{part} missing from {debug}");
        }
    });
}

/// `current_guard` (the gate of work that runs only with a guard of the
/// term in force) hands out a guard while a term holds, and
/// none before, after the term, or once shutdown began; it never starts a
/// campaign (mutation testing: kills `current_guard -> None`).
#[test]
fn current_guard_is_a_guard_of_the_term_in_force_only() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        assert!(e.current_guard().is_none(), "no term yet");
        sleep(S(5)).await;
        assert_eq!(
            fake.lease().and_then(|l| l.spec?.holder_identity).as_deref(),
            Some(""),
            "current_guard campaigned"
        );
        let guard = e.acquire().await.unwrap();
        let current = e.current_guard().expect("a guard of the term in force");
        assert!(current.is_valid());
        assert_eq!(current.fencing_token(), guard.fencing_token());
        // The term ends (renew deadline, partitioned): no guard after it.
        fake.partition(id, true);
        assert_eq!(guard.await, Lost::RenewDeadlineExceeded);
        assert!(e.current_guard().is_none(), "the term ended");
        fake.partition(id, false);
        let again = e.acquire().await.unwrap();
        assert!(e.current_guard().is_some());
        let shutdown = e.shutdown(S(5));
        let mut shutdown = std::pin::pin!(shutdown);
        assert!(poll!(&mut shutdown).is_pending(), "waits for the guard");
        assert!(e.current_guard().is_none(), "shutdown began");
        drop(again);
        shutdown.await.unwrap();
    });
}

/// `shutdown` is bounded by renew deadline + release timeout + retry period
/// after the grace, and that bound is not cut short: a write to acquire in
/// flight when shutdown begins (answered after nearly the renew deadline),
/// then the release (its read answered just within the release timeout),
/// both fit (mutation testing: kills `+ -> -` in the bound).
#[test]
fn a_shutdown_that_meets_a_slow_acquisition_and_a_slow_release_ends_in_time() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        fake.fault(
            id,
            Some("update"),
            Fault::DelayResponse(Duration::from_millis(9_500)),
        );
        fake.fault(
            id,
            Some("get"),
            Fault::DelayResponse(Duration::from_millis(4_500)),
        );
        let mut acquire = Box::pin(e.acquire());
        assert!(poll!(&mut acquire).is_pending());
        sleep(MS(100)).await;
        let started = Instant::now();
        let result = e.shutdown(S(1)).await;
        assert!(result.is_ok(), "{result:?} after {:?}", started.elapsed());
        assert!(matches!(acquire.await, Err(crate::AcquireError::Shutdown)));
        assert!(
            started.elapsed() > S(12),
            "the slow steps were taken: {:?}",
            started.elapsed()
        );
        assert_eq!(holder(&fake).as_deref(), Some(""), "released");
    });
}

/// A Lease deleted while the leader's watch was down (its re-list is empty)
/// ends the term as deleted at the re-list, confirmed by a read, not at the
/// next renewal (mutation testing: kills `shows`'s `InitDone` arm and its `!`).
#[test]
fn a_lease_deleted_while_the_watch_was_down_ends_the_term_at_the_re_list() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, unhurried("me"));
        let guard = e.acquire().await.unwrap();
        sleep(MS(100)).await;
        // The watch expires, and the Lease is deleted before the re-list:
        // no watcher sees the deletion.
        fake.expire_watches();
        fake.delete();
        let deleted = Instant::now();
        let lost = tokio::time::timeout(S(60), guard)
            .await
            .expect("the term never ended");
        assert_eq!(lost, Lost::Deleted);
        assert!(
            deleted.elapsed() < S(15),
            "ended {:?} after the deletion: at a renewal, not at the re-list",
            deleted.elapsed()
        );
    });
}

/// A renewal answered 404 is confirmed by a read at once (mutation testing:
/// kills `renew`'s 404 guard `-> false`, which logged it and renewed again
/// at the next tick): the Lease was not deleted, so the term goes on (a
/// deletion the read confirms ends it: `tests::never_none`).
#[test]
fn a_renewal_answered_not_found_is_confirmed_by_a_read_at_once() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        let begun = Instant::now();
        fake.fault(id, Some("update"), Fault::Status(404));
        sleep(S(3)).await;
        let answered_404 = first_after(&fake, id, "update", begun).expect("a renewal");
        let read = fake
            .requests()
            .iter()
            .find(|r| r.client == id && r.verb == "get" && r.at >= answered_404)
            .map(|r| r.at);
        assert_eq!(read, Some(answered_404), "read at once after the 404");
        assert_eq!(guard.lost(), None, "the Lease is still ours: the term goes on");
        assert!(guard.is_valid());
    });
}

/// A renewal answered 404 whose read shows the Lease taken over ends the term
/// on that read, at the renewal's instant, not at the next renewal's conflict
/// (mutation testing: deleting the 404 path's `Some(Err(lost))` arm let the
/// term run one more retry period on a Lease someone else held).
#[test]
fn a_renewal_answered_not_found_ends_the_term_when_the_read_shows_a_takeover() {
    paused(async {
        let fake = free();
        // No watch: only the renewal's read can see the takeover.
        let (e, id) = elector(&fake, config("me").watch(false));
        let mut guard = e.acquire().await.unwrap();
        let taken = Instant::now();
        fake.take_over("other");
        fake.fault(id, Some("update"), Fault::Status(404));
        let lost = tokio::time::timeout(S(10), &mut guard)
            .await
            .expect("the term outlived its renew deadline");
        let answered_404 = first_after(&fake, id, "update", taken).expect("a renewal");
        assert_eq!(lost, taken_by("other"));
        assert_eq!(
            guard.lost(),
            Some(taken_by("other")),
            "the guard and the term agree"
        );
        assert!(
            answered_404.elapsed() < S(1),
            "ended {:?} after the 404: at a later renewal, not on the read that showed the takeover",
            answered_404.elapsed()
        );
    });
}

/// A leader whose guards come and go for a long term (an `acquire` while
/// leading, `current_guard` per reconcile as the guarded and warm
/// Controllers take it, a lost signal) keeps no memory per guard it ever
/// handed out: the term's senders stay at the live ones. So does the one
/// term of a disabled election, which never ends.
#[test]
fn a_long_term_keeps_nothing_per_guard_dropped() {
    for enabled in [true, false] {
        paused(async move {
            let fake = free();
            let (e, _) = elector(&fake, config("me").enabled(enabled));
            let guard = e.acquire().await.unwrap();
            for i in 0..5_000 {
                let g = e.acquire().await.unwrap();
                drop(g.lost_signal());
                drop(g);
                drop(e.current_guard().expect("a guard of the term in force"));
                if i % 500 == 0 {
                    sleep(S(1)).await;
                }
            }
            let term = e.inner.lock().term.clone().expect("the term in force");
            assert_eq!(guard.lost(), None, "the term goes on");
            let kept = term.senders_for_test();
            assert!(
                kept <= 16,
                "enabled: {enabled}: {kept} senders of the term's end kept for 1 live guard, \
                 after 10000 guards and 5000 signals dropped"
            );
        });
    }
}

/// A long term with a follower watching costs the same every five minutes
/// (of the most paused time a test may take): the same requests (a
/// renewal per retry period, the follower's watch) and the same tasks.
#[test]
fn a_long_term_costs_the_same_every_five_minutes() {
    paused(async {
        let fake = free();
        let (leader, _) = elector(&fake, config("a"));
        let guard = leader.acquire().await.unwrap();
        let (follower, _) = elector(&fake, config("b"));
        let mut acquire = std::pin::pin!(follower.acquire());
        let metrics = tokio::runtime::Handle::current().metrics();
        let mut costs = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let from = fake.requests().len();
            assert!(
                tokio::time::timeout(S(300), &mut acquire).await.is_err(),
                "b led while a renews"
            );
            costs.push(fake.requests().len() - from);
            tasks.push(metrics.num_alive_tasks());
        }
        assert_eq!(guard.lost(), None, "the term goes on");
        let (first, last) = (costs[1], costs[9]);
        assert!(
            last <= first + first / 100,
            "requests every five minutes grew from {first} to {last}: {costs:?}"
        );
        assert_eq!(tasks[1], tasks[9], "tasks alive every five minutes: {tasks:?}");
    });
}
