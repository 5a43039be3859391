//! `LeaderElector::contact_check`: a standby that has not heard from the API
//! server for too long fails its liveness probe.

use std::{pin::pin, time::Duration};

use tokio::time::{sleep, timeout};

use crate::{
    HealthError,
    test_util::{FakeLeaseApi, Fault},
    tests::support::{config, elector, free, paused},
};

const S: fn(u64) -> Duration = Duration::from_secs;
const LIMIT: Duration = Duration::from_secs(10);

/// A watching standby hears the leader's renewals, and a leader its own
/// answers: both healthy. A standby cut off from the API server fails once
/// the limit has passed, and is healthy again once it is answered.
#[test]
fn a_standby_cut_off_from_the_api_server_fails_its_contact_check() {
    paused(async {
        let fake = free();
        let (a, _) = elector(&fake, config("a"));
        let (b, b_id) = elector(&fake, config("b"));
        let _a_guard = a.acquire().await.unwrap();
        let mut b_acquire = pin!(b.acquire());
        assert!(timeout(S(60), &mut b_acquire).await.is_err(), "a keeps leading");
        assert_eq!(a.contact_check(LIMIT), Ok(()), "the leader hears its answers");
        assert_eq!(b.contact_check(LIMIT), Ok(()), "the standby hears a's renewals");
        fake.partition(b_id, true);
        // The last renewal it heard was at most a retry period (2 s) before.
        assert!(timeout(S(7), &mut b_acquire).await.is_err());
        assert_eq!(b.contact_check(LIMIT), Ok(()), "within the limit");
        assert!(timeout(S(5), &mut b_acquire).await.is_err());
        match b.contact_check(LIMIT) {
            Err(HealthError::ApiSilent { since, limit }) => {
                assert!(since > LIMIT && since <= S(14), "{since:?}");
                assert_eq!(limit, LIMIT);
            }
            other => panic!("a standby cut off for 12 s: {other:?}"),
        }
        assert_eq!(
            a.health_check(S(20)),
            Ok(()),
            "the leader's own checks are unaffected"
        );
        fake.partition(b_id, false);
        let healthy = timeout(S(60), async {
            while b.contact_check(LIMIT).is_err() {
                let _ = timeout(Duration::from_millis(100), &mut b_acquire).await;
            }
        })
        .await;
        assert!(healthy.is_ok(), "healthy again once the API server answers");
    });
}

/// Nobody wants leadership (no election task, or none any more), or the
/// election is off: nothing to hear, healthy. A task that has never been
/// answered counts its silence from its own start, and fails only once it
/// is over the limit.
#[test]
fn the_contact_check_counts_only_while_the_election_runs() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (idle, _) = elector(&fake, config("idle"));
        sleep(S(60)).await;
        assert_eq!(idle.contact_check(LIMIT), Ok(()), "no election task: healthy");
        let led = free();
        let (ended, _) = elector(&led, config("ended"));
        drop(ended.acquire().await.unwrap());
        sleep(S(60)).await;
        let check = ended.contact_check(LIMIT);
        assert_eq!(check, Ok(()), "its task ended about 60 s ago: healthy");
        let (off, _) = elector(&fake, config("off").enabled(false));
        let _guard = off.acquire().await.unwrap();
        sleep(S(60)).await;
        assert_eq!(off.contact_check(LIMIT), Ok(()), "election off: healthy");
        let (cut, id) = elector(&fake, config("cut"));
        fake.partition(id, true);
        let mut acquire = pin!(cut.acquire());
        assert!(timeout(S(5), &mut acquire).await.is_err());
        assert_eq!(cut.contact_check(LIMIT), Ok(()), "5 s since its task started");
        assert!(timeout(S(5), &mut acquire).await.is_err());
        let at_limit = cut.contact_check(LIMIT);
        assert_eq!(at_limit, Ok(()), "exactly the limit since its task started");
        assert!(timeout(Duration::from_millis(1), &mut acquire).await.is_err());
        let check = cut.contact_check(LIMIT);
        assert!(
            matches!(check, Err(HealthError::ApiSilent { .. })),
            "never answered, 1 ms over the limit since its task started: {check:?}, {:?}",
            cut.status()
        );
    });
}

/// An answer of the API server's own counts as contact, an error `Status`
/// too (a 403 from missing RBAC: the API server is there, and restarting the
/// candidate would not help); a 5xx does not (it may come from a proxy in
/// front of an API server that is gone).
#[test]
fn a_refusal_from_the_api_server_is_contact_and_a_5xx_is_not() {
    paused(async {
        let fake = FakeLeaseApi::default();
        for (status, heard) in [(403, true), (500, false)] {
            let (candidate, id) = elector(&fake, config(&format!("c{status}")));
            for _ in 0..200 {
                fake.fault(id, None, Fault::Status(status));
            }
            let mut acquire = pin!(candidate.acquire());
            assert!(timeout(S(30), &mut acquire).await.is_err(), "{status}: led");
            let check = candidate.contact_check(LIMIT);
            assert_eq!(check.is_ok(), heard, "{status} for 30 s: {check:?}");
        }
    });
}
