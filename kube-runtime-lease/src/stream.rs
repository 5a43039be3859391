//! [`WithLeaderElection`]: the adapter returned by `with_leader_election`.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use futures::{Stream, stream::FusedStream};
use pin_project::pin_project;
use tracing::debug;

use crate::{Acquire, LeaderElector, LeaseGuard, Lost};

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
///   Lease is released once no other stream or guard shares the term.
///
/// # Fairness
/// Every poll checks leadership before polling the inner stream, so a busy
/// inner stream cannot delay the reaction to a loss.
///
/// ## Warning
/// The inner stream is dropped when this stream is polled after the loss; the
/// elector wakes it at once, so a consumer awaiting `next()` (such as
/// `for_each`) reacts within the same instant. A consumer that does not poll
/// (a `for_each` body that blocks for long) delays the drop; work that must not
/// outlive leadership should also check [`LeaseGuard::is_valid`].
#[pin_project]
#[must_use = "streams do nothing unless polled"]
pub struct WithLeaderElection<S> {
    #[pin]
    inner: Option<S>,
    state: State,
    lost: Option<Lost>,
}

impl<S> WithLeaderElection<S> {
    pub(crate) fn new(inner: S, elector: &LeaderElector) -> Self {
        WithLeaderElection {
            inner: Some(inner),
            state: State::Acquiring(elector.acquire()),
            lost: None,
        }
    }

    /// Why leadership ended, if this stream ended because it did; `None` while
    /// running, or when the inner stream ended on its own.
    pub fn lost(&self) -> Option<&Lost> {
        self.lost.as_ref()
    }

    /// Takes the reason leadership ended, leaving `None`.
    pub fn take_lost(self: Pin<&mut Self>) -> Option<Lost> {
        self.project().lost.take()
    }

    /// Whether this candidate leads and the inner stream runs.
    pub fn is_leading(&self) -> bool {
        matches!(self.state, State::Leading(_))
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
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Option<Pin<&mut S>> {
        self.project().inner.as_pin_mut()
    }

    /// The inner stream, unless it has been dropped. Leadership (if held) is
    /// given up as the guard is dropped.
    pub fn into_inner(self) -> Option<S> {
        self.inner
    }
}

impl<S: Stream> Stream for WithLeaderElection<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let mut this = self.project();
        loop {
            match this.state {
                State::Acquiring(acquire) => match Pin::new(acquire).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(guard)) => {
                        debug!(
                            fencing_token = guard.fencing_token(),
                            "leading: starting the guarded stream"
                        );
                        *this.state = State::Leading(guard);
                    }
                    Poll::Ready(Err(_)) => {
                        debug!("elector shut down before leading: dropping the guarded stream");
                        this.inner.set(None);
                        *this.lost = Some(Lost::Released);
                        *this.state = State::Done;
                        return Poll::Ready(None);
                    }
                },
                State::Leading(guard) => {
                    // Also check the deadline here, synchronously: after a pause
                    // (SIGSTOP, a frozen VM) this poll may run before the elector
                    // task has noticed that the term is over.
                    let ended = match Pin::new(&mut *guard).poll(cx) {
                        Poll::Ready(lost) => Some(lost),
                        Poll::Pending if !guard.is_valid() => {
                            Some(guard.lost().unwrap_or(Lost::RenewDeadlineExceeded))
                        }
                        Poll::Pending => None,
                    };
                    if let Some(lost) = ended {
                        debug!(reason = %lost, "leadership ended: dropping the guarded stream");
                        // The inner stream goes first, then the guard.
                        this.inner.set(None);
                        *this.lost = Some(lost);
                        *this.state = State::Done;
                        return Poll::Ready(None);
                    }
                    let Some(inner) = this.inner.as_mut().as_pin_mut() else {
                        *this.state = State::Done;
                        return Poll::Ready(None);
                    };
                    return match inner.poll_next(cx) {
                        Poll::Ready(None) => {
                            debug!("guarded stream ended: giving up leadership");
                            this.inner.set(None);
                            *this.state = State::Done;
                            Poll::Ready(None)
                        }
                        other => other,
                    };
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }
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
