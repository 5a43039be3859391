//! The task's view of the Lease: reads, the watch (kube-runtime's
//! `watch_object`, with the polling fallback when it is unavailable), and
//! what they change.

use std::time::Duration;

use futures::{FutureExt, StreamExt, stream::BoxStream};
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube_runtime::watcher;
use tokio::time::{Instant, sleep_until};
use tracing::{debug, info, warn};

use super::{LeaseView, Task};
use crate::{
    error::Result,
    record::{self, Observed},
};

/// What the watch yields: the Lease as it is now, or `None` once it is gone
/// (kube-runtime's `watch_object`, of the Lease's own events:
/// `lease_observer::watch`).
pub(in crate::elector) type WatchItem = watcher::Result<Option<Lease>>;
pub(in crate::elector) type WatchStream = BoxStream<'static, WatchItem>;

/// What one watch item means for the election: `Some` with what it
/// delivered, or `None` when the watch failed or ended (its view may be
/// behind).
pub(in crate::elector) type Step = Option<Delivered>;

/// What the watch delivered.
#[derive(Debug, PartialEq)]
pub(in crate::elector) struct Delivered {
    /// The Lease as it is now (`None`: gone).
    pub(in crate::elector) lease: Option<Lease>,
    /// The watch is in sync now and was not before.
    pub(in crate::elector) news: bool,
}

/// The Lease watch: its stream, how far it got, and when it was heard from;
/// one step per item ([`Watch::step`]).
pub(in crate::elector) struct Watch {
    /// The open watch; `None` when not asked for (`LeaseConfig::watch(false)`)
    /// or once it ended: the task polls.
    stream: Option<WatchStream>,
    sync: Sync,
    /// When the watch last delivered the Lease's state.
    heard: Instant,
    /// The resourceVersion it last delivered (`None`: the Lease gone, or
    /// nothing yet).
    version: Option<String>,
    /// What reads after a silence showed since the watch last delivered.
    silence: Silence,
    /// A record delivered more than this after its `renewTime` (the retry
    /// period) was delivered late.
    late_after: Duration,
    /// The last record was delivered late: a watch that lags (or a clock
    /// ahead of the holder's) is not trusted, and reads decide meanwhile.
    lagging: bool,
    /// The `renewTime` of the last record delivered (`None`: none, or the
    /// Lease gone): only a renewal the watch had not delivered yet tells
    /// how late it delivers.
    renewed: Option<Timestamp>,
    /// When a late delivery was last warned: a lateness that hovers around
    /// the retry period (write latencies, a clock offset close to it) is
    /// warned once per [`LAG_WARN_EVERY`], then told at debug.
    lag_warned_at: Option<Instant>,
    /// The lateness in force was warned: its end is told at info.
    lag_warned: bool,
    /// A version a read showed before the watch delivered it, and when: the
    /// watch delivering it more than `late_after` later lags by this node's
    /// monotonic clock, which no holder's clock ahead can hide.
    read_ahead: Option<(u64, Instant)>,
    /// How late the watch delivered a version a read had showed, if more
    /// than `late_after` and no read found it up to date since.
    behind: Option<Duration>,
}

/// How often a watch that keeps turning late again is warned of it.
const LAG_WARN_EVERY: Duration = Duration::from_secs(600);

/// What reads after a silence of a watch showed since it last delivered (the
/// election's watch and [`LeaseObserver`](crate::LeaseObserver)'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Silence {
    /// Nothing: the Lease as the watch delivered it last.
    Heard,
    /// One read showed a change the watch had not delivered. Alone it is no
    /// stall: among many candidates, the read before a takeover often comes
    /// just after another candidate's winning write, which the watch is
    /// about to deliver.
    Suspected,
    /// Another read showed one too: the watch is taken as stalled.
    Warned,
}

impl Silence {
    /// A read showed a change the watch had not delivered: `None` at the
    /// first in a row, then `Some(true)` once (a stall, to warn), then
    /// `Some(false)` until the watch delivers again.
    pub(crate) fn changed(&mut self) -> Option<bool> {
        let next = if *self == Silence::Heard {
            Silence::Suspected
        } else {
            Silence::Warned
        };
        let was = std::mem::replace(self, next);
        (was != Silence::Heard).then_some(was == Silence::Suspected)
    }

    /// The watch delivered: whether a stall had been warned.
    pub(crate) fn heard(&mut self) -> bool {
        std::mem::replace(self, Silence::Heard) == Silence::Warned
    }
}

/// How far an open watch got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::elector) enum Sync {
    /// Opened, nothing delivered yet.
    Listing,
    /// It delivered the Lease's state, and has not failed since.
    Synced,
    /// It failed since (the watcher retries with its backoff), warned once.
    Failing,
}

impl Watch {
    /// A watch on `stream` (`None`: no watch), nothing delivered yet,
    /// trusted only while it delivers records within `late_after` of their
    /// `renewTime`.
    pub(in crate::elector) fn new(stream: Option<WatchStream>, late_after: Duration) -> Self {
        Watch {
            stream,
            sync: Sync::Listing,
            heard: Instant::now(),
            version: None,
            silence: Silence::Heard,
            late_after,
            lagging: false,
            renewed: None,
            lag_warned_at: None,
            lag_warned: false,
            read_ahead: None,
            behind: None,
        }
    }

    /// After a read made because the watch in sync was silent for `silence`
    /// or more: warns, once until it delivers again, when the Lease read
    /// (`read`: its resourceVersion, `None` when gone) is not the one the
    /// watch delivered last, at two such reads in a row: a watch that misses
    /// changes is stalled (a dead connection that neither ends nor fails),
    /// and only reads keep the view fresh meanwhile. One such read is only
    /// suspected ([`Silence::Suspected`]).
    pub(in crate::elector) fn check_silence(&mut self, read: Option<&str>, silence: Duration) {
        let silent_for = self.heard.elapsed();
        if self.sync == Sync::Synced
            && silent_for >= silence
            && read != self.version.as_deref()
            && self.silence.changed() == Some(true)
        {
            warn!(
                ?silent_for,
                "lease watch delivered nothing while the Lease changed: it may be stalled; \
                 reading before every attempt until it delivers again"
            );
        }
    }

    /// Whether the watch delivered the Lease's state, has not failed since,
    /// was heard from within `silence`, its last record was not late, and it
    /// is not behind a read by more than `late_after`.
    pub(in crate::elector) fn trusted(&self, silence: Duration) -> bool {
        self.sync == Sync::Synced
            && self.heard.elapsed() < silence
            && !self.late()
            && self
                .read_ahead
                .is_none_or(|(_, at)| at.elapsed() <= self.late_after)
    }

    /// After a read that showed the resourceVersion `read` (as a number;
    /// `None`: the Lease gone, or a version that is no number): remembers it
    /// if the watch has not delivered it yet, to tell how late the watch
    /// does (only while it is in sync: a watch that fails or lists is not
    /// trusted anyway); a watch that already delivered it is not behind.
    pub(in crate::elector) fn saw_read(&mut self, read: Option<u64>) {
        let Some(read) = read else { return };
        if self.delivered().is_some_and(|v| v >= read) {
            let was = self.late();
            self.behind = None;
            self.tell_lag(was, None);
        } else if self.read_ahead.is_none() && self.sync == Sync::Synced {
            self.read_ahead = Some((read, Instant::now()));
        }
    }

    /// Tells whether `lease` was delivered late: more than `late_after`
    /// after its `renewTime`, by this node's clock. A watch that lags (a
    /// slow watch cache, a congested connection) keeps a follower seeing a
    /// dead holder's last renewals as news, and so waiting the lag out on
    /// top of the lease duration; the follower reads before every attempt
    /// instead, as client-go does, until a record comes in time. Expiry is
    /// still judged on this node's monotonic clock only: a clock ahead of
    /// the holder's costs reads, never safety.
    ///
    /// Only a renewal is judged: a record whose `renewTime` the watch
    /// delivers for the first time, after the watch was in sync. The first
    /// item after a (re-)list is the Lease as it is, not news: a Lease
    /// released or left by a dead holder long ago is old, not late. An edit
    /// that keeps `renewTime` (labels, a `preferredHolder` mark) is no
    /// renewal either.
    ///
    /// A version a read showed before the watch delivered it is judged too,
    /// on this node's monotonic clock: delivered (or passed) more than
    /// `late_after` after the read, the watch is behind. A holder whose clock
    /// is ahead of this node's by about the lag hides it from `renewTime`.
    fn check_lag(&mut self, lease: Option<&Lease>, listed: bool, now: Instant) {
        let was = self.late();
        let mut late = None;
        if let Some((read, at)) = self.read_ahead
            && self.delivered().is_none_or(|v| v >= read)
        {
            self.read_ahead = None;
            late = Some(now.saturating_duration_since(at));
            self.behind = late.filter(|late| *late > self.late_after);
        }
        let renewed = lease
            .and_then(|l| l.spec.as_ref()?.renew_time.as_ref())
            .map(|t| t.0);
        let before = std::mem::replace(&mut self.renewed, renewed);
        if !listed && (lease.is_none() || renewed != before) {
            let by_clock = renewed.and_then(|t| Duration::try_from(record::now().duration_since(t)).ok());
            self.lagging = by_clock.is_some_and(|late| late > self.late_after);
            late = late.max(by_clock);
        }
        self.tell_lag(was, late);
    }

    /// Whether the watch is late: its last record was, or it is behind a read.
    fn late(&self) -> bool {
        self.lagging || self.behind.is_some()
    }

    /// The resourceVersion the watch delivered last, as a number.
    fn delivered(&self) -> Option<u64> {
        self.version.as_deref().and_then(record::rv_number)
    }

    /// Tells a change of the watch's lateness (`was`: late before), warned
    /// once per [`LAG_WARN_EVERY`]; `late`: by how much, as far as known.
    fn tell_lag(&mut self, was: bool, late: Option<Duration>) {
        let late = late.unwrap_or_default();
        match (was, self.late()) {
            (false, true) if self.lag_warned_at.is_some_and(|at| at.elapsed() < LAG_WARN_EVERY) => {
                self.lag_warned = false;
                debug!(?late, "lease watch delivered a record late again");
            }
            (false, true) => {
                (self.lag_warned, self.lag_warned_at) = (true, Some(Instant::now()));
                warn!(
                    ?late,
                    "lease watch delivered a record late (or this node's clock is ahead of the holder's); \
                     reading before every attempt until it delivers in time"
                );
            }
            (true, false) if std::mem::take(&mut self.lag_warned) => {
                info!("lease watch delivers in time again");
            }
            (true, false) => debug!("lease watch delivers in time again"),
            _ => {}
        }
    }

    /// The next item of an open watch, stepped; never, without one.
    pub(in crate::elector) async fn next(&mut self) -> Step {
        let item = match &mut self.stream {
            Some(stream) => stream.next().await,
            None => futures::future::pending().await,
        };
        self.step(item, Instant::now())
    }

    /// The transition for one item of the open watch (`None`: the stream
    /// ended), at `now`. A failure, a 403 included, is retried by the watcher
    /// with kube-runtime's default backoff (up to 30 s, jittered): a 403 can
    /// pass, as from an API server just restarted whose authorization cache
    /// has not synced yet. The task polls meanwhile.
    fn step(&mut self, item: Option<WatchItem>, now: Instant) -> Step {
        match item {
            Some(Ok(lease)) => {
                if self.sync == Sync::Failing {
                    info!("lease watch recovered");
                }
                let news = std::mem::replace(&mut self.sync, Sync::Synced) != Sync::Synced;
                self.heard = now;
                self.version = lease.as_ref().and_then(|l| l.metadata.resource_version.clone());
                if self.silence.heard() {
                    info!("lease watch delivers again");
                }
                self.check_lag(lease.as_ref(), news, now);
                return Some(Delivered { lease, news });
            }
            None => {
                warn!("lease watch ended; polling every retry period from now on");
                (self.stream, self.sync) = (None, Sync::Listing);
            }
            Some(Err(_)) if self.sync == Sync::Failing => {}
            // Expired (`410 Gone`: etcd compacted past the watch's
            // resourceVersion, or an API server restarted): the watcher
            // lists again, as client-go's reflector does (which says so at
            // V(4)). Normal, not warned; polled meanwhile as when listing.
            Some(Err(e)) if crate::error::watch_status(&e) == Some(410) => {
                debug!(error = %e, "lease watch expired (410 Gone); listing again");
                self.sync = Sync::Listing;
            }
            Some(Err(e)) if crate::error::watch_refused_by_rbac(&e) => {
                warn!(
                    error = %e,
                    "cannot watch leases: grant `list` and `watch` on `leases` in `coordination.k8s.io`; \
                     falling back to polling every retry period until the watch is allowed"
                );
                self.sync = Sync::Failing;
            }
            Some(Err(e)) => {
                warn!(error = %e, "lease watch failed; polling every retry period until it recovers");
                self.sync = Sync::Failing;
            }
        }
        // Its recovery, after the watcher's backoff, is not a lag.
        self.read_ahead = None;
        None
    }
}

impl Task {
    pub(in crate::elector) async fn get(&mut self, bound: Duration) -> Result<Option<Lease>> {
        (self.inner.api.get(bound).await).inspect(|lease| {
            self.needs_read = false;
            self.watch.saw_read(lease.as_ref().and_then(record::version_of));
            self.see(lease.clone(), Instant::now());
        })
    }

    /// Records the Lease as read, written or delivered at `at` (`None`: it
    /// does not exist); returns whether the record changed.
    pub(in crate::elector) fn see(&mut self, lease: Option<Lease>, at: Instant) -> bool {
        self.memory
            .saw(lease.as_ref(), self.inner.config.lease_duration, Instant::now());
        let carried = std::mem::take(&mut self.carried);
        let Some(lease) = lease else {
            self.inner.observe(None);
            let before = std::mem::replace(&mut self.view, LeaseView::Missing);
            return !matches!(before, LeaseView::Missing);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        // The record seen before on the same object, if any (across tasks,
        // only if untouched since: the same record may have been written
        // again meanwhile, over another holder's).
        let previous = match std::mem::replace(&mut self.view, LeaseView::Unknown) {
            LeaseView::Known { observed, object }
                if object.metadata.uid == lease.metadata.uid
                    && (!carried || object.metadata.resource_version == lease.metadata.resource_version) =>
            {
                Some(*observed)
            }
            _ => None,
        };
        let changed = previous.as_ref().is_none_or(|p| p.spec != spec);
        self.inner.observe(Some(&spec));
        let observed = Observed::update(previous, spec, lease.metadata.resource_version.clone(), at);
        self.view = LeaseView::Known {
            observed: Box::new(observed),
            object: Box::new(lease),
        };
        changed
    }

    /// Waits until `until`, a change of demand, or a watch item that changes
    /// the record, brings the watch in sync, or tells it failed. A watch not
    /// trusted (lagging, silent) wakes the campaign only for a record it
    /// could take at once (the Lease gone, free, or naming us): a renewal of
    /// another holder only restarts its clock, and the next attempt, which
    /// reads first, comes at `until`, a jittered retry period at most, at
    /// client-go's pace (an attempt per renewal delivered would read once
    /// every retry period: 1.6 times as often as client-go on average).
    pub(in crate::elector) async fn idle_until(&mut self, until: Instant) {
        let wake = self.inner.wake.clone();
        loop {
            let step = futures::select_biased! {
                () = wake.notified().fuse() => return,
                step = self.watch.next().fuse() => step,
                () = sleep_until(until).fuse() => return,
            };
            let Some(Delivered { lease, news }) = step else {
                return;
            };
            let changed = self.see(lease, Instant::now());
            if news || (changed && self.may_take_at_once()) {
                return;
            }
        }
    }

    /// Whether the view may be taken at once, as far as a watch item tells:
    /// any change while the watch is trusted; else only the Lease gone, free
    /// or naming this candidate.
    fn may_take_at_once(&self) -> bool {
        let LeaseView::Known { observed, .. } = &self.view else {
            return true;
        };
        self.watch.trusted(self.config().retry_period * 2)
            || record::holder(&observed.spec).is_none_or(|h| h == self.config().identity)
    }
}

#[cfg(test)]
mod tests;
