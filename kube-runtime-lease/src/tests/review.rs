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
