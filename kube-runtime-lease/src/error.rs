//! The errors of the public API, one type per function that can fail:
//! [`AcquireError`] for [`LeaderElector::acquire`](crate::LeaderElector::acquire),
//! [`ShutdownError`] for [`LeaderElector::shutdown`](crate::LeaderElector::shutdown),
//! and [`ApiError`], a failed call to the Lease API, the source of a failed
//! release (and of the election's log lines). As kube's own errors do
//! (kube-rs/kube#2021), each message prints its source after a colon.

use std::time::Duration;

/// Why [`LeaderElector::acquire`](crate::LeaderElector::acquire) returned no
/// guard. API failures are not among them: the election logs and retries
/// those (an unreachable API server means waiting, never leading).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// [`LeaderElector::shutdown`](crate::LeaderElector::shutdown) was
    /// called: the elector no longer campaigns.
    #[error("the leader elector has been shut down")]
    Shutdown,
    /// The elector's background task stopped while this waited: the runtime
    /// it was spawned on shut down, or it panicked. Acquiring again starts a
    /// new task.
    #[error("the leader election task stopped (its runtime shut down, or it panicked)")]
    ElectorStopped,
}

/// Why [`LeaderElector::shutdown`](crate::LeaderElector::shutdown) did not hand
/// leadership over cleanly. Leadership has ended either way; an unreleased
/// Lease expires after its lease duration, as after a crash.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShutdownError {
    /// Releasing the Lease failed.
    #[error("failed to release the lease: {0}")]
    Release(#[source] ApiError),
    /// The election task did not end within `after` (its runtime is no longer
    /// driven). It ends when its runtime is driven again, with no write but
    /// the release, or is dropped with it; the Lease, no longer renewed,
    /// expires.
    #[error("the leader election task did not end within {after:?}")]
    TaskDidNotEnd {
        /// How long shutdown waited for it.
        after: Duration,
    },
}

/// A failed call to the Lease API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// Reading the Lease failed.
    #[error("failed to get lease: {0}")]
    Get(#[source] kube_client::Error),
    /// Creating the Lease failed.
    #[error("failed to create lease: {0}")]
    Create(#[source] kube_client::Error),
    /// Replacing (acquiring, renewing or releasing) the Lease failed, also
    /// when the Lease changed between our read and our write (HTTP 409).
    #[error("failed to update lease: {0}")]
    Replace(#[source] kube_client::Error),
    /// A request did not answer within its bound.
    #[error("lease {verb} request timed out after {after:?}")]
    Timeout {
        /// The verb of the request (`get`, `create`, `update`).
        verb: &'static str,
        /// The bound it exceeded.
        after: Duration,
    },
}

/// The HTTP status of a client error, if the API answered.
pub(crate) fn status_of(e: &kube_client::Error) -> Option<u16> {
    match e {
        kube_client::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// Whether `e` is the API server's authorization refusing a request: a 403
/// with no cause whose message is authorization's, `<resource> ["<name>"] is
/// forbidden: User "<user>" cannot <verb> resource ...` (a missing RBAC rule).
/// Admission refuses with 403 too, and none of its refusals reads so (a
/// create in a namespace being terminated carries the cause
/// `NamespaceTerminating`; a webhook or an admission policy "denied the
/// request"; a `ResourceQuota` says "exceeded quota" or "status unknown for
/// quota", with no cause); and a 401 refuses the client's credentials: no
/// RBAC rule lets those through. Nor is a refused impersonation (`User "<user>"
/// cannot impersonate resource "users"`, or with constrained impersonation
/// `cannot impersonate-on:user-info:get resource "leases"`): the
/// client's own identity may not act as the one its stack names
/// (`Impersonate-User`), and no verb of this request is missing.
pub(crate) fn refused_by_rbac(e: &kube_client::Error) -> bool {
    matches!(e, kube_client::Error::Api(s) if s.code == 403
        && s.details.as_ref().is_none_or(|d| d.causes.is_empty())
        && s.message
            .split_once(" is forbidden: User \"")
            .is_some_and(|(_, rest)| rest.contains("\" cannot ") && !rest.contains("\" cannot impersonate")))
}

/// Whether the API server answered that the Lease `name` does not exist: a
/// `Status` with reason `NotFound` whose details name that Lease (see
/// `LeaseApi::get`); not any 404, as kube's `get_opt` takes it.
pub(crate) fn lease_gone(e: &kube_client::Error, name: &str) -> bool {
    matches!(e, kube_client::Error::Api(status) if status.reason == "NotFound"
        && matches!(&status.details, Some(d) if d.name == name && d.kind == "leases"))
}

/// The HTTP status a watch failed with, if the API answered (its list, its
/// start, or an error event).
pub(crate) fn watch_status(e: &kube_runtime::watcher::Error) -> Option<u16> {
    use kube_runtime::watcher::Error as E;
    match e {
        E::InitialListFailed(e) | E::WatchStartFailed(e) | E::WatchFailed(e) => status_of(e),
        E::WatchError(s) => Some(s.code),
        E::NoResourceVersion => None,
    }
}

/// Whether a watch failed as authorization refuses it (its list, its start,
/// or an error event; see [`refused_by_rbac`]).
pub(crate) fn watch_refused_by_rbac(e: &kube_runtime::watcher::Error) -> bool {
    use kube_runtime::watcher::Error as E;
    match e {
        E::InitialListFailed(e) | E::WatchStartFailed(e) | E::WatchFailed(e) => refused_by_rbac(e),
        E::WatchError(s) => refused_by_rbac(&kube_client::Error::Api(s.clone())),
        E::NoResourceVersion => false,
    }
}

/// `Result` of the election's API calls.
pub(crate) type Result<T, E = ApiError> = std::result::Result<T, E>;

impl ApiError {
    /// The HTTP status of the API's answer, if the API answered.
    #[must_use]
    pub fn status(&self) -> Option<u16> {
        self.client_error().and_then(|(_, e)| status_of(e))
    }

    /// The RBAC verb of the request and the client's error, unless the
    /// request timed out.
    fn client_error(&self) -> Option<(&'static str, &kube_client::Error)> {
        match self {
            ApiError::Get(e) => Some(("get", e)),
            ApiError::Create(e) => Some(("create", e)),
            ApiError::Replace(e) => Some(("update", e)),
            ApiError::Timeout { .. } => None,
        }
    }

    /// Whether the API server answered that the Lease `name` does not exist
    /// (see `LeaseApi::get`): not merely any 404, but reason `NotFound`, with
    /// details naming that Lease (the API server always fills them in for an
    /// object it looked up).
    pub(crate) fn is_gone(&self, name: &str) -> bool {
        self.client_error().is_some_and(|(_, e)| lease_gone(e, name))
    }

    /// Whether someone else wrote first: a `replace` whose resourceVersion was
    /// outdated, or a `create` of a Lease that exists (both HTTP 409).
    pub(crate) fn is_conflict(&self) -> bool {
        self.status() == Some(409)
    }

    /// The RBAC verb a refusal of the API server's authorization shows to be
    /// missing (see [`refused_by_rbac`]).
    pub(crate) fn forbidden_verb(&self) -> Option<&'static str> {
        let (verb, e) = self.client_error()?;
        refused_by_rbac(e).then_some(verb)
    }
}

/// Displays an error with its chain of sources, `a: b: c`, for log lines.
///
/// A source whose message the text so far already holds is left out: this
/// crate's errors and kube's print their source themselves (kube-rs#2021),
/// others do not, and a line names each error once either way.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = self.0.to_string();
        for message in std::iter::successors(self.0.source(), |e| e.source()).map(ToString::to_string) {
            if !text.contains(&message) {
                text = format!("{text}: {message}");
            }
        }
        f.write_str(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::{ApiError, Chain, refused_by_rbac};

    /// An error that does not print its source.
    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    /// A log line names each error of the chain once, whether an error prints
    /// its source itself (as kube's do) or not. A log line once showed a 429
    /// three times.
    #[test]
    fn a_chain_prints_each_message_once() {
        let status = kube_client::core::Status::failure(
            "Too many requests, please try again later.",
            "TooManyRequests",
        )
        .with_code(429);
        let error = ApiError::Replace(kube_client::Error::Api(Box::new(status)));
        let line = Chain(&error).to_string();
        // Both sources are in the error's own message already: nothing is added.
        assert_eq!(line, error.to_string());
        assert!(
            line.starts_with("failed to update lease: ApiError: Too many requests"),
            "{line}"
        );

        // A source that its parent does not print is still shown.
        let line = Chain(&Outer(std::io::Error::other("inner"))).to_string();
        assert_eq!(line, "outer: inner");
    }

    /// Only authorization's 403 is an RBAC matter: admission's (a namespace
    /// being deleted names its cause; a webhook denied the request) and a
    /// 401 (credentials) are not.
    #[test]
    fn only_authorizations_403_is_taken_for_a_missing_rbac_rule() {
        let status = |code: u16, message: &str, cause: Option<&str>| {
            let mut status = kube_client::core::Status::failure(message, "Forbidden").with_code(code);
            if let Some(reason) = cause {
                let details = serde_json::json!({ "causes": [{ "reason": reason }] });
                status = status.with_details(serde_json::from_value(details).unwrap());
            }
            kube_client::Error::Api(Box::new(status))
        };
        let rbac = r#"leases.coordination.k8s.io "l" is forbidden: User "u" cannot update resource "leases""#;
        assert!(refused_by_rbac(&status(403, rbac, None)));
        let terminating = "unable to create new content in namespace ns because it is being terminated";
        assert!(!refused_by_rbac(&status(
            403,
            terminating,
            Some("NamespaceTerminating")
        )));
        let webhook = r#"admission webhook "w" denied the request: no"#;
        assert!(!refused_by_rbac(&status(403, webhook, None)));
        assert!(!refused_by_rbac(&status(401, "Unauthorized", None)));
        let error = ApiError::Replace(status(403, rbac, None));
        assert_eq!(error.forbidden_verb(), Some("update"));
    }

    /// Admission's 403s that name no cause and deny
    /// nothing in words are not authorization's either: a `ResourceQuota` on
    /// `count/leases.coordination.k8s.io` (before it is counted, and at its
    /// limit), `OwnerReferencesPermissionEnforcement` (which quotes an
    /// authorization of another request: no verb of this one is missing) and
    /// a validating admission policy. A list or watch refused by RBAC (no
    /// name) still is.
    #[test]
    fn admissions_403_without_a_cause_is_not_taken_for_a_missing_rbac_rule() {
        let forbidden = |message: &str| {
            let status = kube_client::core::Status::failure(message, "Forbidden").with_code(403);
            kube_client::Error::Api(Box::new(status))
        };
        let count = "count/leases.coordination.k8s.io";
        for message in [
            format!(r#"leases.coordination.k8s.io "l" is forbidden: status unknown for quota: q, resources: {count}"#),
            format!(
                r#"leases.coordination.k8s.io "l" is forbidden: exceeded quota: q, requested: {count}=1, used: {count}=1, limited: {count}=1"#
            ),
            r#"leases.coordination.k8s.io "l" is forbidden: cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on: , <nil>"#.to_owned(),
            r#"leases.coordination.k8s.io "l" is forbidden: cannot set an ownerRef on a resource you can't delete: , <nil>"#.to_owned(),
            r#"leases.coordination.k8s.io "l" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no"#.to_owned(),
        ] {
            assert!(!refused_by_rbac(&forbidden(&message)), "{message}");
            assert_eq!(ApiError::Create(forbidden(&message)).forbidden_verb(), None, "{message}");
        }
        let list = r#"leases.coordination.k8s.io is forbidden: User "system:serviceaccount:ns:sa" cannot list resource "leases" in API group "coordination.k8s.io" in the namespace "ns""#;
        assert!(refused_by_rbac(&forbidden(list)));
    }

    /// A Client that impersonates (`Impersonate-User` from the kubeconfig's
    /// `as:`, `Config::headers` or a layer of the user's) while its own
    /// identity may not: the API server refuses every request with
    /// authorization's 403 about `impersonate` on `users`, `groups` or
    /// `serviceaccounts` (or, with constrained impersonation, an
    /// `impersonate:<mode>` verb), not about the Lease: no verb on `leases`
    /// is missing, and the line must not send the user to grant one.
    #[test]
    fn a_refused_impersonation_is_not_taken_for_a_missing_lease_verb() {
        let forbidden = |message: &str| {
            let status = kube_client::core::Status::failure(message, "Forbidden").with_code(403);
            kube_client::Error::Api(Box::new(status))
        };
        for message in [
            r#"users "someone" is forbidden: User "system:serviceaccount:ns:sa" cannot impersonate resource "users" in API group "" at the cluster scope"#,
            r#"groups "g" is forbidden: User "me" cannot impersonate resource "groups" in API group "" at the cluster scope"#,
            r#"serviceaccounts "sa" is forbidden: User "me" cannot impersonate resource "serviceaccounts" in API group "" in the namespace "ns""#,
            r#"users "someone" is forbidden: User "me" cannot impersonate:user-info resource "users" in API group "" at the cluster scope"#,
            // Kubernetes 1.37 (constrained impersonation), as the real API
            // server answers (`tests/tests/api.rs`): the Lease named, the
            // verb impersonation's.
            r#"leases.coordination.k8s.io "lease" is forbidden: User "system:serviceaccount:ns:elector" cannot impersonate-on:user-info:get resource "leases" in API group "coordination.k8s.io" in the namespace "ns""#,
        ] {
            assert!(!refused_by_rbac(&forbidden(message)), "{message}");
            assert_eq!(
                ApiError::Replace(forbidden(message)).forbidden_verb(),
                None,
                "{message}"
            );
        }
    }
}
