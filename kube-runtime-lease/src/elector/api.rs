//! All of the election's Lease API I/O, in one small type: `get`, `create`,
//! `replace` (each bounded by the time its caller has left) and the watch.

use std::{future::Future, sync::Arc, time::Duration};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::{Api, api::PostParams};
use parking_lot::Mutex;
use tokio::time::Instant;

use super::task::WatchStream;
use crate::{
    error::{ApiError, Result},
    record::Wire,
};

/// The Lease named by the configuration, in its namespace (read leniently:
/// [`Wire`]).
pub(super) struct LeaseApi {
    pub(super) api: Api<Wire>,
    pub(super) name: String,
    pub(super) contact: Arc<Contact>,
    /// Held (cloned) by a read that outlived its bound for as long as it
    /// runs (see [`get`](Self::get)): dropped with it however it ends,
    /// also by a panic or its runtime's shutdown.
    pub(super) detached: Arc<()>,
}

/// How long a read that outlived its bound may still run in the background
/// (see [`LeaseApi::get`]): a credential plugin's usual worst (a cloud
/// provider's token service, slow) and more, not a dead connection's
/// (TCP's retransmissions: about 15 minutes).
const DETACHED_READ: Duration = Duration::from_secs(60);

/// When the API server last answered (see [`LeaderElector::contact_check`](crate::LeaderElector::contact_check)),
/// or the running election task started, if later: the silence is counted
/// from the start of the running task at the earliest.
#[derive(Default)]
pub(super) struct Contact(Mutex<Option<Instant>>);

impl Contact {
    /// The silence starts over now: the API server answered, or an election
    /// task starts talking to it (both happen in the one running task, in
    /// order).
    pub(super) fn reset(&self) {
        *self.0.lock() = Some(Instant::now());
    }

    /// How long since the API server last answered (or the running task
    /// started).
    pub(super) fn silence(&self) -> Duration {
        self.0.lock().map_or(Duration::ZERO, |t| t.elapsed())
    }
}

impl LeaseApi {
    /// Sends one Lease request of `verb` (failing with [`ApiError::Timeout`]
    /// once `bound` passed, and with `wrap(e)` when it fails), and notes an
    /// answer of the API server's own: an object, or a `Status` below 500 (a
    /// 5xx may come from a proxy in front of it, and a timeout or a
    /// connection error is no answer). A `2xx` that is not this Lease
    /// fails too ([`Wire::answer_for`]): kept as the term's object, it made
    /// every later renewal invalid.
    async fn request(
        &self,
        verb: &'static str,
        bound: Duration,
        fut: impl Future<Output = kube_client::Result<Wire>>,
        wrap: fn(kube_client::Error) -> ApiError,
    ) -> Result<Lease> {
        let result = bounded(bound, fut, wrap, || ApiError::Timeout { verb, after: bound }).await;
        let result = result.and_then(|wire| wire.answer_for(&self.name).map_err(wrap));
        match &result {
            Err(e) if e.status().is_none_or(|s| s >= 500) => {}
            _ => self.contact.reset(),
        }
        result.map(|Wire(lease)| lease)
    }

    /// Reads the Lease; `None` if it does not exist.
    ///
    /// Only the API server's own word counts as "does not exist": a `Status`
    /// with reason `NotFound` that names this Lease (`ApiError::is_gone`). Any other
    /// 404 (a plain-text answer from a proxy or load balancer in front of the
    /// API server, or an API group it does not serve yet) is an error, retried
    /// as any other: taking it for a deletion would end a term, or start a
    /// creation hold, on a Lease that was never deleted. (kube's `get_opt`
    /// takes any 404 for a missing object.)
    ///
    /// A read that outlives its bound is not dropped but left to finish in
    /// the background (one at a time, for [`DETACHED_READ`] at most): kube
    /// keeps a refreshed token only if the request that ran the credential
    /// plugin (`exec` in the kubeconfig) is still awaited when the plugin
    /// answers. Dropped at each bound, a plugin slower than the renew
    /// deadline was started again by every request and never answered one:
    /// the candidate never authenticated again. A read has no effect: its
    /// late answer is ignored.
    pub(super) async fn get(&self, bound: Duration) -> Result<Option<Lease>> {
        let (api, name) = (self.api.clone(), self.name.clone());
        let mut fut = Box::pin(async move { api.get(&name).await });
        let read = self.request("get", bound, &mut fut, ApiError::Get).await;
        if matches!(read, Err(ApiError::Timeout { .. })) && Arc::strong_count(&self.detached) == 1 {
            let detached = self.detached.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(DETACHED_READ, fut).await;
                drop(detached); // (Held however the task ends.)
            });
        }
        match read {
            Err(e) if e.is_gone(&self.name) => Ok(None),
            read => read.map(Some),
        }
    }

    /// Creates the Lease (`create` has no precondition: it fails with a
    /// conflict, 409, if the object exists).
    pub(super) async fn create(&self, lease: &Lease, bound: Duration) -> Result<Lease> {
        let (params, lease) = (PostParams::default(), Wire(lease.clone()));
        let create = self.api.create(&params, &lease);
        self.request("create", bound, create, ApiError::Create).await
    }

    /// Replaces the Lease, with the resourceVersion `lease` carries as the
    /// precondition: a lost race is a conflict, never a silent overwrite.
    pub(super) async fn replace(&self, lease: &Lease, bound: Duration) -> Result<Lease> {
        let (params, lease) = (PostParams::default(), Wire(lease.clone()));
        let replace = self.api.replace(&self.name, &params, &lease);
        self.request("update", bound, replace, ApiError::Replace).await
    }

    /// Watches the Lease (lazy: no request before it is first polled).
    pub(super) fn watch(&self) -> WatchStream {
        let contact = self.contact.clone();
        crate::lease_observer::watch(self.api.clone(), &self.name)
            .inspect_ok(move |_| contact.reset())
            .map_ok(|seen| seen.map(|w| w.0))
            .boxed()
    }
}

/// Runs one request, failing it with `timed_out()` once `bound` passed, and
/// with `wrap(e)` when it fails (the Lease's calls here, and any other
/// object's the elector writes).
pub(super) async fn bounded<T, E>(
    bound: Duration,
    fut: impl Future<Output = kube_client::Result<T>>,
    wrap: impl FnOnce(kube_client::Error) -> E,
    timed_out: impl FnOnce() -> E,
) -> std::result::Result<T, E> {
    match tokio::time::timeout(bound, fut).await {
        Err(_) => Err(timed_out()),
        Ok(r) => r.map_err(wrap),
    }
}
