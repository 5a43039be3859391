//! [`LeaderElector`]: the election loop (acquire, renew, release, observe) and
//! the handle that shares it.

mod acquire;
mod api;
mod extras;
mod memory;
mod observer;
mod status;
mod supervise;
mod task;
#[cfg(test)]
pub(crate) mod test_hooks;
#[cfg(test)]
mod tests;

use std::{future::Future, sync::Arc, time::Duration};

use futures::{FutureExt, channel::oneshot, future::Shared};
use kube_client::{Api, Client};
use parking_lot::Mutex;
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
    time::Instant,
};
use tracing::{info, warn};

pub use self::{
    acquire::Acquire,
    status::{HealthError, LeaderStatus},
};
use self::{api::LeaseApi, memory::Memory, observer::Observers, supervise::join};
pub(crate) use self::{
    observer::{Observer, Transition},
    task::Silence,
};
use crate::{
    config::{ConfigError, LeaseConfig},
    error::{Result, ShutdownError},
    guard::LeaseGuard,
    record,
    term::{Lost, Term},
};

/// A candidate in the election for one Lease: a cheap, cloneable handle.
///
/// One elector runs one background task per Lease, however many streams,
/// controllers and guards share it: one renewal loop and one set of API calls.
/// Leadership is campaigned for only while somebody wants it (a pending
/// [`acquire`](Self::acquire), a guarded stream, or a live [`LeaseGuard`]);
/// when the last of them is gone the Lease is released.
///
/// # Protocol
/// client-go's `leaderelection` protocol on a `coordination.k8s.io/v1` Lease,
/// so that Go and Rust candidates honour each other:
/// - expiry is judged only from how long this candidate has seen the record
///   unchanged, on its own monotonic clock, for the record's
///   `leaseDurationSeconds` (never from `renewTime`);
/// - writes are `replace` calls carrying the resourceVersion read, so a lost
///   race is a 409 and never a silent overwrite; `strategy` and
///   `preferredHolder` are never cleared;
/// - the leader renews every retry period with one request (no read while its
///   cached record is valid) and gives up when no renewal succeeded within the
///   renew deadline, counted from the instant before the request was sent;
///   every request is bounded by the time left;
/// - candidates also watch the Lease, so that a released Lease is taken
///   within one event and one write, and an expired one on a timer at the
///   exact instant it expires (see [`LeaseConfig::watch`]).
#[derive(Clone)]
pub struct LeaderElector {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    config: LeaseConfig,
    api: LeaseApi,
    wake: Arc<Notify>,
    state: Mutex<State>,
    /// Notified whenever a task ends (see [`State::running`]).
    task_ended: Notify,
    status: watch::Sender<LeaderStatus>,
    shutdown_tx: Mutex<Option<oneshot::Sender<()>>>,
    shutdown_rx: Shared<oneshot::Receiver<()>>,
    /// Told of every transition (none unless an observer was added).
    observers: Observers,
}

#[derive(Default)]
struct State {
    waiters: Vec<oneshot::Sender<LeaseGuard>>,
    /// The term in force, once begun (not during a creation hold).
    term: Option<Arc<Term>>,
    /// Whether an election task runs: one at a time talks to the API, and
    /// the next one starts only after the last one ended (its release
    /// included) or was dropped, whatever runtime either was spawned on (see
    /// [`supervise`]).
    running: bool,
    /// The newest task, for `shutdown` to await its release.
    task: Option<JoinHandle<Result<()>>>,
    /// Counts tasks spawned: whose handle `task` is.
    spawned: u64,
    shutdown: bool,
    /// What the elector remembers of the Lease, between tasks (the running
    /// task owns it: [`Task`](task::Task)).
    memory: Memory,
    /// The extras' part: which election is in force (Coordinated Leader
    /// Election), a record handed over by elected shards (see
    /// `LeaderElector::hand_over_record`); empty without their features.
    #[allow(dead_code, reason = "only the extras read it (elector/extras.rs)")]
    extras: extras::State,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.inner.config)
            .field("status", &*self.inner.status.borrow())
            .finish_non_exhaustive()
    }
}

impl LeaderElector {
    /// A candidate for the Lease described by `config`, using `client`.
    ///
    /// Makes no API call: the election starts when leadership is first wanted
    /// ([`acquire`](Self::acquire) or a guarded stream is polled).
    ///
    /// # Errors
    /// The first rule `config` breaks (see [`LeaseConfig::validate`]).
    pub fn new(client: Client, config: LeaseConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let state = State::default();
        // Coordinated: the identity is the LeaseCandidate's name, and the
        // election waits for the API server's first answer. (A line of its
        // own, with this comment: the upstream generator drops both.)
        let (config, state) = extras::set_up(config, state);
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        Ok(LeaderElector {
            inner: Arc::new(Inner {
                observers: Observers::default(),
                api: LeaseApi {
                    api: Api::namespaced(client, &config.namespace),
                    name: config.name.clone(),
                    contact: Arc::default(),
                    detached: Arc::default(),
                },
                config,
                wake: Arc::new(Notify::new()),
                state: Mutex::new(state),
                task_ended: Notify::new(),
                status: watch::Sender::new(LeaderStatus::default()),
                shutdown_tx: Mutex::new(Some(shutdown_tx)),
                shutdown_rx: shutdown_rx.shared(),
            }),
        })
    }

    /// The configuration of this candidate.
    #[must_use]
    pub fn config(&self) -> &LeaseConfig {
        &self.inner.config
    }

    /// Waits until this candidate leads, then returns a guard for the term.
    ///
    /// Every caller waiting at the same time gets a guard of the same term.
    /// If this candidate already leads, the guard is returned at once, but
    /// only while the term is valid ([`LeaseGuard::is_valid`]): once its renew
    /// deadline has passed, even before the background task noticed, this
    /// waits for the next term.
    ///
    /// # Errors
    /// [`AcquireError::Shutdown`](crate::AcquireError::Shutdown) once [`shutdown`](Self::shutdown) has been called;
    /// [`AcquireError::ElectorStopped`](crate::AcquireError::ElectorStopped) if the background task stopped while this
    /// waited (the runtime it was spawned on shut down, or it panicked).
    /// API failures are never returned: they are logged and retried
    /// every jittered retry period, as client-go does (an unreachable API server
    /// means waiting, never leading).
    ///
    /// # Cancellation safety
    /// Dropping the future withdraws the request; if it was the only one, the
    /// elector stops campaigning. What it saw of the Lease is kept (also when
    /// the runtime its task ran on shut down): an `acquire` called again later
    /// takes a record that has not changed since once it has been unchanged
    /// for its lease duration, counted from when it was first seen (as
    /// client-go), not from the new campaign's read, provided the Lease was
    /// not written at all meanwhile (the same resourceVersion): a record
    /// written again exactly (a pinning manifest applied again) is judged
    /// from that read. (etcd restored from a snapshot to exactly that
    /// resourceVersion reads as not written, as for client-go's elector.)
    ///
    /// # Panics
    /// The future panics if first polled outside a Tokio runtime: the elector
    /// spawns its background task on the runtime that polls it.
    pub fn acquire(&self) -> Acquire {
        Acquire {
            inner: self.inner.clone(),
            rx: None,
        }
    }

    /// A `Send + Sync + 'static` future that resolves once
    /// [`shutdown`](Self::shutdown) has been called: give it to
    /// [`Controller::graceful_shutdown_on`](kube_runtime::Controller::graceful_shutdown_on)
    /// so that reconciles in flight finish before the Lease is released.
    pub fn shutdown_requested(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        self.inner.shutdown_rx.clone().map(|_| ())
    }

    /// Leaves the election for good and hands leadership over.
    ///
    /// In order, each step bounded so that the whole sequence fits a pod's
    /// termination grace period:
    /// 1. stop campaigning: pending [`acquire`](Self::acquire) calls fail with
    ///    [`AcquireError::Shutdown`](crate::AcquireError::Shutdown), [`is_leader`](Self::is_leader) turns false (a
    ///    readiness gate stops routing to this replica), and
    ///    [`shutdown_requested`](Self::shutdown_requested) resolves, so that
    ///    controllers stop taking new work and let reconciles in flight finish;
    /// 2. wait up to `grace` for every guard of the current term to be
    ///    dropped (guarded streams end when their controller finishes);
    /// 3. end the term with [`Lost::Shutdown`], which drops what is still
    ///    guarded (aborting reconciles still in flight);
    /// 4. release the Lease (bounded by [`LeaseConfig::release_timeout`];
    ///    not with [`LeaseConfig::release_on_drop`]`(false)`) so
    ///    that a standby takes over at once, **only if every guard was dropped
    ///    before the term ended**. Work stopped at step 3 may have sent
    ///    requests that still land (an aborted future does not recall a
    ///    request already sent): the Lease is then left to expire, and a
    ///    standby leads one lease duration after the last renewal, as after a
    ///    crash. client-go's `ReleaseOnCancel` asks the same of its users ("only
    ///    if the lock's callers are guaranteed to have completed all their
    ///    work"); here it is enforced. A Lease this candidate created and
    ///    still holds before leading (the creation hold) is never released
    ///    either;
    /// 5. wait for the background task to end.
    ///
    /// Worst case: [`LeaseConfig::shutdown_budget`]`(grace)`, which says what
    /// it adds up; `shutdown` waits no longer. A task that does not end
    /// within it (its runtime is no longer driven) ends when its runtime is
    /// driven again, with no write but the release, or is dropped with it;
    /// the Lease, never renewed again, expires.
    ///
    /// # Errors
    /// [`ShutdownError::Release`] if the release failed;
    /// [`ShutdownError::TaskDidNotEnd`] if the background task did not end in
    /// time. Leadership has ended either way; an unreleased Lease expires
    /// after its lease duration.
    ///
    /// # Panics
    /// Polled outside a Tokio runtime, or within one without timers
    /// (`enable_time`, or `enable_all`): each of its steps is bounded by a
    /// Tokio timer. Call it within a runtime with timers (the election's own
    /// runtime needs them too).
    pub async fn shutdown(&self, grace: Duration) -> Result<(), ShutdownError> {
        let span = self.inner.config.span(tracing::Span::current().id());
        tracing::Instrument::instrument(self.shut_down(grace), span).await
    }

    /// [`shutdown`](Self::shutdown), in the election's span.
    async fn shut_down(&self, grace: Duration) -> Result<(), ShutdownError> {
        let (task, term) = {
            let mut state = self.inner.lock();
            state.shutdown = true;
            state.waiters.clear();
            // No new guard of the term in force either (a `TermTasks` spawning).
            if let Some(term) = &state.term {
                term.close();
            }
            (state.task.take(), state.term.clone())
        };
        self.inner.update_status(|s| s.is_leader = false);
        #[cfg(test)]
        test_hooks::reached(&self.inner, test_hooks::Point::ShutdownBegun);
        if let Some(tx) = self.inner.shutdown_tx.lock().take() {
            let _ = tx.send(());
        }
        info!("leader election shutting down");
        if let Some(term) = &term {
            term.guards_dropped(record::later(Instant::now(), grace)).await;
            term.lose(&Lost::Shutdown);
        }
        if !self.inner.config.enabled {
            // No task to say it: nobody leads any more.
            self.inner.not_leading();
        }
        self.inner.wake.notify_one();
        // The budget beyond the grace (already waited, or not needed).
        let bound = self.inner.config.shutdown_budget(Duration::ZERO);
        let ended = tokio::time::timeout(bound, async {
            let result = join(task).await;
            // A task spawned while this ran (its handle stored after it was
            // taken above) sees the shutdown at its first check: wait until
            // no task runs, and for that task's release too.
            self.inner.idle().await;
            let late = self.inner.lock().task.take();
            result.and(join(late).await).map_err(ShutdownError::Release)
        })
        .await;
        ended.unwrap_or_else(|_| {
            warn!(
                ?bound,
                "the leader election task did not end in time (is its runtime still driven?); \
                 not waiting for it: the lease, no longer renewed, will expire"
            );
            self.inner.not_leading();
            Err(ShutdownError::TaskDidNotEnd { after: bound })
        })
    }

    /// Whether [`shutdown`](Self::shutdown) has been called.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.inner.lock().shutdown
    }

    /// A guard of the term in force, if this candidate leads now and the
    /// shutdown has not begun: `None` otherwise. Never waits, and never asks
    /// for leadership.
    ///
    /// For work that runs whether or not this replica leads and needs the
    /// term when it does: a reconciler that writes the
    /// [`fencing_token`](LeaseGuard::fencing_token) with its changes, or
    /// checks [`is_valid`](LeaseGuard::is_valid) right before a side
    /// effect. The guard counts like any other: while it is kept, leadership
    /// is wanted (drop it when the work is done).
    #[must_use]
    pub fn current_guard(&self) -> Option<LeaseGuard> {
        let state = self.inner.lock();
        let term = state.term.as_ref().filter(|_| !state.shutdown)?;
        LeaseGuard::of(term, self.inner.wake.clone())
    }
}
