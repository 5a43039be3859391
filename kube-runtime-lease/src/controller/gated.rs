//! A [`Controller`] whose reconciles are gated by a term: each reconcile runs
//! the user's reconciler only if the gate hands it a guard, and races that
//! guard. Shared by warm standby ([`WarmController`](crate::warm::WarmController):
//! the gate is the election's term) and elected shards (the gate is the
//! object's shard's term).

use std::{fmt::Debug, sync::Arc};

use futures::{Stream, StreamExt, TryFuture, TryFutureExt, channel::mpsc, future, stream};
use kube_runtime::{
    Controller,
    controller::{Action, Error as ControllerError},
};
use tracing::debug;

use crate::{
    LeaseGuard, Lost,
    controller::{ControllerResource, RunItem},
};

/// What a gated reconcile runs in: nothing more (`()`), or a task-local
/// value its reconciler can read (a shard's [`CurrentShard`](crate::shard::CurrentShard)).
pub(crate) trait Scope: Send + 'static {
    /// `work`, run within this scope.
    fn scope<F: Future + Send>(self, work: F) -> impl Future<Output = F::Output> + Send;
}

impl Scope for () {
    fn scope<F: Future + Send>(self, work: F) -> impl Future<Output = F::Output> + Send {
        work
    }
}

/// Why a gated reconcile did not run the user's reconciler, or its error.
#[derive(Debug, thiserror::Error)]
enum Gated<E> {
    /// The gate handed no guard (not leading; the object's shard not held
    /// here): skipped without calling the reconciler.
    #[error("{0}")]
    Skipped(&'static str),
    /// The term ended while the reconcile ran: it was dropped.
    #[error("the term ended during the reconcile: {0}")]
    Lost(Lost),
    #[error(transparent)]
    Reconciler(E),
}

/// [`Controller::run`] with every reconcile gated by `gate`:
/// - `gate(object)` is asked as the reconcile is scheduled; without a guard
///   the reconcile is skipped (`skipped` says why, at debug level) without
///   calling `reconciler`, without an item in the stream, and is not retried
///   (`await_change`: the caller triggers a reconcile of every object when it
///   gains a term);
/// - with one, the reconciler's future runs in the gate's [`Scope`] and races
///   the guard: when the term ends it is dropped at its next `.await`;
/// - the reconciler's own errors go to `error_policy` and into the stream, as
///   [`Controller::run`] gives them;
/// - `background(gained)` (what hands out the terms: a campaign, a
///   balancer) is polled with the stream, for as long as the stream is; it
///   sends on `gained` when a term is gained, and every object in the store
///   is reconciled then (with no new LIST).
pub(crate) fn run<K, ReconcilerFut, Ctx, S, B>(
    controller: Controller<K>,
    background: impl FnOnce(mpsc::UnboundedSender<()>) -> B,
    gate: impl Fn(&K) -> Option<(LeaseGuard, S)>,
    skipped: &'static str,
    mut reconciler: impl FnMut(Arc<K>, Arc<Ctx>) -> ReconcilerFut,
    error_policy: impl Fn(Arc<K>, &ReconcilerFut::Error, Arc<Ctx>) -> Action,
    context: Arc<Ctx>,
) -> impl Stream<Item = RunItem<K, ReconcilerFut::Error>>
where
    K: ControllerResource,
    ReconcilerFut: TryFuture<Ok = Action> + Send + 'static,
    ReconcilerFut::Error: std::error::Error + Send + 'static,
    S: Scope,
    B: Future<Output = ()>,
{
    let (gained_tx, gained_rx) = mpsc::unbounded::<()>();
    let controller = controller.reconcile_all_on(gained_rx);
    let background = background(gained_tx);
    let reconcile = move |object: Arc<K>, ctx: Arc<Ctx>| {
        // Only with a guard is the user's reconciler even called.
        let work = gate(&object).map(|(guard, scope)| {
            let work = scope.scope(TryFutureExt::into_future(reconciler(object, ctx)));
            (guard, work)
        });
        async move {
            let Some((guard, work)) = work else {
                return Err(Gated::Skipped(skipped));
            };
            // The guard first: a term that ended (its timer fired at the
            // renew deadline) stops the work before it runs another step.
            match guard.while_holds(work).await {
                Err(lost) => Err(Gated::Lost(lost)),
                Ok(result) => result.map_err(Gated::Reconciler),
            }
        }
    };
    let policy = move |object: Arc<K>, error: &Gated<ReconcilerFut::Error>, ctx: Arc<Ctx>| match error {
        Gated::Reconciler(e) => error_policy(object, e, ctx),
        // Reconciled again when a term is gained.
        Gated::Skipped(_) | Gated::Lost(_) => Action::await_change(),
    };
    let controller = controller.run(reconcile, policy, context).filter_map(|item| {
        future::ready(match item {
            Ok(done) => Some(Ok(done)),
            Err(ControllerError::ReconcilerFailed(Gated::Reconciler(e), object)) => {
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
    let background = stream::once(background).filter_map(|()| future::ready(None));
    stream::select(controller, background)
}
