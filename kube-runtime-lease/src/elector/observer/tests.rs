use std::sync::{
    Arc,
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
