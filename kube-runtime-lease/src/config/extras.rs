//! The extras' settings in a [`LeaseConfig`]: one field of it, with each
//! extra's part under that extra's feature, validated, budgeted and written
//! here. The core calls the three hooks below unconditionally; without the
//! extras' features the struct is empty and each hook does nothing, so the
//! `cfg`s stand here, at the definitions, and not at the core's calls.
//!
//! - `coordinated`: Coordinated Leader Election ([`Coordinated`],
//!   [`LeaseConfig::coordinated`]);
//! - `lease-metadata`: labels, annotations and an owner reference the
//!   candidate writes on the Lease ([`LeaseConfig::label`] and the others).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;

#[cfg(feature = "coordinated")]
pub(crate) mod coordinated;
#[cfg(feature = "lease-metadata")]
pub(crate) mod metadata;

#[cfg(feature = "coordinated")]
use self::coordinated::Coordinated;
use super::ConfigError;
#[cfg(doc)]
use super::LeaseConfig;

/// The extras' settings (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Extras {
    #[cfg(feature = "lease-metadata")]
    pub(crate) metadata: metadata::LeaseMetadata,
    #[cfg(feature = "coordinated")]
    pub(crate) coordinated: Option<Coordinated>,
}

// Every field compares fully (`OwnerReference`'s `PartialEq` included).
impl Eq for Extras {}

#[allow(
    clippy::unused_self,
    clippy::unnecessary_wraps,
    reason = "without the extras' features, each hook does nothing"
)]
impl Extras {
    /// The first rule the extras' settings break, for a candidate named
    /// `identity`.
    pub(crate) fn validate(&self, identity: &str) -> Result<(), ConfigError> {
        #[cfg(feature = "coordinated")]
        if let Some((field, value, rule)) = self.coordinated.as_ref().and_then(|c| c.check(identity)) {
            return Err(ConfigError::InvalidCoordinated { field, value, rule });
        }
        #[cfg(feature = "lease-metadata")]
        self.metadata.validate()?;
        #[cfg(not(feature = "coordinated"))]
        let _ = identity;
        Ok(())
    }

    /// The Lease a candidate writes to take it: `lease` with the configured
    /// labels, annotations and owner (`lease-metadata`), and, in Coordinated
    /// Leader Election, no `preferredHolder` (the API server marks the end of
    /// a term; a record it gives has none, and one taken back must not keep
    /// an old mark); the rest is kept.
    pub(crate) fn prepare(&self, lease: Lease) -> Lease {
        #[cfg(any(feature = "lease-metadata", feature = "coordinated"))]
        let mut lease = lease;
        #[cfg(feature = "lease-metadata")]
        self.metadata.apply(&mut lease.metadata);
        #[cfg(feature = "coordinated")]
        if let Some(spec) = lease.spec.as_mut().filter(|_| self.coordinated.is_some()) {
            spec.preferred_holder = None;
        }
        lease
    }

    /// The configured labels set again on `lease` before a renewal: a
    /// label someone removed or edited while this candidate holds the
    /// Lease comes back within a retry period (the sharded election selects
    /// its shard Leases by label: a Lease its watches no longer see cannot
    /// be judged, and a wrong count label kept its peers out).
    pub(crate) fn relabel(&self, lease: &mut Lease) {
        #[cfg(feature = "lease-metadata")]
        self.metadata.relabel(&mut lease.metadata);
        #[cfg(not(feature = "lease-metadata"))]
        let _ = lease;
    }

    /// What the extras add to the shutdown's worst case: the deletion of the
    /// `LeaseCandidate` with Coordinated Leader Election.
    pub(crate) fn shutdown_bound(&self) -> Duration {
        #[cfg(feature = "coordinated")]
        if self.coordinated.is_some() {
            return coordinated::REQUEST_BOUND;
        }
        Duration::ZERO
    }
}
