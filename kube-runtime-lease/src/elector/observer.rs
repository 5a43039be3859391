//! The seam between the election and what reports on it from outside the
//! election: the election tells its observers of
//! every [`Transition`], and the core names no observer.

use std::{any::TypeId, sync::Arc, time::Duration};

use parking_lot::RwLock;
use tokio::time::Instant;

use crate::term::Lost;

/// What the election tells its observers.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code, reason = "read by the extras' observers: metrics and Events")]
pub(crate) enum Transition<'a> {
    /// Whether this candidate leads now: `true` when a term begins (also with
    /// the election switched off), `false` when it ends or can no longer
    /// hold (shutdown begun, the task stopped).
    Leading(bool),
    /// A term on the Lease object `uid` began (the election is on).
    TermBegan { uid: Option<&'a str> },
    /// A term that had begun on the Lease object `uid` ended, for `reason`.
    TermEnded { reason: &'a Lost, uid: Option<&'a str> },
    /// A renewal write: its outcome (`success`, `late`, `conflict`,
    /// `not_found`, `error`), how long it took, and the instant before it was
    /// sent.
    Renewal {
        outcome: &'static str,
        latency: Duration,
        sent: Instant,
    },
    /// The holder this candidate sees on the Lease changed.
    HolderChanged,
    /// Which election is in force: Coordinated Leader Election (`true`) or
    /// the ordinary one.
    Coordinated(bool),
}

/// Reports on the election, told of every [`Transition`]. Called from the
/// election task with no lock held: it must not block.
pub(crate) trait Observer: Send + Sync + 'static {
    fn observe(&self, transition: Transition<'_>);
}

/// The observers of one elector: at most one of each type, the first one
/// added (so that one added twice does not count twice).
#[derive(Default)]
pub(crate) struct Observers(RwLock<Vec<(TypeId, Arc<dyn Observer>)>>);

impl Observers {
    /// Adds `observer` unless one of its type is there already; whether it
    /// was added.
    pub(crate) fn add<O: Observer>(&self, observer: O) -> bool {
        let mut all = self.0.write();
        if all.iter().any(|(t, _)| *t == TypeId::of::<O>()) {
            return false;
        }
        all.push((TypeId::of::<O>(), Arc::new(observer)));
        true
    }

    /// Tells every observer of `transition`.
    pub(crate) fn tell(&self, transition: Transition<'_>) {
        for (_, observer) in self.0.read().iter() {
            observer.observe(transition);
        }
    }
}

#[cfg(test)]
mod tests;
