use std::time::Duration;

use tokio::time::{sleep, timeout};

use super::LeaseObserver;
use crate::{
    ConfigError,
    test_util::FakeLeaseApi,
    tests::support::{config, elector, paused},
};

const S: fn(u64) -> Duration = Duration::from_secs;

/// An observer follows the holder through a creation, a takeover, a release
/// and a deletion, and never writes to the Lease.
#[test]
fn an_observer_follows_the_holder_and_never_writes() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (client, observer_id) = fake.client();
        let observer = LeaseObserver::new(client, "default", "lease").unwrap();
        let mut status = observer.subscribe();
        sleep(S(1)).await;
        assert_eq!(observer.status().holder, None, "no Lease yet");
        let (a, _) = elector(&fake, config("a"));
        let guard = a.acquire().await.unwrap();
        timeout(S(5), status.wait_for(|s| s.holder.as_deref() == Some("a")))
            .await
            .expect("sees a")
            .unwrap();
        assert!(!observer.status().is_leader);
        fake.take_over("b");
        timeout(S(5), status.wait_for(|s| s.holder.as_deref() == Some("b")))
            .await
            .expect("sees the takeover")
            .unwrap();
        drop(guard);
        let transitions = observer.status().transitions;
        assert!(transitions.is_some());
        fake.delete();
        timeout(
            S(5),
            status.wait_for(|s| s.holder.is_none() && s.transitions.is_none()),
        )
        .await
        .expect("sees the deletion")
        .unwrap();
        let writes = fake
            .requests()
            .iter()
            .filter(|r| r.client == observer_id && matches!(r.verb, "create" | "update" | "delete"))
            .count();
        assert_eq!(writes, 0, "an observer never writes");
    });
}

/// A watch that fails (a partition) recovers, and the status catches up.
#[test]
fn an_observer_catches_up_after_its_watch_fails() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = elector(&fake, config("a"));
        let _guard = a.acquire().await.unwrap();
        let (client, id) = fake.client();
        let observer = LeaseObserver::new(client, "default", "lease").unwrap();
        let mut status = observer.subscribe();
        timeout(S(5), status.wait_for(|s| s.holder.as_deref() == Some("a")))
            .await
            .expect("sees a")
            .unwrap();
        fake.partition(id, true);
        fake.take_over("c");
        sleep(S(5)).await;
        assert_eq!(observer.status().holder.as_deref(), Some("a"), "cut off");
        fake.partition(id, false);
        timeout(S(60), status.wait_for(|s| s.holder.as_deref() == Some("c")))
            .await
            .expect("catches up once the watch is back")
            .unwrap();
    });
}

/// Invalid names are refused before any API call.
#[test]
fn an_observer_of_an_invalid_name_is_an_error() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (client, _) = fake.client();
        assert!(matches!(
            LeaseObserver::new(client.clone(), "Bad_NS", "lease"),
            Err(ConfigError::InvalidNamespace { .. })
        ));
        assert!(matches!(
            LeaseObserver::new(client, "default", "Not A Name"),
            Err(ConfigError::InvalidName { .. })
        ));
        assert!(fake.requests().is_empty());
    });
}

/// A watch that stalls (open and silent: a dead connection behind a proxy,
/// which neither ends nor fails) must not leave the status on a holder
/// long gone: a held record is renewed well within its lease duration, so
/// a silence that long is checked with a read, and a takeover the watch
/// missed is reported within about two of the record's lease durations.
#[test]
fn an_observer_whose_watch_stalls_still_reports_the_takeover() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = elector(&fake, config("a"));
        let _guard = a.acquire().await.unwrap();
        let (client, id) = fake.client();
        let observer = LeaseObserver::new(client, "default", "lease").unwrap();
        let mut status = observer.subscribe();
        timeout(S(5), status.wait_for(|s| s.holder.as_deref() == Some("a")))
            .await
            .expect("sees a")
            .unwrap();
        fake.stall_watches(id);
        sleep(S(3)).await;
        fake.take_over("c");
        let duration = fake
            .lease()
            .and_then(|l| l.spec?.lease_duration_seconds)
            .expect("a duration");
        let bound = S(2 * u64::try_from(duration).unwrap());
        timeout(bound, status.wait_for(|s| s.holder.as_deref() == Some("c")))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the observer still reports {:?} {bound:?} after c took the Lease over (its watch stalled)",
                    observer.status().holder
                )
            })
            .unwrap();
    });
}

/// The double's lagging watch (`set_watch_latency`): an observer behind
/// one reports a takeover as late as its watch delivers it, not before,
/// and not much after.
#[test]
fn an_observer_behind_a_lagging_watch_reports_as_late_as_it_delivers() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (a, _) = elector(&fake, config("a"));
        let _guard = a.acquire().await.unwrap();
        let (client, id) = fake.client();
        fake.set_watch_latency(id, S(3));
        let observer = LeaseObserver::new(client, "default", "lease").unwrap();
        let mut status = observer.subscribe();
        timeout(S(5), status.wait_for(|s| s.holder.as_deref() == Some("a")))
            .await
            .expect("sees a")
            .unwrap();
        fake.take_over("c");
        let taken = tokio::time::Instant::now();
        timeout(S(5), status.wait_for(|s| s.holder.as_deref() == Some("c")))
            .await
            .expect("sees c")
            .unwrap();
        let after = taken.elapsed();
        assert!(
            after >= S(3) && after < S(4),
            "c reported {after:?} after the takeover, behind a watch 3 s late"
        );
    });
}
