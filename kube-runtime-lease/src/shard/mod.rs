//! Elected shards (design: `docs/sharding-design.md`), behind the
//! `unstable-shards` feature: one controller across many replicas, each
//! shard behind its own Lease.
//!
//! - [`ShardedElector`]: `S` shard electors (an ordinary [`LeaderElector`]
//!   each, on the Lease `<base>-s<S>-shard-<NN>`: every guarantee of one
//!   Lease holds per shard) and an entry in the roster per replica (the
//!   Lease `<base>-member-<hash of identity>`, written when it joins, leaves
//!   or is evicted, never renewed). Every member computes the same
//!   assignment from the roster (`assign.rs`: its share, `floor(S / L)` or
//!   one more, by rendezvous hashing), campaigns for its shards and hands
//!   the others over by graceful release, never one held for less than a
//!   lease duration, and only once the roster was stable for a retry period.
//! - [`ShardedController`]: one Controller, one watch per resource on every
//!   replica; an object is reconciled only on the replica that holds its
//!   shard (FNV-1a over its UID), racing that shard's guard.
//!
//! With the election switched off ([`LeaseConfig::enabled`]`(false)`: a
//! local run, a single-replica install), a replica holds every shard, with
//! no roster and no API call, until shutdown; never where several run.
//!
//! Watches, per replica: the roster, and the shard Leases it owns or would
//! own if their owner left (its backups), selected by label and selected
//! again when the roster changes; the shard Leases of other shard counts
//! (`shards!=<S>`: none but during a rolling update of `S`, and the old
//! count's, free and unchanging, after one); plus each shard elector's own
//! while it campaigns or leads. So a replica receives, per retry period, at
//! most about `4 S / L` events (its shards' renewals twice, its backups',
//! the next member's), whatever the number of replicas at a given `S / L`.
//!
//! Replicas of two shard counts (a rolling update of `S`): each roster entry
//! carries its count (`SHARDS_LABEL`; none: an older build, counted as the
//! reader's own), each count assigns its shards among its own members, and a
//! replica takes no shard while a Lease of another count is held and fresh
//! (see [`ShardConfig::new`]).
//!
//! A member's death shows in its shards: the members watching over them
//! (their backups, and the member before it on the roster) see its records
//! unchanged for a lease duration, and evict it from the roster (after
//! reading the shard's Lease again); the assignment without it gives each
//! of its shards to the backup that was watching it, which takes it at once,
//! its expiry counted from that watch (`LeaderElector::hand_over_record`).
//! Design, guarantees and tests: `docs/sharding-design.md`.
//!
//! # Bounds
//! With `LD`, `RD`, `RP` the lease duration, renew deadline and retry period:
//! - **A replica (re)starting** into a running election does nothing before
//!   its watch has listed the roster: it campaigns only for its share of the
//!   assignment with the members listed, never for a shard assigned to
//!   another (before, its first pass saw no other member and campaigned for
//!   all `S`, and could take a shard free mid-handover, to move it again a
//!   lease duration later).
//! - **A moved shard** is served by its new owner within a watch event and a
//!   write of the handover when its work here (gated reconciles, guards from
//!   [`ShardedElector::guard`]) ends within the reconcile grace
//!   ([`ShardConfig::reconcile_grace`], default `RD`); and within
//!   `grace + LD + RP` of the handover however long a reconcile hangs (kube
//!   sets no read timeout): at the end of the grace the work still running is
//!   stopped (its term ends as [`Lost::GivenUp`](crate::Lost::GivenUp), the
//!   work racing its guards is dropped), and the Lease, never released after
//!   stopped work, expires for the new owner.
//! - **The roster** holds the live members and the members gone within the
//!   last `3 LD + RP`: an entry left free (its member left, or was evicted:
//!   within `2 LD + RP` of a crash) is deleted once the member chosen for it
//!   has seen it unchanged for `LD` (any member after `3 LD`), with the
//!   record judged as the delete's precondition. Needs `delete` on `leases`.
//!   A member that dies holding no shard (more members than shards) is never
//!   evicted, so its entry stays (and counts nothing).
//! - **Once faults heal** (the API answers every replica again), every shard
//!   has an owner within `W + k (2 LD + RP) + grace + LD + RP`: `W` until the
//!   replicas' watches are back (kube-runtime's backoff: up to 30 s after a
//!   long cut), `k` the dead members still on the roster that watched over
//!   each other (evicted one after the other). The sharded simulation checks
//!   it for every shard with its own timings (`W` = 6.4 s, `k` = 2). Other
//!   members joining and leaving meanwhile do not delay an eviction: a
//!   watcher's clock of a shard held by nobody runs on across roster changes
//!   while it watches over that shard for the same owner (not across its own
//!   restarts: a shard watched over only by members that each live less
//!   than `2 LD` is not judged).
//! - **A watch that stalls** (open and silent, neither ending nor failing)
//!   is caught by the reads it would have made unnecessary: an eviction's
//!   confirming read that shows a newer record than the shard watch, or a
//!   roster entry that changed since the roster watch showed it (the
//!   eviction's write conflicts), starts the roster and shard watches again
//!   (warned), and the shard's holder is judged by those reads meanwhile (the
//!   same version read a lease duration apart evicts it); another count's
//!   Lease that stopped changing on the watch is read before it lets this
//!   replica in. An eviction's own write is taken into the view at once,
//!   without waiting for the roster watch. A shard watch that lags (a
//!   renewal delivered more than `RP` after its `renewTime`) is not
//!   trusted: the shards it selects are read every `RP` instead, as a
//!   client-go follower polls, until it delivers in time, so that a dead
//!   member's shards are taken within about `LD + 2 RP` of its death, not
//!   the lag later.

mod assign;
mod controller;
mod roster;
#[cfg(test)]
mod tests;
mod view;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::{FutureExt, StreamExt, TryStreamExt, stream::BoxStream};
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::{Api, Client};
use kube_runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
    time::Instant,
};
use tracing::{Instrument, debug, info, warn};

pub use self::controller::{CurrentShard, ShardedController, current_shard};
use self::{
    assign::Assignment,
    view::{Lag, Listing, Watched},
};
use crate::{ConfigError, LeaderElector, LeaseConfig, LeaseGuard, error::Chain, record::Wire};

/// The label on every Lease of one sharded election: its base name.
pub(crate) const OF_LABEL: &str = "leases.kube-runtime-lease/sharded-by";
/// The label telling a shard's Lease (`shard`) from a member's (`member`).
pub(crate) const ROLE_LABEL: &str = "leases.kube-runtime-lease/role";
/// The label of a shard's Lease with its number (`NN`, as in its name), by
/// which a replica selects the shards it watches.
pub(crate) const SHARD_LABEL: &str = "leases.kube-runtime-lease/shard";
/// The label of a shard's Lease, and of a member's roster entry, with the
/// election's shard count: replicas of two counts (a rolling update of the
/// count) tell each other's entries and Leases by it.
pub(crate) const SHARDS_LABEL: &str = "leases.kube-runtime-lease/shards";

/// A sharded election: the base Lease settings (namespace, base name,
/// identity, timings) and the number of shards.
#[derive(Clone, Debug)]
pub struct ShardConfig {
    lease: LeaseConfig,
    shards: u16,
    /// See [`ShardConfig::reconcile_grace`]; `None`: the renew deadline.
    reconcile_grace: Option<Duration>,
}

impl ShardConfig {
    /// `shards` shards of the election `lease` describes: its name is the
    /// base of every Lease (`<name>-s<shards>-shard-<NN>`, and
    /// `<name>-member-<hash of identity>` for each replica) and the value of
    /// the label that finds them, so at most 63 characters of
    /// `[A-Za-z0-9._-]`. Checked by [`ShardedElector::new`], before any API
    /// call: zero shards is [`ConfigError::NoShards`], and every Lease's
    /// configuration is checked as [`LeaseConfig::validate`] checks one.
    ///
    /// A change of `shards` may be a rolling update (a Helm upgrade changing
    /// the count: replicas of both counts run side by side). Each roster
    /// entry carries its replica's count, and each count assigns its shards
    /// among its own members only; a replica takes no shard while a shard
    /// Lease of another count is held with a record that changed within its
    /// lease duration (or was released lately, while a replica of that
    /// count is on the roster to take it again), and says so once (info).
    /// So the new count starts once the old count's last replica has
    /// released its shards (each once its work ended): never an object with
    /// an owner of each count. A crashed old replica's shards expire for it
    /// a lease duration after their last renewal; a new count's first
    /// takeover then adds the creation hold of its new Leases (one lease
    /// duration, see [`LeaseConfig::creation_hold`]). Replicas of two counts
    /// started at once with nothing held (a misconfiguration) may both take
    /// shards: the lower count gives its shards up, with the reconcile
    /// grace, as on a handover, so objects may have an owner of each count
    /// for a watch event, and for up to the grace while work runs. The
    /// build before (with no count on the roster entry) must not be the old
    /// side of such an update: it counts the new count's members in its
    /// assignment; update the build first, then the count.
    ///
    /// Moving from one election ([`LeaderElector`] on a Lease `name`) to
    /// elected shards with the base name `name`, or back, is not a rolling
    /// update: the shard Leases are other Leases than `name`, so the old
    /// replicas' leader and the new shard owners would both reconcile the
    /// same objects until the last old replica is gone. Scale to zero first
    /// (or use the `Recreate` strategy). Replicas whose timings differ (a
    /// rolling update of the timings alone) are fine: every shard, and each
    /// member's progress on it, is judged by the lease duration on its
    /// record.
    #[must_use]
    pub fn new(lease: LeaseConfig, shards: u16) -> Self {
        ShardConfig {
            lease,
            shards,
            reconcile_grace: None,
        }
    }

    /// How long the work of a shard handed over to another replica may go
    /// on here (each gated reconcile, each guard from
    /// [`ShardedElector::guard`]) before it is stopped: its term then ends
    /// ([`Lost::GivenUp`](crate::Lost::GivenUp)), the work racing its
    /// guards is dropped, and the Lease is not released but left to expire
    /// (requests the stopped work sent may still land), so that the new
    /// owner serves the shard within this grace, the lease duration and a
    /// retry period of the handover, however long a reconcile hangs. Work
    /// that ends within the grace lets the shard be released at once.
    /// Default: the Lease's renew deadline.
    #[must_use]
    pub fn reconcile_grace(mut self, grace: Duration) -> Self {
        self.reconcile_grace = Some(grace);
        self
    }

    /// The longest [`ShardedElector::shutdown`]`(grace)` can take: leaving the
    /// roster (bounded by the release timeout), then every shard's elector
    /// shut down at once, each within
    /// [`LeaseConfig::shutdown_budget`]`(grace)`. What a pod's
    /// `terminationGracePeriodSeconds` must cover.
    #[must_use]
    pub fn shutdown_budget(&self, grace: Duration) -> Duration {
        self.lease
            .release_timeout
            .saturating_add(self.lease.shutdown_budget(grace))
    }

    /// The span of the sharded election's own lines (the balancer's, and
    /// those of the tasks it spawns; each shard's election has its own),
    /// naming its base name, under the caller's span. At ERROR level, as
    /// `LeaseConfig::span`.
    fn span(&self) -> tracing::Span {
        tracing::error_span!(
            "sharded_election",
            lease.namespace = %self.lease.namespace,
            lease.name = %self.lease.name,
            identity = %self.lease.identity,
            shards = self.shards,
        )
    }

    /// The reconcile grace in force (see [`reconcile_grace`](Self::reconcile_grace)).
    fn grace(&self) -> Duration {
        self.reconcile_grace.unwrap_or(self.lease.renew_deadline)
    }

    fn shard_lease(&self, shard: u16) -> LeaseConfig {
        let mut c = self.lease.clone();
        c.name = format!("{}-s{}-shard-{shard:02}", self.lease.name, self.shards);
        c.own_label(OF_LABEL, self.lease.name.clone())
            .own_label(ROLE_LABEL, "shard")
            .own_label(SHARD_LABEL, format!("{shard:02}"))
            .own_label(SHARDS_LABEL, self.shards.to_string())
    }

    /// This replica's roster entry: its name, labels and annotations.
    fn member_lease(&self) -> LeaseConfig {
        let mut c = self.lease.clone();
        c.name = format!(
            "{}-member-{:016x}",
            self.lease.name,
            assign::preference(&self.lease.identity, u16::MAX)
        );
        c.own_label(OF_LABEL, self.lease.name.clone())
            .own_label(ROLE_LABEL, "member")
            .own_label(SHARDS_LABEL, self.shards.to_string())
    }

    /// The shard a Lease of this election is for (by its name), if it is one.
    fn shard_of_lease(&self, lease: &Lease) -> Option<u16> {
        let prefix = format!("{}-s{}-shard-", self.lease.name, self.shards);
        let shard = lease
            .metadata
            .name
            .as_deref()?
            .strip_prefix(&prefix)?
            .parse::<u16>()
            .ok()?;
        (shard < self.shards).then_some(shard)
    }

    /// The label selector of the roster's entries.
    fn roster_selector(&self) -> String {
        format!("{OF_LABEL}={},{ROLE_LABEL}=member", self.lease.name)
    }

    /// The label selector of the shard Leases of every other shard count.
    fn foreign_selector(&self) -> String {
        format!(
            "{OF_LABEL}={},{ROLE_LABEL}=shard,{SHARDS_LABEL}!={}",
            self.lease.name, self.shards
        )
    }

    /// The label selector of the shard Leases in `shards` (all of them:
    /// no set to name).
    fn shards_selector(&self, shards: &BTreeSet<u16>) -> String {
        let all = format!(
            "{OF_LABEL}={},{ROLE_LABEL}=shard,{SHARDS_LABEL}={}",
            self.lease.name, self.shards
        );
        if shards.len() >= usize::from(self.shards) {
            return all;
        }
        let list: Vec<String> = shards.iter().map(|s| format!("{s:02}")).collect();
        format!("{all},{SHARD_LABEL} in ({})", list.join(","))
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

/// One replica's part in a sharded election: it joins the roster, campaigns
/// for the shards the roster's assignment gives it (`floor(S / members)`, or
/// one more), hands the others over by graceful release, and says which it
/// holds.
///
/// RBAC: `get`, `list`, `watch`, `create` and `update` on `leases` in the
/// election's namespace, as for one Lease, and `delete`, for the departed
/// members' roster entries (without it they stay, with one warning).
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
    /// This replica's roster entry.
    member: LeaseConfig,
    state: Mutex<State>,
    held_tx: watch::Sender<BTreeSet<u16>>,
    /// Whether a [`ShardedElector::shutdown`] returned (its releases written).
    shut_down: watch::Sender<bool>,
    wake: Notify,
    /// Shards handed over to balance.
    rebalances: std::sync::atomic::AtomicU64,
    /// A delete of a departed member's entry was refused (403) since the
    /// last one done: said once per outage.
    delete_forbidden: std::sync::atomic::AtomicBool,
    /// Shard Leases held that the shard watch does not show (their labels
    /// edited by someone else), as an eviction's confirming read last found
    /// them: shard -> (resourceVersion, when first read so). Such a Lease is
    /// judged by these reads, by the observed-change rule.
    unseen: Mutex<BTreeMap<u16, (Option<String>, Instant)>>,
    /// An eviction's confirming read showed a record the shard watch did not
    /// (stalled or lagging): the balancer starts its roster and shard
    /// watches again.
    relist: std::sync::atomic::AtomicBool,
    /// Roster entries this replica's evictions wrote, for the balancer's
    /// view at its next turn, without waiting for the roster watch (which
    /// may lag).
    written: Mutex<Vec<Lease>>,
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
    /// Shards handed over whose work (guards still alive) may go on here
    /// until then: the reconcile grace after the handover.
    handing_over: BTreeMap<u16, Instant>,
    /// The write of this replica's roster entry under way (joining again),
    /// which `leave` waits for before it reads the entry.
    joining: Option<JoinHandle<()>>,
    shutdown: bool,
}

/// What this replica's watches show.
#[derive(Default)]
struct View {
    /// The roster: Lease name → what was seen of it.
    roster: Listing<String>,
    /// The shards watched (owned or backed up): shard → its Lease.
    shards: Listing<u16>,
    /// The shard Leases of other shard counts (a rolling update of the
    /// count): Lease name → what was seen of it.
    foreign: Listing<String>,
    /// Those of them read unchanged since they stopped changing on the
    /// watch: Lease name → the resourceVersion read.
    confirmed: BTreeMap<String, Option<String>>,
}

/// What the shard Leases of other shard counts show.
#[derive(Default)]
struct Foreign {
    /// The highest count of a Lease held with a fresh record.
    held: Option<u16>,
    /// The counts with a Lease that keeps this replica out now: held with
    /// a fresh record, or released while watched, its record fresh (and,
    /// for a count higher than this replica's, a retry period more).
    active: BTreeSet<u16>,
    /// When the next of those stops keeping it out.
    until: Option<Instant>,
}

impl View {
    /// The identities the roster names with the shard count `shards`: an
    /// entry's count is its `SHARDS_LABEL`, and an entry without one (written
    /// by an older version) counts as `shards`.
    fn members(&self, shards: u16) -> BTreeSet<String> {
        self.roster
            .iter()
            .filter(|(_, seen)| seen.shard_count().is_none_or(|c| c == shards))
            .filter_map(|(_, seen)| seen.holder.clone())
            .collect()
    }

    /// The shard Leases of other counts, for a replica of `shards` shards,
    /// as seen at `now` (`fallback`: the lease duration of a record without
    /// one). A released record of a higher count keeps a replica out a
    /// retry period longer than one of a lower count: when replicas of both
    /// counts hold nothing (both gave their shards up at once), the higher
    /// count takes its shards first, and the lower one then sees them held.
    /// A released record counts only while the roster has a member of its
    /// count (one that may take it again: a replica leaves the roster before
    /// it releases its shards), so that the last replica of a count leaving
    /// lets the other count in at once.
    fn foreign(&self, shards: u16, fallback: Duration, retry: Duration, now: Instant) -> Foreign {
        let listed = self.listed_counts();
        // A Lease held by a member of this count (its labels edited by
        // someone else: no replica of that count holds it) outranks nobody.
        let ours = self.members(shards);
        let mut out = Foreign::default();
        for (_, seen) in self.foreign.iter() {
            let Some(until) = keeps_out_until(seen, shards, &listed, fallback, retry) else {
                continue;
            };
            if now >= until {
                continue;
            }
            let count = seen.shard_count().unwrap_or(0);
            out.active.insert(count);
            if seen.holder.as_ref().is_some_and(|h| !ours.contains(h)) {
                out.held = out.held.max(Some(count));
            }
            out.until = Some(out.until.map_or(until, |u| u.min(until)));
        }
        out
    }

    /// The shard Leases of other counts that kept a replica of `shards`
    /// shards out until their record stopped changing on this watch, and
    /// now let it in (see [`foreign`](Self::foreign)): their names and the
    /// resourceVersions the watch last showed.
    fn lapsed_foreign(
        &self,
        shards: u16,
        fallback: Duration,
        retry: Duration,
        now: Instant,
    ) -> Vec<(String, Option<String>)> {
        let listed = self.listed_counts();
        self.foreign
            .iter()
            .filter(|(_, seen)| {
                keeps_out_until(seen, shards, &listed, fallback, retry).is_some_and(|until| now >= until)
            })
            .map(|(name, seen)| (name.clone(), seen.lease.metadata.resource_version.clone()))
            .collect()
    }

    /// The shard counts of the members on the roster.
    fn listed_counts(&self) -> BTreeSet<u16> {
        self.roster
            .iter()
            .filter(|(_, seen)| seen.holder.is_some())
            .filter_map(|(_, seen)| seen.shard_count())
            .collect()
    }

    /// The roster entry naming `identity`.
    fn entry_of(&self, identity: &str) -> Option<&Watched> {
        self.roster
            .iter()
            .map(|(_, seen)| seen)
            .find(|seen| seen.holder.as_deref() == Some(identity))
    }
}

/// Until when the shard Lease `seen` of another count keeps a replica of
/// `shards` shards out, unless its record changes (`None`: it does not):
/// held, or released while watched while a member of its count is on the
/// roster (`listed`), for its lease duration after it last changed here,
/// and a released one of a higher count a retry period more (see
/// [`View::foreign`]).
fn keeps_out_until(
    seen: &Watched,
    shards: u16,
    listed: &BTreeSet<u16>,
    fallback: Duration,
    retry: Duration,
) -> Option<Instant> {
    let count = seen.shard_count().unwrap_or(0);
    let live = seen.holder.is_some() || (seen.released && listed.contains(&count));
    if count == shards || !live {
        return None;
    }
    let until = seen.expires(fallback);
    Some(if seen.holder.is_none() && count > shards {
        crate::record::later(until, retry)
    } else {
        until
    })
}

/// This replica's part of an assignment.
#[derive(Default)]
struct Duty {
    /// The shards assigned to it.
    assigned: BTreeSet<u16>,
    /// The shards whose owner it watches over, evicting the owner when they
    /// show it gone: shard → owner. Its backups (the shards it would own if
    /// their owner left, so that it takes them a lease duration after their
    /// last renewal), and the shards of the next member on the roster (by
    /// identity, around): every member is watched over by the one before
    /// it, so that members gone together (each the other's backup) are
    /// evicted too, one after the other.
    watch_over: BTreeMap<u16, String>,
}

impl Duty {
    fn of(assignment: &Assignment, members: &BTreeSet<String>, me: &str) -> Self {
        let mut watch_over = assignment.backups(me);
        let next = members
            .range::<str, _>((std::ops::Bound::Excluded(me), std::ops::Bound::Unbounded))
            .next()
            .or_else(|| members.first())
            .filter(|n| *n != me);
        if let Some(next) = next {
            for s in assignment.of(next) {
                watch_over.insert(s, next.clone());
            }
        }
        Duty {
            assigned: assignment.of(me),
            watch_over,
        }
    }
}

/// Evictions: when each backed-up shard was first seen held by nobody
/// (free, expired or absent) while assigned to its owner, the members
/// evicted lately, and the departed members' entries deleted lately.
#[derive(Default)]
struct Evictions {
    /// Shard → (its owner then, since when it was seen held by nobody).
    /// Kept across roster changes while this replica watches over the shard
    /// for the same owner: only a new owner gets two lease durations anew,
    /// so that members joining and leaving faster than that do not keep a
    /// dead owner's shards free for ever.
    unowned_since: BTreeMap<u16, (String, Instant)>,
    tried: BTreeMap<String, Instant>,
    /// Departed members' roster entries whose delete was sent lately.
    deleted: BTreeMap<String, Instant>,
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
        // The API server's election would pick each shard's holder itself,
        // against the balancer's assignment.
        #[cfg(feature = "coordinated")]
        if config.lease.extras.coordinated.is_some() {
            return Err(ConfigError::InvalidCoordinated {
                field: "coordinated",
                value: config.lease.name.clone(),
                rule: "elected shards cannot use Coordinated Leader Election: the API server would pick each \
                       shard's holder, against the balancer's assignment",
            });
        }
        let shards = (0..config.shards)
            .map(|s| LeaderElector::new(client.clone(), config.shard_lease(s)))
            .collect::<Result<Vec<_>, _>>()?;
        let member = config.member_lease();
        member.validate()?;
        Ok(ShardedElector {
            inner: Arc::new(Inner {
                config,
                client,
                shards,
                member,
                state: Mutex::new(State::default()),
                held_tx: watch::Sender::new(BTreeSet::new()),
                shut_down: watch::Sender::new(false),
                wake: Notify::new(),
                rebalances: std::sync::atomic::AtomicU64::new(0),
                delete_forbidden: std::sync::atomic::AtomicBool::new(false),
                unseen: Mutex::new(BTreeMap::new()),
                relist: std::sync::atomic::AtomicBool::new(false),
                written: Mutex::new(Vec::new()),
                #[cfg(feature = "metrics")]
                metrics: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Records every shard's election metrics into `metrics` (see
    /// [`LeaseMetrics`](crate::metrics::LeaseMetrics)): one series per shard
    /// Lease, so that the shards a replica holds are the sum of
    /// `leader_election_is_leader` over its shard Leases
    /// (`<base>-s<S>-shard-<NN>`); and the election's own two, labelled by
    /// its base name: `leader_election_shards_held` and
    /// `leader_election_shard_rebalances_total` (shards handed over to
    /// balance the shares).
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn with_metrics(self, metrics: &crate::metrics::LeaseMetrics) -> Self {
        for elector in &self.inner.shards {
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
    /// (graceful releases because the assignment gave them to another
    /// member; shards lost or given up at shutdown do not count).
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

    /// Takes part in the election until [`shutdown`](Self::shutdown): joins
    /// the roster, watches it, the shards this replica owns or backs up and
    /// the shard Leases of other shard counts, campaigns for its shards
    /// (once no other count's are held: see [`ShardConfig::new`]), hands the
    /// others over, and evicts members whose shards show they are gone.
    pub async fn run(&self) {
        self.balance().instrument(self.inner.config.span()).await;
    }

    /// [`run`](Self::run), in the election's span.
    async fn balance(&self) {
        let inner = &self.inner;
        let cfg = &inner.config.lease;
        let me = cfg.identity.clone();
        // However it ends (shutdown, the future dropped with its controller's
        // stream), no shard stays held by a replica that no longer takes
        // part: its guards go, so each shard is released once its work
        // stopped, and campaigns stop; and it leaves the roster.
        let _leave = Leave(self);
        if !cfg.enabled {
            self.run_unelected().await;
            return;
        }
        let api: Api<Lease> = Api::namespaced(inner.client.clone(), &cfg.namespace);
        if !self.join_until_done(&api).await {
            return;
        }
        let wire: Api<Wire> = Api::namespaced(inner.client.clone(), &cfg.namespace);
        let mut roster_events = watch_leases(&wire, &inner.config.roster_selector());
        let mut shard_events: Events = futures::stream::pending().boxed();
        // The shard Leases of other counts: none but during a rolling update
        // of the count (and the old count's, free, after one), so free.
        let mut foreign_events = watch_leases(&wire, &inner.config.foreign_selector());
        // Waiting for the shards of another count to be released or expire.
        let mut waiting = false;
        let mut view = View::default();
        let mut members = BTreeSet::new();
        let mut members_since = Instant::now();
        let mut duty = Duty::default();
        let mut selected: BTreeSet<u16> = BTreeSet::new();
        let mut evictions = Evictions::default();
        let mut tick = tokio::time::interval(cfg.retry_period);
        let member_key = |lease: &Lease| lease.metadata.name.clone();
        let shard_key = |lease: &Lease| inner.config.shard_of_lease(lease);
        // The next instant an eviction may be due (a backed-up shard's record
        // expiring), so that it is judged then, not at the next tick.
        let mut due: Option<Instant> = None;
        let far = crate::record::later(Instant::now(), crate::config::MAX_DURATION);
        let mut lag = Lag::new(cfg.retry_period);
        loop {
            futures::select_biased! {
                event = roster_events.next().fuse() => {
                    if let Some(Ok(event)) = event {
                        view.roster.event(event, member_key, Instant::now());
                    }
                }
                event = shard_events.next().fuse() => {
                    if let Some(Ok(event)) = event {
                        lag.take(&mut view.shards, event, shard_key);
                    }
                }
                event = foreign_events.next().fuse() => {
                    if let Some(Ok(event)) = event {
                        view.foreign.event(event, member_key, Instant::now());
                    }
                }
                () = inner.wake.notified().fuse() => {}
                _ = tick.tick().fuse() => self.read_shards(&wire, &lag, &selected, &mut view).await,
                () = tokio::time::sleep_until(due.unwrap_or(far)).fuse() => {}
            }
            if inner.state.lock().shutdown {
                return;
            }
            self.relisted(&wire, &mut roster_events, &mut members, &mut selected, &mut view);
            // Nothing before the roster has been listed once: an assignment
            // computed from part of it (the watch's first event comes before
            // its list) gives this replica the shards of the members not yet
            // seen, and a campaign for a shard free mid-handover may take it,
            // to hand it over again a lease duration later. Nor before the
            // other counts' shard Leases have been listed (and those that
            // stopped changing here read): a new count would take its shards
            // while those of the old count are held.
            if !view.roster.synced()
                || !view.foreign.synced()
                || !self.confirm_lapsed(&wire, &mut view, &mut foreign_events).await
            {
                continue;
            }
            let now = Instant::now();
            // Evicted (or the entry lost): join again, or the others never
            // count this replica again.
            if view.entry_of(&me).is_none() {
                self.join_again(&api);
            }
            let mut live = view.members(inner.config.shards);
            live.insert(me.clone());
            if live != members {
                debug!(members = ?live, "the roster changed");
                members.clone_from(&live);
                members_since = now;
                let assignment = Assignment::new(&members, inner.config.shards);
                duty = Duty::of(&assignment, &members, &me);
                // An unowned shard's clock runs on while this replica still
                // watches over it for the same owner; a shard moved to
                // another owner (or no longer watched here) starts anew.
                evictions
                    .unowned_since
                    .retain(|s, (owner, _)| duty.watch_over.get(s) == Some(&*owner));
                let watch: BTreeSet<u16> = duty
                    .assigned
                    .iter()
                    .chain(duty.watch_over.keys())
                    .copied()
                    .collect();
                if watch != selected {
                    selected = watch;
                    view.shards.reselect(|s| selected.contains(s));
                    shard_events = if selected.is_empty() {
                        futures::stream::pending().boxed()
                    } else {
                        watch_leases(&wire, &inner.config.shards_selector(&selected))
                    };
                }
            }
            let stable = now.saturating_duration_since(members_since) >= cfg.retry_period;
            due = self.step(&api, &view, &duty, stable, &mut evictions, &mut waiting, now);
            let collect = self.collect_departed(&api, &view, &members, &mut evictions, now);
            let overdue = self.stop_overdue(now);
            due = [due, collect, overdue].into_iter().flatten().min();
        }
    }

    /// Reads each shard Lease of another count that kept this replica out
    /// and now lets it in because its record stopped changing on the watch
    /// ([`View::lapsed_foreign`]), once per version: a watch that stalled
    /// (open, silent) shows the other count's renewals as a dead replica's
    /// record, and this count would take its shards beside theirs. A read
    /// showing the version the watch showed confirms it
    /// (`View::confirmed`); one showing another (or the Lease gone) is what
    /// the watch missed: taken into the view (its clock starts again),
    /// warned, and the watch (`events`) started again. `false` while a read
    /// fails or the reads take longer than the renew deadline (those done
    /// are kept): the balancer's step waits meanwhile.
    async fn confirm_lapsed(&self, wire: &Api<Wire>, view: &mut View, events: &mut Events) -> bool {
        let cfg = &self.inner.config.lease;
        let lapsed = view.lapsed_foreign(
            self.inner.config.shards,
            cfg.lease_duration,
            cfg.retry_period,
            Instant::now(),
        );
        view.confirmed
            .retain(|name, _| lapsed.iter().any(|(n, _)| n == name));
        let mut missed = false;
        // Every read of this turn within one renew deadline: the balancer
        // waits for them.
        let deadline = Instant::now() + cfg.renew_deadline;
        for (name, version) in lapsed {
            if view.confirmed.get(&name) == Some(&version) {
                continue;
            }
            // (Not kube's `get_opt`: a 404 that names no Lease, or a `200`
            // that is not the Lease, made the old count's Lease gone.)
            let left = deadline.saturating_duration_since(Instant::now());
            let read = match crate::lease_observer::read(wire, &name, left).await {
                Ok(read) => read.map(|Wire(l)| l),
                Err(e) => {
                    debug!(lease = %name, error = %Chain(&e), "reading a shard Lease of another shard count failed");
                    return false;
                }
            };
            let now = Instant::now();
            match read {
                Some(lease) if lease.metadata.resource_version == version => {
                    view.confirmed.insert(name, version);
                }
                Some(lease) => {
                    missed = true;
                    view.foreign
                        .event(watcher::Event::Apply(lease), |l| l.metadata.name.clone(), now);
                }
                None => {
                    missed = true;
                    let mut gone = Lease::default();
                    gone.metadata.name = Some(name);
                    view.foreign
                        .event(watcher::Event::Delete(gone), |l| l.metadata.name.clone(), now);
                }
            }
        }
        if missed {
            warn!(
                "the watch of the other shard counts' Leases did not show changes a read shows: it may be stalled \
                 or lagging; watching them anew"
            );
            *events = watch_leases(wire, &self.inner.config.foreign_selector());
        }
        true
    }

    /// While the shard watch lags ([`Lag`]), at every tick (a retry
    /// period): reads the shard Leases `selected` into the view, as a watch
    /// would show them, what the balancer judges them by meanwhile. A read
    /// that fails or takes longer than the renew deadline changes nothing.
    async fn read_shards(&self, wire: &Api<Wire>, lag: &Lag, selected: &BTreeSet<u16>, view: &mut View) {
        if !lag.lagging || selected.is_empty() {
            return;
        }
        let selector = self.inner.config.shards_selector(selected);
        let params = kube_client::api::ListParams::default().labels(&selector);
        let read = tokio::time::timeout(self.inner.config.lease.renew_deadline, wire.list(&params)).await;
        let Ok(Ok(list)) = read else {
            debug!("reading the shard Leases failed or timed out");
            return;
        };
        let now = Instant::now();
        let key = |l: &Lease| self.inner.config.shard_of_lease(l);
        let read: Vec<Lease> = list.items.into_iter().map(|Wire(l)| l).collect();
        let gone: Vec<Lease> = view
            .shards
            .iter()
            .filter(|(s, _)| !read.iter().any(|l| key(l).as_ref() == Some(*s)))
            .map(|(_, w)| w.lease.clone())
            .collect();
        for lease in read {
            view.shards.event(watcher::Event::Apply(lease), key, now);
        }
        for lease in gone {
            view.shards.event(watcher::Event::Delete(lease), key, now);
        }
    }

    /// One step of the balancer once the roster is listed: unless replicas
    /// of another shard count keep this replica out
    /// ([`yields_to`](Self::yields_to)), campaign for its shards, hand the
    /// others over, and evict the members its shards show gone. Returns
    /// when the next step may be due (an eviction, or another count's Lease
    /// expiring).
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        api: &Api<Lease>,
        view: &View,
        duty: &Duty,
        stable: bool,
        evictions: &mut Evictions,
        waiting: &mut bool,
        now: Instant,
    ) -> Option<Instant> {
        let cfg = &self.inner.config.lease;
        let foreign = view.foreign(
            self.inner.config.shards,
            cfg.lease_duration,
            cfg.retry_period,
            now,
        );
        let due = if self.yields_to(&foreign, waiting) {
            // No campaign; evictions wait too (this count's shards are free
            // on purpose): their clocks start again afterwards.
            self.rebalance(view, &BTreeSet::new(), false, now);
            evictions.unowned_since.clear();
            None
        } else {
            self.rebalance(view, &duty.assigned, stable, now);
            if foreign.active.is_empty() {
                (view.roster.synced() && view.shards.synced())
                    .then(|| self.evict_if_due(api, view, &duty.watch_over, evictions, now))
                    .flatten()
            } else {
                // (Both counts started at once: this count's peers may
                // wait, their shards free meanwhile.)
                evictions.unowned_since.clear();
                None
            }
        };
        [due, foreign.until].into_iter().flatten().min()
    }

    /// Whether this replica must stay out of the election now because
    /// replicas of another shard count run (a rolling update of the count):
    /// while a shard Lease of another count is held, or was released while
    /// watched, with a record that changed within its lease duration, a
    /// replica holding no shard takes none (the other count's work may go
    /// on: its replicas release a shard only once its work has ended), and
    /// a replica holding shards while a Lease of a higher count is held
    /// (both counts started at once, with nothing held) gives them up, with
    /// the reconcile grace, as on a handover. A replica holding shards keeps
    /// them against a lower count, whose replicas give theirs up. `waiting`:
    /// whether it was already waiting (said once, when it starts).
    fn yields_to(&self, foreign: &Foreign, waiting: &mut bool) -> bool {
        let shards = self.inner.config.shards;
        // Holding a shard, or campaigning for one (both counts started at
        // once: a campaign of the higher count goes on).
        let holds = {
            let state = self.inner.state.lock();
            state.held.values().any(|(g, _)| g.is_valid())
                || state.acquiring.values().any(|t| !t.is_finished())
        };
        let outranked = foreign.held.is_some_and(|count| count > shards);
        let yields = if holds {
            outranked
        } else {
            !foreign.active.is_empty()
        };
        if yields && holds {
            warn!(
                shards,
                other = ?foreign.held,
                "holds shards while shard Leases of a higher shard count are held (replicas of both counts \
                 started at once): giving every shard up, its work ending within the reconcile grace"
            );
            let until = crate::record::later(Instant::now(), self.inner.config.grace());
            self.give_up_all(Some(until));
        }
        if yields && !*waiting {
            info!(
                shards,
                others = ?foreign.active,
                "waiting for the shard Leases of another shard count to be released or to expire \
                 (a rolling update of the shard count) before taking any shard"
            );
        } else if !yields && *waiting {
            info!(
                shards,
                "no shard Lease of another shard count is held any more: taking this count's shards"
            );
        }
        *waiting = yields;
        yields
    }

    /// The election switched off ([`LeaseConfig::enabled`]`(false)`): this
    /// replica is the only one, and holds every shard (each shard elector
    /// leads without a Lease) until shutdown, with no roster and no API
    /// call.
    async fn run_unelected(&self) {
        let inner = &self.inner;
        info!(
            "sharded election disabled: holding every shard, without leases or the roster (no API call is made)"
        );
        for (s, elector) in (0..inner.config.shards).zip(&inner.shards) {
            let Ok(guard) = elector.acquire().await else {
                return; // shut down
            };
            inner.state.lock().held.insert(s, (guard, Instant::now()));
        }
        self.publish();
        loop {
            let notified = inner.wake.notified();
            if inner.state.lock().shutdown {
                return;
            }
            notified.await;
        }
    }

    /// Joins the roster, retrying every retry period until it is done or
    /// shutdown begins (`false`). Each attempt runs as `State::joining`, as a
    /// join again does: a `leave` from then on (a shutdown, or this future
    /// dropped) waits for the write before it reads the entry, so that an
    /// entry written as the replica stops is not left behind.
    async fn join_until_done(&self, api: &Api<Lease>) -> bool {
        let inner = &self.inner;
        let cfg = &inner.member;
        loop {
            let (tx, rx) = tokio::sync::oneshot::channel();
            {
                let mut state = inner.state.lock();
                if state.shutdown {
                    return false;
                }
                let (this, api) = (self.clone(), api.clone());
                state.joining = Some(spawn_in_span(async move {
                    let cfg = &this.inner.member;
                    let joined = tokio::time::timeout(cfg.renew_deadline, roster::join(&api, cfg)).await;
                    let _ = tx.send(joined);
                }));
            }
            match rx.await {
                Ok(Ok(Ok(()))) => {
                    info!(lease = %cfg.name, "joined the sharded election");
                    return true;
                }
                Ok(Ok(Err(e))) => {
                    warn!(lease = %cfg.name, error = %Chain(&e), "could not join the sharded election; trying again");
                }
                Ok(Err(_)) => {
                    warn!(lease = %cfg.name, "joining the sharded election timed out; trying again");
                }
                Err(_) => {
                    warn!(lease = %cfg.name, "joining the sharded election was cut short; trying again");
                }
            }
            tokio::time::sleep(cfg.retry_period).await;
        }
    }

    /// Joins the roster again in the background (one write at a time).
    fn join_again(&self, api: &Api<Lease>) {
        let mut state = self.inner.state.lock();
        let busy = state.joining.as_ref().is_some_and(|task| !task.is_finished());
        if busy || state.shutdown {
            return;
        }
        info!(lease = %self.inner.member.name, "this replica is not on the roster (evicted by a peer, or its entry was lost): joining again");
        let (this, api) = (self.clone(), api.clone());
        // Stored under the same lock as the check: a `leave` from then on
        // finds it and waits for it, so that the write cannot land after
        // the leave's read (leaving behind an entry whose member no longer
        // takes part).
        state.joining = Some(spawn_in_span(async move {
            let cfg = &this.inner.member;
            match tokio::time::timeout(cfg.renew_deadline, roster::join(&api, cfg)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(lease = %cfg.name, error = %Chain(&e), "could not join the sharded election again");
                }
                Err(_) => warn!(lease = %cfg.name, "joining the sharded election again timed out"),
            }
        }));
    }

    /// Evicts the members whose shards this replica watches over and shows
    /// gone: a shard held by its owner whose record has not changed for its
    /// lease duration (the owner stopped renewing: dead, frozen or cut
    /// off), or a shard held by nobody for two lease durations (its owner
    /// never took it): this replica's, or the one on the shard's record if
    /// longer (a record left by a dead member of another build, with longer
    /// timings, in a rolling update: an owner that first sees it must wait
    /// that long before it may take it). The shard's Lease is read again
    /// first: a record that changed since this watch saw it (the watch
    /// lagging) evicts nobody. Returns when the next eviction may be due.
    fn evict_if_due(
        &self,
        api: &Api<Lease>,
        view: &View,
        watch_over: &BTreeMap<u16, String>,
        evictions: &mut Evictions,
        now: Instant,
    ) -> Option<Instant> {
        let mut due: Option<Instant> = None;
        let mut at = |t: Instant| due = Some(due.map_or(t, |d| d.min(t)));
        let cfg = &self.inner.config.lease;
        evictions
            .tried
            .retain(|_, at| now.saturating_duration_since(*at) < cfg.lease_duration);
        for (&shard, owner) in watch_over {
            let seen = view.shards.get(&shard);
            if let Some(w) = seen.filter(|w| w.held_fresh(cfg.lease_duration, now)) {
                evictions.unowned_since.remove(&shard);
                if w.holder.as_deref() == Some(owner.as_str()) {
                    at(w.expires(cfg.lease_duration));
                }
                continue;
            }
            let since = match evictions.unowned_since.get(&shard) {
                Some((o, since)) if o == owner => *since,
                _ => {
                    evictions.unowned_since.insert(shard, (owner.clone(), now));
                    now
                }
            };
            let expired = seen.is_some_and(|w| w.holder.as_deref() == Some(owner.as_str()));
            // Two lease durations: ours, or the record's if longer (held by
            // someone else, it is taken only once it has been seen unchanged
            // for its duration, counted from the owner's first sight).
            let record = seen.map_or(cfg.lease_duration, |w| w.duration(cfg.lease_duration));
            let unowned_for = cfg.lease_duration.max(record).saturating_mul(2);
            if !expired && now.saturating_duration_since(since) < unowned_for {
                at(crate::record::later(since, unowned_for));
                continue;
            }
            if evictions.tried.contains_key(owner) {
                continue;
            }
            let Some(entry) = view.entry_of(owner) else {
                continue;
            };
            evictions.tried.insert(owner.clone(), now);
            let why = if expired {
                "its shard's record has not changed for a lease duration"
            } else {
                "its shard has been held by nobody for two lease durations"
            };
            let shard_name = self.inner.shards[usize::from(shard)].config().name.clone();
            let seen_version = seen.and_then(|w| w.lease.metadata.resource_version.clone());
            let namespace = cfg.namespace.clone();
            let (api, entry, owner, timeout, fallback) = (
                api.clone(),
                entry.lease.clone(),
                owner.clone(),
                cfg.renew_deadline,
                cfg.lease_duration,
            );
            let this = self.clone();
            spawn_in_span(async move {
                let evict = async {
                    // Confirm: has the shard's record changed since (its owner,
                    // or someone, renewing or taking it)? Then the watch lagged.
                    // (Not kube's `get_opt`: a 404 that names no Lease, or a
                    // `200` that is not the Lease, evicted a live owner.)
                    let wire = Api::<Wire>::namespaced(api.clone().into_client(), &namespace);
                    let current = crate::lease_observer::read(&wire, &shard_name, timeout).await?;
                    let current = current.map(|Wire(l)| l);
                    let held = current
                        .as_ref()
                        .and_then(|l| l.spec.as_ref())
                        .is_some_and(|spec| crate::record::holder(spec).is_some());
                    let current = current.filter(|_| held);
                    let moved = this.moved_since(shard, current.as_ref(), seen_version.as_ref(), fallback);
                    if moved {
                        debug!(member = %owner, shard, "not evicted: its shard's record changed since it was seen");
                        return Ok(roster::Wrote::Changed);
                    }
                    let cleared = roster::clear_to(&api, &entry).await.map(|w| this.evicted(w));
                    if matches!(cleared, Ok(roster::Wrote::Changed)) {
                        // The entry changed since the roster watch showed it
                        // (the member left or joined again, or a peer evicted
                        // it): a watch still showing it after its lease
                        // duration may be stalled, and the assignment it
                        // feeds gives shards to a member that no longer
                        // takes them.
                        this.relist(&format!(
                            "the roster entry of {owner} changed since the roster watch showed it"
                        ));
                    }
                    cleared
                };
                match tokio::time::timeout(timeout, evict).await {
                    Ok(Ok(roster::Wrote::Done)) => {
                        info!(member = %owner, shard, reason = why, "evicted the member from the roster");
                    }
                    Ok(Ok(roster::Wrote::Changed)) => {}
                    Ok(Err(e)) => {
                        warn!(member = %owner, shard, error = %Chain(&e), "could not evict the member");
                    }
                    Err(_) => warn!(member = %owner, shard, "evicting the member timed out"),
                }
            });
        }
        due
    }

    /// Whether the shard's Lease `current` (as read, held; `None`: free or
    /// gone) shows that its holder renews, for an eviction judged on the
    /// watch's record `seen_version`. Held, and the watch does not show it
    /// (its labels edited by someone else), or shows an older record (the
    /// watch stalled or lags: the record changed since, or it would not
    /// look expired), it is judged by these reads, as a watch would judge
    /// it: the record read unchanged for its lease duration evicts its
    /// holder; and a watch behind is started again.
    fn moved_since(
        &self,
        shard: u16,
        current: Option<&Lease>,
        seen_version: Option<&String>,
        fallback: Duration,
    ) -> bool {
        let Some(l) = current.filter(|l| l.metadata.resource_version.as_ref() != seen_version) else {
            return false;
        };
        if seen_version.is_some() {
            self.relist(&format!(
                "the shard watch did not show a change of shard {shard} a read shows"
            ));
        }
        let rv = l.metadata.resource_version.clone();
        let d = l
            .spec
            .as_ref()
            .map_or(fallback, |spec| crate::record::lease_duration(spec, fallback));
        let now = Instant::now();
        let mut unseen = self.inner.unseen.lock();
        match unseen.get(&shard) {
            Some((v, at)) if *v == rv => now.saturating_duration_since(*at) < d,
            _ => {
                unseen.insert(shard, (rv, now));
                true
            }
        }
    }

    /// Takes the roster entries this replica's evictions wrote into the
    /// view ([`evicted`](Self::evicted)); starts the roster watch again
    /// (`roster_events`) if asked to (see [`relist`](Self::relist)), and
    /// then forgets the members counted and the shards selected, so that
    /// `run` selects the shards anew, with a watch of its own.
    fn relisted(
        &self,
        wire: &Api<Wire>,
        roster_events: &mut Events,
        members: &mut BTreeSet<String>,
        selected: &mut BTreeSet<u16>,
        view: &mut View,
    ) {
        for entry in std::mem::take(&mut *self.inner.written.lock()) {
            view.roster.event(
                watcher::Event::Apply(entry),
                |l| l.metadata.name.clone(),
                Instant::now(),
            );
        }
        if self
            .inner
            .relist
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            *roster_events = watch_leases(wire, &self.inner.config.roster_selector());
            members.clear();
            selected.clear();
        }
    }

    /// An eviction's write answered (`written`: the entry as written;
    /// `None`: it changed since it was read): the entry is taken into the
    /// view at the balancer's next turn, so that the evicted member's shards
    /// are reassigned without waiting for the roster watch, which may lag.
    fn evicted(&self, written: Option<Lease>) -> roster::Wrote {
        let Some(entry) = written else {
            return roster::Wrote::Changed;
        };
        self.inner.written.lock().push(entry);
        self.inner.wake.notify_one();
        roster::Wrote::Done
    }

    /// Has the balancer start its roster and shard watches again (`run`, at
    /// its next turn: every roster member counted anew, the shards selected
    /// anew): a read or a write showed what they did not (`what`), so they
    /// may be stalled (open and silent) or lagging. Warned.
    fn relist(&self, what: &str) {
        warn!("{what}: the watch may be stalled or lagging; watching the roster and the shards anew");
        self.inner
            .relist
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.inner.wake.notify_one();
    }

    /// Deletes the roster entries of departed members: an entry held by
    /// nobody (its member left, or was evicted) whose record this replica
    /// has seen unchanged for the election's lease duration, if this
    /// replica is the member chosen to delete it ([`assign::collector`]),
    /// or for three lease durations, by any member (the chosen one may be
    /// gone too). Each delete names the record judged (its uid and
    /// resourceVersion as preconditions): an entry written since (its member
    /// joined again) is left alone. Returns when the next may be due.
    fn collect_departed(
        &self,
        api: &Api<Lease>,
        view: &View,
        members: &BTreeSet<String>,
        evictions: &mut Evictions,
        now: Instant,
    ) -> Option<Instant> {
        let cfg = &self.inner.config.lease;
        let mut due: Option<Instant> = None;
        evictions
            .deleted
            .retain(|_, at| now.saturating_duration_since(*at) < cfg.lease_duration);
        for (name, seen) in view.roster.iter() {
            if seen.holder.is_some()
                || *name == self.inner.member.name
                || evictions.deleted.contains_key(name)
            {
                continue;
            }
            let chosen = assign::collector(members, name) == Some(&cfg.identity);
            let after = if chosen {
                cfg.lease_duration
            } else {
                cfg.lease_duration.saturating_mul(3)
            };
            let at = crate::record::later(seen.changed, after);
            if now < at {
                due = Some(due.map_or(at, |d| d.min(at)));
                continue;
            }
            evictions.deleted.insert(name.clone(), now);
            let (api, entry, timeout) = (api.clone(), seen.lease.clone(), cfg.renew_deadline);
            let this = self.clone();
            let name = name.clone();
            spawn_in_span(async move {
                match tokio::time::timeout(timeout, roster::delete(&api, &entry)).await {
                    Ok(Ok(roster::Wrote::Done)) => {
                        info!(lease = %name, "deleted a departed member's roster entry");
                        // A refusal after this is another outage: warned again.
                        this.inner
                            .delete_forbidden
                            .store(false, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(Ok(roster::Wrote::Changed)) => {
                        debug!(lease = %name, "not deleted: the roster entry changed since it was seen, or is gone");
                    }
                    // Admission's 403 (a webhook, a policy) is no RBAC matter:
                    // warned with its message below.
                    Ok(Err(e)) if crate::error::refused_by_rbac(&e) => {
                        let first = !this
                            .inner
                            .delete_forbidden
                            .swap(true, std::sync::atomic::Ordering::Relaxed);
                        if first {
                            warn!(lease = %name, "could not delete a departed member's roster entry: forbidden (RBAC needs `delete` on leases); departed members' entries stay");
                        } else {
                            debug!(lease = %name, "could not delete a departed member's roster entry: forbidden");
                        }
                    }
                    Ok(Err(e)) => {
                        warn!(lease = %name, error = %Chain(&e), "could not delete a departed member's roster entry");
                    }
                    Err(_) => warn!(lease = %name, "deleting a departed member's roster entry timed out"),
                }
            });
        }
        due
    }

    /// Stops the work of the shards handed over whose reconcile grace has
    /// passed: their terms end (if the work ended in time, the shard was
    /// released already and there is none), the work racing their guards is
    /// dropped, and their Leases are left to expire for the new owners.
    /// Returns when the next grace ends.
    fn stop_overdue(&self, now: Instant) -> Option<Instant> {
        let overdue: Vec<u16> = {
            let mut state = self.inner.state.lock();
            let overdue: Vec<u16> = state
                .handing_over
                .iter()
                .filter(|(_, until)| **until <= now)
                .map(|(s, _)| *s)
                .collect();
            for s in &overdue {
                state.handing_over.remove(s);
            }
            overdue
        };
        for s in overdue {
            if self.inner.shards[usize::from(s)].give_up_term() {
                warn!(
                    shard = s,
                    grace = ?self.inner.config.grace(),
                    "work on the shard handed over still ran at the end of the reconcile grace: stopped; \
                     the shard is not released, its new owner takes it when its lease expires"
                );
            }
        }
        self.inner.state.lock().handing_over.values().min().copied()
    }

    /// One step of the balancer: campaign for the shards assigned here, and
    /// hand the others over.
    fn rebalance(&self, view: &View, assigned: &BTreeSet<u16>, stable: bool, now: Instant) {
        let inner = &self.inner;
        let cfg = &inner.config.lease;
        let mut state = inner.state.lock();
        // Terms that ended (lost, or their deadline passed) are not held.
        state.held.retain(|_, (g, _)| g.is_valid());
        state.acquiring.retain(|_, task| !task.is_finished());
        // Campaigns for shards no longer assigned here stop at once (nothing
        // guarded runs yet).
        let elsewhere: Vec<u16> = state
            .acquiring
            .keys()
            .copied()
            .filter(|s| !assigned.contains(s))
            .collect();
        for s in elsewhere {
            if let Some(task) = state.acquiring.remove(&s) {
                task.abort();
            }
        }
        let mine: BTreeSet<u16> = state.held.keys().chain(state.acquiring.keys()).copied().collect();
        let plan = assign::plan(&cfg.identity, assigned, &mine, stable);
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
                let until = crate::record::later(now, inner.config.grace());
                state.handing_over.insert(s, until);
                self.inner
                    .rebalances
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                #[cfg(feature = "metrics")]
                if let Some((_, counter)) = self.inner.metrics.get() {
                    counter.inc();
                }
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
            let task = spawn_in_span(async move {
                let Ok(guard) = this.inner.shards[usize::from(s)].acquire().await else {
                    return;
                };
                #[cfg(test)]
                tests::hooks::acquired(&this.inner, s);
                // When the term ends (lost, or its deadline passed), the
                // balancer says so at once, not at its next tick.
                let ended = guard.lost_signal();
                {
                    let mut state = this.inner.state.lock();
                    // The campaign was called off since it won: the balancer
                    // gave every shard up (shutdown, or dropped: on a
                    // multi-threaded runtime this task may run on another
                    // thread past its last `.await`, where the abort does not
                    // stop it) or assigned the shard elsewhere. The guard is
                    // not kept (nothing would ever drop it: the shard renewed
                    // with no work for ever): the shard is released at once.
                    if state.shutdown || !state.acquiring.contains_key(&s) {
                        drop(state);
                        debug!(
                            shard = s,
                            "won the shard after its campaign was called off: giving it up"
                        );
                        drop(guard);
                        return;
                    }
                    info!(
                        shard = s,
                        fencing_token = guard.fencing_token(),
                        "holds the shard"
                    );
                    // Handed over and taken back (assigned here again): its
                    // work, if any still runs, may go on. Not before the
                    // campaign won: one called off first (the roster changed
                    // back at once) leaves that work to be stopped at the
                    // end of its grace, or it would keep the shard renewed
                    // here, held by no balancer, for as long as it runs.
                    state.handing_over.remove(&s);
                    state.held.insert(s, (guard, Instant::now()));
                }
                this.publish();
                this.inner.wake.notify_one();
                // (Weakly: the shard's guard lives in `held`, and this task
                // must not keep the election alive once it is dropped.)
                let weak = Arc::downgrade(&this.inner);
                spawn_in_span(async move {
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

    /// The shards held now with a term still valid (what [`publish`](Self::publish)
    /// publishes, read afresh).
    fn owned_now(&self) -> BTreeSet<u16> {
        self.inner
            .state
            .lock()
            .held
            .iter()
            .filter(|(_, (g, _))| g.is_valid())
            .map(|(s, _)| *s)
            .collect()
    }

    fn publish(&self) {
        let held = self.owned_now();
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

    /// Drops every shard held or campaigned for, and says so. With `grace`,
    /// the work still running on the shards held (guards from
    /// [`guard`](Self::guard)) may go on until then, as on a shard handed
    /// over: [`stop_overdue`](Self::stop_overdue) stops it after that.
    fn give_up_all(&self, grace: Option<Instant>) {
        let tasks: Vec<JoinHandle<()>> = {
            let mut state = self.inner.state.lock();
            let held = std::mem::take(&mut state.held);
            if let Some(until) = grace {
                for s in held.into_keys() {
                    state.handing_over.insert(s, until);
                }
            }
            std::mem::take(&mut state.acquiring).into_values().collect()
        };
        for task in tasks {
            task.abort();
        }
        self.publish();
    }

    /// Clears this replica's roster entry, if it still names it (none when
    /// the election is switched off: no roster).
    async fn leave(&self) {
        let cfg = &self.inner.member;
        if !cfg.enabled {
            return;
        }
        let api: Api<Lease> = Api::namespaced(self.inner.client.clone(), &cfg.namespace);
        let joining = self.inner.state.lock().joining.take();
        let left = async {
            // A join in flight first: read after it, the entry it wrote is
            // cleared; read before, it would be left behind.
            if let Some(join) = joining {
                let _ = join.await;
            }
            let Some(lease) = api.get_opt(&cfg.name).await? else {
                return Ok(roster::Wrote::Changed);
            };
            let ours = lease.spec.as_ref().and_then(crate::record::holder) == Some(cfg.identity.as_str());
            if !ours {
                return Ok(roster::Wrote::Changed);
            }
            roster::clear(&api, &lease).await
        };
        match tokio::time::timeout(cfg.release_timeout, left).await {
            Ok(Ok(roster::Wrote::Done)) => info!(lease = %cfg.name, "left the sharded election"),
            Ok(Ok(roster::Wrote::Changed)) => {}
            Ok(Err(e)) => {
                warn!(lease = %cfg.name, error = %Chain(&e), "could not leave the roster: the others evict this replica once its shards are free for two lease durations");
            }
            Err(_) => {
                warn!(lease = %cfg.name, "leaving the roster timed out: the others evict this replica once its shards are free for two lease durations");
            }
        }
    }

    /// Leaves the election: stops the balancer, leaves the roster (the
    /// others' shares grow at once), and gives every shard up (each
    /// released once its guards are dropped, within `grace`), so that the
    /// others take them within a watch event and a write each. A sharded
    /// Controller's stream ends once this returned.
    pub async fn shutdown(&self, grace: Duration) {
        self.shut_down(grace).instrument(self.inner.config.span()).await;
    }

    /// [`shutdown`](Self::shutdown), in the election's span.
    async fn shut_down(&self, grace: Duration) {
        self.inner.state.lock().shutdown = true;
        // (Each shard's elector ends the work left at the end of `grace`.)
        self.give_up_all(None);
        self.inner.wake.notify_one();
        // The roster first: the others' shares grow at once, so that they
        // campaign for these shards while they are being released.
        self.leave().await;
        futures::future::join_all(self.inner.shards.iter().map(|s| s.shutdown(grace))).await;
        self.inner.shut_down.send_replace(true);
    }

    /// Once a [`shutdown`](Self::shutdown) begun returned (at once if none began).
    async fn shut_down_finished(&self) {
        let mut finished = self.inner.shut_down.subscribe();
        if self.inner.state.lock().shutdown {
            let _ = finished.wait_for(|f| *f).await;
        }
    }
}

/// Spawns `task` in the current span (the sharded election's): a spawned
/// task is in none of its spawner's.
fn spawn_in_span<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(task.in_current_span())
}

/// The events of a watch of the Leases `selector` selects.
type Events = BoxStream<'static, Result<watcher::Event<Lease>, watcher::Error>>;

/// A watch of the Leases `selector` selects, with kube-runtime's backoff,
/// read leniently as an elector reads its own ([`Wire`]).
fn watch_leases(api: &Api<Wire>, selector: &str) -> Events {
    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
    watcher(api.clone(), watcher::Config::default().labels(selector))
        .default_backoff()
        .map_ok(|event| match event {
            Apply(Wire(l)) => Apply(l),
            Delete(Wire(l)) => Delete(l),
            InitApply(Wire(l)) => InitApply(l),
            Init => Init,
            InitDone => InitDone,
        })
        .boxed()
}

/// Gives every shard up when [`ShardedElector::run`] ends, however it ends,
/// and leaves the roster (in the background: a drop cannot wait).
struct Leave<'a>(&'a ShardedElector);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        debug!("the sharded election's balancer stopped: giving every shard up");
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.0.give_up_all(None);
            return;
        };
        // Work still running under the shards' guards (from `guard`: the
        // controller's reconciles went with its stream) would keep them
        // renewed by a replica that no longer takes part, for as long as it
        // runs: it gets the reconcile grace, as on a shard handed over, and is
        // stopped then (unless a balancer started again took the shard back).
        let grace = self.0.inner.config.grace();
        self.0
            .give_up_all(Some(crate::record::later(Instant::now(), grace)));
        let this = self.0.clone();
        runtime.spawn(async move { this.leave().await }.in_current_span());
        let this = self.0.clone();
        runtime.spawn(
            async move {
                tokio::time::sleep(grace).await;
                this.stop_overdue(Instant::now());
            }
            .in_current_span(),
        );
    }
}
