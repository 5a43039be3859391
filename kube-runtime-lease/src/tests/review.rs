//! Failing-first tests of a review of the core against client-go's
//! candidates and Leases edited by others (2026-12-05, second round).
//! <!-- upstream: omit -->
//! `docs/regressions.md` lists them in section 17.
//! <!-- upstream: end -->

use std::{pin::pin, time::Duration};

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::{SignedDuration, Timestamp},
};
use tokio::time::{Instant, sleep, timeout};

use crate::{
    Lost,
    test_util::FakeLeaseApi,
    tests::support::{config, elector, free, paused},
};

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

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
            let Some(mut lease) = fake.lease() else { continue };
            let spec = lease.spec.as_mut().unwrap();
            if spec.holder_identity.as_deref() != Some(identity) {
                continue;
            }
            let now = Timestamp::now()
                .checked_add(SignedDuration::from_secs(3600))
                .unwrap();
            spec.renew_time = Some(MicroTime(now));
            fake.put(lease);
        }
    })
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
        let mut lease = crate::tests::support::held_by("", 1);
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
        assert_eq!(
            crate::tests::support::spec(&fake).lease_duration_seconds,
            Some(15)
        );
        assert!(a_guard.is_valid());
        fake.delete();
        let deleted = Instant::now();
        assert_eq!(
            timeout(S(5), a_guard).await.expect("a's term ended"),
            Lost::Deleted
        );
        let mut a_acquire = pin!(a.acquire());
        let led = timeout(S(60), async {
            tokio::select! {
                g = &mut a_acquire => g.map(|_| "a"),
                g = &mut b_acquire => g.map(|_| "b"),
            }
        })
        .await;
        assert!(
            matches!(led, Ok(Ok(_))),
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
