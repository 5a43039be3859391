//! [`LeaderElector`]: the election loop (acquire, renew, release, observe) and
//! the handle that shares it.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll},
    time::Duration,
};

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::{FutureExt, StreamExt, channel::oneshot, future::Shared, stream::BoxStream};
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube_client::{Api, Client, api::PostParams};
use kube_runtime::{WatchStreamExt, watcher};
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
    time::{Instant, sleep_until},
};
use tracing::{Instrument, debug, error, info, warn};

use crate::{
    config::{ConfigError, JITTER_FACTOR, LeaseConfig},
    error::{Error, Result},
    guard::{LeaseGuard, Lost, Term},
    metrics::Metrics,
    record::{self, Observed, Verdict},
};

/// What this candidate knows of the election, as of its last observation.
///
/// Read it with [`LeaderElector::status`], or follow every change with
/// [`LeaderElector::subscribe`] (client-go's `OnNewLeader`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderStatus {
    /// Whether this candidate leads now.
    pub is_leader: bool,
    /// The holder named by the last observed record, `None` when the Lease
    /// is free, missing or not yet observed.
    pub holder: Option<String>,
    /// The Lease's `leaseTransitions` in the last observed record.
    pub transitions: Option<i32>,
}

/// Why a [`LeaderElector::health_check`] failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HealthError {
    /// This candidate believes it leads, but its last successful renewal is
    /// older than the lease duration plus the tolerance: its election task is
    /// stuck, and another candidate may already lead.
    #[error(
        "leader election: last successful renewal was {since:?} ago, more than lease duration + tolerance ({limit:?})"
    )]
    RenewalOverdue {
        /// Time since the instant before the last successful renewal was sent.
        since: Duration,
        /// The lease duration plus the tolerance.
        limit: Duration,
    },
}

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
    api: Api<Lease>,
    wake: Arc<Notify>,
    state: Mutex<State>,
    /// Held by the election task for as long as it lives (see [`run`]): at
    /// most one runs at a time, and the next one starts only after the last
    /// one finished its release, whatever runtime either was spawned on.
    slot: Arc<tokio::sync::Mutex<()>>,
    status: watch::Sender<LeaderStatus>,
    shutdown_tx: Mutex<Option<oneshot::Sender<()>>>,
    shutdown_rx: Shared<oneshot::Receiver<()>>,
    metrics: Metrics,
}

#[derive(Default)]
struct State {
    waiters: Vec<oneshot::Sender<LeaseGuard>>,
    term: Option<Arc<Term>>,
    running: bool,
    /// The newest task, for `shutdown` to await its release.
    task: Option<JoinHandle<Result<()>>>,
    /// Counts tasks spawned, so that a handle stored late never replaces a newer task's.
    spawned: u64,
    /// The `uid` of the Lease object of our last term: a record naming us on
    /// any other object was not written in a term of ours.
    term_uid: Option<String>,
    shutdown: bool,
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
        let api = Api::namespaced(client, &config.namespace);
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        Ok(LeaderElector {
            inner: Arc::new(Inner {
                metrics: Metrics::default(),
                config,
                api,
                wake: Arc::new(Notify::new()),
                state: Mutex::new(State::default()),
                slot: Arc::new(tokio::sync::Mutex::new(())),
                status: watch::Sender::new(LeaderStatus::default()),
                shutdown_tx: Mutex::new(Some(shutdown_tx)),
                shutdown_rx: shutdown_rx.shared(),
            }),
        })
    }

    /// Records this elector's metrics into `metrics` (see [`LeaseMetrics`](crate::LeaseMetrics)).
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn with_metrics(self, metrics: &crate::LeaseMetrics) -> Self {
        self.inner.metrics.attach(metrics, &self.inner.config);
        self
    }

    /// The configuration of this candidate.
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
    /// [`Error::Shutdown`] once [`shutdown`](Self::shutdown) has been called;
    /// [`Error::ElectorStopped`] if the background task stopped while this
    /// waited (the runtime it was spawned on shut down, or it panicked).
    /// API failures are never returned: they are logged and retried with
    /// backoff (an unreachable API server means waiting, never leading).
    ///
    /// # Cancellation safety
    /// Dropping the future withdraws the request; if it was the only one, the
    /// elector stops campaigning.
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

    /// What this candidate knows of the election now.
    pub fn status(&self) -> LeaderStatus {
        self.inner.status.borrow().clone()
    }

    /// Follows [`status`](Self::status): the receiver sees every change of
    /// leader observed by this candidate (client-go's `OnNewLeader`).
    pub fn subscribe(&self) -> watch::Receiver<LeaderStatus> {
        self.inner.status.subscribe()
    }

    /// Whether this candidate leads now.
    pub fn is_leader(&self) -> bool {
        self.inner.status.borrow().is_leader
    }

    /// client-go's healthz watchdog: fails when this candidate believes it
    /// leads but its last successful renewal is older than the lease duration
    /// plus `tolerance` (client-go's default tolerance is 20 s). Healthy
    /// otherwise, including when it does not lead. Suited to a liveness probe:
    /// restarting a stuck leader lets another take over.
    ///
    /// # Errors
    /// [`HealthError::RenewalOverdue`] as above.
    pub fn health_check(&self, tolerance: Duration) -> Result<(), HealthError> {
        let term = self.inner.lock().term.clone();
        let Some(term) = term else { return Ok(()) };
        if term.lost().is_some() {
            return Ok(());
        }
        let since = term.last_renewal().elapsed();
        let limit = self.inner.config.lease_duration + tolerance;
        if since > limit {
            return Err(HealthError::RenewalOverdue { since, limit });
        }
        Ok(())
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
    ///    [`Error::Shutdown`] and [`shutdown_requested`](Self::shutdown_requested)
    ///    resolves, so that controllers stop taking new work and let
    ///    reconciles in flight finish;
    /// 2. wait up to `grace` for every guard of the current term to be
    ///    dropped (guarded streams end when their controller finishes);
    /// 3. end the term with [`Lost::Released`], which drops what is still
    ///    guarded (aborting reconciles still in flight);
    /// 4. release the Lease (bounded by [`LeaseConfig::release_timeout`]) so
    ///    that a standby takes over at once, if no guard is left;
    /// 5. wait for the background task to end.
    ///
    /// Worst case: `grace + release_timeout`, plus the time left on a renewal
    /// in flight (at most the renew deadline).
    ///
    /// # Errors
    /// The release's failure, if it failed. Leadership has ended either way;
    /// an unreleased Lease expires after its lease duration.
    pub async fn shutdown(&self, grace: Duration) -> Result<()> {
        let (task, term) = {
            let mut state = self.inner.lock();
            state.shutdown = true;
            state.waiters.clear();
            (state.task.take(), state.term.clone())
        };
        if let Some(tx) = self
            .inner
            .shutdown_tx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            let _ = tx.send(());
        }
        info!(lease = %self.inner.config.name, "leader election shutting down");
        if let Some(term) = &term {
            term.guards_dropped(Instant::now() + grace).await;
            term.lose(&Lost::Released);
        }
        self.inner.wake.notify_one();
        let result = join(task).await;
        // A task spawned while this ran (its handle stored after it was
        // taken above) sees the shutdown at its first check: wait until no
        // task holds the slot, and for that task's release too.
        drop(self.inner.slot.lock().await);
        let late = self.inner.lock().task.take();
        result.and(join(late).await)
    }
}

#[cfg(test)]
impl LeaderElector {
    pub(crate) fn set_term_for_test(&self, term: Arc<Term>) {
        self.inner.lock().term = Some(term);
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
/// Future returned by [`LeaderElector::acquire`]: resolves to a [`LeaseGuard`]
/// once this candidate leads.
#[must_use = "futures do nothing unless polled"]
pub struct Acquire {
    inner: Arc<Inner>,
    rx: Option<oneshot::Receiver<LeaseGuard>>,
}

impl std::fmt::Debug for Acquire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquire")
            .field("registered", &self.rx.is_some())
            .finish_non_exhaustive()
    }
}

impl Future for Acquire {
    type Output = Result<LeaseGuard>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let rx = if let Some(rx) = &mut this.rx {
            rx
        } else {
            let (rx, spawn) = {
                let mut state = this.inner.lock();
                if state.shutdown {
                    return Poll::Ready(Err(Error::Shutdown));
                }
                if let Some(guard) = state.term.as_ref().and_then(|t| t.guard(this.inner.wake.clone())) {
                    return Poll::Ready(Ok(guard));
                }
                // Before any change of state: polled outside a runtime (a
                // programming error, as for `tokio::spawn`), this panics
                // without leaving the elector waiting for a task that never ran.
                let runtime = (!state.running).then(|| {
                    tokio::runtime::Handle::try_current()
                        .expect("`LeaderElector::acquire` must be polled within a Tokio runtime")
                });
                let (tx, rx) = oneshot::channel();
                state.waiters.push(tx);
                let spawn = runtime.map(|runtime| {
                    state.running = true;
                    state.spawned += 1;
                    (runtime, state.spawned)
                });
                (rx, spawn)
            };
            if let Some((runtime, n)) = spawn {
                // Spawned with the state unlocked: a runtime that is shutting
                // down drops the future at once, and `Task`'s drop (which fails
                // the waiters and resets `running`) takes the lock. The task's
                // state is built here, not in the future, so that its drop runs
                // even if the future is never polled.
                let task = Task::new(this.inner.clone());
                let handle = runtime.spawn(run(task).instrument(this.inner.span()));
                let mut state = this.inner.lock();
                if state.spawned == n {
                    state.task = Some(handle);
                }
            }
            // A running task re-counts who wants leadership.
            this.inner.wake.notify_one();
            this.rx.insert(rx)
        };
        match Pin::new(rx).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(guard)) => {
                this.rx = None;
                Poll::Ready(Ok(guard))
            }
            Poll::Ready(Err(oneshot::Canceled)) => {
                this.rx = None;
                // Waiters are dropped by `shutdown`, or by the task when it
                // is dropped without exiting (runtime shut down, panic).
                Poll::Ready(Err(if this.inner.lock().shutdown {
                    Error::Shutdown
                } else {
                    Error::ElectorStopped
                }))
            }
        }
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        if self.rx.take().is_some() {
            self.inner.wake.notify_one();
        }
    }
}

impl Inner {
    fn span(&self) -> tracing::Span {
        tracing::info_span!(
            parent: None,
            "leader_election",
            lease.namespace = %self.config.namespace,
            lease.name = %self.config.name,
            identity = %self.config.identity,
        )
    }

    async fn replace(&self, lease: &Lease, bound: Duration) -> Result<Lease> {
        let name = &self.config.name;
        bounded(
            "update",
            bound,
            self.api.replace(name, &PostParams::default(), lease),
            Error::ReplaceLease,
        )
        .await
    }

    fn jittered_retry(&self) -> Duration {
        self.config
            .retry_period
            .mul_f64(1.0 + fastrand::f64() * JITTER_FACTOR)
    }

    fn update_status(&self, f: impl FnOnce(&mut LeaderStatus)) {
        self.status.send_if_modified(|s| {
            let before = s.clone();
            f(s);
            if s.holder != before.holder {
                if let Some(holder) = &s.holder {
                    info!(%holder, "new leader observed");
                } else {
                    info!("lease observed free or missing");
                }
                self.metrics.holder_changed();
            }
            *s != before
        });
    }
}

/// The election task. It first takes the slot, so that it starts only after
/// the previous task finished (its release included), and keeps it in `task`
/// until it is dropped: after `Task`'s drop has cleaned up.
async fn run(mut task: Task) -> Result<()> {
    task.slot = Some(task.inner.slot.clone().lock_owned().await);
    debug!("election task started");
    loop {
        let Some((lease, sent, created)) = task.campaign().await else {
            return Ok(());
        };
        if let Some(result) = task.lead(lease, sent, created).await {
            return result;
        }
    }
}

/// What this candidate last saw of the Lease.
#[derive(Clone, Debug)]
enum Obs {
    /// Nothing trustworthy: read before acting.
    Unknown,
    /// The Lease does not exist.
    Missing,
    /// The last record seen, and the whole object (for its metadata).
    Known { observed: Observed, object: Box<Lease> },
}

enum Attempt {
    /// Won: the object written, the instant before the write was sent, and
    /// whether the write created the Lease.
    Acquired(Box<Lease>, Instant, bool),
    WaitUntil(Instant),
    RetryNow,
}

type WatchStream = BoxStream<'static, watcher::Result<watcher::Event<Lease>>>;

#[allow(clippy::struct_excessive_bools)] // independent flags of one state machine
struct Task {
    inner: Arc<Inner>,
    obs: Obs,
    /// The observation may be outdated (after a conflict, or carried over
    /// from an earlier task): read before acting on it.
    stale: bool,
    watch: Option<WatchStream>,
    /// The watch has delivered a complete state and failed not since.
    synced: bool,
    init_seen: bool,
    watch_warned: bool,
    /// While leading: the object as we last wrote or verified it.
    cached: Option<Box<Lease>>,
    exited: bool,
    /// The slot (see [`Inner::slot`]), once taken; released after `Drop`.
    slot: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Task {
    fn new(inner: Arc<Inner>) -> Self {
        // Lazy: the watch makes no request before it is first polled.
        let watch = inner.config.watch.then(|| {
            let wc = watcher::Config::default().fields(&format!("metadata.name={}", inner.config.name));
            watcher(inner.api.clone(), wc).default_backoff().boxed()
        });
        Task {
            inner,
            obs: Obs::Unknown,
            stale: true,
            watch,
            synced: false,
            init_seen: false,
            watch_warned: false,
            cached: None,
            exited: false,
            slot: None,
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if self.exited {
            return;
        }
        // Aborted, panicked, or its runtime shut down: end the term so that no
        // guard outlives its renewals, and fail the waiters.
        let mut state = self.inner.lock();
        if let Some(term) = state.term.take() {
            term.lose(&Lost::ElectorStopped);
        }
        state.waiters.clear();
        state.running = false;
        drop(state);
        self.inner.update_status(|s| s.is_leader = false);
        self.inner.metrics.leading(false);
    }
}

/// What woke a leading term's loop.
#[allow(
    clippy::large_enum_variant,
    reason = "lives on the stack for one turn of the loop, like the event it carries"
)]
enum LeadWake {
    /// A change of demand (a guard dropped, a shutdown) or the end of the hold
    /// after creating the Lease: re-check at the top of the loop.
    Demand,
    /// A watch event (or the watch's end).
    Watch(Option<watcher::Result<watcher::Event<Lease>>>),
    /// Time to renew.
    Tick,
}

async fn next_event(watch: &mut Option<WatchStream>) -> Option<watcher::Result<watcher::Event<Lease>>> {
    match watch {
        Some(w) => w.next().await,
        None => futures::future::pending().await,
    }
}

/// Awaits an election task: its release's result. A task that did not return
/// is logged: cancelled with its runtime (already reported as
/// `ElectorStopped`), or panicked (a bug).
async fn join(task: Option<JoinHandle<Result<()>>>) -> Result<()> {
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

async fn bounded<T>(
    verb: &'static str,
    bound: Duration,
    fut: impl Future<Output = kube_client::Result<T>>,
    wrap: fn(kube_client::Error) -> Error,
) -> Result<T> {
    match tokio::time::timeout(bound, fut).await {
        Err(_) => Err(Error::Timeout { verb, after: bound }),
        Ok(Err(kube_client::Error::Api(s))) if s.code == 409 => Err(Error::Conflict),
        Ok(r) => r.map_err(wrap),
    }
}

impl Task {
    fn config(&self) -> &LeaseConfig {
        &self.inner.config
    }

    /// Re-counts who wants leadership; decides (under the lock) to exit when
    /// nobody does or the elector was shut down.
    fn should_exit(&mut self) -> bool {
        let mut state = self.inner.lock();
        state.waiters.retain(|tx| !tx.is_canceled());
        let live = state
            .term
            .as_ref()
            .filter(|t| t.lost().is_none())
            .map_or(0, |t| t.live_guards());
        if live == 0 && (state.shutdown || state.waiters.is_empty()) {
            if !state.shutdown {
                state.running = false;
            }
            // Decided under the lock: no guard of this term may be handed out
            // from now on (`end_term` ends it). A later `acquire` waits for the
            // next task instead of receiving a guard of a term about to end as
            // `Released`, which only a shutdown may cause.
            state.term = None;
            self.exited = true;
            return true;
        }
        false
    }

    fn shutting_down(&self) -> bool {
        self.inner.lock().shutdown
    }

    async fn get(&mut self, bound: Duration) -> Result<Option<Lease>> {
        let name = self.config().name.clone();
        let result = bounded("get", bound, self.inner.api.get_opt(&name), Error::GetLease).await;
        if result.is_ok() {
            self.stale = false;
        }
        match &result {
            Ok(Some(lease)) => {
                self.observe(lease.clone(), Instant::now());
            }
            Ok(None) => {
                self.observe_missing();
            }
            Err(_) => {}
        }
        result
    }

    /// Records a Lease seen at `at`; returns whether the record changed.
    fn observe(&mut self, lease: Lease, at: Instant) -> bool {
        let spec = lease.spec.clone().unwrap_or_default();
        let rv = lease.metadata.resource_version.clone();
        let (previous, changed) = match std::mem::replace(&mut self.obs, Obs::Unknown) {
            Obs::Known { observed, .. } => {
                let changed = observed.spec != spec;
                (Some(observed), changed)
            }
            _ => (None, true),
        };
        self.inner.update_status(|s| {
            s.holder = record::holder(&spec).map(str::to_owned);
            s.transitions = spec.lease_transitions;
        });
        let observed = Observed::observe(previous, spec, rv, at);
        self.obs = Obs::Known {
            observed,
            object: Box::new(lease),
        };
        changed
    }

    fn observe_missing(&mut self) -> bool {
        let changed = !matches!(self.obs, Obs::Missing);
        self.obs = Obs::Missing;
        self.inner.update_status(|s| {
            s.holder = None;
            s.transitions = None;
        });
        changed
    }

    /// Handles one watch event; returns whether the election should be re-evaluated.
    fn handle_watch(&mut self, event: Option<watcher::Result<watcher::Event<Lease>>>) -> bool {
        let now = Instant::now();
        match event {
            None => {
                warn!("lease watch ended; polling every retry period instead");
                self.watch = None;
                self.synced = false;
                true
            }
            Some(Ok(watcher::Event::Init)) => {
                self.init_seen = false;
                false
            }
            Some(Ok(watcher::Event::InitApply(lease))) => {
                self.init_seen = true;
                self.observe(lease, now)
            }
            Some(Ok(watcher::Event::Apply(lease))) => self.observe(lease, now),
            Some(Ok(watcher::Event::Delete(_))) => self.observe_missing(),
            Some(Ok(watcher::Event::InitDone)) => {
                if self.watch_warned {
                    info!("lease watch recovered");
                }
                self.watch_warned = false;
                let changed = !self.init_seen && self.observe_missing();
                let was_synced = std::mem::replace(&mut self.synced, true);
                changed || !was_synced
            }
            Some(Err(e)) => {
                let forbidden = matches!(&e, watcher::Error::InitialListFailed(kube_client::Error::Api(s))
                    | watcher::Error::WatchStartFailed(kube_client::Error::Api(s)) if s.code == 403 || s.code == 401);
                self.synced = false;
                if forbidden {
                    warn!(
                        error = %e,
                        "cannot watch leases: grant `list` and `watch` on `leases` in `coordination.k8s.io`; \
                         falling back to polling every retry period"
                    );
                    self.watch = None;
                } else if !self.watch_warned {
                    warn!(error = %e, "lease watch failed; polling every retry period until it recovers");
                    self.watch_warned = true;
                }
                true
            }
        }
    }

    fn log_error(&self, what: &str, e: &Error) {
        if let Some(verb) = e.forbidden_verb() {
            error!(
                error = %crate::error::Chain(e),
                "forbidden to {verb} lease {}/{}: RBAC needs verbs get, create, update on resource `leases` in API group `coordination.k8s.io` (and list, watch for watch-driven election); `{verb}` is missing",
                self.config().namespace,
                self.config().name,
            );
        } else {
            warn!(error = %crate::error::Chain(e), "{what} failed");
        }
    }

    /// Campaigns until this candidate leads (`Some`) or nobody wants it (`None`).
    async fn campaign(&mut self) -> Option<(Box<Lease>, Instant, bool)> {
        let mut backoff = None;
        loop {
            if self.should_exit() {
                return None;
            }
            let wait = match self.try_acquire().await {
                Ok(Attempt::Acquired(lease, sent, created)) => return Some((lease, sent, created)),
                Ok(Attempt::WaitUntil(until)) => {
                    backoff = None;
                    Some(if self.synced {
                        until
                    } else {
                        until.min(Instant::now() + self.inner.jittered_retry())
                    })
                }
                Ok(Attempt::RetryNow) => None,
                Err(e) => {
                    self.log_error("acquiring the lease", &e);
                    let delay = backoff
                        .get_or_insert_with(|| {
                            ExponentialBuilder::new()
                                .with_min_delay(self.config().retry_period)
                                .with_max_delay(self.config().lease_duration)
                                .with_jitter()
                                .without_max_times()
                                .build()
                        })
                        .next()
                        .unwrap_or(self.config().lease_duration);
                    Some(Instant::now() + delay)
                }
            };
            if let Some(until) = wait {
                self.idle_until(until).await;
            }
        }
    }

    /// Waits until `until`, a change of demand, or a watch event that changes the record.
    async fn idle_until(&mut self, until: Instant) {
        let wake = self.inner.wake.clone();
        loop {
            let event = futures::select_biased! {
                () = wake.notified().fuse() => return,
                event = next_event(&mut self.watch).fuse() => event,
                () = sleep_until(until).fuse() => return,
            };
            if self.handle_watch(event) {
                return;
            }
        }
    }

    async fn try_acquire(&mut self) -> Result<Attempt> {
        let renew_deadline = self.config().renew_deadline;
        if !self.synced || self.stale || matches!(self.obs, Obs::Unknown) {
            self.get(renew_deadline).await?;
        }
        let now = Instant::now();
        let cfg = &self.inner.config;
        match &self.obs {
            Obs::Unknown => Ok(Attempt::RetryNow),
            Obs::Missing => {
                let lease = Lease {
                    metadata: kube_client::core::ObjectMeta {
                        name: Some(cfg.name.clone()),
                        namespace: Some(cfg.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(record::acquired(
                        None,
                        &cfg.identity,
                        cfg.lease_duration_seconds(),
                        Timestamp::now(),
                    )),
                };
                let sent = Instant::now();
                let result = bounded(
                    "create",
                    renew_deadline,
                    self.inner.api.create(&PostParams::default(), &lease),
                    Error::CreateLease,
                )
                .await;
                match result {
                    Ok(lease) => Ok(Attempt::Acquired(Box::new(lease), sent, true)),
                    Err(Error::Conflict) => {
                        debug!("lost the race to create the lease");
                        self.stale = true;
                        Ok(Attempt::WaitUntil(Instant::now() + self.inner.jittered_retry()))
                    }
                    Err(e) => Err(e),
                }
            }
            Obs::Known { observed, object } => {
                let ours_known =
                    object.metadata.uid.is_some() && object.metadata.uid == self.inner.lock().term_uid;
                match record::verdict(observed, &cfg.identity, ours_known, cfg.lease_duration, now) {
                    Verdict::WaitUntil(until) => Ok(Attempt::WaitUntil(until)),
                    Verdict::Take => {
                        let mut lease = (**object).clone();
                        lease.spec = Some(record::acquired(
                            Some(&observed.spec),
                            &cfg.identity,
                            cfg.lease_duration_seconds(),
                            Timestamp::now(),
                        ));
                        lease
                            .metadata
                            .resource_version
                            .clone_from(&observed.resource_version);
                        let sent = Instant::now();
                        match self.inner.replace(&lease, renew_deadline).await {
                            Ok(lease) => Ok(Attempt::Acquired(Box::new(lease), sent, false)),
                            Err(Error::Conflict) => {
                                debug!("lost the race to take the lease");
                                self.stale = true;
                                Ok(Attempt::WaitUntil(Instant::now() + self.inner.jittered_retry()))
                            }
                            Err(e) if e.status() == Some(404) => {
                                self.stale = true;
                                Ok(Attempt::RetryNow)
                            }
                            Err(e) => Err(e),
                        }
                    }
                }
            }
        }
    }

    /// Leads one term. `Some(result)` when the task should exit (with the
    /// release's result), `None` to campaign again.
    async fn lead(&mut self, lease: Box<Lease>, sent: Instant, created: bool) -> Option<Result<()>> {
        let cfg = self.inner.config.clone();
        let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0);
        let term = Arc::new(Term::new(i64::from(transitions), sent, cfg.renew_deadline));
        self.observe((*lease).clone(), sent);
        self.inner.lock().term_uid.clone_from(&lease.metadata.uid);
        self.cached = Some(lease);
        // A Lease has no version once deleted and `create` has no precondition,
        // so the leader of a deleted incarnation may still believe it leads: its
        // last renewal was sent before the deletion, before our create took
        // effect. After creating, hold the Lease (renewing it) for one lease
        // duration before leading, by which time that leader has given up.
        let mut pending = created.then(|| {
            info!("created the lease; holding it for one lease duration before leading");
            Instant::now() + cfg.lease_duration
        });
        if pending.is_none() {
            self.begin_term(&term);
        }

        let wake = self.inner.wake.clone();
        let mut next_tick = sent + cfg.retry_period;
        let mut exiting = false;
        let reason = loop {
            if let Some(lost) = term.lost() {
                // Ended from outside: by `shutdown` once its grace ran out.
                if self.shutting_down() {
                    self.exited = true;
                    exiting = true;
                }
                break lost;
            }
            if let Some(preferred) = self
                .cached
                .as_ref()
                .and_then(|l| l.spec.as_ref())
                .and_then(record::preferred_holder)
                && preferred != cfg.identity
            {
                break Lost::SteppedDown {
                    preferred_holder: preferred.to_owned(),
                };
            }
            if self.should_exit() {
                exiting = true;
                break Lost::Released;
            }
            if pending.is_some_and(|until| Instant::now() >= until) {
                pending = None;
                self.begin_term(&term);
            }
            let pending_elapsed = async {
                match pending {
                    Some(until) => sleep_until(until).await,
                    None => futures::future::pending().await,
                }
            };
            // The branches' futures borrow `self.watch`: act once they are dropped.
            let cause = futures::select_biased! {
                () = wake.notified().fuse() => LeadWake::Demand,
                () = pending_elapsed.fuse() => LeadWake::Demand,
                () = sleep_until(term.deadline()).fuse() => break Lost::RenewDeadlineExceeded,
                event = next_event(&mut self.watch).fuse() => LeadWake::Watch(event),
                () = sleep_until(next_tick).fuse() => LeadWake::Tick,
            };
            match cause {
                LeadWake::Demand => {}
                LeadWake::Watch(event) => {
                    if self.handle_watch(event)
                        && self.foreign_record_observed()
                        && let Err(lost) = self.verify(&term).await
                    {
                        break lost;
                    }
                }
                LeadWake::Tick => {
                    let now = Instant::now();
                    while next_tick <= now {
                        next_tick += cfg.retry_period;
                    }
                    if let Err(lost) = self.renew(&term).await {
                        break lost;
                    }
                }
            }
        };
        let result = self.end_term(&term, &reason).await;
        exiting.then_some(result)
    }

    /// Ends `term` for `reason`, releasing the Lease when leadership was given up.
    async fn end_term(&mut self, term: &Arc<Term>, reason: &Lost) -> Result<()> {
        // Status first, so that `is_leader()` is false once a guard resolves.
        self.inner.update_status(|s| s.is_leader = false);
        term.lose(reason);
        {
            let mut state = self.inner.lock();
            if state.term.as_ref().is_some_and(|t| Arc::ptr_eq(t, term)) {
                state.term = None;
            }
        }
        self.inner.metrics.leading(false);
        let release = match reason {
            Lost::Released if self.shutting_down() => {
                info!(%reason, "leadership ended");
                self.config().release_on_drop
            }
            Lost::Released => {
                // No guard can see this reason: none is left.
                info!("leadership given up: no guard or waiter wants it any more");
                self.config().release_on_drop
            }
            Lost::SteppedDown { .. } => {
                info!(%reason, "leadership ended");
                true
            }
            _ => {
                warn!(%reason, "leadership lost");
                false
            }
        };
        let result = if release {
            self.release_after_guards(term).await
        } else {
            Ok(())
        };
        self.cached = None;
        self.stale = true;
        result
    }

    /// Publishes `term`: hands guards to every waiter.
    fn begin_term(&mut self, term: &Arc<Term>) {
        // Status first, so that `is_leader()` agrees with a guard as soon as it is handed out.
        self.inner.update_status(|s| s.is_leader = true);
        {
            let mut state = self.inner.lock();
            state.term = Some(term.clone());
            // A waiter that cannot get a guard (the renew deadline already
            // passed) keeps waiting, for the next term.
            for tx in std::mem::take(&mut state.waiters) {
                match term.guard(self.inner.wake.clone()) {
                    Some(guard) => {
                        let _ = tx.send(guard);
                    }
                    None => state.waiters.push(tx),
                }
            }
        }
        self.inner.metrics.leading(true);
        info!(transitions = term.transitions, "acquired lease, now leading");
    }

    fn foreign_record_observed(&self) -> bool {
        match &self.obs {
            Obs::Missing => true,
            Obs::Known { observed, .. } => {
                record::holder(&observed.spec) != Some(self.config().identity.as_str())
            }
            Obs::Unknown => false,
        }
    }

    /// The watch showed a record not ours: confirm with a read before
    /// stepping down (the event may be older than our last write).
    async fn verify(&mut self, term: &Term) -> Result<(), Lost> {
        let left = term.deadline().saturating_duration_since(Instant::now());
        match self.get(left).await {
            Ok(None) => Err(Lost::Deleted),
            Ok(Some(lease)) => self.check_still_ours(lease),
            Err(e) => {
                self.log_error("verifying the lease", &e);
                Ok(())
            }
        }
    }

    fn check_still_ours(&mut self, lease: Lease) -> Result<(), Lost> {
        let spec = lease.spec.clone().unwrap_or_default();
        match record::holder(&spec) {
            Some(h) if h == self.config().identity => {
                self.cached = Some(Box::new(lease));
                Ok(())
            }
            other => Err(Lost::TakenOver {
                holder: other.unwrap_or_default().to_owned(),
            }),
        }
    }

    /// One renewal: the fast path (one `replace` with the cached
    /// resourceVersion), falling to a read and a retry on conflict.
    async fn renew(&mut self, term: &Term) -> Result<(), Lost> {
        let cfg = self.inner.config.clone();
        for attempt in 0..2 {
            let sent = Instant::now();
            let deadline = term.deadline();
            if sent >= deadline {
                return Err(Lost::RenewDeadlineExceeded);
            }
            let Some(cached) = &self.cached else {
                return Err(Lost::ElectorStopped);
            };
            let mut lease = (**cached).clone();
            lease.spec = Some(record::acquired(
                lease.spec.as_ref(),
                &cfg.identity,
                cfg.lease_duration_seconds(),
                Timestamp::now(),
            ));
            match self.inner.replace(&lease, deadline - sent).await {
                Ok(lease) => {
                    let in_time = term.renewed(sent, cfg.renew_deadline);
                    self.observe(lease.clone(), sent);
                    self.cached = Some(Box::new(lease));
                    if !in_time {
                        if term.lost().is_some() {
                            // Ended from outside while the request was in
                            // flight (`shutdown`): the top of the loop handles it.
                            return Ok(());
                        }
                        self.inner.metrics.renewal("late", sent.elapsed(), sent);
                        warn!(
                            after = ?sent.elapsed(),
                            "the renewal succeeded only after the renew deadline; giving the term up"
                        );
                        return Err(Lost::RenewDeadlineExceeded);
                    }
                    self.inner.metrics.renewal("success", sent.elapsed(), sent);
                    debug!("renewed lease");
                    return Ok(());
                }
                Err(e) if e.status() == Some(404) => {
                    self.inner.metrics.renewal("not_found", sent.elapsed(), sent);
                    return Err(Lost::Deleted);
                }
                Err(Error::Conflict) if attempt == 0 => {
                    self.inner.metrics.renewal("conflict", sent.elapsed(), sent);
                    debug!("renewal conflicted; re-reading the lease");
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.get(left).await {
                        Ok(None) => return Err(Lost::Deleted),
                        Ok(Some(lease)) => self.check_still_ours(lease)?,
                        Err(e) => {
                            self.log_error("re-reading the lease", &e);
                            return Ok(());
                        }
                    }
                }
                Err(e) => {
                    self.inner.metrics.renewal("error", sent.elapsed(), sent);
                    self.log_error("renewing the lease", &e);
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Releases once every guard of `term` is gone (bounded by the release timeout).
    async fn release_after_guards(&mut self, term: &Term) -> Result<()> {
        let until = Instant::now() + self.config().release_timeout;
        if !term.guards_dropped(until).await {
            warn!(
                "guarded work still running after the release timeout; not releasing, the lease will expire instead"
            );
            return Ok(());
        }
        let result = self.release(until).await;
        if let Err(e) = &result {
            self.log_error("releasing the lease", e);
        }
        result
    }

    /// Fetches the Lease and, if it is still ours, writes it free.
    async fn release(&mut self, until: Instant) -> Result<()> {
        let left = until.saturating_duration_since(Instant::now());
        let Some(lease) = self.get(left).await? else {
            return Ok(());
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if record::holder(&spec) != Some(self.config().identity.as_str()) {
            info!(
                holder = record::holder(&spec).unwrap_or(""),
                "not releasing: the lease is no longer ours"
            );
            return Ok(());
        }
        let mut next = lease;
        next.spec = Some(record::released(&spec, Timestamp::now()));
        let left = until.saturating_duration_since(Instant::now());
        let released = self.inner.replace(&next, left).await?;
        self.observe(released, Instant::now());
        info!("released lease");
        Ok(())
    }
}
