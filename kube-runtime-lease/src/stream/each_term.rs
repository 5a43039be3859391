//! [`LeaderElector::run_each_term`]: a guarded stream for every term,
//! rejoining the election after a loss without restarting the process. It
//! lives beside the stream adapter it runs: the elector does not depend on
//! the adapter.

use std::fmt::Display;

use backon::{BackoffBuilder, ExponentialBackoff};
use futures::{Stream, StreamExt, future::Either};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::{LeaderElectionStreamExt, LeaderElector, LeaseConfig, Lost};

/// Why [`LeaderElector::run_each_term`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunEnded {
    /// The elector was shut down ([`LeaderElector::shutdown`]), also when the
    /// work ended on its own because of it (a `Controller` given
    /// [`shutdown_requested`](LeaderElector::shutdown_requested) through
    /// `graceful_shutdown_on`).
    Shutdown,
    /// The work ended on its own while leading (its stream finished): the
    /// election was left and the Lease released.
    WorkEnded,
}

impl LeaderElector {
    /// Runs the work that `make` builds under leadership, again each time
    /// leadership is won, until the work ends on its own or the elector is
    /// shut down.
    ///
    /// A [`Controller`](kube_runtime::Controller) is consumed by `run`, so a
    /// process that wants to lead again after a loss must build it again:
    /// `make` is called once per campaign, and the stream it returns is not
    /// polled until the Lease is won. Items are
    /// discarded: log them inside the stream (`.inspect(...)`, `.map(...)`).
    /// Between terms, the candidate waits with an exponential backoff from
    /// the retry period up to the lease duration, so that a flapping candidate
    /// does not hammer the API server; the backoff starts over after a loss
    /// more than a lease duration after the candidate rejoined (a long term,
    /// or a long wait for one, is no flapping), whether or not the work
    /// yielded (a Controller with nothing to reconcile yields nothing).
    ///
    /// A [`Controller`](kube_runtime::Controller) given here is best wrapped
    /// once more, with
    /// [`LeaderElectionControllerExt::with_leader_election`](crate::LeaderElectionControllerExt::with_leader_election)
    /// before `run`: `run_each_term` guards
    /// the stream it is given as any stream (not polled before the Lease is
    /// won, dropped when it is lost), while the Controller's own wrapping is
    /// what wires [`shutdown_requested`](Self::shutdown_requested) to
    /// `graceful_shutdown_on`, so that a [`shutdown`](Self::shutdown) lets
    /// reconciles in flight finish within its grace instead of aborting them.
    /// The two wrappings hold guards of the same term: one election task, one
    /// renewal loop, no extra request. Without the inner wrapping a shutdown
    /// still ends the work, by dropping it, and the reconciles (tasks of
    /// their own) stop only when the stream is dropped, not on their own at
    /// the renew deadline.
    ///
    /// Returns why it stopped ([`RunEnded`]): every other end of a term
    /// ([`Lost`] other than [`Lost::Shutdown`]) is followed by a new campaign.
    ///
    /// ```no_run
    /// use futures::StreamExt;
    /// use kube_runtime_lease::{LeaderElector, LeaseConfig, unique_identity};
    ///
    /// # async fn doc(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let elector = LeaderElector::new(client, LeaseConfig::new("default", "my-job", unique_identity()))?;
    /// let ended = elector
    ///     .run_each_term(|| futures::stream::repeat(()).then(|()| tokio::time::sleep(std::time::Duration::from_secs(1))))
    ///     .await;
    /// println!("{ended:?}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run_each_term<F: FnMut() -> S, S: Stream>(&self, mut make: F) -> RunEnded {
        let mut backoff = self.config().retry_backoff();
        loop {
            let rejoined = Instant::now();
            let mut guarded = std::pin::pin!(make().with_leader_election(self));
            while guarded.next().await.is_some() {}
            let lost = guarded.as_mut().take_lost();
            // Work wired to `shutdown_requested` (`graceful_shutdown_on`)
            // ends on its own when the elector is shut down: still a shutdown.
            if lost == Some(Lost::Shutdown) || (lost.is_none() && self.is_shut_down()) {
                return RunEnded::Shutdown;
            }
            let Some(lost) = lost else {
                let config = self.config();
                info!(
                    lease.namespace = %config.namespace,
                    lease.name = %config.name,
                    identity = %config.identity,
                    "guarded work ended on its own; leaving the election"
                );
                return RunEnded::WorkEnded;
            };
            if rejoined.elapsed() > self.config().lease_duration {
                backoff = self.config().retry_backoff();
            }
            if !self.wait_to_rejoin(&mut backoff, &lost).await {
                return RunEnded::Shutdown;
            }
        }
    }

    /// Waits the next delay of `backoff` (the lease duration once it is
    /// spent) before campaigning again after `why`: whether to campaign
    /// (`false`: the shutdown began meanwhile, and nothing is left to rejoin).
    pub(crate) async fn wait_to_rejoin(
        &self,
        backoff: &mut RetryBackoff,
        why: &(dyn Display + Sync),
    ) -> bool {
        let delay = backoff.next();
        // In the caller's task (or warm standby's), not the election's:
        // named here.
        let config = self.config();
        warn!(
            lease.namespace = %config.namespace,
            lease.name = %config.name,
            identity = %config.identity,
            reason = %why,
            ?delay,
            "rejoining the election after a backoff"
        );
        let wait = std::pin::pin!(tokio::time::sleep(delay));
        let shutdown = std::pin::pin!(self.shutdown_requested());
        matches!(futures::future::select(wait, shutdown).await, Either::Left(_))
    }
}

impl LeaseConfig {
    /// The backoff before campaigning again after a loss
    /// ([`run_each_term`](crate::LeaderElector::run_each_term), warm
    /// standby, a `LeaseCandidate`'s publication): exponential with jitter
    /// from the retry period up to the lease duration, never giving up. (The
    /// election's own attempts retry every jittered retry period instead.)
    pub(crate) fn retry_backoff(&self) -> RetryBackoff {
        let backoff = backon::ExponentialBuilder::new()
            .with_min_delay(self.retry_period)
            .with_max_delay(self.lease_duration)
            .with_jitter()
            .without_max_times();
        RetryBackoff(backoff.build(), self.lease_duration)
    }
}

/// [`LeaseConfig::retry_backoff`]'s delays.
pub(crate) struct RetryBackoff(ExponentialBackoff, std::time::Duration);

impl RetryBackoff {
    /// The next delay, at most the lease duration: backon adds its jitter
    /// (up to 100 %) after its own cap.
    pub(crate) fn next(&mut self) -> std::time::Duration {
        self.0.next().map_or(self.1, |d| d.min(self.1))
    }
}
