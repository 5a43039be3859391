//! The election task: one per elector at a time (see [`supervise`](super::supervise)),
//! campaigning while leadership is wanted, leading a term, and ending it.
//!
//! - [`observe`]: the task's view of the Lease (watch, polling fallback, reads);
//! - [`campaign`]: try-acquire, backoff, the creation hold;
//! - [`term`]: leading one term (renew, verify, step down);
//! - [`end`]: ending a term and releasing.

mod campaign;
mod end;
mod observe;
mod term;

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;
use tracing::{error, warn};

pub(in crate::elector) use self::observe::WatchStream;
use super::Inner;
use crate::{config::LeaseConfig, error::Error, record::Observed};

/// What this candidate last saw of the Lease.
#[derive(Clone, Debug)]
pub(in crate::elector) enum Obs {
    /// Nothing trustworthy: read before acting.
    Unknown,
    /// The Lease does not exist.
    Missing,
    /// The last record seen, and the whole object (for its metadata).
    Known { observed: Observed, object: Box<Lease> },
}

pub(in crate::elector) enum Attempt {
    /// Won: the object written, the instant before the write was sent, and
    /// whether the write created the Lease.
    Acquired(Box<Lease>, Instant, bool),
    WaitUntil(Instant),
    RetryNow,
}

#[allow(clippy::struct_excessive_bools)] // independent flags of one state machine
pub(in crate::elector) struct Task {
    pub(in crate::elector) inner: Arc<Inner>,
    pub(in crate::elector) generation: u64,
    pub(in crate::elector) obs: Obs,
    /// The observation may be outdated (after a conflict, or carried over
    /// from an earlier task): read before acting on it.
    pub(in crate::elector) stale: bool,
    pub(in crate::elector) watch: Option<WatchStream>,
    /// The watch has delivered a complete state and failed not since.
    pub(in crate::elector) synced: bool,
    pub(in crate::elector) init_seen: bool,
    pub(in crate::elector) watch_warned: bool,
    /// While leading: the object as we last wrote or verified it.
    pub(in crate::elector) cached: Option<Box<Lease>>,
    /// While leading: the watch has delivered our last write, so every later
    /// event is newer than it.
    pub(in crate::elector) caught_up: bool,
    /// The task returned: its drop leaves the state alone.
    pub(in crate::elector) exited: bool,
}

impl Task {
    pub(in crate::elector) fn new(inner: Arc<Inner>, generation: u64) -> Self {
        let watch = inner.config.watch.then(|| inner.api.watch());
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

impl Task {
    pub(in crate::elector) fn config(&self) -> &LeaseConfig {
        &self.inner.config
    }

    pub(in crate::elector) fn log_error(&self, what: &str, e: &Error) {
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
}
