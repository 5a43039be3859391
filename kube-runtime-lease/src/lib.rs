//! Lease-based leader election for kube-runtime controllers and streams.
#![forbid(unsafe_code)]

mod config;
mod elector;
mod error;
mod guard;
mod metrics;
mod record;

pub use config::{ConfigError, Field, LeaseConfig, unique_identity};
pub use elector::{Acquire, HealthError, LeaderElector, LeaderStatus};
pub use error::{Error, Result};
pub use guard::{LeaseGuard, Lost};

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;
