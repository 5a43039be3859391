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
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube_client::{Api, Client, api::PostParams};
use kube_runtime::{WatchStreamExt, watcher};
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
    time::{Instant, Sleep, sleep, sleep_until},
};
use tracing::{Instrument, debug, error, info, warn};

use crate::{
    config::{ConfigError, JITTER_FACTOR, LeaseConfig},
    error::{Error, Result},
    guard::{LeaseGuard, Lost, Term},
    metrics::Metrics,
    record::{self, Observed, TermId, Verdict},
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
    /// Notified whenever the slot (see [`State::active`]) is freed or a task
    /// ends.
    slot_freed: Notify,
    status: watch::Sender<LeaderStatus>,
    shutdown_tx: Mutex<Option<oneshot::Sender<()>>>,
    shutdown_rx: Shared<oneshot::Receiver<()>>,
    metrics: Metrics,
    /// Tests: a wake-up between any two waits of the task (a storm of them).
    #[cfg(test)]
    pub(crate) storm: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct State {
    waiters: Vec<oneshot::Sender<LeaseGuard>>,
    /// The term in force, once begun (not during a creation hold).
    term: Option<Arc<Term>>,
    /// The generation of the task that campaigns now, if any.
    current: Option<u64>,
    /// The generation of the task that holds the slot: at most one task talks
    /// to the API at a time, and the next one starts only after the last one
    /// finished its release, whatever runtime either was spawned on.
    active: Option<u64>,
    /// The newest task, for `shutdown` to await its release.
    task: Option<JoinHandle<Result<()>>>,
    /// Counts tasks spawned: each task's generation.
    spawned: u64,
    /// Counts the beats of the task holding the slot (one per retry period
    /// while its runtime is driven): a task whose runtime is no longer driven
    /// stops beating, and is replaced (see [`Acquire`]).
    beats: u64,
    shutdown: bool,
    memory: Memory,
}

/// What this elector remembers of the Lease across terms and tasks.
#[derive(Default)]
struct Memory {
    /// Our last term: a record of it (same object, holder, acquireTime and
    /// transitions) is our own write; any other record naming our identity is
    /// not (another process with the same identity, or a write we gave up on).
    own: Option<TermId>,
    /// A term on this Lease object must not begin before this instant (the
    /// creation hold), whichever task campaigns.
    hold: Option<(Option<String>, Instant)>,
    /// Until when the last holder of a Lease object that went away (deleted,
    /// or replaced by another object) may still believe it leads.
    risk_until: Option<Instant>,
    /// The Lease object last seen, whether its last record named a holder,
    /// and the longest lease duration seen on it.
    seen_uid: Option<String>,
    seen_held: bool,
    seen_longest: Duration,
    /// The largest `leaseTransitions` seen on this Lease name, any object.
    max_transitions: Option<i32>,
    /// The largest fencing token handed out.
    last_token: Option<i64>,
    /// Guarded work of a term that ended was stopped, not finished: requests
    /// it sent may land until then (lease duration − renew deadline after the
    /// term ended, the margin the protocol leaves for it). No later term of
    /// ours releases the Lease before then: that would let a standby lead
    /// at once, inside the margin.
    stopped_until: Option<Instant>,
}

impl Memory {
    /// Remembers a record seen at `now` on the object `uid`.
    fn saw(&mut self, uid: Option<&String>, spec: &LeaseSpec, fallback: Duration, now: Instant) {
        if self.seen_uid.as_ref() != uid {
            self.went_away(now);
            self.seen_uid = uid.cloned();
        }
        self.seen_longest = self.seen_longest.max(record::lease_duration(spec, fallback));
        self.seen_held = record::holder(spec).is_some();
        self.max_transitions = self.max_transitions.max(spec.lease_transitions);
    }

    /// The object last seen is gone (seen missing at `now`, or replaced).
    fn went_away(&mut self, now: Instant) {
        if self.seen_uid.take().is_some() && self.seen_held {
            let until = record::later(now, self.seen_longest);
            self.risk_until = Some(self.risk_until.map_or(until, |u| u.max(until)));
        }
        self.seen_held = false;
        self.seen_longest = Duration::ZERO;
    }

    /// The `leaseTransitions` to write when a term begins on a record with
    /// `prev`: more than anything seen on this name.
    fn next_transitions(&self, prev: Option<i32>) -> i32 {
        prev.max(self.max_transitions).map_or(0, |t| t.saturating_add(1))
    }

    /// The fencing token of a term that wrote `transitions`: strictly more
    /// than every token before it, also once the Lease's counter saturates.
    fn next_token(&mut self, transitions: i32) -> i64 {
        let token = self.last_token.map_or(i64::from(transitions), |last| {
            (last + 1).max(i64::from(transitions))
        });
        self.last_token = Some(token);
        token
    }
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
                slot_freed: Notify::new(),
                status: watch::Sender::new(LeaderStatus::default()),
                shutdown_tx: Mutex::new(Some(shutdown_tx)),
                shutdown_rx: shutdown_rx.shared(),
                #[cfg(test)]
                storm: std::sync::atomic::AtomicBool::new(false),
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
            watchdog: None,
        }
    }

    /// What this candidate knows of the election now. `is_leader` is as
    /// [`is_leader`](Self::is_leader) says.
    pub fn status(&self) -> LeaderStatus {
        let mut status = self.inner.status.borrow().clone();
        status.is_leader = self.is_leader();
        status
    }

    /// Follows [`status`](Self::status): the receiver sees every change of
    /// leader observed by this candidate (client-go's `OnNewLeader`).
    pub fn subscribe(&self) -> watch::Receiver<LeaderStatus> {
        self.inner.status.subscribe()
    }

    /// Whether this candidate leads now: a term holds (its renew deadline has
    /// not passed, even if the background task has not noticed yet) and
    /// [`shutdown`](Self::shutdown) has not begun. Suited to a readiness gate.
    pub fn is_leader(&self) -> bool {
        let state = self.inner.lock();
        !state.shutdown && state.term.as_ref().is_some_and(|t| t.holds())
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
        let limit = self.inner.config.lease_duration.saturating_add(tolerance);
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
    ///    [`Error::Shutdown`], [`is_leader`](Self::is_leader) turns false (a
    ///    readiness gate stops routing to this replica), and
    ///    [`shutdown_requested`](Self::shutdown_requested) resolves, so that
    ///    controllers stop taking new work and let reconciles in flight finish;
    /// 2. wait up to `grace` for every guard of the current term to be
    ///    dropped (guarded streams end when their controller finishes);
    /// 3. end the term with [`Lost::Released`], which drops what is still
    ///    guarded (aborting reconciles still in flight);
    /// 4. release the Lease (bounded by [`LeaseConfig::release_timeout`]) so
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
    /// Worst case: `grace + release_timeout`, plus the time left on a renewal
    /// in flight (at most the renew deadline), plus one retry period. A task
    /// that does not end within that (its runtime is no longer driven) is
    /// left behind: it can no longer write to the Lease, which expires.
    ///
    /// # Errors
    /// The release's failure, if it failed; [`Error::ElectorStopped`] if the
    /// background task did not end in time. Leadership has ended either way;
    /// an unreleased Lease expires after its lease duration.
    pub async fn shutdown(&self, grace: Duration) -> Result<()> {
        let (task, term) = {
            let mut state = self.inner.lock();
            state.shutdown = true;
            state.waiters.clear();
            (state.task.take(), state.term.clone())
        };
        self.inner.update_status(|s| s.is_leader = false);
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
            term.guards_dropped(record::later(Instant::now(), grace)).await;
            term.lose(&Lost::Released);
        }
        self.inner.wake.notify_one();
        let cfg = &self.inner.config;
        let bound = cfg.renew_deadline + cfg.release_timeout + cfg.retry_period;
        let ended = tokio::time::timeout(bound, async {
            let result = join(task).await;
            // A task spawned while this ran (its handle stored after it was
            // taken above) sees the shutdown at its first check: wait until
            // no task runs or holds the slot, and for that task's release too.
            self.inner.idle().await;
            let late = self.inner.lock().task.take();
            result.and(join(late).await)
        })
        .await;
        ended.unwrap_or_else(|_| {
            warn!(
                ?bound,
                "the leader election task did not end in time (is its runtime still driven?); \
                 leaving it behind: it can no longer write to the lease, which will expire"
            );
            self.inner.abandon();
            Err(Error::ElectorStopped)
        })
    }

    /// Whether [`shutdown`](Self::shutdown) has been called.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.inner.lock().shutdown
    }
}

#[cfg(test)]
impl LeaderElector {
    pub(crate) fn set_term_for_test(&self, term: Arc<Term>) {
        self.inner.lock().term = Some(term);
    }

    /// A wake-up between any two waits of the election task, for ever.
    pub(crate) fn storm_for_test(&self) {
        self.inner.storm.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Ends [`storm_for_test`](Self::storm_for_test).
    pub(crate) fn inner_storm_off_for_test(&self) {
        self.inner
            .storm
            .store(false, std::sync::atomic::Ordering::Relaxed);
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
    /// While waiting: a timer, and the beats of the task seen when it was set
    /// (see [`State::beats`]).
    watchdog: Option<(Pin<Box<Sleep>>, u64)>,
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
                let runtime = state.current.is_none().then(|| {
                    tokio::runtime::Handle::try_current()
                        .expect("`LeaderElector::acquire` must be polled within a Tokio runtime")
                });
                let (tx, rx) = oneshot::channel();
                state.waiters.push(tx);
                let spawn = runtime.map(|runtime| (runtime, state.next_task()));
                (rx, spawn)
            };
            if let Some((runtime, n)) = spawn {
                this.inner.spawn(&runtime, n);
            }
            // A running task re-counts who wants leadership.
            this.inner.wake.notify_one();
            this.rx.insert(rx)
        };
        match Pin::new(rx).poll(cx) {
            Poll::Pending => {
                this.watch_the_task(cx);
                Poll::Pending
            }
            Poll::Ready(Ok(guard)) => {
                this.rx = None;
                this.watchdog = None;
                Poll::Ready(Ok(guard))
            }
            Poll::Ready(Err(oneshot::Canceled)) => {
                this.rx = None;
                this.watchdog = None;
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

impl Acquire {
    /// While waiting: if the task that should serve this waiter has not beaten
    /// for [`Inner::stuck_after`] (the runtime it was spawned on is no longer
    /// driven), leaves it behind and starts a new one on this runtime.
    fn watch_the_task(&mut self, cx: &mut Context<'_>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let period = self.inner.stuck_after();
        let (timer, seen) = self.watchdog.get_or_insert_with(|| {
            let beats = self.inner.lock().beats;
            (Box::pin(sleep(period)), beats)
        });
        while timer.as_mut().poll(cx).is_ready() {
            let spawn = {
                let mut state = self.inner.lock();
                let stuck = state.beats == *seen
                    && !state.shutdown
                    && (state.current.is_some() || state.active.is_some());
                *seen = state.beats;
                stuck.then(|| {
                    warn!(
                        after = ?period,
                        "the leader election task has not run (is its runtime still driven?); \
                         leaving it behind and starting a new one"
                    );
                    state.abandon();
                    state.next_task()
                })
            };
            if let Some(n) = spawn {
                self.inner.abandoned();
                self.inner.spawn(&runtime, n);
            }
            timer.as_mut().reset(Instant::now() + period);
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

impl State {
    /// Registers a new task as the one that campaigns; its generation.
    fn next_task(&mut self) -> u64 {
        self.spawned += 1;
        self.current = Some(self.spawned);
        self.spawned
    }

    /// Leaves the running task (and any holding the slot) behind: their
    /// runtime is no longer driven. They can no longer write to the Lease
    /// (each write checks the slot first), and their term ends.
    fn abandon(&mut self) {
        self.current = None;
        self.active = None;
        self.task = None;
        if let Some(term) = self.term.take() {
            term.lose(&Lost::ElectorStopped);
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

    /// Spawns the task of generation `n` on `runtime`, with the state unlocked:
    /// a runtime that is shutting down drops the future at once, and `Task`'s
    /// drop (which fails the waiters and frees the generation) takes the lock.
    /// The task's state is built here, not in the future, so that its drop
    /// runs even if the future is never polled.
    fn spawn(self: &Arc<Self>, runtime: &tokio::runtime::Handle, n: u64) {
        let task = Task::new(self.clone(), n);
        let handle = runtime.spawn(run(task).instrument(self.span()));
        let mut state = self.lock();
        if state.current == Some(n) {
            state.task = Some(handle);
        }
    }

    /// How long a task may go without a beat before a waiter leaves it behind.
    fn stuck_after(&self) -> Duration {
        self.config.renew_deadline + self.config.retry_period
    }

    /// Waits until no task campaigns or holds the slot.
    async fn idle(&self) {
        loop {
            let mut freed = std::pin::pin!(self.slot_freed.notified());
            freed.as_mut().enable();
            {
                let state = self.lock();
                if state.current.is_none() && state.active.is_none() {
                    return;
                }
            }
            freed.await;
        }
    }

    /// Leaves the running task behind (see [`State::abandon`]).
    fn abandon(&self) {
        self.lock().abandon();
        self.abandoned();
    }

    /// What follows [`State::abandon`], with the state unlocked: wake whoever
    /// waits for the slot, and say that nobody leads.
    fn abandoned(&self) {
        self.slot_freed.notify_waiters();
        self.update_status(|s| s.is_leader = false);
        self.metrics.leading(false);
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
/// the previous task finished (its release included), and keeps it until it
/// is dropped: after `Task`'s drop has cleaned up. While it holds the slot it
/// beats once per retry period (see [`State::beats`]).
async fn run(mut task: Task) -> Result<()> {
    let inner = task.inner.clone();
    let n = task.generation;
    loop {
        let mut freed = std::pin::pin!(inner.slot_freed.notified());
        freed.as_mut().enable();
        {
            let mut state = inner.lock();
            if state.current != Some(n) {
                // Left behind while waiting (or never wanted): nothing to do.
                task.exited = true;
                return Ok(());
            }
            if state.active.is_none() {
                state.active = Some(n);
                break;
            }
        }
        freed.await;
    }
    debug!("election task started");
    // The wake-up stored by the `acquire` that spawned this task: the loops
    // re-count demand before they wait anyway.
    let _ = inner.wake.notified().now_or_never();
    let pulse = async {
        loop {
            sleep(inner.config.retry_period).await;
            let mut state = inner.lock();
            if state.active == Some(n) {
                state.beats += 1;
            }
        }
    };
    let elect = async move {
        loop {
            let Some((lease, sent, created)) = task.campaign().await else {
                return Ok(());
            };
            if let Some(result) = task.lead(lease, sent, created).await {
                return result;
            }
        }
    };
    futures::select_biased! {
        result = elect.fuse() => result,
        () = pulse.fuse() => unreachable!("the pulse never ends"),
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

/// Who wants leadership, as the task re-counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Demand {
    /// A live guard of the term, or a waiter.
    Wanted,
    /// Nobody.
    Unwanted,
    /// [`LeaderElector::shutdown`] was called.
    Shutdown,
    /// This task was left behind (see [`State::abandon`]): stop at once,
    /// without a write.
    Abandoned,
}

type WatchStream = BoxStream<'static, watcher::Result<watcher::Event<Lease>>>;

#[allow(clippy::struct_excessive_bools)] // independent flags of one state machine
struct Task {
    inner: Arc<Inner>,
    generation: u64,
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
    /// While leading: the watch has delivered our last write, so every later
    /// event is newer than it.
    caught_up: bool,
    /// The task returned: its drop leaves the state alone.
    exited: bool,
}

impl Task {
    fn new(inner: Arc<Inner>, generation: u64) -> Self {
        // Lazy: the watch makes no request before it is first polled.
        let watch = inner.config.watch.then(|| {
            let wc = watcher::Config::default().fields(&format!("metadata.name={}", inner.config.name));
            watcher(inner.api.clone(), wc).default_backoff().boxed()
        });
        Task {
            inner,
            generation,
            obs: Obs::Unknown,
            stale: true,
            watch,
            synced: false,
            init_seen: false,
            watch_warned: false,
            cached: None,
            caught_up: false,
            exited: false,
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        let mut state = self.inner.lock();
        let freed = state.active == Some(self.generation);
        if freed {
            state.active = None;
        }
        let current = state.current == Some(self.generation);
        if current {
            state.current = None;
        }
        if current && !self.exited {
            // Aborted, panicked, or its runtime shut down: end the term so
            // that no guard outlives its renewals, and fail the waiters.
            if let Some(term) = state.term.take() {
                term.lose(&Lost::ElectorStopped);
            }
            state.waiters.clear();
            drop(state);
            self.inner.update_status(|s| s.is_leader = false);
            self.inner.metrics.leading(false);
        } else {
            drop(state);
        }
        if freed || current {
            self.inner.slot_freed.notify_waiters();
        }
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

/// The loss of a term whose Lease now holds `lease`, someone else's record
/// (its holder is `""` when someone else wrote it free).
fn taken_over(lease: &Lease) -> Lost {
    Lost::TakenOver {
        holder: lease
            .spec
            .as_ref()
            .and_then(record::holder)
            .unwrap_or_default()
            .to_owned(),
    }
}

/// The state of one term, as its loop sees it.
struct TermRun {
    term: Arc<Term>,
    /// The record of this term (see [`TermId`]).
    id: TermId,
    /// The creation hold: the term is not handed out before this instant.
    hold: Option<Instant>,
    /// A `preferredHolder` already on the record when the term began: the
    /// preferred holder was given its chance (one lease duration), so it does
    /// not end this term; a preferred holder set during the term does.
    tolerated: Option<String>,
}

impl Task {
    fn config(&self) -> &LeaseConfig {
        &self.inner.config
    }

    /// Re-counts who wants leadership (under the lock). With `giving_up`, when
    /// nobody does, the term is removed from the state in the same step: no
    /// guard of it may be handed out from then on (`end_term` ends it), so a
    /// later `acquire` waits for the next term instead of receiving a guard of
    /// a term about to end.
    fn demand(&mut self, giving_up: bool) -> Demand {
        #[cfg(test)]
        if self.inner.storm.load(std::sync::atomic::Ordering::Relaxed) {
            self.inner.wake.notify_one();
        }
        let mut state = self.inner.lock();
        if state.active != Some(self.generation) {
            return Demand::Abandoned;
        }
        state.waiters.retain(|tx| !tx.is_canceled());
        let live = state
            .term
            .as_ref()
            .filter(|t| t.lost().is_none())
            .map_or(0, |t| t.live_guards());
        let demand = if live > 0 {
            Demand::Wanted
        } else if state.shutdown {
            Demand::Shutdown
        } else if state.waiters.is_empty() {
            Demand::Unwanted
        } else {
            Demand::Wanted
        };
        if giving_up && demand != Demand::Wanted {
            state.term = None;
        }
        demand
    }

    /// Leaves the election if still nobody wants leadership (decided under the
    /// lock, so that a waiter registering now finds no task and starts one).
    fn exit(&mut self) -> bool {
        if matches!(self.demand(false), Demand::Wanted) {
            return false;
        }
        let mut state = self.inner.lock();
        if state.current == Some(self.generation) {
            state.current = None;
        }
        self.exited = true;
        true
    }

    /// Whether this task still holds the slot: checked before every write, so
    /// that a task left behind (its runtime no longer driven) never writes
    /// again if it resumes.
    fn may_write(&self) -> Result<()> {
        if self.inner.lock().active == Some(self.generation) {
            Ok(())
        } else {
            Err(Error::ElectorStopped)
        }
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
            Obs::Known { observed, object } => {
                let same_object = object.metadata.uid == lease.metadata.uid;
                let changed = observed.spec != spec || !same_object;
                (same_object.then_some(observed), changed)
            }
            _ => (None, true),
        };
        self.inner.lock().memory.saw(
            lease.metadata.uid.as_ref(),
            &spec,
            self.inner.config.lease_duration,
            Instant::now(),
        );
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
        self.inner.lock().memory.went_away(Instant::now());
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
                self.caught_up = false;
                true
            }
            Some(Ok(watcher::Event::Init)) => {
                // A re-list: what it shows is current, but until it is done
                // the events before it may have been missed.
                self.init_seen = false;
                self.caught_up = false;
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
                self.caught_up = false;
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

    /// Campaigns until this candidate leads (`Some`) or nobody wants it
    /// (`None`). Nobody wanting it, the task lingers for one retry period,
    /// keeping its watch, before it exits: demand that flaps (an `acquire`
    /// created and dropped repeatedly) costs no new LIST, WATCH and GET.
    async fn campaign(&mut self) -> Option<(Box<Lease>, Instant, bool)> {
        let mut backoff = None;
        let mut linger_until = None;
        loop {
            match self.demand(false) {
                Demand::Abandoned => {
                    self.exited = true;
                    return None;
                }
                Demand::Shutdown => {
                    if self.exit() {
                        return None;
                    }
                    continue;
                }
                Demand::Unwanted => {
                    let until =
                        *linger_until.get_or_insert_with(|| Instant::now() + self.config().retry_period);
                    if Instant::now() >= until {
                        if self.exit() {
                            debug!("nobody wants leadership: leaving the election");
                            return None;
                        }
                        continue;
                    }
                    self.idle_until(until).await;
                    continue;
                }
                Demand::Wanted => linger_until = None,
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
                Err(Error::ElectorStopped) => {
                    self.exited = true;
                    return None;
                }
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

    /// The lease duration to write: our own, or, during a creation hold, as
    /// much as is left of the hold, so that a candidate that only ever sees
    /// our record does not take it before the hold ends.
    fn seconds_to_write(&self, hold: Option<Instant>) -> i32 {
        let ours = self.config().lease_duration_seconds();
        let left = hold.map_or(Duration::ZERO, |h| h.saturating_duration_since(Instant::now()));
        let left = i32::try_from(left.as_secs() + u64::from(left.subsec_nanos() > 0)).unwrap_or(i32::MAX);
        ours.max(left)
    }

    async fn try_acquire(&mut self) -> Result<Attempt> {
        let renew_deadline = self.config().renew_deadline;
        if !self.synced || self.stale || matches!(self.obs, Obs::Unknown) {
            self.get(renew_deadline).await?;
        }
        let now = Instant::now();
        let cfg = self.inner.config.clone();
        match &self.obs {
            Obs::Unknown => Ok(Attempt::RetryNow),
            Obs::Missing => {
                let (transitions, risk) = {
                    let state = self.inner.lock();
                    (state.memory.next_transitions(None), state.memory.risk_until)
                };
                let spec = record::taken(
                    None,
                    &cfg.identity,
                    self.seconds_to_write(Some(
                        risk.map_or(now + cfg.lease_duration, |r| r.max(now + cfg.lease_duration)),
                    )),
                    transitions,
                    record::now(),
                );
                let lease = Lease {
                    metadata: kube_client::core::ObjectMeta {
                        name: Some(cfg.name.clone()),
                        namespace: Some(cfg.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec.clone()),
                };
                self.may_write()?;
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
                    Err(Error::Conflict) => self.after_conflict(&spec, sent, true).await,
                    Err(e) => Err(e),
                }
            }
            Obs::Known { observed, object } => {
                let (own, transitions) = {
                    let state = self.inner.lock();
                    (
                        state.memory.own.as_ref().is_some_and(|o| o.matches(object)),
                        state
                            .memory
                            .next_transitions(Some(observed.spec.lease_transitions.unwrap_or(0))),
                    )
                };
                match record::verdict(observed, &cfg.identity, own, cfg.lease_duration, now) {
                    Verdict::WaitUntil(until) => Ok(Attempt::WaitUntil(until)),
                    Verdict::Take => {
                        let mut lease = (**object).clone();
                        let spec = record::taken(
                            Some(&observed.spec),
                            &cfg.identity,
                            cfg.lease_duration_seconds(),
                            transitions,
                            record::now(),
                        );
                        lease.spec = Some(spec.clone());
                        lease
                            .metadata
                            .resource_version
                            .clone_from(&observed.resource_version);
                        self.may_write()?;
                        let sent = Instant::now();
                        match self.inner.replace(&lease, renew_deadline).await {
                            Ok(lease) => Ok(Attempt::Acquired(Box::new(lease), sent, false)),
                            Err(Error::Conflict) => self.after_conflict(&spec, sent, false).await,
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

    /// A write to acquire was answered 409: someone else won the race, unless
    /// the write was ours after all (applied, answered 504 and retried by the
    /// client, whose retry met our own write). A read tells: the record is
    /// exactly the one sent.
    async fn after_conflict(
        &mut self,
        sent_spec: &LeaseSpec,
        sent: Instant,
        created: bool,
    ) -> Result<Attempt> {
        self.stale = true;
        let bound = self.config().renew_deadline.saturating_sub(sent.elapsed());
        if let Ok(Some(lease)) = self.get(bound).await
            && lease
                .spec
                .as_ref()
                .is_some_and(|spec| record::same_write(spec, sent_spec))
        {
            info!("the write answered with a conflict had been applied (a retried request): it was ours");
            return Ok(Attempt::Acquired(Box::new(lease), sent, created));
        }
        debug!("lost the race to acquire the lease");
        Ok(Attempt::WaitUntil(Instant::now() + self.inner.jittered_retry()))
    }

    /// The creation hold for a term beginning on `lease`: until the previous
    /// holder of a Lease object that went away may still lead (at least one
    /// lease duration when we created it), and any hold a term of ours on the
    /// same object already had.
    fn hold_for(&self, lease: &Lease, created: bool) -> Option<Instant> {
        let now = Instant::now();
        let mut state = self.inner.lock();
        let memory = &mut state.memory;
        let mut until = memory.risk_until.filter(|t| *t > now);
        if created {
            let ours = now + self.config().lease_duration;
            until = Some(until.map_or(ours, |u| u.max(ours)));
        }
        if let Some((uid, held)) = &memory.hold
            && *uid == lease.metadata.uid
            && *held > now
        {
            until = Some(until.map_or(*held, |u| u.max(*held)));
        }
        if let Some(until) = until {
            memory.hold = Some((lease.metadata.uid.clone(), until));
        }
        until
    }

    /// Leads one term. `Some(result)` when the task should exit (with the
    /// release's result), `None` to campaign again.
    async fn lead(&mut self, lease: Box<Lease>, sent: Instant, created: bool) -> Option<Result<()>> {
        let cfg = self.inner.config.clone();
        let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0);
        let id = TermId::of(&lease)?;
        let token = {
            let mut state = self.inner.lock();
            state.memory.own = Some(id.clone());
            state.memory.next_token(transitions)
        };
        let term = Arc::new(Term::new(token, sent, cfg.renew_deadline));
        self.observe((*lease).clone(), sent);
        // A Lease has no version once deleted and `create` has no
        // precondition, so the leader of a deleted incarnation may still
        // believe it leads: its last renewal was sent before the deletion.
        // Hold the Lease (renewing it) until that leader has given up.
        let hold = self.hold_for(&lease, created);
        if let Some(until) = hold {
            let left = until.saturating_duration_since(Instant::now());
            if created {
                info!(
                    ?left,
                    "created the lease; holding it for one lease duration (or the deleted record's, if longer) before leading"
                );
            } else {
                info!(
                    ?left,
                    "holding the lease before leading: the holder of the object it replaced may still lead"
                );
            }
        }
        let tolerated = lease
            .spec
            .as_ref()
            .and_then(record::preferred_holder)
            .map(str::to_owned);
        self.cached = Some(lease);
        self.caught_up = false;
        let mut run = TermRun {
            term,
            id,
            hold,
            tolerated,
        };
        if run.hold.is_none() {
            self.begin_term(&run.term);
        }
        let (reason, exiting) = self.lead_until_lost(&mut run, sent).await;
        let result = self.end_term(&run, &reason).await;
        exiting.then_some(result)
    }

    /// The loop of one term: why it ended, and whether the task should exit.
    async fn lead_until_lost(&mut self, run: &mut TermRun, sent: Instant) -> (Lost, bool) {
        let cfg = self.inner.config.clone();
        let wake = self.inner.wake.clone();
        let term = run.term.clone();
        let mut next_tick = sent + cfg.retry_period;
        loop {
            if let Some(lost) = term.lost() {
                // Ended from outside: by `shutdown` once its grace ran out, or
                // by a guard that saw the renew deadline pass first.
                return (lost, self.inner.lock().shutdown);
            }
            // Checked before waiting, so that no storm of wake-ups can starve
            // the deadline or the renewals.
            if Instant::now() >= term.deadline() {
                return (Lost::RenewDeadlineExceeded, false);
            }
            if let Some(lost) = self.step_down(run) {
                return (lost, false);
            }
            match self.demand(true) {
                Demand::Wanted => {}
                Demand::Unwanted => return (Lost::Released, false),
                Demand::Shutdown => return (Lost::Released, true),
                Demand::Abandoned => {
                    self.exited = true;
                    return (Lost::ElectorStopped, true);
                }
            }
            if run.hold.is_some_and(|until| Instant::now() >= until) {
                // Before handing out guards, one read: the record must still
                // be ours (a watch, even one caught up with our last write,
                // may have stalled or broken during the hold). A read that
                // fails leaves the hold on for another retry period.
                match self
                    .reread(run, "confirming the lease at the end of the creation hold")
                    .await
                {
                    Some(Err(lost)) => return (lost, false),
                    Some(Ok(())) => {
                        run.hold = None;
                        self.begin_term(&term);
                    }
                    None => run.hold = Some(Instant::now() + cfg.retry_period),
                }
            }
            if Instant::now() >= next_tick {
                let now = Instant::now();
                while next_tick <= now {
                    next_tick += cfg.retry_period;
                }
                if let Err(lost) = self.renew(run).await {
                    let left_behind = lost == Lost::ElectorStopped;
                    self.exited |= left_behind;
                    return (lost, left_behind);
                }
                continue;
            }
            let hold = run.hold;
            let hold_elapsed = async {
                match hold {
                    Some(until) => sleep_until(until).await,
                    None => futures::future::pending().await,
                }
            };
            // The branches' futures borrow `self.watch`: act once they are dropped.
            let cause = futures::select_biased! {
                () = wake.notified().fuse() => LeadWake::Demand,
                () = hold_elapsed.fuse() => LeadWake::Demand,
                () = sleep_until(term.deadline()).fuse() => LeadWake::Demand,
                event = next_event(&mut self.watch).fuse() => LeadWake::Watch(event),
                () = sleep_until(next_tick).fuse() => LeadWake::Demand,
            };
            if let LeadWake::Watch(event) = cause
                && let Err(lost) = self.on_watch_event(run, event).await
            {
                return (lost, false);
            }
        }
    }

    /// The `preferredHolder` marks the end of this term for another candidate
    /// (set during the term: one already there when it began was given its
    /// chance, and a preferred holder that never campaigns must not stop the
    /// election).
    fn step_down(&self, run: &mut TermRun) -> Option<Lost> {
        let identity = &self.config().identity;
        match self
            .cached
            .as_ref()
            .and_then(|l| l.spec.as_ref())
            .and_then(record::preferred_holder)
        {
            Some(p) if p != identity => (run.tolerated.as_deref() != Some(p)).then(|| Lost::SteppedDown {
                preferred_holder: p.to_owned(),
            }),
            _ => {
                run.tolerated = None;
                None
            }
        }
    }

    /// A watch event while leading.
    async fn on_watch_event(
        &mut self,
        run: &TermRun,
        event: Option<watcher::Result<watcher::Event<Lease>>>,
    ) -> Result<(), Lost> {
        let changed = self.handle_watch(event);
        let object = match &self.obs {
            Obs::Known { object, .. } => Some(object.clone()),
            _ => None,
        };
        let cached_rv = self
            .cached
            .as_ref()
            .and_then(|c| c.metadata.resource_version.clone());
        if let Some(object) = &object
            && object.metadata.resource_version.is_some()
            && object.metadata.resource_version == cached_rv
        {
            // Our own last write, delivered: every later event is newer.
            self.caught_up = true;
            return Ok(());
        }
        let foreign = match &object {
            None => matches!(self.obs, Obs::Missing),
            Some(object) => !run.id.matches(object),
        };
        if !foreign {
            if self.caught_up
                && let Some(object) = object
            {
                // Our record, changed by someone else since our last write
                // (a `preferredHolder` set, labels): the newest version.
                self.cached = Some(object);
            }
            return Ok(());
        }
        if !changed {
            return Ok(());
        }
        if self.caught_up {
            // Written after our last write: the term is over, now.
            return Err(object.map_or(Lost::Deleted, |object| taken_over(&object)));
        }
        // Possibly older than our last write: confirm with a read.
        self.verify(run).await
    }

    /// Ends the term for `reason`, releasing the Lease only when leadership
    /// was given up and the guarded work had ended before the term did.
    async fn end_term(&mut self, run: &TermRun, reason: &Lost) -> Result<()> {
        let term = &run.term;
        if self.may_write().is_err() {
            // Left behind: the state is the new task's now; only end our term.
            term.lose(reason);
            return Ok(());
        }
        // Status first, so that subscribers see no leader once a guard resolves.
        self.inner.update_status(|s| s.is_leader = false);
        term.lose(reason);
        {
            let mut state = self.inner.lock();
            if state.term.as_ref().is_some_and(|t| Arc::ptr_eq(t, term)) {
                state.term = None;
            }
        }
        self.inner.metrics.leading(false);
        let begun = run.hold.is_none();
        let stopped_until = {
            let mut state = self.inner.lock();
            if term.stopped_work() {
                let cfg = self.config();
                let until = record::later(
                    Instant::now(),
                    cfg.lease_duration.saturating_sub(cfg.renew_deadline),
                );
                state.memory.stopped_until = Some(state.memory.stopped_until.map_or(until, |u| u.max(until)));
            }
            state.memory.stopped_until.filter(|u| *u > Instant::now())
        };
        let wants_release = match reason {
            Lost::Released if self.inner.lock().shutdown => {
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
            Lost::ElectorStopped => false,
            _ => {
                warn!(%reason, "leadership lost");
                false
            }
        };
        let result = if !wants_release {
            Ok(())
        } else if !begun {
            info!("not releasing during the creation hold: the lease will expire instead");
            Ok(())
        } else if term.stopped_work() {
            warn!(
                "guarded work was stopped, not finished, when the term ended (requests it sent may still land): \
                 not releasing; the lease will expire after its lease duration"
            );
            Ok(())
        } else if let Some(until) = stopped_until {
            warn!(
                left = ?until.saturating_duration_since(Instant::now()),
                "guarded work of an earlier term was stopped, not finished, too recently: \
                 not releasing; the lease will expire after its lease duration"
            );
            Ok(())
        } else {
            let until = record::later(Instant::now(), self.config().release_timeout);
            let result = self.release(&run.id, until).await;
            if let Err(e) = &result {
                self.log_error("releasing the lease", e);
            }
            result
        };
        self.cached = None;
        self.caught_up = false;
        self.stale = true;
        result
    }

    /// Publishes `term`: hands guards to every waiter.
    fn begin_term(&mut self, term: &Arc<Term>) {
        // Status first, so that subscribers agree with a guard as soon as it is handed out.
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
        info!(fencing_token = term.token, "acquired lease, now leading");
    }

    /// The watch showed a record not of our term, possibly older than our last
    /// write: confirm with a read before stepping down.
    async fn verify(&mut self, run: &TermRun) -> Result<(), Lost> {
        self.reread(run, "verifying the lease").await.unwrap_or(Ok(()))
    }

    /// Reads the Lease (bounded by the renew deadline): whether it still holds
    /// a record of our term (the same identity is not enough: another process
    /// may share it), which then becomes the cached object; `None` if the read
    /// failed (logged as `what`).
    async fn reread(&mut self, run: &TermRun, what: &str) -> Option<Result<(), Lost>> {
        let left = run.term.deadline().saturating_duration_since(Instant::now());
        match self.get(left).await {
            Ok(None) => Some(Err(Lost::Deleted)),
            Ok(Some(lease)) if run.id.matches(&lease) => {
                self.cached = Some(Box::new(lease));
                Some(Ok(()))
            }
            Ok(Some(lease)) => Some(Err(taken_over(&lease))),
            Err(e) => {
                self.log_error(what, &e);
                None
            }
        }
    }

    /// One renewal: the fast path (one `replace` with the cached
    /// resourceVersion), falling to a read and a retry on conflict. The renew
    /// deadline moves to the instant before the successful request was sent.
    async fn renew(&mut self, run: &TermRun) -> Result<(), Lost> {
        let cfg = self.inner.config.clone();
        let term = &run.term;
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
            lease.spec = Some(record::renewed(
                &lease.spec.clone().unwrap_or_default(),
                self.seconds_to_write(run.hold),
                record::now(),
            ));
            if self.may_write().is_err() {
                return Err(Lost::ElectorStopped);
            }
            match self.inner.replace(&lease, deadline - sent).await {
                Ok(lease) => {
                    let in_time = term.renewed(sent, cfg.renew_deadline);
                    self.observe(lease.clone(), sent);
                    self.cached = Some(Box::new(lease));
                    self.caught_up = false;
                    if !in_time {
                        if term.lost().is_some() {
                            // Ended from outside while the request was in
                            // flight: the top of the loop handles it.
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
                    match self.reread(run, "re-reading the lease").await {
                        Some(still_ours) => still_ours?,
                        None => return Ok(()),
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

    /// Fetches the Lease and, if it still holds a record of our term, writes
    /// it free; a conflict (the Lease modified between the read and the
    /// write) is retried once after a fresh read, as client-go does.
    async fn release(&mut self, own: &TermId, until: Instant) -> Result<()> {
        for attempt in 0..2 {
            let left = until.saturating_duration_since(Instant::now());
            let Some(lease) = self.get(left).await? else {
                return Ok(());
            };
            if !own.matches(&lease) {
                info!(
                    holder = lease.spec.as_ref().and_then(record::holder).unwrap_or(""),
                    "not releasing: the lease is no longer ours"
                );
                return Ok(());
            }
            let spec = lease.spec.clone().unwrap_or_default();
            let mut next = lease;
            next.spec = Some(record::released(&spec, record::now()));
            self.may_write()?;
            let left = until.saturating_duration_since(Instant::now());
            match self.inner.replace(&next, left).await {
                Ok(released) => {
                    self.observe(released, Instant::now());
                    info!("released lease");
                    return Ok(());
                }
                Err(Error::Conflict) if attempt == 0 => {
                    debug!("the release conflicted; re-reading the lease");
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Conflict)
    }
}
