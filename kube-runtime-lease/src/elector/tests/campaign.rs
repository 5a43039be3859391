//! The acquire path (`task/campaign.rs`): one test per property that mutation
//! testing showed untested, each named after it. On the in-memory
//! Lease API double, with paused time.

use std::{pin::pin, time::Duration};

use tokio::time::{Instant, sleep, timeout};

use crate::{
    LeaseConfig, Lost,
    test_util::{FakeLeaseApi, Fault},
    tests::support::{config, elector, held_by, holder, paused, spec},
};

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

/// The longest wait between two attempts of a candidate without a watch:
/// the retry period (2 s) with client-go's jitter (factor 1.2).
const LONGEST_POLL: Duration = Duration::from_millis(4400);

/// When `client` sent each request of `verb`, in order.
fn times(fake: &FakeLeaseApi, client: usize, verb: &str) -> Vec<Instant> {
    fake.requests()
        .iter()
        .filter(|s| s.client == client && s.verb == verb)
        .map(|s| s.at)
        .collect()
}

/// When `client` last wrote the Lease (create or update).
fn last_write(fake: &FakeLeaseApi, client: usize) -> Instant {
    fake.requests()
        .iter()
        .filter(|s| s.client == client && matches!(s.verb, "create" | "update"))
        .map(|s| s.at)
        .max()
        .expect("no write yet")
}

/// Invariant 7: every write during a creation hold carries a duration that
/// covers the rest of the hold, rounded *up* to whole seconds, so that a
/// candidate that only ever sees our record cannot take it before the hold
/// ends. The hold here has a fractional rest: the deletion of a 40 s record
/// is seen while the task lingers (nobody wants leadership), and leadership
/// is wanted again 250 ms later.
#[test]
fn every_write_during_a_creation_hold_covers_its_rest_rounded_up() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("go", 40));
        let (a, id) = elector(&fake, config("a"));
        assert!(timeout(S(1), a.acquire()).await.is_err(), "go holds the lease");
        // Nobody wants leadership: the task lingers, watching, for a retry period.
        sleep(MS(500)).await;
        let deleted = Instant::now();
        fake.delete();
        sleep(MS(250)).await;
        let mut acquire = pin!(a.acquire());
        assert!(
            timeout(MS(100), &mut acquire).await.is_err(),
            "a holds the re-created lease"
        );
        assert_eq!(holder(&fake).as_deref(), Some("a"), "re-created by a");
        let hold_ends = deleted + S(40);
        for _ in 0..5 {
            let written = last_write(&fake, id);
            let seconds = spec(&fake).lease_duration_seconds.expect("a duration");
            let covers = written + S(u64::try_from(seconds).unwrap());
            assert!(
                covers >= hold_ends,
                "the write {:?} after the deletion says {seconds} s: it ends {:?} before the hold",
                written - deleted,
                hold_ends - covers
            );
            sleep(S(2)).await; // the next renewal during the hold
        }
        let _guard = acquire.await.unwrap();
        assert!(
            deleted.elapsed() >= S(40),
            "led {:?} after the deletion",
            deleted.elapsed()
        );
    });
}

/// A missing Lease is created under the configured name, in the configured
/// namespace (the API server refuses a create without a name).
#[test]
fn a_missing_lease_is_created_under_the_configured_name_and_namespace() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = elector(&fake, LeaseConfig::new("ns1", "my-lease", "a"));
        assert!(timeout(S(1), a.acquire()).await.is_err(), "created, then held");
        let lease = fake
            .lease()
            .unwrap_or_else(|| panic!("no Lease created: {:?}", fake.requests()));
        assert_eq!(lease.metadata.name.as_deref(), Some("my-lease"));
        assert_eq!(lease.metadata.namespace.as_deref(), Some("ns1"));
        assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some("a"));
    });
}

/// A candidate without a watch reads the Lease before every attempt, so it
/// sees a release at its next poll (within one jittered retry period), not
/// only once the record it read first would have expired.
#[test]
fn a_polling_candidate_reads_before_every_attempt_and_takes_a_release_at_its_next_poll() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("other", 60));
        let (a, id) = elector(&fake, config("a").watch(false));
        let mut acquire = pin!(a.acquire());
        assert!(
            timeout(S(10), &mut acquire).await.is_err(),
            "other holds the lease"
        );
        let polls = times(&fake, id, "get").len();
        assert!(
            polls >= 3,
            "{polls} reads in 10 s of polling: {:?}",
            fake.requests()
        );
        // The holder releases: a free record.
        let mut released = fake.lease().unwrap();
        released.spec.as_mut().unwrap().holder_identity = Some(String::new());
        fake.put(released);
        let released_at = Instant::now();
        let guard = timeout(LONGEST_POLL + MS(1), &mut acquire)
            .await
            .expect("the release was not taken at the next poll")
            .unwrap();
        assert!(guard.is_valid());
        assert!(
            released_at.elapsed() <= LONGEST_POLL,
            "{:?}",
            released_at.elapsed()
        );
    });
}

/// A write to acquire answered 404 is not taken for a deletion (the API
/// server answers a replace of a deleted Lease with 409): the candidate reads
/// the Lease again and tries again after a jittered retry period (one to 2.2
/// retry periods), never at once, so that a `replace` that keeps answering
/// 404 while reads succeed is no loop without a delay. (The write is the
/// takeover of an expired record, the watch in sync; the retry was once at
/// once, which a replace answering 404 for good turned into a loop.)
#[test]
fn an_acquire_that_meets_404_on_update_reads_again_and_retries_after_a_retry_period() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("other", 5));
        let (a, id) = elector(&fake, config("a"));
        fake.fault(id, Some("update"), Fault::Status(404));
        let expired = Instant::now() + S(5);
        let guard = timeout(S(10), a.acquire())
            .await
            .expect("a 404 on the write to acquire was not retried within two retry periods")
            .unwrap();
        assert!(guard.is_valid());
        let writes = times(&fake, id, "update");
        assert_eq!(
            writes.len(),
            2,
            "the write answered 404, then the retry: {writes:?}"
        );
        assert_eq!(writes[0], expired, "the first write at the expiry");
        let gap = writes[1] - writes[0];
        assert!(
            (S(2)..=MS(4_400)).contains(&gap),
            "retried {gap:?} after the 404: one to 2.2 retry periods"
        );
        let reads_between = times(&fake, id, "get")
            .into_iter()
            .filter(|t| *t >= writes[0] && *t <= writes[1])
            .count();
        assert!(
            reads_between >= 1,
            "a read between the 404 and the retry: {:?}",
            fake.requests()
        );
        assert_eq!(holder(&fake).as_deref(), Some("a"));
    });
}

/// The read after a write to acquire answered 404 does not rest on the watch
/// being silent: a watch in sync and heard from since (here it delivers an
/// edit of the labels) is not trusted until the Lease was read again.
#[test]
fn a_404_on_the_write_to_acquire_is_followed_by_a_read_even_while_the_watch_is_heard_from() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("other", 5));
        let (a, id) = elector(&fake, config("a"));
        fake.fault(id, Some("update"), Fault::Status(404));
        let acquire = tokio::spawn({
            let a = a.clone();
            async move { a.acquire().await }
        });
        // The takeover at the expiry (5 s) is answered 404; the retry comes
        // 2 to 4.4 s later.
        tokio::time::sleep(MS(6_500)).await;
        assert_eq!(times(&fake, id, "update").len(), 1, "{:?}", fake.requests());
        let mut edited = fake.lease().unwrap();
        edited.metadata.labels = Some([("edited".to_owned(), "yes".to_owned())].into());
        fake.put(edited);
        let guard = timeout(S(10), acquire)
            .await
            .expect("a 404 on the write to acquire was not retried")
            .unwrap()
            .unwrap();
        assert!(guard.is_valid());
        let writes = times(&fake, id, "update");
        assert_eq!(writes.len(), 2, "{writes:?}");
        let reads_between = times(&fake, id, "get")
            .into_iter()
            .filter(|t| *t > writes[0] && *t <= writes[1])
            .count();
        assert_eq!(reads_between, 1, "one read after the 404: {:?}", fake.requests());
    });
}

/// A write to acquire that fails (a 500, here three times) is retried after
/// a jittered retry period (at least one retry period), never at once: a candidate never
/// hammers a failing API server. (The first write is the takeover of an
/// expired record, once the watch is in sync.)
#[test]
fn a_failed_write_to_acquire_backs_off_before_the_next_attempt() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("other", 5));
        let (a, id) = elector(&fake, config("a"));
        for _ in 0..3 {
            fake.fault(id, Some("update"), Fault::Status(500));
        }
        let expired = Instant::now() + S(5);
        let guard = a.acquire().await.unwrap();
        assert!(guard.is_valid());
        let writes = times(&fake, id, "update");
        assert!(
            writes.len() >= 4,
            "three failures, then the write that won: {writes:?}"
        );
        assert_eq!(writes[0], expired, "the first attempt at the expiry");
        let gaps: Vec<_> = writes[..4].windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.iter().all(|g| *g >= S(2)),
            "a failed write retried before a retry period: {gaps:?}"
        );
    });
}

/// A candidate that lost a race to acquire (409, the record not its own
/// write) waits one jittered retry period before it tries again, as
/// client-go does, instead of retrying at once. (The race is at the expiry
/// of another's record, the watch in sync.)
#[test]
fn a_candidate_that_lost_a_race_waits_a_retry_period_before_trying_again() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("other", 5));
        let (a, id) = elector(&fake, config("a"));
        fake.fault(id, Some("update"), Fault::Status(409));
        let start = Instant::now() + S(5);
        let guard = a.acquire().await.unwrap();
        assert!(guard.is_valid());
        let waited = start.elapsed();
        assert!(
            waited >= S(2) && waited <= LONGEST_POLL,
            "tried again {waited:?} after the lost race"
        );
        let writes = times(&fake, id, "update");
        assert_eq!(writes.len(), 2, "the lost write, then one more: {writes:?}");
        assert!(writes[1] - writes[0] >= S(2), "{writes:?}");
    });
}

/// Invariant 7 on the takeover path: a Lease object that replaced a held one
/// (deleted and re-created free by someone else) is not led before the
/// deleted record's holder may have given up (here 40 s), although it is
/// taken with an update, not created.
#[test]
fn a_takeover_of_a_lease_re_created_since_its_holder_was_seen_waits_out_that_holder() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("go", 40));
        let (a, id) = elector(&fake, config("a"));
        let mut acquire = pin!(a.acquire());
        assert!(timeout(S(1), &mut acquire).await.is_err(), "go holds the lease");
        let deleted = Instant::now();
        fake.delete();
        let mut recreated = held_by("", 1);
        recreated.metadata.labels = None;
        fake.put(recreated);
        let uid = fake.lease().unwrap().metadata.uid;
        let guard = acquire.await.unwrap();
        assert!(
            deleted.elapsed() >= S(40),
            "led {:?} after the held object was replaced",
            deleted.elapsed()
        );
        assert!(guard.is_valid());
        assert_eq!(
            fake.lease().unwrap().metadata.uid,
            uid,
            "the re-created object was taken over, not created again"
        );
        assert!(
            !times(&fake, id, "update").is_empty(),
            "taken with an update: {:?}",
            fake.requests()
        );
    });
}

/// A candidate without a watch polls every retry period with client-go's
/// jitter: each wait is between 1 and 2.2 retry periods (`JitterFactor`
/// 1.2), and spread over that whole range, so that candidates started
/// together drift apart. Over 100 or so polls, a wait beyond 1.85 retry
/// periods is all but certain.
#[test]
fn polling_waits_are_spread_over_client_gos_jitter_of_up_to_2_2_retry_periods() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("other", 3600));
        let (a, id) = elector(&fake, config("a").watch(false));
        assert!(
            timeout(S(400), a.acquire()).await.is_err(),
            "other holds the lease"
        );
        let reads = times(&fake, id, "get");
        let gaps: Vec<_> = reads.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() >= 90, "{} polls in 400 s", gaps.len());
        assert!(
            gaps.iter().all(|g| *g >= S(2) && *g <= LONGEST_POLL),
            "a wait outside [1, 2.2] retry periods: {gaps:?}"
        );
        let longest = gaps.iter().max().unwrap();
        assert!(
            *longest > MS(3700),
            "no wait beyond 1.85 retry periods in {} polls (longest {longest:?}): the jitter is narrower than client-go's",
            gaps.len()
        );
    });
}

/// Only a Lease that was *held* when it went away puts its successor on
/// hold: a free Lease replaced by a new object is taken and led at once
/// (`Memory::went_away`: the risk is a holder that may still lead).
#[test]
fn a_lease_replaced_while_free_is_led_at_once() {
    paused(async {
        let fake = FakeLeaseApi::default();
        // Free, but reserved for someone else for one lease duration: seen,
        // not taken.
        let mut reserved = held_by("", 15);
        reserved.spec.as_mut().unwrap().preferred_holder = Some("x".to_owned());
        reserved.spec.as_mut().unwrap().strategy = Some("OldestEmulationVersion".to_owned());
        fake.put(reserved);
        let (e, _) = elector(&fake, config("me"));
        let mut acquire = pin!(e.acquire());
        assert!(
            timeout(S(5), &mut acquire).await.is_err(),
            "took a reserved Lease"
        );
        assert_eq!(holder(&fake).as_deref(), Some(""));
        // Replaced, while free, by a new object (deleted and re-created
        // between two observations), free too.
        let mut successor = held_by("", 15);
        successor.metadata.uid = Some("another-object".to_owned());
        fake.put(successor);
        let guard = timeout(S(2), &mut acquire)
            .await
            .expect("a free Lease re-created after a free one went away is led at once")
            .expect("leads");
        assert!(guard.is_valid());
    });
}

/// A completed sync of the watch re-evaluates the election at once: the API
/// server answers again, so a backoff begun before it (a failed write while
/// the initial list was still on its way) ends there instead of running its
/// course. (Kills view.rs's `InitDone` survivors, which reduce the
/// answer to "the record changed".)
#[test]
fn a_backoff_begun_before_the_watch_synced_ends_when_it_syncs() {
    paused(async {
        let fake = crate::tests::support::free();
        let (a, id) = elector(&fake, config("a"));
        // The first write to take the free Lease fails; the watch's initial
        // list answers only after 1 s.
        fake.fault(id, Some("update"), Fault::Status(500));
        fake.fault(id, Some("list"), Fault::DelayResponse(S(1)));
        let start = Instant::now();
        let guard = timeout(S(60), a.acquire()).await.expect("leads").expect("leads");
        assert!(guard.is_valid());
        let writes = times(&fake, id, "update");
        assert!(writes.len() >= 2, "{writes:?}");
        assert_eq!(writes[0], start, "the first attempt at once");
        assert!(
            writes[1] - start <= MS(1100),
            "the retry waited out its backoff ({:?}) instead of ending at the sync (1 s)",
            writes[1] - start
        );
    });
}

/// With the creation hold off, a Lease this candidate creates is led at
/// once (as client-go does), and so is one re-created after a deletion; the
/// default holds both (regressions, section 1).
#[test]
fn without_the_creation_hold_a_created_lease_is_led_at_once() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = elector(&fake, config("a").creation_hold(false));
        let began = Instant::now();
        let guard = timeout(S(1), a.acquire())
            .await
            .expect("led at once after creating the Lease")
            .unwrap();
        assert_eq!(began.elapsed(), Duration::ZERO);
        assert_eq!(
            fake.lease().unwrap().spec.unwrap().lease_duration_seconds,
            Some(15),
            "our own duration, no hold written"
        );
        fake.delete();
        assert_eq!(timeout(S(5), guard).await.expect("the term ended"), Lost::Deleted);
        let deleted = Instant::now();
        let again = timeout(S(5), a.acquire())
            .await
            .expect("a re-created Lease is led without a hold")
            .unwrap();
        assert!(deleted.elapsed() < S(3), "{:?}", deleted.elapsed());
        assert!(again.is_valid());
        // The default holds a created Lease for one lease duration.
        let fake = FakeLeaseApi::default();
        let (b, _) = elector(&fake, config("b"));
        assert!(timeout(S(14), b.acquire()).await.is_err(), "held by default");
    });
}

/// A follower with a watch costs nothing while the leader renews: over ten
/// minutes it sends no request beyond its watch (and the watch's own
/// reconnections), however long it waits, while the leader renews once per
/// retry period.
#[test]
fn an_idle_follower_sends_no_requests_beyond_its_watch() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (leader, _) = elector(&fake, config("a"));
        let _guard = leader.acquire().await.unwrap();
        let (follower, id) = elector(&fake, config("b"));
        let mut acquire = pin!(follower.acquire());
        assert!(
            timeout(S(30), &mut acquire).await.is_err(),
            "b led while a renews"
        );
        let from = fake.requests().len();
        assert!(
            timeout(S(600), &mut acquire).await.is_err(),
            "b led while a renews"
        );
        let sent: Vec<_> = fake.requests()[from..]
            .iter()
            .filter(|r| r.client == id)
            .map(|r| r.verb)
            .collect();
        assert!(
            sent.len() <= 10,
            "the follower sent {} requests in 10 minutes of an unchanging leader: {:?}",
            sent.len(),
            &sent[..sent.len().min(20)]
        );
    });
}

/// Under a storm of 5xx and 429 answers to every request (list, watch, get,
/// writes), a candidate's requests stay bounded by its retry period and the
/// watch's backoff: no request loop runs without a delay.
#[test]
fn a_storm_of_error_answers_does_not_raise_the_request_rate() {
    for code in [429, 500, 503, 504] {
        paused(async move {
            let fake = FakeLeaseApi::default();
            let (leader, _) = elector(&fake, config("a"));
            let _guard = leader.acquire().await.unwrap();
            let (follower, id) = elector(&fake, config("b"));
            for _ in 0..100_000 {
                fake.fault(id, None, Fault::Status(code));
            }
            let mut acquire = pin!(follower.acquire());
            assert!(
                timeout(S(600), &mut acquire).await.is_err(),
                "b led while a renews"
            );
            let sent = fake.requests().iter().filter(|r| r.client == id).count();
            // A read every retry period (2 s) at most, and the watch's retries.
            assert!(
                sent <= 600 / 2 + 60,
                "{code}: the candidate sent {sent} requests in 10 minutes"
            );
        });
    }
}

/// A record of another holder that the trusted watch delivers is judged at
/// once, not at the campaign's next planned attempt: a holder that renews
/// with a lease duration shorter than the retry period (1 s here, against
/// 2 s) and then stops is taken at that record's expiry, not up to a
/// jittered retry period later.
#[test]
fn another_holders_renewal_delivered_by_the_watch_is_judged_at_once() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("go", 10));
        let (a, _) = elector(&fake, config("a"));
        let mut acquire = pin!(a.acquire());
        assert!(
            timeout(MS(500), &mut acquire).await.is_err(),
            "go holds the lease"
        );
        let renewed = Instant::now();
        let mut lease = fake.lease().expect("the lease");
        let go = lease.spec.as_mut().expect("a record");
        go.lease_duration_seconds = Some(1);
        go.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        fake.put(lease);
        let _guard = timeout(S(10), acquire).await.expect("a leads").expect("a leads");
        let took = renewed.elapsed();
        assert!(
            took >= S(1) && took < MS(1400),
            "a took the Lease {took:?} after go's renewal for 1 s"
        );
    });
}

/// A candidate that tries to lead for 5 s each minute (an `acquire` under a
/// timeout, as a periodic job would), four times at most, with `pause`
/// (given the attempt) after each attempt that did not lead: the attempt
/// that led.
async fn attempt_each_minute(e: &crate::LeaderElector, mut pause: impl AsyncFnMut(usize)) -> Option<usize> {
    for attempt in 0..4 {
        if let Ok(guard) = timeout(S(5), e.acquire()).await {
            assert!(guard.expect("leads").is_valid());
            return Some(attempt);
        }
        pause(attempt).await;
    }
    None
}

/// client-go's `TestTryAcquireOrRenew`, "acquire from led, unacked object":
/// a candidate that has seen a record unchanged for its lease duration takes
/// it, however many attempts that took (`observedTime` is kept while the
/// record read is the same). Here a candidate that tries to lead for 5 s
/// each minute (an `acquire` under a timeout, as a periodic job would) keeps
/// what its last campaign saw: a dead holder's record, unchanged since, is
/// taken at the next attempt; a record that changed meanwhile is judged
/// from the read that shows the change, and taken at the attempt after.
#[test]
fn an_acquire_called_again_later_keeps_the_clock_of_a_record_unchanged_since() {
    paused(async {
        for (watch, renewed_in_the_pause) in [(true, false), (false, false), (true, true), (false, true)] {
            let fake = FakeLeaseApi::default();
            fake.put(held_by("dead", 15));
            let (e, _) = elector(&fake, config("me").watch(watch));
            let led = attempt_each_minute(&e, async |attempt| {
                sleep(S(25)).await;
                if renewed_in_the_pause && attempt == 0 {
                    let mut lease = fake.lease().expect("the lease");
                    lease.spec.as_mut().expect("a record").renew_time =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                            k8s_openapi::jiff::Timestamp::now(),
                        ));
                    fake.put(lease);
                }
                sleep(S(30)).await;
            })
            .await;
            let expected = if renewed_in_the_pause { 2 } else { 1 };
            assert_eq!(
                led,
                Some(expected),
                "watch {watch}, renewed in the pause {renewed_in_the_pause}: the attempt (5 s each minute) that \
                 took the dead holder's record (lease duration 15 s; holder {:?})",
                holder(&fake)
            );
        }
    });
}

/// The same periodic candidate, each attempt's election task dropped as
/// its runtime shuts down (a runtime per run of the job, the elector kept
/// across runs): the next task starts from what the dropped one saw, as
/// after a task that ended, so a dead holder's record unchanged since is
/// taken at the next attempt (`Drop for Task` handed the memory back
/// without the view: every attempt judged the record from its own read,
/// and nobody led).
#[test]
fn an_acquire_after_its_last_task_was_dropped_keeps_the_clock_of_a_record_unchanged_since() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("dead", 15));
        let (e, _) = elector(&fake, config("me"));
        let led = attempt_each_minute(&e, async |_| {
            // The runtime shuts down while the task lingers.
            e.abort_task_for_test();
            sleep(MS(1)).await;
            assert!(!e.tasks_for_test().0, "the task was dropped");
            sleep(S(55)).await;
        })
        .await;
        assert_eq!(
            led,
            Some(1),
            "the attempt (5 s each minute, each task dropped) that took the dead holder's record (lease \
             duration 15 s; holder {:?})",
            holder(&fake)
        );
    });
}

/// Rule 0 across election tasks: a record another candidate's last task saw
/// is written again exactly while no task of it runs (a manifest that pins
/// the election applied again, a backup restored onto the object: the same
/// object, a new resourceVersion) over a leader's term. The next `acquire`
/// judges it from that read, not from the first sight of its twin: taking
/// it at once would lead beside the leader, which learns of the write only
/// at its next renewal. (Within a task, an unchanged record under a new
/// resourceVersion is a metadata edit and keeps its clock; across the gap
/// only the object untouched since does.)
#[test]
fn a_record_written_again_exactly_while_no_task_ran_is_waited_out() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("pinned", 15));
        let pinned = fake.lease().expect("the lease").spec;
        let (me, _) = elector(&fake, config("me"));
        assert!(timeout(S(5), me.acquire()).await.is_err(), "led on a held record");
        sleep(S(30)).await;
        let (b, _) = elector(&fake, config("b").watch(false));
        let b_guard = timeout(S(30), b.acquire()).await.expect("b leads").unwrap();
        sleep(S(5)).await;
        let mut lease = fake.lease().expect("the lease");
        lease.spec.clone_from(&pinned);
        fake.put(lease);
        let led = timeout(S(5), me.acquire()).await;
        assert!(
            led.is_err(),
            "me took at once a record just written again (lease duration 15 s), its twin seen first 55 s \
             before; b's guard still valid: {}",
            b_guard.is_valid()
        );
    });
}
