//! Warm standby for a guarded [`Controller`]
//! ([`LeaderElectionControllerExt::with_leader_election_warm`](crate::LeaderElectionControllerExt::with_leader_election_warm)):
//! the Controller's watches and its reflector store run on every replica;
//! leadership gates only reconciliation.

use std::{fmt::Debug, hash::Hash, pin::pin, sync::Arc};

use futures::{
    FutureExt, Stream, StreamExt, TryFuture, TryFutureExt,
    channel::mpsc,
    future::{self, Either},
    stream,
};
use kube_client::Resource;
use kube_runtime::{
    Controller,
    controller::{Action, Error as ControllerError},
    reflector::ObjectRef,
    watcher,
};
use serde::de::DeserializeOwned;
use tracing::debug;

use crate::{LeaderElector, Lost};

/// A [`Controller`] in warm standby: returned by
/// [`LeaderElectionControllerExt::with_leader_election_warm`](crate::LeaderElectionControllerExt::with_leader_election_warm).
/// Start it with [`run`](Self::run).
#[must_use = "call `run` to start the controller"]
pub struct WarmController<K>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    pub(crate) controller: Controller<K>,
    pub(crate) elector: LeaderElector,
}

/// Why a reconcile did not run the user's reconciler, or its error.
#[derive(Debug, thiserror::Error)]
enum Warm<E> {
    /// This replica does not lead: the reconcile is skipped (the store is
    /// never used to act on a follower).
    #[error("not leading")]
    NotLeading,
    /// The term ended while the reconcile ran: it was dropped.
    #[error("leadership ended during the reconcile: {0}")]
    Lost(Lost),
    #[error(transparent)]
    Reconciler(E),
}

impl<K> WarmController<K>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    /// [`Controller::run`] in warm standby.
    ///
    /// The watches run and the store stays current whether or not this
    /// replica leads; the reconciler runs only while it leads:
    /// - on a follower, scheduled reconciles are skipped without calling
    ///   `reconciler` (and without an item in the returned stream);
    /// - when a term begins, every object in the store is reconciled at once
    ///   (as on a cold start, with no new LIST);
    /// - when a term ends, reconciles in flight are dropped at their next
    ///   `.await`, as with [`with_leader_election`](crate::LeaderElectionControllerExt::with_leader_election),
    ///   and the replica campaigns again by itself, its caches still running
    ///   (no [`run_each_term`](LeaderElector::run_each_term) needed);
    /// - on [`LeaderElector::shutdown`] the Controller shuts down gracefully
    ///   (reconciles in flight finish within the grace), and the stream ends.
    #[allow(clippy::type_complexity)] // the item type of `Controller::run`, spelled out
    pub fn run<ReconcilerFut, Ctx>(
        self,
        mut reconciler: impl FnMut(Arc<K>, Arc<Ctx>) -> ReconcilerFut,
        error_policy: impl Fn(Arc<K>, &ReconcilerFut::Error, Arc<Ctx>) -> Action,
        context: Arc<Ctx>,
    ) -> impl Stream<Item = Result<(ObjectRef<K>, Action), ControllerError<ReconcilerFut::Error, watcher::Error>>>
    where
        K::DynamicType: Debug + Unpin,
        ReconcilerFut: TryFuture<Ok = Action> + Send + 'static,
        ReconcilerFut::Error: std::error::Error + Send + 'static,
    {
        let elector = self.elector;
        let (terms_tx, terms_rx) = mpsc::unbounded::<()>();
        let gate = elector.clone();
        let reconcile = move |object: Arc<K>, ctx: Arc<Ctx>| {
            // Only while a term holds is the user's reconciler even called.
            let work = gate
                .current_guard()
                .map(|guard| (guard, TryFutureExt::into_future(reconciler(object, ctx))));
            async move {
                let Some((guard, work)) = work else {
                    return Err(Warm::NotLeading);
                };
                match future::select(pin!(work), guard).await {
                    Either::Left((result, _guard)) => result.map_err(Warm::Reconciler),
                    Either::Right((lost, _dropped)) => Err(Warm::Lost(lost)),
                }
            }
        };
        let policy = move |object: Arc<K>, error: &Warm<ReconcilerFut::Error>, ctx: Arc<Ctx>| match error {
            Warm::Reconciler(e) => error_policy(object, e, ctx),
            // Reconciled again when the next term begins.
            Warm::NotLeading | Warm::Lost(_) => Action::await_change(),
        };
        let controller = self
            .controller
            .reconcile_all_on(terms_rx)
            .graceful_shutdown_on(elector.shutdown_requested())
            .run(reconcile, policy, context)
            .filter_map(|item| {
                future::ready(match item {
                    Ok(done) => Some(Ok(done)),
                    Err(ControllerError::ReconcilerFailed(Warm::Reconciler(e), object)) => {
                        Some(Err(ControllerError::ReconcilerFailed(e, object)))
                    }
                    Err(ControllerError::ReconcilerFailed(skipped, object)) => {
                        debug!(%object, reason = %skipped, "reconcile skipped");
                        None
                    }
                    Err(ControllerError::ObjectNotFound(object)) => {
                        Some(Err(ControllerError::ObjectNotFound(object)))
                    }
                    Err(ControllerError::QueueError(e)) => Some(Err(ControllerError::QueueError(e))),
                    Err(ControllerError::RunnerError(e)) => Some(Err(ControllerError::RunnerError(e))),
                })
            });
        // Campaigns for as long as the stream is polled, polled with it.
        let campaign = stream::once(hold_each_term(elector, terms_tx)).filter_map(|()| future::ready(None));
        stream::select(controller, campaign)
    }
}

/// Holds a guard of every term this candidate wins (so that it always
/// campaigns) and asks for every object to be reconciled when a term begins,
/// until the elector shuts down. The guard is dropped as soon as shutdown is
/// requested, so that shutdown waits only for reconciles in flight.
async fn hold_each_term(elector: LeaderElector, terms: mpsc::UnboundedSender<()>) {
    let shutdown = elector.shutdown_requested().shared();
    loop {
        let acquired = match future::select(pin!(elector.acquire()), shutdown.clone()).await {
            Either::Left((Ok(guard), _)) => guard,
            Either::Left((Err(_), _)) | Either::Right(_) => return,
        };
        debug!(
            fencing_token = acquired.fencing_token(),
            "leading: reconciling every object in the store"
        );
        let _ = terms.unbounded_send(());
        match future::select(acquired, shutdown.clone()).await {
            Either::Left((Lost::Shutdown, _)) | Either::Right(_) => return,
            Either::Left((lost, _)) => {
                debug!(reason = %lost, "leadership ended: reconciles stop, the caches keep running");
            }
        }
    }
}

impl<K> std::fmt::Debug for WarmController<K>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmController")
            .field("elector", &self.elector)
            .finish_non_exhaustive()
    }
}
