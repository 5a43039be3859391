//! The election task: one per elector at a time (see [`supervise`](super::supervise)),
//! campaigning while leadership is wanted, leading a term, and ending it.
//!
//! - [`view`]: the task's view of the Lease (reads, the watch, the polling
//!   fallback, records written by others);
//! - [`campaign`]: one attempt to acquire, the retries, the creation hold;
//! - [`lead`]: leading one term (publish, the loop, verify, step down);
//! - [`renew`]: one renewal, and what each answer means for the term;
//! - [`end`]: ending a term, and the release;
//! - all Lease API calls go through [`LeaseApi`](super::api::LeaseApi).
//!
//! # Invariants
//! What the election promises rests on these rules; each names where it is
//! enforced.
//!
//! 1. **One task at a time.** At most one task talks to the API: a task is
//!    spawned only while none runs (`State::running`), and a task stops
//!    running only after its last request (`Task::end`, under the lock) or
//!    when it is dropped (its runtime shut down).
//! 2. **A passed deadline is final.** The renew deadline counts from the
//!    instant before the last successful write was *sent*, never from its
//!    answer (`Term::renewed(sent, ..)`), and comes sooner when our record
//!    is edited to a shorter lease duration (`Task::ours`); once it passed,
//!    no renewal brings the term back, no guard of it is handed out, and
//!    guards, guarded streams and `is_leader` see it on their own clock.
//! 3. **A guard only while its term holds.** Guards are made only by
//!    `LeaseGuard::of` (`Term::join`), under the term's lock, while it holds; a term is
//!    published (`begin_term`) only after the creation hold, and removed from
//!    the state in the same step that decides to give it up (`demand_for_term`).
//! 4. **Why a term ended is exact.** The first reason wins (`Term::lose`);
//!    `Lost::Shutdown` follows only `shutdown()` (a term given up because
//!    nobody wants it has no guard left to see its reason); a task dropped
//!    with its runtime ends its term as `Lost::ElectorStopped`.
//! 5. **Release only after the guarded work ended.** The Lease is written free
//!    (`end_term`, `release`) never within lease duration − renew deadline of
//!    stopped work (a guard alive when a term ended, work dropped unfinished:
//!    `Term::stopped_at`, `Memory::stopped_until`), never during a creation
//!    hold, and only if a fresh read still shows our own term's record,
//!    renewed last by us (`Memory::is_last_term`).
//! 6. **"Ours" is our own term's record**: the same object and holder as
//!    the write that began the term (`TermId`), with the `renewTime` of our
//!    last write (`Memory::is_last_term`), whatever else an edit changed;
//!    every term begins with a new acquisition.
//! 7. **No leader on a re-created Lease before its old holder gave up.** A
//!    term on a Lease object that replaced a held one (or that we created)
//!    begins only when the creation hold ends (`Memory::hold`, kept across
//!    campaigns and tasks), confirmed by a read; the hold is never written
//!    free, and every write during it carries a duration covering the rest.

mod campaign;
mod end;
mod lead;
mod renew;
pub(in crate::elector) mod view;

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;
use tracing::{error, warn};

pub(crate) use self::view::Silence;
pub(in crate::elector) use self::view::{Watch, WatchStream};
use super::{Inner, memory::Memory};
use crate::{
    config::LeaseConfig,
    error::{ApiError, Result},
    record::{Asker, Observed, Verdict},
};

/// What this candidate last saw of the Lease.
#[derive(Clone, Debug)]
pub(in crate::elector) enum LeaseView {
    /// Nothing trustworthy: read before acting.
    Unknown,
    /// The Lease does not exist.
    Missing,
    /// The last record seen, and the whole object (for its metadata).
    Known {
        observed: Box<Observed>,
        object: Box<Lease>,
    },
}

/// A rule for a record: what a candidate may do with it
/// ([`Observed::verdict`], or Coordinated Leader Election's).
pub(in crate::elector) type Rule = fn(&Observed, Asker<'_>, Instant) -> Verdict;

/// One attempt to acquire: won, or when to try again.
pub(in crate::elector) enum Attempt {
    Won(Won),
    WaitUntil(Instant),
}

/// A write that won the Lease: a term begins with it.
pub(in crate::elector) struct Won {
    /// The object as written (or, after a retried write, as read back).
    pub(in crate::elector) lease: Box<Lease>,
    /// The instant before the write was sent: the renew deadline counts from it.
    pub(in crate::elector) sent: Instant,
    /// Whether the write created the Lease.
    pub(in crate::elector) created: bool,
}

/// What the task does once a term ended.
pub(in crate::elector) enum Next {
    /// Campaign again (or end, if nobody wants leadership).
    Campaign,
    /// End: the shutdown began. The release's result is what `shutdown` returns.
    End(Result<()>),
}

pub(in crate::elector) struct Task {
    pub(in crate::elector) inner: Arc<Inner>,
    pub(in crate::elector) view: LeaseView,
    /// The observation may be outdated (after a conflict, or carried over
    /// from an earlier task): read before acting on it.
    pub(in crate::elector) needs_read: bool,
    /// The view is the last task's (or handed over), not seen since: its
    /// clock holds only for the object untouched (same resourceVersion).
    pub(in crate::elector) carried: bool,
    pub(in crate::elector) watch: Watch,
    /// What the elector remembers of the Lease across terms and tasks: the
    /// running task owns it, and hands it back when it ends (or is dropped).
    pub(in crate::elector) memory: Memory,
    /// The task ended (see [`Task::end`]): its drop leaves the state alone.
    pub(in crate::elector) ended: bool,
}

impl Task {
    pub(in crate::elector) fn new(inner: Arc<Inner>) -> Self {
        let mut state = inner.lock();
        let mut memory = std::mem::take(&mut state.memory);
        let view = memory.view.take().unwrap_or(LeaseView::Unknown);
        // A record seen elsewhere in this process (elected shards). (A
        // binding of its own, with this comment: the upstream generator
        // drops both.)
        let view = super::extras::handed_view(&mut state).unwrap_or(view);
        drop(state);
        Task {
            watch: Watch::new(
                inner.config.watch.then(|| inner.api.watch()),
                inner.config.retry_period,
            ),
            inner,
            view,
            needs_read: true,
            carried: true,
            memory,
            ended: false,
        }
    }

    pub(in crate::elector) fn config(&self) -> &LeaseConfig {
        &self.inner.config
    }

    pub(in crate::elector) fn log_error(&self, what: &str, e: &ApiError) {
        let (namespace, name) = (&self.config().namespace, &self.config().name);
        let why = if e.status() == Some(401) {
            format!(
                "unauthorized: the API server did not accept this client's credentials (401) for lease {namespace}/{name}: \
                 check the kubeconfig or the service account token (no RBAC grant can fix a 401)"
            )
        } else if let Some(verb) = e.forbidden_verb() {
            format!(
                "forbidden to {verb} lease {namespace}/{name}: RBAC needs verbs get, create, update on resource `leases` in API group `coordination.k8s.io` (and list, watch for watch-driven election); `{verb}` is missing"
            )
        } else {
            warn!(error = %crate::error::Chain(e), "{what} failed");
            return;
        };
        error!(error = %crate::error::Chain(e), "{why}");
    }
}
