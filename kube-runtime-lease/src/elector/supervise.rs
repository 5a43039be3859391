//! One election task at a time: spawning a task, the slot it takes before it
//! talks to the API (so that the next task starts only after the last one's
//! release), its beat and the leaving behind of a task whose runtime is no longer
//! driven, the re-count of demand, and the cleanup when a task ends.

use std::{sync::Arc, time::Duration};

use futures::FutureExt;
use tokio::{task::JoinHandle, time::sleep};
use tracing::{Instrument, debug, error};

use super::{Inner, State, task::Task};
use crate::{error::Result, term::Lost};

impl State {
    /// Registers a new task as the one that campaigns; its generation.
    pub(super) fn next_task(&mut self) -> u64 {
        self.spawned += 1;
        self.campaigning = Some(self.spawned);
        self.spawned
    }

    /// Leaves the running task (and any holding the slot) behind: their
    /// runtime is no longer driven. They can no longer write to the Lease
    /// (each write checks the slot first), and their term ends.
    pub(super) fn leave_behind(&mut self) {
        self.campaigning = None;
        self.slot = None;
        self.task = None;
        if let Some(term) = self.term.take() {
            term.lose(&Lost::ElectorStopped);
        }
    }
}

impl Inner {
    pub(super) fn span(&self) -> tracing::Span {
        tracing::info_span!(
            parent: None,
            "leader_election",
            lease.namespace = %self.config.namespace,
            lease.name = %self.config.name,
            identity = %self.config.identity,
        )
    }

    /// Spawns the task of generation `n` on `runtime`, with the state unlocked:
    /// a runtime that is shutting down drops the future at once, and `Task`'s
    /// drop (which fails the waiters and frees the generation) takes the lock.
    /// The task's state is built here, not in the future, so that its drop
    /// runs even if the future is never polled.
    pub(super) fn spawn(self: &Arc<Self>, runtime: &tokio::runtime::Handle, n: u64) {
        let task = Task::new(self.clone(), n);
        let handle = runtime.spawn(run(task).instrument(self.span()));
        #[cfg(test)]
        self.interleave(super::Interleave::Spawned);
        let mut state = self.lock();
        if state.campaigning == Some(n) {
            state.task = Some(handle);
        }
    }

    /// How long a task may go without a beat before a waiter leaves it behind.
    pub(super) fn heartbeat_timeout(&self) -> Duration {
        self.config.renew_deadline + self.config.retry_period
    }

    /// Waits until no task campaigns or holds the slot.
    pub(super) async fn idle(&self) {
        loop {
            let mut freed = std::pin::pin!(self.slot_freed.notified());
            freed.as_mut().enable();
            {
                let state = self.lock();
                if state.campaigning.is_none() && state.slot.is_none() {
                    return;
                }
            }
            freed.await;
        }
    }

    /// Leaves the running task behind (see [`State::leave_behind`]).
    pub(super) fn leave_behind(&self) {
        self.lock().leave_behind();
        self.left_behind();
    }

    /// What follows [`State::leave_behind`], with the state unlocked: wake whoever
    /// waits for the slot, and say that nobody leads.
    pub(super) fn left_behind(&self) {
        self.slot_freed.notify_waiters();
        self.not_leading();
    }
}

/// The election task. It first takes the slot, so that it starts only after
/// the previous task finished (its release included), and keeps it until it
/// is dropped: after `Task`'s drop has cleaned up. While it holds the slot it
/// counts a heartbeat once per retry period (see [`State::heartbeats`]).
async fn run(mut task: Task) -> Result<()> {
    let inner = task.inner.clone();
    let n = task.generation;
    loop {
        let mut freed = std::pin::pin!(inner.slot_freed.notified());
        freed.as_mut().enable();
        {
            let mut state = inner.lock();
            if state.campaigning != Some(n) {
                // Left behind while waiting (or never wanted): nothing to do.
                task.exited = true;
                return Ok(());
            }
            if state.slot.is_none() {
                state.slot = Some(n);
                break;
            }
        }
        freed.await;
    }
    // A task that starts once `shutdown` began (spawned just before it, then
    // waiting for the slot) has nothing to do: it ends at once, with no
    // request, not even for an object beside the Lease, so that `shutdown`
    // waits for one task's requests only (see `LeaseConfig::shutdown_budget`).
    if task.demand(false) == Demand::Shutdown && task.exit() {
        debug!("election task started after the shutdown: nothing to do");
        return Ok(());
    }
    debug!("election task started");
    inner.api.contact().task_started();
    // The wake-up stored by the `acquire` that spawned this task: the loops
    // re-count demand before they wait anyway.
    let _ = inner.wake.notified().now_or_never();
    let heartbeat = async {
        loop {
            sleep(inner.config.retry_period).await;
            let mut state = inner.lock();
            if state.slot == Some(n) {
                state.heartbeats += 1;
            }
        }
    };
    // `task` is borrowed, not moved: it keeps the slot until this function
    // returns, after whatever the task publishes beside the Lease is deleted
    // (invariant 1 covers such an object too: the next task publishes its
    // own only after this one deleted it).
    let elect = async {
        loop {
            let Some((lease, sent, created)) = task.campaign().await else {
                return Ok(());
            };
            if let Some(result) = task.lead(lease, sent, created).await {
                return result;
            }
        }
    };
    // Coordinated Leader Election: the task campaigns and leads with its
    // LeaseCandidate published, and deletes it before it ends.
    #[cfg(feature = "coordinated")]
    let elect = super::lease_candidate::while_published(&inner, elect);
    let result = futures::select_biased! {
        result = elect.fuse() => result,
        () = heartbeat.fuse() => unreachable!("the heartbeat never ends"),
    };
    drop(task);
    result
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
    /// This task was left behind (see [`State::leave_behind`]): stop at once,
    /// without a write.
    LeftBehind,
}

impl Drop for Task {
    fn drop(&mut self) {
        let mut state = self.inner.lock();
        let freed = state.slot == Some(self.generation);
        if freed {
            state.slot = None;
        }
        let current = state.campaigning == Some(self.generation);
        if current {
            state.campaigning = None;
        }
        if current && !self.exited {
            // Aborted, panicked, or its runtime shut down: end the term so
            // that no guard outlives its renewals, and fail the waiters.
            if let Some(term) = state.term.take() {
                term.lose(&Lost::ElectorStopped);
            }
            state.waiters.clear();
            drop(state);
            self.inner.not_leading();
        } else {
            drop(state);
        }
        if freed || current {
            self.inner.slot_freed.notify_waiters();
        }
    }
}

/// Awaits an election task: its release's result. A task that did not return
/// is logged: cancelled with its runtime (already reported as
/// `ElectorStopped`), or panicked (a bug).
pub(super) async fn join(task: Option<JoinHandle<Result<()>>>) -> Result<()> {
    let Some(task) = task else { return Ok(()) };
    match task.await {
        Ok(result) => result,
        Err(e) if e.is_cancelled() => {
            debug!("the leader election task was cancelled (its runtime shut down)");
            Ok(())
        }
        Err(e) => {
            error!(error = %e, "leader election task panicked");
            Ok(())
        }
    }
}

impl Task {
    /// Re-counts who wants leadership (under the lock). With `giving_up`, when
    /// nobody does, the term is removed from the state in the same step: no
    /// guard of it may be handed out from then on (`end_term` ends it), so a
    /// later `acquire` waits for the next term instead of receiving a guard of
    /// a term about to end.
    pub(super) fn demand(&mut self, giving_up: bool) -> Demand {
        #[cfg(test)]
        if self.inner.storm.load(std::sync::atomic::Ordering::Relaxed) {
            self.inner.wake.notify_one();
        }
        let mut state = self.inner.lock();
        if state.slot != Some(self.generation) {
            return Demand::LeftBehind;
        }
        state.waiters.retain(|tx| !tx.is_canceled());
        let live = state
            .term
            .as_ref()
            .filter(|t| t.lost().is_none())
            .map_or(0, |t| t.live_guards());
        let demand = if live > 0 {
            Demand::Wanted
        } else if state.shutdown {
            Demand::Shutdown
        } else if state.waiters.is_empty() {
            Demand::Unwanted
        } else {
            Demand::Wanted
        };
        if giving_up && demand != Demand::Wanted {
            state.term = None;
        }
        demand
    }

    /// Leaves the election if still nobody wants leadership (decided under the
    /// lock, so that a waiter registering now finds no task and starts one).
    pub(super) fn exit(&mut self) -> bool {
        if matches!(self.demand(false), Demand::Wanted) {
            return false;
        }
        let mut state = self.inner.lock();
        if state.campaigning == Some(self.generation) {
            state.campaigning = None;
        }
        self.exited = true;
        true
    }

    /// Whether this task still holds the slot: checked before every write, so
    /// that a task left behind (its runtime no longer driven) never writes
    /// again if it resumes.
    pub(super) fn may_write(&self) -> bool {
        self.inner.lock().slot == Some(self.generation)
    }
}
