use std::{
    future::Future,
    pin::{Pin, pin},
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use futures::{
    channel::oneshot,
    future::{Either, select},
};
use parking_lot::Mutex;
use tokio::{
    sync::Notify,
    time::{Instant, Sleep},
};

/// Why a term of leadership ended: the output of a [`LeaseGuard`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Lost {
    /// No renewal succeeded within the renew deadline, counted from the instant before the last
    /// successful renewal was sent.
    #[error("the lease was not renewed within the renew deadline")]
    RenewDeadlineExceeded,
    /// Another candidate holds the Lease.
    #[error("the lease was taken over by {holder:?}")]
    TakenOver {
        /// The new holder (`""` when the Lease was released).
        holder: String,
    },
    /// [`LeaderElector::shutdown`](super::LeaderElector::shutdown) ended the term: guards were
    /// still alive when its grace passed.
    #[error("the elector was shut down")]
    Shutdown,
}

/// One term of leadership, shared by its guards and the election task.
pub(crate) struct Term {
    token: i64,
    state: Mutex<TermState>,
    /// Notified when a guard is dropped or the term ends: wakes the election task.
    pub(crate) changed: Notify,
}

struct TermState {
    deadline: Instant,
    lost: Option<Lost>,
    guards: usize,
    senders: Vec<oneshot::Sender<Lost>>,
}

impl Term {
    pub(crate) fn new(token: i64, deadline: Instant) -> Self {
        let state = TermState {
            deadline,
            lost: None,
            guards: 0,
            senders: Vec::new(),
        };
        Term {
            token,
            state: Mutex::new(state),
            changed: Notify::new(),
        }
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.state.lock().deadline
    }

    pub(crate) fn lost(&self) -> Option<Lost> {
        self.state.lock().lost.clone()
    }

    pub(crate) fn guards(&self) -> usize {
        self.state.lock().guards
    }

    /// Resolves when the term ends: lost, or its renew deadline passed.
    async fn ended(self: Arc<Self>) {
        let (tx, mut rx) = oneshot::channel();
        self.state.lock().senders.push(tx);
        while self.lost().is_none() && Instant::now() < self.deadline() {
            let timer = pin!(tokio::time::sleep_until(self.deadline()));
            if let Either::Left(_) = select(&mut rx, timer).await {
                return;
            }
        }
    }

    /// A renewal sent at `sent_at` succeeded. A term whose deadline passed stays over: its
    /// guards may have resolved already.
    pub(crate) fn renewed(&self, sent_at: Instant, renew_deadline: Duration) {
        let mut state = self.state.lock();
        if state.lost.is_none() && Instant::now() < state.deadline {
            state.deadline = state.deadline.max(sent_at + renew_deadline);
            return;
        }
        drop(state);
        self.lose(Lost::RenewDeadlineExceeded);
    }

    /// Ends the term (the first reason stays) and resolves its guards.
    pub(crate) fn lose(&self, lost: Lost) {
        let mut state = self.state.lock();
        if state.lost.is_none() {
            for tx in state.senders.drain(..) {
                let _ = tx.send(lost.clone());
            }
            state.lost = Some(lost);
        }
        drop(state);
        self.changed.notify_one();
    }
}

/// Proof of leadership for one term: a future that resolves to [`Lost`] when the term ends.
///
/// Obtained from [`LeaderElector::acquire`](super::LeaderElector::acquire). The election task
/// renews the Lease however often this guard is polled; the guard resolves at the renew
/// deadline on its own timer, even if that task is stalled. Run guarded work against it, e.g.
/// with [`futures::future::select`]. When the last guard of a term is dropped, the Lease is
/// released so that another candidate takes over at once.
///
/// Leases are best effort: a paused process may resume after its term ended and act before it
/// notices. Check [`LeaseGuard::is_valid`] right before a side effect, and write
/// [`LeaseGuard::fencing_token`] with it so that readers can reject writes of older terms.
#[must_use = "the Lease is released when the last guard is dropped"]
pub struct LeaseGuard {
    term: Arc<Term>,
    rx: oneshot::Receiver<Lost>,
    timer: Pin<Box<Sleep>>,
}

impl LeaseGuard {
    /// A new guard of `term`, unless it no longer holds.
    pub(crate) fn new(term: &Arc<Term>) -> Option<Self> {
        let mut state = term.state.lock();
        if state.lost.is_some() || Instant::now() >= state.deadline {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        state.senders.push(tx);
        state.guards += 1;
        let timer = Box::pin(tokio::time::sleep_until(state.deadline));
        drop(state);
        Some(LeaseGuard {
            term: term.clone(),
            rx,
            timer,
        })
    }

    /// Whether the term still holds: not ended, and its renew deadline not passed.
    #[must_use]
    pub fn is_valid(&self) -> bool {
        let state = self.term.state.lock();
        state.lost.is_none() && Instant::now() < state.deadline
    }

    /// The fencing token of this term: the Lease's `leaseTransitions` when the term began. It
    /// grows with every change of holder.
    #[must_use]
    pub fn fencing_token(&self) -> i64 {
        self.term.token
    }

    /// Resolves when this guard's term ends, without keeping the term wanted as the guard does:
    /// a trigger for [`Controller::graceful_shutdown_on`](crate::Controller::graceful_shutdown_on),
    /// so that a controller run under this guard stops taking new work when the term ends.
    pub fn lost_signal(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        self.term.clone().ended()
    }
}

impl Future for LeaseGuard {
    type Output = Lost;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Lost> {
        let this = &mut *self;
        if let Poll::Ready(Ok(lost)) = Pin::new(&mut this.rx).poll(cx) {
            return Poll::Ready(lost);
        }
        loop {
            if let Some(lost) = this.term.lost() {
                return Poll::Ready(lost);
            }
            let deadline = this.term.deadline();
            if Instant::now() >= deadline {
                this.term.lose(Lost::RenewDeadlineExceeded);
                continue;
            }
            if this.timer.deadline() != deadline {
                this.timer.as_mut().reset(deadline);
            }
            ready!(this.timer.as_mut().poll(cx));
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.term.state.lock().guards -= 1;
        self.term.changed.notify_one();
    }
}
