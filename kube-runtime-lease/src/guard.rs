//! [`LeaseGuard`]: proof of leadership for one term, a future resolving to
//! [`Lost`] when it ends.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use futures::{FutureExt, channel::oneshot};
use tokio::{sync::Notify, time::Instant};

use crate::term::{Lost, Term};

/// Proof of leadership for one term: a future that resolves to [`Lost`] when
/// the term ends.
///
/// Obtained from [`LeaderElector::acquire`](crate::LeaderElector::acquire).
/// The lease is renewed by the elector's own background task, however often
/// (or seldom) this guard or the work it guards is polled.
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
///
/// # Panics
/// Polled (the guard, or its [`lost_signal`](Self::lost_signal)) within a
/// Tokio runtime without timers, or within another runtime after the one
/// that first polled it shut down: its deadline is a Tokio timer, bound to
/// the runtime that made it, as kube's own clients need one. Poll a guard
/// within a runtime with timers (`enable_time`, or `enable_all`) that
/// outlives it.
#[must_use = "leadership ends when the guard is dropped"]
pub struct LeaseGuard {
    term: Arc<Term>,
    wake: Arc<Notify>,
    rx: oneshot::Receiver<Lost>,
    /// Fires at the renew deadline, so that the guard resolves on its own
    /// clock even if the elector task never runs again (its runtime no
    /// longer driven). Made at the first poll within a runtime.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The guard of work that has not finished (`while_holds`, a guarded
    /// stream whose inner stream has not ended): dropped so, the work was
    /// stopped, not finished.
    pub(crate) unfinished: bool,
    /// Handed to a waiting `acquire` that has not received it yet
    /// ([`deliver`](Self::deliver)): it guards no work.
    undelivered: bool,
}

impl LeaseGuard {
    /// A new guard of `term`, or `None` if the term already ended or its
    /// renew deadline passed (the elector task may not have noticed yet: a
    /// guard handed out now would end at once, and a caller that re-acquires
    /// in a loop would spin on it instead of waiting for the next term).
    /// `wake` wakes the elector task when the guard is dropped.
    pub(crate) fn of(term: &Arc<Term>, wake: Arc<Notify>) -> Option<Self> {
        Self::joining(term, wake, false)
    }

    /// A guard of `term` for a waiting `acquire`, which has not received it
    /// yet: it counts as wanting leadership, but guards no work until the
    /// `acquire` takes it ([`deliver`](Self::deliver)). Dropped before that
    /// (the `acquire` dropped, or refusing it once the shutdown began), it
    /// neither holds the shutdown back nor keeps the Lease from its release.
    pub(crate) fn undelivered(term: &Arc<Term>, wake: Arc<Notify>) -> Option<Self> {
        Self::joining(term, wake, true)
    }

    fn joining(term: &Arc<Term>, wake: Arc<Notify>, undelivered: bool) -> Option<Self> {
        term.join(undelivered).map(|rx| LeaseGuard {
            term: term.clone(),
            wake,
            rx,
            timer: None,
            unfinished: false,
            undelivered,
        })
    }

    /// The waiting `acquire` receives this guard: `false` if its term is over
    /// already (the guard is then dropped, still undelivered, and the
    /// `acquire` waits for the next term).
    pub(crate) fn deliver(&mut self) -> bool {
        if self.undelivered && self.term.deliver() {
            self.undelivered = false;
        }
        !self.undelivered
    }

    /// The term this guard belongs to, and the elector task's wake-up: what
    /// another guard of the same term is made of.
    pub(crate) fn parts(&self) -> (Arc<Term>, Arc<Notify>) {
        (self.term.clone(), self.wake.clone())
    }

    /// Whether this term still holds: not ended, and the renew deadline not
    /// passed. A cheap synchronous check to make right before a side effect.
    #[must_use]
    pub fn is_valid(&self) -> bool {
        self.term.over().is_none()
    }

    /// Whether this guard's timer is set for the current renew deadline.
    pub(crate) fn timer_armed(&self) -> bool {
        self.timer
            .as_ref()
            .is_some_and(|t| t.deadline() == self.term.deadline())
    }

    /// The time left before the renew deadline (zero once the term ended):
    /// how long this term is certain to last without another successful
    /// renewal; `Duration::MAX` when the election is switched off
    /// ([`LeaseConfig::enabled`](crate::LeaseConfig::enabled)).
    #[must_use]
    pub fn time_left(&self) -> Duration {
        match self.term.over() {
            Some(_) => Duration::ZERO,
            None if self.term.timeless => Duration::MAX,
            None => self.term.deadline().saturating_duration_since(Instant::now()),
        }
    }

    /// The fencing token of this term, as the write that began it stored it
    /// on the Lease (the annotation `leases.kube.rs/fencing-token`; it equals
    /// `leaseTransitions` while that counter can carry it).
    ///
    /// Every term begins with a write whose token is larger than every token
    /// the candidate has seen on the Lease's name (its annotation, or its
    /// `leaseTransitions` where a term of another implementation moved only
    /// those) or handed out itself, across deletions and re-creations of the
    /// object and takeovers by a process with the same identity, so:
    /// - within one process, each term's token is strictly larger than the
    ///   token of every term before it on that name;
    /// - across processes, the token is the number every candidate reads from
    ///   the Lease: a term's token is larger than that of every term whose
    ///   record its candidate saw, which includes the term it took over (a
    ///   takeover writes on top of the record it read). This holds where
    ///   `leaseTransitions` cannot: at `i32::MAX`, where the counter starts again,
    ///   and after the counter was edited down. A candidate that never saw an
    ///   older, deleted Lease object may start again from lower numbers, and
    ///   so may one after the annotation was removed.
    ///
    /// Write it alongside side effects, and have readers reject writes tagged
    /// with a smaller token than one already seen: they come from an older term.
    #[must_use]
    pub fn fencing_token(&self) -> i64 {
        self.term.token
    }

    /// Why the term ended, or `None` while it holds: past the renew
    /// deadline, [`Lost::RenewDeadlineExceeded`] at once, on this guard's
    /// clock (as [`is_valid`](Self::is_valid) says), even before the election
    /// task or this guard's timer noticed.
    #[must_use]
    pub fn lost(&self) -> Option<Lost> {
        self.term.over()
    }

    /// A `Send + Sync + 'static` future that resolves when this term ends,
    /// without holding the guard.
    ///
    /// Like the guard, it resolves at the renew deadline on its own clock,
    /// even if the election task never runs again.
    ///
    /// It only tells. Given to
    /// [`Controller::graceful_shutdown_on`](kube_runtime::Controller::graceful_shutdown_on),
    /// it stops the Controller from starting new reconciles, but lets those
    /// in flight run to their end, after the term ended and past the instant
    /// another replica may take the Lease: to stop a Controller's reconciles
    /// with the term, guard it with
    /// [`with_leader_election`](crate::LeaderElectionControllerExt::with_leader_election)
    /// (each reconcile races a guard of its term), or race the work with the
    /// guard itself.
    pub fn lost_signal(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        let term = self.term.clone();
        let mut lost = term.subscribe();
        async move {
            // Without a deadline, or outside a runtime with timers (polled by
            // hand), the term's own end is all there is.
            if term.timeless || tokio::runtime::Handle::try_current().is_err() {
                let _ = lost.await;
                return;
            }
            // The clock is read at every poll, as the guard reads it: after a
            // step that blocked the runtime past the deadline, the timer has
            // not fired yet when the signal is polled again. A renewal moves
            // the deadline: the timer follows it.
            let mut timer = Box::pin(tokio::time::sleep_until(term.deadline()));
            std::future::poll_fn(move |cx| {
                loop {
                    if term.over().is_some() || lost.poll_unpin(cx).is_ready() {
                        return Poll::Ready(());
                    }
                    if timer.deadline() != term.deadline() {
                        timer.as_mut().reset(term.deadline());
                    }
                    ready!(timer.as_mut().poll(cx));
                }
            })
            .await;
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
        let this = &mut *self;
        loop {
            // Once the term ended, every poll answers its reason: the one the
            // term sent, or the one this guard ended it with.
            if let Some(lost) = this.term.lost() {
                return Poll::Ready(lost);
            }
            if let Poll::Ready(sent) = this.rx.poll_unpin(cx) {
                // A sender dropped unsent is not reached while this guard
                // holds the term (its senders are taken only by `lose`, which
                // sends to each); answered rather than a panic.
                return Poll::Ready(sent.unwrap_or(Lost::ElectorStopped));
            }
            if this.term.timeless {
                // No deadline: the term ends only when it is lost (the sender).
                return Poll::Pending;
            }
            let deadline = this.term.deadline();
            if Instant::now() >= deadline {
                // Final (see `Term::renewed`): the term ends for every
                // guard, whether or not the elector task ever notices.
                this.term.lose(&Lost::RenewDeadlineExceeded);
                // The elector task ends the term its way (its status, its log line).
                this.wake.notify_one();
                continue;
            }
            let timer = match &mut this.timer {
                Some(timer) => timer,
                // Outside a runtime with timers (a guard polled by hand), the
                // elector task's wake-up is all there is.
                None if tokio::runtime::Handle::try_current().is_err() => return Poll::Pending,
                None => this.timer.insert(Box::pin(tokio::time::sleep_until(deadline))),
            };
            if timer.deadline() != deadline {
                timer.as_mut().reset(deadline);
            }
            ready!(timer.as_mut().poll(cx));
            // Renewed since the timer was set: set it again.
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.term.guard_dropped(self.unfinished, self.undelivered);
        self.wake.notify_one();
    }
}
