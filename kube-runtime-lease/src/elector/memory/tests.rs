use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use tokio::time::Instant;

use super::Memory;

fn written(version: &str, renewed: i64, seconds: i32) -> Lease {
    let mut lease = Lease::default();
    lease.metadata.uid = Some("uid".into());
    lease.metadata.resource_version = Some(version.into());
    lease.spec = Some(LeaseSpec {
        holder_identity: Some("a".into()),
        lease_duration_seconds: Some(seconds),
        renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
        ..LeaseSpec::default()
    });
    lease
}

/// The longest duration seen since the holder last wrote: an edit of its
/// write (the same `renewTime`) keeps the longer, a newer write sets its
/// own. Newer is a larger resourceVersion with another `renewTime` where
/// versions are numbers (whatever the clocks that wrote them), a later
/// `renewTime` where they are not.
#[test]
fn an_edit_keeps_the_longest_duration_and_a_newer_write_sets_its_own() {
    let (now, fallback, secs) = (Instant::now(), Duration::from_secs(15), Duration::from_secs);
    for versions in [["1", "2", "3"], ["x", "y", "z"]] {
        let mut memory = Memory::default();
        memory.saw(Some(&written(versions[0], 100, 60)), fallback, now);
        memory.saw(Some(&written(versions[1], 100, 15)), fallback, now);
        assert_eq!(memory.seen.longest, secs(60), "an edit, versions {versions:?}");
        memory.saw(Some(&written(versions[2], 101, 15)), fallback, now);
        assert_eq!(
            memory.seen.longest,
            secs(15),
            "a newer write, versions {versions:?}"
        );
    }
    // A newer version written by a clock behind the last one's.
    let mut memory = Memory::default();
    memory.saw(Some(&written("1", 100, 60)), fallback, now);
    memory.saw(Some(&written("2", 40, 15)), fallback, now);
    assert_eq!(memory.seen.longest, secs(15));
}

/// The count written is one more than the largest seen, never negative and
/// never `i32::MAX`: a client-go takeover adds one to it as an int32, so a
/// record at `i32::MAX` (written, or once seen and remembered) would have
/// every client-go takeover refused. At the top it starts again at 0.
#[test]
fn transitions_stay_where_client_go_can_count_on_from() {
    let mut memory = Memory::default();
    assert_eq!(memory.next_transitions(None), 0);
    assert_eq!(memory.next_transitions(Some(-5)), 0);
    assert_eq!(memory.next_transitions(Some(7)), 8);
    assert_eq!(memory.next_transitions(Some(i32::MAX - 2)), i32::MAX - 1);
    assert_eq!(memory.next_transitions(Some(i32::MAX - 1)), 0);
    assert_eq!(memory.next_transitions(Some(i32::MAX)), 0);
    // Once seen on the name, an edit down (an admin's fix) is not undone.
    memory.max_transitions = Some(i32::MAX);
    assert_eq!(memory.next_transitions(Some(1)), 0);
    memory.max_transitions = Some(9);
    assert_eq!(memory.next_transitions(Some(1)), 10);
}
