//! Coordinated Leader Election on the Lease API double, with paused time:
//! the test plays the API server's election with `FakeLeaseApi::put`.

use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use tokio::time::sleep;

use crate::{
    LeaseConfig, Lost,
    coordinated::Coordinated,
    test_util::FakeLeaseApi,
    tests::support::{config, elector, held_by, holder, paused, spec},
};

const S: fn(u64) -> Duration = Duration::from_secs;
/// The `LeaseCandidate` of the candidate `me` for the Lease `lease`, and so
/// the identity it campaigns with (the API server's holder when elected).
const CANDIDATE: &str = "me.lease";

fn coordinated(identity: &str) -> LeaseConfig {
    config(identity).coordinated(Coordinated::new("1.37.0").emulation_version("1.36.0"))
}

/// What the API server's election writes: `holder`, a 5 s lease renewed now,
/// no `acquireTime`, the strategy; transitions kept.
fn assign(fake: &FakeLeaseApi, holder: &str) {
    let mut lease = fake.lease().unwrap_or_else(|| held_by("", 5));
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(holder.to_owned());
    spec.lease_duration_seconds = Some(5);
    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    spec.acquire_time = None;
    spec.preferred_holder = None;
    spec.strategy = Some("OldestEmulationVersion".to_owned());
    fake.put(lease);
}

/// The API server marks the end of the current term for `preferred`.
fn prefer(fake: &FakeLeaseApi, preferred: &str) {
    let mut lease = fake.lease().expect("a lease");
    lease.spec.as_mut().expect("a spec").preferred_holder = Some(preferred.to_owned());
    fake.put(lease);
}

/// Where the API server does not serve `LeaseCandidate` (it answers 404:
/// the feature gate is off, or it is still starting), the ordinary election
/// runs at once, and the `LeaseCandidate` is published again with backoff
/// (10 s doubling, across election tasks: never a loop, never given up); once
/// the API server serves it, Coordinated Leader Election is in force. (Before
/// the fallback, one 404 was taken as "off" for the life of the process.)
#[test]
fn where_lease_candidates_are_not_served_the_ordinary_election_runs_until_they_are() {
    paused(async {
        let fake = FakeLeaseApi::default()
            .serve_lease_candidates()
            .refuse_lease_candidates(404);
        let (e, _) = elector(&fake, coordinated("me"));
        let begun = tokio::time::Instant::now();
        let guard = tokio::time::timeout(S(60), e.acquire())
            .await
            .expect("leads by the ordinary election")
            .expect("leads");
        assert!(guard.is_valid());
        assert_eq!(
            holder(&fake).as_deref(),
            Some(CANDIDATE),
            "created and took the Lease itself"
        );
        assert!(!e.status().coordinated, "the fallback is in force");
        let tries = || -> Vec<Duration> {
            fake.requests()
                .iter()
                .filter(|s| s.verb == "candidate create")
                .map(|s| s.at - begun)
                .collect()
        };
        sleep(S(75)).await;
        assert_eq!(
            tries(),
            [S(0), S(10), S(30), S(70)],
            "published again after 10, 20, 40 s: {:?}",
            fake.requests()
        );
        // A later election task (leadership given up, then wanted again)
        // keeps the backoff: it asks at the time already set, not at once.
        drop(guard);
        sleep(S(5)).await;
        let again = tokio::time::timeout(S(60), e.acquire())
            .await
            .expect("leads again")
            .expect("leads");
        assert!(again.is_valid());
        assert_eq!(tries().len(), 4, "asked again at once: {:?}", tries());
        // The API server serves LeaseCandidate now: published at the next try
        // (70 + 80 s), and the API server's election is in force.
        fake.set_lease_candidates_refused(None);
        let switched = tokio::time::timeout(S(120), async {
            let mut status = e.subscribe();
            status.wait_for(|s| s.coordinated).await.map(drop)
        })
        .await;
        assert!(switched.is_ok(), "never switched: {:?}", tries());
        assert_eq!(tries().last(), Some(&S(150)));
        assert!(fake.lease_candidates().contains_key(CANDIDATE));
        // The term won by the ordinary election goes on until the API
        // server marks its end.
        assert!(again.is_valid());
    });
}

/// One process, one identity, two Leases, both coordinated (two
/// controllers with one `unique_identity()`): each Lease gets a
/// `LeaseCandidate` of its own, both lead when the API server elects them,
/// and the end of one elector's task deletes only its own candidate.
#[test]
fn several_leases_with_one_identity_each_get_a_lease_candidate_of_their_own() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (a, _) = elector(&fake, coordinated("me"));
        let (b, _) = elector(
            &fake,
            LeaseConfig::new("default", "other-lease", "me")
                .coordinated(Coordinated::new("1.37.0").emulation_version("1.36.0")),
        );
        let mut a_acquire = Box::pin(a.acquire());
        let mut b_acquire = Box::pin(b.acquire());
        assert!(tokio::time::timeout(S(5), &mut a_acquire).await.is_err());
        assert!(tokio::time::timeout(S(1), &mut b_acquire).await.is_err());
        let candidates = fake.lease_candidates();
        assert_eq!(
            candidates.keys().collect::<Vec<_>>(),
            ["me.lease", "me.other-lease"],
            "one candidate per Lease"
        );
        assert_eq!(candidates["me.lease"]["spec"]["leaseName"], "lease");
        assert_eq!(candidates["me.other-lease"]["spec"]["leaseName"], "other-lease");
        // The API server elects `me` on both Leases.
        assign(&fake, CANDIDATE);
        let mut other = held_by("me.other-lease", 5);
        other.metadata.name = Some("other-lease".into());
        other.spec.as_mut().unwrap().strategy = Some("OldestEmulationVersion".into());
        fake.put(other);
        let a_guard = tokio::time::timeout(S(5), a_acquire)
            .await
            .expect("a leads")
            .unwrap();
        let b_guard = tokio::time::timeout(S(5), b_acquire)
            .await
            .expect("b leads")
            .unwrap();
        assert!(a_guard.is_valid() && b_guard.is_valid());
        // One elector ends: its candidate goes, the other's stays.
        drop(a_guard);
        a.shutdown(S(1)).await.unwrap();
        let left = fake.lease_candidates();
        assert!(!left.contains_key("me.lease"), "{left:?}");
        assert!(
            left.contains_key("me.other-lease"),
            "the other's candidate was deleted"
        );
        assert!(b_guard.is_valid());
    });
}

/// An object of our candidate's name that names another Lease is not ours:
/// it is never adopted or deleted, publishing is retried with backoff, and
/// the elector does not lead (the API server cannot elect it).
#[test]
fn a_lease_candidate_of_our_name_for_another_lease_is_left_alone() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        fake.put_lease_candidate(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1beta1", "kind": "LeaseCandidate",
            "metadata": { "name": CANDIDATE, "namespace": "default" },
            "spec": { "leaseName": "someone-elses", "binaryVersion": "1.30.0",
                      "emulationVersion": "1.30.0", "strategy": "OldestEmulationVersion" },
        }));
        let before = fake.lease_candidates()[CANDIDATE].clone();
        let (e, _) = elector(&fake, coordinated("me"));
        let mut acquire = Box::pin(e.acquire());
        assert!(tokio::time::timeout(S(60), &mut acquire).await.is_err());
        let creates = fake
            .requests()
            .iter()
            .filter(|s| s.verb == "candidate create")
            .count();
        assert!(
            (2..=10).contains(&creates),
            "{creates} tries in 60 s: with backoff"
        );
        assert_eq!(fake.lease_candidates()[CANDIDATE], before, "left alone");
        drop(acquire);
        e.shutdown(S(1)).await.unwrap();
        assert_eq!(fake.lease_candidates()[CANDIDATE], before, "not deleted");
    });
}

#[test]
fn a_coordinated_candidate_never_creates_or_takes_a_lease_and_leads_when_elected() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (e, _) = elector(&fake, coordinated("me"));
        let mut acquire = Box::pin(e.acquire());
        // No Lease: it waits for the API server to create one.
        assert!(tokio::time::timeout(S(60), &mut acquire).await.is_err());
        assert!(
            fake.lease().is_none(),
            "a coordinated candidate created the Lease"
        );
        assert!(e.status().coordinated);
        let candidates = fake.lease_candidates();
        let published = &candidates
            .get(CANDIDATE)
            .expect("the LeaseCandidate is published")["spec"];
        assert_eq!(published["leaseName"], "lease");
        assert_eq!(published["binaryVersion"], "1.37.0");
        assert_eq!(published["emulationVersion"], "1.36.0");
        assert_eq!(published["strategy"], "OldestEmulationVersion");

        // A free Lease, then one held by someone else that expires: neither is taken.
        fake.put(held_by("", 5));
        assert!(tokio::time::timeout(S(60), &mut acquire).await.is_err());
        assert_eq!(holder(&fake).as_deref(), Some(""), "took a free Lease");
        assert_coordinated_waits(&fake, &mut acquire, "other").await;
        // Nor a record marked for another candidate that is not our own
        // term's, however long it stays (taking our own record back after a
        // step-down is for our own term only; mutation testing: kills the
        // guard of that arm as `true`, and its `&&`s as `||`).
        for (holder_name, preferred) in [("other", "x"), ("other", CANDIDATE), (CANDIDATE, "x")] {
            let mut lease = held_by(holder_name, 5);
            let marked = lease.spec.as_mut().unwrap();
            marked.acquire_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
            marked.preferred_holder = Some(preferred.to_owned());
            fake.put(lease);
            assert!(
                tokio::time::timeout(S(60), &mut acquire).await.is_err(),
                "took a record held by {holder_name}, marked for {preferred}"
            );
            assert_eq!(holder(&fake).as_deref(), Some(holder_name));
        }

        // The API server elects us: we lead, at once.
        assign(&fake, CANDIDATE);
        let guard = tokio::time::timeout(S(1), acquire)
            .await
            .expect("leads when elected")
            .expect("leads");
        let s = spec(&fake);
        assert_eq!(s.holder_identity.as_deref(), Some(CANDIDATE));
        assert!(
            s.acquire_time.is_some(),
            "our first write of the term sets acquireTime"
        );
        assert_eq!(s.lease_transitions, Some(5), "and counts a transition (4 before)");
        assert_eq!(guard.fencing_token(), 5);
        assert_eq!(
            s.lease_duration_seconds,
            Some(15),
            "renewed with our own duration"
        );
        assert_eq!(
            s.strategy.as_deref(),
            Some("OldestEmulationVersion"),
            "the strategy kept"
        );
        // It renews like any leader.
        sleep(S(30)).await;
        assert!(guard.is_valid());
    });
}

async fn assert_coordinated_waits(
    fake: &FakeLeaseApi,
    acquire: &mut (impl std::future::Future<Output = Result<crate::LeaseGuard, crate::AcquireError>> + Unpin),
    other: &str,
) {
    let mut lease = held_by(other, 5);
    lease.spec.as_mut().unwrap().acquire_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    fake.put(lease);
    assert!(
        tokio::time::timeout(S(60), acquire).await.is_err(),
        "took an expired Lease held by {other}"
    );
    assert_eq!(holder(fake).as_deref(), Some(other));
}

/// A coordinated candidate elected by the API server, whose term the API
/// server then marks for "better": the elector, why its term ended (at
/// once), and the instant of the mark.
async fn stepped_down(fake: &FakeLeaseApi) -> (crate::LeaderElector, Lost, tokio::time::Instant) {
    let (e, _) = elector(fake, coordinated("me"));
    let mut acquire = Box::pin(e.acquire());
    assert!(tokio::time::timeout(S(1), &mut acquire).await.is_err());
    assign(fake, CANDIDATE);
    let guard = acquire.await.expect("leads");
    prefer(fake, "better");
    let marked = tokio::time::Instant::now();
    let lost = tokio::time::timeout(S(1), guard)
        .await
        .expect("the term ends at once");
    (e, lost, marked)
}

#[test]
fn a_coordinated_leader_steps_down_for_the_preferred_holder_and_stops_renewing() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (e, lost, _) = stepped_down(&fake).await;
        assert_eq!(
            lost,
            Lost::SteppedDown {
                preferred_holder: "better".to_owned()
            }
        );
        assert!(!e.is_leader());
        // Its work was stopped, not finished (the guard was alive when the
        // term ended): no release, and no renewal either, so the Lease
        // expires for the API server to hand over (client-go's end of term).
        let renewed = spec(&fake).renew_time;
        let mut again = Box::pin(e.acquire());
        // (Within twice its duration and the API server's election: see
        // below for a Lease nobody takes.)
        assert!(tokio::time::timeout(S(30), &mut again).await.is_err());
        let s = spec(&fake);
        assert_eq!(
            s.holder_identity.as_deref(),
            Some(CANDIDATE),
            "released after stopped work"
        );
        assert_eq!(s.renew_time, renewed, "renewed after stepping down");
        // Nor does it take the Lease back on its own: the API server hands it on.
        assign(&fake, "better");
        assert!(tokio::time::timeout(S(60), &mut again).await.is_err());
        assert_eq!(holder(&fake).as_deref(), Some("better"));
    });
}

/// A coordinated leader steps down for a preferred holder with its work
/// alive (so it does not release), and the preferred holder goes away (its
/// pod deleted in the rollout that made it preferred) before it takes the
/// Lease. The API server, electing this candidate again, writes nothing: it
/// gives an expired Lease to a new holder only, and clears `preferredHolder`
/// only then. The candidate takes its own record back once nobody took it
/// for twice its duration and the API server's election (40 s here), with no
/// `preferredHolder`. (Before: it waited for the API server for ever, and the
/// Lease stayed without a leader, as client-go's coordinated candidate does.)
#[test]
fn a_stepped_down_coordinated_leader_whose_preferred_holder_is_gone_leads_again() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (e, lost, marked) = stepped_down(&fake).await;
        assert!(matches!(lost, Lost::SteppedDown { .. }), "{lost:?}");
        // Wanted again at once (a guarded controller rejoining); "better"
        // never comes, and the API server never writes.
        let again = tokio::time::timeout(S(120), e.acquire()).await;
        let led = marked.elapsed();
        let s = spec(&fake);
        assert!(
            matches!(again, Ok(Ok(_))),
            "nobody leads 120 s after the step-down though the preferred holder is gone: holder {:?}, \
             preferredHolder {:?}",
            s.holder_identity,
            s.preferred_holder
        );
        assert!(
            led >= S(39),
            "took its record back {led:?} after the mark, before the API server's turn"
        );
        assert_eq!(s.holder_identity.as_deref(), Some(CANDIDATE));
        assert_eq!(s.preferred_holder, None, "taken back with the old mark");
    });
}

/// Which of `a` (`"p2"`) and `b` (`"me"`) leads first within `within`, if any.
async fn either_leads(
    a: &mut std::pin::Pin<Box<crate::Acquire>>,
    b: &mut std::pin::Pin<Box<crate::Acquire>>,
    within: Duration,
) -> Option<&'static str> {
    let first = async {
        tokio::select! {
            _ = a => "p2",
            _ = b => "me",
        }
    };
    tokio::time::timeout(within, first).await.ok()
}

/// A rolling update that switches Coordinated Leader Election on, then one
/// that switches it off: plain candidates (the old build, `p1` leading with
/// its work alive, `p2` campaigning) beside a coordinated one (`me`) on one
/// Lease. The API server elects `me` and marks the end of `p1`'s term: `p1`
/// steps down at once and, its work stopped, does not release; `p2` leaves
/// the marked record to the preferred holder; once the record expired the
/// API server hands it to `me`, which leads. Never two, and one lease
/// duration without a leader (the bound of a step-down with work stopped).
/// The other way, `me`'s release at its shutdown is taken by the plain
/// `p2` at once, and a mark for another coordinated candidate ends `p2`'s
/// term in turn: the two kinds hand the Lease back and forth, one term
/// each, never both at once.
#[test]
fn plain_and_coordinated_candidates_on_one_lease_hand_it_over_and_never_both_lead() {
    paused(async {
        let fake = crate::tests::support::free().serve_lease_candidates();
        let (p1, _) = elector(&fake, config("p1"));
        let (p2, _) = elector(&fake, config("p2"));
        let (me, _) = elector(&fake, coordinated("me"));
        let mut p1_guard = p1.acquire().await.unwrap();
        let mut p2_acquire = Box::pin(p2.acquire());
        let mut me_acquire = Box::pin(me.acquire());
        assert!(
            either_leads(&mut p2_acquire, &mut me_acquire, S(5))
                .await
                .is_none(),
            "a second leader beside p1"
        );
        assert!(me.status().coordinated);

        // The API server elects `me` and marks the end of p1's term.
        prefer(&fake, CANDIDATE);
        let marked = tokio::time::Instant::now();
        let lost = tokio::time::timeout(S(1), &mut p1_guard)
            .await
            .expect("p1 steps down at once");
        assert_eq!(
            lost,
            Lost::SteppedDown {
                preferred_holder: CANDIDATE.to_owned()
            }
        );
        drop(p1_guard);
        assert!(
            either_leads(&mut p2_acquire, &mut me_acquire, S(15))
                .await
                .is_none(),
            "the marked record was taken before it expired (holder {:?})",
            holder(&fake)
        );
        assert_eq!(
            holder(&fake).as_deref(),
            Some("p1"),
            "p1 released though its work was stopped"
        );
        // Expired: the API server hands it to its choice.
        assign(&fake, CANDIDATE);
        let me_guard = tokio::time::timeout(S(1), &mut me_acquire)
            .await
            .expect("the coordinated candidate leads once the API server assigns it")
            .unwrap();
        assert!(marked.elapsed() <= S(16), "{:?}", marked.elapsed());
        assert!(
            tokio::time::timeout(S(60), &mut p2_acquire).await.is_err(),
            "p2 led beside the coordinated leader"
        );
        assert!(me_guard.is_valid());
        assert_eq!(spec(&fake).lease_duration_seconds, Some(15));

        // Switched off: the coordinated leader shuts down (released), and the
        // plain candidate takes the free Lease at once.
        drop(me_guard);
        me.shutdown(S(1)).await.unwrap();
        let mut p2_guard = tokio::time::timeout(S(1), p2_acquire)
            .await
            .expect("p2 takes the released Lease at once")
            .unwrap();
        // The API server still elects among the coordinated candidates left:
        // its mark ends the plain term too.
        prefer(&fake, "other.lease");
        let lost = tokio::time::timeout(S(1), &mut p2_guard)
            .await
            .expect("p2 steps down at once");
        assert_eq!(
            lost,
            Lost::SteppedDown {
                preferred_holder: "other.lease".to_owned()
            }
        );
    });
}

#[test]
fn the_lease_candidate_is_deleted_when_the_election_ends() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (e, _) = elector(&fake, coordinated("me"));
        let mut acquire = Box::pin(e.acquire());
        assert!(tokio::time::timeout(S(1), &mut acquire).await.is_err());
        assert!(fake.lease_candidates().contains_key(CANDIDATE));
        assign(&fake, CANDIDATE);
        let guard = acquire.await.expect("leads");
        drop(guard);
        e.shutdown(S(5)).await.expect("shuts down");
        assert!(
            fake.lease_candidates().is_empty(),
            "{:?}",
            fake.lease_candidates()
        );
        assert_eq!(holder(&fake).as_deref(), Some(""), "released on shutdown");
    });
}

#[test]
fn a_record_naming_us_that_is_not_the_api_servers_assignment_is_waited_out() {
    paused(async {
        // Another process with our identity holds the Lease (its record has an
        // acquireTime: not the API server's assignment): waited out for one
        // lease duration after it last changed, as in the ordinary election.
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let mut lease = held_by(CANDIDATE, 5);
        lease.spec.as_mut().unwrap().acquire_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        fake.put(lease);
        let (e, _) = elector(&fake, coordinated("me"));
        let mut acquire = Box::pin(e.acquire());
        assert!(
            tokio::time::timeout(S(4), &mut acquire).await.is_err(),
            "took a record of unknown provenance before it expired"
        );
        let guard = tokio::time::timeout(S(4), acquire)
            .await
            .expect("takes it once expired")
            .expect("leads");
        assert!(guard.is_valid());
        assert!(acquire_ready_now(&e));
    });
}

fn acquire_ready_now(e: &crate::LeaderElector) -> bool {
    e.acquire().now_or_never().is_some_and(|r| r.is_ok())
}

#[cfg(feature = "metrics")]
#[test]
fn the_coordinated_metric_says_which_election_is_in_force() {
    use prometheus_client::registry::Registry;

    use crate::tests::support::assert_scraped;
    const SERIES: &str = r#"leader_election_coordinated{namespace="default",lease="lease"}"#;

    paused(async {
        // Served: 1 once the LeaseCandidate is published (0 before).
        let mut registry = Registry::default();
        let metrics = crate::metrics::LeaseMetrics::register(&mut registry);
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (e, _) = elector(&fake, coordinated("me"));
        let e = e.with_metrics(&metrics);
        assert_scraped(&registry, &format!("{SERIES} 0"));
        let mut acquire = Box::pin(e.acquire());
        assert!(tokio::time::timeout(S(1), &mut acquire).await.is_err());
        assert_scraped(&registry, &format!("{SERIES} 1"));

        // Attached after the election decided: the gauge starts at the truth.
        let mut late = Registry::default();
        let late_metrics = crate::metrics::LeaseMetrics::register(&mut late);
        let _e = e.clone().with_metrics(&late_metrics);
        assert_scraped(&late, &format!("{SERIES} 1"));

        // Not served: 0, the fallback; served later: 1 from the switch on.
        let mut registry = Registry::default();
        let metrics = crate::metrics::LeaseMetrics::register(&mut registry);
        let fake = FakeLeaseApi::default()
            .serve_lease_candidates()
            .refuse_lease_candidates(404);
        let (e, _) = elector(&fake, coordinated("me"));
        let e = e.with_metrics(&metrics);
        let guard = e.acquire().await.expect("leads by the ordinary election");
        assert_scraped(&registry, &format!("{SERIES} 0"));
        fake.set_lease_candidates_refused(None);
        let switched = tokio::time::timeout(S(120), async {
            e.subscribe().wait_for(|s| s.coordinated).await.map(drop)
        })
        .await;
        assert!(switched.is_ok(), "never switched to the coordinated election");
        assert_scraped(&registry, &format!("{SERIES} 1"));
        drop(guard);
        drop(acquire);
    });
}

#[test]
fn a_candidate_forbidden_to_publish_never_leads_and_says_why() {
    let text = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            // RBAC without `leasecandidates`: not the fallback (the API is
            // served), so no ordinary election either: it waits, retrying.
            let fake = FakeLeaseApi::default().refuse_lease_candidates(403);
            let (e, _) = elector(&fake, coordinated("me"));
            let mut acquire = Box::pin(e.acquire());
            assert!(tokio::time::timeout(S(120), &mut acquire).await.is_err());
            assert!(fake.lease().is_none(), "created the Lease without a candidate");
            assert!(!e.status().coordinated);
            let tries = fake
                .requests()
                .iter()
                .filter(|s| s.verb.starts_with("candidate"))
                .count();
            assert!(
                (3..=40).contains(&tries),
                "{tries} tries in 120 s: retried with a backoff"
            );
        });
    });
    assert!(
        text.contains(
            "RBAC needs verbs create, get, list, watch, update, delete on resource `leasecandidates`"
        ),
        "{text}"
    );
}

/// The longest time between two of the requests `counts` picks (more than
/// ten of them, in the 600 s the callers wait).
fn longest_gap(fake: &FakeLeaseApi, counts: impl Fn(&crate::test_util::Received) -> bool) -> Duration {
    let tries: Vec<_> = fake
        .requests()
        .iter()
        .filter(|s| counts(s))
        .map(|s| s.at)
        .collect();
    assert!(tries.len() > 10, "{} tries in 600 s", tries.len());
    tries.windows(2).map(|w| w[1] - w[0]).max().unwrap()
}

/// A `LeaseCandidate` whose publication fails (an API server answering 500)
/// is published again at most one lease duration apart, as documented for
/// every retry backoff: backon adds its jitter (up to 100 %) after its own
/// cap, and the publication once waited up to two lease durations (30 s),
/// with no candidate the API server could elect meanwhile.
#[test]
fn a_failing_lease_candidate_publication_is_retried_within_a_lease_duration() {
    paused(async {
        let fake = FakeLeaseApi::default().refuse_lease_candidates(500);
        let (e, _) = elector(&fake, coordinated("me"));
        let mut acquire = Box::pin(e.acquire());
        assert!(tokio::time::timeout(S(600), &mut acquire).await.is_err());
        let longest = longest_gap(&fake, |s| s.verb.starts_with("candidate"));
        assert!(
            longest <= e.config().lease_duration,
            "published again {longest:?} after a failure: more than a lease duration"
        );
    });
}

/// A `LeaseCandidate` whose renewal keeps failing (an API server answering
/// 500 from a ping on) is renewed again at most one lease duration apart,
/// as its publication is: backon adds its jitter after its own cap
/// (mutation testing: kills the renewal's retry not going through
/// the capped `RetryBackoff`, which waited up to two lease durations).
#[test]
fn a_failing_lease_candidate_renewal_is_retried_within_a_lease_duration() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (e, _acquire) = published(&fake).await;
        fake.set_lease_candidates_refused(Some(500));
        assert!(fake.ping_lease_candidate(CANDIDATE));
        let pinged = tokio::time::Instant::now();
        sleep(S(600)).await;
        let longest = longest_gap(&fake, |s| {
            matches!(s.verb, "candidate get" | "candidate update") && s.at >= pinged
        });
        assert!(
            longest <= e.config().lease_duration,
            "renewed again {longest:?} after a failure: more than a lease duration"
        );
    });
}

/// A task that ends in coordinated mode deletes its `LeaseCandidate` after it
/// gave the term up, still running: an `acquire` meanwhile (wanted again)
/// finds it running and waits; the task counts it once the deletion is done
/// and campaigns again, publishing a new `LeaseCandidate`.
#[test]
fn a_task_spawned_while_the_last_one_deletes_its_lease_candidate_starts_when_it_is_gone() {
    paused(async {
        let fake = FakeLeaseApi::default()
            .serve_lease_candidates()
            .lease_candidates_latency(S(3));
        let (e, _) = elector(&fake, coordinated("me"));
        let mut acquire = Box::pin(e.acquire());
        assert!(tokio::time::timeout(S(5), &mut acquire).await.is_err());
        assign(&fake, CANDIDATE);
        drop(acquire.await.expect("leads"));
        // Nobody wants it: after a retry period the task releases and exits,
        // then deletes its candidate (3 s).
        sleep(S(2) + Duration::from_millis(500)).await;
        assert!(!e.is_leader());
        let mut again = Box::pin(e.acquire());
        assert!(
            tokio::time::timeout(S(10), &mut again).await.is_err(),
            "nothing assigns it yet"
        );
        let published = fake.lease_candidates();
        assert!(
            published.contains_key(CANDIDATE),
            "the new task did not start after the old one deleted its candidate: {published:?}"
        );
        assign(&fake, CANDIDATE);
        let guard = tokio::time::timeout(S(5), again)
            .await
            .expect("leads again")
            .expect("leads");
        assert!(guard.is_valid());
    });
}

/// The `spec` time `field` of the published `LeaseCandidate` `name`.
fn lease_candidate_time(
    fake: &FakeLeaseApi,
    name: &str,
    field: &str,
) -> Option<k8s_openapi::jiff::Timestamp> {
    let object = fake.lease_candidates().remove(name)?;
    serde_json::from_value::<MicroTime>(object["spec"][field].clone())
        .ok()
        .map(|t| t.0)
}

/// A coordinated candidate campaigning (the API server has not elected it),
/// its `LeaseCandidate` published; the pending `acquire` keeps it campaigning.
async fn published(fake: &FakeLeaseApi) -> (crate::LeaderElector, std::pin::Pin<Box<crate::Acquire>>) {
    let (e, _) = elector(fake, coordinated("me"));
    let mut acquire = Box::pin(e.acquire());
    assert!(tokio::time::timeout(S(5), &mut acquire).await.is_err());
    assert!(fake.lease_candidates().contains_key(CANDIDATE), "published");
    (e, acquire)
}

/// The API server pings a candidate before it elects (`pingTime`); the
/// candidate answers by renewing (`renewTime` after it), or it is not
/// elected (mutation testing: kills `LeaseCandidate::renew -> ()`).
#[test]
fn a_pinged_lease_candidate_is_answered_by_a_renewal() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (_e, _acquire) = published(&fake).await;
        assert!(fake.ping_lease_candidate(CANDIDATE));
        let ping = lease_candidate_time(&fake, CANDIDATE, "pingTime").unwrap();
        sleep(Duration::from_millis(100)).await;
        let renew = lease_candidate_time(&fake, CANDIDATE, "renewTime").unwrap();
        assert!(
            renew > ping,
            "not answered: renewTime {renew} after pingTime {ping}"
        );
    });
}

/// A ping answered with a stale resourceVersion (the object changed since
/// the ping was delivered) is answered again after a fresh read (mutation testing:
/// kills the conflict retry's survivors in `LeaseCandidate::renew`).
#[test]
fn a_ping_answer_that_conflicts_is_retried_after_a_fresh_read() {
    paused(async {
        let fake = FakeLeaseApi::default()
            .serve_lease_candidates()
            .lease_candidates_latency(S(1));
        let (_e, _acquire) = published(&fake).await;
        sleep(S(5)).await;
        assert!(fake.ping_lease_candidate(CANDIDATE));
        let ping = lease_candidate_time(&fake, CANDIDATE, "pingTime").unwrap();
        // While its answer is on the way: someone else's write, which leaves
        // it answered-looking (renewTime = pingTime), so that only the retry
        // renews it.
        sleep(Duration::from_millis(500)).await;
        let mut object = fake.lease_candidates().remove(CANDIDATE).unwrap();
        object["spec"]["renewTime"] = object["spec"]["pingTime"].clone();
        object["metadata"]["labels"] = serde_json::json!({ "touched": "yes" });
        fake.put_lease_candidate(object);
        sleep(S(10)).await;
        let renew = lease_candidate_time(&fake, CANDIDATE, "renewTime").unwrap();
        assert!(
            renew > ping,
            "the conflict was not retried: renewTime {renew}, pingTime {ping}"
        );
        assert_eq!(
            fake.lease_candidates()[CANDIDATE]["metadata"]["labels"]["touched"],
            "yes",
            "the retry wrote over the fresh object"
        );
    });
}

/// A `LeaseCandidate` left by an earlier process with our identity (create
/// answers 409) is adopted: our versions and strategy written on it, renewed
/// (mutation testing: kills `publish`'s 409 guard `-> false`).
#[test]
fn a_lease_candidate_left_by_an_earlier_process_is_adopted() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        fake.put_lease_candidate(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1beta1", "kind": "LeaseCandidate",
            "metadata": { "name": CANDIDATE, "namespace": "default" },
            "spec": {
                "leaseName": "lease", "binaryVersion": "1.30.0", "emulationVersion": "1.30.0",
                "strategy": "OldestEmulationVersion", "renewTime": "2000-01-01T00:00:00.000000Z",
            },
        }));
        let (_e, _acquire) = published(&fake).await;
        let object = &fake.lease_candidates()[CANDIDATE];
        assert_eq!(object["spec"]["binaryVersion"], "1.37.0");
        assert_eq!(object["spec"]["emulationVersion"], "1.36.0");
        let renew = lease_candidate_time(&fake, CANDIDATE, "renewTime").unwrap();
        assert!(
            renew
                > "2000-01-01T00:00:00Z"
                    .parse::<k8s_openapi::jiff::Timestamp>()
                    .unwrap(),
            "not renewed: {renew}"
        );
    });
}

/// Without pings the candidate refreshes `renewTime` every 5 minutes (as
/// client-go's does), the first time 5 minutes after it published, not at
/// once (mutation testing: kills `+ -> -` in the refresh's start).
#[test]
fn a_lease_candidate_is_refreshed_every_five_minutes_and_not_sooner() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let start = tokio::time::Instant::now();
        let (_e, _acquire) = published(&fake).await;
        let refreshes = || {
            fake.requests()
                .iter()
                .filter(|s| s.verb == "candidate get")
                .map(|s| s.at.duration_since(start))
                .collect::<Vec<_>>()
        };
        sleep(S(11 * 60)).await;
        let at = refreshes();
        assert_eq!(at.len(), 2, "{at:?}");
        assert!(
            at[0] >= S(300) && at[0] < S(302) && at[1] >= S(600) && at[1] < S(602),
            "refreshed at {at:?}"
        );
    });
}

/// Failing calls say why (`CallError`'s text), and deleting a candidate
/// already gone is no failure (mutation testing: kills `CallError::fmt` and
/// `delete`'s 404 guards).
#[test]
fn a_failed_lease_candidate_call_says_why_and_one_already_gone_is_no_failure() {
    let text = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default().serve_lease_candidates();
            let (e, acquire) = published(&fake).await;
            fake.set_lease_candidates_refused(Some(500));
            drop(acquire);
            // Nobody wants leadership: the task exits and deletes its
            // candidate, which fails.
            sleep(S(10)).await;
            assert!(!e.tasks_for_test().0, "the task ended");
        });
    });
    assert!(
        text.contains("deleting the LeaseCandidate failed") && text.contains("refused by the test"),
        "{text}"
    );
    let text = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default()
                .serve_lease_candidates()
                .lease_candidates_latency(S(1));
            let (e, acquire) = published(&fake).await;
            // The task lingers a retry period (2 s), then deletes its
            // candidate (the request takes 1 s): someone else deletes it first.
            drop(acquire);
            sleep(Duration::from_millis(2_500)).await;
            assert!(fake.delete_lease_candidate(CANDIDATE));
            sleep(S(10)).await;
            assert!(!e.tasks_for_test().0, "the task ended");
            assert!(fake.lease_candidates().is_empty());
            assert!(
                fake.requests().iter().any(|s| s.verb == "candidate delete"),
                "the task deleted its candidate after someone else had"
            );
        });
    });
    assert!(!text.contains("deleting the LeaseCandidate failed"), "{text}");
}

/// The API server pings every candidate before it elects, counts only those
/// that renewed within its election duration (5 s) of the ping, and pings
/// again only a candidate that answered its last ping: with no answer, it
/// stops its election until a `LeaseCandidate` changes. An answer that fails
/// (a 5xx, a timeout: the API server restarting) is therefore sent again
/// after the elector's retry backoff (a retry period, jittered), not at the
/// next refresh five minutes later, with no leader meanwhile; and not at
/// once either: only a conflict is retried at once, after a read (mutation
/// testing: kills the retry guard's `-> true` and `&& -> ||`).
#[test]
fn a_ping_answer_that_fails_is_sent_again_within_the_api_servers_election() {
    let text = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default().serve_lease_candidates();
            let (_e, _acquire) = published(&fake).await;
            sleep(S(5)).await;
            let requests = || {
                fake.requests()
                    .iter()
                    .filter(|s| s.verb.starts_with("candidate"))
                    .count()
            };
            let before = requests();
            // A one-second blip of the API server, as the ping arrives.
            fake.set_lease_candidates_refused(Some(500));
            assert!(fake.ping_lease_candidate(CANDIDATE));
            let ping = lease_candidate_time(&fake, CANDIDATE, "pingTime").unwrap();
            let pinged = tokio::time::Instant::now();
            sleep(S(1)).await;
            fake.set_lease_candidates_refused(None);
            sleep(Duration::from_millis(900)).await;
            assert_eq!(requests() - before, 1, "the failed answer was sent again at once");
            let mut answered = None;
            while pinged.elapsed() < S(400) {
                let renewed = lease_candidate_time(&fake, CANDIDATE, "renewTime");
                if renewed.is_some_and(|r| r > ping) {
                    answered = Some(pinged.elapsed());
                    break;
                }
                sleep(Duration::from_millis(100)).await;
            }
            assert!(
                answered.is_some_and(|a| a < S(5)),
                "the ping was answered {answered:?} after it: the API server counts an answer within 5 s, \
                 and pings again only a candidate that answered"
            );
        });
    });
    assert!(
        text.contains("renewing the LeaseCandidate failed") && text.contains("refused by the test"),
        "{text}"
    );
}

/// `shutdown` waits for the `LeaseCandidate`'s deletion too (each of its
/// requests bounded by 10 s), after the release (a renewal in flight is
/// abandoned): it once reported `TaskDidNotEnd` for a task about to end
/// (it waited renew deadline + release timeout + retry period, 17 s, while
/// a renewal in flight, the release and the deletion took 23 s); it fits
/// [`LeaseConfig::shutdown_budget`](crate::LeaseConfig::shutdown_budget).
#[test]
fn a_shutdown_waits_for_a_slow_lease_candidate_deletion() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let cfg = coordinated("me");
        let budget = cfg.shutdown_budget(S(1));
        let (client, id) = fake.client();
        let e = crate::LeaderElector::new(client, cfg).unwrap();
        let mut acquire = Box::pin(e.acquire());
        assert!(tokio::time::timeout(S(1), &mut acquire).await.is_err());
        assign(&fake, CANDIDATE);
        let guard = acquire.await.expect("leads");
        // From now on: every LeaseCandidate request takes 9 s (the builder
        // acts on the store the clone shares), the next renewal is answered
        // after 9.5 s (abandoned at the shutdown), and the release's read
        // after 4.5 s.
        let _ = fake.clone().lease_candidates_latency(S(9));
        fake.fault(
            id,
            Some("update"),
            crate::test_util::Fault::DelayResponse(Duration::from_millis(9_500)),
        );
        fake.fault(
            id,
            Some("get"),
            crate::test_util::Fault::DelayResponse(Duration::from_millis(4_500)),
        );
        // The renewal is in flight; the guarded work ends, then the shutdown.
        sleep(Duration::from_millis(2_500)).await;
        drop(guard);
        let started = tokio::time::Instant::now();
        let result = tokio::time::timeout(S(120), e.shutdown(S(1)))
            .await
            .expect("shutdown is bounded");
        let took = started.elapsed();
        assert!(result.is_ok(), "{result:?} after {took:?}");
        assert!(
            took > S(13),
            "the release's read and the deletion were waited for: {took:?}"
        );
        assert!(took <= budget, "took {took:?}, more than its budget {budget:?}");
        assert!(
            fake.lease_candidates().is_empty(),
            "{:?}",
            fake.lease_candidates()
        );
        assert_eq!(holder(&fake).as_deref(), Some(""), "released on shutdown");
    });
}

/// A task that starts once `shutdown` began (spawned by an `acquire` while
/// the last task was still deleting its `LeaseCandidate`, then waiting for the
/// slot) makes no request: it deleted the candidate a second time (10 s more
/// that `shutdown` would wait, beyond its budget with short timings).
#[test]
fn a_task_that_starts_after_the_shutdown_does_not_delete_the_lease_candidate_again() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (e, _) = elector(&fake, coordinated("me"));
        let mut acquire = Box::pin(e.acquire());
        assert!(tokio::time::timeout(S(1), &mut acquire).await.is_err());
        assign(&fake, CANDIDATE);
        let guard = acquire.await.expect("leads");
        // Every LeaseCandidate request takes 9 s from now on (the builder
        // acts on the store the clone shares).
        let _ = fake.clone().lease_candidates_latency(S(9));
        // Given up: released, the task lingers a retry period, exits, and
        // deletes its LeaseCandidate (under way 5 s later).
        drop(guard);
        sleep(S(5)).await;
        let deletes = || {
            fake.requests()
                .iter()
                .filter(|r| r.verb == "candidate delete")
                .count()
        };
        let (running, _) = e.tasks_for_test();
        assert!(
            running && fake.lease_candidates().contains_key(CANDIDATE),
            "the deletion is under way: {:?}",
            e.tasks_for_test()
        );
        // A new acquire waits for the task (a second one starts only once it
        // ended); then the shutdown.
        let mut again = Box::pin(e.acquire());
        assert!(futures::poll!(&mut again).is_pending());
        let result = tokio::time::timeout(S(120), e.shutdown(S(1)))
            .await
            .expect("shutdown is bounded");
        assert!(result.is_ok(), "{result:?}");
        assert!(matches!(again.await, Err(crate::AcquireError::Shutdown)));
        assert_eq!(
            deletes(),
            1,
            "a task started after the shutdown deleted the LeaseCandidate again: {:?}",
            fake.requests()
        );
    });
}

/// Coordinated Leader Election in force, then the API server stops serving
/// `LeaseCandidate` (the feature gate turned off again, a rollback): nobody
/// elects any more. The candidate's next publication (its refresh, every
/// five minutes; or its watch's reconnection) is answered 404, which must
/// bring the ordinary election back as it does on the first publication,
/// or a Lease whose holder is gone is never led again.
#[test]
fn when_lease_candidates_stop_being_served_the_ordinary_election_takes_over() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        // The API server's last election: `other`, which is gone (its record
        // is never renewed).
        fake.put(held_by("other", 5));
        let (e, acquire) = published(&fake).await;
        assert!(e.status().coordinated);
        fake.set_lease_candidates_refused(Some(404));
        let led = tokio::time::timeout(S(400), acquire).await;
        let candidate_calls: Vec<_> = fake
            .requests()
            .iter()
            .filter(|r| r.verb.starts_with("candidate"))
            .map(|r| (r.verb, r.at))
            .collect();
        let guard = led
            .unwrap_or_else(|_| {
                panic!(
                    "nobody led for 400 s once the API server stopped electing (coordinated: {}); \
                     LeaseCandidate calls: {candidate_calls:?}",
                    e.status().coordinated
                )
            })
            .expect("leads");
        assert!(guard.is_valid());
        assert!(!e.status().coordinated, "the fallback is in force");
    });
}

/// The API server's ping carries its own clock (`pingTime`), and it counts a
/// candidate as live only if its answer's `renewTime` is after it. A candidate
/// whose clock is behind the API server's (by any amount: clocks are never
/// exact) answers with a `renewTime` before the ping: not counted, and its
/// own write, seen on its watch, still looks unanswered, so it writes again
/// at once, in a loop without a delay for as long as its clock is behind.
/// One answer per ping, after the ping, is what the API server needs.
#[test]
fn a_ping_from_an_api_server_whose_clock_is_ahead_is_answered_once_and_counted() {
    paused(async {
        let fake = FakeLeaseApi::default()
            .serve_lease_candidates()
            .lease_candidates_latency(Duration::from_millis(10));
        let (_e, _acquire) = published(&fake).await;
        let updates = || {
            fake.requests()
                .iter()
                .filter(|r| r.verb == "candidate update")
                .count()
        };
        let before = updates();
        // The API server's clock is 2 s ahead of ours.
        let ping = k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(2);
        let mut object = fake.lease_candidates()[CANDIDATE].clone();
        object["spec"]["pingTime"] = serde_json::to_value(MicroTime(ping)).unwrap();
        fake.put_lease_candidate(object);
        sleep(S(1)).await;
        let answers = updates() - before;
        let renew = lease_candidate_time(&fake, CANDIDATE, "renewTime").unwrap();
        assert!(
            answers <= 2,
            "{answers} writes in 1 s to answer one ping (a loop without a delay)"
        );
        assert!(
            renew > ping,
            "the answer does not count: renewTime {renew} is not after pingTime {ping}"
        );
    });
}

/// The `LeaseCandidate` deleted (by an administrator, a cleanup job) while the
/// API server fails for a moment: its re-creation, answered 500, is only
/// logged, and the next try is the five-minute refresh. For those minutes
/// the API server cannot elect this candidate (if the leader goes, nobody
/// leads). A failed re-creation must be retried as a failed renewal is,
/// after the elector's retry backoff.
#[test]
fn a_lease_candidate_deleted_while_its_recreation_fails_is_published_again_soon() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (_e, _acquire) = published(&fake).await;
        fake.set_lease_candidates_refused(Some(500));
        assert!(fake.delete_lease_candidate(CANDIDATE));
        sleep(S(1)).await;
        fake.set_lease_candidates_refused(None);
        let deleted = tokio::time::Instant::now();
        let mut waited = Duration::ZERO;
        while !fake.lease_candidates().contains_key(CANDIDATE) && waited < S(60) {
            sleep(S(1)).await;
            waited += S(1);
        }
        assert!(
            fake.lease_candidates().contains_key(CANDIDATE),
            "not published again within 60 s of the API server answering again (deleted {:?} ago); \
             LeaseCandidate calls: {:?}",
            deleted.elapsed(),
            fake.requests()
                .iter()
                .filter(|r| r.verb.starts_with("candidate"))
                .map(|r| (r.verb, r.at.duration_since(deleted)))
                .collect::<Vec<_>>()
        );
    });
}

/// The `LeaseCandidate` deleted while its watch was away long enough to be
/// answered `410 Gone` (etcd compacted past it: an API server restart, a
/// long disconnection): the re-list shows no object, and no `DELETED`
/// event ever comes. It must be published again then, not at the
/// five-minute refresh (until then the API server cannot elect it).
#[test]
fn a_lease_candidate_deleted_while_its_watch_was_away_is_published_again_at_the_relist() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (_e, _acquire) = published(&fake).await;
        fake.expire_lease_candidate_watches();
        assert!(fake.delete_lease_candidate(CANDIDATE));
        let deleted = tokio::time::Instant::now();
        let mut waited = Duration::ZERO;
        while !fake.lease_candidates().contains_key(CANDIDATE) && waited < S(60) {
            sleep(S(1)).await;
            waited += S(1);
        }
        assert!(
            fake.lease_candidates().contains_key(CANDIDATE),
            "not published again within {:?} of its deletion; LeaseCandidate calls: {:?}",
            deleted.elapsed(),
            fake.requests()
                .iter()
                .filter(|r| r.verb.starts_with("candidate"))
                .map(|r| (r.verb, r.at.duration_since(deleted)))
                .collect::<Vec<_>>()
        );
    });
}

/// Coordinated leadership acquired and given up many times over leaves
/// nothing behind: after each cycle the `LeaseCandidate` is gone, the
/// runtime's tasks (its watch and keeper among them) are back at their
/// baseline, and each cycle costs the same requests as the one before.
#[test]
fn coordinated_acquire_and_drop_many_times_returns_to_a_baseline() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (e, _) = elector(&fake, coordinated("me"));
        let metrics = tokio::runtime::Handle::current().metrics();
        let baseline = metrics.num_alive_tasks();
        let mut costs = Vec::new();
        for cycle in 0..100 {
            let before = fake.requests().len();
            let mut acquire = Box::pin(e.acquire());
            assert!(tokio::time::timeout(S(1), &mut acquire).await.is_err());
            assert!(
                fake.lease_candidates().contains_key(CANDIDATE),
                "cycle {cycle}: not published"
            );
            assign(&fake, CANDIDATE);
            let guard = tokio::time::timeout(S(30), acquire)
                .await
                .unwrap_or_else(|_| panic!("cycle {cycle}: not leading 30s after its assignment"))
                .expect("leads");
            drop(guard);
            tokio::time::timeout(S(30), async {
                while e.tasks_for_test().0 {
                    sleep(Duration::from_millis(100)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("cycle {cycle}: the election task still runs 30s later"));
            assert!(
                fake.lease_candidates().is_empty(),
                "cycle {cycle}: {:?}",
                fake.lease_candidates()
            );
            assert_eq!(
                metrics.num_alive_tasks(),
                baseline,
                "cycle {cycle}: tasks alive after the election task ended"
            );
            costs.push(fake.requests().len() - before);
        }
        let (first, last) = (costs[10], costs[costs.len() - 1]);
        assert!(
            last <= first,
            "requests per cycle grew from {first} to {last}: {costs:?}"
        );
    });
}

/// A ping that comes while the candidate's `LeaseCandidate` watch is
/// stalled (open and silent: a dead connection that neither ends nor
/// fails) is still answered within two of the API server's elections of
/// the Lease going missing, not at kube-runtime's idle timeout of the
/// watch (295 s) or the five-minute refresh: the API server elects only
/// candidates that answered, so a Lease whose only live candidate missed
/// its ping has no leader meanwhile. The candidate watches its
/// `LeaseCandidate` anew (a re-list shows the ping) once the Lease has
/// been missing or expired that long, then with a backoff.
#[test]
fn a_ping_is_answered_though_the_lease_candidate_watch_stalls() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let (_e, _acquire) = published(&fake).await;
        fake.stall_lease_candidate_watches();
        sleep(S(5)).await;
        assert!(fake.ping_lease_candidate(CANDIDATE));
        let ping = lease_candidate_time(&fake, CANDIDATE, "pingTime").unwrap();
        sleep(S(20)).await;
        let renew = lease_candidate_time(&fake, CANDIDATE, "renewTime").unwrap();
        assert!(
            renew > ping,
            "a ping not answered 20 s after it (the LeaseCandidate's watch stalled): renewTime {renew}, \
             pingTime {ping}"
        );
    });
}

/// The same while the Lease is held by a candidate that died: its record
/// expired, not missing, is as long without a leader, so the candidate
/// watches its `LeaseCandidate` anew as well (mutation testing: kills `||`
/// as `&&` in `rule`'s "due", which counted only a record both free and
/// expired).
#[test]
fn a_ping_is_answered_though_the_lease_candidate_watch_stalls_while_a_dead_holders_record_expired() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        assign(&fake, "gone");
        let (_e, _acquire) = published(&fake).await;
        fake.stall_lease_candidate_watches();
        sleep(S(5)).await;
        assert!(fake.ping_lease_candidate(CANDIDATE));
        let ping = lease_candidate_time(&fake, CANDIDATE, "pingTime").unwrap();
        sleep(S(25)).await;
        assert_eq!(
            fake.lease().and_then(|l| l.spec?.holder_identity).as_deref(),
            Some("gone")
        );
        let renew = lease_candidate_time(&fake, CANDIDATE, "renewTime").unwrap();
        assert!(
            renew > ping,
            "a ping not answered 25 s after it (the LeaseCandidate's watch stalled, the Lease held by a \
             dead candidate): renewTime {renew}, pingTime {ping}"
        );
    });
}

/// Every extra on one coordinated elector at once (Events, metrics, Lease
/// metadata, fencing tokens) through an API server's handover away from it
/// and back: one Event per transition, the leader gauge and the token in
/// step with the terms, the configured metadata written by each term of
/// ours, and the token growing across the other candidate's term.
#[cfg(all(feature = "metrics", feature = "events", feature = "lease-metadata"))]
#[test]
fn every_extra_on_a_coordinated_elector_follows_a_handover_away_and_back() {
    use prometheus_client::registry::Registry;

    use crate::tests::support::assert_scraped;
    const LEADER: &str = r#"leader_election_is_leader{namespace="default",lease="lease"}"#;

    paused(async {
        let mut registry = Registry::default();
        let metrics = crate::metrics::LeaseMetrics::register(&mut registry);
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        let config = coordinated("me")
            .label("example.com/app", "x")
            .annotation("example.com/note", "mine");
        let (e, _) = elector(&fake, config);
        let e = e
            .with_events(kube_runtime::events::Reporter {
                controller: "test".into(),
                instance: None,
            })
            .with_metrics(&metrics);
        let mut acquire = Box::pin(e.acquire());
        assert!(tokio::time::timeout(S(1), &mut acquire).await.is_err());
        assign(&fake, CANDIDATE);
        let first = tokio::time::timeout(S(1), acquire)
            .await
            .expect("leads when elected")
            .expect("leads");
        let lease = fake.lease().expect("a lease");
        let labels = lease.metadata.labels.clone().unwrap_or_default();
        let annotations = lease.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(labels.get("example.com/app").map(String::as_str), Some("x"));
        assert_eq!(
            annotations.get("example.com/note").map(String::as_str),
            Some("mine")
        );
        assert_eq!(crate::record::token_of(&lease), first.fencing_token());
        assert_scraped(&registry, &format!("{LEADER} 1"));

        // The API server marks the term for "better", and hands it over.
        let first_token = first.fencing_token();
        prefer(&fake, "better");
        let lost = tokio::time::timeout(S(1), first)
            .await
            .expect("steps down at once");
        assert!(matches!(lost, Lost::SteppedDown { .. }), "{lost:?}");
        sleep(S(20)).await;
        assert_scraped(&registry, &format!("{LEADER} 0"));
        // "better" (client-go's coordinated candidate) takes it: transitions + 1.
        assign(&fake, "better");
        let mut lease = fake.lease().expect("a lease");
        let spec = lease.spec.as_mut().expect("a spec");
        spec.acquire_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        spec.lease_transitions = spec.lease_transitions.map(|t| t + 1);
        fake.put(lease);
        let better_transitions = fake
            .lease()
            .and_then(|l| l.spec?.lease_transitions)
            .map_or(0, i64::from);
        sleep(S(20)).await;

        // And back to us.
        let mut again = Box::pin(e.acquire());
        assert!(tokio::time::timeout(S(1), &mut again).await.is_err());
        assign(&fake, CANDIDATE);
        let second = tokio::time::timeout(S(10), again)
            .await
            .expect("leads when elected again")
            .expect("leads");
        assert!(
            second.fencing_token() > first_token && second.fencing_token() > better_transitions,
            "tokens: ours {first_token}, better's transitions {better_transitions}, ours again {}",
            second.fencing_token()
        );
        assert_eq!(
            crate::record::token_of(&fake.lease().unwrap()),
            second.fencing_token()
        );
        assert_scraped(&registry, &format!("{LEADER} 1"));
        sleep(S(1)).await;
        let actions: Vec<String> = fake
            .events()
            .iter()
            .map(|e| e["action"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(
            actions,
            ["BecameLeader", "SteppedDown", "BecameLeader"],
            "one Event per transition"
        );
        assert!(
            fake.events()
                .iter()
                .all(|e| e["note"].as_str().is_some_and(|n| n.starts_with(CANDIDATE))),
            "each Event names the candidate: {:?}",
            fake.events()
        );
    });
}

/// A Role on `leasecandidates` without `list`
/// and `watch` publishes the `LeaseCandidate` but cannot watch it, so the
/// API server's pings went unseen (answered only by the refresh, every five
/// minutes): the API server elects only candidates that answered, so the
/// candidate was never elected, and only kube-runtime's watcher logged the
/// 403, with nothing naming the rule. The refusal is warned once, naming
/// the verbs, and the candidate reads its `LeaseCandidate` every retry
/// period meanwhile, answering pings from those reads.
#[test]
fn a_lease_candidate_that_cannot_be_watched_says_so_and_still_answers_pings() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default().serve_lease_candidates();
            fake.forbid_lease_candidate_verbs(&["list", "watch"]);
            let (e, _acquire) = published(&fake).await;
            // Pinged between two reads (they come every retry period, 2 s).
            sleep(Duration::from_millis(5_500)).await;
            assert!(fake.ping_lease_candidate(CANDIDATE));
            let ping = lease_candidate_time(&fake, CANDIDATE, "pingTime").unwrap();
            // By the first read after the ping (mutation testing: kills
            // answering it only at the second read).
            sleep(e.config().retry_period + Duration::from_millis(100)).await;
            let renew = lease_candidate_time(&fake, CANDIDATE, "renewTime").unwrap();
            assert!(
                renew > ping,
                "a ping not answered by the first read after it (a retry period), the \
                 LeaseCandidate's watch forbidden: renewTime {renew}, pingTime {ping}"
            );
            // Answered once: no write at every read.
            let updates = |fake: &FakeLeaseApi| {
                fake.requests()
                    .iter()
                    .filter(|r| r.verb == "candidate update")
                    .count()
            };
            let before = updates(&fake);
            sleep(S(60)).await;
            assert_eq!(updates(&fake), before, "the reads write nothing without a ping");
            // Allowed again (the watcher retries within 30 s): the reads end.
            fake.forbid_lease_candidate_verbs(&[]);
            sleep(S(60)).await;
            let since = tokio::time::Instant::now();
            sleep(S(30)).await;
            let reads = fake
                .requests()
                .iter()
                .filter(|r| r.verb == "candidate get" && r.at >= since)
                .count();
            assert_eq!(
                reads, 0,
                "still reading every retry period once the watch is allowed"
            );
        });
    });
    let named: Vec<_> = logs
        .lines()
        .filter(|l| l.contains("LeaseCandidate") && l.contains("RBAC"))
        .collect();
    assert_eq!(named.len(), 1, "one warning naming the rule; logs:\n{logs}");
    assert!(
        named[0].contains("WARN") && named[0].contains("`list` and `watch`"),
        "{}",
        named[0]
    );
}

/// A read standing in for the refused watch that fails (a 5xx) is only
/// logged and tried again at the next: the `LeaseCandidate` is not
/// published again as if it were gone (mutation testing: kills the 404
/// test of `read_for_a_ping` inverted).
#[test]
fn a_failed_read_in_place_of_the_watch_does_not_publish_the_candidate_again() {
    paused(async {
        let fake = FakeLeaseApi::default().serve_lease_candidates();
        fake.forbid_lease_candidate_verbs(&["list", "watch"]);
        let (_e, _acquire) = published(&fake).await;
        fake.set_lease_candidates_refused(Some(500));
        let since = tokio::time::Instant::now();
        sleep(S(20)).await;
        let requests = fake.requests();
        let sent = |verb: &str| {
            requests
                .iter()
                .filter(|r| r.verb == verb && r.at >= since)
                .count()
        };
        assert!(
            sent("candidate get") >= 3,
            "not read every retry period: {} reads",
            sent("candidate get")
        );
        assert_eq!(sent("candidate create"), 0, "published again after a failed read");
    });
}

/// A Role on `leasecandidates` without
/// `update` (a ping's answer refused) or without `delete` (the candidate
/// left behind when the election ends): the warning names the verb that
/// is missing, as the Lease's do, not only the API server's message.
#[test]
fn a_lease_candidate_call_refused_by_rbac_names_the_missing_verb() {
    let text = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default().serve_lease_candidates();
            let (e, acquire) = published(&fake).await;
            fake.forbid_lease_candidate_verbs(&["update", "delete"]);
            assert!(fake.ping_lease_candidate(CANDIDATE));
            sleep(S(1)).await;
            drop(acquire);
            sleep(S(10)).await;
            assert!(!e.tasks_for_test().0, "the task ended");
        });
    });
    for (what, verb) in [("renewing", "update"), ("deleting", "delete")] {
        let line = text
            .lines()
            .find(|l| l.contains(&format!("{what} the LeaseCandidate failed")))
            .unwrap_or_else(|| panic!("no line about {what}: {text}"));
        assert!(
            line.contains(&format!("`{verb}` is missing")) && line.contains("RBAC needs"),
            "{line}"
        );
    }
}
