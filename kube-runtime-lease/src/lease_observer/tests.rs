use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};

use super::LeaseObserver;
use crate::{
    ConfigError, LeaderStatus,
    test_util::FakeLeaseApi,
    tests::support::{config, elector, paused},
};

const S: fn(u64) -> Duration = Duration::from_secs;

/// Waits (5 s at most) until `status` names `holder`.
async fn sees(status: &mut tokio::sync::watch::Receiver<LeaderStatus>, holder: &str) {
    timeout(S(5), status.wait_for(|s| s.holder.as_deref() == Some(holder)))
        .await
        .unwrap_or_else(|_| panic!("the observer did not report {holder} within 5 s"))
        .unwrap();
}

/// An observer follows the holder through a creation, a takeover, a release
/// and a deletion, and never writes to the Lease.
#[test]
fn an_observer_follows_the_holder_and_never_writes() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (client, observer_id) = fake.client();
        let observer = LeaseObserver::new(client, "default", "lease").unwrap();
        let mut status = observer.subscribe();
        sleep(S(1)).await;
        assert_eq!(observer.status().holder, None, "no Lease yet");
        let (a, _) = elector(&fake, config("a"));
        let guard = a.acquire().await.unwrap();
        sees(&mut status, "a").await;
        assert!(!observer.status().is_leader);
        fake.take_over("b");
        sees(&mut status, "b").await;
        drop(guard);
        let transitions = observer.status().transitions;
        assert!(transitions.is_some());
        fake.delete();
        timeout(
            S(5),
            status.wait_for(|s| s.holder.is_none() && s.transitions.is_none()),
        )
        .await
        .expect("sees the deletion")
        .unwrap();
        let writes = fake
            .requests()
            .iter()
            .filter(|r| r.client == observer_id && matches!(r.verb, "create" | "update" | "delete"))
            .count();
        assert_eq!(writes, 0, "an observer never writes");
    });
}

/// A watch that fails (a partition) recovers, and the status catches up.
#[test]
fn an_observer_catches_up_after_its_watch_fails() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = elector(&fake, config("a"));
        let _guard = a.acquire().await.unwrap();
        let (client, id) = fake.client();
        let observer = LeaseObserver::new(client, "default", "lease").unwrap();
        let mut status = observer.subscribe();
        sees(&mut status, "a").await;
        fake.partition(id, true);
        fake.take_over("c");
        sleep(S(5)).await;
        assert_eq!(observer.status().holder.as_deref(), Some("a"), "cut off");
        fake.partition(id, false);
        timeout(S(60), status.wait_for(|s| s.holder.as_deref() == Some("c")))
            .await
            .expect("catches up once the watch is back")
            .unwrap();
    });
}

/// Invalid names are refused before any API call.
#[test]
fn an_observer_of_an_invalid_name_is_an_error() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (client, _) = fake.client();
        assert!(matches!(
            LeaseObserver::new(client.clone(), "Bad_NS", "lease"),
            Err(ConfigError::InvalidNamespace { .. })
        ));
        assert!(matches!(
            LeaseObserver::new(client, "default", "Not A Name"),
            Err(ConfigError::InvalidName { .. })
        ));
        assert!(fake.requests().is_empty());
    });
}

/// A watch that stalls (open and silent: a dead connection behind a proxy,
/// which neither ends nor fails) must not leave the status on a holder
/// long gone: a held record is renewed well within its lease duration, so
/// a silence that long is checked with a read, and a takeover the watch
/// missed is reported within about two of the record's lease durations.
#[test]
fn an_observer_whose_watch_stalls_still_reports_the_takeover() {
    paused(takeover_behind_a_stalled_watch(false, config("a"), 2));
}

/// A stalled watch and a dead kept-alive connection go together (a load
/// balancer or NAT that dropped its state: `stall_open` on the real API
/// server), and kube sets no read timeout: the read that checks the silent
/// watch may never be answered. It must be bounded, as every elector
/// request is, or the observer reports a holder long gone for as long as
/// the dead connection lasts (TCP's retransmissions: about 15 minutes).
#[test]
fn an_observer_whose_checking_read_hangs_still_reports_the_takeover() {
    paused(takeover_behind_a_stalled_watch(true, config("a"), 3));
}

/// A Lease held with a long lease duration (an hour) is renewed every retry
/// period all the same: a watch silent for a minute is checked with a read,
/// however long the record's duration (its silence was once trusted for the
/// whole duration, so a stalled watch hid a takeover for an hour). Within
/// the minute (mutation testing: kills a cap of two minutes).
#[test]
fn an_observer_of_a_long_held_lease_checks_a_stalled_watch_within_a_minute() {
    let hour = config("a").lease_duration(S(3600)).renew_deadline(S(3000));
    paused(takeover_behind_a_stalled_watch(false, hour, 1));
}

/// And a Lease held with a short lease duration (6 s) is checked after its
/// duration, not the 15 s of a free Lease (mutation testing: kills
/// `silence`'s holder guard as `false`).
#[test]
fn an_observer_of_a_short_held_lease_checks_a_stalled_watch_within_its_duration() {
    let short = config("a")
        .lease_duration(S(6))
        .renew_deadline(S(4))
        .retry_period(S(1));
    paused(takeover_behind_a_stalled_watch(false, short, 2));
}

/// `c` takes the Lease over from the candidate of `a` while the observer's
/// watch is stalled (and its first checking read never answered, if
/// `read_hangs`): the observer reports `c` within `durations` of the
/// record's lease duration, or of a minute if that is shorter.
async fn takeover_behind_a_stalled_watch(read_hangs: bool, a: crate::LeaseConfig, durations: u64) {
    // Free (no creation hold to wait out).
    let fake = crate::tests::support::free();
    let (a, _) = elector(&fake, a);
    let _guard = a.acquire().await.unwrap();
    let (client, id) = fake.client();
    let observer = LeaseObserver::new(client, "default", "lease").unwrap();
    let mut status = observer.subscribe();
    sees(&mut status, "a").await;
    fake.stall_watches(id);
    if read_hangs {
        fake.fault(id, Some("get"), crate::test_util::Fault::DelayRequest(S(3600)));
    }
    sleep(S(3)).await;
    fake.take_over("c");
    let duration = fake
        .lease()
        .and_then(|l| l.spec?.lease_duration_seconds)
        .expect("a duration");
    let bound = S(durations * u64::try_from(duration).unwrap().min(60));
    timeout(bound, status.wait_for(|s| s.holder.as_deref() == Some("c")))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the observer still reports {:?} {bound:?} after c took the Lease over (its watch stalled, \
                 its first checking read hanging: {read_hangs})",
                observer.status().holder
            )
        })
        .unwrap();
}

/// The double's lagging watch (`set_watch_latency`): an observer behind
/// one reports a takeover as late as its watch delivers it, not before,
/// and not much after.
#[test]
fn an_observer_behind_a_lagging_watch_reports_as_late_as_it_delivers() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = elector(&fake, config("a"));
        let _guard = a.acquire().await.unwrap();
        let (client, id) = fake.client();
        fake.set_watch_latency(id, S(3));
        let observer = LeaseObserver::new(client, "default", "lease").unwrap();
        let mut status = observer.subscribe();
        sees(&mut status, "a").await;
        fake.take_over("c");
        let taken = tokio::time::Instant::now();
        sees(&mut status, "c").await;
        let after = taken.elapsed();
        assert!(
            after >= S(3) && after < S(4),
            "c reported {after:?} after the takeover, behind a watch 3 s late"
        );
    });
}

/// An observer beside candidates whose leader dies: its watch, silent for
/// the lease duration since the last renewal, is read at about the instant
/// the followers take over, and a read that overtakes the watch's event of
/// the takeover is no stall. Neither warned nor watched anew.
#[test]
fn an_observer_does_not_take_a_takeover_it_reads_first_for_a_stalled_watch() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = crate::tests::support::free();
            let (client, observer_id) = fake.client();
            fake.set_latency(observer_id, Duration::from_millis(8));
            fake.set_watch_latency(observer_id, Duration::from_millis(10));
            let observer = LeaseObserver::new(client, "default", "lease").unwrap();
            let mut status = observer.subscribe();
            let (a, a_id) = elector(&fake, config("a"));
            let _guard = a.acquire().await.unwrap();
            let mut followers = vec![];
            for i in 0..5 {
                let (e, id) = elector(&fake, config(&format!("f{i}")));
                fake.set_latency(id, Duration::from_millis(1));
                followers.push(tokio::spawn(async move {
                    let _guard = e.acquire().await;
                    std::future::pending::<()>().await;
                }));
            }
            sleep(S(10)).await;
            fake.partition(a_id, true);
            timeout(
                S(30),
                status.wait_for(|s| s.holder.as_deref().is_some_and(|h| h != "a")),
            )
            .await
            .expect("sees the takeover")
            .unwrap();
            sleep(S(5)).await;
        });
    });
    assert!(
        !logs.contains("lease observer: the watch delivered nothing"),
        "a healthy watch warned as stalled:\n{logs}"
    );
}

/// An observer's Role is `get`, `list` and
/// `watch` on `leases`. Without `list`/`watch` (the watch refused with
/// 403), or without `get` (its checking reads refused), it must say which
/// rule is missing, once per outage, as an elector does, instead of
/// retrying silently at debug level; and without `list`/`watch` it still
/// reports the holder, from its reads.
#[test]
fn an_observer_refused_by_rbac_names_the_missing_verb_once() {
    let mut watch_at = None;
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default();
            let (a, _) = elector(&fake, config("a"));
            let _guard = a.acquire().await.unwrap();
            let (client, id) = fake.client();
            fake.forbid_watch(id);
            let start = tokio::time::Instant::now();
            let observer = LeaseObserver::new(client, "default", "lease").unwrap();
            let mut status = observer.subscribe();
            timeout(S(60), status.wait_for(|s| s.holder.as_deref() == Some("a")))
                .await
                .expect("an observer without list/watch reports the holder from its reads")
                .unwrap();
            watch_at = Some(start.elapsed());
            sleep(S(120)).await;
        });
    });
    let watch_at = watch_at.unwrap();
    assert!(
        watch_at <= S(16),
        "the holder was reported only {watch_at:?} after the observer started (the watch forbidden)"
    );
    let watch: Vec<_> = logs
        .lines()
        .filter(|l| l.contains("lease observer") && l.contains("RBAC"))
        .collect();
    assert_eq!(watch.len(), 1, "one warning naming the rule; logs:\n{logs}");
    assert!(
        watch[0].contains("WARN") && watch[0].contains("`list` and `watch`"),
        "{}",
        watch[0]
    );

    // Without `get`: the watch delivers; its checking read after a silence
    // is refused. (The Lease is free: nothing changes, a read every 15 s.)
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = crate::tests::support::free();
            let (client, id) = fake.client();
            for _ in 0..100 {
                fake.fault(id, Some("get"), crate::test_util::Fault::Status(403));
            }
            let observer = LeaseObserver::new(client, "default", "lease").unwrap();
            sleep(S(120)).await;
            assert_eq!(observer.status().holder, None);
        });
    });
    let get: Vec<_> = logs
        .lines()
        .filter(|l| l.contains("lease observer") && l.contains("RBAC"))
        .collect();
    assert_eq!(get.len(), 1, "one warning naming the rule; logs:\n{logs}");
    assert!(get[0].contains("`get`"), "{}", get[0]);
}

/// An observer whose Client impersonates (a kubeconfig's `as:`) while its
/// own identity may not: every request is refused with authorization's
/// 403 about `impersonate`, no verb on `leases` missing. It must say so at
/// WARN, once per outage, with the API server's message (as the election
/// does), not retry silently at debug, nor name verbs the Role has.
#[test]
fn an_observer_refused_impersonation_warns_with_the_api_servers_message() {
    const REFUSED: &str = r#"users "someone" is forbidden: User "system:serviceaccount:ns:sa" cannot impersonate resource "users" in API group "" at the cluster scope"#;
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let service = tower::service_fn(|_: http::Request<kube_client::client::Body>| async {
                let status = serde_json::json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": REFUSED, "reason": "Forbidden",
                    "details": {"name": "someone", "kind": "users"}, "code": 403,
                });
                http::Response::builder()
                    .status(403)
                    .header("content-type", "application/json")
                    .body(kube_client::client::Body::from(status.to_string().into_bytes()))
            });
            let client = kube_client::Client::new(service, "default");
            let observer = LeaseObserver::new(client, "default", "lease").unwrap();
            sleep(S(120)).await;
            assert_eq!(observer.status().holder, None);
        });
    });
    let lines: Vec<_> = logs.lines().filter(|l| l.contains("lease observer")).collect();
    assert!(
        lines.len() == 2
            && lines
                .iter()
                .all(|l| l.contains("WARN") && l.contains("cannot impersonate") && !l.contains("RBAC needs"))
            && lines.iter().any(|l| l.contains("watch"))
            && lines.iter().any(|l| l.contains("read") || l.contains("get")),
        "a refused impersonation: expected one WARN for the watch and one for the read, with the API server's \
         message and no missing verb named; lease observer lines at WARN and above:\n{}",
        lines.join("\n")
    );
}

/// An observer whose task panicked (a panic in a request's future, which
/// runs in the observer's task: a layer of the user's Client stack, or
/// kube's own) follows the Lease no more: its subscribers' `changed()`
/// ends, and its status must not go on naming the last holder as if it
/// were current (a dashboard or a webhook would trust a leader long gone).
#[test]
fn an_observer_whose_task_panicked_names_no_holder() {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = elector(&fake, config("a"));
        let _guard = a.acquire().await.unwrap();
        let (inner, _) = fake.client();
        let panics = Arc::new(AtomicBool::new(false));
        let p = panics.clone();
        let service = tower::service_fn(move |req: http::Request<kube_client::client::Body>| {
            let (inner, panics) = (inner.clone(), p.load(Ordering::SeqCst));
            async move {
                assert!(!panics, "injected: a request of the observer's panics");
                inner.send(req).await
            }
        });
        let observer =
            LeaseObserver::new(kube_client::Client::new(service, "default"), "default", "lease").unwrap();
        let mut status = observer.subscribe();
        sees(&mut status, "a").await;
        panics.store(true, Ordering::SeqCst);
        // The watch expires: the watcher lists again, and that request panics.
        fake.expire_watches();
        let ended = timeout(S(30), async { while status.changed().await.is_ok() {} }).await;
        assert!(
            ended.is_ok() && observer.status().holder.is_none(),
            "the observer's task panicked (its subscribers' changed() ended: {}); its status still names {:?} \
             as the holder",
            ended.is_ok(),
            observer.status().holder
        );
    });
}

/// A watch silent for less than the record's lease duration is no stall:
/// an observer of a released Lease (client-go's released record: no holder,
/// a duration of 1 s) reads it at most once every 15 s, and of a Lease held
/// and renewed every retry period not at all (mutation testing: kills
/// `silence`'s holder guard as `true`, a read every second of a released
/// Lease, and a clamp of 1 s, a read between renewals).
#[test]
fn an_observer_reads_a_released_lease_every_15_s_and_a_renewed_one_never() {
    paused(async {
        let fake = crate::tests::support::free();
        let (client, id) = fake.client();
        let observer = LeaseObserver::new(client, "default", "lease").unwrap();
        let mut status = observer.subscribe();
        let reads = || {
            fake.requests()
                .iter()
                .filter(|r| r.client == id && r.verb == "get")
                .count()
        };
        sleep(S(1)).await;
        let before = reads();
        sleep(S(60)).await;
        let free = reads() - before;
        assert!(
            free <= 4,
            "{free} reads of a released Lease in 60 s: one every 15 s at most"
        );
        let (a, _) = elector(&fake, config("a"));
        let _guard = a.acquire().await.unwrap();
        sees(&mut status, "a").await;
        let before = reads();
        sleep(S(60)).await;
        assert_eq!(
            reads() - before,
            0,
            "reads of a Lease renewed every retry period, in 60 s"
        );
    });
}

/// An observer's checking read answered with something that does not say the
/// Lease is gone: a 404 whose `Status` names no Lease (an API server that
/// does not serve the group yet), or a `200` whose body is not the Lease
/// (`{}`: something in front of the API server). The observer took both
/// for "no holder" (kube's `get_opt` takes any `NotFound` for a missing
/// object, and `{}` decoded as a Lease with no record), while `a` held the
/// Lease all along. Each is a failed read: the holder read last stands.
#[test]
fn an_observer_does_not_take_an_odd_answer_for_a_lease_gone() {
    const NOT_FOUND_OTHER: &str = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"details":{"name":"other","kind":"leases"}}"#;
    const NOT_FOUND_KIND: &str = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"details":{"name":"lease","kind":"configmaps"}}"#;
    const FORBIDDEN: &str = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"details":{"name":"lease","kind":"leases"}}"#;
    for fault in [
        crate::test_util::Fault::NoSuchResource,
        crate::test_util::Fault::Body(200, "{}"),
        // A `Status` naming another Lease, or another kind of object, or
        // the Lease but saying something else (mutation testing: each
        // comparison of `error::lease_gone`).
        crate::test_util::Fault::Body(404, NOT_FOUND_OTHER),
        crate::test_util::Fault::Body(404, NOT_FOUND_KIND),
        crate::test_util::Fault::Body(403, FORBIDDEN),
    ] {
        paused(async {
            let fake = FakeLeaseApi::default();
            fake.put(crate::tests::support::held_by("a", 15));
            let (client, id) = fake.client();
            let observer = LeaseObserver::new(client, "default", "lease").unwrap();
            let mut status = observer.subscribe();
            sees(&mut status, "a").await;
            // Nobody renews: every 15 s of silence, a checking read.
            for _ in 0..10 {
                fake.fault(id, Some("get"), fault);
            }
            sleep(S(100)).await;
            let reads = crate::tests::support::count(&fake, id, "get", tokio::time::Instant::now() - S(100));
            assert!(reads >= 5, "{reads} checking reads in 100 s");
            assert_eq!(
                observer.status().holder.as_deref(),
                Some("a"),
                "the observer reports no holder after reads answered {fault:?}, while a holds the Lease"
            );
        });
    }
}

/// An observer whose watch stalled reads the Lease when it stays silent, and
/// a read answered with the API server's `NotFound` naming the Lease is the
/// Lease gone: no holder (mutation testing: kills `read`'s `lease_gone`
/// guard as `false`, which reported the deleted Lease's holder for as long
/// as the watch stalled).
#[test]
fn an_observer_whose_watch_stalled_reads_a_deleted_lease_as_gone() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(crate::tests::support::held_by("a", 15));
        let (client, id) = fake.client();
        let observer = LeaseObserver::new(client, "default", "lease").unwrap();
        let mut status = observer.subscribe();
        sees(&mut status, "a").await;
        fake.stall_watches(id);
        fake.delete();
        timeout(S(30), status.wait_for(|s| s.holder.is_none()))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the observer still reports {:?} 30s after the Lease was deleted (its watch stalled)",
                    observer.status().holder
                )
            })
            .unwrap();
    });
}

/// An observer's watch delivering events for another Lease than its own (see
/// `tests::regressions::a_watch_event_for_another_lease_costs_no_term`): it
/// reported the other Lease's holder, or no holder for its deletion, while
/// `a` held the Lease all along. Such an event is dropped.
#[test]
fn an_observer_does_not_take_another_leases_watch_event_for_its_own() {
    for event in crate::tests::support::OTHER_LEASE_EVENTS {
        paused(async {
            let fake = FakeLeaseApi::default();
            fake.put(crate::tests::support::held_by("a", 15));
            let (client, id) = fake.client();
            let observer = LeaseObserver::new(client, "default", "lease").unwrap();
            let mut status = observer.subscribe();
            sees(&mut status, "a").await;
            fake.fault(id, Some("watch"), crate::test_util::Fault::Body(200, event));
            fake.expire_watches();
            let other = timeout(S(10), status.wait_for(|s| s.holder.as_deref() != Some("a"))).await;
            assert!(
                other.is_err(),
                "the observer reports holder {:?} after its watch delivered {event}, while a holds the Lease",
                observer.status().holder
            );
        });
    }
}

/// A watch resumed from an old BOOKMARK after it delivered the Lease's
/// deletion (no list between) replays the Lease's history since: the
/// last record before the deletion was not older than the newest version
/// delivered (a deletion did not raise it), and the observer reported its
/// holder again, for a Lease gone. A deletion is the newest version too.
#[test]
fn an_observer_does_not_bring_a_deleted_lease_back_from_an_old_bookmark() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(crate::tests::support::held_by("b", 15));
        fake.take_over("a");
        let (client, id) = fake.client();
        let observer = LeaseObserver::new(client, "default", "lease").unwrap();
        let mut status = observer.subscribe();
        sees(&mut status, "a").await;
        fake.delete();
        timeout(S(5), status.wait_for(|s| s.holder.is_none()))
            .await
            .expect("sees the deletion")
            .unwrap();
        resume_from_an_old_bookmark(&fake, id);
        status.mark_unchanged();
        let odd = Instant::now();
        let back = timeout(S(30), status.changed()).await;
        assert!(
            back.is_err(),
            "the observer's status changed {:?} after its watch resumed from an old bookmark, for a Lease \
             deleted and seen deleted (a holder reported again; now {:?})",
            Instant::now() - odd,
            status.borrow().holder
        );
        assert!(fake.lease().is_none());
    });
}

/// The same, for a Lease deleted and created again: the replay brings the
/// deletion back, older than the record created since, which the observer
/// reported as the Lease gone while `c` held it. An event older than one
/// delivered is dropped, a deletion as a record.
#[test]
fn an_observer_does_not_replay_an_old_deletion_from_an_old_bookmark() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(crate::tests::support::held_by("a", 15));
        fake.delete();
        fake.put(crate::tests::support::held_by("c", 15));
        let (client, id) = fake.client();
        let observer = LeaseObserver::new(client, "default", "lease").unwrap();
        let mut status = observer.subscribe();
        sees(&mut status, "c").await;
        resume_from_an_old_bookmark(&fake, id);
        status.mark_unchanged();
        let odd = Instant::now();
        let gone = timeout(S(30), status.changed()).await;
        assert!(
            gone.is_err(),
            "the observer's status changed {:?} after its watch resumed from an old bookmark, while c held the \
             Lease all along (no holder reported; now {:?})",
            Instant::now() - odd,
            status.borrow().holder
        );
    });
}

/// Ends `client`'s Lease watch (its connection cut), and answers the watch
/// resumed from where it was with a BOOKMARK at resourceVersion 1 and its
/// end: the watch is resumed from there, and the double replays the
/// Leases' history since.
fn resume_from_an_old_bookmark(fake: &FakeLeaseApi, client: usize) {
    fake.fault(
        client,
        Some("watch"),
        crate::test_util::Fault::Body(
            200,
            concat!(
                r#"{"type":"BOOKMARK","object":{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","#,
                r#""metadata":{"resourceVersion":"1"}}}"#,
                "\n"
            ),
        ),
    );
    fake.partition(client, true);
    fake.partition(client, false);
}

/// The same, for records the watch delivered after its list: the replay
/// brings back `b`'s record, older than `a`'s since but newer than the
/// list's. Every record delivered counts as the newest, not the list's
/// alone.
#[test]
fn an_observer_does_not_replay_a_takeover_delivered_after_its_list_from_an_old_bookmark() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(crate::tests::support::held_by("a", 15));
        let (client, id) = fake.client();
        let observer = LeaseObserver::new(client, "default", "lease").unwrap();
        let mut status = observer.subscribe();
        for holder in ["a", "b", "a"] {
            if observer.status().holder.is_some() {
                fake.take_over(holder);
            }
            sees(&mut status, holder).await;
        }
        resume_from_an_old_bookmark(&fake, id);
        status.mark_unchanged();
        let odd = Instant::now();
        let changed = timeout(S(30), status.changed()).await;
        assert!(
            changed.is_err(),
            "the observer's status changed {:?} after its watch resumed from an old bookmark, while a held the \
             Lease all along (b reported again; now {:?})",
            Instant::now() - odd,
            status.borrow().holder
        );
    });
}

/// etcd restored from a snapshot (without `--bump-revision`), to an older
/// record and to before the Lease's creation: the revision moves back, and
/// the writes after the restore reuse versions the watch delivered before.
/// The list after the restore is taken as it is, and what follows it is
/// judged against it alone: the observer reports the next holder as its
/// watch delivers it, not at its next checking read (15 s).
#[test]
fn an_observer_follows_the_writes_after_an_etcd_restore_at_once() {
    for (rv, listed) in [(1, Some("a")), (0, None)] {
        paused(async {
            let fake = FakeLeaseApi::default();
            fake.put(crate::tests::support::held_by("a", 15));
            fake.take_over("b");
            fake.take_over("c");
            let (client, _) = fake.client();
            let observer = LeaseObserver::new(client, "default", "lease").unwrap();
            let mut status = observer.subscribe();
            sees(&mut status, "c").await;
            fake.restore(rv);
            timeout(S(5), status.wait_for(|s| s.holder.as_deref() == listed))
                .await
                .expect("sees the Lease as restored")
                .unwrap();
            match listed {
                Some(_) => fake.take_over("d"),
                None => fake.put(crate::tests::support::held_by("d", 15)),
            }
            let at = Instant::now();
            let d = timeout(S(5), status.wait_for(|s| s.holder.as_deref() == Some("d")))
                .await
                .is_ok();
            assert!(
                d,
                "the observer reports holder {:?} 5 s after d took the Lease restored to resourceVersion {rv} \
                 (reports d {:?} after)",
                observer.status().holder,
                {
                    let _ = timeout(S(60), status.wait_for(|s| s.holder.as_deref() == Some("d"))).await;
                    Instant::now() - at
                }
            );
        });
    }
}
