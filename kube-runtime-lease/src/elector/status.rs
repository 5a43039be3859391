//! What a candidate knows of the election ([`LeaderStatus`]) and its health
//! ([`LeaderElector::health_check`]).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use tokio::sync::watch;
use tracing::info;

use super::{Inner, LeaderElector, Transition};
use crate::record;

/// What this candidate knows of the election, as of its last observation.
///
/// Read it with [`LeaderElector::status`], or follow every change with
/// [`LeaderElector::subscribe`] (client-go's `OnNewLeader`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderStatus {
    /// Whether this candidate leads now.
    pub is_leader: bool,
    /// The holder named by the last observed record, `None` when the Lease
    /// is free, missing or not yet observed.
    pub holder: Option<String>,
    /// The Lease's `leaseTransitions` in the last observed record.
    pub transitions: Option<i32>,
    /// Whether Coordinated Leader Election is in force
    /// ([`LeaseConfig::coordinated`](crate::LeaseConfig::coordinated), and
    /// the API server serves `LeaseCandidate`): `false` for the ordinary
    /// election, also while the first `LeaseCandidate` creation is pending
    /// and after the fallback.
    #[cfg(feature = "coordinated")]
    pub coordinated: bool,
}

impl LeaderStatus {
    /// What the record `spec` says of the election (`None`: the Lease does
    /// not exist): its holder and transitions.
    pub(crate) fn observe(&mut self, spec: Option<&LeaseSpec>) {
        self.holder = spec.and_then(record::holder).map(str::to_owned);
        self.transitions = spec.and_then(|s| s.lease_transitions);
    }
}

/// Why a [`LeaderElector::health_check`] or
/// [`LeaderElector::contact_check`] failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HealthError {
    /// This candidate believes it leads, but its last successful renewal is
    /// older than the lease duration plus the tolerance: its election task is
    /// stuck, and another candidate may already lead.
    #[error(
        "leader election: last successful renewal was {since:?} ago, more than lease duration + tolerance ({limit:?})"
    )]
    RenewalOverdue {
        /// Time since the instant before the last successful renewal was sent.
        since: Duration,
        /// The lease duration plus the tolerance.
        limit: Duration,
    },
    /// This candidate campaigns (or leads), but the API server has not
    /// answered it for longer than the limit given to
    /// [`LeaderElector::contact_check`].
    #[error(
        "leader election: no answer from the API server for {since:?}, more than {limit:?}: this replica can neither lead nor see who does"
    )]
    ApiSilent {
        /// Time since the API server last answered (or since the election
        /// task started, if it never has).
        since: Duration,
        /// The limit given.
        limit: Duration,
    },
}

impl LeaderElector {
    /// What this candidate knows of the election now. `is_leader` is as
    /// [`is_leader`](Self::is_leader) says.
    #[must_use]
    pub fn status(&self) -> LeaderStatus {
        let mut status = self.inner.status.borrow().clone();
        status.is_leader = self.is_leader();
        status
    }

    /// Follows [`status`](Self::status): the receiver sees every change of
    /// leader observed by this candidate (client-go's `OnNewLeader`).
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<LeaderStatus> {
        self.inner.status.subscribe()
    }

    /// Whether this candidate leads now: a term holds (its renew deadline has
    /// not passed, even if the background task has not noticed yet) and
    /// [`shutdown`](Self::shutdown) has not begun. Suited to a readiness gate.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        let state = self.inner.lock();
        !state.shutdown && state.term.as_ref().is_some_and(|t| t.holds_serialized())
    }

    /// client-go's healthz watchdog: fails when this candidate believes it
    /// leads but its last successful renewal is older than the lease duration
    /// plus `tolerance` (client-go's default tolerance is 20 s). Healthy
    /// otherwise, including when it does not lead. Suited to a liveness probe:
    /// restarting a stuck leader lets another take over.
    ///
    /// # Errors
    /// [`HealthError::RenewalOverdue`] as above.
    pub fn health_check(&self, tolerance: Duration) -> Result<(), HealthError> {
        // The term in force, unless it ended; the one term of a disabled
        // election (the only timeless one) renews nothing: never stuck.
        // Without such a term, no renewal is overdue (zero since). The last
        // renewal was sent one renew deadline before the term's deadline.
        let term = self.inner.lock().term.clone();
        let term = term.filter(|t| !t.timeless && t.lost().is_none());
        let cfg = &self.inner.config;
        let since = term.map_or(Duration::ZERO, |t| t.deadline().elapsed() + cfg.renew_deadline);
        let limit = cfg.lease_duration.saturating_add(tolerance);
        if since > limit {
            return Err(HealthError::RenewalOverdue { since, limit });
        }
        Ok(())
    }

    /// The standby's health check, for a liveness probe: fails when this
    /// candidate takes part in the election (it campaigns or leads) but the
    /// API server has not answered it for longer than `max_silence` (no read,
    /// write or watch event answered by the API server itself; a timeout, a
    /// connection error or a 5xx is no answer). Healthy when nobody wants
    /// leadership (no election task runs), and with the election switched
    /// off.
    ///
    /// [`health_check`](Self::health_check) fails only for a leader whose
    /// renewals are overdue; a standby that has lost its way to the API
    /// server (a connection pool or DNS cache gone bad) looks healthy to it,
    /// and never takes over. Restarting it helps only if the API server is
    /// up for others, so choose `max_silence` well above an API server
    /// outage you would ride out (minutes, not seconds): every replica would
    /// otherwise restart together. Serve both from `/livez`.
    ///
    /// # Errors
    /// [`HealthError::ApiSilent`] as above.
    pub fn contact_check(&self, max_silence: Duration) -> Result<(), HealthError> {
        if !self.inner.config.enabled || !self.inner.lock().running {
            return Ok(());
        }
        let (since, limit) = (self.inner.api.contact.silence(), max_silence);
        if since > limit {
            return Err(HealthError::ApiSilent { since, limit });
        }
        Ok(())
    }
}

impl Inner {
    /// This candidate does not lead (any more): the status says so.
    pub(super) fn not_leading(&self) {
        self.update_status(|s| s.is_leader = false);
        // And the observers (metrics, Events) are told.
        self.observers.tell(Transition::Leading(false));
    }

    /// The Lease observed now holds the record `spec` (`None`: it does not
    /// exist): the status shows its holder. The first look at the Lease is
    /// no change of holder for the observers (a replica started beside a
    /// leader has seen none).
    pub(super) fn observe(&self, spec: Option<&LeaseSpec>) {
        self.update_status(|s| s.observe(spec));
        self.observers.looked();
    }

    /// Changes the published status; a change of holder is logged, and told
    /// (once the Lease was looked at before: `Observers::looked`).
    pub(super) fn update_status(&self, f: impl FnOnce(&mut LeaderStatus)) {
        self.status.send_if_modified(|s| {
            let before = s.clone();
            f(s);
            if s.holder != before.holder {
                if let Some(holder) = &s.holder {
                    info!(%holder, "new leader observed");
                } else {
                    info!("lease observed free or missing");
                }
                // And told to the observers (metrics, Events).
                self.observers.tell(Transition::HolderChanged);
            }
            *s != before
        });
    }
}
