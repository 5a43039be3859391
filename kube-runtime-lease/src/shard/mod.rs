//! Elected shards (design: `docs/sharding-design.md`), behind the
//! `unstable-shards` feature: one controller across many replicas, each
//! shard behind its own Lease.
//!
//! - [`ShardedElector`]: `S` shard electors (an ordinary [`LeaderElector`]
//!   each, on the Lease `<base>-s<S>-shard-<NN>`: every guarantee of one
//!   Lease holds per shard) and a membership elector per replica (its Lease,
//!   `<base>-member-<hash of identity>`, renewed every retry period, tells
//!   the others it is live); a balancer campaigns for this replica's share
//!   (`floor(S / L)`, or one more: within one of every other's, see
//!   `assign.rs`) and hands surplus shards over by graceful release, never
//!   one held for less than a lease duration, and only once the member list
//!   was stable for a retry period.
//! - [`ShardedController`]: one Controller, one watch per resource on every
//!   replica; an object is reconciled only on the replica that holds its
//!   shard (FNV-1a over its UID), racing that shard's guard.
//!
//! Watches: one of the election's Leases (by label) per replica, plus each
//! shard elector's own while it campaigns or leads (at most `S + 2`).
//!
//! A dead holder's shards are taken a lease duration after their records
//! last changed *as this replica's own watch saw them*: the balancer seeds
//! each campaign with that observation (`LeaderElector::hand_over_record`),
//! so that a campaign begun late does not count the lease duration again.
//! Design, guarantees and tests: `docs/sharding-design.md`.

mod assign;
mod controller;
#[cfg(test)]
mod tests;

pub use self::controller::{CurrentShard, ShardedController, current_shard};

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::{Api, Client};
use kube_runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
    time::Instant,
};
use tracing::{debug, info};

use crate::{ConfigError, LeaderElector, LeaseConfig, LeaseGuard};

/// The label on every Lease of one sharded election: its base name.
pub(crate) const OF_LABEL: &str = "leases.kube-runtime-lease/sharded-by";
/// The label telling a shard's Lease (`shard`) from a member's (`member`).
pub(crate) const ROLE_LABEL: &str = "leases.kube-runtime-lease/role";

/// A sharded election: the base Lease settings (namespace, base name,
/// identity, timings) and the number of shards.
#[derive(Clone, Debug)]
pub struct ShardConfig {
    lease: LeaseConfig,
    shards: u16,
}

impl ShardConfig {
    /// `shards` shards of the election `lease` describes: its name is the
    /// base of every Lease (`<name>-s<shards>-shard-<NN>`, and
    /// `<name>-member-<hash of identity>` for each replica) and the value of
    /// the label that finds them, so at most 63 characters of
    /// `[A-Za-z0-9._-]`. Checked by [`ShardedElector::new`], before any API
    /// call: zero shards is [`ConfigError::NoShards`], and every Lease's
    /// configuration is checked as [`LeaseConfig::validate`] checks one.
    #[must_use]
    pub fn new(lease: LeaseConfig, shards: u16) -> Self {
        ShardConfig { lease, shards }
    }

    fn shard_lease(&self, shard: u16) -> LeaseConfig {
        let mut c = self.lease.clone();
        c.name = format!("{}-s{}-shard-{shard:02}", self.lease.name, self.shards);
        c.label(OF_LABEL, self.lease.name.clone())
            .label(ROLE_LABEL, "shard")
    }

    fn member_lease(&self) -> LeaseConfig {
        let mut c = self.lease.clone();
        c.name = format!(
            "{}-member-{:016x}",
            self.lease.name,
            assign::preference(&self.lease.identity, u16::MAX)
        );
        c.label(OF_LABEL, self.lease.name.clone())
            .label(ROLE_LABEL, "member")
    }
}

impl std::fmt::Debug for ShardedElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedElector")
            .field("config", &self.inner.config)
            .field("held", &*self.inner.held_tx.borrow())
            .finish_non_exhaustive()
    }
}

/// One replica's part in a sharded election: it campaigns for about
/// `ceil(S / live replicas)` shards, hands surplus ones over by graceful
/// release, and says which it holds.
///
/// A Controller sharded by it reconciles each object only on the replica
/// holding the object's shard ([`controller`](Self::controller)):
///
/// ```no_run
/// # use std::sync::Arc;
/// # use k8s_openapi::api::core::v1::ConfigMap;
/// # use kube_client::Api;
/// # use kube_runtime::{Controller, controller::Action, watcher};
/// # use kube_runtime_lease::{LeaseConfig, shard::{ShardConfig, ShardedElector}};
/// # use futures::StreamExt;
/// # async fn reconcile(_: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, kube_client::Error> { Ok(Action::await_change()) }
/// # fn error_policy(_: Arc<ConfigMap>, _: &kube_client::Error, _: Arc<()>) -> Action { Action::await_change() }
/// # async fn doc(client: kube_client::Client, lease: LeaseConfig) -> Result<(), Box<dyn std::error::Error>> {
/// let sharded = ShardedElector::new(client.clone(), ShardConfig::new(lease, 16))?;
/// let controller = Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default());
/// let run = sharded.controller(controller).run(reconcile, error_policy, Arc::new(()));
/// run.for_each(|_| async {}).await; // the balancer runs while this is polled
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ShardedElector {
    inner: Arc<Inner>,
}

struct Inner {
    config: ShardConfig,
    client: Client,
    shards: Vec<LeaderElector>,
    member: LeaderElector,
    state: Mutex<State>,
    held_tx: watch::Sender<BTreeSet<u16>>,
    wake: Notify,
    /// Shards handed over to balance.
    rebalances: std::sync::atomic::AtomicU64,
    /// `with_metrics`: the shards-held gauge and the rebalance counter.
    #[cfg(feature = "metrics")]
    metrics: std::sync::OnceLock<(
        prometheus_client::metrics::gauge::Gauge,
        prometheus_client::metrics::counter::Counter,
    )>,
}

#[derive(Default)]
struct State {
    /// Shards held: their guard, and since when.
    held: BTreeMap<u16, (LeaseGuard, Instant)>,
    /// Shards campaigned for.
    acquiring: BTreeMap<u16, JoinHandle<()>>,
    shutdown: bool,
}

/// What one watch of the election's Leases shows.
#[derive(Default)]
struct View {
    /// Members: Lease name → what was seen of it.
    members: BTreeMap<String, Watched>,
    /// Shards: shard → what was seen of its Lease.
    shards: BTreeMap<u16, Watched>,
}

/// A Lease of the election as the watch showed it.
struct Watched {
    /// Its holder (`None` when free).
    holder: Option<String>,
    /// The last object seen.
    lease: Lease,
    /// When its record (spec) last changed here: the observed-change clock.
    changed: Instant,
}

impl Watched {
    fn spec(&self) -> Option<&k8s_openapi::api::coordination::v1::LeaseSpec> {
        self.lease.spec.as_ref()
    }

    /// Whether its record changed within its own lease duration (`fallback`
    /// when it has none, or one that is not positive, as for any Lease: see
    /// `record::lease_duration`).
    fn fresh(&self, fallback: Duration, now: Instant) -> bool {
        let d = self
            .spec()
            .map_or(fallback, |spec| crate::record::lease_duration(spec, fallback));
        now.saturating_duration_since(self.changed) < d
    }
}

impl ShardedElector {
    /// A replica of the sharded election `config`, using `client`. Makes no
    /// API call until [`run`](Self::run).
    ///
    /// # Errors
    /// The first rule a Lease's configuration breaks.
    pub fn new(client: Client, config: ShardConfig) -> Result<Self, ConfigError> {
        if config.shards == 0 {
            return Err(ConfigError::NoShards);
        }
        let shards = (0..config.shards)
            .map(|s| LeaderElector::new(client.clone(), config.shard_lease(s)))
            .collect::<Result<Vec<_>, _>>()?;
        let member = LeaderElector::new(client.clone(), config.member_lease())?;
        Ok(ShardedElector {
            inner: Arc::new(Inner {
                config,
                client,
                shards,
                member,
                state: Mutex::new(State::default()),
                held_tx: watch::Sender::new(BTreeSet::new()),
                wake: Notify::new(),
                rebalances: std::sync::atomic::AtomicU64::new(0),
                #[cfg(feature = "metrics")]
                metrics: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Records every shard's and the membership's election metrics into
    /// `metrics` (see [`LeaseMetrics`](crate::metrics::LeaseMetrics)): one series per
    /// Lease, so that the shards a replica holds are the sum of
    /// `leader_election_is_leader` over its shard Leases
    /// (`<base>-s<S>-shard-<NN>`); and the election's own two, labelled by
    /// its base name: `leader_election_shards_held` and
    /// `leader_election_shard_rebalances_total` (shards handed over to
    /// balance the shares).
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn with_metrics(self, metrics: &crate::metrics::LeaseMetrics) -> Self {
        for elector in self.inner.shards.iter().chain([&self.inner.member]) {
            let _ = elector.clone().with_metrics(metrics);
        }
        let cfg = &self.inner.config.lease;
        let (held, rebalances) = metrics.shards(&cfg.namespace, &cfg.name);
        held.set(i64::try_from(self.inner.held_tx.borrow().len()).unwrap_or(i64::MAX));
        rebalances.inc_by(self.rebalances());
        let _ = self.inner.metrics.set((held, rebalances));
        self
    }

    /// How many shards this replica has handed over to balance the shares
    /// (graceful releases because it held more than its share; shards lost
    /// or given up at shutdown do not count).
    #[must_use]
    pub fn rebalances(&self) -> u64 {
        self.inner.rebalances.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The shard of the object with `uid`.
    #[must_use]
    pub fn shard_of(&self, uid: &str) -> u16 {
        assign::shard_of(uid, self.inner.config.shards)
    }

    /// Whether this replica holds `object`'s shard now (by its UID: an object
    /// without one, which a watch never delivers, is owned by nobody). The
    /// answer is a snapshot; a reconcile run by
    /// [`controller`](Self::controller) is the one that is fenced.
    #[must_use]
    pub fn owns<K: kube_client::Resource>(&self, object: &K) -> bool {
        object.meta().uid.as_deref().is_some_and(|uid| self.owns_uid(uid))
    }

    /// Whether this replica holds the shard of the object with `uid` now.
    #[must_use]
    pub fn owns_uid(&self, uid: &str) -> bool {
        let shard = self.shard_of(uid);
        self.inner
            .state
            .lock()
            .held
            .get(&shard)
            .is_some_and(|(g, _)| g.is_valid())
    }

    /// The shards held now, and every change.
    #[must_use]
    pub fn held(&self) -> watch::Receiver<BTreeSet<u16>> {
        self.inner.held_tx.subscribe()
    }

    /// Each shard's status, as its elector sees it (who holds it, whether
    /// this replica does, when it last renewed).
    #[must_use]
    pub fn status(&self) -> BTreeMap<u16, crate::LeaderStatus> {
        (0..self.inner.config.shards)
            .zip(&self.inner.shards)
            .map(|(s, e)| (s, e.status()))
            .collect()
    }

    /// A guard of `shard`'s term, if this replica holds it (for the work of
    /// that shard: it resolves when the shard is lost).
    #[must_use]
    pub fn guard(&self, shard: u16) -> Option<LeaseGuard> {
        let held = self.inner.state.lock().held.contains_key(&shard);
        held.then(|| self.inner.shards[usize::from(shard)].current_guard())
            .flatten()
    }

    /// Takes part in the election until [`shutdown`](Self::shutdown): holds
    /// this replica's membership Lease, watches the election's Leases, and
    /// campaigns for and releases shards by the rules of `assign`.
    pub async fn run(&self) {
        let inner = &self.inner;
        let cfg = &inner.config.lease;
        // However it ends (shutdown, the future dropped with its controller's
        // stream, the membership elector stopped), no shard stays held by a
        // replica that no longer takes part: its guards go, so each shard is
        // released once its work stopped, and campaigns stop.
        let _leave = Leave(self);
        // Live once the membership Lease is held; from then on it is taken
        // again whenever its term ends (a pause, a partition, an API server
        // outage): a member that stops renewing drops out of every peer's
        // count, so it must come back.
        let Ok(first) = inner.member.acquire().await else {
            return;
        };
        let member = inner.member.clone();
        let membership = async move {
            let mut guard = first;
            loop {
                let lost = (&mut guard).await;
                info!(reason = ?lost, "the membership Lease was lost: taking it again");
                match member.acquire().await {
                    Ok(g) => guard = g,
                    Err(_) => return,
                }
            }
        };
        let mut membership = std::pin::pin!(membership.fuse());
        let api: Api<Lease> = Api::namespaced(inner.client.clone(), &cfg.namespace);
        let selector = format!("{OF_LABEL}={}", cfg.name);
        let mut events = watcher(api, watcher::Config::default().labels(&selector))
            .default_backoff()
            .applied_objects()
            .boxed();
        let mut view = View::default();
        let mut members = BTreeSet::new();
        let mut members_since = Instant::now();
        let mut tick = tokio::time::interval(cfg.retry_period);
        loop {
            futures::select_biased! {
                event = events.next().fuse() => {
                    if let Some(Ok(lease)) = event {
                        view.update(&inner.config, &lease, Instant::now());
                    }
                }
                () = inner.wake.notified().fuse() => {}
                _ = tick.tick().fuse() => {}
                () = membership => return,
            }
            if inner.state.lock().shutdown {
                return;
            }
            let now = Instant::now();
            let mut live = view.live_members(cfg.lease_duration, now);
            live.insert(cfg.identity.clone());
            if live != members {
                debug!(?live, "members changed");
                members.clone_from(&live);
                members_since = now;
            }
            let stable = now.saturating_duration_since(members_since) >= cfg.retry_period;
            self.rebalance(&view, &members, stable, now);
        }
    }

    /// One step of the balancer.
    fn rebalance(&self, view: &View, members: &BTreeSet<String>, stable: bool, now: Instant) {
        let inner = &self.inner;
        let cfg = &inner.config.lease;
        let mut state = inner.state.lock();
        // Terms that ended (lost, or their deadline passed) are not held.
        state.held.retain(|_, (g, _)| g.is_valid());
        state.acquiring.retain(|_, task| !task.is_finished());
        // Shards a live other member holds are not worth campaigning for.
        let taken_by_other = |s: u16| {
            view.shards.get(&s).is_some_and(|seen| {
                seen.holder
                    .as_ref()
                    .is_some_and(|h| *h != cfg.identity && members.contains(h))
                    && seen.fresh(cfg.lease_duration, now)
            })
        };
        let busy: Vec<u16> = state
            .acquiring
            .keys()
            .copied()
            .filter(|s| taken_by_other(*s))
            .collect();
        for s in busy {
            if let Some(task) = state.acquiring.remove(&s) {
                task.abort();
            }
        }
        let mine: BTreeSet<u16> = state.held.keys().chain(state.acquiring.keys()).copied().collect();
        let free: BTreeSet<u16> = (0..inner.config.shards)
            .filter(|s| !mine.contains(s) && !taken_by_other(*s))
            .collect();
        let plan = assign::plan(&cfg.identity, members, inner.config.shards, &mine, &free, stable);
        for s in plan.release {
            // Never release a shard held for less than one lease duration.
            let young = state
                .held
                .get(&s)
                .is_some_and(|(_, since)| now.saturating_duration_since(*since) < cfg.lease_duration);
            if young {
                continue;
            }
            if state.held.remove(&s).is_some() {
                info!(shard = s, "handing the shard over");
                self.inner
                    .rebalances
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                #[cfg(feature = "metrics")]
                if let Some((_, counter)) = self.inner.metrics.get() {
                    counter.inc();
                }
            } else if let Some(task) = state.acquiring.remove(&s) {
                task.abort();
            }
        }
        for s in plan.take {
            // The shard elector starts from this watch's observation of the
            // shard's Lease: a dead holder's record expires a lease duration
            // after it last changed here, not after the campaign's first read.
            if let Some(seen) = view.shards.get(&s) {
                inner.shards[usize::from(s)].hand_over_record(seen.lease.clone(), seen.changed);
            }
            let this = self.clone();
            let task = tokio::spawn(async move {
                let Ok(guard) = this.inner.shards[usize::from(s)].acquire().await else {
                    return;
                };
                info!(
                    shard = s,
                    fencing_token = guard.fencing_token(),
                    "holds the shard"
                );
                // When the term ends (lost, or its deadline passed), the
                // balancer says so at once, not at its next tick.
                let ended = guard.lost_signal();
                this.inner.state.lock().held.insert(s, (guard, Instant::now()));
                this.publish();
                this.inner.wake.notify_one();
                // (Weakly: the shard's guard lives in `held`, and this task
                // must not keep the election alive once it is dropped.)
                let weak = Arc::downgrade(&this.inner);
                tokio::spawn(async move {
                    ended.await;
                    if let Some(inner) = weak.upgrade() {
                        inner.wake.notify_one();
                    }
                });
            });
            state.acquiring.insert(s, task);
        }
        drop(state);
        self.publish();
    }

    fn publish(&self) {
        let held: BTreeSet<u16> = self
            .inner
            .state
            .lock()
            .held
            .iter()
            .filter(|(_, (g, _))| g.is_valid())
            .map(|(s, _)| *s)
            .collect();
        #[cfg(feature = "metrics")]
        if let Some((gauge, _)) = self.inner.metrics.get() {
            gauge.set(i64::try_from(held.len()).unwrap_or(i64::MAX));
        }
        self.inner.held_tx.send_if_modified(|h| {
            let changed = *h != held;
            *h = held;
            changed
        });
    }

    /// Drops every shard held or campaigned for, and says so.
    fn give_up_all(&self) {
        let tasks: Vec<JoinHandle<()>> = {
            let mut state = self.inner.state.lock();
            state.held.clear();
            std::mem::take(&mut state.acquiring).into_values().collect()
        };
        for task in tasks {
            task.abort();
        }
        self.publish();
    }

    /// Leaves the election: stops the balancer, releases its membership
    /// Lease (the others' shares grow at once), and gives every shard up
    /// (each released once its guards are dropped, within `grace`), so that
    /// the others take them within a watch event and a write each.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.state.lock().shutdown = true;
        self.give_up_all();
        self.inner.wake.notify_one();
        // The membership first: the others' shares grow at once, so that
        // they campaign for these shards while they are being released.
        let _ = self.inner.member.shutdown(grace).await;
        futures::future::join_all(self.inner.shards.iter().map(|s| s.shutdown(grace))).await;
    }
}

/// Gives every shard up when [`ShardedElector::run`] ends, however it ends.
struct Leave<'a>(&'a ShardedElector);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        debug!("the sharded election's balancer stopped: giving every shard up");
        self.0.give_up_all();
    }
}

impl View {
    fn update(&mut self, config: &ShardConfig, lease: &Lease, now: Instant) {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let role = lease
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ROLE_LABEL))
            .map(String::as_str);
        let slot = match role {
            Some("member") => self.members.entry(name),
            Some("shard") => {
                let prefix = format!("{}-s{}-shard-", config.lease.name, config.shards);
                let Some(shard) = name.strip_prefix(&prefix).and_then(|n| n.parse::<u16>().ok()) else {
                    return;
                };
                return Self::put(self.shards.entry(shard), lease, now);
            }
            _ => return,
        };
        Self::put(slot, lease, now);
    }

    /// Records `lease` in `slot`: the clock restarts only when its record
    /// (spec) changed or it is another object.
    fn put<K: Ord>(slot: std::collections::btree_map::Entry<'_, K, Watched>, lease: &Lease, now: Instant) {
        let holder = lease
            .spec
            .as_ref()
            .and_then(crate::record::holder)
            .map(str::to_owned);
        let seen = Watched {
            holder,
            lease: lease.clone(),
            changed: now,
        };
        match slot {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(seen);
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                let old = o.get();
                let same = old.lease.spec == lease.spec && old.lease.metadata.uid == lease.metadata.uid;
                let changed = if same { old.changed } else { now };
                o.insert(Watched { changed, ..seen });
            }
        }
    }

    /// The identities of members whose record changed within its lease
    /// duration (the membership elector renews every retry period).
    fn live_members(&self, fallback: Duration, now: Instant) -> BTreeSet<String> {
        self.members
            .values()
            .filter(|seen| seen.fresh(fallback, now))
            .filter_map(|seen| seen.holder.clone())
            .collect()
    }
}
