//! Coordinated Leader Election's `LeaseCandidate` (see [`Coordinated`]): the
//! `coordination.k8s.io/v1beta1` `LeaseCandidate` this elector publishes
//! while its election task runs, the answers to the API server's pings, and
//! the fallback to the ordinary election where the API server does not serve
//! it.
//!
//! The object is handled as a `DynamicObject`: k8s-openapi has the type only
//! with a Kubernetes version feature of 1.33 or later, and the library does
//! not choose one for its users.

use std::{future::pending, time::Duration};

use backon::BackoffBuilder;
use futures::{FutureExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube_client::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams},
};
use kube_runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tracing::{debug, info, warn};

use super::Inner;
use crate::{
    config::{Coordinated, LeaseConfig},
    error::Chain,
    record,
};

/// How often `renewTime` is refreshed without a ping (client-go's
/// `requeueInterval`): the API server treats a `LeaseCandidate` not renewed for 15
/// minutes as a reason to re-elect, and collects it after 30.
const REFRESH: Duration = Duration::from_secs(300);
/// The bound of each request.
const BOUND: Duration = crate::config::coordinated::REQUEST_BOUND;

/// A failed request about the `LeaseCandidate`.
#[derive(Debug)]
enum CallError {
    Api(kube_client::Error),
    Timeout,
}

impl CallError {
    fn status(&self) -> Option<u16> {
        match self {
            CallError::Api(e) => crate::error::status_of(e),
            CallError::Timeout => None,
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Api(e) => write!(f, "{}", Chain(e)),
            CallError::Timeout => write!(f, "no answer within {BOUND:?}"),
        }
    }
}

async fn bounded<T>(fut: impl Future<Output = kube_client::Result<T>>) -> Result<T, CallError> {
    super::api::bounded(BOUND, fut, CallError::Api, || CallError::Timeout).await
}

/// Runs `elect` (a task campaigning and leading) with this elector's
/// `LeaseCandidate` published, for as long as `elect` runs, and deletes the
/// candidate before returning. The `LeaseCandidate` lives as long as the task
/// campaigns or leads. After a fallback (the API server does not serve
/// `LeaseCandidate`), later tasks do not ask again: one warning per elector.
pub(super) async fn while_published<T>(inner: &Inner, elect: impl Future<Output = T>) -> T {
    let fell_back = inner.lock().election == super::Election::Ordinary;
    let lease_candidate = inner
        .config
        .coordinated
        .as_ref()
        .filter(|_| !fell_back)
        .map(|c| LeaseCandidate::new(inner.api.client(), &inner.config, c));
    let keep_published = async {
        match &lease_candidate {
            Some(c) => c.run(inner).await,
            None => std::future::pending().await,
        }
    };
    let result = futures::select_biased! {
        result = elect.fuse() => result,
        () = keep_published.fuse() => unreachable!("the LeaseCandidate is kept until the task ends"),
    };
    // Only a published LeaseCandidate is deleted (none was, after a fallback).
    if let Some(lease_candidate) = &lease_candidate
        && inner.lock().election == super::Election::Coordinated
    {
        lease_candidate.delete().await;
    }
    result
}

/// This elector's `LeaseCandidate`.
pub(super) struct LeaseCandidate {
    api: Api<DynamicObject>,
    resource: ApiResource,
    name: String,
    namespace: String,
    lease: String,
    settings: Coordinated,
}

impl LeaseCandidate {
    pub(super) fn new(client: Client, config: &LeaseConfig, settings: &Coordinated) -> Self {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("coordination.k8s.io", "v1beta1", "LeaseCandidate"),
            "leasecandidates",
        );
        LeaseCandidate {
            api: Api::namespaced_with(client, &config.namespace, &resource),
            resource,
            name: config.identity.clone(),
            namespace: config.namespace.clone(),
            lease: config.name.clone(),
            settings: settings.clone(),
        }
    }

    /// The object to create: our settings, renewed now.
    fn object(&self) -> DynamicObject {
        let mut object = DynamicObject::new(&self.name, &self.resource)
            .within(&self.namespace)
            .data(json!({ "spec": {
                "leaseName": self.lease,
                "binaryVersion": self.settings.binary_version,
                "emulationVersion": self.settings.emulation_version,
                "strategy": self.settings.strategy,
            }}));
        set_renewed(&mut object);
        object
    }

    /// Publishes the `LeaseCandidate`, then keeps it: answers pings, refreshes it,
    /// re-creates it if it is deleted. Tells `inner` which election is in
    /// force once the first creation is answered. Never returns.
    pub(super) async fn run(&self, inner: &Inner) {
        let mut backoff = None;
        loop {
            match self.publish().await {
                Ok(()) => {
                    info!(lease_candidate = %self.name, "coordinated leader election: LeaseCandidate published");
                    inner.set_coordinated(true);
                    break;
                }
                Err(e) if e.status() == Some(404) => {
                    warn!(
                        error = %e,
                        "coordinated leader election: the API server does not serve coordination.k8s.io/v1beta1 \
                         LeaseCandidate (the CoordinatedLeaderElection feature gate is off): falling back to the \
                         ordinary election"
                    );
                    inner.set_coordinated(false);
                    return pending().await;
                }
                Err(e) => {
                    let delay = backoff
                        .get_or_insert_with(|| inner.config.retry_backoff().build())
                        .next()
                        .unwrap_or(inner.config.lease_duration);
                    if matches!(e.status(), Some(401 | 403)) {
                        warn!(
                            error = %e,
                            retry_in = ?delay,
                            "coordinated leader election: forbidden to publish the LeaseCandidate: RBAC needs verbs \
                             create, get, list, watch, update, delete on resource `leasecandidates` in API group \
                             `coordination.k8s.io`; this candidate cannot be elected until then"
                        );
                    } else {
                        warn!(error = %e, retry_in = ?delay, "coordinated leader election: publishing the LeaseCandidate failed");
                    }
                    tokio::time::sleep(delay).await;
                }
            }
        }
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let mut events = watcher(self.api.clone(), config).default_backoff().boxed();
        let mut refresh = tokio::time::interval_at(tokio::time::Instant::now() + REFRESH, REFRESH);
        loop {
            futures::select_biased! {
                event = events.next().fuse() => match event {
                    Some(Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object))) => {
                        if pinged(&object) {
                            debug!("coordinated leader election: pinged by the API server");
                            self.renew(object).await;
                        }
                    }
                    Some(Ok(watcher::Event::Delete(_))) => {
                        info!("coordinated leader election: the LeaseCandidate was deleted: publishing it again");
                        if let Err(e) = self.publish().await {
                            warn!(error = %e, "coordinated leader election: publishing the LeaseCandidate failed");
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => debug!(error = %Chain(&e), "coordinated leader election: watch of the LeaseCandidate failed"),
                    None => pending().await,
                },
                _ = refresh.tick().fuse() => {
                    match bounded(self.api.get_opt(&self.name)).await {
                        Ok(Some(object)) => self.renew(object).await,
                        Ok(None) => {
                            if let Err(e) = self.publish().await {
                                warn!(error = %e, "coordinated leader election: publishing the LeaseCandidate failed");
                            }
                        }
                        Err(e) => warn!(error = %e, "coordinated leader election: reading the LeaseCandidate failed"),
                    }
                }
            }
        }
    }

    /// Creates the `LeaseCandidate`, or renews the one that exists (ours from an
    /// earlier task or process: same name, same Lease).
    async fn publish(&self) -> Result<(), CallError> {
        match bounded(self.api.create(&PostParams::default(), &self.object())).await {
            Ok(_) => Ok(()),
            Err(e) if e.status() == Some(409) => match bounded(self.api.get_opt(&self.name)).await? {
                Some(mut existing) => {
                    // Ours now: our settings (an older binary of ours may
                    // have published other versions), renewed now.
                    if let Some(spec) = existing.data.get_mut("spec").and_then(|s| s.as_object_mut()) {
                        spec.insert("binaryVersion".into(), json!(self.settings.binary_version));
                        spec.insert("emulationVersion".into(), json!(self.settings.emulation_version));
                        spec.insert("strategy".into(), json!(self.settings.strategy));
                    }
                    set_renewed(&mut existing);
                    bounded(self.api.replace(&self.name, &PostParams::default(), &existing))
                        .await
                        .map(drop)
                }
                None => bounded(self.api.create(&PostParams::default(), &self.object()))
                    .await
                    .map(drop),
            },
            Err(e) => Err(e),
        }
    }

    /// Answers a ping (or refreshes): `renewTime` now, with the
    /// resourceVersion read; a conflict is retried once after a fresh read.
    async fn renew(&self, mut object: DynamicObject) {
        for attempt in 0..2 {
            set_renewed(&mut object);
            match bounded(self.api.replace(&self.name, &PostParams::default(), &object)).await {
                Ok(_) => return,
                Err(e) if e.status() == Some(409) && attempt == 0 => {
                    match bounded(self.api.get_opt(&self.name)).await {
                        Ok(Some(fresh)) => object = fresh,
                        _ => return,
                    }
                }
                Err(e) => {
                    warn!(error = %e, "coordinated leader election: renewing the LeaseCandidate failed");
                    return;
                }
            }
        }
    }

    /// Deletes the `LeaseCandidate` (the election task ends), bounded.
    pub(super) async fn delete(&self) {
        match bounded(self.api.delete(&self.name, &DeleteParams::default())).await {
            Ok(_) => debug!("coordinated leader election: LeaseCandidate deleted"),
            Err(e) if e.status() == Some(404) => {}
            Err(e) => warn!(error = %e, "coordinated leader election: deleting the LeaseCandidate failed"),
        }
    }
}

/// Sets `spec.renewTime` to now.
fn set_renewed(object: &mut DynamicObject) {
    if let Some(spec) = object.data.get_mut("spec").and_then(|s| s.as_object_mut()) {
        spec.insert(
            "renewTime".into(),
            serde_json::to_value(MicroTime(record::now())).unwrap_or_default(),
        );
    }
}

/// Whether the API server pinged the `LeaseCandidate`: `pingTime` after `renewTime`
/// (or no `renewTime` at all).
fn pinged(object: &DynamicObject) -> bool {
    let time = |field: &str| {
        object
            .data
            .get("spec")
            .and_then(|s| s.get(field))
            .and_then(|v| serde_json::from_value::<MicroTime>(v.clone()).ok())
            .map(|t| t.0)
    };
    match (time("pingTime"), time("renewTime")) {
        (Some(ping), Some(renew)) => ping > renew,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

#[cfg(test)]
mod tests;
