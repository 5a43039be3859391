use std::{
    collections::hash_map::RandomState,
    future::Future,
    hash::{BuildHasher, Hasher},
    sync::Arc,
    time::Duration,
};

use futures::{FutureExt, channel::oneshot, future::Shared as SharedFuture, select_biased};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube_client::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use parking_lot::Mutex;
use tokio::{
    sync::Notify,
    task::JoinHandle,
    time::{Instant, sleep_until},
};

use super::{
    Config, Error, LeaseGuard, Lost,
    guard::Term,
    record::{self, Observed, Verdict},
    view::{Seen, View},
};

/// Elects one leader among the candidates for one Lease, with client-go's protocol.
///
/// Cheap to clone: clones share one election, run by one task (spawned on the current Tokio
/// runtime by the first [`acquire`](Self::acquire)) that campaigns while an `acquire` waits,
/// renews while a guard lives, and then releases the Lease and stops, until
/// [`shutdown`](Self::shutdown).
#[derive(Clone)]
pub struct LeaderElector {
    shared: Arc<Shared>,
}

struct Shared {
    api: Api<Lease>,
    config: Config,
    state: Mutex<State>,
    /// Notified (every waiter) when a term begins.
    term_begun: Notify,
    /// Resolves once `shutdown` was called.
    shutdown_rx: SharedFuture<oneshot::Receiver<()>>,
    shutdown_tx: Mutex<Option<oneshot::Sender<()>>>,
}

#[derive(Default)]
struct State {
    task: Option<JoinHandle<()>>,
    waiters: usize,
    term: Option<Arc<Term>>,
    shutdown: bool,
}

/// What one attempt to acquire came to.
enum Attempt {
    Won(Box<Lease>, Instant),
    WaitUntil(Instant),
}

impl LeaderElector {
    /// An elector for the Lease that `config` names.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `config` breaks one of client-go's rules (see
    /// [`Config::validate`]); no API call is made before this check.
    pub fn new(client: Client, config: Config) -> Result<Self, Error> {
        config.validate()?;
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let shared = Shared {
            api: Api::namespaced(client, &config.namespace),
            config,
            state: Mutex::default(),
            term_begun: Notify::new(),
            shutdown_rx: shutdown_rx.shared(),
            shutdown_tx: Mutex::new(Some(shutdown_tx)),
        };
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// Waits until this candidate leads, and returns a guard of the term.
    ///
    /// Failed API calls are logged and retried: an unreachable API server means waiting, never
    /// leading. Starts the election task when none runs, so it must be called within a Tokio
    /// runtime. Never resolves once [`shutdown`](Self::shutdown) was called.
    pub async fn acquire(&self) -> LeaseGuard {
        let _waiting = Waiting::new(&self.shared);
        loop {
            let begun = self.shared.term_begun.notified();
            if let Some(guard) = self.shared.guard_or_start() {
                return guard;
            }
            begun.await;
        }
    }

    /// Resolves once [`shutdown`](Self::shutdown) was called: a trigger for
    /// [`Controller::graceful_shutdown_on`](crate::Controller::graceful_shutdown_on), so that a
    /// controller under the election finishes its reconciles in flight, and its stream ends.
    pub fn shutdown_requested(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        self.shared.shutdown_requested()
    }

    /// Leaves the election for good, and hands the Lease over to another candidate.
    ///
    /// 1. Stops campaigning: `acquire` never resolves any more, a guarded stream that has not
    ///    won ends (with [`Lost::Shutdown`]), and
    ///    [`shutdown_requested`](Self::shutdown_requested) resolves.
    /// 2. Waits up to `grace` for every guard of the current term to be dropped, while it keeps
    ///    renewing the Lease.
    /// 3. Ends the term with [`Lost::Shutdown`]: the guards still alive resolve.
    /// 4. Releases the Lease, so that another candidate takes over at once, **only if every
    ///    guard was dropped before the term ended**: work stopped at step 3 may have sent
    ///    requests that still land, so the Lease is then left to expire, as after a crash.
    ///
    /// Returns once the election task has ended.
    pub async fn shutdown(&self, grace: Duration) {
        let shared = &self.shared;
        let (task, term) = {
            let mut state = shared.state.lock();
            state.shutdown = true;
            (state.task.take(), state.term.clone())
        };
        if let Some(tx) = shared.shutdown_tx.lock().take() {
            let _ = tx.send(());
        }
        let Some(mut task) = task else { return };
        if let Some(term) = &term {
            // The task releases once the last guard is dropped.
            term.changed.notify_one();
        }
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            if let Some(term) = term {
                term.lose(Lost::Shutdown);
            }
            let _ = task.await;
        }
    }
}

/// An `acquire` in progress: while one waits, the election goes on.
struct Waiting<'a>(&'a Shared);

impl<'a> Waiting<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.state.lock().waiters += 1;
        Waiting(shared)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.state.lock().waiters -= 1;
    }
}

impl Shared {
    /// A guard of the current term, or `None` after starting the task if it is not running.
    fn guard_or_start(self: &Arc<Self>) -> Option<LeaseGuard> {
        let mut state = self.state.lock();
        if state.shutdown {
            return None;
        }
        if let Some(guard) = state.term.as_ref().and_then(LeaseGuard::new) {
            return Some(guard);
        }
        if state.task.as_ref().is_none_or(JoinHandle::is_finished) {
            state.task = Some(tokio::spawn(self.clone().run()));
        }
        None
    }

    /// The election task: campaigns while an `acquire` waits, and leads.
    ///
    /// Between attempts it waits for the instant the Lease expires or a change the watch
    /// delivers; without a watch in sync, at most a jittered retry period.
    async fn run(self: Arc<Self>) {
        let mut view = View::new(self.api.clone(), &self.config.name);
        let mut observed = None;
        while self.wanted() {
            let wait = match self.try_acquire(&mut observed, view.seen()).await {
                Ok(Attempt::Won(lease, sent_at)) => {
                    observed = None;
                    self.lead(*lease, sent_at, &mut view).await;
                    continue;
                }
                Ok(Attempt::WaitUntil(until)) => until,
                Err(error) => {
                    tracing::warn!(%error, "failed to acquire lease");
                    Instant::now() + jittered(self.config.retry_period)
                }
            };
            let now = Instant::now();
            let until = match view.seen() {
                Seen::Unknown => wait.max(now).min(now + jittered(self.config.retry_period)),
                _ => wait.max(now),
            };
            select_biased! {
                () = self.shutdown_requested().fuse() => {}
                () = view.changed().fuse() => {}
                () = sleep_until(until).fuse() => {}
            }
        }
    }

    /// Whether an `acquire` waits; if not, the task ends (atomically with the check).
    fn wanted(&self) -> bool {
        let mut state = self.state.lock();
        let wanted = state.waiters > 0 && !state.shutdown;
        if !wanted {
            state.task = None;
        }
        wanted
    }

    fn shutdown_requested(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        self.shutdown_rx.clone().map(|_| ())
    }

    /// One attempt: get (unless the watch in sync has `seen` the Lease); create if missing;
    /// take with a `replace` if free, ours, or expired.
    async fn try_acquire(&self, observed: &mut Option<Observed>, seen: Seen) -> Result<Attempt, Error> {
        let (config, now) = (&self.config, Instant::now());
        let (bound, seconds) = (config.renew_deadline, config.lease_duration_seconds());
        let retry = Attempt::WaitUntil(now + config.retry_period);
        let current = match seen {
            Seen::Lease(lease) => Some(*lease),
            Seen::Missing => None,
            Seen::Unknown => bounded(bound, self.api.get_opt(&config.name)).await?,
        };
        let (written, sent_at) = if let Some(current) = current {
            let seen = Observed::update(observed.take(), spec_of(&current), now);
            let verdict = seen.verdict(&config.identity, config.lease_duration, now);
            let transitions = seen.spec.lease_transitions.unwrap_or(0).saturating_add(1);
            let (id, time) = (&config.identity, record::now());
            let spec = record::taken(Some(&seen.spec), id, seconds, transitions, time);
            *observed = Some(seen);
            if let Verdict::WaitUntil(until) = verdict {
                return Ok(Attempt::WaitUntil(until));
            }
            let sent_at = Instant::now();
            (self.write(&current, spec, bound).await, sent_at)
        } else {
            let metadata = ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..ObjectMeta::default()
            };
            let spec = Some(record::taken(None, &config.identity, seconds, 0, record::now()));
            let (lease, sent_at) = (Lease { metadata, spec }, Instant::now());
            (
                bounded(bound, self.api.create(&PostParams::default(), &lease)).await,
                sent_at,
            )
        };
        match written {
            Ok(lease) => Ok(Attempt::Won(Box::new(lease), sent_at)),
            // Another candidate created or took it since our read: not leader.
            Err(e) if e.is_conflict() => Ok(retry),
            Err(e) => Err(e),
        }
    }

    /// Leads one term: renews every retry period until the term is lost, or releases the Lease
    /// once nobody wants the term any more.
    ///
    /// When the watch shows the Lease held by another or gone, it renews at once: the
    /// `resourceVersion` tells a takeover (a conflict, then the read that names the new holder)
    /// from an event older than our last write (the renewal succeeds).
    async fn lead(&self, mut lease: Lease, sent_at: Instant, view: &mut View) {
        let config = &self.config;
        let token = lease.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0);
        let term = Arc::new(Term::new(token.into(), sent_at + config.renew_deadline));
        self.state.lock().term = Some(term.clone());
        self.term_begun.notify_waiters();
        let mut renew_at = sent_at + config.retry_period;
        loop {
            if term.lost().is_some() {
                break;
            }
            if self.unwanted(&term) {
                self.release(&lease, &term).await;
                return;
            }
            let now = Instant::now();
            if now >= term.deadline() {
                term.lose(Lost::RenewDeadlineExceeded);
                break;
            }
            if now < renew_at {
                let next = renew_at.min(term.deadline());
                select_biased! {
                    () = term.changed.notified().fuse() => {}
                    () = sleep_until(next).fuse() => {}
                    () = view.changed().fuse() => {
                        if view.shows_other_than(&config.identity) {
                            renew_at = Instant::now();
                        }
                    }
                }
                continue;
            }
            // A fixed cadence: a slow renewal does not move the next one.
            while renew_at <= now {
                renew_at += config.retry_period;
            }
            match self.renew(&lease, &term).await {
                Ok(renewed) => lease = renewed,
                Err(error) => tracing::warn!(%error, "failed to renew lease"),
            }
        }
        self.state.lock().term = None;
    }

    /// One renewal, bounded by the time left. On a conflict, one `get` tells whether another
    /// candidate took the Lease.
    async fn renew(&self, lease: &Lease, term: &Term) -> Result<Lease, Error> {
        let config = &self.config;
        let spec = record::renewed(&spec_of(lease), config.lease_duration_seconds(), record::now());
        let sent_at = Instant::now();
        match self
            .write(lease, spec, term.deadline().saturating_duration_since(sent_at))
            .await
        {
            Ok(renewed) => {
                term.renewed(sent_at, config.renew_deadline);
                Ok(renewed)
            }
            Err(e) if e.is_conflict() => {
                let left = term.deadline().saturating_duration_since(Instant::now());
                let current = bounded(left, self.api.get_opt(&config.name)).await?;
                let holder = current.as_ref().map(spec_of);
                match holder.as_ref().and_then(record::holder) {
                    Some(holder) if holder == config.identity => Ok(current.unwrap_or_default()),
                    holder => {
                        let holder = holder.unwrap_or_default().to_owned();
                        term.lose(Lost::TakenOver { holder });
                        Err(e)
                    }
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the term has no guard and no `acquire` waits; if so, no guard is made any more.
    fn unwanted(&self, term: &Term) -> bool {
        let mut state = self.state.lock();
        let unwanted = (state.waiters == 0 || state.shutdown) && term.guards() == 0;
        if unwanted {
            state.term = None;
        }
        unwanted
    }

    /// Releases the Lease (client-go's `ReleaseOnCancel`) within the time left to the deadline.
    /// The `resourceVersion` of our last write makes it a no-op once someone else wrote.
    async fn release(&self, lease: &Lease, term: &Term) {
        let spec = record::released(&spec_of(lease), record::now());
        let left = term.deadline().saturating_duration_since(Instant::now());
        if let Err(error) = self.write(lease, spec, left).await {
            tracing::warn!(%error, "failed to release lease");
        }
    }

    /// A `replace` of `lease`'s record by `spec`, with `lease`'s `resourceVersion`, bounded by
    /// `left`: it fails with a conflict if the Lease changed since.
    async fn write(&self, lease: &Lease, spec: LeaseSpec, left: Duration) -> Result<Lease, Error> {
        let next = Lease {
            spec: Some(spec),
            ..lease.clone()
        };
        bounded(
            left,
            self.api.replace(&self.config.name, &PostParams::default(), &next),
        )
        .await
    }
}

fn spec_of(lease: &Lease) -> LeaseSpec {
    lease.spec.clone().unwrap_or_default()
}

/// `request`, bounded by `left`.
async fn bounded<T>(
    left: Duration,
    request: impl Future<Output = Result<T, kube_client::Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(left, request).await {
        Ok(result) => result.map_err(Error::Api),
        Err(_) => Err(Error::Timeout(left)),
    }
}

/// `period` stretched by client-go's jitter: `period * (1 + rand * 1.2)`.
fn jittered(period: Duration) -> Duration {
    let random = RandomState::new().build_hasher().finish() >> 32;
    let factor = 1.0 + 1.2 * f64::from(u32::try_from(random).unwrap_or(0)) / f64::from(u32::MAX);
    Duration::try_from_secs_f64(period.as_secs_f64() * factor).unwrap_or(period)
}
