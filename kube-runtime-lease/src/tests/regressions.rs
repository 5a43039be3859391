//! Regression tests for the schedules that broke "exactly one leader, never
//! none". Each test failed on the code before its fix; all run in the unit
//! suite, on the in-memory Lease API double with paused time, except where a
//! doc comment says otherwise. The numbered sections are the behaviours
//! guarded.
//! <!-- upstream: omit -->
//! `docs/regressions.md` lists them by these numbers.
//! <!-- upstream: end -->

use std::{
    pin::{Pin, pin},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::Poll,
    time::Duration,
};

use futures::{FutureExt, StreamExt, poll, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use tokio::time::{Instant, advance, sleep, timeout};

use crate::{
    Acquire, AcquireError, ConfigError, LeaderElectionStreamExt, LeaderElector, LeaseConfig, Lost,
    elector::test_hooks::Point,
    term::Term,
    test_util::{FakeLeaseApi, Fault},
    tests::{
        never_none::first_to_lead,
        runtime::paused_runtime,
        support::{config, count, elector, free, held_by, holder, paused, spec, taken_by},
    },
};

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

// ---- 1. The creation hold ---------------------------------------------------

/// The creation hold's opening: a candidate `a` campaigns while `go` holds
/// a 40 s record, sees it, and then the record is deleted. The elector, its
/// client, its pending `acquire` and the instant of the deletion.
async fn a_saw_go_then_deleted(fake: &FakeLeaseApi) -> (LeaderElector, usize, Pin<Box<Acquire>>, Instant) {
    fake.put(held_by("go", 40));
    let (a, id) = elector(fake, config("a"));
    let mut acquire = Box::pin(a.acquire());
    let seen = timeout(S(1), &mut acquire).await;
    assert!(seen.is_err(), "a saw go's record");
    fake.delete();
    (a, id, acquire, Instant::now())
}

/// 1: a `shutdown` during the creation hold finds no guard (the hold has
/// none); it must not write the Lease free, or another candidate leads while
/// the deleted Lease's last holder may still lead.
#[test]
fn a_shutdown_during_the_creation_hold_does_not_free_the_lease() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = elector(&fake, config("a"));
        let (b, _) = elector(&fake, config("b"));
        let created = Instant::now();
        let mut acquire = pin!(a.acquire());
        assert!(timeout(S(1), &mut acquire).await.is_err());
        assert_eq!(holder(&fake).as_deref(), Some("a"), "created, now holding");
        let (shutdown, acquired) = tokio::join!(a.shutdown(S(5)), acquire);
        shutdown.unwrap();
        assert!(matches!(acquired, Err(AcquireError::Shutdown)));
        assert_eq!(
            holder(&fake).as_deref(),
            Some("a"),
            "never written free during the hold"
        );
        let _b = b.acquire().await.unwrap();
        assert!(
            created.elapsed() >= S(15),
            "b led {:?} after the Lease was re-created",
            created.elapsed()
        );
    });
}

/// 1: the only `acquire` dropped during the hold (a `timeout(acquire)`).
#[test]
fn dropping_the_only_acquire_during_the_creation_hold_does_not_free_the_lease() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = elector(&fake, config("a"));
        let created = Instant::now();
        assert!(timeout(S(1), a.acquire()).await.is_err());
        sleep(MS(10)).await;
        assert_eq!(holder(&fake).as_deref(), Some("a"));
        let (b, _) = elector(&fake, config("b"));
        let _b = b.acquire().await.unwrap();
        assert!(
            created.elapsed() >= S(15),
            "b led {:?} after the Lease was re-created",
            created.elapsed()
        );
    });
}

/// 1: a later campaign (the same task lingering, or a new one) finds the
/// record it wrote during the hold and must not begin a term before the hold
/// ends.
#[test]
fn campaigning_again_during_the_creation_hold_does_not_skip_it() {
    paused(async {
        for pause in [S(1), S(5)] {
            let fake = FakeLeaseApi::default();
            let (a, _) = elector(&fake, config("a").release_on_drop(false));
            let created = Instant::now();
            assert!(timeout(S(1), a.acquire()).await.is_err());
            sleep(pause).await;
            let guard = a.acquire().await.unwrap();
            assert!(
                created.elapsed() >= S(15),
                "after a pause of {pause:?}: led {:?} after creating the Lease",
                created.elapsed()
            );
            assert!(guard.is_valid());
        }
    });
}

/// 1: the hold lasts the longest lease duration seen on the deleted record
/// (here a 40 s client-go lease), and what is written during the hold says so,
/// so that a candidate that never saw the deleted record waits as long.
#[test]
fn the_creation_hold_lasts_the_deleted_records_lease_duration() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (_a, _, acquire, deleted) = a_saw_go_then_deleted(&fake).await;
        sleep(MS(10)).await;
        assert_eq!(holder(&fake).as_deref(), Some("a"), "re-created");
        assert_eq!(spec(&fake).lease_duration_seconds, Some(40));
        // A candidate that never saw the deleted record.
        let (b, _) = elector(&fake, config("b"));
        let mut b_acquire = pin!(b.acquire());
        assert!(poll!(&mut b_acquire).is_pending());
        let guard = acquire.await.unwrap();
        assert!(
            deleted.elapsed() >= S(40),
            "led {:?} after the deletion of a 40 s lease",
            deleted.elapsed()
        );
        drop(guard);
        let _b = b_acquire.await.unwrap();
        assert!(deleted.elapsed() >= S(40));
    });
}

/// 1: an edit that shortens the duration of the holder's record (the same
/// write: its `renewTime` unchanged) does not shorten the hold after a
/// deletion: until its holder writes again, it may go by either duration.
#[test]
fn an_edit_shortening_the_deleted_records_duration_does_not_shorten_the_hold() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let mut go = held_by("go", 40);
        let written = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap();
        go.spec.as_mut().unwrap().renew_time = Some(MicroTime(written));
        fake.put(go);
        let (a, _) = elector(&fake, config("a"));
        let mut acquire = pin!(a.acquire());
        assert!(timeout(S(1), &mut acquire).await.is_err(), "a saw go's record");
        let mut edited = fake.lease().unwrap();
        edited.spec.as_mut().unwrap().lease_duration_seconds = Some(15);
        fake.put(edited);
        sleep(MS(10)).await;
        fake.delete();
        let deleted = Instant::now();
        let guard = timeout(S(120), acquire).await.expect("a leads").unwrap();
        assert!(
            deleted.elapsed() >= S(40),
            "led {:?} after the deletion of a record that said 40 s before an edit",
            deleted.elapsed()
        );
        assert!(guard.is_valid());
    });
}

/// 1 (found with random fault schedules): the end of the hold is confirmed with a
/// read before any guard is handed out; a read that fails keeps the hold on
/// for another retry period instead of leading unconfirmed.
#[test]
fn a_failed_read_at_the_end_of_the_creation_hold_keeps_holding() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, id) = elector(&fake, config("a"));
        let start = Instant::now();
        let mut acquire = pin!(a.acquire());
        assert!(timeout(S(1), &mut acquire).await.is_err());
        fake.fault(id, Some("get"), Fault::Status(503));
        let guard = acquire.await.unwrap();
        assert_eq!(start.elapsed(), S(17), "the hold (15 s), then one retry period");
        assert!(guard.is_valid());
    });
}

/// 1: the creation hold on a Lease object that replaced a held one and is
/// *taken over* (created by someone else, here left free at once, as a
/// client-go candidate that re-created it and then released it would),
/// rather than created by us: the write that takes it carries a
/// `leaseDurationSeconds` covering the rest of the hold (the deleted
/// record's 40 s), as every write of the hold does, so that a candidate that
/// never saw the deleted record waits as long, even if we are cut off before
/// our first renewal. (Before: the takeover wrote the configured 15 s, and
/// `c` led about 19 s after the deletion, while the deleted record's holder
/// `go` might still lead.)
#[test]
fn a_takeover_during_the_creation_hold_writes_a_duration_covering_the_hold() {
    paused(async {
        let fake = FakeLeaseApi::default();
        // The object is deleted, and a new one (a new uid) appears at once, free.
        let (_a, a_id, _a_acquire, deleted) = a_saw_go_then_deleted(&fake).await;
        let mut free = held_by("", 1);
        free.spec.as_mut().unwrap().lease_transitions = Some(0);
        fake.put(free);
        // a takes the new object over (after one lost race: its watch showed
        // the deletion first, its create met the new object).
        while holder(&fake).as_deref() != Some("a") {
            assert!(deleted.elapsed() < S(10), "a did not take the new object over");
            sleep(MS(10)).await;
        }
        let written = spec(&fake).lease_duration_seconds.unwrap_or_default();
        let left = S(40).saturating_sub(deleted.elapsed()).as_secs();
        // a is cut off before its first renewal (a pause, a partition).
        fake.partition(a_id, true);
        let (c, _) = elector(&fake, config("c"));
        let c_led = timeout(S(60), c.acquire()).await.expect("c leads").unwrap();
        assert!(c_led.is_valid());
        assert!(
            u64::try_from(written).unwrap_or_default() >= left && deleted.elapsed() >= S(40),
            "the takeover during the hold wrote leaseDurationSeconds {written} ({left} s of the hold were left), and c (which never saw the \
             deleted 40 s record) led {:?} after the deletion",
            deleted.elapsed()
        );
    });
}

/// 1: the same rule on the other path into a held term: a candidate that
/// created the Lease after a 40 s record was deleted holds it, writing
/// `leaseDurationSeconds` 40; its `acquire` is dropped during the hold (no
/// release: the hold is never written free) and a new one campaigns again.
/// The record is its own term's, taken back at once, and the write that
/// takes it covers the rest of the hold. (Before: it carried the configured
/// 15 s, so a candidate that never saw the deleted record waited 15 s only.)
#[test]
fn campaigning_again_during_the_creation_hold_writes_a_duration_covering_the_hold() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _, acquire, deleted) = a_saw_go_then_deleted(&fake).await;
        sleep(MS(10)).await;
        assert_eq!(holder(&fake).as_deref(), Some("a"), "re-created");
        assert_eq!(spec(&fake).lease_duration_seconds, Some(40));
        let acquired_at = spec(&fake).acquire_time;
        // Given up during the hold (no release), then wanted again.
        drop(acquire);
        sleep(MS(500)).await;
        let mut again = pin!(a.acquire());
        while spec(&fake).acquire_time == acquired_at {
            assert!(
                timeout(MS(10), &mut again).await.is_err(),
                "a does not lead during the hold"
            );
            assert!(
                deleted.elapsed() < S(10),
                "a did not campaign again: {:?}",
                fake.requests()
                    .iter()
                    .map(|r| (r.at - deleted, r.verb))
                    .collect::<Vec<_>>()
            );
        }
        let written = spec(&fake).lease_duration_seconds.unwrap_or_default();
        let left = S(40).saturating_sub(deleted.elapsed()).as_secs();
        assert!(
            u64::try_from(written).unwrap_or_default() >= left,
            "a took its own record back during the hold with leaseDurationSeconds {written}; {left} s of the \
             hold were left"
        );
    });
}

/// 1: a remembered creation hold holds only while it lasts, and only its own
/// object: a term begun on the Lease we created, once its hold is over,
/// begins with the write that takes it, with no hold and no confirming read.
/// (Liveness: a hold taken into account after it ended, or for another
/// object, would delay every later term.)
#[test]
fn a_term_after_the_creation_hold_is_over_begins_without_a_hold() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, id) = elector(&fake, config("a"));
        let created = Instant::now();
        drop(a.acquire().await.unwrap());
        assert!(created.elapsed() >= S(15), "the first term began after the hold");
        sleep(S(60)).await;
        assert_eq!(holder(&fake).as_deref(), Some(""), "released");
        // Requests are stamped with paused time, which stands still here.
        let start = Instant::now() - MS(1);
        let guard = timeout(S(1), a.acquire())
            .await
            .expect("leads at once: the hold is long over")
            .unwrap();
        let verbs = verbs_after(&fake, id, start);
        assert!(
            !held_after_write(&verbs),
            "a read after the write that took the lease (the term was held): {verbs:?}"
        );
        assert!(guard.is_valid());
    });
}

/// The verbs `client` sent after `since`, in order (paused time may stand
/// still between them).
fn verbs_after(fake: &FakeLeaseApi, client: usize, since: Instant) -> Vec<&'static str> {
    fake.requests()
        .iter()
        .filter(|r| r.client == client && r.at > since)
        .map(|r| r.verb)
        .collect()
}

/// Whether a read followed the first write in `verbs`: the term that write
/// began was held (a hold ends with a confirming read).
fn held_after_write(verbs: &[&str]) -> bool {
    verbs
        .iter()
        .position(|v| *v == "update")
        .is_some_and(|w| verbs[w..].contains(&"get"))
}

/// 1: a remembered hold is over at its last instant: a term that begins on
/// our own record exactly when the hold of its object ends is not held.
#[test]
fn a_term_begun_the_instant_the_remembered_hold_ends_is_not_held() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, id) = elector(&fake, config("a").release_on_drop(false));
        let created = Instant::now();
        // Created, held until `created` + 15 s; given up during the hold.
        assert!(timeout(S(1), a.acquire()).await.is_err());
        tokio::time::sleep_until(created + S(15)).await;
        let guard = timeout(S(1), a.acquire())
            .await
            .expect("took its own record back")
            .unwrap();
        let verbs = verbs_after(&fake, id, created + S(15) - MS(1));
        assert!(!held_after_write(&verbs), "held at the hold's end: {verbs:?}");
        assert!(guard.is_valid());
    });
}

/// 1: the risk a replaced object leaves is over at its last instant: the
/// record of the object that replaced it, expiring exactly then, is taken
/// and led at once.
#[test]
fn a_takeover_the_instant_the_replaced_objects_risk_ends_is_not_held() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("go", 15));
        let (a, id) = elector(&fake, config("a"));
        let mut acquire = pin!(a.acquire());
        assert!(timeout(S(1), &mut acquire).await.is_err(), "a saw go's record");
        // A new object (a new uid) replaces it, held by another candidate
        // for as long: its holder may lead until it expires, and so may go.
        fake.delete();
        fake.put(held_by("go2", 15));
        let replaced = Instant::now();
        let guard = timeout(S(30), &mut acquire).await.expect("a leads").unwrap();
        assert_eq!(replaced.elapsed(), S(15), "taken when go2's record expired");
        let verbs = verbs_after(&fake, id, replaced);
        assert!(!held_after_write(&verbs), "held after the risk ended: {verbs:?}");
        assert!(guard.is_valid());
    });
}

/// A `leaseDurationSeconds` of `i32::MAX` written on the leader's record by
/// someone else (`kubectl edit`), then overwritten by the leader's next
/// renewal, and later the Lease deleted: the creation hold lasts the
/// deleted record's lease duration (what its last holder may still lead
/// for), not the longest duration ever seen on the object. (Before: every
/// candidate that had seen the edit held the re-created Lease for 68 years,
/// writing `leaseDurationSeconds: 2147483647`, so that nobody led it.)
#[test]
fn a_huge_lease_duration_edited_in_and_renewed_over_does_not_make_the_creation_hold_huge() {
    paused(async {
        let fake = free();
        let (a, _) = elector(&fake, config("a"));
        let (b, _) = elector(&fake, config("b"));
        let a_guard = timeout(S(5), a.acquire()).await.expect("a leads").unwrap();
        let mut b_acquire = pin!(b.acquire());
        assert!(timeout(S(1), &mut b_acquire).await.is_err(), "b waits");
        let mut lease = fake.lease().unwrap();
        lease.spec.as_mut().unwrap().lease_duration_seconds = Some(i32::MAX);
        fake.put(lease);
        // a's next renewals write its own 15 s again.
        sleep(S(5)).await;
        assert_eq!(spec(&fake).lease_duration_seconds, Some(15));
        assert!(a_guard.is_valid());
        fake.delete();
        let deleted = Instant::now();
        assert_eq!(
            timeout(S(5), a_guard).await.expect("a's term ended"),
            Lost::Deleted
        );
        let led = first_to_lead(pin!(a.acquire()), b_acquire.as_mut(), S(60)).await;
        assert!(
            matches!(led, Some(Ok(_))),
            "nobody led the re-created Lease within 60 s of the deletion of a 15 s record (written: {:?})",
            fake.lease()
                .and_then(|l| l.spec)
                .and_then(|s| s.lease_duration_seconds)
        );
        assert!(
            deleted.elapsed() >= S(15),
            "led {:?} after the deletion",
            deleted.elapsed()
        );
    });
}

/// Clock offsets between nodes, next to client-go: the Lease was last held by
/// a client-go candidate `go` with a 60 s lease duration whose node's clock
/// runs an hour ahead (its `renewTime`s are an hour ahead); it crashed, and
/// `a` or `b` (15 s) took the record once it expired, and renewed it since.
/// The Lease is then deleted: its last holder's record says 15 s, so
/// the re-created Lease is led about 15 s later. Whether a record is a newer
/// write of its holder must not be told by comparing `renewTime`s written by
/// different nodes' clocks. (Before: `a`'s renewals, an hour "older" than
/// go's last, counted as edits of go's write, and the hold lasted go's 60 s.)
#[test]
fn a_clock_ahead_on_an_earlier_holders_node_does_not_lengthen_the_creation_hold() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let mut lease = held_by("go", 60);
        let ahead = k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_hours(1);
        let spec_ = lease.spec.as_mut().unwrap();
        spec_.acquire_time = Some(MicroTime(ahead));
        spec_.renew_time = Some(MicroTime(ahead));
        fake.put(lease);
        let (a, _) = elector(&fake, config("a"));
        let (b, _) = elector(&fake, config("b"));
        let mut a_acquire = pin!(a.acquire());
        let mut b_acquire = pin!(b.acquire());
        // Whichever takes go's record once it expired is the leader `l`; the
        // other keeps campaigning.
        let (a_led, l_guard) = timeout(S(70), async {
            tokio::select! {
                g = &mut a_acquire => (true, g.unwrap()),
                g = &mut b_acquire => (false, g.unwrap()),
            }
        })
        .await
        .expect("someone takes go's record once it expired");
        sleep(S(10)).await;
        assert_eq!(spec(&fake).lease_duration_seconds, Some(15));
        assert!(l_guard.is_valid());
        fake.delete();
        let deleted = Instant::now();
        assert_eq!(
            timeout(S(5), l_guard).await.expect("the leader's term ended"),
            Lost::Deleted
        );
        let (l, mut other) = if a_led { (&a, b_acquire) } else { (&b, a_acquire) };
        let mut l_again = pin!(l.acquire());
        let led = timeout(S(120), async {
            tokio::select! {
                g = &mut l_again => g.map(|_| "the old leader"),
                g = &mut other => g.map(|_| "the other"),
            }
        })
        .await
        .expect("nobody led the re-created Lease in 120 s")
        .unwrap();
        let after = deleted.elapsed();
        let bound = S(15) + MS(4_400) + S(1);
        assert!(
            after <= bound,
            "{led} led the re-created Lease {after:?} after the deletion of a 15 s record (bound {bound:?}; \
             written leaseDurationSeconds {:?}): the hold counted go's 60 s, an hour-ahead clock's write",
            fake.lease()
                .and_then(|l| l.spec)
                .and_then(|s| s.lease_duration_seconds)
        );
    });
}

// ---- 2. One identity, two processes -----------------------------------------

/// 2: two processes with one identity; the leader stops (here: partitioned,
/// as a paused process is) past the lease duration, the other takes over; the
/// first comes back and campaigns: the record names its identity, but it is
/// the other's write, so it waits like anyone else.
#[test]
fn two_processes_with_one_identity_never_both_lead() {
    paused(async {
        let fake = free();
        let (a, a_id) = elector(&fake, config("x"));
        let (b, _) = elector(&fake, config("x"));
        let a_guard = a.acquire().await.unwrap();
        fake.partition(a_id, true);
        let b_guard = timeout(S(60), b.acquire())
            .await
            .expect("b takes the record once it expired")
            .unwrap();
        assert!(!a_guard.is_valid(), "a's term ended at its renew deadline");
        assert!(
            b_guard.fencing_token() > a_guard.fencing_token(),
            "8: a takeover by another process with the same identity is a new term"
        );
        drop(a_guard);
        fake.partition(a_id, false);
        let mut again = pin!(a.acquire());
        assert!(
            timeout(S(60), &mut again).await.is_err(),
            "a must not lead while b renews"
        );
        assert!(b_guard.is_valid());
        assert!(b.is_leader() && !a.is_leader());
    });
}

/// 2: two processes with one identity, the second one client-go's: a
/// client-go candidate whose identity is the holder's treats the record as
/// its own (`IsLeader()`: the observed holder is its identity) and renews
/// it, keeping `acquireTime` and `leaseTransitions`, so that its writes
/// carry our term's `TermId`. A record of our term is ours only if we
/// renewed it last (`Memory::is_last_term`: the `renewTime` we wrote, or
/// one of a renewal sent since): this one ends our term. (Before: our
/// renewals met a conflict, re-read "our" term and renewed on top of it, and
/// both led for ever.)
#[test]
fn a_client_go_process_with_our_identity_renewing_our_record_ends_our_term() {
    paused(async {
        let fake = free();
        let (a, _) = elector(&fake, config("x"));
        let guard = a.acquire().await.unwrap();
        let started = Instant::now();
        // client-go's candidate "x": every retry period, a renewal of the
        // record it reads, with its own renewTime.
        let go = client_go_renewing(&fake, "x", MS(1300));
        let ended = timeout(S(60), guard).await;
        assert!(
            ended.is_ok(),
            "our term still holds {:?} after a client-go process with our identity began renewing our \
             record: both lead",
            started.elapsed()
        );
        // Nor does it lead again while the other renews: the record is no
        // longer its own term's, and is waited out like anyone else's.
        let again = timeout(S(30), a.acquire()).await;
        go.abort();
        assert!(
            again.is_err(),
            "led again while the other process renewed the record"
        );
    });
}

/// client-go's candidate with identity `identity`: every `every`, a renewal
/// of the record it reads while the record names it (`IsLeader()`), keeping
/// `acquireTime` and `leaseTransitions`, with its own `renewTime`.
fn client_go_renewing(
    fake: &FakeLeaseApi,
    identity: &'static str,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let fake = fake.clone();
    tokio::spawn(async move {
        loop {
            sleep(every).await;
            if fake
                .lease()
                .is_some_and(|l| l.spec.and_then(|s| s.holder_identity).as_deref() == Some(identity))
            {
                renew_as_another_process(&fake);
            }
        }
    })
}

/// One renewal of the record on `fake` by another process (its own
/// `renewTime`, an hour ahead, everything else kept, as client-go's
/// renewal of a record naming its identity keeps `acquireTime` and
/// `leaseTransitions`): the `renewTime` written.
fn renew_as_another_process(fake: &FakeLeaseApi) -> MicroTime {
    let mut lease = fake.lease().expect("a Lease to renew");
    let renewed = MicroTime(
        k8s_openapi::jiff::Timestamp::now()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(3600))
            .unwrap(),
    );
    lease.spec.as_mut().unwrap().renew_time = Some(renewed.clone());
    fake.put(lease);
    renewed
}

/// Our term ends (the leader is cut off from the API server past its renew
/// deadline) while a client-go process with our identity renews our term's
/// record as its own (it keeps our `acquireTime` and `leaseTransitions`).
/// Once the cut heals, the record is not ours: we did not renew it last, and
/// the other process leads on it. It must be waited out like anyone else's,
/// not taken back at once. (Before: the elector's memory of its last term
/// compared only the `TermId`, so the campaign took the record back at once
/// as its own: both led.)
#[test]
fn our_record_renewed_by_another_process_after_our_term_ended_is_not_taken_back_at_once() {
    paused(async {
        let fake = free();
        let (a, a_id) = elector(&fake, config("x"));
        let guard = a.acquire().await.unwrap();
        fake.partition(a_id, true);
        let go = client_go_renewing(&fake, "x", MS(1300));
        assert_eq!(
            timeout(S(15), guard)
                .await
                .expect("the term outlived its renew deadline"),
            Lost::RenewDeadlineExceeded
        );
        fake.partition(a_id, false);
        let healed = Instant::now();
        let mut again = pin!(a.acquire());
        let led = timeout(S(30), &mut again).await;
        go.abort();
        assert!(
            led.is_err(),
            "led again {:?} after the cut healed, while another process with our identity renewed the record",
            healed.elapsed()
        );
    });
}

/// A release reads the Lease first, and writes it free only if it still
/// holds our term's record as we wrote it last: renewed since by another
/// process with our identity (client-go's candidate renewing it as its own,
/// unseen yet without a watch), the record is that process's, and is left
/// alone. (Before: the release compared only the `TermId`, and wrote free a
/// record another process was renewing, so that a third candidate could
/// lead beside it.)
#[test]
fn a_release_leaves_alone_our_record_renewed_by_another_process() {
    paused(async {
        let fake = free();
        let (a, _) = elector(&fake, config("x").watch(false));
        let guard = a.acquire().await.unwrap();
        // client-go's candidate "x" renews the record as its own.
        let renewed = renew_as_another_process(&fake);
        drop(guard);
        sleep(S(1)).await;
        let after = spec(&fake);
        assert_eq!(
            (after.holder_identity.as_deref(), after.renew_time),
            (Some("x"), Some(renewed)),
            "our release wrote free a record another process with our identity renews"
        );
    });
}

/// 2: a leader about to release (its last guard dropped, or a shutdown)
/// whose record was just renewed by a client-go process with its identity
/// (which keeps `acquireTime` and `leaseTransitions`) must not write it
/// free: that process leads on it now, and a third candidate would lead at
/// once beside it. The release checks the record as the term does (renewed
/// last by us), not only the term's `TermId`.
#[test]
fn a_record_renewed_by_another_process_with_our_identity_is_not_released() {
    for shutdown in [false, true] {
        paused(async move {
            let fake = free();
            let (a, _) = elector(&fake, config("x"));
            let guard = a.acquire().await.unwrap();
            sleep(S(1)).await;
            // client-go's candidate "x" renews the record naming it.
            let renewed = renew_as_another_process(&fake);
            drop(guard);
            if shutdown {
                a.shutdown(S(1)).await.unwrap();
            }
            sleep(S(1)).await;
            assert_eq!(
                spec(&fake).renew_time,
                Some(renewed),
                "shutdown {shutdown}: the record another process with our identity renewed last was \
                 written over (holder {:?})",
                holder(&fake)
            );
        });
    }
}

/// 2: a record on our last term's object that names our identity with no
/// `renewTime`, written after another candidate took the Lease over (an
/// edit by a third party), is not our own write: a campaign waits it out
/// instead of taking it at once while the other's term may still hold. (A
/// record with no `renewTime` is ours only while our own term holds, when
/// nobody else can have taken the Lease in between.)
#[test]
fn a_record_naming_us_with_no_renew_time_after_a_takeover_is_waited_out() {
    paused(async {
        let fake = free();
        let (a, a_id) = elector(&fake, config("a"));
        let (b, _) = elector(&fake, config("b"));
        let a_guard = a.acquire().await.unwrap();
        fake.partition(a_id, true);
        let _b_guard = timeout(S(60), b.acquire()).await.expect("b took over").unwrap();
        drop(a_guard);
        fake.partition(a_id, false);
        let mut again = pin!(a.acquire());
        assert!(timeout(S(3), &mut again).await.is_err(), "b leads");
        let mut lease = fake.lease().unwrap();
        let spec = lease.spec.as_mut().unwrap();
        spec.holder_identity = Some("a".into());
        spec.renew_time = None;
        fake.put(lease);
        let edited = Instant::now();
        assert!(
            timeout(S(10), &mut again).await.is_err(),
            "a took the edited record {:?} after the edit, as its own",
            edited.elapsed()
        );
    });
}

// ---- 3. Release only after the guarded work ended ---------------------------

/// 3: `shutdown`'s grace runs out with guarded work in flight; the work is
/// stopped (here: it ends when its guard does, as a guarded stream is
/// dropped), and requests it had sent may still land: the Lease is not written
/// free, and a standby leads no earlier than lease duration − renew deadline
/// after the term ended.
#[test]
fn work_stopped_by_shutdown_is_not_followed_by_an_immediate_release() {
    paused(async {
        let fake = free();
        let (a, _) = elector(&fake, config("a"));
        let guard = a.acquire().await.unwrap();
        let work = tokio::spawn(guard);
        let (b, _) = elector(&fake, config("b"));
        let mut b_acquire = pin!(b.acquire());
        assert!(timeout(S(1), &mut b_acquire).await.is_err());
        a.shutdown(S(2)).await.unwrap();
        let ended = Instant::now();
        assert_eq!(work.await.unwrap(), Lost::Shutdown);
        sleep(MS(10)).await;
        assert_eq!(holder(&fake).as_deref(), Some("a"), "not written free");
        let _b = b_acquire.await.unwrap();
        assert!(
            ended.elapsed() >= S(5),
            "b led {:?} after a's work was stopped",
            ended.elapsed()
        );
    });
}

/// 3: the same for a step-down (a `preferredHolder` set during the term).
#[test]
fn a_step_down_with_work_in_flight_lets_the_lease_expire() {
    paused(async {
        let fake = free();
        let (a, _) = elector(&fake, config("a"));
        let guard = a.acquire().await.unwrap();
        let work = tokio::spawn(guard);
        let (p, _) = elector(&fake, config("p"));
        let mut p_acquire = pin!(p.acquire());
        assert!(timeout(S(1), &mut p_acquire).await.is_err());
        let mut lease = fake.lease().unwrap();
        lease.spec.as_mut().unwrap().preferred_holder = Some("p".into());
        // The API server accepts a preferred holder only with a strategy.
        lease.spec.as_mut().unwrap().strategy = Some("OldestEmulationVersion".into());
        fake.put(lease);
        let lost = timeout(S(3), work).await.expect("a steps down").unwrap();
        let ended = Instant::now();
        assert!(matches!(lost, Lost::SteppedDown { .. }), "{lost:?}");
        sleep(MS(10)).await;
        assert_eq!(holder(&fake).as_deref(), Some("a"), "not written free");
        let _p = timeout(S(20), p_acquire)
            .await
            .expect("the preferred holder leads once a's record expired")
            .unwrap();
        assert!(ended.elapsed() >= S(5), "p led {:?} after", ended.elapsed());
    });
}

/// 3: guarded work dropped by its owner before it finished (a guarded
/// Controller stream dropped in a `select!` on a signal, its reconciles
/// aborted at their next `.await`; a `with_lease` future dropped; the inner
/// stream taken out with `into_inner`; `TermTasks` dropped) was
/// stopped, not finished: requests it sent may still land, so the Lease is
/// left to expire, not released. (Before: dropping it dropped the last
/// guard while the term held, which counted as work that ended, and the
/// Lease was released at once: `b` led within milliseconds.)
#[test]
fn guarded_work_dropped_before_it_finished_lets_the_lease_expire() {
    paused(async {
        for how in ["stream", "with_lease", "into_inner", "term_tasks"] {
            let fake = free();
            let (a, _) = elector(&fake, config("a"));
            let (b, _) = elector(&fake, config("b"));
            let mut b_acquire = pin!(b.acquire());
            match how {
                "stream" => {
                    let mut guarded = Box::pin(stream::pending::<()>().with_leader_election(&a));
                    assert!(timeout(S(1), guarded.next()).await.is_err(), "{how}: a leads");
                    assert!(guarded.is_leading(), "{how}");
                    drop(guarded);
                }
                "into_inner" => {
                    let mut guarded = stream::pending::<()>().with_leader_election(&a);
                    assert!(timeout(S(1), guarded.next()).await.is_err(), "{how}: a leads");
                    assert!(guarded.is_leading(), "{how}");
                    let inner = guarded.into_inner();
                    assert!(inner.is_some(), "{how}: the inner stream goes on");
                }
                "term_tasks" => {
                    let guard = a.acquire().await.unwrap();
                    let mut tasks = guard.tasks::<()>();
                    tasks.spawn(futures::future::pending()).unwrap();
                    drop(guard);
                    sleep(MS(10)).await;
                    assert!(a.is_leader(), "{how}: the task's guard keeps the term");
                    // Dropping the set aborts its tasks.
                    drop(tasks);
                }
                _ => {
                    let work = a.with_lease(futures::future::pending::<()>());
                    assert!(timeout(S(1), work).await.is_err(), "{how}: dropped mid-work");
                }
            }
            let dropped = Instant::now();
            assert!(
                timeout(S(1), &mut b_acquire).await.is_err(),
                "{how}: b led {:?} after a's work was dropped unfinished (the Lease was released)",
                dropped.elapsed()
            );
            assert_eq!(holder(&fake).as_deref(), Some("a"), "{how}: not written free");
            let _b = timeout(S(30), &mut b_acquire)
                .await
                .expect("b leads once a's record expired")
                .unwrap();
            assert!(
                dropped.elapsed() >= S(15),
                "{how}: b led {:?} after",
                dropped.elapsed()
            );
            a.shutdown(S(1)).await.unwrap();
        }
    });
}

/// 3: the counterpart: guarded work that ended on its own (the inner stream
/// ended, the `with_lease` future completed) is released at once, so that a
/// standby leads within one event and one write.
#[test]
fn guarded_work_that_ended_is_released_at_once() {
    paused(async {
        for how in ["stream", "with_lease"] {
            let fake = free();
            let (a, _) = elector(&fake, config("a"));
            let (b, _) = elector(&fake, config("b"));
            let (done, finish) = futures::channel::oneshot::channel::<u8>();
            let mut work: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> = if how == "stream" {
                let guarded = stream::once(finish).with_leader_election(&a);
                Box::pin(async move {
                    let items: Vec<_> = guarded.collect().await;
                    assert_eq!(items, [Ok(7)], "stream");
                })
            } else {
                let a = a.clone();
                Box::pin(async move {
                    assert_eq!(a.with_lease(finish).await, Ok(Ok(7)), "with_lease");
                })
            };
            assert!(
                timeout(S(1), &mut work).await.is_err(),
                "{how}: a leads, its work runs"
            );
            assert!(a.is_leader(), "{how}");
            let mut b_acquire = pin!(b.acquire());
            assert!(timeout(S(1), &mut b_acquire).await.is_err(), "{how}: b waits");
            done.send(7).unwrap();
            timeout(S(1), work).await.expect("the work ends");
            let ended = Instant::now();
            let _b = timeout(S(1), &mut b_acquire)
                .await
                .expect("b leads at once")
                .unwrap();
            assert!(ended.elapsed() < S(1), "{how}: b led {:?} after", ended.elapsed());
        }
    });
}

// ---- 4. A free record written by someone else -------------------------------

/// 4: an admin (or client-go ≥ 0.34's release path) writes the record free
/// while we lead. A follower takes it within one event and one write; the
/// leader, whose watch has already delivered its own last write, must end its
/// term on the event itself, not after a confirming read.
#[test]
fn a_free_record_written_by_someone_else_ends_the_term_on_the_event() {
    paused(async {
        let fake = free();
        let (a, a_id) = elector(&fake, config("a"));
        let a_guard = a.acquire().await.unwrap();
        let (b, b_id) = elector(&fake, config("b"));
        let mut b_acquire = pin!(b.acquire());
        assert!(timeout(MS(2500), &mut b_acquire).await.is_err());
        fake.set_latency(a_id, MS(50));
        fake.set_latency(b_id, MS(10));
        let mut lease = fake.lease().unwrap();
        lease.spec.as_mut().unwrap().holder_identity = Some(String::new());
        fake.put(lease);
        let _b = b_acquire.await.unwrap();
        assert!(!a_guard.is_valid(), "a still led when b took the Lease");
        assert_eq!(a_guard.lost(), Some(taken_by("")));
    });
}

// ---- 5. A write applied, answered with an error ------------------------------

/// 5: a takeover applied but answered 409 (a 504 retried by the client) is our
/// own write: we lead at once instead of waiting a lease duration for it.
#[test]
fn a_takeover_applied_but_answered_409_is_recognised_as_ours() {
    paused(async {
        let fake = free();
        let (a, id) = elector(&fake, config("a").watch(false));
        fake.fault(id, Some("update"), Fault::AppliedThenStatus(409));
        let guard = timeout(S(1), a.acquire())
            .await
            .expect("a lease duration lost with nobody leading")
            .unwrap();
        assert!(guard.is_valid());
        assert_eq!(holder(&fake).as_deref(), Some("a"));
    });
}

/// 5: the same for a creation: the record is renewed through the creation
/// hold (not left unrenewed for a lease duration, as a stranger's would be,
/// for anyone to take), and led once the hold ends.
#[test]
fn a_creation_applied_but_answered_409_is_recognised_as_ours() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, id) = elector(&fake, config("a").watch(false));
        fake.fault(id, Some("create"), Fault::AppliedThenStatus(409));
        let start = Instant::now();
        let _guard = a.acquire().await.unwrap();
        let waited = start.elapsed();
        assert!(
            waited >= S(15) && waited <= S(15) + MS(10),
            "led {waited:?} after creating"
        );
        let renewals = fake
            .requests()
            .iter()
            .filter(|s| s.verb == "update" && s.at > start + MS(1) && s.at < start + S(15))
            .count();
        assert_eq!(renewals, 7, "renewed every retry period during the hold");
    });
}

/// 5: a takeover applied but whose answer never came (the connection reset,
/// a 5xx from a proxy or an etcd timeout after the write went through, or
/// no answer within the bound) is our own write too: the next read shows
/// the record we sent, and we lead within a retry period or two, as
/// client-go does (it takes any record naming its identity), instead of
/// leaving the Lease without a leader for a lease duration while nobody
/// renews it.
#[test]
fn a_takeover_applied_but_never_answered_is_recognised_as_ours() {
    for watch in [false, true] {
        for (fault, bound) in [
            (Fault::AppliedThenLost, S(5)),
            (Fault::AppliedThenStatus(500), S(5)),
            (Fault::AppliedThenStatus(504), S(5)),
            // Answered after the 10 s bound: a timeout.
            (Fault::DelayResponse(S(11)), S(15)),
        ] {
            paused(async move {
                let fake = free();
                let (a, id) = elector(&fake, config("a").watch(watch));
                fake.fault(id, Some("update"), fault);
                let guard = timeout(bound, a.acquire())
                    .await
                    .unwrap_or_else(|_| {
                        panic!(
                            "watch {watch}, {fault:?}: nobody led {bound:?} after our takeover was applied \
                             (holder {:?})",
                            holder(&fake)
                        )
                    })
                    .unwrap();
                assert!(guard.is_valid());
                assert_eq!(holder(&fake).as_deref(), Some("a"));
            });
        }
    }
}

// ---- 6. A preferred holder that never comes ---------------------------------

/// Campaigns in a loop, as `run_each_term` does; counts step-downs.
fn campaign_forever(e: LeaderElector, stepped_down: Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok(guard) = e.acquire().await {
            if let Lost::SteppedDown { .. } = guard.await {
                stepped_down.fetch_add(1, Ordering::SeqCst);
            }
        }
    })
}

/// 6: a free Lease whose `preferredHolder` names a pod that never campaigns:
/// one candidate leads stably within two lease durations, the transitions
/// stop growing, and no guard is handed out for a term that steps down.
#[test]
fn a_preferred_holder_that_never_campaigns_does_not_stop_the_election() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let mut lease = held_by("", 1);
        lease.spec.as_mut().unwrap().preferred_holder = Some("ghost".into());
        // The API server accepts a preferred holder only with a strategy.
        lease.spec.as_mut().unwrap().strategy = Some("OldestEmulationVersion".into());
        fake.put(lease);
        let stepped_down = Arc::new(AtomicUsize::new(0));
        let (a, _) = elector(&fake, config("a"));
        let (b, _) = elector(&fake, config("b"));
        let tasks = [
            campaign_forever(a.clone(), stepped_down.clone()),
            campaign_forever(b.clone(), stepped_down.clone()),
        ];
        sleep(S(30)).await;
        let transitions = spec(&fake).lease_transitions;
        let leader = holder(&fake);
        assert!(
            a.is_leader() ^ b.is_leader(),
            "one leader after two lease durations"
        );
        sleep(S(60)).await;
        assert_eq!(
            spec(&fake).lease_transitions,
            transitions,
            "transitions stopped growing"
        );
        assert_eq!(holder(&fake), leader, "the same leader");
        assert!(a.is_leader() ^ b.is_leader());
        assert_eq!(stepped_down.load(Ordering::SeqCst), 0, "no term stepped down");
        for t in tasks {
            t.abort();
        }
    });
}

/// 6: a preferred holder that does campaign still gets the Lease promptly
/// when the end of the term is marked: the leader steps down at once, and
/// since its guard was still alive (work stopped, not finished) it lets the
/// Lease expire; the preferred holder takes it at expiry, before anyone else.
#[test]
fn a_campaigning_preferred_holder_gets_the_lease_promptly() {
    paused(async {
        let fake = free();
        let (a, _) = elector(&fake, config("a"));
        let a_guard = a.acquire().await.unwrap();
        let (other, _) = elector(&fake, config("other"));
        let mut other_acquire = pin!(other.acquire());
        let (p, _) = elector(&fake, config("p"));
        let mut p_acquire = pin!(p.acquire());
        assert!(timeout(S(1), &mut p_acquire).await.is_err());
        assert!(poll!(&mut other_acquire).is_pending());
        let mut lease = fake.lease().unwrap();
        lease.spec.as_mut().unwrap().preferred_holder = Some("p".into());
        // The API server accepts a preferred holder only with a strategy.
        lease.spec.as_mut().unwrap().strategy = Some("OldestEmulationVersion".into());
        fake.put(lease);
        let marked = Instant::now();
        let lost = timeout(S(3), a_guard).await.expect("a steps down");
        assert!(matches!(lost, Lost::SteppedDown { .. }), "{lost:?}");
        let _p = timeout(S(17), p_acquire)
            .await
            .expect("the preferred holder leads within a lease duration of the mark")
            .unwrap();
        assert!(marked.elapsed() >= S(5), "no overlap with a's stopped work");
        assert!(
            timeout(S(30), other_acquire).await.is_err(),
            "p keeps it; nobody else took it first"
        );
    });
}

// ---- 7, 9. An election task whose runtime is no longer driven ---------------

/// 7, 9: the election task was spawned on a runtime that stopped being polled
/// (a helper current-thread runtime whose `block_on` returned). Guards resolve
/// at their renew deadline on their own timer, `is_leader` says no from then
/// on, and `shutdown` is bounded (below). The rule (see `elector/supervise.rs`):
/// the task runs on the runtime that started it, as kube's `Client` runs its
/// buffer there, and a second task starts only once the first one ended or
/// was dropped, so that two tasks never talk to the API at once. An `acquire`
/// elsewhere therefore waits while that runtime is kept; once it shuts down,
/// the task is dropped with it and the next `acquire` starts a new one.
#[test]
fn an_election_task_on_a_runtime_no_longer_driven_does_not_hang_the_elector() {
    let fake = free();
    let main = paused_runtime();
    let (e, _) = main.block_on(async { elector(&fake, config("me")) });
    let (guard, helper) = main.block_on(acquire_on_a_helper_runtime(&e));
    let first = guard.fencing_token();
    // `helper` is kept alive and not driven.
    main.block_on(async {
        assert!(e.is_leader());
        let lost = timeout(S(11), guard)
            .await
            .expect("the guard resolves at its renew deadline on its own timer");
        assert_eq!(lost, Lost::RenewDeadlineExceeded);
        assert!(!e.is_leader(), "9: not a leader past the renew deadline");
        assert!(!e.status().is_leader);
        assert!(
            timeout(S(60), e.acquire()).await.is_err(),
            "a second task started while the first one may still run"
        );
    });
    // The runtime shuts down: the task is dropped with it.
    drop(helper);
    main.block_on(async {
        let again = timeout(S(120), e.acquire())
            .await
            .expect("a new election task starts")
            .unwrap();
        assert!(again.is_valid());
        assert!(again.fencing_token() > first, "a new term");
        drop(again);
        timeout(S(60), e.shutdown(S(1)))
            .await
            .expect("shutdown is bounded")
            .unwrap();
    });
}

/// 9: a guard says why its term is over as soon as it is over, on its own
/// clock: past the renew deadline, with the election task not driven and the
/// guard not polled, `lost()` is the deadline, as `is_valid()` and
/// `time_left()` say (before: `None`, "while it holds", though it did not).
#[test]
fn a_guard_not_polled_tells_the_renew_deadline_as_its_loss_without_the_election_task() {
    let fake = free();
    let main = paused_runtime();
    let (e, _) = main.block_on(async { elector(&fake, config("me")) });
    let (guard, helper) = main.block_on(acquire_on_a_helper_runtime(&e));
    main.block_on(async {
        assert_eq!(guard.lost(), None, "the term holds");
        tokio::time::sleep(S(11)).await;
        assert!(!guard.is_valid(), "past the renew deadline");
        assert_eq!(guard.time_left(), Duration::ZERO);
        assert_eq!(
            guard.lost(),
            Some(Lost::RenewDeadlineExceeded),
            "the term is over (is_valid: false, time left 0), but lost() does not say why"
        );
    });
    drop(helper);
}

/// 7: `shutdown` while the only task is stuck on a runtime no longer driven.
#[test]
fn shutdown_is_bounded_when_the_election_task_is_not_driven() {
    let fake = free();
    let main = paused_runtime();
    let (e, _) = main.block_on(async { elector(&fake, config("me")) });
    let (guard, helper) = main.block_on(acquire_on_a_helper_runtime(&e));
    main.block_on(async {
        let result = timeout(S(60), e.shutdown(S(1)))
            .await
            .expect("shutdown is bounded");
        assert!(
            matches!(result, Err(crate::ShutdownError::TaskDidNotEnd { .. })),
            "{result:?}"
        );
        assert!(!guard.is_valid());
        assert!(!e.is_leader());
    });
    drop(helper);
}

// ---- 8. The fencing token ---------------------------------------------------

/// 8: a re-created Lease restarts `leaseTransitions`; the fencing token must
/// not go back.
#[test]
fn the_fencing_token_grows_across_a_re_creation() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let first = e.acquire().await.unwrap();
        let before = first.fencing_token();
        fake.delete();
        assert_eq!(first.await, Lost::Deleted);
        let second = e.acquire().await.unwrap();
        assert!(
            second.fencing_token() > before,
            "{before} then {}",
            second.fencing_token()
        );
    });
}

/// 8: another holder's term stored a token far above `leaseTransitions`
/// (past `i32::MAX`, or after the count was edited down); the Lease is
/// deleted and this elector, which never led on it, creates it. Its term's
/// token must still be larger than the one it saw (`Memory::token_for`'s
/// `max_token`): the new object starts with no annotation and low
/// transitions, and nothing else remembers the old token.
#[test]
fn a_token_seen_before_a_re_creation_is_exceeded_by_the_creators_first_term() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let mut lease = held_by("other", 15);
        crate::record::set_token(&mut lease, 1_000_000);
        fake.put(lease);
        let (e, _) = elector(&fake, config("me"));
        let mut leads = Box::pin(e.acquire());
        assert!(timeout(S(2), &mut leads).await.is_err(), "led on a held Lease");
        fake.delete();
        let guard = timeout(S(60), leads)
            .await
            .expect("leads on the re-created Lease")
            .unwrap();
        assert!(
            guard.fencing_token() > 1_000_000,
            "the term on the re-created Lease got token {} after token 1000000 was seen on the name",
            guard.fencing_token()
        );
    });
}

/// 8: `leaseTransitions` saturates at `i32::MAX`; the token keeps growing.
#[test]
fn the_fencing_token_grows_past_i32_max() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let mut lease = held_by("other", 1);
        lease.spec.as_mut().unwrap().lease_transitions = Some(i32::MAX - 1);
        fake.put(lease);
        let (e, _) = elector(&fake, config("me"));
        let mut tokens = Vec::new();
        for _ in 0..3 {
            let guard = e.acquire().await.unwrap();
            tokens.push(guard.fencing_token());
            drop(guard);
            sleep(MS(10)).await;
        }
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
        assert_eq!(tokens[0], i64::from(i32::MAX));
    });
}

/// 8: a term that continues our own record (re-acquired after every guard was
/// dropped, the Lease not released) is still a new term.
#[test]
fn every_term_gets_a_larger_token() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me").release_on_drop(false));
        let first = e.acquire().await.unwrap().fencing_token();
        sleep(S(5)).await;
        let second = e.acquire().await.unwrap().fencing_token();
        assert!(second > first, "{first} then {second}");
    });
}

/// A configured annotation ([`LeaseConfig::annotation`](crate::LeaseConfig::annotation))
/// under the key where each term stores its fencing token
/// (`record::TOKEN_ANNOTATION`) replaces the token written on the Lease, so
/// that the next candidate reads the configured value: at the top of
/// `leaseTransitions`' range (where the annotation alone carries the token),
/// a's second term got the token b's term had. Such a configuration must be
/// refused (or the tokens must still never repeat). (Before: accepted, and
/// the tokens of a's, b's and a's terms were `[2147483647, 2147483648,
/// 2147483648]`.)
#[cfg(feature = "lease-metadata")]
#[test]
fn a_configured_annotation_does_not_replace_the_fencing_token() {
    paused(async {
        let config_a = config("a").annotation(crate::record::TOKEN_ANNOTATION, "1");
        if let Err(e) = config_a.validate() {
            assert!(
                matches!(&e, crate::ConfigError::InvalidAnnotation { key, .. } if key == crate::record::TOKEN_ANNOTATION),
                "{e}"
            );
            return;
        }
        let fake = FakeLeaseApi::default();
        let mut lease = held_by("", 1);
        lease.spec.as_mut().unwrap().lease_transitions = Some(i32::MAX);
        fake.put(lease);
        let (a, _) = elector(&fake, config_a);
        let (b, _) = elector(&fake, config("b"));
        // a, b, then a again, each term released to the next.
        let mut tokens = Vec::new();
        for candidate in [&a, &b, &a] {
            let guard = timeout(S(10), candidate.acquire()).await.expect("leads").unwrap();
            tokens.push(guard.fencing_token());
        }
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "the tokens of a's, b's and a's terms, in turn: {tokens:?}"
        );
    });
}

/// 8, with the `lease-metadata` extra: a free Lease whose annotations
/// (someone else's, and the token of an earlier term) leave room for the
/// fencing token's annotation but not for the configured annotations beside
/// it. The term's token must still be stored (the configured annotations,
/// which no safety rule needs, are what gives way), or tokens repeat. (Before:
/// the write kept the Lease's annotations as they were, the old token
/// included, and a's term, whose token is read back from its write, got the
/// token of the term before it: 100.)
#[cfg(feature = "lease-metadata")]
#[test]
fn configured_annotations_that_do_not_fit_beside_the_token_do_not_make_tokens_repeat() {
    paused(async {
        let fake = free();
        let mut lease = fake.lease().unwrap();
        let annotations = lease.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(crate::record::TOKEN_ANNOTATION.to_owned(), "100".to_owned());
        // 2 KiB left: room for the token, not for a 4 KiB note.
        let used = crate::record::annotations_size(Some(annotations));
        let big = crate::record::MAX_ANNOTATIONS_SIZE - used - 2048 - "example.com/big".len();
        annotations.insert("example.com/big".to_owned(), "x".repeat(big));
        fake.put(lease);
        let config_a = config("a").annotation("example.com/note", "y".repeat(4096));
        config_a
            .validate()
            .expect("a 4 KiB annotation is a valid configuration");
        let (a, _) = elector(&fake, config_a);
        let (b, _) = elector(&fake, config("b"));
        let mut tokens = Vec::new();
        for candidate in [&a, &b] {
            let guard = timeout(S(10), candidate.acquire()).await.expect("leads").unwrap();
            let stored = crate::record::token_of(&fake.lease().unwrap());
            tokens.push((guard.fencing_token(), stored));
        }
        assert!(
            tokens.iter().all(|(token, stored)| token == stored)
                && 100 < tokens[0].0
                && tokens[0].0 < tokens[1].0,
            "(token, token stored on the Lease) of a's and b's terms, in turn, after a term with token 100: {tokens:?}"
        );
        let size = crate::record::annotations_size(fake.lease().unwrap().metadata.annotations.as_ref());
        assert!(
            size <= crate::record::MAX_ANNOTATIONS_SIZE,
            "{size} bytes of annotations"
        );
    });
}

/// 8: a Lease whose annotations (someone else's) leave room for the token
/// of the term before it but not for one digit more: every term is taken
/// without its token stored (warned: tokens may repeat across processes).
/// Still, this elector saw the token 99, and its term's token must be larger
/// (`Memory::token_for`), not read back from the record it wrote, which
/// carries the old one. (Before: 99, the previous term's.)
#[test]
fn a_term_whose_token_does_not_fit_on_the_lease_still_gets_a_larger_one() {
    paused(async {
        let fake = free();
        let mut lease = fake.lease().unwrap();
        let annotations = lease.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(crate::record::TOKEN_ANNOTATION.to_owned(), "99".to_owned());
        let used = crate::record::annotations_size(Some(annotations));
        let filler = crate::record::MAX_ANNOTATIONS_SIZE - used - "example.com/big".len();
        annotations.insert("example.com/big".to_owned(), "x".repeat(filler));
        fake.put(lease);
        let (e, _) = elector(&fake, config("me"));
        let guard = timeout(S(10), e.acquire()).await.expect("leads").unwrap();
        assert!(
            guard.fencing_token() > 99,
            "the term that took a Lease carrying token 99 (no room for a longer one) got token {}",
            guard.fencing_token()
        );
    });
}

/// 8, with the `lease-metadata` extra: the configured annotations, written
/// by the term before (the same configuration on every replica), fill the
/// Lease's annotations up to the API server's limit beside its token, 99.
/// The next term's token, 100, is one byte longer: the configured
/// annotations already there must give way to it, as they do when they are
/// not there yet (section 49). (Before: they stayed, the write kept the old
/// token, and b's term got a's token, 99: `[(99, 99), (99, 99), (100, 99)]`.)
#[cfg(feature = "lease-metadata")]
#[test]
fn configured_annotations_already_on_the_lease_give_way_to_a_longer_token() {
    paused(async {
        let fake = free();
        let mut lease = fake.lease().unwrap();
        let annotations = lease.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(crate::record::TOKEN_ANNOTATION.to_owned(), "98".to_owned());
        let note = "y".repeat(4096);
        let used = crate::record::annotations_size(Some(annotations)) + "example.com/note".len() + note.len();
        let filler = crate::record::MAX_ANNOTATIONS_SIZE - used - "example.com/big".len();
        annotations.insert("example.com/big".to_owned(), "x".repeat(filler));
        fake.put(lease);
        let (a, _) = elector(&fake, config("a").annotation("example.com/note", note.clone()));
        let (b, _) = elector(&fake, config("b").annotation("example.com/note", note));
        // a, b, then a again, each term released to the next.
        let mut tokens = Vec::new();
        for candidate in [&a, &b, &a] {
            let guard = timeout(S(10), candidate.acquire()).await.expect("leads").unwrap();
            let stored = crate::record::token_of(&fake.lease().unwrap());
            tokens.push((guard.fencing_token(), stored));
        }
        assert!(
            tokens.iter().all(|(token, stored)| token == stored)
                && 98 < tokens[0].0
                && tokens.windows(2).all(|w| w[0].0 < w[1].0),
            "(token, token stored on the Lease) of a's, b's and a's terms, in turn, after a term with token 98: \
             {tokens:?}"
        );
    });
}

/// 8, the same with a configured annotation whose value is each replica's
/// own (the pod's node, `LeaseConfig::annotation`'s own example), of the same
/// length: the one on the Lease is a's when b's term needs its room. It must
/// give way to b's longer token as a's own value does to a's. (Before: a's
/// stayed, b's token 100 was not stored, and a's next term got 100 too:
/// `[(99, 99), (100, 99), (100, 100)]`.)
#[cfg(feature = "lease-metadata")]
#[test]
fn configured_annotations_another_replica_left_give_way_to_a_longer_token() {
    paused(async {
        let fake = free();
        let mut lease = fake.lease().unwrap();
        let annotations = lease.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(crate::record::TOKEN_ANNOTATION.to_owned(), "98".to_owned());
        let used =
            crate::record::annotations_size(Some(annotations)) + "example.com/node".len() + "node-a".len();
        let filler = crate::record::MAX_ANNOTATIONS_SIZE - used - "example.com/big".len();
        annotations.insert("example.com/big".to_owned(), "x".repeat(filler));
        fake.put(lease);
        let (a, _) = elector(&fake, config("a").annotation("example.com/node", "node-a"));
        let (b, _) = elector(&fake, config("b").annotation("example.com/node", "node-b"));
        let mut tokens = Vec::new();
        for candidate in [&a, &b, &a] {
            let guard = timeout(S(10), candidate.acquire()).await.expect("leads").unwrap();
            let stored = crate::record::token_of(&fake.lease().unwrap());
            tokens.push((guard.fencing_token(), stored));
        }
        assert!(
            tokens.iter().all(|(token, stored)| token == stored)
                && tokens.windows(2).all(|w| w[0].0 < w[1].0),
            "(token, token stored on the Lease) of a's, b's and a's terms, in turn, each configured with its own \
             node annotation, after a term with token 98: {tokens:?}"
        );
    });
}

// ---- 9. is_leader after shutdown began --------------------------------------

/// 9: `is_leader()` is a readiness gate: false as soon as `shutdown` began,
/// while the guarded work is still given its grace.
#[test]
fn is_leader_is_false_once_shutdown_began() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        assert!(e.is_leader());
        let shutting = tokio::spawn({
            let e = e.clone();
            async move { e.shutdown(S(10)).await }
        });
        sleep(MS(1)).await;
        assert!(!e.is_leader());
        assert!(!e.status().is_leader);
        drop(guard);
        shutting.await.unwrap().unwrap();
    });
}

/// 9: a shutdown that begins while the write that wins the Lease is in flight:
/// the term is never published (no guard, no leader status, observers hear
/// of no term), and the Lease it won is released at once, since no work ran
/// under it. (Before: the status turned to leader, and observers heard the
/// term begin, after the shutdown began.)
#[cfg(feature = "metrics")]
#[test]
fn a_shutdown_during_the_winning_write_publishes_no_term_and_releases() {
    use crate::elector::{Observer, Transition};
    struct Record(Arc<parking_lot::Mutex<Vec<String>>>);
    impl Observer for Record {
        fn observe(&self, transition: Transition<'_>) {
            self.0.lock().push(format!("{transition:?}"));
        }
    }
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let told = Arc::new(parking_lot::Mutex::new(Vec::new()));
        assert!(e.add_observer(Record(told.clone())));
        fake.fault(id, Some("update"), Fault::DelayResponse(S(1)));
        let mut acquire = pin!(e.acquire());
        assert!(
            timeout(MS(100), &mut acquire).await.is_err(),
            "the write is in flight"
        );
        assert_eq!(holder(&fake).as_deref(), Some("me"), "the write took effect");
        let (shutdown, acquired) = tokio::join!(e.shutdown(S(10)), acquire);
        shutdown.unwrap();
        assert!(matches!(acquired, Err(AcquireError::Shutdown)));
        assert!(!e.is_leader());
        let told = told.lock().clone();
        assert!(
            !told
                .iter()
                .any(|t| t.starts_with("Leading(true)") || t.starts_with("TermBegan")),
            "a term published after the shutdown began: {told:?}"
        );
        assert_eq!(
            holder(&fake).as_deref(),
            Some(""),
            "released: no work ran under the term"
        );
    });
}

// ---- 10. run_each_term after a graceful shutdown ----------------------------

/// 10: the guarded work ends on its own because it was wired to
/// `shutdown_requested` (`graceful_shutdown_on`): still a shutdown.
#[test]
fn run_each_term_reports_a_shutdown_when_the_work_ended_through_graceful_shutdown_on() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let run = tokio::spawn({
            let e = e.clone();
            async move {
                e.run_each_term(|| stream::pending::<()>().take_until(e.shutdown_requested()))
                    .await
            }
        });
        sleep(S(1)).await;
        assert!(e.is_leader() || holder(&fake).as_deref() == Some("me"));
        e.shutdown(S(5)).await.unwrap();
        assert_eq!(run.await.unwrap(), crate::RunEnded::Shutdown);
    });
}

// ---- 11. No panic from any argument -----------------------------------------

/// 11: every duration is bounded by validation, and no argument panics.
#[test]
fn no_argument_panics() {
    paused(async {
        let max = Duration::MAX;
        let base = || LeaseConfig::new("default", "lease", "me");
        for config in [
            base().lease_duration(max),
            base().renew_deadline(max),
            base().retry_period(max),
            base().release_timeout(max),
            base().release_timeout(S(u64::from(u32::MAX))),
        ] {
            assert!(config.validate().is_err(), "{config:?}");
        }
        assert!(matches!(
            base().release_timeout(max).validate(),
            Err(ConfigError::TooLong { .. })
        ));
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        assert!(e.health_check(max).is_ok());
        let signal = e.shutdown_requested();
        tokio::spawn(async move {
            signal.await;
            drop(guard);
        });
        e.shutdown(max).await.unwrap();
        assert_eq!(holder(&fake).as_deref(), Some(""));
    });
}

// ---- 12. A busy guarded stream ----------------------------------------------

/// 12: a guarded stream that is always ready stops within one item once the
/// renew deadline passes, even if the elector task has not noticed yet (here
/// it never does: the term is set by hand).
#[test]
fn a_busy_guarded_stream_stops_within_one_item_after_the_renew_deadline() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let deadline = Instant::now() + S(10);
        e.set_term_for_test(Arc::new(Term::new(1, Instant::now(), S(10))));
        let mut guarded = pin!(stream::repeat(()).with_leader_election(&e));
        let mut late = 0;
        let mut items = 0;
        while let Some(()) = guarded.next().now_or_never().expect("always ready") {
            items += 1;
            if Instant::now() >= deadline {
                late += 1;
            }
            advance(MS(30)).await;
            assert!(items < 10_000, "never stopped");
        }
        assert_eq!(late, 0, "items yielded after the renew deadline");
        assert_eq!(guarded.lost(), Some(Lost::RenewDeadlineExceeded));
    });
}

/// 12: work that blocks a current-thread runtime for longer than the lease
/// (a CPU-bound loop without `.await`, a blocking call) keeps the election
/// task and every timer from running meanwhile: nothing renews, and another
/// candidate may lead before the step ends. No change of the crate can
/// prevent that (the crate docs say so), but once the step ends nothing of
/// the term may look alive, before any other task ran: the guard, its
/// future, `is_leader`, `current_guard`, `acquire` and `TermTasks::spawn`
/// all see it over on their own clock. The Lease is not released (the work
/// was alive at the deadline), and the elector leads again afterwards. The
/// log names the cause: the election task ran late (before, only "not
/// renewed within the renew deadline", with no renewal failed before it).
#[test]
fn work_that_blocks_the_runtime_past_the_lease_finds_its_term_over_at_once() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = free();
            let (e, _) = elector(&fake, config("me"));
            let mut guard = e.acquire().await.unwrap();
            let mut tasks = guard.tasks::<()>();
            sleep(S(3)).await;
            assert!(guard.is_valid() && e.is_leader(), "renewed before the step");
            crate::tests::support::busy(S(20));
            assert!(!guard.is_valid());
            assert_eq!(guard.lost(), Some(Lost::RenewDeadlineExceeded));
            assert_eq!(guard.time_left(), Duration::ZERO);
            assert!(!e.is_leader() && !e.status().is_leader);
            assert!(e.current_guard().is_none(), "a guard of a term that is over");
            assert!(
                e.acquire().now_or_never().is_none(),
                "acquire handed out the old term"
            );
            assert_eq!(tasks.spawn(async {}).err(), Some(Lost::RenewDeadlineExceeded));
            assert_eq!((&mut guard).now_or_never(), Some(Lost::RenewDeadlineExceeded));
            let first = guard.fencing_token();
            drop(guard);
            sleep(S(1)).await;
            assert_eq!(
                holder(&fake).as_deref(),
                Some("me"),
                "released though the blocked work was alive at the deadline"
            );
            let again = timeout(S(30), e.acquire())
                .await
                .expect("the elector leads again after the step")
                .unwrap();
            assert!(again.is_valid() && again.fencing_token() > first);
        });
    });
    // The log tells why the term ended with no renewal failed: before the
    // loss, the election task's own lateness.
    let late = logs.find("the leader election task ran late");
    let lost = logs.find("leadership lost");
    assert!(
        late.is_some() && late < lost,
        "no line names the blocked runtime before the loss:\n{logs}"
    );
}

/// 12: a guarded Controller's reconcile in flight stops at the renew
/// deadline on its own clock, not only when the Controller's stream is next
/// polled. kube-runtime spawns
/// each reconcile as a task: dropping the stream aborts them, but a consumer
/// busy with an item (here: writing a status to an API server that does not
/// answer) does not poll the stream, and the reconcile went on past the
/// instant another candidate took the Lease.
#[test]
fn a_guarded_controllers_reconcile_stops_at_the_renew_deadline_while_its_stream_is_not_polled() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_client::ResourceExt;
    use kube_runtime::{Controller, controller::Action, watcher};
    use parking_lot::Mutex;

    use crate::LeaderElectionControllerExt;

    paused(async {
        let fake = free();
        // A second object, whose reconcile ends at once: the consumer then
        // spends a minute on its item.
        let mut other = held_by("", 1);
        other.metadata.name = Some("other".to_owned());
        fake.put(other);
        let (a, a_client) = elector(&fake, config("a"));
        let (client, _) = fake.client();
        let started = Arc::new(AtomicBool::new(false));
        let wrote = Arc::new(Mutex::new(Vec::<Instant>::new()));
        let controller = Controller::new(
            kube_client::Api::<Lease>::namespaced(client, "default"),
            watcher::Config::default(),
        )
        .with_leader_election(&a)
        .run(
            {
                let (started, wrote) = (started.clone(), wrote.clone());
                move |lease: Arc<Lease>, _: Arc<()>| {
                    let slow = lease.name_any() == "lease";
                    let (started, wrote) = (started.clone(), wrote.clone());
                    async move {
                        if slow {
                            started.store(true, Ordering::SeqCst);
                            // A request that takes 30 s, then a write.
                            sleep(S(30)).await;
                            wrote.lock().push(Instant::now());
                        }
                        Ok::<_, kube_client::Error>(Action::await_change())
                    }
                }
            },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        );
        let consumer = tokio::spawn(async move {
            let mut controller = pin!(controller);
            while controller.next().await.is_some() {
                sleep(S(60)).await;
            }
        });
        timeout(S(30), async {
            while !started.load(Ordering::SeqCst) {
                sleep(MS(10)).await;
            }
        })
        .await
        .expect("the guarded Controller never reconciled");
        // `a`'s renewals fail from now on; `b` takes the Lease once it expires.
        fake.partition(a_client, true);
        let (b, _) = elector(&fake, config("b"));
        let b_guard = timeout(S(60), b.acquire())
            .await
            .expect("b never led")
            .expect("b's acquire failed");
        let b_led = Instant::now();
        sleep(S(60)).await;
        let late: Vec<_> = wrote
            .lock()
            .iter()
            .filter(|at| **at >= b_led)
            .map(|at| at.duration_since(b_led))
            .collect();
        assert!(
            late.is_empty(),
            "two leaders: a's reconcile wrote {late:?} after b took the Lease (a's term: {:?}); \
             its Controller's stream was not polled meanwhile",
            a.status()
        );
        drop(b_guard);
        consumer.abort();
    });
}

/// 12: once its term is over, a guarded Controller calls the user's
/// reconciler no more. The reconciler's synchronous part (the closure's
/// body before its future) runs in the Controller stream's poll, which
/// starts every reconcile that is due: after one such step ran past the
/// renew deadline, the same poll went on to the next object, and the
/// adapter, finding no guard (`current_guard` is `None`), called the
/// reconciler and ran its future unguarded, in a task of its own that
/// nothing stops at the next `.await`: work of a term that was over. It
/// is skipped now, with a line at debug level.
#[test]
fn a_guarded_controller_calls_no_reconciler_once_its_term_is_over() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_client::ResourceExt;
    use kube_runtime::{Controller, controller::Action, watcher};
    use parking_lot::Mutex;

    use crate::LeaderElectionControllerExt;

    let logs = crate::tests::support::logs_during(tracing::Level::DEBUG, || {
        paused(async {
            let fake = free();
            let mut other = held_by("", 1);
            other.metadata.name = Some("other".to_owned());
            fake.put(other);
            let (e, _) = elector(&fake, config("me"));
            let (client, _) = fake.client();
            // Each call of the reconciler (the object, and whether the term
            // held), and each object whose reconcile's future ran.
            let called = Arc::new(Mutex::new(Vec::<(String, bool)>::new()));
            let worked = Arc::new(Mutex::new(Vec::<String>::new()));
            let controller = Controller::new(
                kube_client::Api::<Lease>::namespaced(client, "default"),
                watcher::Config::default(),
            )
            .with_leader_election(&e)
            .run(
                {
                    let (e, called, worked) = (e.clone(), called.clone(), worked.clone());
                    move |lease: Arc<Lease>, _: Arc<()>| {
                        let first = called.lock().is_empty();
                        called.lock().push((lease.name_any(), e.is_leader()));
                        if first {
                            // A synchronous step past the renew deadline.
                            crate::tests::support::busy(S(12));
                        }
                        let worked = worked.clone();
                        async move {
                            worked.lock().push(lease.name_any());
                            Ok::<_, kube_client::Error>(Action::await_change())
                        }
                    }
                },
                |_, _, _| Action::await_change(),
                Arc::new(()),
            );
            let mut controller = pin!(controller);
            timeout(S(60), async { while controller.next().await.is_some() {} })
                .await
                .expect("the guarded Controller ran on after its term");
            sleep(S(1)).await;
            let (called, worked) = (called.lock().clone(), worked.lock().clone());
            assert!(
                called.iter().all(|(_, held)| *held) && worked.is_empty(),
                "the reconciler was called once the term was over ({:?}): calls (object, term held) \
             {called:?}, futures run {worked:?}",
                controller.lost()
            );
        });
    });
    // The other object was due in the same poll: skipped, and said so.
    let skipped: Vec<_> = logs.lines().filter(|l| l.contains("reconcile skipped")).collect();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
}

// ---- 13. Wake-up storms, and a release that meets a conflict -----------------

/// 13: a storm of wake-ups (guards and acquisitions created and dropped
/// without pause, on other threads) must not starve the renewals. Here a test
/// hook wakes the task between any two of its waits, the worst a storm can
/// do: the task never finds itself without a wake-up. The storm keeps a
/// worker busy, and paused time would not advance under it, so this test runs
/// in real time on a multi-threaded runtime with short timings, and observes
/// the renewals for two seconds.
#[test]
fn a_storm_of_wake_ups_does_not_starve_the_renewals() {
    let fake = free();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let fast = config("me")
        .lease_duration(S(2))
        .renew_deadline(MS(900))
        .retry_period(MS(300));
    let (e, id) = rt.block_on(async { elector(&fake, fast) });
    let guard = rt
        .block_on(async { timeout(S(10), e.acquire()).await })
        .unwrap()
        .unwrap();
    let start = Instant::now();
    e.set_storm_for_test(true);
    std::thread::sleep(S(2));
    let valid = guard.is_valid();
    let renewals = count(&fake, id, "update", start);
    e.set_storm_for_test(false);
    drop(guard);
    rt.shutdown_timeout(S(5));
    assert!(valid, "renewals starved: the term ended");
    assert!(
        renewals >= 4,
        "{renewals} renewals in 2 s at a 300 ms retry period"
    );
}

/// 13: a release that meets a conflict (the Lease was modified, say its
/// `preferredHolder` set, between the read and the write) is retried once
/// after a fresh read, like client-go's.
#[test]
fn a_release_that_meets_a_conflict_is_retried_after_a_fresh_read() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        fake.fault(id, Some("update"), Fault::Status(409));
        drop(guard);
        sleep(MS(10)).await;
        assert_eq!(holder(&fake).as_deref(), Some(""), "released on the second try");
    });
}

// ---- 14. Flapping demand ----------------------------------------------------

/// 14: demand that flaps (an `acquire` created and dropped repeatedly) must
/// not cost a LIST, a WATCH and a GET each time.
#[test]
fn flapping_demand_keeps_one_observation() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("other", 15));
        let (e, id) = elector(&fake, config("me"));
        let start = Instant::now() - MS(1);
        for _ in 0..10 {
            assert!(timeout(MS(100), e.acquire()).await.is_err());
            sleep(MS(100)).await;
        }
        for verb in ["list", "watch", "get"] {
            let n = count(&fake, id, verb, start);
            assert!(
                n <= 1,
                "{n} {verb} requests for 10 short-lived acquires: {:?}",
                fake.requests()
            );
        }
    });
}

/// 7: a shutdown that had to leave its task behind says so everywhere: the
/// `leader_election_is_leader` gauge drops to 0 although the task that
/// would have said it is not driven.
#[cfg(feature = "metrics")]
#[test]
fn a_shutdown_that_leaves_its_task_behind_clears_the_leader_gauge() {
    use prometheus_client::registry::Registry;

    use crate::tests::support::assert_scraped;
    const SERIES: &str = r#"leader_election_is_leader{namespace="default",lease="lease"}"#;

    let fake = free();
    let main = paused_runtime();
    let mut registry = Registry::default();
    let metrics = crate::metrics::LeaseMetrics::register(&mut registry);
    let (e, _) = main.block_on(async { elector(&fake, config("me")) });
    let e = e.with_metrics(&metrics);
    let (guard, helper) = main.block_on(acquire_on_a_helper_runtime(&e));
    assert_scraped(&registry, &format!("{SERIES} 1"));
    main.block_on(async {
        let result = timeout(S(60), e.shutdown(S(1)))
            .await
            .expect("shutdown is bounded");
        assert!(
            matches!(result, Err(crate::ShutdownError::TaskDidNotEnd { .. })),
            "{result:?}"
        );
    });
    assert_scraped(&registry, &format!("{SERIES} 0"));
    drop(guard);
    drop(helper);
}

/// 7: the task of a first `acquire` polled once on a runtime that is then
/// dropped never even started: the waiter is told
/// ([`AcquireError::ElectorStopped`](crate::AcquireError::ElectorStopped)), and
/// the next `acquire` starts a task on its own runtime.
#[test]
fn a_task_dropped_before_it_started_fails_its_waiter_and_the_next_acquire_starts_one() {
    let fake = free();
    let main = paused_runtime();
    let (e, _) = main.block_on(async { elector(&fake, config("me")) });
    let helper = helper_runtime();
    let mut acquire = Box::pin(e.acquire());
    // Polled once on the helper: the task is spawned there, and never runs.
    helper.block_on(async {
        assert!(poll!(&mut acquire).is_pending());
    });
    drop(helper);
    main.block_on(async {
        let failed = timeout(S(1), acquire).await.expect("the waiter is told");
        assert!(
            matches!(failed, Err(crate::AcquireError::ElectorStopped)),
            "{failed:?}"
        );
    });
    the_next_acquire_leads(&main, &e);
}

/// 7: an `acquire` first polled through the `Handle` of a runtime already
/// shut down (a handle kept past its runtime, whose `block_on` still polls).
/// That runtime drops the task's future inside the spawn, so the task's drop
/// runs there, and it locks the elector's state: spawned with that lock
/// held, it would wait for itself for ever. The waiter is told instead, and
/// the next `acquire` starts a task on a running runtime.
#[test]
fn an_acquire_on_a_runtime_shut_down_fails_instead_of_hanging() {
    let fake = free();
    let main = paused_runtime();
    let (e, _) = main.block_on(async { elector(&fake, config("me")) });
    let helper = helper_runtime();
    let handle = helper.handle().clone();
    drop(helper);
    let (tx, rx) = std::sync::mpsc::channel();
    let on_handle = e.clone();
    std::thread::spawn(move || {
        let _ = tx.send(handle.block_on(on_handle.acquire()).map(drop));
    });
    let failed = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the acquire hangs: the task's drop waits for a lock its spawn holds");
    assert_eq!(failed, Err(AcquireError::ElectorStopped));
    the_next_acquire_leads(&main, &e);
}

/// After a task was dropped with its runtime, the next `acquire` (on `main`)
/// starts a task of its own and leads.
fn the_next_acquire_leads(main: &tokio::runtime::Runtime, e: &LeaderElector) {
    main.block_on(async {
        let guard = timeout(S(120), e.acquire())
            .await
            .expect("the next acquire starts a task of its own")
            .unwrap();
        assert!(guard.is_valid());
    });
}

/// A current-thread runtime with a real clock, for a task that must run on a
/// runtime of its own (and, once its `block_on` returns, is never polled again).
fn helper_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Acquires on a helper current-thread runtime, on its own thread, while the
/// caller's runtime keeps serving the client (the double's `kube::Client`
/// runs its buffer on the runtime it was made on); returns the guard and the
/// helper runtime, whose `block_on` has returned: its tasks, the election task
/// among them, are not polled any more.
async fn acquire_on_a_helper_runtime(e: &LeaderElector) -> (crate::LeaseGuard, tokio::runtime::Runtime) {
    let (tx, rx) = futures::channel::oneshot::channel();
    let e = e.clone();
    std::thread::spawn(move || {
        let helper = helper_runtime();
        let guard = helper
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), e.acquire()).await })
            .unwrap()
            .unwrap();
        let _ = tx.send((guard, helper));
    });
    rx.await.expect("acquired on the helper runtime")
}

// ---- 15. Our record edited to a shorter lease duration ---------------------

/// Someone (`kubectl edit`, a tool) shortens `leaseDurationSeconds` on the
/// leader's record to 1 s, keeping the rest: under client-go's rules a
/// candidate that sees the edited record unchanged for 1 s may take it. The
/// leader `a` saw the edit (its watch lags from then on) and kept its term to
/// its renew deadline, 10 s after its last renewal: two leaders. Now it
/// writes its duration back at once, and, when that renewal fails, its term
/// ends 1 s after its last renewal was sent, before `b` may take the record.
#[test]
fn a_leader_whose_record_is_edited_to_a_shorter_duration_never_leads_beside_the_taker() {
    for renewals_fail in [false, true] {
        paused(async move {
            let fake = free();
            let (a, a_id) = elector(&fake, config("a"));
            let (b, _) = elector(&fake, config("b"));
            let a_guard = a.acquire().await.unwrap();
            let mut b_acquire = Box::pin(b.acquire());
            assert!(timeout(S(5), &mut b_acquire).await.is_err(), "b led beside a");
            // Just after one of a's renewals.
            let start = Instant::now();
            while count(&fake, a_id, "update", start) == 0 {
                sleep(MS(10)).await;
            }
            sleep(MS(100)).await;
            if renewals_fail {
                for _ in 0..10 {
                    fake.fault(a_id, Some("update"), Fault::Status(500));
                }
            }
            let mut edited = fake.lease().unwrap();
            edited.spec.as_mut().unwrap().lease_duration_seconds = Some(1);
            fake.put(edited);
            let edit = Instant::now();
            sleep(MS(10)).await;
            fake.stall_watches(a_id);
            let b_guard = loop {
                match timeout(MS(10), &mut b_acquire).await {
                    Ok(led) => break Some(led.unwrap()),
                    Err(_) if edit.elapsed() >= S(12) => break None,
                    Err(_) => {}
                }
            };
            let took = edit.elapsed();
            if let Some(b_guard) = b_guard {
                assert!(
                    !a_guard.is_valid(),
                    "two leaders: b took a's record {took:?} after it was edited to leaseDurationSeconds 1, \
                     and a's guard is still valid ({:?} left; renewals fail: {renewals_fail})",
                    a_guard.time_left(),
                );
                assert!(
                    renewals_fail,
                    "b took the record though a wrote its duration back"
                );
                drop(b_guard);
            } else {
                assert!(!renewals_fail, "b never took the record a could not renew");
                assert!(
                    a_guard.is_valid(),
                    "a's term ended though it wrote its duration back"
                );
                assert_eq!(
                    spec(&fake).lease_duration_seconds,
                    Some(15),
                    "a's duration, written back"
                );
            }
        });
    }
}

// ---- 16. How a term ends: a dropped task, an acquire served late -----------

/// The election task is dropped in the middle of a term (aborted as when its
/// runtime shuts down, or it panics) while guarded work runs: the term ends
/// as `ElectorStopped` with that work still alive, i.e. stopped, not
/// finished. The next task takes our own record back at once (as it should),
/// but a clean term that ends inside lease duration − renew deadline of that
/// stop must not release (the module docs, *Release only after the guarded
/// work ended*: "for lease duration − renew deadline after such a stop no
/// later term of this elector releases either").
#[test]
fn a_task_dropped_with_work_in_flight_keeps_the_margin_of_stopped_work() {
    let mut released = Vec::new();
    for panics in [false, true] {
        let outcome = Arc::new(parking_lot::Mutex::new(None));
        let out = outcome.clone();
        paused(async move {
            let fake = free();
            let (e, _) = elector(&fake, config("me"));
            let guard = e.acquire().await.unwrap();
            sleep(S(3)).await;
            assert!(guard.is_valid(), "renewed");
            if panics {
                e.interleave_for_test(Point::Recount, || panic!("injected: the election task panics"));
            } else {
                e.abort_task_for_test();
            }
            // The work (this guard) is alive when the term ends.
            let lost = timeout(S(3), guard).await.expect("the term ends with its task");
            assert_eq!(lost, Lost::ElectorStopped);
            let stopped = Instant::now();
            let again = timeout(S(2), e.acquire())
                .await
                .expect("our own record, taken back at once")
                .unwrap();
            drop(again);
            sleep(MS(1500)).await;
            assert!(stopped.elapsed() < S(5), "still inside the 5 s margin");
            *out.lock() = Some((holder(&fake), stopped.elapsed()));
        });
        let (holder, after) = outcome.lock().take().unwrap();
        if holder.as_deref() != Some("me") {
            let how = if panics {
                "panicked"
            } else {
                "was aborted (its runtime shut down)"
            };
            released.push(format!(
                "the election task {how}: the next term released the Lease (holder {holder:?}) {after:?} after \
                 guarded work was stopped by it (ElectorStopped), inside the 5 s margin of stopped work"
            ));
        }
    }
    assert!(released.is_empty(), "{}", released.join("\n"));
}

/// A `with_lease` waits for the Lease; the term begins and its guard is sent
/// to the waiter, but the future is not polled again before `shutdown`
/// begins (the SIGTERM comes in that instant). The shutdown's first step
/// promises "pending `acquire` calls fail with `AcquireError::Shutdown`" and
/// `acquire`'s docs "`AcquireError::Shutdown` once `shutdown` has been
/// called"; `Term::close` says "no new work under it". Instead the pending
/// acquire resolves to a guard, the work starts after the shutdown began,
/// the shutdown waits its whole grace for it, stops it, and the Lease is left
/// to expire instead of handed over.
#[test]
fn a_pending_acquire_is_not_served_once_the_shutdown_began() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let started = Arc::new(AtomicBool::new(false));
        let work = {
            let started = started.clone();
            async move {
                started.store(true, Ordering::SeqCst);
                sleep(S(60)).await;
            }
        };
        let mut with_lease = pin!(e.with_lease(work));
        // First poll: a waiter registers and the task starts.
        assert!(futures::poll!(with_lease.as_mut()).is_pending());
        // The term begins; the `with_lease` future is not polled meanwhile.
        timeout(S(5), async {
            while !e.is_leader() {
                sleep(MS(1)).await;
            }
        })
        .await
        .expect("never led");
        let shutdown = tokio::spawn({
            let e = e.clone();
            async move { e.shutdown(S(5)).await }
        });
        tokio::task::yield_now().await;
        assert!(e.is_shut_down(), "the shutdown began");
        let began = Instant::now();
        let out = timeout(S(30), with_lease).await.expect("with_lease hangs");
        let result = timeout(S(60), shutdown).await.expect("shutdown hangs").unwrap();
        let work_started = started.load(Ordering::SeqCst);
        let holder = holder(&fake);
        assert!(
            !work_started && out == Err(Lost::Shutdown) && holder.as_deref() == Some(""),
            "an acquire pending when the shutdown began was served a guard: the work started \
             {work_started}, with_lease returned {out:?}, shutdown returned {result:?} {:?} after \
             it began, and the Lease holder is {holder:?} (not released)",
            began.elapsed()
        );
    });
}

/// A guarded Controller at `shutdown(2 s)`: its reconcile in flight may
/// finish within the grace, and then the Lease is released (a standby leads
/// at once); one still running at the end of the grace is aborted as on a
/// loss, and the Lease is left to expire. (The adapter's docs said the Lease
/// was released in both cases.)
#[test]
fn a_guarded_controller_is_released_at_shutdown_only_if_its_reconciles_finished_within_the_grace() {
    use futures::StreamExt;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_runtime::{Controller, controller::Action, watcher};

    use crate::LeaderElectionControllerExt;

    for reconcile_for in [S(1), S(60)] {
        paused(async move {
            let fake = free();
            let (e, _) = elector(&fake, config("me"));
            let (client, _) = fake.client();
            let reconciling = Arc::new(AtomicBool::new(false));
            let controller = Controller::new(
                kube_client::Api::<Lease>::namespaced(client, "default"),
                watcher::Config::default(),
            )
            .with_leader_election(&e)
            .run(
                {
                    let reconciling = reconciling.clone();
                    move |_, _: Arc<()>| {
                        reconciling.store(true, Ordering::SeqCst);
                        async move {
                            sleep(reconcile_for).await;
                            Ok::<_, kube_client::Error>(Action::await_change())
                        }
                    }
                },
                |_, _, _| Action::await_change(),
                Arc::new(()),
            );
            let consumer = tokio::spawn(async move {
                let mut controller = pin!(controller);
                while controller.next().await.is_some() {}
                controller.lost()
            });
            timeout(S(30), async {
                while !reconciling.load(Ordering::SeqCst) {
                    sleep(MS(10)).await;
                }
            })
            .await
            .expect("the guarded Controller never reconciled");
            let began = Instant::now();
            let result = e.shutdown(S(2)).await;
            let lost = timeout(S(5), consumer)
                .await
                .expect("the controller runs on")
                .unwrap();
            let holder = holder(&fake);
            // Finished within the grace: released; aborted at its end: left to
            // expire (requests the aborted reconcile sent may still land).
            let released = reconcile_for < S(2);
            assert_eq!(
                holder.as_deref(),
                Some(if released { "" } else { "me" }),
                "a reconcile of {reconcile_for:?}: shutdown(2 s) returned {result:?} after {:?}; the \
             Controller ended with {lost:?}",
                began.elapsed()
            );
        });
    }
}

/// A guarded Controller shut down (`shutdown(20 s)`) while its first LIST
/// of the term is in flight (a large collection, a slow API server: a
/// takeover followed at once by the next step of a rolling update) has no
/// reconcile in flight: kube-runtime's Runner starts none before its store
/// is ready. But its graceful shutdown stops that LIST, so the store never
/// becomes ready, and the Runner waited for it for ever: the stream did not
/// end, `shutdown` waited its whole grace, and the Lease was left to expire
/// as if work had been aborted. It ends at once now, and the Lease is
/// released.
#[test]
fn a_guarded_controller_shut_down_during_its_first_list_ends_at_once_and_is_released() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_runtime::{Controller, controller::Action, watcher};

    use crate::LeaderElectionControllerExt;

    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let (client, listing) = fake.client();
        // The Controller's LIST takes 30 s.
        fake.set_latency(listing, S(30));
        let reconciled = Arc::new(AtomicUsize::new(0));
        let controller = Controller::new(
            kube_client::Api::<Lease>::namespaced(client, "default"),
            watcher::Config::default(),
        )
        .with_leader_election(&e)
        .run(
            {
                let reconciled = reconciled.clone();
                move |_, _: Arc<()>| {
                    reconciled.fetch_add(1, Ordering::SeqCst);
                    async { Ok::<_, kube_client::Error>(Action::await_change()) }
                }
            },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        );
        let consumer = tokio::spawn(async move {
            let mut controller = pin!(controller);
            while controller.next().await.is_some() {}
            controller.lost()
        });
        timeout(S(30), async {
            while !e.is_leader() {
                sleep(MS(10)).await;
            }
        })
        .await
        .expect("never led");
        sleep(S(1)).await;
        let began = Instant::now();
        let result = e.shutdown(S(20)).await;
        let took = began.elapsed();
        let ended = timeout(S(60), consumer).await;
        assert!(
            took < S(1) && holder(&fake).as_deref() == Some("") && matches!(ended, Ok(Ok(None))),
            "shut down during the Controller's first LIST ({} reconciles): shutdown(20 s) returned \
             {result:?} after {took:?}, the Lease is held by {:?}, the Controller ended with {ended:?}",
            reconciled.load(Ordering::SeqCst),
            holder(&fake)
        );
    });
}

/// A guarded Controller polled (on another worker thread) while `shutdown`
/// begins, after it stopped handing out guards and before its signal
/// reached the Controller (`shutdown_requested`): kube-runtime still starts
/// what is due, and the adapter, finding no guard (`current_guard` is
/// `None` once the shutdown began), called the reconciler anyway: its
/// future ran unguarded, work begun after the shutdown that nothing ties to
/// the term. It is skipped now, with a line at debug level.
#[test]
fn a_guarded_controller_calls_no_reconciler_once_the_shutdown_began() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_client::ResourceExt;
    use kube_runtime::{Controller, controller::Action, watcher};
    use parking_lot::Mutex;

    use crate::LeaderElectionControllerExt;

    fn object(name: &str) -> k8s_openapi::api::coordination::v1::Lease {
        let mut object = held_by("", 1);
        object.metadata.namespace = Some("objects".to_owned());
        object.metadata.name = Some(name.to_owned());
        object
    }

    let logs = crate::tests::support::logs_during(tracing::Level::DEBUG, || {
        paused(async {
            let fake = free();
            fake.put(object("first"));
            let (e, _) = elector(&fake, config("me"));
            let (client, _) = fake.client();
            // Each call of the reconciler (the object, and whether the shutdown
            // had begun), and each object whose reconcile's future ran.
            let called = Arc::new(Mutex::new(Vec::<(String, bool)>::new()));
            let worked = Arc::new(Mutex::new(Vec::<String>::new()));
            let controller = Controller::new(
                kube_client::Api::<Lease>::namespaced(client, "objects"),
                watcher::Config::default(),
            )
            .with_leader_election(&e)
            .run(
                {
                    let e = e.clone();
                    let (called, worked) = (called.clone(), worked.clone());
                    move |lease: Arc<Lease>, _: Arc<()>| {
                        called.lock().push((lease.name_any(), e.is_shut_down()));
                        let worked = worked.clone();
                        async move {
                            sleep(S(1)).await;
                            worked.lock().push(lease.name_any());
                            Ok::<_, kube_client::Error>(Action::await_change())
                        }
                    }
                },
                |_, _, _| Action::await_change(),
                Arc::new(()),
            );
            let controller = Arc::new(Mutex::new(Box::pin(controller)));
            let next = || std::future::poll_fn(|cx| controller.lock().poll_next_unpin(cx));
            timeout(S(30), next())
                .await
                .expect("the first object was reconciled")
                .expect("an item")
                .expect("reconciled");
            // A change to reconcile, and the Controller's stream polled (by
            // another thread) as the shutdown begins.
            fake.put(object("second"));
            e.interleave_for_test(Point::ShutdownBegun, {
                let controller = controller.clone();
                move || {
                    let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
                    for _ in 0..10 {
                        let _ = controller.lock().poll_next_unpin(&mut cx);
                    }
                }
            });
            let mut shutdown = Box::pin({
                let e = e.clone();
                async move { e.shutdown(S(30)).await }
            });
            assert!(poll!(&mut shutdown).is_pending(), "waits for the Controller");
            let shutdown = tokio::spawn(shutdown);
            timeout(S(60), async { while next().await.is_some() {} })
                .await
                .expect("the guarded Controller ends at the shutdown");
            let result = timeout(S(60), shutdown)
                .await
                .expect("shutdown is bounded")
                .unwrap();
            sleep(S(5)).await;
            let (called, worked) = (called.lock().clone(), worked.lock().clone());
            assert!(
                called.iter().all(|(_, began)| !*began),
                "the reconciler was called once the shutdown had begun: calls (object, shutdown \
             begun) {called:?}, futures run {worked:?}; shutdown returned {result:?}, the \
             Controller ended with {:?}",
                controller.lock().lost()
            );
            assert_eq!(worked, ["first"], "calls {called:?}");
            assert!(result.is_ok(), "{result:?}");
            assert_eq!(holder(&fake).as_deref(), Some(""), "released: the work finished");
        });
    });
    // The second object was due as the shutdown began: skipped, and said so.
    let skipped: Vec<_> = logs.lines().filter(|l| l.contains("reconcile skipped")).collect();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
}

// ---- 17. The parts users touch around the election -------------------------

/// 17: `LeaseGuard::lost_signal`, the future the guard's docs give to
/// `Controller::graceful_shutdown_on`, resolves when the term is over,
/// as the guard does: at the renew deadline on its own clock too, even if
/// the election task never runs again (its runtime no longer driven, as in
/// section 7). Otherwise a Controller wired to it keeps reconciling past
/// the renew deadline, and past the lease duration, while another candidate
/// takes the Lease.
#[test]
fn lost_signal_resolves_at_the_renew_deadline_without_the_election_task() {
    let fake = free();
    let main = paused_runtime();
    let (e, _) = main.block_on(async { elector(&fake, config("me")) });
    let (guard, helper) = main.block_on(acquire_on_a_helper_runtime(&e));
    main.block_on(async {
        let signal = guard.lost_signal();
        let began = Instant::now();
        let resolved = timeout(S(30), signal).await;
        assert!(
            resolved.is_ok(),
            "lost_signal still pending {:?} after the term's renew deadline passed (valid: {}, \
             time left {:?}): a Controller given it through graceful_shutdown_on reconciles on",
            began.elapsed(),
            guard.is_valid(),
            guard.time_left()
        );
        assert!(!guard.is_valid());
    });
    drop(guard);
    drop(helper);
}

/// 17: after a step that blocked the (current-thread) runtime past the renew
/// deadline, `lost_signal` is ready at its next poll, as the guard is: it
/// reads its own clock, not only its timer, which fires only once the
/// runtime drives it again. Raced with the work (`select!`), a signal still
/// pending let the work take one more step past the deadline, and past the
/// lease duration.
#[test]
fn lost_signal_is_ready_at_its_next_poll_after_a_blocked_runtime() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        let mut signal = pin!(guard.lost_signal());
        assert!(poll!(signal.as_mut()).is_pending(), "the term holds");
        crate::tests::support::busy(S(20));
        assert!(!guard.is_valid());
        assert!(
            poll!(signal.as_mut()).is_ready(),
            "lost_signal still pending after a step that blocked the runtime 20 s, \
             past the renew deadline (the guard: {:?})",
            guard.lost()
        );
    });
}

/// 17: a guarded Controller that kube-runtime itself ends by force
/// (`Controller::shutdown_on_signal`, a second SIGTERM: "requesting that all
/// reconcilers abort") ends its stream with reconciles in flight; the
/// adapter drops it, which aborts them. That work was stopped, not
/// finished: requests it sent may still land, so the Lease must be left to
/// expire (rule 5), not released at once. Real time and real signals, sent
/// to a child process (this test alone, run again by this binary):
/// kube-runtime's handlers leave SIGTERM and SIGINT ignored in the process
/// that takes them.
#[test]
fn a_guarded_controller_ended_by_force_with_reconciles_in_flight_is_not_released() {
    use std::{
        io::{BufRead, BufReader},
        process::{Command, Stdio},
        sync::mpsc,
    };

    const CHILD: &str = "KRL_FORCED_SHUTDOWN_CHILD";
    if std::env::var_os(CHILD).is_some() {
        forced_shutdown_in_this_process();
        return;
    }
    // This test's name as the test harness knows it: its path without the crate's name.
    let module = module_path!().split_once("::").map_or("", |(_, path)| path);
    let name =
        format!("{module}::a_guarded_controller_ended_by_force_with_reconciles_in_flight_is_not_released");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut output = Vec::new();
    let mut wait_for = |marker: &str, signal: bool| {
        let started = std::time::Instant::now();
        while started.elapsed() < S(30) {
            if signal {
                // Graceful, then forceful: repeated until the stream ended
                // (a signal is seen only by a listener already waiting).
                let kill = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
                assert!(kill.unwrap().success());
            }
            while let Ok(line) = lines.recv_timeout(MS(200)) {
                let found = line.contains(marker);
                output.push(line);
                if found {
                    return;
                }
            }
        }
        panic!("no `{marker}` from the child within 30 s:\n{}", output.join("\n"));
    };
    wait_for("KRL-CHILD reconciling", false);
    wait_for("KRL-CHILD ended", true);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    output.extend(lines.try_iter());
    assert!(
        status.success(),
        "the child failed ({status}):\n{}",
        output.join("\n")
    );
}

/// The child's side of the test above: a guarded Controller reconciling (a
/// reconcile that never ends) until the signals end it by force; then the
/// Lease must still be held.
fn forced_shutdown_in_this_process() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_runtime::{Controller, controller::Action, watcher};

    use crate::LeaderElectionControllerExt;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let (client, _) = fake.client();
        let reconciling = AtomicBool::new(false);
        let controller = Controller::new(
            kube_client::Api::<Lease>::namespaced(client, "default"),
            watcher::Config::default(),
        )
        .shutdown_on_signal()
        .with_leader_election(&e)
        .run(
            move |_, _: Arc<()>| {
                if !reconciling.swap(true, Ordering::SeqCst) {
                    // Once the Controller's stream was polled: its signal
                    // listeners wait.
                    println!("KRL-CHILD reconciling");
                }
                async move {
                    // Sends a request and waits for its answer, for ever.
                    futures::future::pending::<()>().await;
                    Ok::<_, kube_client::Error>(Action::await_change())
                }
            },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        );
        let mut controller = pin!(controller);
        let ended = timeout(S(60), async { while controller.next().await.is_some() {} }).await;
        assert!(
            ended.is_ok(),
            "the Controller's stream did not end at the forceful shutdown"
        );
        println!("KRL-CHILD ended");
        let lost = controller.lost();
        // Time for a release, which must not come.
        sleep(MS(500)).await;
        assert_eq!(
            holder(&fake).as_deref(),
            Some("me"),
            "the Lease was released at once (the guarded Controller ended with {lost:?}) though \
             its reconcile was aborted in flight"
        );
        e.shutdown(S(1)).await.ok();
    });
}

/// 17: the `lost_signal` of a timeless term (the election switched off)
/// sets no timer: it resolves at the shutdown only, and until then leaves
/// the runtime idle, so that paused time passes. Bounded in real time: a
/// signal that spun on a timer would keep paused time from ever passing.
#[test]
fn the_lost_signal_of_a_timeless_term_sets_no_timer() {
    use std::sync::mpsc::RecvTimeoutError;

    let (tx, rx) = std::sync::mpsc::channel();
    let run = std::thread::spawn(move || {
        paused(async {
            let fake = free();
            let (e, _) = elector(&fake, config("me").enabled(false));
            let guard = e.acquire().await.unwrap();
            let mut signal = pin!(guard.lost_signal());
            let early = timeout(S(3600), &mut signal).await;
            assert!(early.is_err(), "the signal resolved while the term held");
            drop(guard);
            e.shutdown(S(1)).await.unwrap();
            timeout(S(1), signal)
                .await
                .expect("the signal resolves at the shutdown");
        });
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => {}
        Err(RecvTimeoutError::Disconnected) => std::panic::resume_unwind(run.join().unwrap_err()),
        Err(RecvTimeoutError::Timeout) => {
            panic!("an hour of paused time did not pass in 60 s: the signal of a timeless term spins")
        }
    }
}

// ---- 18. Dropped at any poll point ------------------------------------------

/// An `acquire` polled once waits for the Lease; the term begins and its
/// guard is sent to the waiter, but the future is kept unpolled (a
/// `select!` that took another branch and keeps it pinned for later) while
/// the shutdown runs. No work can start under that guard (a later poll
/// answers `AcquireError::Shutdown`, section 16), so the shutdown has no
/// work to wait for: it must not wait its grace for a guard nobody holds,
/// nor leave the Lease to expire as if work had been stopped.
#[test]
fn an_acquire_served_but_not_polled_does_not_hold_the_shutdown_back() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let mut acquire = pin!(e.acquire());
        assert!(poll!(acquire.as_mut()).is_pending(), "a waiter registers");
        timeout(S(5), async {
            while !e.is_leader() {
                sleep(MS(1)).await;
            }
        })
        .await
        .expect("never led");
        let began = Instant::now();
        let result = timeout(S(60), e.shutdown(S(10))).await.expect("shutdown hangs");
        let took = began.elapsed();
        let holder = holder(&fake);
        let later = poll!(acquire.as_mut());
        assert!(
            took < S(1)
                && holder.as_deref() == Some("")
                && matches!(later, Poll::Ready(Err(AcquireError::Shutdown))),
            "shutdown(10 s) returned {result:?} after {took:?} and the Lease holder is {holder:?} (not \
             released), with no guard in anyone's hands: the only one sat unreceived in an acquire \
             (polled afterwards: {later:?})"
        );
    });
}

/// 18: an `acquire` served a guard that it has not received yet is not
/// handed a term that ended meanwhile: a guard of it would end at once
/// (`LeaseGuard::of` refuses one for that reason), and one that ended
/// before the work could start is no stopped work. It waits for the next
/// term instead.
#[test]
fn an_acquire_served_a_term_that_ended_before_it_was_polled_waits_for_the_next_one() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let mut acquire = pin!(e.acquire());
        assert!(poll!(acquire.as_mut()).is_pending(), "a waiter registers");
        timeout(S(5), async {
            while !e.is_leader() {
                sleep(MS(1)).await;
            }
        })
        .await
        .expect("never led");
        fake.take_over("b");
        timeout(S(5), async {
            while e.is_leader() {
                sleep(MS(1)).await;
            }
        })
        .await
        .expect("the takeover was never seen");
        let later = poll!(acquire.as_mut());
        let served = match &later {
            Poll::Ready(Ok(guard)) => Some((guard.is_valid(), guard.lost())),
            _ => None,
        };
        assert!(
            later.is_pending(),
            "the acquire resolved to {later:?} (valid, lost: {served:?}) after its term was taken over by b: \
             a guard of a term already over"
        );
        // b's record expires: the same acquire leads the next term.
        let guard = timeout(S(60), acquire)
            .await
            .expect("the acquire never led the next term")
            .unwrap();
        assert!(guard.is_valid(), "the next term holds");
    });
}

/// What to set up before a future of the election is polled, for the tests
/// that drop it after any number of polls.
#[derive(Clone, Copy, Debug)]
enum Before {
    /// A free Lease: won at the first write.
    Free,
    /// No Lease: this candidate creates it and holds it first (the
    /// creation hold) for a lease duration.
    Missing,
    /// The first write is answered 3 s after it took effect (dropped
    /// with the request in flight).
    SlowWrite,
    /// The first write is answered 409 (a retry after a read).
    Conflict,
    /// The watch's initial list is answered after 3 s.
    SlowList,
}

impl Before {
    const ALL: [Before; 5] = [
        Before::Free,
        Before::Missing,
        Before::SlowWrite,
        Before::Conflict,
        Before::SlowList,
    ];

    fn fake(self) -> FakeLeaseApi {
        match self {
            Before::Missing => FakeLeaseApi::default(),
            _ => free(),
        }
    }

    fn fault(self, fake: &FakeLeaseApi, id: usize) {
        match self {
            Before::Free | Before::Missing => {}
            Before::SlowWrite => fake.fault(id, Some("update"), Fault::DelayResponse(S(3))),
            Before::Conflict => fake.fault(id, Some("update"), Fault::Status(409)),
            Before::SlowList => fake.fault(id, Some("list"), Fault::DelayResponse(S(3))),
        }
    }
}

/// Polls `work` `polls` times, 250 ms of paused time apart (or until it
/// ends), then drops it.
async fn poll_then_drop<F: std::future::Future>(work: F, polls: usize) {
    let mut work = pin!(work);
    for _ in 0..polls {
        if poll!(work.as_mut()).is_ready() {
            break;
        }
        sleep(MS(250)).await;
    }
}

/// After a future of the election was dropped at `dropped` and nothing
/// else wants leadership: at most one write follows (a release), within a
/// lease duration and a half the election goes quiet (no task, no request
/// for the next 40 s), the Lease is free, expired or was never written, and
/// a new `acquire` leads within `allowance`; then `shutdown` is bounded. The
/// problems found, or nothing.
async fn left_behind(
    fake: &FakeLeaseApi,
    e: &LeaderElector,
    id: usize,
    dropped: Instant,
    allowance: Duration,
) -> Vec<String> {
    let mut found = Vec::new();
    sleep(S(25)).await;
    let writes = count(fake, id, "update", dropped) + count(fake, id, "create", dropped);
    if writes > 1 {
        found.push(format!(
            "{writes} writes within 25 s after the drop (holder {:?})",
            holder(fake)
        ));
    }
    let quiet = Instant::now();
    sleep(S(40)).await;
    let sent: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.client == id && r.at > quiet)
        .map(|r| r.verb)
        .collect();
    if !sent.is_empty() {
        found.push(format!("requests 25 s to 65 s after the drop: {sent:?}"));
    }
    let (running, _) = e.tasks_for_test();
    if running {
        found.push("an election task still runs 65 s after the drop".into());
    }
    match timeout(allowance, e.acquire()).await {
        Ok(Ok(guard)) => drop(guard),
        Ok(Err(err)) => found.push(format!("a later acquire failed: {err:?}")),
        Err(_) => found.push(format!(
            "a later acquire did not lead within {allowance:?} (holder {:?})",
            holder(fake)
        )),
    }
    match timeout(S(60), e.shutdown(S(1))).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => found.push(format!("shutdown failed: {err:?}")),
        Err(_) => found.push("shutdown(1 s) did not return within 60 s".into()),
    }
    found
}

/// Runs `make`'s future against every setup of [`Before`], polled 0 to 23
/// times (up to 5.75 s: through the first write, its answer, the creation
/// hold's start, a retry), dropped, and checks what it [left behind]. The
/// problems found, by setup and polls.
fn drop_at_every_poll<F: std::future::Future + 'static>(
    make: fn(&FakeLeaseApi, &LeaderElector) -> F,
) -> Vec<String> {
    let found = Arc::new(parking_lot::Mutex::new(Vec::new()));
    for before in Before::ALL {
        for polls in 0..24 {
            let found = found.clone();
            paused(async move {
                let fake = before.fake();
                let (e, id) = elector(&fake, config("me"));
                before.fault(&fake, id);
                poll_then_drop(make(&fake, &e), polls).await;
                // Never polled, the future did nothing: the later `acquire`
                // is the first, and meets the setup (a creation hold, a slow
                // write).
                let allowance = if polls == 0 { S(20) } else { S(2) };
                for problem in left_behind(&fake, &e, id, Instant::now(), allowance).await {
                    found
                        .lock()
                        .push(format!("{before:?}, dropped after {polls} polls: {problem}"));
                }
            });
        }
    }
    found.lock().clone()
}

/// 18: an `acquire` dropped at any poll point (waiting, with a write in
/// flight, during a 409 retry, the creation hold or the watch's initial
/// list; or resolved, its guard dropped) leaves nothing behind.
#[test]
fn an_acquire_dropped_at_any_poll_point_leaves_nothing_behind() {
    let found = drop_at_every_poll(|_, e| {
        let acquire = e.acquire();
        async move {
            let _guard = acquire.await;
        }
    });
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// 18: the same for the futures built on guards: `with_lease`, a guarded
/// stream and `run_each_term`, each dropped while waiting or while its work
/// runs (stopped, not finished: the Lease is left to expire).
#[test]
fn guarded_work_dropped_at_any_poll_point_leaves_nothing_behind() {
    static RECONCILES: AtomicUsize = AtomicUsize::new(0);
    let mut found = drop_at_every_poll(|_, e| {
        let e = e.clone();
        async move {
            let _ = e.with_lease(futures::future::pending::<()>()).await;
        }
    });
    found.extend(drop_at_every_poll(|_, e| {
        let e = e.clone();
        async move {
            let mut guarded = pin!(stream::pending::<()>().with_leader_election(&e));
            while guarded.next().await.is_some() {}
        }
    }));
    found.extend(drop_at_every_poll(|_, e| {
        let e = e.clone();
        async move {
            e.run_each_term(stream::pending::<()>).await;
        }
    }));
    // A guarded Controller of the Leases themselves: a reconcile of 1 s at
    // every write, each holding its own guard.
    found.extend(drop_at_every_poll(|fake, e| {
        use k8s_openapi::api::coordination::v1::Lease;
        use kube_runtime::{Controller, controller::Action, watcher};

        use crate::LeaderElectionControllerExt;

        let (client, _) = fake.client();
        let controller = Controller::new(
            kube_client::Api::<Lease>::namespaced(client, "default"),
            watcher::Config::default(),
        )
        .with_leader_election(e)
        .run(
            |_, _: Arc<()>| async move {
                RECONCILES.fetch_add(1, Ordering::SeqCst);
                sleep(S(1)).await;
                Ok::<_, kube_client::Error>(Action::await_change())
            },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        );
        async move {
            let mut controller = pin!(controller);
            while controller.next().await.is_some() {}
        }
    }));
    let reconciles = RECONCILES.load(Ordering::SeqCst);
    assert!(
        reconciles > 100,
        "the guarded Controller reconciled {reconciles} times in all"
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// 18: the last guard dropped while a new `acquire` comes, at every step of
/// the task's giving up (k yields apart, the release answered at once or
/// after 3 s): the new `acquire` leads within a second (the term kept, or
/// the Lease released and taken again), or once the release in flight is
/// answered (the release is bounded by `release_timeout`; the Lease is free
/// for others meanwhile), and the term it leads is renewed.
#[test]
fn the_last_guard_dropped_as_a_new_acquire_comes_leads_again_at_once() {
    let found = Arc::new(parking_lot::Mutex::new(Vec::new()));
    for slow_release in [false, true] {
        for yields in 0..40 {
            let found = found.clone();
            paused(async move {
                let fake = free();
                let (e, id) = elector(&fake, config("me"));
                let guard = e.acquire().await.unwrap();
                sleep(S(3)).await;
                if slow_release {
                    fake.fault(id, Some("update"), Fault::DelayResponse(S(3)));
                }
                drop(guard);
                for _ in 0..yields {
                    tokio::task::yield_now().await;
                }
                let asked = Instant::now();
                let allowance = if slow_release { S(4) } else { S(1) };
                let problem = match timeout(allowance, e.acquire()).await {
                    Err(_) => Some(format!(
                        "did not lead within {allowance:?} (holder {:?})",
                        holder(&fake)
                    )),
                    Ok(Err(err)) => Some(format!("failed: {err:?}")),
                    Ok(Ok(guard)) => {
                        let took = asked.elapsed();
                        sleep(S(20)).await;
                        (!guard.is_valid() || holder(&fake).as_deref() != Some("me")).then(|| {
                            format!(
                                "led after {took:?}, but 20 s later valid {} lost {:?}, holder {:?}",
                                guard.is_valid(),
                                guard.lost(),
                                holder(&fake)
                            )
                        })
                    }
                };
                if let Some(problem) = problem {
                    found.lock().push(format!(
                        "slow release {slow_release}, {yields} yields after the drop: the new acquire {problem}"
                    ));
                }
                timeout(S(60), e.shutdown(S(1)))
                    .await
                    .expect("shutdown is bounded")
                    .unwrap();
            });
        }
    }
    let found = found.lock().clone();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// 18: `shutdown` dropped by its caller (a timeout around it) after any
/// number of polls, with a guard alive: the shutdown has begun for good
/// (`acquire` fails, `is_leader` is false), the term goes on while the
/// guard's work runs, and once the guard is dropped the Lease is released
/// and the task ends; a second `shutdown` returns within its budget.
#[test]
fn a_shutdown_dropped_at_any_poll_point_still_hands_over() {
    let found = Arc::new(parking_lot::Mutex::new(Vec::new()));
    for slow_release in [false, true] {
        // (Never polled, a shutdown has not begun: from one poll on.)
        for polls in 1..30 {
            let found = found.clone();
            paused(async move {
                let fake = free();
                let (e, id) = elector(&fake, config("me"));
                let guard = e.acquire().await.unwrap();
                sleep(S(1)).await;
                if slow_release {
                    fake.fault(id, Some("update"), Fault::DelayResponse(S(3)));
                }
                // The guard's work ends 4 s into the shutdown's 10 s grace.
                let work = tokio::spawn(async move {
                    sleep(S(4)).await;
                    drop(guard);
                });
                poll_then_drop(e.shutdown(S(10)), polls).await;
                let mut problems = Vec::new();
                if !matches!(e.acquire().await, Err(AcquireError::Shutdown)) || e.is_leader() {
                    problems.push("the shutdown did not stay begun".to_owned());
                }
                work.await.unwrap();
                sleep(S(10)).await;
                if holder(&fake).as_deref() != Some("") {
                    problems.push(format!("not released (holder {:?})", holder(&fake)));
                }
                let budget = e.config().shutdown_budget(S(1));
                let began = Instant::now();
                match timeout(S(120), e.shutdown(S(1))).await {
                    Ok(Ok(())) if began.elapsed() <= budget => {}
                    other => problems.push(format!(
                        "a second shutdown returned {other:?} after {:?} (budget {budget:?})",
                        began.elapsed()
                    )),
                }
                if e.tasks_for_test().0 {
                    problems.push("a task still runs".to_owned());
                }
                for problem in problems {
                    found.lock().push(format!(
                        "slow release {slow_release}, shutdown dropped after {polls} polls: {problem}"
                    ));
                }
            });
        }
    }
    let found = found.lock().clone();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// 18: three guards of one term (the `acquire`'s, `current_guard`'s, and one
/// moved into another task) and the elector's handles, dropped in every
/// order: the term holds and is renewed while any guard is alive (whether or
/// not a handle is), and once the last guard goes the Lease is released and
/// the election goes quiet; another candidate then leads at once.
#[test]
fn guards_and_handles_dropped_in_any_order_release_after_the_last_guard() {
    // 0, 1: guards kept here; 2: a guard moved to another task; 3: the handles.
    let orders = [
        [0, 1, 2, 3],
        [0, 2, 1, 3],
        [1, 0, 2, 3],
        [2, 1, 0, 3],
        [3, 0, 1, 2],
        [3, 2, 1, 0],
        [0, 3, 2, 1],
        [2, 3, 0, 1],
        [1, 2, 3, 0],
    ];
    let found = Arc::new(parking_lot::Mutex::new(Vec::new()));
    for order in orders {
        let found = found.clone();
        paused(async move {
            let fake = free();
            let (e, id) = elector(&fake, config("me"));
            let (b, _) = elector(&fake, config("b"));
            let first = e.acquire().await.unwrap();
            let mut guards = [Some(first), e.current_guard(), None];
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let moved = e.current_guard().expect("a third guard");
            let elsewhere = tokio::spawn(async move {
                let _moved = moved;
                let _ = rx.await;
            });
            let mut tx = Some(tx);
            let mut elsewhere = Some(elsewhere);
            let mut handle = Some(e);
            let mut live = 3;
            for (step, which) in order.into_iter().enumerate() {
                sleep(S(7)).await;
                match which {
                    0 | 1 => drop(guards[which].take()),
                    2 => {
                        drop(tx.take());
                        elsewhere.take().unwrap().await.unwrap();
                    }
                    _ => drop(handle.take()),
                }
                if which != 3 {
                    live -= 1;
                }
                let dropped = Instant::now();
                sleep(S(20)).await;
                let h = holder(&fake);
                let renewals = count(&fake, id, "update", dropped);
                let ok = if live > 0 {
                    h.as_deref() == Some("me") && renewals >= 5
                } else {
                    h.as_deref() == Some("") && count(&fake, id, "update", dropped + S(1)) == 0
                };
                if !ok {
                    found.lock().push(format!(
                        "order {order:?}, after step {step} ({live} guards left): holder {h:?}, {renewals} \
                         writes in the 20 s since"
                    ));
                }
            }
            if timeout(S(1), b.acquire()).await.is_err() {
                found
                    .lock()
                    .push(format!("order {order:?}: b did not lead at once"));
            }
        });
    }
    let found = found.lock().clone();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

// ---- 19. Several guarded works on one term ---------------------------------

/// 19: two guarded streams share a term (two controllers under one Lease).
/// One is cancelled mid-term; the other ends on its own long after. The
/// cancelled one's requests may land for lease duration − renew deadline
/// after it stopped, not after the term ends: past that margin the Lease is
/// released at once, as if neither had been cancelled. (Before: a cancelled
/// stream marked the whole term, and the Lease was left to expire, so a
/// standby waited a lease duration.) Cancelled inside the margin, the Lease
/// is still left to expire.
#[test]
fn a_stream_cancelled_long_before_its_sibling_ends_does_not_keep_the_lease_from_its_release() {
    paused(async {
        // Lease duration 15 s, renew deadline 10 s: a margin of 5 s.
        for (cancelled_before_end, released) in [(S(20), true), (S(2), false)] {
            let fake = free();
            let (a, _) = elector(&fake, config("a"));
            let (b, _) = elector(&fake, config("b"));
            let mut cancelled = Box::pin(stream::pending::<()>().with_leader_election(&a));
            let (done, finish) = futures::channel::oneshot::channel::<u8>();
            let mut sibling = Box::pin(stream::once(finish).with_leader_election(&a));
            assert!(timeout(S(1), cancelled.next()).await.is_err(), "a leads");
            assert!(timeout(MS(10), sibling.next()).await.is_err(), "the sibling runs");
            assert!(cancelled.is_leading() && sibling.is_leading());
            drop(cancelled);
            sleep(cancelled_before_end).await;
            assert!(a.is_leader(), "the sibling keeps the term");
            let mut b_acquire = pin!(b.acquire());
            assert!(timeout(MS(100), &mut b_acquire).await.is_err(), "b waits");
            done.send(7).unwrap();
            let items: Vec<_> = timeout(S(1), sibling.by_ref().collect::<Vec<_>>())
                .await
                .expect("the sibling ends");
            assert_eq!(items, [Ok(7)]);
            let ended = Instant::now();
            let _b = timeout(S(30), &mut b_acquire)
                .await
                .expect("b leads once the Lease is released or expires")
                .unwrap();
            let waited = ended.elapsed();
            if released {
                assert!(
                    waited < S(1),
                    "b led {waited:?} after the last stream ended, its sibling cancelled \
                     {cancelled_before_end:?} before that (the margin is 5 s): the Lease was not released"
                );
            } else {
                assert!(
                    waited >= S(10),
                    "b led {waited:?} after the last stream ended, its sibling cancelled \
                     {cancelled_before_end:?} before that, inside the 5 s margin: released too early"
                );
            }
        }
    });
}

/// 19: two `acquire`s wait; the term begins and serves both; one is
/// received and its work runs, the other is polled again only after the
/// shutdown began. That one resolves to `Shutdown` (no work starts once the
/// shutdown began), and its guard, dropped unused, is not counted against
/// the working one: the shutdown still waits for the work, and the Lease is
/// released only after it. (Two survivors of the mutation run: `!shutdown`
/// as `true` in `Acquire::poll`, and the undelivered count never going down
/// in `Term::guard_dropped`, which let the shutdown end the term under the
/// working guard and release the Lease at once.)
#[test]
fn an_acquire_served_before_the_shutdown_and_polled_after_it_leaves_the_shutdown_waiting_for_the_work() {
    paused(async {
        let fake = free();
        let (e, _) = elector(&fake, config("me"));
        let mut first = Box::pin(e.acquire());
        let mut second = Box::pin(e.acquire());
        assert!(poll!(first.as_mut()).is_pending() && poll!(second.as_mut()).is_pending());
        let work = timeout(S(1), first).await.expect("a term").unwrap();
        sleep(MS(10)).await;
        let shutting = tokio::spawn({
            let e = e.clone();
            async move { e.shutdown(S(10)).await }
        });
        sleep(MS(10)).await;
        let late = timeout(S(1), second).await.expect("the second acquire resolves");
        assert!(
            matches!(late, Err(AcquireError::Shutdown)),
            "an acquire polled after the shutdown began resolved to {late:?}"
        );
        sleep(S(3)).await;
        assert!(
            !shutting.is_finished() && work.is_valid(),
            "the shutdown ended the term under the working guard: {:?}, holder {:?}",
            work.lost(),
            holder(&fake)
        );
        assert_eq!(
            holder(&fake).as_deref(),
            Some("me"),
            "released under the working guard"
        );
        drop(work);
        timeout(S(1), shutting)
            .await
            .expect("the shutdown ends once the work ended")
            .unwrap()
            .unwrap();
        assert_eq!(holder(&fake).as_deref(), Some(""), "released once the work ended");
    });
}

// ---- 20. etcd restored from an older snapshot -------------------------------

/// The resourceVersion of the Lease on `fake` now, as a number.
fn version_now(fake: &FakeLeaseApi) -> u64 {
    let lease = fake.lease().expect("a Lease");
    lease.metadata.resource_version.unwrap().parse().unwrap()
}

/// 20: the API server comes back on etcd restored from a snapshot taken
/// during a's term: the Lease shows an older renewal of that very term, at
/// an older resourceVersion, and a's next renewal conflicts. client-go's
/// leader reads the record, sees its identity and renews on; ours must too,
/// not give its term up and leave the Lease without a leader for a lease
/// duration.
#[test]
fn a_leader_keeps_its_term_when_etcd_is_restored_to_an_older_renewal_of_it() {
    paused(async {
        let fake = free();
        let (a, id) = elector(&fake, config("a"));
        let guard = a.acquire().await.unwrap();
        sleep(S(5)).await;
        let snapshot = version_now(&fake);
        sleep(S(5)).await;
        fake.restore(snapshot);
        let restored = Instant::now();
        let ended = timeout(S(30), guard).await;
        assert!(
            ended.is_err(),
            "a's term ended {:?} after etcd was restored to an older renewal of it ({:?}); client-go's leader \
             renews on",
            restored.elapsed(),
            ended.unwrap()
        );
        assert!(
            count(&fake, id, "update", restored) >= 10,
            "a did not renew on the restored record"
        );
        assert_eq!(holder(&fake).as_deref(), Some("a"));
    });
}

/// 20: etcd restored to a snapshot of a's term after a's term ended and b
/// took the Lease over: the record names a again while b leads. a must not
/// take it at once as its own (client-go's candidate would, since it names
/// its identity: two leaders until b's next renewal conflicts); b gives its
/// term up at that conflict, and a leads only after the restored record
/// was seen unchanged for a lease duration.
#[test]
fn a_restored_record_of_an_ended_term_is_not_taken_back_beside_the_leader() {
    paused(async {
        let fake = free();
        let (a, a_id) = elector(&fake, config("a"));
        let guard = a.acquire().await.unwrap();
        sleep(S(3)).await;
        let snapshot = version_now(&fake);
        fake.partition(a_id, true);
        timeout(S(30), guard)
            .await
            .expect("a's term ends once it is cut off");
        let (b, _) = elector(&fake, config("b"));
        let b_guard = timeout(S(60), b.acquire()).await.expect("b leads").unwrap();
        fake.partition(a_id, false);
        let mut a_leads = Box::pin(a.acquire());
        assert!(
            timeout(S(5), &mut a_leads).await.is_err(),
            "a led beside b before the restore"
        );
        fake.restore(snapshot);
        let restored = Instant::now();
        let mut b_guard = pin!(b_guard);
        tokio::select! {
            biased;
            lost = &mut b_guard => assert_eq!(lost, taken_by("a"), "b's term ended"),
            _ = &mut a_leads => panic!(
                "two leaders: a led {:?} after etcd was restored to a record of its ended term, while b's term held",
                restored.elapsed()
            ),
            () = sleep(S(30)) => panic!("b's term still holds 30 s after the restore"),
        }
        let b_ended = restored.elapsed();
        let a_guard = timeout(S(30), a_leads)
            .await
            .expect("a leads after the restored record expires")
            .unwrap();
        assert!(a_guard.is_valid());
        assert!(
            restored.elapsed() <= S(15) + S(3),
            "a led {:?} after the restore (b's term ended at {b_ended:?}): later than a lease duration and a retry period",
            restored.elapsed()
        );
    });
}

/// 20: after etcd was restored to an older renewal of a's term, a renews on
/// at resourceVersions below those it saw before the restore. Its own last
/// write is still its own: cut off past its renew deadline and healed, a
/// takes its record back at once, as before the restore, and not after a
/// lease duration as if the record had been brought back from a snapshot.
#[test]
fn after_a_restore_a_leaders_own_last_write_is_still_its_own() {
    paused(async {
        let fake = free();
        let (a, id) = elector(&fake, config("a"));
        let guard = a.acquire().await.unwrap();
        sleep(S(5)).await;
        let snapshot = version_now(&fake);
        // Ten renewals after the snapshot, fewer after the restore.
        sleep(S(20)).await;
        fake.restore(snapshot);
        sleep(S(5)).await;
        fake.partition(id, true);
        timeout(S(30), guard)
            .await
            .expect("a's term ends once it is cut off");
        fake.partition(id, false);
        let healed = Instant::now();
        let again = timeout(S(5), a.acquire()).await;
        assert!(
            again.is_ok(),
            "a did not take its own last write back within 5 s of the heal (holder {:?}, resourceVersion {})",
            holder(&fake),
            version_now(&fake)
        );
        assert!(healed.elapsed() <= S(3));
    });
}

// ---- 21. Candidates configured differently on one Lease (a rolling update) --

/// Timings (lease duration, renew deadline, retry period) of a candidate.
type Timings = (Duration, Duration, Duration);

/// The pairs of timings a rolling update can put side by side on one Lease
/// (the leader's, the other candidate's): client-go's defaults next to
/// longer ones, both ways, and extremes `validate` accepts (a 2 s lease
/// duration next to a 400 s retry period), both ways.
fn skewed() -> [(Timings, Timings); 4] {
    let defaults = (S(15), S(10), S(2));
    let long = (S(60), S(40), S(5));
    let shortest = (S(2), MS(1900), MS(1500));
    let longest = (S(600), S(500), S(400));
    [
        (defaults, long),
        (long, defaults),
        (shortest, longest),
        (longest, shortest),
    ]
}

fn timed(identity: &str, (lease, renew, retry): Timings) -> LeaseConfig {
    config(identity)
        .lease_duration(lease)
        .renew_deadline(renew)
        .retry_period(retry)
}

/// 21: a rolling update that changes the timings runs candidates of both
/// on one Lease. The leader `a` is cut off: `b`, configured otherwise, takes
/// the Lease by the duration on the record (`a`'s), not by its own: never
/// while `a`'s term may still hold (a longer duration of its own would not
/// matter, a shorter one would be two leaders), and within that duration
/// of `a`'s last renewal (a longer one of its own, or a retry period far
/// longer than `a`'s lease duration, would leave the Lease without a
/// leader). Its first write carries its own duration, which `a`, campaigning
/// again, then goes by.
#[test]
fn a_takeover_between_candidates_with_different_timings_goes_by_the_records_duration() {
    for (a_timings, b_timings) in skewed() {
        paused(async move {
            let fake = free();
            let (a, a_id) = elector(&fake, timed("a", a_timings));
            let (b, _) = elector(&fake, timed("b", b_timings));
            let a_guard = a.acquire().await.unwrap();
            let mut b_acquire = Box::pin(b.acquire());
            // Beside a live leader for a while (a renews at its own pace).
            let beside = a_timings.2.mul_f64(3.5);
            assert!(
                timeout(beside, &mut b_acquire).await.is_err(),
                "{a_timings:?} / {b_timings:?}: b led beside a live a"
            );
            assert_eq!(spec(&fake).lease_duration_seconds, Some(secs(a_timings.0)));
            let cut = Instant::now();
            let last_renewal = fake
                .requests()
                .iter()
                .filter(|r| r.client == a_id && matches!(r.verb, "update"))
                .map(|r| r.at)
                .next_back()
                .unwrap_or(cut);
            fake.partition(a_id, true);
            let b_guard = timeout(a_timings.0 + S(10), &mut b_acquire)
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{a_timings:?} / {b_timings:?}: b did not lead within a's lease duration and 10 s of a's last \
                         renewal (holder {:?})",
                        holder(&fake)
                    )
                })
                .unwrap();
            let took = last_renewal.elapsed();
            assert!(
                !a_guard.is_valid() && a_guard.lost().is_some(),
                "{a_timings:?} / {b_timings:?}: two leaders: b led {took:?} after a's last renewal, a's guard still \
                 valid ({:?} left)",
                a_guard.time_left()
            );
            assert!(
                took >= a_timings.0,
                "{a_timings:?} / {b_timings:?}: b led {took:?} after a's last renewal, before the record's duration"
            );
            assert!(
                took <= a_timings.0 + S(1),
                "{a_timings:?} / {b_timings:?}: b led only {took:?} after a's last renewal (the record's duration is \
                 {:?})",
                a_timings.0
            );
            assert_eq!(
                spec(&fake).lease_duration_seconds,
                Some(secs(b_timings.0)),
                "{a_timings:?} / {b_timings:?}: b's record carries b's duration"
            );
            drop(a_guard);
            // a, back, waits for b's record by its duration.
            fake.partition(a_id, false);
            let mut a_acquire = Box::pin(a.acquire());
            assert!(
                timeout(b_timings.2.mul_f64(3.5), &mut a_acquire).await.is_err(),
                "{a_timings:?} / {b_timings:?}: a led beside b"
            );
            assert!(b_guard.is_valid());
            // A graceful handover: b's release is taken at once.
            drop(b_guard);
            let released = Instant::now();
            let _a_guard = timeout(S(3), a_acquire)
                .await
                .unwrap_or_else(|_| {
                    panic!("{a_timings:?} / {b_timings:?}: a did not take b's released Lease within 3 s")
                })
                .unwrap();
            assert!(released.elapsed() <= S(3));
        });
    }
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap()
}

// ---- 22. Panics in guarded work and in the election task --------------------

/// The election task panics (a bug: an overflow, an `unwrap` on a record)
/// while this candidate leads. Its drop ends the term as `ElectorStopped`
/// (the guards resolve, the waiters fail, the next `acquire` starts a new
/// task), and the log says so as it says every other loss: `leadership
/// lost` at WARN, in the election's span (which names the Lease), after an
/// ERROR that names the panic as the cause. The panic's own message goes to
/// the panic hook (stderr), not to the operator's log, and names no Lease.
#[test]
fn an_election_task_that_panics_while_leading_logs_the_loss() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = free();
            let (e, _) = elector(&fake, config("me"));
            let guard = e.acquire().await.unwrap();
            sleep(S(3)).await;
            e.interleave_for_test(Point::Recount, || panic!("injected: the election task panics"));
            let lost = timeout(S(3), guard).await.expect("the term ends with its task");
            assert_eq!(lost, Lost::ElectorStopped);
            // And the next `acquire` leads again (our own record, taken back).
            let again = timeout(S(3), e.acquire()).await;
            assert!(matches!(again, Ok(Ok(_))), "{again:?}");
        });
    });
    let lines: Vec<&str> = logs.lines().collect();
    let panicked = lines
        .iter()
        .position(|l| l.contains("ERROR") && l.contains("panicked") && l.contains("lease.name=lease"));
    let lost = lines.iter().position(|l| {
        l.contains("WARN")
            && l.contains("leadership lost")
            && l.contains("elector task stopped")
            && l.contains("lease.name=lease")
    });
    assert!(
        matches!((panicked, lost), (Some(p), Some(l)) if p < l),
        "the election task panicked while leading: no ERROR line naming the panic ({panicked:?}) before a \
         WARN `leadership lost` ({lost:?}); logs at WARN and above:\n{logs}"
    );
}

/// A panic that is not the election task's, on the thread that drops it: a
/// `#[tokio::main(flavor = "current_thread")]` (or a `#[tokio::test]`) whose
/// body panics while leading drops its runtime, and the election task with
/// it, while that panic unwinds. The task did not panic: the term ends with
/// its runtime (`leadership lost`, as on any runtime shutdown), and the log
/// must not blame the election task (it said `the leader election task
/// panicked` at ERROR, read from `std::thread::panicking()`).
#[test]
fn a_panic_that_drops_the_runtime_is_not_logged_as_the_election_tasks() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        let main = std::panic::catch_unwind(|| {
            paused(async {
                let fake = free();
                let (e, _) = elector(&fake, config("me"));
                let _guard = e.acquire().await.unwrap();
                panic!("injected: the application's main panics while leading");
            });
        });
        assert!(main.is_err());
    });
    assert!(
        !logs.contains("election task panicked") && logs.contains("leadership lost"),
        "the runtime was dropped by the application's own panic: the log blames the election task, or says \
         nothing of the loss; logs at WARN and above:\n{logs}"
    );
}

/// A guarded stream whose inner stream panics, the panic caught by its
/// consumer (`StreamExt::catch_unwind`, or a `catch_unwind` around each
/// `next()`), which then goes on with something else (waits for a signal)
/// and keeps the stream. The work is gone, but the guard, a field of the
/// stream, is not: the replica renewed the Lease for ever with nothing
/// running under it, and no other candidate could lead (never none). A
/// panic in the inner stream ends its work as a drop does: stopped, not
/// finished, so the Lease is left to expire, and another candidate leads
/// one lease duration after the last renewal.
#[test]
fn a_guarded_stream_whose_panic_its_consumer_caught_does_not_keep_the_lease() {
    paused(async {
        let fake = free();
        let (a, _) = elector(&fake, config("a"));
        let (b, _) = elector(&fake, config("b"));
        let work = stream::iter(0..).then(|i| async move {
            sleep(S(1)).await;
            assert!(i < 3, "injected: the guarded work panics");
            i
        });
        let mut caught = pin!(std::panic::AssertUnwindSafe(work.with_leader_election(&a)).catch_unwind());
        while let Some(item) = caught.next().await {
            if item.is_err() {
                break;
            }
        }
        let panicked = Instant::now();
        assert_eq!(holder(&fake).as_deref(), Some("a"));
        // The consumer keeps the stream; b campaigns.
        let took = timeout(S(30), b.acquire()).await;
        let after = panicked.elapsed();
        assert!(
            matches!(took, Ok(Ok(_))),
            "b did not lead within 30 s of the panic in a's guarded work (lease duration 15 s): a still leads \
             ({}), holder {:?}, renewed with nothing running under it",
            a.is_leader(),
            holder(&fake)
        );
        // Stopped, not finished: left to expire, not released.
        assert!(
            after >= S(13),
            "b led {after:?} after the panic: the Lease was released"
        );
        // (`caught` is kept until here.)
        assert!(caught.next().await.is_none());
    });
}

/// A Controller of the Leases in `default` guarded by `elector`, cold or
/// `warm` (where it is built), run with `reconcile` (errors await a change).
fn guarded_controller<F>(
    client: kube_client::Client,
    elector: &LeaderElector,
    warm: bool,
    reconcile: impl FnMut(Arc<k8s_openapi::api::coordination::v1::Lease>, Arc<()>) -> F + Send + 'static,
) -> std::panic::AssertUnwindSafe<futures::stream::BoxStream<'static, impl Send>>
where
    F: std::future::Future<Output = Result<kube_runtime::controller::Action, kube_client::Error>>
        + Send
        + 'static,
{
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_runtime::{Controller, controller::Action, watcher};

    use crate::LeaderElectionControllerExt;
    let policy = |_: Arc<Lease>, _: &kube_client::Error, _: Arc<()>| Action::await_change();
    let controller = Controller::new(
        kube_client::Api::<Lease>::namespaced(client, "default"),
        watcher::Config::default(),
    );
    let stream = if warm {
        #[cfg(feature = "warm-standby")]
        {
            controller
                .with_leader_election_warm(elector)
                .run(reconcile, policy, Arc::new(()))
                .boxed()
        }
        #[cfg(not(feature = "warm-standby"))]
        unreachable!()
    } else {
        controller
            .with_leader_election(elector)
            .run(reconcile, policy, Arc::new(()))
            .boxed()
    };
    std::panic::AssertUnwindSafe(stream)
}

/// A guarded Controller whose reconciler panics: kube-runtime runs each
/// reconcile as a task and resumes its panic in the Controller's stream, so
/// the panic reaches the consumer, which catches it (`StreamExt::catch_unwind`)
/// and keeps the stream. Cold (`with_leader_election`: the guarded stream
/// above) and, where it is built, warm (`with_leader_election_warm`: the
/// guard of the term is held by a campaign polled with the stream) alike, the
/// replica must not go on renewing a Lease with no Controller running under
/// it: another candidate leads once the Lease expires.
#[test]
fn a_guarded_controller_whose_reconciler_panicked_does_not_keep_the_lease() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_client::ResourceExt;
    use kube_runtime::controller::Action;
    let mut kept = Vec::new();
    for warm in [false, true] {
        #[cfg(not(feature = "warm-standby"))]
        if warm {
            continue;
        }
        let outcome = Arc::new(parking_lot::Mutex::new(None));
        let out = outcome.clone();
        paused(async move {
            let fake = free();
            let (a, _) = elector(&fake, config("a"));
            let (b, _) = elector(&fake, config("b"));
            let (client, _) = fake.client();
            let reconcile = |lease: Arc<Lease>, _: Arc<()>| async move {
                assert!(lease.name_any().is_empty(), "injected: the reconciler panics");
                Ok::<_, kube_client::Error>(Action::await_change())
            };
            let mut caught = pin!(guarded_controller(client, &a, warm, reconcile).catch_unwind());
            let caught_panic = timeout(S(60), async {
                while let Some(item) = caught.next().await {
                    if item.is_err() {
                        return;
                    }
                }
                panic!("the Controller's stream ended without the reconciler's panic");
            })
            .await;
            assert!(caught_panic.is_ok(), "the reconciler never ran");
            let panicked = Instant::now();
            let took = timeout(S(30), b.acquire()).await;
            *out.lock() = Some((
                matches!(took, Ok(Ok(_))),
                panicked.elapsed(),
                a.is_leader(),
                holder(&fake),
            ));
        });
        let (took, after, a_leads, holder) = outcome.lock().take().unwrap();
        if took {
            assert!(
                after >= S(13),
                "b led {after:?} after the panic: the Lease was released"
            );
        } else {
            kept.push(format!(
                "{}: b did not lead within {after:?} of the panic in a's reconciler (lease duration 15 s): \
                 a still leads ({a_leads}), holder {holder:?}",
                if warm { "warm" } else { "cold" }
            ));
        }
    }
    assert!(kept.is_empty(), "{}", kept.join("\n"));
}

/// A guarded Controller whose reconciler panics while another reconcile is
/// in flight. kube-runtime runs each reconcile as a task of its own, aborted
/// only when the Controller's stream is dropped, and that reconcile holds a
/// guard of the term: the panic must drop the Controller itself, not only
/// the stream's own guard, or the reconcile runs on after the panic and its
/// guard keeps the replica renewing the Lease until it ends (a cold guarded
/// stream that kept its inner stream at a panic: the other candidate did not
/// lead within 60 s, and the reconcile finished at 121 s).
#[test]
fn a_reconcile_in_flight_when_another_panics_is_aborted_and_keeps_no_term() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_client::ResourceExt;
    use kube_runtime::controller::Action;
    for warm in [false, true] {
        #[cfg(not(feature = "warm-standby"))]
        if warm {
            continue;
        }
        paused(async move {
            let fake = free();
            let mut other = held_by("", 1);
            other.metadata.name = Some("slow".into());
            fake.put(other);
            let (a, _) = elector(&fake, config("a"));
            let (b, _) = elector(&fake, config("b"));
            let (client, _) = fake.client();
            let finished = Arc::new(AtomicBool::new(false));
            let reconcile = {
                let finished = finished.clone();
                move |lease: Arc<Lease>, _: Arc<()>| {
                    let finished = finished.clone();
                    async move {
                        if lease.name_any() == "slow" {
                            sleep(S(120)).await;
                            finished.store(true, Ordering::SeqCst);
                        } else {
                            sleep(S(1)).await;
                            panic!("injected: the reconciler panics");
                        }
                        Ok::<_, kube_client::Error>(Action::await_change())
                    }
                }
            };
            let mut caught = pin!(guarded_controller(client, &a, warm, reconcile).catch_unwind());
            let panicked = timeout(S(60), async {
                while let Some(item) = caught.next().await {
                    if item.is_err() {
                        return;
                    }
                }
            })
            .await;
            assert!(panicked.is_ok(), "warm: {warm}: the reconciler never panicked");
            // The consumer keeps the stream; b campaigns.
            let took = timeout(S(60), b.acquire()).await;
            let led = matches!(took, Ok(Ok(_)));
            sleep(S(120)).await;
            assert!(
                led && !finished.load(Ordering::SeqCst),
                "warm: {warm}: after the panic, b led within 60 s: {led} (a leads: {}), the reconcile in \
                 flight finished: {}",
                a.is_leader(),
                finished.load(Ordering::SeqCst)
            );
        });
    }
}

/// What holds around a panic: work under `with_lease` that panics, the
/// panic caught around the call (`FutureExt::catch_unwind`) and the future
/// kept, drops its guard while unwinding (an `async fn`'s locals go with the
/// panic), as stopped work: the Lease is not released but expires, and
/// another candidate leads then; a task of a `TermTasks` that panics ends
/// as `JoinError::Panic` while the term goes on; a guard polled on a runtime
/// that is then dropped is dropped outside any runtime without a panic.
#[test]
fn panics_in_guarded_work_leave_the_lease_to_expire_and_the_term_defined() {
    let guard = paused_runtime().block_on(async {
        let fake = free();
        let (a, _) = elector(&fake, config("a"));
        let (b, _) = elector(&fake, config("b"));
        let guard = a.acquire().await.unwrap();
        let mut tasks = guard.tasks::<()>();
        tasks
            .spawn(async { panic!("injected: a task of the term panics") })
            .unwrap();
        let joined = timeout(S(1), tasks.join_next()).await.unwrap().unwrap();
        assert!(joined.is_err_and(|e| e.is_panic()));
        assert!(guard.is_valid() && a.is_leader(), "the term goes on");
        drop(guard);
        // The stopped task's margin (5 s) passes; then a panic under `with_lease`.
        sleep(S(6)).await;
        let mut caught = pin!(
            std::panic::AssertUnwindSafe(a.with_lease(async {
                sleep(S(1)).await;
                panic!("injected: the work under the Lease panics")
            }))
            .catch_unwind()
        );
        assert!(timeout(S(20), &mut caught).await.unwrap().is_err());
        let panicked = Instant::now();
        let took = timeout(S(30), b.acquire()).await;
        assert!(
            matches!(took, Ok(Ok(_))),
            "b never led after the panic under a's with_lease"
        );
        let after = panicked.elapsed();
        assert!(
            after >= S(13),
            "b led {after:?} after the panic: the Lease was released"
        );
        assert!(!a.is_leader());
        // A guard polled (its timer made) on this runtime, kept past it.
        let (c, _) = elector(&FakeLeaseApi::default(), config("c"));
        let mut guard = c.acquire().await.unwrap();
        assert!(poll!(&mut guard).is_pending());
        Some(guard)
    });
    let guard = guard.unwrap();
    // Its runtime dropped the election task with it: the term ended.
    assert_eq!(guard.lost(), Some(Lost::ElectorStopped));
    drop(guard);
}

// ---- 23. Answers that are not what they say ---------------------------------

/// 23: a renewal answered `200` with a body that is not the Lease (`{}`,
/// another object, one with no resourceVersion: something in front of the
/// API server, or a Status that is no object) was taken for the written
/// Lease: the term's cached object lost its name or resourceVersion, every
/// later renewal was refused (400, 422), and the term ended at its renew
/// deadline after one odd answer. Such an answer is a failed renewal, said
/// so: the next one writes on top of the object last written, or reads it.
#[test]
fn a_renewal_answered_with_something_that_is_not_the_lease_costs_no_term() {
    for body in [
        "{}",
        r#"{"metadata":{"name":"lease"}}"#,
        r#"{"metadata":{"name":"other","resourceVersion":"1"}}"#,
        r#"{"kind":"Status","apiVersion":"v1","status":"Success","code":200}"#,
    ] {
        let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
            paused(async {
                let fake = free();
                let (a, id) = elector(&fake, config("a"));
                let guard = a.acquire().await.unwrap();
                sleep(S(3)).await;
                fake.fault(id, Some("update"), Fault::Body(200, body));
                let odd = Instant::now();
                let ended = timeout(S(30), guard).await;
                assert!(
                    ended.is_err(),
                    "a's term ended {:?} after one renewal answered 200 {body} ({:?})",
                    odd.elapsed(),
                    ended.unwrap()
                );
                assert_eq!(holder(&fake).as_deref(), Some("a"), "{body}");
            });
        });
        assert!(
            logs.contains("renewing the lease failed") && logs.contains("failed to update lease"),
            "no line naming the failed update for 200 {body}:\n{logs}"
        );
    }
}

/// Watch events for another object than the Lease watched, as something in
/// front of the API server that ignores the watch's field selector
/// (`metadata.name=lease`) delivers them: the other Lease changed, or
/// deleted. kube-runtime's `watch_object` hands either on as the Lease
/// itself (`Some(other)`, or `None` for any deletion), and the leader,
/// caught up with its own last write, took the first for a takeover and
/// the second for the Lease deleted: its term ended at once, on a Lease
/// nobody else wrote. Such an event is not the Lease's: dropped.
#[test]
fn a_watch_event_for_another_lease_costs_no_term() {
    for event in crate::tests::support::OTHER_LEASE_EVENTS {
        paused(async {
            let fake = free();
            let (a, id) = elector(&fake, config("a"));
            let guard = a.acquire().await.unwrap();
            sleep(S(3)).await;
            // a's watch re-lists (410), then watches: its watch answered
            // with the other Lease's event.
            fake.fault(id, Some("watch"), Fault::Body(200, event));
            fake.expire_watches();
            let odd = Instant::now();
            let ended = timeout(S(30), guard).await;
            assert!(
                ended.is_err(),
                "a's term ended {:?} after its watch delivered {event} ({:?})",
                odd.elapsed(),
                ended.unwrap()
            );
            assert_eq!(holder(&fake).as_deref(), Some("a"), "{event}");
        });
    }
}

/// A watch's BOOKMARK whose resourceVersion goes backwards (something in
/// front of the API server, or a cache, answering with an old one): the
/// watcher resumes from it when the watch ends, and the API server replays
/// the Lease's history since: the records before this term, the last
/// holder's among them, as events. The leader, caught up with its own
/// last write, took its predecessor's replayed record for a takeover.
/// An event older than one the watch delivered is no news: dropped.
#[test]
fn a_watch_resumed_from_an_old_bookmark_does_not_replay_a_takeover() {
    paused(async {
        let fake = free();
        let (b, _) = elector(&fake, config("b"));
        drop(b.acquire().await.unwrap());
        b.shutdown(S(1)).await.unwrap();
        let (a, id) = elector(&fake, config("a"));
        let guard = a.acquire().await.unwrap();
        sleep(S(3)).await;
        fake.fault(
            id,
            Some("watch"),
            Fault::Body(
                200,
                concat!(
                    r#"{"type":"BOOKMARK","object":{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","#,
                    r#""metadata":{"resourceVersion":"1"}}}"#,
                    "\n"
                ),
            ),
        );
        fake.expire_watches();
        let odd = Instant::now();
        let ended = timeout(S(30), guard).await;
        assert!(
            ended.is_err(),
            "a's term ended {:?} after its watch resumed from an old bookmark ({:?})",
            odd.elapsed(),
            ended.unwrap()
        );
        assert_eq!(holder(&fake).as_deref(), Some("a"));
    });
}
