//! The public API used wrongly or at its extremes: every misuse has a
//! defined outcome, and none panics the library.

use std::{panic::AssertUnwindSafe, time::Duration};

use tokio::time::Instant;

use super::{
    runtime::paused_runtime,
    support::{config, elector, free},
};

/// A Tokio runtime built without `enable_time` (or `enable_all`): a guard
/// moved to it, or a term's `lost_signal` awaited on it.
fn timerless_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().unwrap()
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "<non-string panic>".to_owned())
}

/// An `acquire` first polled on a runtime without timers spawns the
/// election task there: the task cannot run (every wait of it needs a
/// timer). The outcome must be defined: an error, not a hang or a panic
/// in the caller.
#[test]
fn an_acquire_on_a_runtime_without_timers_has_a_defined_outcome() {
    let fake = free();
    let (e, _) = paused_runtime().block_on(async { elector(&fake, config("me")) });
    let (tx, rx) = std::sync::mpsc::channel();
    let e2 = e.clone();
    std::thread::spawn(move || {
        let bare = timerless_runtime();
        let got = std::panic::catch_unwind(AssertUnwindSafe(|| bare.block_on(e2.acquire()).map(|_| ())))
            .map_err(|p| panic_message(&*p));
        let _ = tx.send(got);
    });
    // A real-time bound on a wait that must end at once (no timer can run).
    let got = rx.recv_timeout(Duration::from_secs(20));
    assert!(
        matches!(got, Ok(Ok(Err(crate::AcquireError::ElectorStopped)))),
        "an acquire on a runtime without timers: {got:?}"
    );
}

/// Every timing `validate` accepts runs: the longest (`leaseDuration` at
/// `i32::MAX` seconds, a renew deadline one second short of it, and every
/// other duration at its limit) and the shortest. A Lease free, then missing
/// (the creation hold), each for a while, then shut down: no panic, no hang.
#[test]
fn the_extreme_timings_validate_accepts_run_without_panicking() {
    use super::support::holder;
    use crate::config::MAX_DURATION;
    let s = Duration::from_secs;
    let below = MAX_DURATION.saturating_sub(s(1));
    let extremes = [
        config("me")
            .lease_duration(MAX_DURATION)
            .renew_deadline(below)
            .retry_period(s(1))
            .release_timeout(MAX_DURATION),
        config("me")
            .lease_duration(MAX_DURATION)
            .renew_deadline(below)
            .retry_period(below.div_f64(1.21))
            .release_timeout(MAX_DURATION),
        config("me")
            .lease_duration(s(1))
            .renew_deadline(Duration::from_millis(999))
            .retry_period(Duration::from_millis(800))
            .release_timeout(Duration::from_nanos(1)),
    ];
    for (i, c) in extremes.into_iter().enumerate() {
        assert_eq!(c.validate(), Ok(()), "{i}");
        for missing in [false, true] {
            super::support::paused(async {
                let fake = if missing {
                    crate::test_util::FakeLeaseApi::default()
                } else {
                    free()
                };
                let (e, _) = elector(&fake, c.clone());
                let got = tokio::time::timeout(s(60), e.acquire()).await;
                if missing {
                    drop(got);
                } else {
                    let guard = got.expect("a free Lease is taken").unwrap();
                    tokio::time::sleep(s(30)).await;
                    assert!(guard.is_valid(), "{i}: lost {:?}", guard.lost());
                    let _ = guard.time_left();
                    let _ = e.health_check(Duration::MAX);
                    let _ = e.contact_check(Duration::ZERO);
                    drop(guard);
                }
                let t = Instant::now();
                let budget = c.shutdown_budget(Duration::ZERO);
                let done = tokio::time::timeout(s(600), e.shutdown(Duration::MAX)).await;
                assert!(
                    done.is_ok(),
                    "{i} (missing {missing}): shutdown hangs with no guard alive"
                );
                assert!(
                    t.elapsed() <= budget,
                    "{i}: shutdown took {:?} > {budget:?}",
                    t.elapsed()
                );
                let _ = holder(&fake);
            });
        }
    }
}

/// Two shutdowns at once, and a third after them: each returns once the
/// Lease is released (within the grace the guard took), none hangs or
/// fails; after them every call answers "shut down" at once.
#[test]
fn concurrent_and_repeated_shutdowns_each_return_after_the_release() {
    use super::support::holder;
    let secs = Duration::from_secs;
    super::support::paused(async {
        let fake = free();
        let (candidate, _) = elector(&fake, config("me"));
        let guard = candidate.acquire().await.unwrap();
        let since = Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(secs(1)).await;
            drop(guard);
        });
        let (first, second) = tokio::join!(candidate.shutdown(secs(5)), candidate.shutdown(secs(5)));
        assert!(first.is_ok() && second.is_ok(), "{first:?} {second:?}");
        assert_eq!(
            since.elapsed(),
            secs(1),
            "both shutdowns return once the guard is gone"
        );
        assert_eq!(holder(&fake).as_deref(), Some(""), "released");
        let since = Instant::now();
        let third = candidate.shutdown(secs(5)).await;
        assert!(third.is_ok(), "{third:?}");
        assert_eq!(since.elapsed(), Duration::ZERO);
        assert!(matches!(
            candidate.acquire().await,
            Err(crate::AcquireError::Shutdown)
        ));
        assert_eq!(candidate.with_lease(async {}).await, Err(crate::Lost::Shutdown));
        assert!(candidate.current_guard().is_none());
        assert!(!candidate.is_leader());
        let ended = candidate.run_each_term(futures::stream::pending::<()>).await;
        assert_eq!(ended, crate::RunEnded::Shutdown);
        assert_eq!(since.elapsed(), Duration::ZERO);
        assert_eq!(holder(&fake).as_deref(), Some(""), "no write after the shutdown");
    });
}

/// Configured annotations that fill the API server's 256 KiB on their own
/// leave no room for the fencing token's annotation, on every write of
/// every term: `validate` accepts them, and every term is then taken
/// without its token stored (tokens may repeat across processes, for good).
/// A configuration that can never store the token is refused before any
/// API call, like one over the limit.
#[cfg(feature = "lease-metadata")]
#[test]
fn configured_annotations_that_leave_no_room_for_the_fencing_token_are_refused() {
    let key = "example.com/big";
    let full = config("me").annotation(key, "x".repeat(256 * 1024 - key.len()));
    let validated = full.validate();
    let stored = if validated.is_ok() {
        let fake = free();
        super::support::paused(async {
            let (e, _) = elector(&fake, full.clone());
            let guard = e.acquire().await.unwrap();
            let token = guard.fencing_token();
            drop(guard);
            e.shutdown(Duration::from_secs(1)).await.unwrap();
            eprintln!("token {token}");
        });
        let annotations = fake
            .lease()
            .and_then(|l| l.metadata.annotations)
            .unwrap_or_default();
        Some(annotations.contains_key(crate::record::TOKEN_ANNOTATION))
    } else {
        None
    };
    assert!(
        matches!(validated, Err(crate::ConfigError::InvalidAnnotation { .. })),
        "annotations of 256 KiB validate as {validated:?}; the term's token stored on the Lease: {stored:?}"
    );
}

/// `ShardConfig` at its extremes: no shards and a base name too long for the
/// label that finds the Leases are typed errors before any API call; 65535
/// shards and a 63-character base name are accepted, and the shard of any
/// UID is one of them.
#[cfg(feature = "unstable-shards")]
#[test]
fn shard_configs_at_their_extremes() {
    use crate::shard::{ShardConfig, ShardedElector};
    let fake = free();
    let (client, _) = paused_runtime().block_on(async { fake.client() });
    let lease = |name: &str| crate::LeaseConfig::new("default", name, "me");
    let new = |name: &str, shards| ShardedElector::new(client.clone(), ShardConfig::new(lease(name), shards));
    assert!(matches!(new("base", 0), Err(crate::ConfigError::NoShards)));
    let long = new(&"a".repeat(64), 1);
    assert!(long.is_err(), "a 64-character base name: {:?}", long.map(|_| ()));
    let max = new(&"a".repeat(63), u16::MAX).expect("65535 shards, 63 characters");
    assert!(max.shard_of("") < u16::MAX && max.shard_of(&"\u{10ffff}".repeat(1000)) < u16::MAX);
    assert!(max.guard(u16::MAX).is_none() && max.guard(0).is_none());
    assert!(!max.owns_uid("x"));
    assert_eq!(max.status().len(), usize::from(u16::MAX));
}

/// The test kit given a client index it never handed out (`fault`,
/// `partition`, `set_latency`, `set_watch_latency`, `forbid_watch`,
/// `allow_watch`): a panic that
/// says what was wrong, as its docs say, not an index out of bounds from
/// inside the double.
#[test]
fn the_test_kit_names_an_unknown_client() {
    use crate::test_util::{FakeLeaseApi, Fault};
    type Call = Box<dyn Fn(&FakeLeaseApi)>;
    let fake = FakeLeaseApi::default();
    let calls: [(&str, Call); 6] = [
        ("fault", Box::new(|f| f.fault(3, None, Fault::Status(500)))),
        ("partition", Box::new(|f| f.partition(3, true))),
        (
            "set_latency",
            Box::new(|f| f.set_latency(3, Duration::from_secs(1))),
        ),
        (
            "set_watch_latency",
            Box::new(|f| f.set_watch_latency(3, Duration::from_secs(1))),
        ),
        ("forbid_watch", Box::new(|f| f.forbid_watch(3))),
        ("allow_watch", Box::new(|f| f.allow_watch(3))),
    ];
    for (name, call) in calls {
        let got = std::panic::catch_unwind(AssertUnwindSafe(|| call(&fake))).map_err(|p| panic_message(&*p));
        assert!(
            matches!(&got, Err(m) if m.contains("client 3")),
            "{name} with a client index never handed out: {got:?}"
        );
    }
}
