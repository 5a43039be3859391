//! A [`Controller`] across the replicas of a sharded election: one watch per
//! resource on every replica (its store kept warm), each object reconciled
//! only by the replica that holds its shard, each reconcile racing its
//! shard's guard.

use std::{collections::BTreeSet, fmt::Debug, sync::Arc};

use futures::{Stream, StreamExt, TryFuture, channel::mpsc, stream};
use kube_runtime::{Controller, controller::Action};

use super::ShardedElector;
use crate::controller::{ControllerResource, RunItem};

/// The shard a reconcile of a [`ShardedController`] works for, and its term's
/// fencing token: see [`current_shard`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CurrentShard {
    /// The object's shard.
    pub shard: u16,
    /// The fencing token of this replica's term on that shard (see
    /// [`LeaseGuard::fencing_token`](crate::LeaseGuard::fencing_token)).
    pub fencing_token: i64,
}

tokio::task_local! {
    static CURRENT: CurrentShard;
}

impl crate::controller::gated::Scope for CurrentShard {
    fn scope<F: Future + Send>(self, work: F) -> impl Future<Output = F::Output> + Send {
        CURRENT.scope(self, work)
    }
}

/// Inside a reconcile run by a [`ShardedController`] (while its future is
/// polled, not when the reconciler function is called): the shard and the
/// fencing token of that shard's term, to write beside the reconcile's side
/// effects. `None` anywhere else.
#[must_use]
pub fn current_shard() -> Option<CurrentShard> {
    CURRENT.try_with(|c| *c).ok()
}

/// A [`Controller`] whose objects are reconciled by the replica that holds
/// their shard: see [`ShardedElector::controller`]. Start it with
/// [`run`](Self::run).
#[must_use = "call `run` to start the controller"]
pub struct ShardedController<K>
where
    K: ControllerResource,
{
    controller: Controller<K>,
    sharded: ShardedElector,
}

impl<K> std::fmt::Debug for ShardedController<K>
where
    K: ControllerResource,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedController")
            .field("sharded", &self.sharded)
            .finish_non_exhaustive()
    }
}

impl ShardedElector {
    /// `controller`, sharded by this election: see [`ShardedController::run`].
    pub fn controller<K>(&self, controller: Controller<K>) -> ShardedController<K>
    where
        K: ControllerResource,
    {
        ShardedController {
            controller,
            sharded: self.clone(),
        }
    }
}

impl<K> ShardedController<K>
where
    K: ControllerResource,
{
    /// [`Controller::run`], sharded, with the election's balancer running
    /// as long as the stream is polled:
    /// - a reconcile of an object whose shard this replica does not hold is
    ///   skipped without calling `reconciler` (and without an item);
    /// - when a shard is gained, every object in the store is reconciled (the
    ///   ones of other shards are skipped): no LIST; those of the shards held
    ///   already are reconciled again too (kube-runtime's stable API triggers
    ///   all objects or none), so a replica that gains 2 shards beside the 4
    ///   it holds reconciles 6 shards' objects;
    /// - when a shard is lost, that shard's reconciles in flight are dropped
    ///   at their next `.await`; the other shards' continue;
    /// - when a shard is handed over to another replica, its reconciles in
    ///   flight may finish within the reconcile grace
    ///   ([`ShardConfig::reconcile_grace`](super::ShardConfig::reconcile_grace)),
    ///   and the shard is released as they end; those still running at its
    ///   end are dropped, and the shard's Lease expires for its new owner;
    /// - inside a reconcile, [`current_shard`] tells its shard and fencing
    ///   token;
    /// - when the Controller's stream ends on its own (its own
    ///   [`Controller::graceful_shutdown_on`] or
    ///   [`Controller::shutdown_on_signal`]), the stream ends and the
    ///   balancer with it: every shard is given up, as when the stream is
    ///   dropped;
    /// - on [`ShardedElector::shutdown`] the Controller shuts down gracefully
    ///   (reconciles in flight finish within the grace), and the stream ends
    ///   once the shutdown returned: every shard released and the roster
    ///   left.
    pub fn run<ReconcilerFut, Ctx>(
        self,
        reconciler: impl FnMut(Arc<K>, Arc<Ctx>) -> ReconcilerFut,
        error_policy: impl Fn(Arc<K>, &ReconcilerFut::Error, Arc<Ctx>) -> Action,
        context: Arc<Ctx>,
    ) -> impl Stream<Item = RunItem<K, ReconcilerFut::Error>>
    where
        ReconcilerFut: TryFuture<Ok = Action> + Send + 'static,
        ReconcilerFut::Error: std::error::Error + Send + 'static,
    {
        let sharded = self.sharded;
        let (gate, done, first) = (sharded.clone(), sharded.clone(), sharded.inner.shards[0].clone());
        let store = self.controller.store();
        // `shutdown` shuts every shard's elector down at once, after leaving the roster.
        let controller = self.controller.graceful_shutdown_on(first.shutdown_requested());
        let stream = crate::controller::gated::run(
            controller,
            // The balancer runs, and gains are signalled, while the stream is polled.
            |gained| async move {
                futures::join!(sharded.run(), signal_gains(sharded.clone(), gained));
            },
            // Only on the replica holding the object's shard is the user's
            // reconciler even called, within that shard's `current_shard`.
            move |object: &K| {
                let shard = gate.shard_of(object.meta().uid.as_deref()?);
                let guard = gate.guard(shard)?;
                let current = CurrentShard {
                    shard,
                    fencing_token: guard.fencing_token(),
                };
                Some((guard, current))
            },
            "the object's shard is not held here",
            reconciler,
            error_policy,
            context,
        );
        // Dropped as it ends (`take_until` keeps the balancer), and ended by
        // `shutdown` only once that returned: its releases written.
        let stream = crate::controller::gated::dropped_at_end(crate::controller::ended_if_unstarted(
            stream, store, first,
        ));
        stream.chain(
            stream::once(async move { done.shut_down_finished().await })
                .filter_map(|()| std::future::ready(None)),
        )
    }
}

/// Sends on `gained` whenever the set of shards held grows.
async fn signal_gains(sharded: ShardedElector, gained: mpsc::UnboundedSender<()>) {
    let mut held = sharded.held();
    let mut before: BTreeSet<u16> = held.borrow_and_update().clone();
    while held.changed().await.is_ok() {
        let now = held.borrow_and_update().clone();
        if !now.is_subset(&before) && gained.unbounded_send(()).is_err() {
            return;
        }
        before = now;
    }
}
