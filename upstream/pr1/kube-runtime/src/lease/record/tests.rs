use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::LeaseSpec,
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::{SignedDuration, Timestamp},
};
use tokio::time::Instant;

use super::{Observed, Verdict, released, renewed, taken};

const FALLBACK: Duration = Duration::from_secs(15);

fn held_by(holder: &str) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(15),
        lease_transitions: Some(4),
        preferred_holder: Some("c".into()),
        // Far in the past: expiry never reads it.
        renew_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
        ..LeaseSpec::default()
    }
}

#[test]
fn take_renew_and_release_write_client_gos_records() {
    let now = Timestamp::UNIX_EPOCH + SignedDuration::from_secs(100);
    let took = taken(Some(&held_by("a")), "b", 15, 5, now);
    assert_eq!(
        (took.holder_identity.as_deref(), took.lease_transitions),
        (Some("b"), Some(5))
    );
    assert_eq!(
        (&took.acquire_time, &took.renew_time),
        (&Some(MicroTime(now)), &Some(MicroTime(now)))
    );
    assert_eq!(took.preferred_holder.as_deref(), Some("c"), "never cleared");

    // Renewals move renewTime only, and always forward, even on a clock stepped back.
    let later = renewed(&took, 15, now + SignedDuration::from_secs(2));
    assert_eq!(
        (&later.acquire_time, later.lease_transitions),
        (&took.acquire_time, Some(5))
    );
    assert!(later.renew_time > took.renew_time);
    assert!(renewed(&later, 15, now).renew_time > later.renew_time);

    let free = released(&later, now);
    assert_eq!(free.holder_identity.as_deref(), Some(""));
    assert_eq!(
        (free.lease_duration_seconds, free.lease_transitions),
        (Some(1), Some(5))
    );
}

#[tokio::test(start_paused = true)]
async fn another_holders_record_is_taken_only_after_lease_duration_unchanged() {
    let (start, second) = (Instant::now(), Duration::from_secs(1));
    let expiry = start + 15 * second;
    let seen = Observed::update(None, held_by("a"), start);
    assert_eq!(seen.verdict("b", FALLBACK, start), Verdict::WaitUntil(expiry));

    // Seen again unchanged: the clock goes on.
    let again = Observed::update(Some(seen), held_by("a"), start + 10 * second);
    assert_eq!(
        again.verdict("b", FALLBACK, expiry - second),
        Verdict::WaitUntil(expiry)
    );
    assert_eq!(again.verdict("b", FALLBACK, expiry), Verdict::Take);

    // Renewed: the clock starts again.
    let mut renewal = held_by("a");
    renewal.renew_time = Some(MicroTime(Timestamp::UNIX_EPOCH + SignedDuration::from_secs(1)));
    let changed = Observed::update(Some(again), renewal, expiry);
    assert_eq!(
        changed.verdict("b", FALLBACK, expiry),
        Verdict::WaitUntil(expiry + FALLBACK)
    );
}

#[tokio::test(start_paused = true)]
async fn free_and_own_records_are_taken_at_once() {
    let now = Instant::now();
    let verdict = |spec| Observed::update(None, spec, now).verdict("b", FALLBACK, now);
    for spec in [LeaseSpec::default(), held_by(""), held_by("b")] {
        assert_eq!(verdict(spec), Verdict::Take);
    }
    // No duration on the record: ours is used, never zero.
    let mut bare = held_by("a");
    bare.lease_duration_seconds = None;
    assert_eq!(verdict(bare), Verdict::WaitUntil(now + FALLBACK));
}
