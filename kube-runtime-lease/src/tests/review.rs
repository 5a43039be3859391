//! Review findings: each test shows a fault on the current code (see the
//! review report). Written failing-first; none is fixed here.

use std::time::Duration;

use std::pin::pin;

use tokio::time::{Instant, sleep, timeout};

use crate::{
    record,
    test_util::FakeLeaseApi,
    tests::support::{config, elector, free, held_by, holder, paused, spec},
};

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

/// A garbage fencing-token annotation (`i64::MAX`, written by an admin, a
/// restore, or a buggy tool) on the Lease: the first term hands out
/// `i64::MAX`, and the next term of the same elector computes
/// `last_token + 1` (`Memory::next_token`), which overflows: in a debug
/// build the election task panics (the next `acquire` fails with
/// `ElectorStopped`, and every later win panics again, leaving the Lease
/// written by a term that never renews); in a release build it wraps and the
/// token repeats.
#[test]
fn a_fencing_token_annotation_at_i64_max_does_not_stop_the_next_term() {
    paused(async {
        let fake = free();
        let mut lease = fake.lease().unwrap();
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(record::TOKEN_ANNOTATION.to_owned(), i64::MAX.to_string());
        fake.put(lease);
        let (e, _) = elector(&fake, config("me"));
        let first = timeout(S(30), e.acquire()).await.expect("leads").unwrap();
        assert_eq!(first.fencing_token(), i64::MAX);
        // Leadership given up: the Lease is released.
        drop(first);
        tokio::time::sleep(S(5)).await;
        let second = timeout(S(30), e.acquire())
            .await
            .expect("leads again")
            .expect("the second term begins (the election task did not panic)");
        assert!(second.fencing_token() >= i64::MAX);
    });
}

/// The creation hold when the Lease object that replaced a held one is
/// *taken over* (created by someone else, here left free at once, as a
/// client-go candidate that re-created it and then released it would),
/// rather than created by us: `hold_for(.., created = false)` holds it until
/// the deleted record's lease duration (40 s) has passed, but the takeover
/// write itself (`try_acquire`, `LeaseView::Known` / `Verdict::Take`) carries
/// only this candidate's own `lease_duration_seconds()` (15 s), not the rest
/// of the hold. The crate docs promise that "every record it writes during
/// the hold carries a `leaseDurationSeconds` that covers the rest of the
/// hold, so that candidates that never saw the old record wait as long".
/// If `a` is then cut off before its first renewal, a candidate `c` that never
/// saw the deleted record takes the Lease 15 s later, while the deleted
/// record's holder (`go`, 40 s) may still lead.
#[test]
fn a_takeover_during_the_creation_hold_writes_a_duration_covering_the_hold() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("go", 40));
        let (a, a_id) = elector(&fake, config("a"));
        let mut a_acquire = pin!(a.acquire());
        assert!(timeout(S(1), &mut a_acquire).await.is_err(), "a saw go's record");
        // The object is deleted, and a new one (a new uid) appears at once, free.
        fake.delete();
        let deleted = Instant::now();
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
        let _ = c_led;
        assert!(
            u64::try_from(written).unwrap_or_default() >= left && deleted.elapsed() >= S(40),
            "the takeover during the hold wrote leaseDurationSeconds {written} ({left} s of the hold were left), and c (which never saw the \
             deleted 40 s record) led {:?} after the deletion",
            deleted.elapsed()
        );
    });
}

/// Two processes with one identity, the second one client-go's: a client-go
/// candidate whose identity is the holder's treats the record as its own
/// (`IsLeader()`: the observed holder is its identity) and renews it at
/// once, keeping `acquireTime` and `leaseTransitions` as client-go's renewal
/// does. Its writes are then indistinguishable from our own term's by
/// `TermId` (uid, holder, acquireTime, transitions): our leader's renewals
/// meet a conflict, re-read the record, find "our" term (`reread`,
/// `run.id.matches`) and renew on top of it, so both lead for ever. The
/// crate docs promise that "a leader that finds such a record at a renewal
/// has been taken over" (docs/regressions.md section 2: "two processes with
/// one identity never both lead").
#[test]
fn a_client_go_process_with_our_identity_renewing_our_record_ends_our_term() {
    paused(async {
        let fake = free();
        let (a, _) = elector(&fake, config("x"));
        let guard = a.acquire().await.unwrap();
        let started = Instant::now();
        // client-go's candidate "x": every retry period, a renewal of the
        // record it reads, with its own renewTime.
        let go = {
            let fake = fake.clone();
            tokio::spawn(async move {
                loop {
                    sleep(MS(1300)).await;
                    let mut lease = fake.lease().unwrap();
                    let spec = lease.spec.as_mut().unwrap();
                    assert_eq!(spec.holder_identity.as_deref(), Some("x"));
                    let now = k8s_openapi::jiff::Timestamp::now()
                        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(3600))
                        .unwrap();
                    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now));
                    fake.put(lease);
                }
            })
        };
        let ended = timeout(S(60), guard).await;
        go.abort();
        assert!(
            ended.is_ok(),
            "our term still holds {:?} after a client-go process with our identity began renewing our \
             record: both lead",
            started.elapsed()
        );
    });
}

/// The same rule on the other path into a held term: a candidate that
/// created the Lease after a 40 s record was deleted holds it, writing
/// `leaseDurationSeconds` 40; its `acquire` is dropped during the hold (no
/// release: the hold is never written free) and a new one campaigns again.
/// The record is its own term's, so `try_acquire` takes it back at once
/// (`Verdict::Take`), and `hold_for` keeps the hold (`Memory::hold`), but the
/// write carries the configured 15 s, not the 30-odd seconds left of the
/// hold: a candidate that never saw the deleted record then waits 15 s only.
#[test]
fn campaigning_again_during_the_creation_hold_writes_a_duration_covering_the_hold() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(held_by("go", 40));
        let (a, _) = elector(&fake, config("a"));
        let mut acquire = Box::pin(a.acquire());
        assert!(timeout(S(1), &mut acquire).await.is_err(), "a saw go's record");
        fake.delete();
        let deleted = Instant::now();
        sleep(MS(10)).await;
        assert_eq!(holder(&fake).as_deref(), Some("a"), "re-created");
        assert_eq!(spec(&fake).lease_duration_seconds, Some(40));
        let acquired_at = spec(&fake).acquire_time;
        // Given up during the hold (no release), then wanted again.
        drop(acquire);
        sleep(MS(500)).await;
        let mut again = pin!(a.acquire());
        while spec(&fake).acquire_time == acquired_at {
            assert!(timeout(MS(10), &mut again).await.is_err(), "a does not lead during the hold");
            assert!(
                deleted.elapsed() < S(10),
                "a did not campaign again: {:?}",
                fake.requests().iter().map(|r| (r.at - deleted, r.verb)).collect::<Vec<_>>()
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
