//! The extras' settings in a [`LeaseConfig`]: one field of it, with each
//! extra's part under that extra's feature, validated and budgeted here.
//!
//! - `coordinated`: Coordinated Leader Election ([`Coordinated`],
//!   [`LeaseConfig::coordinated`]);
//! - `lease-metadata`: labels, annotations and an owner reference the
//!   candidate writes on the Lease ([`LeaseConfig::label`] and the others).

use std::time::Duration;

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
        let _ = identity; // read by the coordinated check only
        Ok(())
    }

    /// What the extras add to the shutdown's worst case: the deletion of the
    /// `LeaseCandidate` with Coordinated Leader Election.
    #[allow(clippy::unused_self, reason = "only the coordinated settings add to it")]
    pub(crate) fn shutdown_bound(&self) -> Duration {
        #[cfg(feature = "coordinated")]
        if self.coordinated.is_some() {
            return coordinated::REQUEST_BOUND;
        }
        Duration::ZERO
    }
}
