//! Lease-based leader election for kube-runtime controllers and streams.
#![forbid(unsafe_code)]

mod config;
mod elector;
mod error;
mod ext;
mod guard;
mod metrics;
mod record;
mod rejoin;
mod stream;

pub use config::{ConfigError, Field, LeaseConfig, unique_identity};
pub use elector::{Acquire, HealthError, LeaderElector, LeaderStatus};
pub use error::{Error, Result};
pub use ext::{ControllerWithLeaderElection, LeaderElectionControllerExt, LeaderElectionStreamExt};
pub use guard::{LeaseGuard, Lost};
#[cfg(feature = "metrics")]
pub use metrics::LeaseMetrics;
pub use stream::WithLeaderElection;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod simulation;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;
