//! A Controller with several replicas, of which exactly one reconciles: the replicas campaign for a
//! `coordination.k8s.io/v1` Lease with the third-party crate `kube-runtime-lease` (which follows
//! client-go's leader election protocol), and only the replica that holds the Lease runs the Controller.
//! The others stand by, ready to take over.
//!
//! Run it in two or three terminals against the same cluster; the first one creates the Lease and leads
//! (a Lease it creates is held one lease duration, 15s, before anyone leads on it), the others stand by:
//!
//! ```sh
//! cargo run --example lease_controller
//! kubectl create configmap lease-demo --from-literal=key=value
//! kubectl label configmap lease-demo lease-example=true
//! ```
//!
//! Only the leader reconciles the labelled ConfigMaps; it stamps each with its identity and its term's
//! fencing token. Stop the leader with Ctrl+C (or SIGTERM, as Kubernetes does in a rollout) and it
//! finishes the reconciles in flight, releases the Lease, and a standby takes over at once. Kill it with
//! SIGKILL and a standby takes over once the Lease expires (the lease duration, 15s).
//!
//! In a cluster, run it as a Deployment with `replicas: 2` or more, set `POD_NAME` and `POD_NAMESPACE`
//! from the downward API, and give its service account `get`, `create`, `update`, `list` and `watch` on
//! `leases` (group `coordination.k8s.io`) in that namespace, beside `list`, `watch` and `patch` on
//! `configmaps`, and a `terminationGracePeriodSeconds` of at least the shutdown budget it logs at start.
use std::{collections::BTreeMap, sync::Arc};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Client, ResourceExt,
    api::{Api, ObjectMeta, Patch, PatchParams},
    runtime::{
        controller::{Action, Controller},
        watcher,
    },
};
use kube_runtime_lease::{LeaderElectionControllerExt, LeaderElector, LeaseConfig, Lost, unique_identity};
use thiserror::Error;
use tokio::{
    signal::unix::{SignalKind, signal},
    time::Duration,
};
use tracing::*;

/// The Lease all replicas campaign for: one per controller, in the namespace the pods run in
const LEASE_NAME: &str = "lease-controller-example";
/// How long reconciles in flight may run on after SIGTERM before the Lease is released anyway
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

#[derive(Debug, Error)]
enum Error {
    #[error("Failed to patch ConfigMap: {0}")]
    ConfigMapPatchFailed(#[source] kube::Error),
    #[error("MissingObjectKey: {0}")]
    MissingObjectKey(&'static str),
}

// Data we want access to in error/reconcile calls
struct Data {
    client: Client,
    elector: LeaderElector,
}

/// Runs only on the replica that holds the Lease: the Controller is not polled before the Lease is won,
/// and it is dropped (aborting reconciles at their next `.await`) the moment the Lease is lost
async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Data>) -> Result<Action, Error> {
    let namespace = cm
        .namespace()
        .ok_or_else(|| Error::MissingObjectKey(".metadata.namespace"))?;
    // The term in force. None once a shutdown has begun: take no new work then
    let Some(term) = ctx.elector.current_guard() else {
        return Ok(Action::await_change());
    };
    // The fencing token grows with every term: readers can reject writes of an older leader
    let annotations = BTreeMap::from([
        (
            "lease-example.kube.rs/leader".to_string(),
            ctx.elector.config().identity().to_string(),
        ),
        (
            "lease-example.kube.rs/term".to_string(),
            term.fencing_token().to_string(),
        ),
    ]);
    drop(term);
    let patch = ConfigMap {
        metadata: ObjectMeta {
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(ctx.client.clone(), &namespace)
        .patch(&cm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::ConfigMapPatchFailed)?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// The controller triggers this on reconcile errors
fn error_policy(_object: Arc<ConfigMap>, error: &Error, _ctx: Arc<Data>) -> Action {
    match error {
        Error::ConfigMapPatchFailed(e) => warn!("patch failed: {e:?}"),
        Error::MissingObjectKey(s) => warn!("missing key {s}"),
    }
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt::init();
    let client = Client::try_default().await?;

    // One identity per process: unique_identity() is $POD_NAME (else $HOSTNAME) plus a random suffix, so
    // that a restarted container whose previous instance still holds the Lease is another candidate
    let namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "default".into());
    let config = LeaseConfig::new(&namespace, LEASE_NAME, unique_identity())
        // client-go's defaults, spelled out: a crashed leader is replaced one lease duration after its
        // last renewal; a leader that cannot renew within the renew deadline stops reconciling
        .lease_duration(Duration::from_secs(15))
        .renew_deadline(Duration::from_secs(10))
        .retry_period(Duration::from_secs(2));
    info!(
        "{} campaigning for Lease {namespace}/{LEASE_NAME}; shutdown takes at most {:?}",
        config.identity(),
        config.shutdown_budget(SHUTDOWN_GRACE)
    );
    // Validates the config; the election itself starts in the background when the Controller is polled
    let elector = LeaderElector::new(client.clone(), config)?;

    // Log every change of leader: the replica is ready either way (leading or standing by)
    let mut status = elector.subscribe();
    let me = elector.config().identity().to_string();
    tokio::spawn(async move {
        while status.changed().await.is_ok() {
            let now = status.borrow_and_update().clone();
            match (now.is_leader, now.holder) {
                (true, _) => info!("leading: this replica reconciles"),
                (false, Some(holder)) if holder == me => info!("holding the new Lease before leading"),
                (false, Some(holder)) => info!("standing by: {holder} leads"),
                (false, None) => info!("standing by: no leader yet"),
            }
        }
    });

    // SIGTERM (a rollout, a drain) or Ctrl+C: the Controller takes no new work, reconciles in flight
    // finish (up to SHUTDOWN_GRACE), then the Lease is released so that a standby takes over at once
    let mut sigterm = signal(SignalKind::terminate())?;
    let handover = tokio::spawn({
        let elector = elector.clone();
        async move {
            tokio::select! {
                _ = sigterm.recv() => info!("SIGTERM: handing over"),
                _ = tokio::signal::ctrl_c() => info!("Ctrl+C: handing over"),
            }
            elector.shutdown(SHUTDOWN_GRACE).await
        }
    });

    let cms = Api::<ConfigMap>::all(client.clone());
    let wc = watcher::Config::default().labels("lease-example=true");
    let data = Arc::new(Data {
        client,
        elector: elector.clone(),
    });
    // Not polled before the Lease is won; dropped, with its watches and cache, when it is lost
    let controller = Controller::new(cms, wc).with_leader_election(&elector);
    // Pinned rather than consumed by for_each: we ask it afterwards why it ended
    let mut controller = std::pin::pin!(controller.run(reconcile, error_policy, data));
    while let Some(res) = controller.next().await {
        match res {
            Ok(o) => info!("reconciled {:?}", o),
            Err(e) => warn!("reconcile failed: {}", e),
        }
    }

    match controller.lost() {
        // Shut down: the Controller drained and the Lease was released, or its grace ran out and the
        // Lease is left to expire (reconciles cut short may still have writes in flight)
        None | Some(Lost::Shutdown) => {
            handover.await??;
            info!("controller terminated, leadership ended");
            Ok(())
        }
        // Leadership lost (renew deadline passed, taken over, Lease deleted): exit non-zero, so that the
        // pod restarts and campaigns again with a fresh Controller and cache
        Some(lost) => {
            error!("controller stopped: {lost}");
            Err(lost.into())
        }
    }
}
