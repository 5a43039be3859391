//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's protocol.
//!
//! Run several replicas of a controller, and let only one of them work at a time: the one that
//! holds the Lease. Candidates written with client-go's `leaderelection` and with this module
//! honour each other on the same Lease.
//!
//! - A [`LeaderElector`] campaigns for one Lease with a [`Config`]: client-go's timings (15 s
//!   lease duration, 10 s renew deadline, 2 s retry period) and its validation rules, checked
//!   before any API call.
//! - [`LeaderElector::acquire`] waits until this candidate leads and returns a [`LeaseGuard`]:
//!   a future that resolves to [`Lost`] when the term ends. Dropping the last guard releases
//!   the Lease, so that another candidate takes over at once.
//! - [`WatchStreamExt::with_leader_election`](crate::WatchStreamExt::with_leader_election)
//!   runs any stream, such as the one [`Controller::run`](crate::Controller::run) returns,
//!   under the election: it is not polled before the Lease is won, and it is dropped when the
//!   term ends.
//!
//! # Guarantees, and their limits
//! A candidate takes another's Lease only after seeing its record unchanged for the lease
//! duration on its own monotonic clock (never by reading `renewTime`), so clock offsets between
//! nodes do not matter. Every write is a `replace` with the `resourceVersion` last read: a lost
//! race is a `409 Conflict`, never an overwrite. The leader stops at the renew deadline, before
//! anyone may take over; a process paused longer than that gap can still act after its term
//! ended, so check [`LeaseGuard::is_valid`] before a side effect and write
//! [`LeaseGuard::fencing_token`] with it.
//!
//! # Example
//! ```no_run
//! use std::sync::Arc;
//!
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::{
//!     Api,
//!     runtime::{Controller, WatchStreamExt, controller::Action, lease, watcher},
//! };
//! # async fn reconcile(_: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, kube::Error> { todo!() }
//! # fn error_policy(_: Arc<ConfigMap>, _: &kube::Error, _: Arc<()>) -> Action { todo!() }
//! # async fn run(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! // One elector per Lease; each replica campaigns under its own identity (its pod's name).
//! let config = lease::Config::new("default", "my-controller", std::env::var("POD_NAME")?);
//! let elector = lease::LeaderElector::new(client.clone(), config)?;
//! let controller = Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
//!     .run(reconcile, error_policy, Arc::new(()))
//!     .with_leader_election(&elector);
//! let mut controller = std::pin::pin!(controller);
//! while let Some(result) = controller.next().await {
//!     tracing::info!(?result, "reconciled");
//! }
//! // The term ended: exit, and let the next replica (or this one, restarted) lead.
//! tracing::warn!(lost = ?controller.lost(), "controller stopped");
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

mod config;
mod elector;
mod guard;
mod record;
mod stream;

pub use self::{
    config::Config,
    elector::LeaderElector,
    guard::{LeaseGuard, Lost},
    stream::WithLeaderElection,
};

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration breaks a rule of client-go's (see [`Config::validate`]).
    #[error("invalid leader election config: {0}")]
    InvalidConfig(&'static str),
    /// A request to the Lease API failed (the election logs it and retries).
    #[error("lease request failed: {0}")]
    Api(#[source] kube_client::Error),
    /// A request to the Lease API did not answer within the time left to the renew deadline.
    #[error("lease request timed out after {0:?}")]
    Timeout(Duration),
}

impl Error {
    /// Whether the API server answered `409 Conflict`: the Lease changed since it was read.
    fn is_conflict(&self) -> bool {
        matches!(self, Error::Api(kube_client::Error::Api(status)) if status.code == 409)
    }
}

#[cfg(test)] mod tests;
