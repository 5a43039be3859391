//! What a [`LeaseConfig`](crate::LeaseConfig) can get wrong.

use std::time::Duration;

/// A setting of [`LeaseConfig`](crate::LeaseConfig), as named in [`ConfigError`].
///
/// Non-exhaustive, as [`ConfigError`] is: a setting added later (and checked
/// by [`ConfigError::NotPositive`] or [`ConfigError::TooLong`]) breaks no
/// `match`, which needs an arm for the others:
///
/// ```compile_fail,E0004
/// use kube_runtime_lease::Field;
///
/// fn flag(field: Field) -> &'static str {
///     match field {
///         Field::LeaseDuration => "--lease-duration",
///         Field::RenewDeadline => "--renew-deadline",
///         Field::RetryPeriod => "--retry-period",
///         Field::ReleaseTimeout => "--release-timeout",
///     }
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Field {
    /// [`LeaseConfig::lease_duration`](crate::LeaseConfig::lease_duration).
    LeaseDuration,
    /// [`LeaseConfig::renew_deadline`](crate::LeaseConfig::renew_deadline).
    RenewDeadline,
    /// [`LeaseConfig::retry_period`](crate::LeaseConfig::retry_period).
    RetryPeriod,
    /// [`LeaseConfig::release_timeout`](crate::LeaseConfig::release_timeout).
    ReleaseTimeout,
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Field::LeaseDuration => "leaseDuration",
            Field::RenewDeadline => "renewDeadline",
            Field::RetryPeriod => "retryPeriod",
            Field::ReleaseTimeout => "releaseTimeout",
        })
    }
}

/// An invalid [`LeaseConfig`](crate::LeaseConfig): the field and the rule it breaks.
///
/// The first three messages are client-go's, word for word.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `lease_duration <= renew_deadline`.
    #[error("leaseDuration must be greater than renewDeadline")]
    LeaseDurationNotGreaterThanRenewDeadline,
    /// `renew_deadline <= retry_period * 1.2`.
    #[error("renewDeadline must be greater than retryPeriod*JitterFactor")]
    RenewDeadlineNotGreaterThanJitteredRetryPeriod,
    /// A duration is zero.
    #[error("{0} must be greater than zero")]
    NotPositive(Field),
    /// The identity is empty.
    #[error("Lock identity is empty")]
    EmptyIdentity,
    /// The lease duration is not whole seconds (the API's `leaseDurationSeconds` is an integer).
    #[error("leaseDuration must be whole seconds, got {0:?}")]
    LeaseDurationNotWholeSeconds(Duration),
    /// A duration is longer than the API's `int32` seconds allow.
    #[error("{field} must be at most {max:?}, got {value:?}")]
    TooLong {
        /// The setting.
        field: Field,
        /// The duration given.
        value: Duration,
        /// The longest allowed.
        max: Duration,
    },
    /// The lease duration does not fit the API's `int32` `leaseDurationSeconds`.
    #[error("leaseDuration must fit in int32 seconds, got {0:?}")]
    LeaseDurationTooLong(Duration),
    /// The namespace is not a DNS-1123 label.
    #[error("namespace {value:?} is not a valid DNS-1123 label: {rule}")]
    InvalidNamespace {
        /// The namespace given.
        value: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// A setting of Coordinated Leader Election
    /// ([`LeaseConfig::coordinated`](crate::LeaseConfig::coordinated)) the API
    /// server would refuse.
    #[cfg(feature = "coordinated")]
    #[error("coordinated leader election: {field} {value:?} is invalid: {rule}")]
    InvalidCoordinated {
        /// The `LeaseCandidate` field (`binaryVersion`, `emulationVersion`,
        /// `strategy`, or `identity` for its name).
        field: &'static str,
        /// The value given.
        value: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// The Lease name is not a DNS-1123 subdomain.
    #[error("lease name {value:?} is not a valid DNS-1123 subdomain: {rule}")]
    InvalidName {
        /// The name given.
        value: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// A label ([`LeaseConfig::label`](crate::LeaseConfig::label)) the API server would refuse.
    #[cfg(feature = "lease-metadata")]
    #[error("label {key:?}={value:?} is invalid: {rule}")]
    InvalidLabel {
        /// The key given.
        key: String,
        /// The value given.
        value: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// A sharded election ([`ShardConfig`](crate::shard::ShardConfig)) of no shards.
    #[cfg(feature = "unstable-shards")]
    #[error("a sharded election needs at least one shard")]
    NoShards,
    /// An annotation ([`LeaseConfig::annotation`](crate::LeaseConfig::annotation))
    /// the API server would refuse, or one under the key reserved for the
    /// fencing token.
    #[cfg(feature = "lease-metadata")]
    #[error("annotation {key:?} is invalid: {rule}")]
    InvalidAnnotation {
        /// The key given (empty when the annotations are too large together).
        key: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// The owner reference
    /// ([`LeaseConfig::owner_reference`](crate::LeaseConfig::owner_reference))
    /// lacks a field.
    #[cfg(feature = "lease-metadata")]
    #[error("owner reference: {field} must not be empty")]
    InvalidOwnerReference {
        /// The empty field: `apiVersion`, `kind`, `name` or `uid`.
        field: &'static str,
    },
}
