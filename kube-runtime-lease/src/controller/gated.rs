//! A [`Controller`] whose reconciles are gated by a term: each reconcile runs
//! the user's reconciler only if the gate hands it a guard, and races that
//! guard. Shared by warm standby ([`WarmController`](crate::warm::WarmController):
//! the gate is the election's term) and elected shards (the gate is the
//! object's shard's term).

use std::{
    panic::AssertUnwindSafe,
    sync::Arc,
    task::{Poll, ready},
};

use futures::{Stream, StreamExt, TryFuture, TryFutureExt, channel::mpsc, future, stream};
use kube_runtime::{Controller, controller::Action};

use crate::{
    LeaseGuard,
    controller::{ControllerResource, Guarded, RunItem, passed_on, skipped},
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

/// [`Controller::run`] with every reconcile gated by `gate`:
/// - `gate(object)` is asked as the reconcile is scheduled; without a guard
///   the reconcile is skipped (`why` is said at debug level) without
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
///   is reconciled then (with no new LIST);
/// - the stream ends when the Controller's does, and the background is
///   dropped then.
pub(crate) fn run<K, ReconcilerFut, Ctx, S, B>(
    controller: Controller<K>,
    background: impl FnOnce(mpsc::UnboundedSender<()>) -> B,
    gate: impl Fn(&K) -> Option<(LeaseGuard, S)>,
    why: &'static str,
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
        let gated = gate(&object);
        if gated.is_none() {
            skipped(&*object, why);
        }
        let held = Arc::clone(&object);
        let work = gated.map(|(guard, scope)| {
            let work = scope.scope(TryFutureExt::into_future(reconciler(object, ctx)));
            (guard, work)
        });
        async move {
            let Some((guard, work)) = work else {
                return Err(Guarded::Skipped);
            };
            // The guard first: a term that ended (its timer fired at the
            // renew deadline) stops the work before it runs another step.
            let Ok(result) = guard.while_holds(work).await else {
                skipped(&*held, "the term ended during it");
                return Err(Guarded::Skipped);
            };
            result.map_err(Guarded::Reconciler)
        }
    };
    let policy = move |object: Arc<K>, error: &Guarded<ReconcilerFut::Error>, ctx: Arc<Ctx>| match error {
        Guarded::Reconciler(e) => error_policy(object, e, ctx),
        // Reconciled again when a term is gained.
        Guarded::Skipped => Action::await_change(),
    };
    // The stream ends with the Controller's (a graceful shutdown of its own,
    // `shutdown_on_signal`), and the background is dropped then, not when the
    // stream is: it stops campaigning and gives its terms up.
    let controller = controller.run(reconcile, policy, context).filter_map(passed_on);
    let controller = controller.map(Some).chain(stream::iter([None]));
    let background = stream::once(background).filter_map(|()| future::ready(None));
    let run = stream::select(controller, background).scan((), |(), item| future::ready(item));
    dropped_at_end(run)
}

/// `stream`, dropped as soon as it ends, not when the consumer drops the
/// ended stream (the campaign or balancer in it holds guards). A panic (a
/// reconciler's, which kube-runtime resumes in the stream) stops the work as
/// a drop does: the Controller and what hands out the terms go, with the
/// guards they hold, before the panic goes on to the consumer. One that
/// catches it and keeps the stream keeps no term.
pub(crate) fn dropped_at_end<S: Stream>(stream: S) -> impl Stream<Item = S::Item> {
    let mut run = Some(Box::pin(stream));
    stream::poll_fn(move |cx| {
        let Some(polled) = run.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| polled.as_mut().poll_next(cx)));
        let item = ready!(polled.unwrap_or_else(|panic| {
            run = None;
            std::panic::resume_unwind(panic)
        }));
        if item.is_none() {
            run = None;
        }
        Poll::Ready(item)
    })
}
