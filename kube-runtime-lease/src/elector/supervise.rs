//! One election task at a time: spawning it, the re-count of demand, the
//! task's end (decided under the state's lock, after its last request), and
//! the cleanup when it is dropped without ending (its runtime shut down, or a
//! panic).
//!
//! # The rule
//! The task runs on the runtime of the `acquire` that started it, as kube's
//! own `Client` runs its request buffer on the runtime it was built on: keep
//! that runtime running while the elector is in use. A new task starts only
//! once the last one ended or was dropped, so two tasks never talk to the
//! API at once, whatever runtimes they were spawned on. If the task's runtime
//! shuts down, the task is dropped with it: its term ends as
//! [`Lost::ElectorStopped`], waiting acquisitions fail with
//! [`AcquireError::ElectorStopped`](crate::AcquireError::ElectorStopped), and
//! the next `acquire` starts a new task on its own runtime. A runtime that is
//! kept but no longer driven stops the election as it stops the client:
//! guards still end at their renew deadline on their own timer, `is_leader`
//! says no from then on, and `shutdown` returns after its budget.

use std::sync::Arc;

use futures::FutureExt;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, error, warn};

use super::{
    Inner,
    task::{Next, Task},
};
use crate::{error::Result, term::Lost};

impl Inner {
    /// The elector's state, locked.
    pub(super) fn lock(&self) -> parking_lot::MutexGuard<'_, super::State> {
        self.state.lock()
    }

    /// Spawns the task numbered `n` (the caller marked it running, under the
    /// lock) on `runtime`, with the state unlocked: a runtime that is shutting
    /// down drops the future at once, and `Task`'s drop takes the lock. The
    /// task's state is built here, not in the future, so that its drop runs
    /// even if the future is never polled.
    pub(super) fn spawn(self: &Arc<Self>, runtime: &tokio::runtime::Handle, n: u64) {
        let mut task = Task::new(self.clone());
        // A panic of the task's own is said in the election's span (its
        // message goes to the panic hook, and names no Lease) before its
        // drop ends the term; not a panic elsewhere that drops its runtime.
        let task = async move {
            let ran = std::panic::AssertUnwindSafe(run(&mut task)).catch_unwind().await;
            ran.unwrap_or_else(|panic| {
                error!("the leader election task panicked: the next `acquire` starts a new one");
                drop(task); // Its term ended (and told) before the unwinding resumes.
                std::panic::resume_unwind(panic)
            })
        };
        let handle = runtime.spawn(task.instrument(self.config.span(None)));
        #[cfg(test)]
        super::test_hooks::reached(self, super::test_hooks::Point::Spawned);
        let mut state = self.lock();
        if state.spawned == n {
            state.task = Some(handle);
        }
    }

    /// Waits until no task runs.
    pub(super) async fn idle(&self) {
        loop {
            let mut ended = std::pin::pin!(self.task_ended.notified());
            ended.as_mut().enable();
            if !self.lock().running {
                return;
            }
            ended.await;
        }
    }
}

/// The election task: campaigns and leads while leadership is wanted, and
/// ends once nobody wants it (or at shutdown), after its release.
async fn run(task: &mut Task) -> Result<()> {
    let inner = task.inner.clone();
    // A task that starts once nobody wants leadership (the `acquire` that
    // spawned it dropped before it ran, or `shutdown` began) has nothing to
    // do: it ends at once, with no request, not even for an object beside the
    // Lease, so that `shutdown` waits for one task's requests only (see
    // `LeaseConfig::shutdown_budget`).
    if task.end() {
        debug!("election task started with nobody wanting leadership: nothing to do");
        return Ok(());
    }
    debug!("election task started");
    inner.api.contact.reset();
    // The wake-up stored by the `acquire` that spawned this task: the loops
    // re-count demand before they wait anyway.
    let _ = inner.wake.notified().now_or_never();
    loop {
        let elect = async {
            loop {
                let won = task.campaign().await?;
                if let Next::End(result) = task.lead(won).await {
                    return Some(result);
                }
            }
        };
        // Coordinated Leader Election: the task campaigns and leads with its
        // LeaseCandidate published, and deletes it before it ends.
        let elect = super::extras::while_published(&inner, elect);
        let result = Box::pin(elect).await.unwrap_or(Ok(()));
        // After the last request: the next task may start from here on,
        // unless someone wants leadership again.
        if task.end() {
            return result;
        }
    }
}

/// Who wants leadership, as the task re-counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Demand {
    /// A live guard of the term, or a waiter.
    Wanted,
    /// Nobody.
    Unwanted,
    /// [`LeaderElector::shutdown`](super::LeaderElector::shutdown) was called.
    Shutdown,
}

impl Drop for Task {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // Aborted, panicked, or its runtime shut down: end the term so that no
        // guard outlives its renewals, fail the waiters, and let the next
        // `acquire` start a task.
        let mut state = self.inner.lock();
        state.running = false;
        let term = state.term.take();
        if let Some(term) = &term {
            term.lose(&Lost::ElectorStopped);
            // Work alive now was stopped: its margin holds for the next task.
            self.memory.term_ended(term, &self.inner.config);
        }
        // Its view, as `end` keeps it: the next task reads before acting.
        self.memory.view = Some(self.view.clone());
        state.memory = std::mem::take(&mut self.memory);
        state.waiters.clear();
        drop(state);
        self.inner.not_leading();
        if term.is_some() {
            warn!(reason = %Lost::ElectorStopped, "leadership lost");
            // And told (the Events'), unless unwinding: an observer may spawn.
            if !std::thread::panicking() {
                self.inner.observers.tell(super::Transition::TermEnded {
                    reason: &Lost::ElectorStopped,
                    uid: match &self.view {
                        super::task::LeaseView::Known { object, .. } => object.metadata.uid.as_deref(),
                        _ => None,
                    },
                });
            }
        }
        self.inner.task_ended.notify_waiters();
    }
}

/// Awaits an election task: its release's result. A task that did not return
/// is logged: cancelled with its runtime (already reported as
/// `ElectorStopped`), or panicked (a bug).
pub(super) async fn join(task: Option<JoinHandle<Result<()>>>) -> Result<()> {
    let Some(task) = task else { return Ok(()) };
    task.await.unwrap_or_else(|e| {
        if e.is_cancelled() {
            debug!("the leader election task was cancelled (its runtime shut down)");
        } else {
            error!(error = %e, "leader election task panicked");
        }
        Ok(())
    })
}

impl super::State {
    /// Who wants leadership now.
    pub(in crate::elector) fn demand(&mut self) -> Demand {
        self.waiters.retain(|tx| !tx.is_canceled());
        let live = self
            .term
            .as_ref()
            .is_some_and(|t| t.lost().is_none() && t.live_guards() > 0);
        // A live guard wants it whatever else; then a shutdown, then waiters.
        match (live, self.shutdown, self.waiters.is_empty()) {
            (false, true, _) => Demand::Shutdown,
            (false, false, true) => Demand::Unwanted,
            _ => Demand::Wanted,
        }
    }
}

impl Task {
    /// Re-counts who wants leadership (under the lock), while campaigning.
    pub(super) fn demand(&mut self) -> Demand {
        #[cfg(test)]
        super::test_hooks::reached(&self.inner, super::test_hooks::Point::Recount);
        self.inner.lock().demand()
    }

    /// Re-counts who wants the term in force (under the lock); when nobody
    /// does, the term is removed from the state in the same step: no guard of
    /// it may be handed out from then on (`end_term` ends it), so a later
    /// `acquire` waits for the next term instead of receiving a guard of a
    /// term about to end.
    pub(super) fn demand_for_term(&mut self) -> Demand {
        #[cfg(test)]
        super::test_hooks::reached(&self.inner, super::test_hooks::Point::Recount);
        let mut state = self.inner.lock();
        let demand = state.demand();
        if demand != Demand::Wanted {
            state.term = None;
        }
        demand
    }

    /// Ends the task if still nobody wants leadership (or at shutdown),
    /// decided under the lock: a waiter registering from then on finds no
    /// task and starts one. Whether it ended.
    pub(super) fn end(&mut self) -> bool {
        let mut state = self.inner.lock();
        if state.demand() == Demand::Wanted {
            return false;
        }
        state.running = false;
        self.memory.view = Some(std::mem::replace(&mut self.view, super::task::LeaseView::Unknown));
        state.memory = std::mem::take(&mut self.memory);
        drop(state);
        self.ended = true;
        self.inner.task_ended.notify_waiters();
        true
    }
}
