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
    /// A term on the Lease object `uid` began (the election is on); `sent`:
    /// the instant before its last successful write was sent (the one that
    /// won it, or the last renewal of its creation hold).
    TermBegan { uid: Option<&'a str>, sent: Instant },
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
/// added (so that one added twice does not count twice), and the last state
/// told ([`Transition::Leading`], [`Transition::Coordinated`]), which an
/// observer added later is told first: it starts at the truth.
#[derive(Default)]
pub(crate) struct Observers(pub(super) RwLock<Told>);

#[derive(Default)]
pub(super) struct Told {
    all: Vec<(TypeId, Arc<dyn Observer>)>,
    pub(super) leading: Option<bool>,
    pub(super) coordinated: Option<bool>,
    /// The Lease was looked at: a change of holder is one from then on (a
    /// replica's first look at a held Lease is none).
    looked: bool,
}

impl Observers {
    /// Adds `observer` unless one of its type is there already, telling it
    /// the last state told; whether it was added.
    pub(crate) fn add<O: Observer>(&self, observer: O) -> bool {
        let mut told = self.0.write();
        if told.all.iter().any(|(t, _)| *t == TypeId::of::<O>()) {
            return false;
        }
        // Under the lock that the changes of state are told under: none is
        // told between this and the observer's first transition.
        if let Some(leading) = told.leading {
            observer.observe(Transition::Leading(leading));
        }
        if let Some(coordinated) = told.coordinated {
            observer.observe(Transition::Coordinated(coordinated));
        }
        told.all.push((TypeId::of::<O>(), Arc::new(observer)));
        true
    }

    /// Tells every observer of `transition`, under the write lock: a change
    /// of state is remembered and told under it, so that an observer being
    /// added sees it either in the replay or told, not missed or reordered.
    pub(crate) fn tell(&self, transition: Transition<'_>) {
        let mut told = self.0.write();
        match transition {
            Transition::HolderChanged if !told.looked => return,
            Transition::Leading(leading) => told.leading = Some(leading),
            Transition::Coordinated(coordinated) => told.coordinated = Some(coordinated),
            _ => {}
        }
        for (_, observer) in &told.all {
            observer.observe(transition);
        }
    }

    /// The Lease was looked at (read, written or delivered): the changes of
    /// holder told from now on are changes.
    pub(crate) fn looked(&self) {
        if !self.0.read().looked {
            self.0.write().looked = true;
        }
    }
}

#[cfg(test)]
mod tests;
