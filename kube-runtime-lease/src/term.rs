//! [`Term`]: one term of leadership, the state its guards, its guarded
//! streams and the elector task share: the renew deadline (readable without a
//! lock), why it ended ([`Lost`]), and whether guarded work was stopped rather
//! than finished.

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::channel::oneshot;
use parking_lot::Mutex;
use tokio::{sync::Notify, time::Instant};

/// Why leadership ended. The output of [`LeaseGuard`](crate::LeaseGuard).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Lost {
    /// No renewal succeeded within the renew deadline (counted from the
    /// instant before the last successful renewal was sent).
    #[error("leadership lost: the lease was not renewed within the renew deadline")]
    RenewDeadlineExceeded,
    /// Another candidate holds the Lease, or someone else wrote it free.
    #[error("leadership lost: {}", taken_over(.holder))]
    TakenOver {
        /// The new holder (`""` when the Lease was released by someone else).
        holder: String,
    },
    /// The Lease object was deleted.
    #[error("leadership lost: the lease was deleted")]
    Deleted,
    /// The Lease's `preferredHolder` names another candidate, so this one
    /// stepped down (Coordinated Leader Election).
    #[error("leadership given up: stepped down for the preferred holder {preferred_holder:?}")]
    SteppedDown {
        /// The preferred holder.
        preferred_holder: String,
    },
    /// Leadership was given up on purpose: the elector was shut down
    /// ([`LeaderElector::shutdown`](crate::LeaderElector::shutdown)). Only a
    /// shutdown ends a term with this reason, so work that rejoins the
    /// election after a loss stops on this one.
    #[error("leadership given up: the elector was shut down")]
    Shutdown,
    /// Leadership was given up because nobody wanted it any more: every
    /// guard of the term was dropped (a guarded stream ended) and no
    /// [`acquire`](crate::LeaderElector::acquire) waited. No guard sees it
    /// (none is left); it is the reason the election logs.
    /// <!-- upstream: omit -->
    /// It is also the action of its Event. Or a shard of a sharded election
    /// was handed over to another replica and its work still ran at the end
    /// of the reconcile grace: its guards see it, and the Lease is not
    /// released.
    /// <!-- upstream: end -->
    #[error("leadership given up: no guard or waiter wanted it any more")]
    GivenUp,
    /// The elector's background task ended without releasing, because its
    /// runtime shut down or it panicked.
    #[error("leadership lost: the elector task stopped")]
    ElectorStopped,
}

/// What [`Lost::TakenOver`] says: the new holder, or that the Lease was
/// written free (an empty holder would read as if someone named `""` led).
fn taken_over(holder: &str) -> String {
    if holder.is_empty() {
        "the lease was written free by someone else".to_owned()
    } else {
        format!("the lease was taken over by {holder:?}")
    }
}

/// One term of leadership, shared by every guard of the term and the elector task.
pub(crate) struct Term {
    /// The fencing token (see [`LeaseGuard::fencing_token`]).
    pub(crate) token: i64,
    /// Whether the term has no renew deadline (the election is disabled; see
    /// [`Term::timeless`]).
    pub(crate) timeless: bool,
    /// Why the term ended: set once, under the lock, and read without it (an
    /// atomic load): the end flag every poll of a guarded stream checks.
    lost: OnceLock<Lost>,
    /// The renew deadline as nanoseconds after `base`, readable without the lock.
    base: Instant,
    deadline_nanos: AtomicU64,
    inner: Mutex<TermInner>,
    /// Notified whenever a guard of this term is dropped.
    dropped: Notify,
}

fn nanos_after(base: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
}

#[derive(Default)]
struct TermInner {
    senders: Vec<oneshot::Sender<Lost>>,
    /// Guards of this term not yet dropped.
    live: usize,
    /// Of those, the guards handed to a waiting `acquire` that has not
    /// received them yet (see [`Term::deliver`]): no work runs under them.
    undelivered: usize,
    /// When guarded work was last stopped rather than finished: a guard
    /// still alive when the term ended, dropped after that, or dropped with
    /// its work unfinished (a guarded future or stream cancelled). Requests
    /// that work sent may still land for a while after it.
    stopped_at: Option<Instant>,
    /// Set once the elector's shutdown began: no new guard joins the term
    /// (no new work under it), so that the shutdown waits only for the work
    /// in flight.
    closed: bool,
}

impl TermInner {
    /// Keeps `tx` until the term ends. The senders of dropped guards and
    /// lost signals are pruned whenever the list would grow (amortised
    /// constant time), so that a long term whose guards come and go (one
    /// per reconcile, per `TermTasks` task) keeps only the live ones.
    fn push(&mut self, tx: oneshot::Sender<Lost>) {
        if self.senders.len() == self.senders.capacity() {
            self.senders.retain(|tx| !tx.is_canceled());
            // Room for as many again before the next pruning.
            self.senders.reserve(self.senders.len().max(4));
        }
        self.senders.push(tx);
    }
}

impl Term {
    pub(crate) fn new(token: i64, sent_at: Instant, renew_deadline: Duration) -> Self {
        Term {
            token,
            timeless: false,
            lost: OnceLock::new(),
            base: sent_at,
            deadline_nanos: AtomicU64::new(nanos_after(sent_at, sent_at + renew_deadline)),
            inner: Mutex::default(),
            dropped: Notify::new(),
        }
    }

    /// A term with no renew deadline, that ends only when it is lost (the
    /// election switched off): its guards set no timer, so paused time never
    /// jumps to a deadline.
    pub(crate) fn timeless(token: i64, begun: Instant) -> Self {
        Term {
            timeless: true,
            ..Term::new(token, begun, Duration::ZERO)
        }
    }

    /// A successful renewal, sent at `sent_at`. Returns `false`, changing
    /// nothing, if the renew deadline has already passed: its answer came too
    /// late. A passed deadline is final: guards and guarded streams read it on
    /// their own (`is_valid`), may already have stopped, and must never see
    /// the term come back to life.
    #[must_use]
    pub(crate) fn renewed(&self, sent_at: Instant, renew_deadline: Duration) -> bool {
        let _inner = self.inner.lock();
        if self.over().is_some() {
            return false;
        }
        let deadline = nanos_after(self.base, sent_at + renew_deadline);
        self.deadline_nanos.store(deadline, Ordering::Release);
        true
    }

    /// Moves the renew deadline earlier, to `until` (never later): our record
    /// came to let others take the Lease sooner (see `Task::ours`). Whether it
    /// moved.
    pub(crate) fn cut(&self, until: Instant) -> bool {
        let _inner = self.inner.lock();
        let until = nanos_after(self.base, until);
        self.deadline_nanos.fetch_min(until, Ordering::AcqRel) > until
    }

    /// The renew deadline: the instant before the last successful write was
    /// sent, plus the renew deadline (read without the lock).
    pub(crate) fn deadline(&self) -> Instant {
        self.base + Duration::from_nanos(self.deadline_nanos.load(Ordering::Acquire))
    }

    /// The one answer to "is the term over?", at `now`: why it ended, or
    /// [`Lost::RenewDeadlineExceeded`] once the renew deadline passed (a
    /// passed deadline is final, whether or not the elector task noticed it
    /// yet; a timeless term has none); `None` while it holds. Lock-free (two
    /// atomic loads), so callers may hold the term's lock: the guards' and
    /// guarded streams' hot path. Under the term's lock it is exact; without
    /// it, a caller may see the old deadline pass while a renewal sent in
    /// time is being recorded, and the term hold once it is (see
    /// [`holds_serialized`](Self::holds_serialized)).
    pub(crate) fn over_at(&self, now: Instant) -> Option<Lost> {
        if let Some(lost) = self.lost() {
            return Some(lost);
        }
        (!self.timeless && now >= self.deadline()).then_some(Lost::RenewDeadlineExceeded)
    }

    /// [`over_at`](Self::over_at) now.
    pub(crate) fn over(&self) -> Option<Lost> {
        self.over_at(Instant::now())
    }

    /// Whether the term holds now (is not [`over`](Self::over)), serialised
    /// with [`renewed`](Self::renewed) and [`lose`](Self::lose) by the lock:
    /// once it answers `false`, it never answers `true` again (for
    /// `is_leader`).
    pub(crate) fn holds_serialized(&self) -> bool {
        let _inner = self.inner.lock();
        self.over().is_none()
    }

    /// Tests: the renew deadline passes now (as during a pause).
    #[cfg(test)]
    pub(crate) fn expire_for_test(&self) {
        let _inner = self.inner.lock();
        self.deadline_nanos.store(0, Ordering::Release);
    }

    /// When guarded work of this term was last stopped rather than finished
    /// (see [`Term::lose`], [`Term::guard_dropped`]).
    pub(crate) fn stopped_at(&self) -> Option<Instant> {
        self.inner.lock().stopped_at
    }

    /// Why the term ended, or `None` while it has not (read without the lock).
    pub(crate) fn lost(&self) -> Option<Lost> {
        self.lost.get().cloned()
    }

    pub(crate) fn live_guards(&self) -> usize {
        self.inner.lock().live
    }

    /// Tests: how many senders of the term's end are kept (live guards and
    /// lost signals, and any not pruned yet).
    #[cfg(test)]
    pub(crate) fn senders_for_test(&self) -> usize {
        self.inner.lock().senders.len()
    }

    /// Guards that may have work running under them: the live ones, but
    /// those still on their way to a waiting `acquire`.
    fn working_guards(&self) -> usize {
        let inner = self.inner.lock();
        inner.live - inner.undelivered
    }

    /// Waits until every guard of this term that may guard work has been
    /// dropped, or `until` (whichever comes first: the caller ends the term
    /// next, and [`Term::lose`] tells whether guards were still alive). A
    /// guard not yet received by its `acquire` guards no work: it is not
    /// waited for (once the shutdown began, that `acquire` drops it).
    pub(crate) async fn guards_dropped(&self, until: Instant) {
        loop {
            let mut notified = std::pin::pin!(self.dropped.notified());
            notified.as_mut().enable();
            if self.working_guards() == 0 || tokio::time::timeout_at(until, notified).await.is_err() {
                return;
            }
        }
    }

    /// Ends the term: every guard resolves to `reason`. Idempotent: the first reason wins.
    pub(crate) fn lose(&self, reason: &Lost) {
        let senders = {
            let mut inner = self.inner.lock();
            if self.lost.set(reason.clone()).is_err() {
                return;
            }
            // Guards are only created under this lock, and only while the term
            // holds: the count cannot grow from here on. A guard not yet
            // received by its `acquire` guards no work (nor will it: see
            // `deliver`).
            if inner.live > inner.undelivered {
                inner.stopped_at = Some(Instant::now());
            }
            std::mem::take(&mut inner.senders)
        };
        for tx in senders {
            // A guard dropped in the meantime does not need telling.
            let _ = tx.send(reason.clone());
        }
    }

    /// A receiver of why the term ends: resolves (with a canceled error)
    /// at once if it has ended already.
    pub(crate) fn subscribe(&self) -> oneshot::Receiver<Lost> {
        let (tx, rx) = oneshot::channel::<Lost>();
        let mut inner = self.inner.lock();
        if self.lost.get().is_none() {
            inner.push(tx);
        }
        // Else `tx` is dropped here and `rx` resolves at once.
        rx
    }

    /// A guard of this term was dropped: counted, its waiters woken, and the
    /// guarded work marked as stopped by it if it was kept past the renew
    /// deadline, or if its work was `unfinished` (its future or stream
    /// dropped before it finished): requests it sent may still land, so the
    /// Lease is not released for a while (see [`stopped_at`](Self::stopped_at)).
    /// A guard never received by its `acquire` (`undelivered`) guarded no work.
    pub(crate) fn guard_dropped(&self, unfinished: bool, undelivered: bool) {
        let mut inner = self.inner.lock();
        if undelivered {
            inner.undelivered -= 1;
        } else if unfinished || self.over().is_some() {
            // (A guard alive when the term ended was counted by `lose`.)
            inner.stopped_at = Some(Instant::now());
        }
        inner.live -= 1;
        drop(inner);
        self.dropped.notify_waiters();
    }

    /// The elector's shutdown began: from now on no new guard joins the term
    /// ([`join`](Self::join)), whoever asks (a [`TermTasks`](crate::TermTasks)
    /// spawning), as the elector hands out none either.
    pub(crate) fn close(&self) {
        self.inner.lock().closed = true;
    }

    /// A new guard joins the term (see [`LeaseGuard::of`](crate::LeaseGuard::of)):
    /// counted, and told why the term ends; `None`, under the term's lock, if
    /// the term is over or its elector's shutdown began.
    /// `undelivered`: the guard is on its way to a waiting `acquire`, which
    /// has not received it yet ([`deliver`](Self::deliver)).
    pub(crate) fn join(&self, undelivered: bool) -> Option<oneshot::Receiver<Lost>> {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.inner.lock();
        if inner.closed || self.over().is_some() {
            return None;
        }
        inner.push(tx);
        inner.live += 1;
        inner.undelivered += usize::from(undelivered);
        Some(rx)
    }

    /// A guard handed to a waiting `acquire` is received by it: from now on
    /// work may run under it. `false`, changing nothing, if the term is over
    /// already (ended, or its renew deadline passed, before the `acquire`
    /// was polled again): such a guard is not handed out (see
    /// [`LeaseGuard::of`](crate::LeaseGuard::of)), and did no work.
    pub(crate) fn deliver(&self) -> bool {
        let mut inner = self.inner.lock();
        if self.over().is_some() {
            return false;
        }
        inner.undelivered -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::Term;

    /// `cut` moves the deadline earlier only, and says whether it moved: an
    /// event that shows our record edited again, as already cut, sends no
    /// second renewal (mutation testing: kills `>` → `>=`).
    #[test]
    fn a_cut_moves_the_deadline_earlier_only() {
        let sent = Instant::now();
        let at = |s| sent + Duration::from_secs(s);
        let term = Term::new(1, sent, Duration::from_secs(10));
        assert!(term.cut(at(1)));
        assert_eq!(term.deadline(), at(1));
        assert!(!term.cut(at(1)), "cut again to the same instant");
        assert!(!term.cut(at(5)), "cut to a later instant");
        assert_eq!(term.deadline(), at(1));
    }

    /// A long term whose guards and lost signals come and go (a guard per
    /// reconcile, per `TermTasks` task, per `acquire` while leading) keeps
    /// the senders of the live ones only, not one per guard ever made.
    #[test]
    fn a_term_keeps_no_sender_of_a_dropped_guard_or_signal() {
        let term = Term::new(1, Instant::now(), Duration::from_secs(10));
        let _live = term.join(false).unwrap();
        for _ in 0..10_000 {
            drop(term.join(false).unwrap());
            term.guard_dropped(false, false);
            drop(term.subscribe());
        }
        let kept = term.inner.lock().senders.len();
        assert!(
            kept <= 16,
            "{kept} senders kept for 1 live guard after 10000 guards and signals dropped"
        );
    }
}
