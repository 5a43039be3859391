//! [`LeaseGuard`]: proof of leadership for one term, and [`Lost`]: why it ended.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::channel::oneshot;
use parking_lot::{Mutex, MutexGuard};
use tokio::{sync::Notify, time::Instant};

/// Why leadership ended. The output of [`LeaseGuard`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Lost {
    /// No renewal succeeded within the renew deadline (counted from the
    /// instant before the last successful renewal was sent).
    #[error("leadership lost: the lease was not renewed within the renew deadline")]
    RenewDeadlineExceeded,
    /// Another candidate holds the Lease.
    #[error("leadership lost: the lease was taken over by {holder:?}")]
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
    /// ([`LeaderElector::shutdown`](crate::LeaderElector::shutdown)). No
    /// guard sees this reason otherwise (a term given up because nobody
    /// wanted it any more has no guard left), so work that rejoins the
    /// election after a loss stops on this one.
    #[error("leadership given up: the elector was shut down")]
    Shutdown,
    /// The elector's background task ended without releasing, because its
    /// runtime shut down or it panicked.
    #[error("leadership lost: the elector task stopped")]
    ElectorStopped,
}

/// One term of leadership, shared by every guard of the term and the elector task.
pub(crate) struct Term {
    /// The fencing token (see [`LeaseGuard::fencing_token`]).
    pub(crate) token: i64,
    /// See [`Term::timeless`].
    timeless: bool,
    inner: Mutex<TermInner>,
    /// Guards of this term not yet dropped.
    live: AtomicUsize,
    /// Notified whenever a guard of this term is dropped.
    dropped: Notify,
    /// Set once the term ended: a cheap check for every poll of a guarded stream.
    ended: AtomicBool,
    /// Whether guarded work was stopped rather than finished: a guard was
    /// still alive when the term ended, or was dropped only after the renew
    /// deadline had passed. Requests that work sent may still land.
    stopped_work: AtomicBool,
    /// The renew deadline as nanoseconds after `base`, readable without the lock.
    base: Instant,
    deadline_nanos: AtomicU64,
}

fn nanos_after(base: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
}

struct TermInner {
    lost: Option<Lost>,
    last_renewal: Instant,
    senders: Vec<oneshot::Sender<Lost>>,
}

impl Term {
    pub(crate) fn new(token: i64, sent_at: Instant, renew_deadline: Duration) -> Self {
        Self::with_deadline(token, sent_at, renew_deadline, false)
    }

    /// A term with no renew deadline, that ends only when it is lost (the
    /// election switched off): its guards set no timer, so paused time never
    /// jumps to a deadline.
    pub(crate) fn timeless(token: i64, begun: Instant) -> Self {
        Self::with_deadline(token, begun, Duration::ZERO, true)
    }

    fn with_deadline(token: i64, sent_at: Instant, renew_deadline: Duration, timeless: bool) -> Self {
        Term {
            token,
            timeless,
            inner: Mutex::new(TermInner {
                lost: None,
                last_renewal: sent_at,
                senders: Vec::new(),
            }),
            live: AtomicUsize::new(0),
            dropped: Notify::new(),
            ended: AtomicBool::new(false),
            stopped_work: AtomicBool::new(false),
            base: sent_at,
            deadline_nanos: AtomicU64::new(nanos_after(sent_at, sent_at + renew_deadline)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TermInner> {
        self.inner.lock()
    }

    /// A successful renewal, sent at `sent_at`. Returns `false`, changing
    /// nothing, if the renew deadline has already passed: its answer came too
    /// late. A passed deadline is final: guards and guarded streams read it on
    /// their own (`is_valid`), may already have stopped, and must never see
    /// the term come back to life.
    #[must_use]
    pub(crate) fn renewed(&self, sent_at: Instant, renew_deadline: Duration) -> bool {
        let mut inner = self.lock();
        if !self.holds() {
            return false;
        }
        self.deadline_nanos.store(
            nanos_after(self.base, sent_at + renew_deadline),
            Ordering::Release,
        );
        inner.last_renewal = sent_at;
        true
    }

    /// The renew deadline: the instant before the last successful write was
    /// sent, plus the renew deadline (read without the lock).
    pub(crate) fn deadline(&self) -> Instant {
        self.base + Duration::from_nanos(self.deadline_nanos.load(Ordering::Acquire))
    }

    /// Whether the term has ended (an atomic load).
    pub(crate) fn has_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Whether the renew deadline has passed at `now`, even if the elector
    /// task has not noticed yet (never, for a timeless term).
    pub(crate) fn deadline_passed_at(&self, now: Instant) -> bool {
        !self.timeless && now >= self.deadline()
    }

    /// The one answer to "does the term still hold?": not ended, and the
    /// renew deadline not passed. A passed deadline is final, whether or not
    /// the elector task has noticed it yet. Lock-free (a clock read and two
    /// atomic loads): the guards' and guarded streams' hot path. Under the
    /// lock it is exact; without it, a caller may see `false` at the old
    /// deadline while a renewal sent in time is being recorded, and `true`
    /// once it is (see [`holds_serialized`](Self::holds_serialized)).
    pub(crate) fn holds(&self) -> bool {
        !self.has_ended() && !self.deadline_passed_at(Instant::now())
    }

    /// [`holds`](Self::holds), serialised with [`renewed`](Self::renewed)
    /// and [`lose`](Self::lose) by the lock: once it answers `false`, it
    /// never answers `true` again (for `is_leader`).
    pub(crate) fn holds_serialized(&self) -> bool {
        let _inner = self.lock();
        self.holds()
    }

    /// Tests: the renew deadline passes now (as during a pause).
    #[cfg(test)]
    pub(crate) fn expire_for_test(&self) {
        let _inner = self.lock();
        self.deadline_nanos.store(0, Ordering::Release);
    }

    /// Whether guards were still alive when the term ended (see [`Term::lose`]).
    pub(crate) fn stopped_work(&self) -> bool {
        self.stopped_work.load(Ordering::Acquire)
    }

    pub(crate) fn last_renewal(&self) -> Instant {
        self.lock().last_renewal
    }

    pub(crate) fn lost(&self) -> Option<Lost> {
        self.lock().lost.clone()
    }

    pub(crate) fn live_guards(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Waits until every guard of this term has been dropped, or `until`
    /// (whichever comes first: the caller ends the term next, and
    /// [`Term::lose`] tells whether guards were still alive).
    pub(crate) async fn guards_dropped(&self, until: Instant) {
        loop {
            let mut notified = std::pin::pin!(self.dropped.notified());
            notified.as_mut().enable();
            if self.live_guards() == 0 || tokio::time::timeout_at(until, notified).await.is_err() {
                return;
            }
        }
    }

    /// Ends the term: every guard resolves to `reason`. Idempotent: the first reason wins.
    pub(crate) fn lose(&self, reason: &Lost) {
        let senders = {
            let mut inner = self.lock();
            if inner.lost.is_some() {
                return;
            }
            inner.lost = Some(reason.clone());
            // Guards are only created under this lock, and only while the term
            // holds: the count cannot grow from here on.
            if self.live_guards() > 0 {
                self.stopped_work.store(true, Ordering::Release);
            }
            self.ended.store(true, Ordering::Release);
            std::mem::take(&mut inner.senders)
        };
        for tx in senders {
            // A guard dropped in the meantime does not need telling.
            let _ = tx.send(reason.clone());
        }
    }

    /// A new guard of this term, or `None` if the term already ended or its
    /// renew deadline passed (the elector task may not have noticed yet: a
    /// guard handed out now would end at once, and a caller that re-acquires
    /// in a loop would spin on it instead of waiting for the next term).
    pub(crate) fn guard(self: &Arc<Self>, wake: Arc<Notify>) -> Option<LeaseGuard> {
        let (tx, rx) = oneshot::channel();
        {
            let mut inner = self.lock();
            if !self.holds() {
                return None;
            }
            inner.senders.push(tx);
            self.live.fetch_add(1, Ordering::AcqRel);
        }
        Some(LeaseGuard {
            term: self.clone(),
            wake,
            rx,
            done: None,
            timer: None,
        })
    }
}

/// Proof of leadership for one term: a future that resolves to [`Lost`] when
/// the term ends.
///
/// Obtained from [`LeaderElector::acquire`](crate::LeaderElector::acquire).
/// The lease is renewed by the elector's own background task, however often
/// (or seldom) this guard or the work it guards is polled. The guard is
/// `Send + Sync + 'static`, so [`LeaseGuard::lost_signal`] can feed
/// [`Controller::graceful_shutdown_on`](kube_runtime::Controller::graceful_shutdown_on).
///
/// Dropping the guard says "I no longer need leadership": when the last guard
/// of the term is dropped and nobody else waits to acquire, the elector stops
/// renewing and releases the Lease (unless
/// [`release_on_drop`](crate::LeaseConfig::release_on_drop) is off).
///
/// # Fencing
/// Leases are best effort: a process that is paused (GC, SIGSTOP, a frozen VM)
/// can resume after its term ended and act before it notices. To narrow that
/// window, call [`LeaseGuard::is_valid`] right before a side effect, and write
/// [`LeaseGuard::fencing_token`] alongside your changes so that readers can
/// reject writes from an older term. Neither closes the window completely: a
/// pause between the check and the side effect is still possible.
#[must_use = "leadership ends when the guard is dropped"]
pub struct LeaseGuard {
    term: Arc<Term>,
    wake: Arc<Notify>,
    rx: oneshot::Receiver<Lost>,
    done: Option<Lost>,
    /// Fires at the renew deadline, so that the guard resolves on its own
    /// clock even if the elector task never runs again (its runtime no
    /// longer driven). Made at the first poll within a runtime.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl LeaseGuard {
    /// Whether this term still holds: not ended, and the renew deadline not
    /// passed. A cheap synchronous check to make right before a side effect.
    pub fn is_valid(&self) -> bool {
        self.term.holds()
    }

    /// Whether the renew deadline has passed (see [`Term::deadline_passed_at`]).
    pub(crate) fn deadline_passed(&self) -> bool {
        self.term.deadline_passed_at(Instant::now())
    }

    fn deadline(&self) -> Instant {
        self.term.deadline()
    }

    /// Whether this guard's timer is set for the current renew deadline.
    pub(crate) fn timer_armed(&self) -> bool {
        self.timer
            .as_ref()
            .is_some_and(|t| t.deadline() == self.deadline())
    }

    /// The time left before the renew deadline (zero once the term ended):
    /// how long this term is certain to last without another successful
    /// renewal; `Duration::MAX` when the election is switched off
    /// ([`LeaseConfig::enabled`](crate::LeaseConfig::enabled)).
    pub fn time_left(&self) -> Duration {
        if self.term.has_ended() {
            Duration::ZERO
        } else if self.term.timeless {
            Duration::MAX
        } else {
            self.term.deadline().saturating_duration_since(Instant::now())
        }
    }

    /// The fencing token of this term: the Lease's `leaseTransitions` as this
    /// term wrote it when it began.
    ///
    /// Every term begins with a write that sets `leaseTransitions` to more than
    /// any value this elector has seen on the Lease's name (across deletions
    /// and re-creations of the object, and across takeovers by a process with
    /// the same identity), so:
    /// - within one process, each term's token is strictly larger than the
    ///   token of every term before it on that name, including past
    ///   `i32::MAX`, where the Lease's counter stops and the token goes on;
    /// - across processes, the token is the number every candidate reads from
    ///   the Lease: a term's token is larger than that of every term whose
    ///   record its candidate saw, which includes the term it took over (a
    ///   takeover writes on top of the record it read). A candidate that never
    ///   saw an older, deleted Lease object may start again from lower numbers.
    ///
    /// Write it alongside side effects, and have readers reject writes tagged
    /// with a smaller token than one already seen: they come from an older term.
    pub fn fencing_token(&self) -> i64 {
        self.term.token
    }

    /// Why the term ended, or `None` while it holds.
    pub fn lost(&self) -> Option<Lost> {
        self.term.lost()
    }

    /// A `Send + Sync + 'static` future that resolves when this term ends,
    /// without holding the guard: for
    /// [`Controller::graceful_shutdown_on`](kube_runtime::Controller::graceful_shutdown_on).
    pub fn lost_signal(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        let (tx, rx) = oneshot::channel::<Lost>();
        {
            let mut inner = self.term.lock();
            if inner.lost.is_none() {
                inner.senders.push(tx);
            }
            // Else `tx` is dropped here and `rx` resolves at once.
        }
        async move {
            let _ = rx.await;
        }
    }
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("fencing_token", &self.term.token)
            .field("lost", &self.term.lost())
            .finish_non_exhaustive()
    }
}

impl Future for LeaseGuard {
    type Output = Lost;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Lost> {
        if let Some(lost) = &self.done {
            return Poll::Ready(lost.clone());
        }
        let lost = match Pin::new(&mut self.rx).poll(cx) {
            Poll::Pending => match self.poll_deadline(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) => {
                    // Final (see `Term::renewed`): the term ends for every
                    // guard, whether or not the elector task ever notices.
                    self.term.lose(&Lost::RenewDeadlineExceeded);
                    // The elector task ends the term its way (status, metrics).
                    self.wake.notify_one();
                    self.term.lost().unwrap_or(Lost::RenewDeadlineExceeded)
                }
            },
            Poll::Ready(Ok(lost)) => lost,
            // The term dropped its senders without a reason: only when the
            // elector task is gone.
            Poll::Ready(Err(oneshot::Canceled)) => self.term.lost().unwrap_or(Lost::ElectorStopped),
        };
        self.done = Some(lost.clone());
        Poll::Ready(lost)
    }
}

impl LeaseGuard {
    /// Ready once the renew deadline has passed, on this guard's own timer.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.term.timeless {
            // No deadline: the term ends only when it is lost (the sender).
            return Poll::Pending;
        }
        loop {
            let deadline = self.deadline();
            if Instant::now() >= deadline {
                return Poll::Ready(());
            }
            let timer = match &mut self.timer {
                Some(timer) => timer,
                // Outside a runtime with timers (a guard polled by hand), the
                // elector task's wake-up is all there is.
                None if tokio::runtime::Handle::try_current().is_err() => return Poll::Pending,
                None => self.timer.insert(Box::pin(tokio::time::sleep_until(deadline))),
            };
            if timer.deadline() != deadline {
                timer.as_mut().reset(deadline);
            }
            match timer.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                // Renewed since the timer was set: set it again.
                Poll::Ready(()) => {}
            }
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if self.deadline_passed() {
            // Kept past the deadline: whatever it guarded was stopped by it.
            self.term.stopped_work.store(true, Ordering::Release);
        }
        self.term.live.fetch_sub(1, Ordering::AcqRel);
        self.term.dropped.notify_waiters();
        self.wake.notify_one();
    }
}
