//! [`Acquire`], the future of [`LeaderElector::acquire`](super::LeaderElector::acquire),
//! and its heartbeat check of a task whose runtime is no longer driven.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use futures::channel::oneshot;
use tokio::time::{Instant, Sleep, sleep, sleep_until};
use tracing::warn;

use super::Inner;
use crate::{error::AcquireError, guard::LeaseGuard};

/// Future returned by [`LeaderElector::acquire`](super::LeaderElector::acquire): resolves to a [`LeaseGuard`]
/// once this candidate leads.
#[must_use = "futures do nothing unless polled"]
pub struct Acquire {
    inner: Arc<Inner>,
    rx: Option<oneshot::Receiver<LeaseGuard>>,
    /// While waiting: a timer, and the heartbeats of the task seen when it was set
    /// (see [`State::heartbeats`](super::State::heartbeats)).
    heartbeat_check: Option<(Pin<Box<Sleep>>, u64)>,
}

impl Acquire {
    pub(super) fn new(inner: Arc<Inner>) -> Self {
        Acquire {
            inner,
            rx: None,
            heartbeat_check: None,
        }
    }
}

impl std::fmt::Debug for Acquire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquire")
            .field("registered", &self.rx.is_some())
            .finish_non_exhaustive()
    }
}

impl Future for Acquire {
    type Output = Result<LeaseGuard, AcquireError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let rx = if let Some(rx) = &mut this.rx {
            rx
        } else {
            let (rx, spawn) = {
                let mut state = this.inner.lock();
                if state.shutdown {
                    return Poll::Ready(Err(AcquireError::Shutdown));
                }
                if let Some(guard) = state
                    .term
                    .as_ref()
                    .and_then(|t| LeaseGuard::of(t, this.inner.wake.clone()))
                {
                    return Poll::Ready(Ok(guard));
                }
                if !this.inner.config.enabled {
                    drop(state);
                    return Poll::Ready(this.inner.lead_unelected());
                }
                // Before any change of state: polled outside a runtime (a
                // programming error, as for `tokio::spawn`), this panics
                // without leaving the elector waiting for a task that never ran.
                let runtime = state.campaigning.is_none().then(|| {
                    tokio::runtime::Handle::try_current()
                        .expect("`LeaderElector::acquire` must be polled within a Tokio runtime")
                });
                let (tx, rx) = oneshot::channel();
                state.waiters.push(tx);
                let spawn = runtime.map(|runtime| (runtime, state.next_task()));
                (rx, spawn)
            };
            if let Some((runtime, n)) = spawn {
                this.inner.spawn(&runtime, n);
            }
            // A running task re-counts who wants leadership.
            this.inner.wake.notify_one();
            this.rx.insert(rx)
        };
        match Pin::new(rx).poll(cx) {
            Poll::Pending => {
                this.watch_the_task(cx);
                Poll::Pending
            }
            Poll::Ready(Ok(guard)) => {
                this.rx = None;
                this.heartbeat_check = None;
                Poll::Ready(Ok(guard))
            }
            Poll::Ready(Err(oneshot::Canceled)) => {
                this.rx = None;
                this.heartbeat_check = None;
                // Waiters are dropped by `shutdown`, or by the task when it
                // is dropped without exiting (runtime shut down, panic).
                Poll::Ready(Err(if this.inner.lock().shutdown {
                    AcquireError::Shutdown
                } else {
                    AcquireError::ElectorStopped
                }))
            }
        }
    }
}

impl Acquire {
    /// While waiting: if the task that should serve this waiter has not beaten
    /// for [`Inner::heartbeat_timeout`] (the runtime it was spawned on is no longer
    /// driven), leaves it behind and starts a new one on this runtime.
    fn watch_the_task(&mut self, cx: &mut Context<'_>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let period = self.inner.heartbeat_timeout();
        let (timer, seen) = self.heartbeat_check.get_or_insert_with(|| {
            let heartbeats = self.inner.lock().heartbeats;
            (Box::pin(sleep(period)), heartbeats)
        });
        // Re-armed on the runtime polling now, at the same deadline: a timer
        // belongs to the runtime it was made on, and a waiter first polled on
        // a runtime that is then no longer driven (whose task never ran)
        // would otherwise wait for a timer that never fires.
        let deadline = timer.deadline();
        timer.set(sleep_until(deadline));
        while timer.as_mut().poll(cx).is_ready() {
            let spawn = {
                let mut state = self.inner.lock();
                let stuck = state.heartbeats == *seen
                    && !state.shutdown
                    && (state.campaigning.is_some() || state.slot.is_some());
                *seen = state.heartbeats;
                stuck.then(|| {
                    warn!(
                        after = ?period,
                        "the leader election task has not run (is its runtime still driven?); \
                         leaving it behind and starting a new one"
                    );
                    state.leave_behind();
                    state.next_task()
                })
            };
            if let Some(n) = spawn {
                self.inner.left_behind();
                self.inner.spawn(&runtime, n);
            }
            timer.as_mut().reset(Instant::now() + period);
        }
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        if self.rx.take().is_some() {
            self.inner.wake.notify_one();
        }
    }
}
