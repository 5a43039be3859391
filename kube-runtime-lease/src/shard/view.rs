//! What a replica's three watches show: the roster (every member's entry),
//! the shards it owns or backs up, and the shard Leases of other shard
//! counts, each Lease with the instant its record last changed here (the
//! observed-change clock).

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube_runtime::watcher;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// A Lease of the election as a watch showed it.
pub(super) struct Watched {
    /// Its holder (`None` when free).
    pub(super) holder: Option<String>,
    /// The last object seen.
    pub(super) lease: Lease,
    /// When its record (spec) last changed here: the observed-change clock.
    pub(super) changed: Instant,
    /// The last two versions first seen, as `Observed::firsts` keeps them:
    /// the newest seen again after an older one (a re-list served by a cache
    /// behind: A-B-A) keeps its clock.
    pub(super) firsts: Vec<(String, LeaseSpec, Instant)>,
    /// Held by nobody, and seen held before by this watch (released or
    /// cleared while watched), not merely listed free.
    pub(super) released: bool,
}

impl Watched {
    /// `lease` seen at `now`, after `old` (the same key's last sighting): the
    /// clock restarts only when the record (spec) changed or it is another
    /// object, by the elector's rule (`Observed::update`): the newest version
    /// seen, seen again after an older one (a re-list from a cache behind),
    /// keeps the clock of its first sight.
    fn seen(old: Option<&Watched>, lease: Lease, now: Instant) -> Self {
        let holder = lease
            .spec
            .as_ref()
            .and_then(crate::record::holder)
            .map(str::to_owned);
        let same = old.filter(|o| o.lease.metadata.uid == lease.metadata.uid);
        let released = holder.is_none() && same.is_some_and(|o| o.holder.is_some() || o.released);
        let previous = same.map(|o| crate::record::Observed {
            spec: o.lease.spec.clone().unwrap_or_default(),
            resource_version: o.lease.metadata.resource_version.clone(),
            at: o.changed,
            firsts: o.firsts.clone(),
        });
        let observed = crate::record::Observed::update(
            previous,
            lease.spec.clone().unwrap_or_default(),
            lease.metadata.resource_version.clone(),
            now,
        );
        Watched {
            holder,
            lease,
            changed: observed.at,
            firsts: observed.firsts,
            released,
        }
    }

    fn spec(&self) -> Option<&LeaseSpec> {
        self.lease.spec.as_ref()
    }

    /// Whether its record changed within its own lease duration (`fallback`
    /// when it has none, or one that is not positive, as for any Lease: see
    /// `record::lease_duration`).
    pub(super) fn fresh(&self, fallback: Duration, now: Instant) -> bool {
        now < self.expires(fallback)
    }

    /// When it stops being fresh, unless its record changes.
    pub(super) fn expires(&self, fallback: Duration) -> Instant {
        crate::record::later(self.changed, self.duration(fallback))
    }

    /// The lease duration on its record (`fallback` when it has none, or
    /// one that is not positive).
    pub(super) fn duration(&self, fallback: Duration) -> Duration {
        self.spec()
            .map_or(fallback, |spec| crate::record::lease_duration(spec, fallback))
    }

    /// Whether someone holds it with a record that changed within its lease
    /// duration.
    pub(super) fn held_fresh(&self, fallback: Duration, now: Instant) -> bool {
        self.holder.is_some() && self.fresh(fallback, now)
    }

    /// The shard count its `SHARDS_LABEL` names, if any.
    pub(super) fn shard_count(&self) -> Option<u16> {
        self.lease
            .metadata
            .labels
            .as_ref()?
            .get(super::SHARDS_LABEL)?
            .parse()
            .ok()
    }
}

/// The objects of one watch, by key, kept across its re-lists: an object
/// listed again unchanged keeps its clock; one gone from the new list is
/// dropped.
pub(super) struct Listing<K> {
    objects: BTreeMap<K, Watched>,
    /// Objects of a re-list under way (between `Init` and `InitDone`).
    pending: Option<BTreeMap<K, Watched>>,
    /// Whether a whole list has been seen since the watch (re)started.
    synced: bool,
}

impl<K> Default for Listing<K> {
    fn default() -> Self {
        Listing {
            objects: BTreeMap::new(),
            pending: None,
            synced: false,
        }
    }
}

impl<K: Ord> Listing<K> {
    /// Takes in one event of the watch; `key` names an object (`None`: not
    /// one of ours, ignored).
    pub(super) fn event(
        &mut self,
        event: watcher::Event<Lease>,
        key: impl Fn(&Lease) -> Option<K>,
        now: Instant,
    ) {
        match event {
            watcher::Event::Init => self.pending = Some(BTreeMap::new()),
            watcher::Event::InitApply(lease) => {
                let Some(k) = key(&lease) else { return };
                let old = self.objects.get(&k);
                let seen = Watched::seen(old, lease, now);
                self.pending.get_or_insert_with(BTreeMap::new).insert(k, seen);
            }
            watcher::Event::InitDone => {
                self.objects = self.pending.take().unwrap_or_default();
                self.synced = true;
            }
            watcher::Event::Apply(lease) => {
                let Some(k) = key(&lease) else { return };
                let seen = Watched::seen(self.objects.get(&k), lease, now);
                self.objects.insert(k, seen);
            }
            watcher::Event::Delete(lease) => {
                if let Some(k) = key(&lease) {
                    self.objects.remove(&k);
                }
            }
        }
    }

    /// Whether a whole list has been seen since the watch (re)started.
    pub(super) fn synced(&self) -> bool {
        self.synced
    }

    /// The object under `key`.
    pub(super) fn get(&self, key: &K) -> Option<&Watched> {
        self.objects.get(key)
    }

    /// Every object.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&K, &Watched)> {
        self.objects.iter()
    }

    /// Keeps only the objects `keep` says, and waits for a new list (the
    /// watch is started again with another selection).
    pub(super) fn reselect(&mut self, keep: impl Fn(&K) -> bool) {
        self.objects.retain(|k, _| keep(k));
        self.pending = None;
        self.synced = false;
    }
}

/// Whether the shard watch lags: a renewal it delivers more than `after`
/// (the retry period) after its `renewTime`, by this node's clock, makes
/// it untrusted, as the elector's own watch (`Watch::check_lag`): it shows
/// a dead owner's last renewals as news, and an eviction would wait the lag
/// out on top of the lease duration. Meanwhile the balancer reads the
/// shards it watches every retry period, at client-go's pace, and takes in
/// only what the watch delivers in time. Expiry is still judged on the
/// monotonic clock: a clock ahead of the owners' costs reads, never safety.
pub(super) struct Lag {
    after: Duration,
    /// The last renewal delivered was late.
    pub(super) lagging: bool,
    /// When a lag was last warned: once per ten minutes, then at debug.
    warned_at: Option<Instant>,
}

impl Lag {
    /// Lagging once a renewal comes more than `after` late.
    pub(super) fn new(after: Duration) -> Self {
        Lag {
            after,
            lagging: false,
            warned_at: None,
        }
    }

    /// Takes `event` into `listing` (`key`: the object's key) unless it
    /// comes late: anything while the watch is in time, and a list (the
    /// Leases as they are, not news) always; a renewal, if delivered in time.
    pub(super) fn take<K: Ord>(
        &mut self,
        listing: &mut Listing<K>,
        event: watcher::Event<Lease>,
        key: impl Fn(&Lease) -> Option<K>,
    ) {
        if self.admits(listing, &event, &key) {
            listing.event(event, key, Instant::now());
        }
    }

    fn admits<K: Ord>(
        &mut self,
        listing: &Listing<K>,
        event: &watcher::Event<Lease>,
        key: impl Fn(&Lease) -> Option<K>,
    ) -> bool {
        let renew_time = |l: &Lease| l.spec.as_ref()?.renew_time.as_ref().map(|t| t.0);
        let lease = match event {
            watcher::Event::Apply(lease) => lease,
            watcher::Event::Delete(_) => return !self.lagging,
            _ => return true,
        };
        let renewed = renew_time(lease);
        let before = key(lease)
            .and_then(|k| listing.get(&k))
            .and_then(|w| renew_time(&w.lease));
        let Some(renewed) = renewed.filter(|r| before != Some(*r)) else {
            return !self.lagging;
        };
        let late = Duration::try_from(crate::record::now().duration_since(renewed)).unwrap_or_default();
        let lagging = late > self.after;
        if lagging && !self.lagging {
            if self
                .warned_at
                .is_some_and(|at| at.elapsed() < Duration::from_secs(600))
            {
                debug!(?late, "the shard watch delivered a renewal late again");
            } else {
                self.warned_at = Some(Instant::now());
                warn!(
                    ?late,
                    "the shard watch delivered a renewal late (or this node's clock is ahead of the owner's); \
                     reading the shards every retry period until it delivers in time"
                );
            }
        } else if self.lagging && !lagging {
            info!("the shard watch delivers in time again");
        }
        self.lagging = lagging;
        !lagging
    }
}
