//! Work under the Lease that is not a stream: [`LeaderElector::with_lease`]
//! runs one future while leading, and [`TermTasks`] spawns tasks that belong
//! to one term.

use std::{future::Future, sync::Arc};

use tokio::{
    sync::Notify,
    task::{AbortHandle, JoinError, JoinSet},
};

use crate::{AcquireError, LeaderElector, LeaseGuard, Lost, term::Term};

impl LeaderElector {
    /// Runs `work` while this candidate leads: waits for the Lease (as
    /// [`acquire`](Self::acquire) does), then polls `work` until it completes
    /// (`Ok` with its output) or the term ends first (`Err` with why; `work`
    /// is dropped at once, unfinished).
    ///
    /// A guard of the term is held while `work` runs, and dropped once it
    /// completes: leadership is then given up (and the Lease released) unless
    /// other guards or waiters want it. A call that cannot lead at all
    /// returns [`Lost::Shutdown`] after [`shutdown`](Self::shutdown) and
    /// [`Lost::ElectorStopped`] if the election task stopped. To lead again
    /// after a loss, call it again (or, for a stream, use
    /// [`run_each_term`](Self::run_each_term)). [`TermTasks`] says what is
    /// cancelled and what is waited for when the term ends.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use kube_runtime_lease::{LeaderElector, LeaseConfig, unique_identity};
    ///
    /// # async fn doc(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let elector = LeaderElector::new(client, LeaseConfig::new("default", "my-job", unique_identity()))?;
    /// loop {
    ///     match elector.with_lease(async { tokio::time::sleep(Duration::from_secs(60)).await }).await {
    ///         Ok(()) => println!("the work finished while leading"),
    ///         Err(kube_runtime_lease::Lost::Shutdown) => break,
    ///         Err(lost) => println!("leadership lost ({lost}); the work was dropped"),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// Why the work did not complete under the Lease ([`Lost`]).
    pub async fn with_lease<F: Future>(&self, work: F) -> Result<F::Output, Lost> {
        let guard = self.acquire().await.map_err(AcquireError::lost)?;
        guard.while_holds(work).await
    }
}

/// Tasks that belong to one term of a Lease, like a [`JoinSet`] whose tasks
/// all end with the term.
///
/// Made by [`LeaseGuard::tasks`]. Each task holds a guard of the term while it
/// runs, so it counts as guarded work: [`LeaderElector::shutdown`] waits for
/// it, and the Lease is released only if it had finished when the term
/// ended. A task's output is `Ok` if it completed within the term, `Err` with
/// why the term ended if it was stopped for that. Dropping the `TermTasks`
/// aborts every task (as a `JoinSet` does).
///
/// # How spawned work relates to a term
/// - **Cancelled**: when the term ends (a loss, the renew deadline passed on
///   the guard's own clock, a step-down, a shutdown once its grace ran out),
///   the future of [`with_lease`](LeaderElector::with_lease) is dropped at
///   once, and every task of a [`TermTasks`] stops at its next poll (each
///   races its own guard of the term). Dropping the `TermTasks` aborts them
///   too. Dropping means what it means for any future: a request already
///   sent is not called back.
/// - **Waited for**: each such future or task holds a guard of the term while
///   it runs. [`LeaderElector::shutdown`] waits up to its grace for them to
///   finish, and the Lease is released only if they all had finished when the
///   term ended; work that had to be stopped (or was dropped unfinished less
///   than lease duration − renew deadline before) leaves the Lease to expire,
///   so that no other candidate leads while requests it sent may still land.
/// - **What can still land after a loss**: a request that stopped work had
///   already sent. The protocol leaves lease duration − renew deadline for
///   it; writes that must never land late carry the fencing token (see the
///   crate docs, *Fencing*).
pub struct TermTasks<T> {
    term: Arc<Term>,
    wake: Arc<Notify>,
    set: JoinSet<Result<T, Lost>>,
}

impl<T> std::fmt::Debug for TermTasks<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TermTasks")
            .field("fencing_token", &self.term.token)
            .field("tasks", &self.set.len())
            .finish_non_exhaustive()
    }
}

impl LeaseGuard {
    /// Runs `work` while the term holds: its output, or why the term ended
    /// first (the work is then dropped, unfinished). The guard is polled
    /// first: once the term has ended, `work` is not polled again. If this future is
    /// dropped before either (by its owner, or with the task running it), the
    /// work was stopped, not finished: the term is told so before the guard
    /// goes, so that the Lease is not released while requests the work sent
    /// may still land.
    pub(crate) async fn while_holds<F: Future>(mut self, work: F) -> Result<F::Output, Lost> {
        self.unfinished = true;
        let result = match futures::future::select(&mut self, std::pin::pin!(work)).await {
            futures::future::Either::Left((lost, _work)) => Err(lost),
            futures::future::Either::Right((output, _)) => Ok(output),
        };
        self.unfinished = false;
        result
    }

    /// A scope for tasks that belong to this guard's term ([`TermTasks`]).
    #[must_use]
    pub fn tasks<T: Send + 'static>(&self) -> TermTasks<T> {
        let (term, wake) = self.parts();
        let set = JoinSet::new();
        TermTasks { term, wake, set }
    }
}

impl<T: Send + 'static> TermTasks<T> {
    /// Spawns `task` on the current Tokio runtime, to run while the term
    /// holds; it is stopped (dropped) when the term ends.
    ///
    /// # Errors
    /// Why the term ended, if it already has (or its renew deadline passed),
    /// and [`Lost::Shutdown`] once [`LeaderElector::shutdown`] began (the
    /// shutdown waits only for the work in flight): nothing is spawned then.
    ///
    /// # Panics
    /// Outside a Tokio runtime, as [`tokio::spawn`] does.
    pub fn spawn<F: Future<Output = T> + Send + 'static>(&mut self, task: F) -> Result<AbortHandle, Lost> {
        let guard = LeaseGuard::of(&self.term, self.wake.clone());
        let guard = guard.ok_or_else(|| self.term.over().unwrap_or(Lost::Shutdown))?;
        Ok(self.set.spawn(guard.while_holds(task)))
    }

    /// Waits for the next task to end: `None` once there are none left.
    pub async fn join_next(&mut self) -> Option<Result<Result<T, Lost>, JoinError>> {
        self.set.join_next().await
    }

    /// Aborts every task (they end at their next poll), and waits until
    /// they have.
    pub async fn shutdown(&mut self) {
        self.set.shutdown().await;
    }

    /// How many tasks have not been joined yet.
    #[must_use]
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether every task has been joined.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

#[cfg(test)]
mod tests;
