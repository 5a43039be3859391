//! The task's view of the Lease: reads, the watch (kube-runtime's
//! `watch_object`, with the polling fallback when it is unavailable), and
//! what they change.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
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

/// The waits before a closed watch is opened again, one per failure in a row
/// (and before a `LeaseCandidate` the API server does not serve is published
/// again): one backoff policy for an optional API that is not there.
pub(in crate::elector) fn reopen_backoff() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(WATCH_REOPEN_MIN)
        .with_max_delay(WATCH_REOPEN_MAX)
        .without_max_times()
        .build()
}

/// What the watch yields: the Lease as it is now, or `None` once it is gone
/// (kube-runtime's `watch_object`).
pub(in crate::elector) type WatchItem = watcher::Result<Option<Lease>>;
pub(in crate::elector) type WatchStream = BoxStream<'static, WatchItem>;

/// The Lease watch: data per state, and one step per item ([`Watch::step`]).
pub(in crate::elector) enum Watch {
    /// Not asked for (`LeaseConfig::watch(false)`): the task polls.
    Off,
    /// Open. `reopens`: once it was closed, the backoff of that outage,
    /// kept until it delivers.
    Open {
        stream: WatchStream,
        sync: Sync,
        reopens: Option<ExponentialBackoff>,
    },
    /// Closed (forbidden, or ended): the task polls until `reopen_at`.
    Closed {
        reopen_at: Instant,
        reopens: ExponentialBackoff,
    },
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

/// What one watch item means for the election.
#[derive(Debug, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "lives on the stack for one step, like the item it carries"
)]
pub(in crate::elector) enum Step {
    /// The Lease as it is now (`None`: gone); `news`: the watch is in sync
    /// now and was not before.
    Delivered { lease: Option<Lease>, news: bool },
    /// The watch failed or ended: its view may be behind.
    Failed,
}

impl Watch {
    /// Whether the watch delivered the Lease's state and has not failed since.
    pub(in crate::elector) fn synced(&self) -> bool {
        matches!(self, Watch::Open { sync, .. } if *sync == Sync::Synced)
    }

    /// An open watch on `stream`, nothing delivered yet; `reopens`: see [`Watch::Open`].
    pub(in crate::elector) fn open(stream: WatchStream, reopens: Option<ExponentialBackoff>) -> Self {
        Watch::Open {
            stream,
            sync: Sync::Listing,
            reopens,
        }
    }

    /// The next item of an open watch; never, without one.
    pub(in crate::elector) async fn next(&mut self) -> Option<WatchItem> {
        match self {
            Watch::Open { stream, .. } => stream.next().await,
            _ => futures::future::pending().await,
        }
    }

    /// The transition for one item (`None`: the stream ended), at `now`.
    pub(in crate::elector) fn step(&mut self, item: Option<WatchItem>, now: Instant) -> Step {
        let Watch::Open { sync, reopens, .. } = self else {
            return Step::Failed;
        };
        match item {
            Some(Ok(lease)) => {
                let news = *sync != Sync::Synced;
                if *sync == Sync::Failing {
                    info!("lease watch recovered");
                }
                *sync = Sync::Synced;
                *reopens = None;
                Step::Delivered { lease, news }
            }
            None => {
                warn!("lease watch ended; polling every retry period until it is opened again");
                self.close(now);
                Step::Failed
            }
            Some(Err(e)) if matches!(crate::error::watch_status(&e), Some(401 | 403)) => {
                // Refused rather than broken.
                if reopens.is_none() {
                    warn!(
                        error = %e,
                        "cannot watch leases: grant `list` and `watch` on `leases` in `coordination.k8s.io`; \
                         falling back to polling every retry period (the watch is tried again, with backoff)"
                    );
                } else {
                    debug!(error = %e, "still cannot watch leases");
                }
                self.close(now);
                Step::Failed
            }
            Some(Err(e)) => {
                if *sync != Sync::Failing {
                    warn!(error = %e, "lease watch failed; polling every retry period until it recovers");
                }
                *sync = Sync::Failing;
                Step::Failed
            }
        }
    }

    /// Closes the watch, to be opened again after a backoff that doubles with
    /// each failure in a row: a 403 can pass (an apiserver just restarted
    /// answers before its authorization cache has synced), and a watch that
    /// ended may be served again.
    fn close(&mut self, now: Instant) {
        let mut reopens = match std::mem::replace(self, Watch::Off) {
            Watch::Open { reopens: Some(r), .. } | Watch::Closed { reopens: r, .. } => r,
            _ => reopen_backoff(),
        };
        let reopen_at = now + reopens.next().unwrap_or(WATCH_REOPEN_MAX);
        *self = Watch::Closed { reopen_at, reopens };
    }

    /// Opens the watch again once its backoff has passed.
    fn reopen_if_due(&mut self, open: impl FnOnce() -> WatchStream) {
        if matches!(self, Watch::Closed { reopen_at, .. } if Instant::now() >= *reopen_at)
            && let Watch::Closed { reopens, .. } = std::mem::replace(self, Watch::Off)
        {
            debug!("opening the lease watch again");
            *self = Watch::open(open(), Some(reopens));
        }
    }
}

impl Task {
    pub(in crate::elector) async fn get(&mut self, bound: Duration) -> Result<Option<Lease>> {
        // Every poll: a watch that was forbidden or ended may be back.
        self.watch.reopen_if_due(|| self.inner.api.watch());
        let result = self.inner.api.get(bound).await;
        if let Ok(lease) = &result {
            self.needs_read = false;
            self.see(lease.clone());
        }
        result
    }

    /// Records the Lease as read or delivered now (`None`: it does not
    /// exist); returns whether the record changed.
    fn see(&mut self, lease: Option<Lease>) -> bool {
        let Some(lease) = lease else {
            let changed = !matches!(self.view, LeaseView::Missing);
            self.view = LeaseView::Missing;
            self.memory.went_away(Instant::now());
            self.inner.update_status(|s| s.observe(None));
            return changed;
        };
        self.update_view(lease, Instant::now())
    }

    /// Records a Lease seen at `at`; returns whether the record changed.
    pub(in crate::elector) fn update_view(&mut self, lease: Lease, at: Instant) -> bool {
        let spec = lease.spec.clone().unwrap_or_default();
        // The record seen before on the same object, if any.
        let previous = match std::mem::replace(&mut self.view, LeaseView::Unknown) {
            LeaseView::Known { observed, object } if object.metadata.uid == lease.metadata.uid => {
                Some(observed)
            }
            _ => None,
        };
        let changed = previous.as_ref().is_none_or(|p| p.spec != spec);
        self.memory.saw(
            lease.metadata.uid.as_ref(),
            &spec,
            record::token_of(&lease),
            self.inner.config.lease_duration,
            Instant::now(),
        );
        self.inner.update_status(|s| s.observe(Some(&spec)));
        self.view = LeaseView::Known {
            observed: Observed::update(previous, spec, lease.metadata.resource_version.clone(), at),
            object: Box::new(lease),
        };
        changed
    }

    /// Handles one watch item; returns whether the election should be
    /// re-evaluated (the record changed, the watch came in sync, or failed).
    pub(in crate::elector) fn handle_watch(&mut self, item: Option<WatchItem>) -> bool {
        match self.watch.step(item, Instant::now()) {
            Step::Delivered { lease, news } => {
                self.heard = Instant::now();
                self.see(lease) || news
            }
            Step::Failed => true,
        }
    }

    /// Waits until `until`, a change of demand, or a watch item that changes the record.
    pub(in crate::elector) async fn idle_until(&mut self, until: Instant) {
        let wake = self.inner.wake.clone();
        loop {
            let item = futures::select_biased! {
                () = wake.notified().fuse() => return,
                item = self.watch.next().fuse() => item,
                () = sleep_until(until).fuse() => return,
            };
            if self.handle_watch(item) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
