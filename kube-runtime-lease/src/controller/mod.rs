//! Leadership for a [`Controller`]: [`LeaderElectionControllerExt`] and the
//! guarded Controller it returns ([`ControllerWithLeaderElection`]).
//! <!-- upstream: omit -->
//! Here too: warm standby (`warm`), and the gated run that warm standby and
//! elected shards share (`gated`).
//! <!-- upstream: end -->
//!
//! The Controller has its own extension trait, apart from
//! [`LeaderElectionStreamExt`](crate::LeaderElectionStreamExt): one trait with
//! a blanket implementation for every stream and one for `Controller` would
//! conflict (E0119).

#[cfg(any(feature = "warm-standby", feature = "unstable-shards"))]
pub(crate) mod gated;
#[cfg(feature = "warm-standby")]
pub(crate) mod warm;

use std::{fmt::Debug, hash::Hash, sync::Arc};

use futures::{FutureExt, Stream, StreamExt, TryFuture, TryFutureExt};
use kube_client::Resource;
use kube_runtime::{
    Controller,
    controller::{Action, Error as ControllerError},
    reflector::{ObjectRef, Store},
    watcher,
};
use serde::de::DeserializeOwned;
use tracing::debug;

use crate::{LeaderElector, WithLeaderElection};

/// The items of a guarded Controller's stream: [`Controller::run`]'s.
pub(crate) type RunItem<K, E> = Result<(ObjectRef<K>, Action), ControllerError<E, watcher::Error>>;

/// The bounds [`Controller::new`] and [`Controller::run`] put on the
/// resource, in one name: every `K` a `Controller<K>` runs on implements it.
pub trait ControllerResource:
    Clone
    + Resource<DynamicType: Eq + Hash + Clone + Debug + Unpin>
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> ControllerResource for K where
    K: Clone
        + Resource<DynamicType: Eq + Hash + Clone + Debug + Unpin>
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// Adds [`with_leader_election`](Self::with_leader_election) to
/// [`Controller`](kube_runtime::Controller).
///
/// Sealed: implemented for [`Controller`](kube_runtime::Controller) only, so
/// that a method added to it breaks no code. A type of your own cannot
/// implement it:
///
/// ```compile_fail,E0277
/// use kube_runtime::Controller;
/// use kube_runtime_lease::{
///     ControllerResource, ControllerWithLeaderElection, LeaderElectionControllerExt, LeaderElector,
/// };
///
/// struct MyController<K: ControllerResource>(Controller<K>);
///
/// impl<K: ControllerResource> LeaderElectionControllerExt<K> for MyController<K> {
///     fn with_leader_election(self, elector: &LeaderElector) -> ControllerWithLeaderElection<K> {
///         self.0.with_leader_election(elector)
///     }
/// }
/// ```
/// <!-- upstream: omit -->
///
/// Unsealed, it made the `warm-standby` feature not additive (see the
/// `warm` module): such an implementation compiled on the core, and
/// failed once anything in the build turned the feature on, which adds the
/// required method `with_leader_election_warm`.
/// <!-- upstream: end -->
pub trait LeaderElectionControllerExt<K: ControllerResource>: sealed::Sealed {
    /// Runs this controller only while `elector`'s candidate leads.
    ///
    /// Call it last, after every other builder method, then
    /// [`run`](ControllerWithLeaderElection::run) as usual. The controller
    /// starts its watches only once the Lease is acquired.
    ///
    /// ## Warning
    /// What happens to reconciles in flight:
    /// - **On loss of leadership** (renew deadline passed, taken over, deleted,
    ///   stepped down): every reconcile in flight is dropped at its next
    ///   `.await` (each races a guard of its term, which ends at the renew
    ///   deadline on its own timer, whether or not the stream is polled
    ///   then), and the controller's stream is dropped when it is next
    ///   polled. A reconcile that is between two `.await`s finishes that step:
    ///   a synchronous step (CPU-bound, or a blocking call) runs to its end,
    ///   past the renew deadline, and only lease duration − renew deadline
    ///   is left before another replica may lead; check
    ///   [`LeaseGuard::is_valid`](crate::LeaseGuard::is_valid) after such a
    ///   step. This is what keeps two replicas from reconciling at the same
    ///   time.
    /// - **On [`LeaderElector::shutdown`]** (SIGTERM handover): the controller
    ///   is shut down gracefully (it is wired to
    ///   [`LeaderElector::shutdown_requested`] through
    ///   [`Controller::graceful_shutdown_on`]): it takes no new work and lets
    ///   the reconciles in flight finish, for up to the grace period given to
    ///   `shutdown`. If they all finished, the Lease is released (a standby
    ///   leads at once); what still runs then is aborted as on a loss, and the
    ///   Lease is left to expire (a standby leads one lease duration after the
    ///   last renewal), since requests the aborted reconciles sent may still
    ///   land.
    /// - **When the Controller's stream ends by force** (kube-runtime's
    ///   [`Controller::shutdown_on_signal`], a second signal): the reconciles
    ///   in flight are aborted as on a loss, and the Lease is left to expire.
    ///   Each reconcile holds a guard of its term, marked unfinished until it
    ///   completes, so aborted work is never taken for finished work.
    /// - **When a reconciler panics** (kube-runtime resumes the panic in the
    ///   Controller's stream): the stream is stopped as if dropped, its
    ///   reconciles aborted and its guard dropped, so the Lease is left to
    ///   expire, and the panic goes on to the consumer.
    ///
    /// A term begins with every object of the first LIST reconciled, all
    /// started at once under kube-runtime's default `concurrency` (no limit): on a
    /// current-thread runtime the election's renewals wait behind them, and
    /// a large store whose reconciles' synchronous steps add up to more than
    /// the renew deadline loses the term in the middle of that storm. Set a
    /// limit ([`Controller::with_config`]) or use the multi-thread runtime.
    ///
    /// Shut the process down with [`LeaderElector::shutdown`], not with the
    /// Controller's own [`Controller::graceful_shutdown_on`] or
    /// [`Controller::shutdown_on_signal`] alone. Those are seen only while
    /// the Controller runs: a standby's is not polled, so it campaigns on.
    /// And kube-runtime 5.0's Controller shut down before its store's first
    /// LIST completed never ends its stream (its graceful shutdown stops the
    /// LIST, and it waits for the store to be filled before it ends): such
    /// a standby, once it wins, holds the Lease without reconciling for as
    /// long as the process lives. (`shutdown` itself ends a Controller
    /// whose first LIST is still in flight at once.) With
    /// [`run_each_term`](LeaderElector::run_each_term), `shutdown_on_signal`
    /// also leaves SIGTERM ignored once a term's Controller ran (kube-runtime
    /// says so), also while the process stands by for a later term.
    ///
    /// A Controller built with kube-runtime's `for_shared_stream` from a
    /// reflector that other parts of the process read holds a subscriber of
    /// it, not polled while this replica stands by: that reflector stops
    /// once its buffer is full (kube-runtime holds each event until every
    /// subscriber has read it), and the store the other parts read goes
    /// stale. Give the guarded Controller a watch of its own.
    /// <!-- upstream: omit -->
    /// Or run it in warm standby, whose Controller runs on every replica.
    /// <!-- upstream: end -->
    ///
    /// ```no_run
    /// use std::{sync::Arc, time::Duration};
    /// use futures::StreamExt;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_client::{Api, Client};
    /// use kube_runtime::{Controller, controller::Action, watcher};
    /// use kube_runtime_lease::{LeaderElectionControllerExt, LeaderElector, LeaseConfig, unique_identity};
    ///
    /// # async fn doc(client: Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let elector = LeaderElector::new(client.clone(), LeaseConfig::new("default", "cm-controller", unique_identity()))?;
    /// let controller = Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
    ///     .with_leader_election(&elector)
    ///     .run(
    ///         |cm, _ctx| async move { Ok::<_, kube_client::Error>(Action::requeue(Duration::from_secs(300))) },
    ///         |_cm, _err, _ctx| Action::requeue(Duration::from_secs(5)),
    ///         Arc::new(()),
    ///     );
    /// let mut controller = std::pin::pin!(controller);
    /// while let Some(result) = controller.next().await {
    ///     tracing::info!(?result, "reconciled");
    /// }
    /// println!("controller stopped: {:?}", controller.lost());
    /// # Ok(())
    /// # }
    /// ```
    fn with_leader_election(self, elector: &LeaderElector) -> ControllerWithLeaderElection<K>;

    /// Runs this controller in warm standby: its watches (the main one,
    /// `owns`, `watches`) and its reflector store run on every replica, and
    /// leadership gates only reconciliation. When this replica wins the Lease
    /// it reconciles every object in its store at once, without a new LIST:
    /// a failover costs the lease duration, not the lease duration plus a full
    /// LIST and cache fill. A follower pays for its cache in memory and in one
    /// watch per resource. See [`WarmController::run`](warm::WarmController::run).
    ///
    /// Built on kube-runtime's stable API: the reconciler is gated by the
    /// term, and [`Controller::reconcile_all_on`] fires when a term begins.
    ///
    /// ```no_run
    /// use std::{sync::Arc, time::Duration};
    /// use futures::StreamExt;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_client::{Api, Client};
    /// use kube_runtime::{Controller, controller::Action, watcher};
    /// use kube_runtime_lease::{LeaderElectionControllerExt, LeaderElector, LeaseConfig, unique_identity};
    ///
    /// # async fn doc(client: Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let elector = LeaderElector::new(client.clone(), LeaseConfig::new("default", "cm-controller", unique_identity()))?;
    /// Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
    ///     .with_leader_election_warm(&elector)
    ///     .run(
    ///         |cm, _ctx| async move { Ok::<_, kube_client::Error>(Action::requeue(Duration::from_secs(300))) },
    ///         |_cm, _err, _ctx| Action::requeue(Duration::from_secs(5)),
    ///         Arc::new(()),
    ///     )
    ///     .for_each(|_| async {})
    ///     .await;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "warm-standby")]
    fn with_leader_election_warm(self, elector: &LeaderElector) -> warm::WarmController<K>;
}

mod sealed {
    /// Implemented for [`Controller`](kube_runtime::Controller) only: see
    /// [`LeaderElectionControllerExt`](super::LeaderElectionControllerExt).
    pub trait Sealed {}

    impl<K: super::ControllerResource> Sealed for kube_runtime::Controller<K> {}
}

impl<K: ControllerResource> LeaderElectionControllerExt<K> for Controller<K> {
    fn with_leader_election(self, elector: &LeaderElector) -> ControllerWithLeaderElection<K> {
        ControllerWithLeaderElection {
            controller: self,
            elector: elector.clone(),
        }
    }

    #[cfg(feature = "warm-standby")]
    fn with_leader_election_warm(self, elector: &LeaderElector) -> warm::WarmController<K> {
        warm::WarmController {
            controller: self,
            elector: elector.clone(),
        }
    }
}

/// A [`Controller`] that runs only while its candidate leads: returned by
/// [`LeaderElectionControllerExt::with_leader_election`]. Start it with
/// [`run`](Self::run).
#[must_use = "call `run` to start the controller"]
pub struct ControllerWithLeaderElection<K: ControllerResource> {
    controller: Controller<K>,
    elector: LeaderElector,
}

impl<K: ControllerResource> ControllerWithLeaderElection<K> {
    /// [`Controller::run`], guarded by leadership: see
    /// [`WithLeaderElection`] for what happens when leadership is won and lost.
    ///
    /// The reconciler is called only while a term is in force: a reconcile
    /// that kube-runtime starts once the term is over (the renew deadline
    /// passed during a step of the poll that starts reconciles), or once
    /// [`LeaderElector::shutdown`] began (before kube-runtime saw its
    /// signal), is skipped without calling it. A skipped reconcile ends at
    /// once (a graceful shutdown does not wait for it), is not retried
    /// (the next term's Controller lists afresh), calls no `error_policy`,
    /// and yields no item: only a line at debug level (`reconcile skipped`).
    pub fn run<ReconcilerFut, Ctx>(
        self,
        mut reconciler: impl FnMut(Arc<K>, Arc<Ctx>) -> ReconcilerFut,
        error_policy: impl Fn(Arc<K>, &ReconcilerFut::Error, Arc<Ctx>) -> Action,
        context: Arc<Ctx>,
    ) -> WithLeaderElection<impl Stream<Item = RunItem<K, ReconcilerFut::Error>>>
    where
        ReconcilerFut: TryFuture<Ok = Action> + Send + 'static,
        ReconcilerFut::Error: std::error::Error + Send + 'static,
    {
        // Each reconcile holds a guard of the term it started in, marked
        // unfinished until it completes: a reconcile dropped in flight
        // (aborted as the stream is dropped, also when kube-runtime ended the
        // stream itself, by a forceful shutdown) leaves the Lease to expire
        // rather than released, whatever the stream's own end looked like.
        // And it races that guard: kube-runtime spawns each reconcile as a
        // task, which the stream's drop aborts only once the stream is
        // polled again; a consumer busy elsewhere would let it run past the
        // renew deadline. At the term's end the reconciler's future is
        // dropped at its next `.await`, and the task waits for the stream's
        // drop to abort it (it has no output to give).
        let elector = self.elector.clone();
        let reconciler = move |object: Arc<K>, ctx: Arc<Ctx>| {
            // Only with a guard is the user's reconciler even called: the
            // term may have ended, or the shutdown begun, since the guarded
            // stream's check at the start of this poll.
            let guard = elector.current_guard();
            if guard.is_none() {
                skipped(&*object, "no term in force (over, or the shutdown began)");
            }
            let work = guard.map(|guard| (guard, TryFutureExt::into_future(reconciler(object, ctx))));
            async move {
                let Some((guard, work)) = work else {
                    return Err(Guarded::Skipped);
                };
                match guard.while_holds(work).await {
                    Ok(result) => result.map_err(Guarded::Reconciler),
                    Err(_) => futures::future::pending().await,
                }
            }
        };
        let error_policy =
            move |object: Arc<K>, error: &Guarded<ReconcilerFut::Error>, ctx: Arc<Ctx>| match error {
                Guarded::Reconciler(e) => error_policy(object, e, ctx),
                Guarded::Skipped => Action::await_change(),
            };
        let store = self.controller.store();
        let stream = self
            .controller
            .graceful_shutdown_on(self.elector.shutdown_requested())
            .run(reconciler, error_policy, context)
            .filter_map(passed_on);
        let stream = ended_if_unstarted(stream, store, self.elector.clone());
        WithLeaderElection::new(stream, &self.elector)
    }
}

/// `stream`, a Controller's run wired to `elector`'s shutdown by
/// `graceful_shutdown_on`, ended at once when the shutdown comes before
/// `store` is ready: kube-runtime starts no reconcile before its store's
/// first LIST, and its graceful shutdown stops that LIST, so the stream
/// would never end. No reconcile ran: it ends as finished work does.
pub(crate) fn ended_if_unstarted<S: Stream, K: ControllerResource>(
    stream: S,
    store: Store<K>,
    elector: LeaderElector,
) -> impl Stream<Item = S::Item> {
    stream.take_until(async move {
        elector.shutdown_requested().await;
        if let Some(Ok(())) = store.wait_until_ready().now_or_never() {
            std::future::pending::<()>().await;
        }
    })
}

/// A guarded reconcile that did not call the user's reconciler (no guard of
/// a term in force), or ended without finishing it (the term ended during
/// it, a gated reconcile: see `gated.rs`), or the reconciler's own error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Guarded<E> {
    #[error("skipped")]
    Skipped,
    #[error(transparent)]
    Reconciler(E),
}

/// Says at debug level that the reconcile of `object` is skipped, and why:
/// said as it is scheduled, since a skip once the term is over yields no
/// item before the stream is dropped.
pub(crate) fn skipped<K: Resource>(object: &K, why: &str) {
    let meta = object.meta();
    debug!(
        object = meta.name.as_deref().unwrap_or_default(),
        namespace = meta.namespace.as_deref().unwrap_or_default(),
        "reconcile skipped: {why}"
    );
}

/// A guarded run's item as [`Controller::run`] gives the user's reconciler
/// one; none for a reconcile that was skipped (the caller reconciles every
/// object again when a term is gained, or lists afresh in the next term).
pub(crate) fn passed_on<K: Resource, E>(
    item: RunItem<K, Guarded<E>>,
) -> std::future::Ready<Option<RunItem<K, E>>> {
    std::future::ready(match item {
        Ok(done) => Some(Ok(done)),
        Err(ControllerError::ReconcilerFailed(Guarded::Reconciler(e), object)) => {
            Some(Err(ControllerError::ReconcilerFailed(e, object)))
        }
        Err(ControllerError::ReconcilerFailed(Guarded::Skipped, _)) => None,
        Err(ControllerError::ObjectNotFound(object)) => Some(Err(ControllerError::ObjectNotFound(object))),
        Err(ControllerError::QueueError(e)) => Some(Err(ControllerError::QueueError(e))),
        Err(ControllerError::RunnerError(e)) => Some(Err(ControllerError::RunnerError(e))),
    })
}

impl<K: ControllerResource> std::fmt::Debug for ControllerWithLeaderElection<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerWithLeaderElection")
            .field("elector", &self.elector)
            .finish_non_exhaustive()
    }
}
