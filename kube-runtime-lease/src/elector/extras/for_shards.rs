//! What elected shards (`shard/`) ask of a shard's elector: a record of its
//! Lease seen by the shards' own watch, handed to the next election task, and
//! the end of a term whose work outlived its grace.

use k8s_openapi::api::coordination::v1::Lease;

use crate::{
    elector::{LeaderElector, State, task::LeaseView},
    record::Observed,
    term::Lost,
};

impl LeaderElector {
    /// Gives the next election task a record of the Lease that this process
    /// observed elsewhere (another watch), unchanged since `since` by its own
    /// clock, so that a campaign started later counts the record's expiry from
    /// then instead of from its own first read. Safe by the same rule as every
    /// observation: the task still reads before acting, and keeps `since`
    /// only if the record it reads is the same (same object, same spec); a
    /// record seen late only makes expiry later. Ignored once a task runs
    /// (it has its own observation), and replaced by a later one.
    pub(crate) fn hand_over_record(&self, lease: Lease, since: tokio::time::Instant) {
        let mut state = self.inner.lock();
        if !state.running {
            state.extras.handed_record = Some((Box::new(lease), since));
        }
    }

    /// Ends the term in force now, if there is one, as [`Lost::GivenUp`]:
    /// its guards resolve, so the work racing them stops, and the release
    /// follows the usual rule (none when a guard was still alive: the Lease
    /// expires). For a shard handed over whose work outlived its grace.
    /// Whether there was a term to end.
    pub(crate) fn give_up_term(&self) -> bool {
        let term = self.inner.lock().term.clone();
        let Some(term) = term else { return false };
        if term.lost().is_some() {
            return false;
        }
        term.lose(&Lost::GivenUp);
        self.inner.wake.notify_one();
        true
    }
}

/// The view a new election task starts from: the record handed over, if any
/// (still read before acting).
pub(in crate::elector) fn handed_view(state: &mut State) -> Option<LeaseView> {
    let (lease, at) = state.extras.handed_record.take()?;
    Some(LeaseView::Known {
        observed: Box::new(Observed {
            spec: lease.spec.clone().unwrap_or_default(),
            resource_version: lease.metadata.resource_version.clone(),
            at,
            firsts: Vec::new(),
        }),
        object: lease,
    })
}
