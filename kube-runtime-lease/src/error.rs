//! Errors of the election's API calls.

use std::time::Duration;

/// A failed call to the Lease API, or a stopped elector.
///
/// The elector itself never gives up on these: they are logged, retried with
/// backoff, and exposed here for [`LeaderElector::shutdown`](crate::LeaderElector::shutdown)
/// and for logs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading the Lease failed.
    #[error("failed to get lease")]
    GetLease(#[source] kube_client::Error),
    /// Creating the Lease failed.
    #[error("failed to create lease")]
    CreateLease(#[source] kube_client::Error),
    /// Replacing (acquiring, renewing or releasing) the Lease failed.
    #[error("failed to update lease")]
    ReplaceLease(#[source] kube_client::Error),
    /// A request did not answer within its bound.
    #[error("lease {verb} request timed out after {after:?}")]
    Timeout {
        /// The verb of the request (`get`, `create`, `update`).
        verb: &'static str,
        /// The bound it exceeded.
        after: Duration,
    },
    /// The Lease changed between our read and our write (HTTP 409).
    #[error("lease changed concurrently (conflict)")]
    Conflict,
    /// The elector has been shut down and no longer campaigns.
    #[error("the leader elector has been shut down")]
    Shutdown,
    /// The elector's background task stopped without a shutdown: its runtime
    /// shut down, or it panicked. Acquiring again starts a new task.
    #[error("the leader election task stopped (its runtime shut down, or it panicked)")]
    ElectorStopped,
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The HTTP status of the API's answer, if the API answered.
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            Error::GetLease(e) | Error::CreateLease(e) | Error::ReplaceLease(e) => match e {
                kube_client::Error::Api(s) => Some(s.code),
                _ => None,
            },
            Error::Conflict => Some(409),
            _ => None,
        }
    }

    /// The RBAC verb a 401/403 answer shows to be missing.
    pub(crate) fn forbidden_verb(&self) -> Option<&'static str> {
        if !matches!(self.status(), Some(401 | 403)) {
            return None;
        }
        match self {
            Error::GetLease(_) => Some("get"),
            Error::CreateLease(_) => Some("create"),
            Error::ReplaceLease(_) => Some("update"),
            _ => None,
        }
    }
}

/// Displays an error with its chain of sources, `a: b: c`, for log lines.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}
