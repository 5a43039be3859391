//! Review findings: each test shows a fault on the current code (see the
//! review report). Written failing-first; none is fixed here.

use std::time::Duration;

use tokio::time::timeout;

use crate::{
    record,
    tests::support::{config, elector, free, paused},
};

const S: fn(u64) -> Duration = Duration::from_secs;

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
