//! A guarded [`Stream`]: [`LeaderElectionStreamExt::with_leader_election`] and
//! the adapter it returns, [`WithLeaderElection`].

mod each_term;
#[cfg(test)]
mod tests;

use std::{
    future::Future,
    panic::AssertUnwindSafe,
    pin::Pin,
    task::{Context, Poll, Waker, ready},
};

use futures::{Stream, stream::FusedStream};
use pin_project::pin_project;
use tracing::{debug, warn};

pub use self::each_term::RunEnded;
use crate::{Acquire, AcquireError, LeaderElector, LeaseGuard, Lost};

enum State {
    /// Waiting for leadership; the inner stream is not polled.
    Acquiring(Acquire),
    /// Leading: the inner stream runs.
    Leading(LeaseGuard),
    /// Ended: the inner stream has been dropped.
    Done,
}

/// Stream returned by the
/// [`with_leader_election`](crate::LeaderElectionStreamExt::with_leader_election) methods.
///
/// - Until this candidate leads, the inner stream is not polled at all.
/// - While it leads, the inner stream's items are passed through unchanged.
/// - When leadership ends, the inner stream is **dropped** at once (for a
///   [`Controller`](kube_runtime::Controller), that aborts the reconciles in
///   flight at their next `.await`) and this stream ends; [`lost`](Self::lost)
///   then tells why.
/// - When the inner stream ends on its own, this stream ends with
///   [`lost`](Self::lost) returning `None`, and its guard is dropped: the
///   Lease is released once no other stream or guard shares the term. An
///   inner stream that ends once the term is over (an inner guarded stream,
///   such as a guarded Controller given to
///   [`run_each_term`](LeaderElector::run_each_term), that saw the renew
///   deadline pass) ends this one with that loss instead.
/// - When this stream is dropped while leading, before its inner stream
///   ended (a `select!` on a signal), the guarded work was stopped, not
///   finished: requests it sent may still land, so the Lease is left to
///   expire instead of released. For a handover within milliseconds, let the
///   inner stream end ([`LeaderElector::shutdown`] with
///   [`Controller::graceful_shutdown_on`](kube_runtime::Controller::graceful_shutdown_on)).
/// - When the inner stream panics, it is stopped as if dropped: the guard
///   and the inner stream are dropped (the Lease is left to expire), and the
///   panic goes on to the consumer. A consumer that catches it and polls
///   again gets `None`.
///
/// # Fairness
/// Every poll checks whether the term is over (an atomic load and a clock
/// read) before polling the inner stream, so that after a pause or a step
/// of the consumer that blocked the runtime the inner stream takes no step
/// past the renew deadline, and reads the clock once more per item, after
/// the inner stream made it:
/// an item made once the renew deadline had passed is dropped, not handed
/// out, and the stream ends. So a busy inner stream cannot delay the reaction
/// to a loss: it stops within one item of the deadline, even if the elector
/// task has not run yet (after a process pause, or when its runtime is not
/// driven). That one item's work may run after the deadline: its step in
/// progress (up to its next `.await`) runs to its end, and only lease
/// duration − renew deadline is left before another candidate may lead, so
/// a longer synchronous step (CPU-bound, a blocking call) runs beside the
/// next leader; its result is never handed out. Each poll of the inner
/// stream spends a unit of Tokio's cooperative budget, as Tokio's own
/// channels do: an inner stream that is always ready (items made without
/// waiting, `stream::iter(..).then(..)`) under a consumer that never waits
/// yields to the runtime once the budget is spent, so that the election
/// task renews meanwhile, also on a current-thread runtime.
///
/// ## Warning
/// The inner stream is dropped when this stream is polled after the loss; the
/// elector wakes it at once, so a consumer awaiting `next()` (such as
/// `for_each`) reacts within the same instant. A consumer that does not poll
/// (a `for_each` body that blocks, or awaits something slow) delays the drop;
/// work that must not outlive leadership should also check
/// [`LeaseGuard::is_valid`]. Work that runs outside the inner stream's poll
/// goes on meanwhile: a [`Controller`](kube_runtime::Controller)'s
/// reconciles are tasks of their own, so guard a Controller with
/// [`LeaderElectionControllerExt::with_leader_election`](crate::LeaderElectionControllerExt::with_leader_election)
/// (each reconcile races a guard of its term and stops at the renew
/// deadline) rather than this adapter on its `run` stream.
#[pin_project(project = WithLeaderElectionProj)]
#[must_use = "streams do nothing unless polled"]
pub struct WithLeaderElection<S> {
    #[pin]
    inner: Option<S>,
    state: State,
    lost: Option<Lost>,
    /// The waker the guard was last polled with (it keeps it until the term ends).
    registered: Option<Waker>,
    /// The Lease, `namespace/name`, named on this stream's own lines: they
    /// are logged in its consumer's task, not in the election's span.
    lease: Box<str>,
}

impl<S> WithLeaderElection<S> {
    pub(crate) fn new(inner: S, elector: &LeaderElector) -> Self {
        WithLeaderElection {
            inner: Some(inner),
            state: State::Acquiring(elector.acquire()),
            lost: None,
            registered: None,
            lease: format!("{}/{}", elector.config().namespace, elector.config().name).into(),
        }
    }

    /// Why leadership ended, if this stream ended because it did; `None` while
    /// running, or when the inner stream ended on its own. A stream that never
    /// led ends with [`Lost::Shutdown`] when the elector was shut down, and
    /// with [`Lost::ElectorStopped`] when its background task stopped. The
    /// same type as [`LeaseGuard::lost`].
    pub fn lost(&self) -> Option<Lost> {
        self.lost.clone()
    }

    /// Takes the reason leadership ended, leaving `None`.
    #[must_use]
    pub fn take_lost(self: Pin<&mut Self>) -> Option<Lost> {
        self.project().lost.take()
    }

    /// Whether this candidate leads and the inner stream runs: false once
    /// the term is over (its renew deadline passed, or it ended), even before
    /// this stream is polled again and drops the inner stream.
    pub fn is_leading(&self) -> bool {
        matches!(&self.state, State::Leading(guard) if guard.is_valid())
    }

    /// Whether this stream has ended (leadership lost or the inner stream finished).
    pub fn is_stopped(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// The guard of the current term, while leading: for its fencing helpers.
    pub fn guard(&self) -> Option<&LeaseGuard> {
        match &self.state {
            State::Leading(g) => Some(g),
            _ => None,
        }
    }

    /// The inner stream, unless it has been dropped.
    pub fn get_ref(&self) -> Option<&S> {
        self.inner.as_ref()
    }

    /// The inner stream, unless it has been dropped.
    pub fn get_mut(&mut self) -> Option<&mut S> {
        self.inner.as_mut()
    }

    /// The inner stream, pinned, unless it has been dropped.
    #[must_use]
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Option<Pin<&mut S>> {
        self.project().inner.as_pin_mut()
    }

    /// The inner stream, unless it has been dropped. Leadership (if held) is
    /// given up as the guard is dropped; the inner stream goes on without
    /// it, so its work counts as stopped, not finished: the Lease is left to
    /// expire rather than released.
    pub fn into_inner(self) -> Option<S> {
        self.inner
    }
}

impl<S: Stream> Stream for WithLeaderElection<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let mut this = self.project();
        if let State::Acquiring(acquire) = this.state {
            match ready!(Pin::new(acquire).poll(cx)) {
                Ok(guard) => start_leading(this.state, guard, this.lease),
                Err(e) => {
                    debug!(lease = %this.lease, error = %e, "no leadership to wait for: dropping the guarded stream");
                    return finish(&mut this, Some(e.lost()));
                }
            }
        }
        let State::Leading(guard) = &mut *this.state else {
            // Done.
            return Poll::Ready(None);
        };
        // Every poll, before the inner stream's: whether the term is over,
        // on the clock (the end flag, an atomic load, then one clock read).
        // Not the guard's own timer alone: after a pause (SIGSTOP, a frozen
        // VM) or a step of the consumer that blocked the runtime, this poll
        // may run before that timer fired and before the elector task
        // noticed, and the inner stream would take one more step past the
        // renew deadline (a request begun, reconciles started).
        if let Some(lost) = guard.lost() {
            return finish(&mut this, Some(lost));
        }
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return finish(&mut this, None);
        };
        // One unit of Tokio's cooperative budget per poll of the inner
        // stream, as Tokio's own channels and sockets spend it: an inner
        // stream that is always ready (items made without waiting) under a
        // consumer that never waits either yields to the runtime once the
        // budget is spent, so that the election task renews meanwhile on a
        // current-thread runtime. (Outside a runtime there is no budget.)
        ready!(poll_budget(cx));
        let polled = match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll_next(cx))) {
            Ok(polled) => polled,
            // A panic in the inner stream stops its work as a drop does: the
            // guard goes (unfinished: the Lease is left to expire), then the
            // inner stream, before the panic goes on to the consumer. One
            // that catches it and keeps this stream keeps no leadership.
            Err(panic) => {
                warn!(lease = %this.lease, "the guarded stream panicked: giving up leadership; the lease will expire");
                *this.state = State::Done;
                this.inner.set(None);
                std::panic::resume_unwind(panic)
            }
        };
        match polled {
            // The clock read again per item: an item made once the deadline
            // had passed is not handed out (a pause, or the inner stream's
            // own long step, while it made it).
            // So the stream stops within one item of the deadline.
            Poll::Ready(Some(item)) => match guard.lost() {
                None => Poll::Ready(Some(item)),
                lost => finish(&mut this, lost),
            },
            // An inner stream that ends once the term is over may have ended
            // because of the loss (an inner guarded stream, a Controller
            // wrapped again, that saw the renew deadline pass on its own
            // clock): its end is the loss, so that `run_each_term` campaigns
            // again instead of leaving the election (one clock read, at the
            // end only).
            Poll::Ready(None) => {
                let lost = guard.lost();
                finish(&mut this, lost)
            }
            // The inner stream is idle: be woken when the term ends (the
            // guard's own timer wakes it at the renew deadline). The guard
            // keeps the last waker it was polled with until the term ends,
            // and its timer keeps it until the renew deadline: polling it
            // again with the same one would only re-register it, unless a
            // renewal moved the deadline since (the timer is then set again).
            Poll::Pending => {
                let same_waker = this.registered.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
                if !(same_waker && guard.timer_armed()) {
                    if let Poll::Ready(lost) = Pin::new(guard).poll(cx) {
                        return finish(&mut this, Some(lost));
                    }
                    *this.registered = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

/// Spends one unit of Tokio's cooperative budget: `Pending` (the task woken
/// again at once, after the others had their turn) once it is spent.
#[allow(
    deprecated,
    reason = "`tokio::task::coop::consume_budget` needs Tokio 1.44; this crate asks for 1.40"
)]
fn poll_budget(cx: &mut Context<'_>) -> Poll<()> {
    std::pin::pin!(tokio::task::consume_budget()).poll(cx)
}

// With its users, the guarded stream and `with_lease`.
impl AcquireError {
    /// Why work that waited for leadership ended without leading: the
    /// [`Lost`] of a term it never had.
    pub(crate) fn lost(self) -> Lost {
        match self {
            AcquireError::Shutdown => Lost::Shutdown,
            AcquireError::ElectorStopped => Lost::ElectorStopped,
        }
    }
}

/// Leadership was won: the inner stream starts.
#[cold]
fn start_leading(state: &mut State, mut guard: LeaseGuard, lease: &str) {
    debug!(
        %lease,
        fencing_token = guard.fencing_token(),
        "leading: starting the guarded stream"
    );
    // Until the inner stream ends, its work is unfinished: a guard dropped
    // before that (this stream dropped by its consumer, or `into_inner`)
    // leaves the Lease to expire rather than released (release only after
    // the guarded work ended).
    guard.unfinished = true;
    *state = State::Leading(guard);
}

/// Ends the stream: the inner stream is dropped first, then the guard.
#[cold]
fn finish<S: Stream>(this: &mut WithLeaderElectionProj<'_, S>, lost: Option<Lost>) -> Poll<Option<S::Item>> {
    if let Some(lost) = lost {
        debug!(lease = %this.lease, reason = %lost, "leadership ended: dropping the guarded stream");
        *this.lost = Some(lost);
    } else if let State::Leading(guard) = this.state {
        // The inner stream ended: its work finished.
        debug!(lease = %this.lease, "guarded stream ended: giving up leadership");
        guard.unfinished = false;
    }
    this.inner.set(None);
    *this.state = State::Done;
    *this.registered = None;
    Poll::Ready(None)
}

impl<S: Stream> FusedStream for WithLeaderElection<S> {
    fn is_terminated(&self) -> bool {
        self.is_stopped()
    }
}

impl<S> std::fmt::Debug for WithLeaderElection<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithLeaderElection")
            .field("leading", &self.is_leading())
            .field("stopped", &self.is_stopped())
            .field("lost", &self.lost)
            .finish_non_exhaustive()
    }
}

/// Adds [`with_leader_election`](Self::with_leader_election) to every [`Stream`].
pub trait LeaderElectionStreamExt: Stream {
    /// Runs this stream only while `elector`'s candidate leads.
    ///
    /// The stream is not polled until the Lease is acquired, is dropped as soon
    /// as leadership ends, and when it ends on its own the Lease is released
    /// (once no other stream or guard shares the term). Several streams given
    /// the same elector share one Lease and one renewal loop: acquiring starts
    /// them all, losing stops them all.
    ///
    /// ```no_run
    /// use futures::StreamExt;
    /// use kube_runtime_lease::{LeaderElectionStreamExt, LeaderElector, LeaseConfig, unique_identity};
    ///
    /// # async fn doc(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let elector = LeaderElector::new(client, LeaseConfig::new("default", "my-job", unique_identity()))?;
    /// let work = futures::stream::iter(0..).then(|i| async move { i * 2 });
    /// let mut guarded = std::pin::pin!(work.with_leader_election(&elector));
    /// while let Some(item) = guarded.next().await {
    ///     println!("{item}");
    /// }
    /// println!("stopped: {:?}", guarded.lost());
    /// # Ok(())
    /// # }
    /// ```
    fn with_leader_election(self, elector: &LeaderElector) -> WithLeaderElection<Self>
    where
        Self: Sized,
    {
        WithLeaderElection::new(self, elector)
    }
}

impl<S: Stream> LeaderElectionStreamExt for S {}
