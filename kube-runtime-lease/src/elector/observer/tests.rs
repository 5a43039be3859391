use std::sync::{
    Arc, Mutex,
    atomic::{AtomicUsize, Ordering},
};

use super::{Observer, Observers, Transition};

/// Counts the transitions it is told.
struct Counting(Arc<AtomicUsize>);

impl Observer for Counting {
    fn observe(&self, _: Transition<'_>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Another type of observer, counting too.
struct Other(Arc<AtomicUsize>);

impl Observer for Other {
    fn observe(&self, _: Transition<'_>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// One observer of each type, the first one added: a second of the same
/// type is not added and never told, one of another type is; every
/// observer added is told of
/// every transition once.
#[test]
fn one_observer_of_each_type_is_added_and_each_is_told_once() {
    let (first, second, other) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let observers = Observers::default();
    assert!(observers.add(Counting(first.clone())), "the first observer");
    assert!(
        !observers.add(Counting(second.clone())),
        "a second of the same type"
    );
    assert!(observers.add(Other(other.clone())), "one of another type");
    observers.tell(Transition::Leading(true));
    // The first look at the Lease is no change of holder; later ones are.
    observers.tell(Transition::HolderChanged);
    observers.looked();
    observers.tell(Transition::HolderChanged);
    assert_eq!(first.load(Ordering::SeqCst), 2);
    assert_eq!(
        second.load(Ordering::SeqCst),
        0,
        "the observer not added was told"
    );
    assert_eq!(other.load(Ordering::SeqCst), 2);
}

/// Asks for a guard of the term in force when told that the term ends (as
/// another thread may, between `demand_for_term` and `end_term`), and keeps
/// whatever it got.
struct AskingAtTheEnd {
    elector: Mutex<Option<crate::LeaderElector>>,
    /// Whether it asked, and the guard it got.
    got: Arc<Mutex<(bool, Option<crate::LeaseGuard>)>>,
}

impl Observer for AskingAtTheEnd {
    fn observe(&self, transition: Transition<'_>) {
        if let Transition::Leading(false) = transition
            && let Some(e) = self.elector.lock().unwrap().take()
        {
            *self.got.lock().unwrap() = (true, e.current_guard());
        }
    }
}

/// Nobody wants the term: `demand_for_term` takes it out of the state in the
/// step that gives it up, so that no guard of it is handed out from then on.
/// A `current_guard` (or `acquire`) between that step and `end_term` (on a
/// multi-threaded runtime, another thread's; here an observer told the end)
/// would get a guard of a term given up a moment later: it resolves at once
/// with `GivenUp`, and, alive at the end, it keeps the Lease from its
/// release. Kills `demand_for_term`'s removal skipped.
#[test]
fn no_guard_is_handed_out_as_the_term_is_given_up() {
    crate::tests::support::paused(async {
        let fake = crate::tests::support::free();
        let (e, _) = crate::tests::support::elector(&fake, crate::tests::support::config("me"));
        let got = Arc::new(Mutex::new((false, None)));
        let asking = AskingAtTheEnd {
            elector: Mutex::new(Some(e.clone())),
            got: got.clone(),
        };
        assert!(e.inner.observers.add(asking));
        drop(e.acquire().await.unwrap());
        tokio::time::timeout(std::time::Duration::from_secs(60), async {
            while !got.lock().unwrap().0 {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("the term ended");
        let guard = got.lock().unwrap().1.take();
        assert!(
            guard.is_none(),
            "a guard of the term being given up was handed out: {:?}",
            guard.as_ref().map(crate::LeaseGuard::lost)
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(
            crate::tests::support::holder(&fake).as_deref(),
            Some(""),
            "released"
        );
    });
}
