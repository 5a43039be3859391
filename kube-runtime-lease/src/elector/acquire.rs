//! [`Acquire`], the future of [`LeaderElector::acquire`](super::LeaderElector::acquire), and
//! the election switched off ([`LeaseConfig::enabled`](crate::LeaseConfig::enabled)):
//! one term that begins at the first `acquire`, ends only at `shutdown`, and
//! never touches the API.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use futures::channel::oneshot;
use parking_lot::MutexGuard;
use tokio::time::Instant;
use tracing::info;

use super::{Inner, State};
use crate::{error::AcquireError, guard::LeaseGuard, term::Term};

/// Future returned by [`LeaderElector::acquire`](super::LeaderElector::acquire): resolves to a [`LeaseGuard`]
/// once this candidate leads.
#[must_use = "futures do nothing unless polled"]
pub struct Acquire {
    pub(super) inner: Arc<Inner>,
    pub(super) rx: Option<oneshot::Receiver<LeaseGuard>>,
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
        loop {
            let rx = if let Some(rx) = &mut this.rx {
                rx
            } else {
                let mut state = this.inner.lock();
                if state.shutdown {
                    return Poll::Ready(Err(AcquireError::Shutdown));
                }
                let wake = &this.inner.wake;
                if let Some(guard) = state.term.as_ref().and_then(|t| LeaseGuard::of(t, wake.clone())) {
                    return Poll::Ready(Ok(guard));
                }
                if !this.inner.config.enabled {
                    return Poll::Ready(this.inner.lead_unelected(state));
                }
                // Before any change of state: polled outside a runtime (a
                // programming error, as for `tokio::spawn`), this panics
                // without leaving the elector waiting for a task that never ran.
                let spawn = (!state.running).then(|| {
                    let runtime = tokio::runtime::Handle::try_current()
                        .expect("`LeaderElector::acquire` must be polled within a Tokio runtime");
                    state.running = true;
                    state.spawned += 1;
                    (runtime, state.spawned)
                });
                let (tx, rx) = oneshot::channel();
                state.waiters.push(tx);
                drop(state);
                if let Some((runtime, n)) = spawn {
                    this.inner.spawn(&runtime, n);
                }
                // A running task re-counts who wants leadership.
                this.inner.wake.notify_one();
                this.rx.insert(rx)
            };
            let received = ready!(Pin::new(rx).poll(cx));
            this.rx = None;
            // Waiters are dropped by `shutdown`, or by the task when it is
            // dropped without exiting (runtime shut down, panic). A guard sent
            // before the shutdown began and received after it is dropped
            // unused, still undelivered: no work starts once the shutdown
            // began, and the shutdown neither waits for it nor keeps the
            // Lease from its release. Decided under the state's lock, which
            // the shutdown takes to begin: either it began first, or it
            // waits for the work of the guard delivered here.
            let state = this.inner.lock();
            let mut guard = match received {
                _ if state.shutdown => return Poll::Ready(Err(AcquireError::Shutdown)),
                Ok(guard) => guard,
                Err(_) => return Poll::Ready(Err(AcquireError::ElectorStopped)),
            };
            if guard.deliver() {
                return Poll::Ready(Ok(guard));
            }
            // The term ended (or its renew deadline passed) before this poll:
            // its guard would end at once. Dropped undelivered, it did no
            // work; wait for the next term instead.
            drop(state);
            drop(guard);
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

impl Inner {
    /// A guard of the one term of a disabled election, begun now if it has
    /// not begun yet; `state` (locked, and unlocked here) shows no shutdown.
    fn lead_unelected(&self, mut state: MutexGuard<'_, State>) -> Result<LeaseGuard, AcquireError> {
        let begun = state.term.is_none();
        let timeless = || Arc::new(Term::timeless(0, Instant::now()));
        let term = state.term.get_or_insert_with(timeless).clone();
        drop(state);
        // The term ends only with `shutdown`, which had not begun above.
        let guard = LeaseGuard::of(&term, self.wake.clone()).ok_or(AcquireError::Shutdown)?;
        if begun {
            let _span = self.config.span(tracing::Span::current().id()).entered();
            self.update_status(|s| {
                s.is_leader = true;
                s.holder = Some(self.config.identity.clone());
            });
            self.observers.tell(super::Transition::Leading(true));
            info!("leader election disabled: leading without a lease (no API call is made)");
        }
        Ok(guard)
    }
}
