//! The extras' attachment to the election. Events (`events`), elected shards
//! (`unstable-shards`) and Coordinated Leader Election (`coordinated`) hook
//! into the core here, at four points the core calls unconditionally:
//!
//! - [`set_up`]: the elector's construction (the `LeaseCandidate`'s name is
//!   the identity, and the election waits for the API server's first answer);
//! - [`handed_view`]: the first view of a new election task (a record of the
//!   Lease the shards' own watch saw);
//! - [`while_published`]: around an election task's campaigns and terms
//!   (the `LeaseCandidate` kept published, then deleted);
//! - [`rule`]: each campaign's rule for the record (the API server's
//!   assignment, once Coordinated Leader Election is in force).
//!
//! Without the extras' features [`State`] is empty and each hook is the
//! identity, chosen here once, so that the features' `cfg`s stand at these
//! definitions and not at the core's calls. Metrics and Events observe the
//! election through the observer seam (`observer.rs`), registering with
//! `LeaderElector::add_observer`.

#[cfg(feature = "events")]
mod events;
#[cfg(feature = "unstable-shards")]
mod for_shards;
#[cfg(feature = "coordinated")]
mod lease_candidate;

#[cfg(feature = "unstable-shards")]
pub(super) use self::for_shards::handed_view;
#[cfg(feature = "coordinated")]
pub(super) use self::lease_candidate::{rule, set_up, while_published};
#[cfg(not(feature = "unstable-shards"))]
use super::task::LeaseView;
#[cfg(not(feature = "coordinated"))]
use super::{
    Inner,
    task::{Rule, Task},
};
#[cfg(not(feature = "coordinated"))]
use crate::config::LeaseConfig;

/// The extras' part of the elector's state (`elector/mod.rs`'s `State`).
#[derive(Default)]
pub(super) struct State {
    /// Which election is in force.
    #[cfg(feature = "coordinated")]
    pub(super) election: lease_candidate::Election,
    /// Since when the campaign has found the coordinated Lease missing, free
    /// or expired (the API server's election due), if it does.
    #[cfg(feature = "coordinated")]
    pub(super) election_due: Option<tokio::time::Instant>,
    /// A record of the Lease that the shards' own watch saw, unchanged since
    /// the instant with it, for the next election task to start from.
    #[cfg(feature = "unstable-shards")]
    pub(super) handed_record: Option<(
        Box<k8s_openapi::api::coordination::v1::Lease>,
        tokio::time::Instant,
    )>,
}

/// The elector's settings and state as the ordinary election has them.
#[cfg(not(feature = "coordinated"))]
pub(super) fn set_up(config: LeaseConfig, state: super::State) -> (LeaseConfig, super::State) {
    (config, state)
}

/// No record handed over: the task starts from its own first read.
#[cfg(not(feature = "unstable-shards"))]
pub(super) fn handed_view(_: &mut super::State) -> Option<LeaseView> {
    None
}

/// The election task's campaigns and terms, as they are.
#[cfg(not(feature = "coordinated"))]
pub(super) async fn while_published<T>(_: &Inner, elect: impl Future<Output = T>) -> T {
    elect.await
}

/// The ordinary election's rule for the record.
#[cfg(not(feature = "coordinated"))]
#[allow(
    clippy::unnecessary_wraps,
    reason = "Coordinated Leader Election may say to wait"
)]
pub(super) fn rule(_: &Task, ordinary: Rule, _: tokio::time::Instant) -> Result<Rule, tokio::time::Instant> {
    Ok(ordinary)
}

impl super::LeaderElector {
    /// Adds an observer of the election's transitions: the extras' metrics
    /// and Events. Whether it was added (see `Observers::add`).
    #[cfg_attr(
        not(any(feature = "events", feature = "metrics")),
        expect(dead_code, reason = "the extras add observers: metrics, Events")
    )]
    pub(crate) fn add_observer(&self, observer: impl super::Observer) -> bool {
        self.inner.observers.add(observer)
    }

    /// The last state told to the observers: whether this candidate leads,
    /// and whether Coordinated Leader Election is in force.
    #[cfg(feature = "metrics")]
    pub(crate) fn told_state(&self) -> (bool, bool) {
        let told = self.inner.observers.0.read();
        (told.leading == Some(true), told.coordinated == Some(true))
    }
}

impl super::api::LeaseApi {
    /// The client the Lease API calls use, for the extras' own calls (Events,
    /// the `LeaseCandidate`).
    #[cfg(any(feature = "events", feature = "coordinated"))]
    pub(super) fn client(&self) -> kube_client::Client {
        self.api.clone().into_client()
    }
}
