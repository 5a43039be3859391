//! The task's view of the Lease: reads, watch events (with the polling
//! fallback when the watch is unavailable), and what they change.

use std::time::Duration;

use futures::{FutureExt, StreamExt, stream::BoxStream};
use k8s_openapi::api::coordination::v1::Lease;
use kube_runtime::watcher;
use tokio::time::{Instant, sleep_until};
use tracing::{debug, info, warn};

use super::{LeaseView, Task};
use crate::{
    error::Result,
    record::{self, Observed},
};

/// The first wait before a watch that was forbidden (or ended) is opened
/// again; each failure doubles it, up to [`WATCH_REOPEN_MAX`].
pub(in crate::elector) const WATCH_REOPEN_MIN: Duration = Duration::from_secs(10);
/// The longest wait before a watch is opened again.
pub(in crate::elector) const WATCH_REOPEN_MAX: Duration = Duration::from_secs(300);

pub(in crate::elector) type WatchStream = BoxStream<'static, watcher::Result<watcher::Event<Lease>>>;

pub(in crate::elector) async fn next_event(
    watch: &mut Option<WatchStream>,
) -> Option<watcher::Result<watcher::Event<Lease>>> {
    match watch {
        Some(w) => w.next().await,
        None => futures::future::pending().await,
    }
}

impl Task {
    pub(in crate::elector) async fn get(&mut self, bound: Duration) -> Result<Option<Lease>> {
        // Every poll: a watch that was forbidden or ended may be back.
        self.reopen_watch_if_due();
        let result = self.inner.api.get(bound).await;
        if result.is_ok() {
            self.needs_read = false;
        }
        match &result {
            Ok(Some(lease)) => {
                self.update_view(lease.clone(), Instant::now());
            }
            Ok(None) => {
                self.view_missing();
            }
            Err(_) => {}
        }
        result
    }

    /// Drops the watch, and schedules opening it again after a backoff that
    /// doubles with each failure in a row: a 403 can pass (an apiserver just
    /// restarted answers before its authorization cache has synced), and a
    /// watch that ended may be served again.
    fn drop_watch(&mut self) {
        self.watch = None;
        self.synced = false;
        self.caught_up = false;
        let backoff = self
            .watch_reopen
            .map_or(WATCH_REOPEN_MIN, |(_, last)| (last * 2).min(WATCH_REOPEN_MAX));
        self.watch_reopen = Some((Instant::now() + backoff, backoff));
    }

    /// Opens the watch again once its backoff has passed.
    pub(in crate::elector) fn reopen_watch_if_due(&mut self) {
        if self.watch.is_none()
            && self.inner.config.watch
            && let Some((at, _)) = self.watch_reopen
            && Instant::now() >= at
        {
            debug!("opening the lease watch again");
            self.watch = Some(self.inner.api.watch());
        }
    }

    /// Records a Lease seen at `at`; returns whether the record changed.
    pub(in crate::elector) fn update_view(&mut self, lease: Lease, at: Instant) -> bool {
        let spec = lease.spec.clone().unwrap_or_default();
        let rv = lease.metadata.resource_version.clone();
        let (previous, changed) = match std::mem::replace(&mut self.view, LeaseView::Unknown) {
            LeaseView::Known { observed, object } => {
                let same_object = object.metadata.uid == lease.metadata.uid;
                let changed = observed.spec != spec || !same_object;
                (same_object.then_some(observed), changed)
            }
            _ => (None, true),
        };
        self.inner.lock().memory.saw(
            lease.metadata.uid.as_ref(),
            &spec,
            record::token_of(&lease),
            self.inner.config.lease_duration,
            Instant::now(),
        );
        self.inner.update_status(|s| {
            s.holder = record::holder(&spec).map(str::to_owned);
            s.transitions = spec.lease_transitions;
        });
        let observed = Observed::update(previous, spec, rv, at);
        self.view = LeaseView::Known {
            observed,
            object: Box::new(lease),
        };
        changed
    }

    pub(in crate::elector) fn view_missing(&mut self) -> bool {
        let changed = !matches!(self.view, LeaseView::Missing);
        self.view = LeaseView::Missing;
        self.inner.lock().memory.went_away(Instant::now());
        self.inner.update_status(|s| {
            s.holder = None;
            s.transitions = None;
        });
        changed
    }

    /// Handles one watch event; returns whether the election should be re-evaluated.
    pub(in crate::elector) fn handle_watch(
        &mut self,
        event: Option<watcher::Result<watcher::Event<Lease>>>,
    ) -> bool {
        let now = Instant::now();
        match event {
            None => {
                warn!("lease watch ended; polling every retry period until it is opened again");
                self.drop_watch();
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
                self.update_view(lease, now)
            }
            Some(Ok(watcher::Event::Apply(lease))) => {
                let recovered = self.resumed();
                self.update_view(lease, now) || recovered
            }
            Some(Ok(watcher::Event::Delete(_))) => {
                let recovered = self.resumed();
                self.view_missing() || recovered
            }
            Some(Ok(watcher::Event::InitDone)) => {
                if self.watch_warned {
                    info!("lease watch recovered");
                }
                self.watch_warned = false;
                self.watch_reopen = None;
                let changed = !self.init_seen && self.view_missing();
                let was_synced = std::mem::replace(&mut self.synced, true);
                changed || !was_synced
            }
            Some(Err(e)) => {
                self.caught_up = false;
                let forbidden = matches!(&e, watcher::Error::InitialListFailed(kube_client::Error::Api(s))
                    | watcher::Error::WatchStartFailed(kube_client::Error::Api(s)) if s.code == 403 || s.code == 401);
                self.synced = false;
                if forbidden {
                    if self.watch_reopen.is_none() {
                        warn!(
                            error = %e,
                            "cannot watch leases: grant `list` and `watch` on `leases` in `coordination.k8s.io`; \
                             falling back to polling every retry period (the watch is tried again, with backoff)"
                        );
                    } else {
                        debug!(error = %e, "still cannot watch leases");
                    }
                    self.drop_watch();
                } else if !self.watch_warned {
                    warn!(error = %e, "lease watch failed; polling every retry period until it recovers");
                    self.watch_warned = true;
                }
                true
            }
        }
    }

    /// An event outside a re-list after the watch failed: the watcher
    /// resumed from the last resourceVersion (no re-list: a `410 Gone`
    /// would have forced one), so no event was missed and the watch is
    /// trusted again, without waiting for an `InitDone` that never comes.
    /// Returns whether it recovered now.
    fn resumed(&mut self) -> bool {
        if self.synced || !self.watch_warned {
            return false;
        }
        info!("lease watch recovered");
        self.watch_warned = false;
        self.watch_reopen = None;
        self.synced = true;
        true
    }

    /// Waits until `until`, a change of demand, or a watch event that changes the record.
    pub(in crate::elector) async fn idle_until(&mut self, until: Instant) {
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
}
