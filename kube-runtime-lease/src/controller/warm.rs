//! Warm standby for a guarded [`Controller`]
//! ([`LeaderElectionControllerExt::with_leader_election_warm`](crate::LeaderElectionControllerExt::with_leader_election_warm)):
//! the Controller's watches and its reflector store run on every replica;
//! leadership gates only reconciliation.

use std::{pin::pin, sync::Arc};

use futures::{
    FutureExt, Stream, TryFuture,
    channel::mpsc,
    future::{self, Either},
};
use kube_runtime::{Controller, controller::Action};
use tracing::debug;

use crate::{
    AcquireError, LeaderElector, Lost,
    controller::{ControllerResource, RunItem},
};

/// A [`Controller`] in warm standby: returned by
/// [`LeaderElectionControllerExt::with_leader_election_warm`](crate::LeaderElectionControllerExt::with_leader_election_warm).
/// Start it with [`run`](Self::run).
#[must_use = "call `run` to start the controller"]
pub struct WarmController<K>
where
    K: ControllerResource,
{
    pub(crate) controller: Controller<K>,
    pub(crate) elector: LeaderElector,
}

impl<K> WarmController<K>
where
    K: ControllerResource,
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
    ///   (reconciles in flight finish within the grace), and the stream ends;
    /// - when a reconciler panics (kube-runtime resumes the panic in the
    ///   stream), the Controller and the campaign are dropped with their
    ///   guards before the panic goes on to the consumer: the Lease is given
    ///   up, and a consumer that catches the panic and polls again gets `None`;
    /// - when the Controller's stream ends on its own (its own
    ///   [`Controller::graceful_shutdown_on`] or
    ///   [`Controller::shutdown_on_signal`]), the stream ends and the replica
    ///   leaves the election: a leader releases the Lease once its reconciles
    ///   finished, a follower campaigns no more.
    ///
    /// ## Warning
    /// A new term reconciles from the store as it is when the term begins,
    /// without waiting for it to catch up: a watch that lags or has stalled
    /// (it is reconnected only at kube-runtime's idle timeout, minutes) hands
    /// the reconciler objects older than the previous leader's last writes.
    /// controller-runtime's warm informers behave the same way; a cold
    /// [`with_leader_election`](crate::LeaderElectionControllerExt::with_leader_election)
    /// LISTs at the takeover instead. Write as the crate's *Fencing* section
    /// says (the resourceVersion that was read as the precondition): a write
    /// made from a stale object then fails with a conflict and is retried
    /// once the watch delivers the newer one, instead of undoing that write.
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
        let elector = self.elector;
        let gate = elector.clone();
        let store = self.controller.store();
        let unstarted = elector.clone();
        let controller = self.controller.graceful_shutdown_on(elector.shutdown_requested());
        let stream = crate::controller::gated::run(
            controller,
            // Campaigns for as long as the stream is polled, polled with it.
            |terms| hold_each_term(elector, terms),
            // Only while a term holds is the user's reconciler even called.
            move |_: &K| gate.current_guard().map(|guard| (guard, ())),
            "not leading",
            reconciler,
            error_policy,
            context,
        );
        // Dropped as it ends: `take_until` keeps the campaign, and its guard.
        crate::controller::gated::dropped_at_end(crate::controller::ended_if_unstarted(
            stream, store, unstarted,
        ))
    }
}

/// Holds a guard of every term this candidate wins (so that it always
/// campaigns) and asks for every object to be reconciled when a term begins,
/// until the elector shuts down. The guard is dropped as soon as shutdown is
/// requested, so that shutdown waits only for reconciles in flight. An
/// election task that stopped (its waiters fail with `ElectorStopped`) is
/// followed by a new campaign after a backoff, as in
/// [`LeaderElector::run_each_term`].
async fn hold_each_term(elector: LeaderElector, terms: mpsc::UnboundedSender<()>) {
    let shutdown = elector.shutdown_requested().shared();
    let config = elector.config();
    let mut backoff = config.retry_backoff();
    loop {
        let acquired = match future::select(pin!(elector.acquire()), shutdown.clone()).await {
            Either::Left((Ok(guard), _)) => {
                backoff = config.retry_backoff();
                guard
            }
            Either::Left((Err(e @ AcquireError::ElectorStopped), _)) => {
                if elector.wait_to_rejoin(&mut backoff, &e).await {
                    continue;
                }
                return;
            }
            Either::Left((Err(_), _)) | Either::Right(_) => return,
        };
        // Polled with the consumer's stream, not in the election's span.
        debug!(
            lease.namespace = %config.namespace,
            lease.name = %config.name,
            fencing_token = acquired.fencing_token(),
            "leading: reconciling every object in the store"
        );
        let _ = terms.unbounded_send(());
        match future::select(acquired, shutdown.clone()).await {
            Either::Left((Lost::Shutdown, _)) | Either::Right(_) => return,
            Either::Left((lost, _)) => {
                debug!(
                    lease.namespace = %config.namespace,
                    lease.name = %config.name,
                    reason = %lost,
                    "leadership ended: reconciles stop, the caches keep running"
                );
            }
        }
    }
}

impl<K> std::fmt::Debug for WarmController<K>
where
    K: ControllerResource,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmController")
            .field("elector", &self.elector)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        },
        time::Duration,
    };

    use futures::{
        FutureExt, StreamExt,
        channel::{mpsc, oneshot},
    };
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_runtime::{Controller, controller::Action, watcher};

    use crate::{
        LeaderElectionControllerExt, LeaderElector,
        elector::test_hooks::Point,
        test_util::FakeLeaseApi,
        tests::support::{config, elector, free, held_by, holder, paused},
    };

    /// Warm standby campaigns for as long as its stream is polled: an
    /// election task that stopped (it panicked, so its waiters fail with
    /// `ElectorStopped`; the next `acquire` starts a new one) is followed by a
    /// new campaign, as in `run_each_term`, not by a replica whose caches run
    /// on but which never campaigns again.
    #[test]
    fn warm_standby_campaigns_again_after_the_election_task_stopped() {
        paused(async {
            let fake = FakeLeaseApi::default();
            // Another candidate leads, then stops renewing: its record expires
            // 5 s after it was first seen.
            fake.put(held_by("other", 5));
            let (e, _) = elector(&fake, config("me"));
            e.interleave_for_test(Point::Recount, || panic!("injected: the election task panics"));
            let (terms, mut began) = mpsc::unbounded();
            let hold = tokio::spawn(super::hold_each_term(e.clone(), terms));
            let led = tokio::time::timeout(Duration::from_secs(60), began.next()).await;
            assert!(
                matches!(led, Ok(Some(()))),
                "never led within 60 s of a 5 s lease: {led:?}; the warm standby's campaign ended: {}",
                hold.is_finished()
            );
            assert!(e.is_leader());
        });
    }

    /// A warm-standby Controller that kube-runtime ends gracefully on its own
    /// trigger (the user's `graceful_shutdown_on`, or the first SIGTERM of
    /// `shutdown_on_signal`), not through `LeaderElector::shutdown`, ends its
    /// stream as a plain or cold guarded Controller does, and its candidate
    /// stops campaigning: a leader releases the Lease, a follower never takes
    /// it. The campaign ran beside the Controller until the elector's own
    /// shutdown, so the stream never ended (the process did not exit) and
    /// the Lease stayed with a replica whose Controller had stopped.
    #[test]
    fn a_warm_controller_ended_by_its_own_graceful_shutdown_ends_and_leaves_the_election() {
        paused(async {
            let fake = free();
            let mut runs = Vec::new();
            let mut stops = Vec::new();
            for identity in ["a", "b"] {
                let (e, _) = elector(&fake, config(identity));
                let (client, _) = fake.client();
                let (stop, stopped) = oneshot::channel::<()>();
                let controller = Controller::new(
                    kube_client::Api::<Lease>::namespaced(client, "default"),
                    watcher::Config::default(),
                );
                let store = controller.store();
                let controller = controller
                    .graceful_shutdown_on(stopped.map(drop))
                    .with_leader_election_warm(&e)
                    .run(
                        |_, _: Arc<()>| async { Ok::<_, kube_client::Error>(Action::await_change()) },
                        |_, _, _| Action::await_change(),
                        Arc::new(()),
                    );
                // The consumer keeps the stream once it ended (`lost()`
                // read after the loop, as the README does).
                let ended = Arc::new(AtomicBool::new(false));
                tokio::spawn({
                    let ended = ended.clone();
                    async move {
                        let mut controller = std::pin::pin!(controller);
                        while controller.next().await.is_some() {}
                        ended.store(true, Ordering::SeqCst);
                        futures::future::pending::<()>().await;
                    }
                });
                runs.push((e.clone(), ended));
                stops.push(stop);
                // `a` leads before `b` campaigns; each store is filled (a
                // graceful shutdown before that never ends: kube-runtime's).
                let led = tokio::time::timeout(Duration::from_secs(30), async {
                    while holder(&fake).as_deref() != Some("a") {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    store.wait_until_ready().await
                })
                .await;
                assert!(
                    matches!(led, Ok(Ok(()))),
                    "a never led, or {identity}'s store was never filled: {led:?}, the Lease is held by {:?}",
                    holder(&fake)
                );
            }
            // The follower's Controller first, then the leader's.
            for stop in stops.into_iter().rev() {
                stop.send(()).unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
            let ended: Vec<_> = runs
                .iter()
                .map(|(_, ended)| ended.load(Ordering::SeqCst))
                .collect();
            let leading: Vec<_> = runs.iter().map(|(e, _)| e.is_leader()).collect();
            assert!(
                ended == [true, true] && holder(&fake).as_deref() == Some(""),
                "30 s after their own graceful shutdown, the warm Controllers' streams ended: \
                 {ended:?} (a, b), they lead: {leading:?}, the Lease is held by {:?}",
                holder(&fake)
            );
            for (e, _) in runs {
                e.shutdown(Duration::ZERO).await.ok();
            }
        });
    }

    /// A warm-standby Controller of `e` over Leases, on a client of `fake`
    /// whose answers take 30 s: its first LIST is in flight for that long.
    fn slow_listing(fake: &FakeLeaseApi, e: &LeaderElector) -> impl futures::Stream + Send + use<> {
        let (client, listing) = fake.client();
        fake.set_latency(listing, Duration::from_secs(30));
        Controller::new(
            kube_client::Api::<Lease>::namespaced(client, "default"),
            watcher::Config::default(),
        )
        .with_leader_election_warm(e)
        .run(
            |_, _: Arc<()>| async { Ok::<_, kube_client::Error>(Action::await_change()) },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        )
    }

    /// A warm-standby Controller whose elector is shut down before its store
    /// was first filled (a pod stopped soon after it started, its LIST
    /// still in flight) ends its stream: kube-runtime's graceful shutdown
    /// stops that LIST and then waits for the store for ever, so the stream
    /// never ended and the process did not exit.
    #[test]
    fn a_warm_controller_shut_down_before_its_store_was_filled_ends() {
        paused(async {
            let fake = free();
            let (e, _) = elector(&fake, config("a"));
            let controller = slow_listing(&fake, &e);
            let run = tokio::spawn(controller.count());
            tokio::time::sleep(Duration::from_secs(1)).await;
            let shutdown = e.shutdown(Duration::from_secs(20)).await;
            let ended = tokio::time::timeout(Duration::from_secs(60), run).await;
            assert!(
                matches!(ended, Ok(Ok(0))) && holder(&fake).as_deref() == Some(""),
                "shut down during its first LIST ({shutdown:?}), the warm Controller's stream \
                 ended: {ended:?}, the Lease is held by {:?}",
                holder(&fake)
            );
        });
    }

    /// The same with a consumer that keeps the ended stream (it reads
    /// `lost()` after its loop, or the stream lives in `main`'s frame while
    /// another task shuts the elector down): the campaign and its guard go
    /// when the stream ends, so a leader shut down during its first LIST is
    /// released at once, not after the grace and a lease duration.
    #[test]
    fn a_warm_leader_shut_down_before_its_store_was_filled_is_released_with_the_stream_kept() {
        paused(async {
            let fake = free();
            let (e, _) = elector(&fake, config("a"));
            let controller = slow_listing(&fake, &e);
            let end = crate::tests::support::kept_once_ended(controller);
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(holder(&fake).as_deref(), Some("a"));
            let started = tokio::time::Instant::now();
            let shutdown = e.shutdown(Duration::from_secs(20)).await;
            let took = started.elapsed();
            let ended = tokio::time::timeout(Duration::from_secs(60), end).await;
            assert!(
                took < Duration::from_secs(1)
                    && matches!(ended, Ok(Ok(())))
                    && holder(&fake).as_deref() == Some(""),
                "a warm leader shut down during its first LIST, its ended stream kept: shutdown returned \
                 {shutdown:?} after {took:?}, the stream ended: {ended:?}, the Lease is held by {:?}",
                holder(&fake)
            );
        });
    }
}
