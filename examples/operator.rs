//! The whole operator pattern in one program: two controllers under one
//! Lease, a validating webhook served over HTTPS on every replica at all
//! times, probes, a leader gauge, rejoining the election in process after
//! any loss, and a SIGTERM sequence that loses no webhook request.
//!
//! ```sh
//! KUBECONFIG=... cargo run -p kube-runtime-lease-examples --example operator
//! ```
//!
//! # What runs
//! - **Two controllers under one elector**, reconciling only on the leader:
//!   `ConfigMaps` and `Secrets` labelled `operator.example.com/managed=true`
//!   (in `WATCH_NAMESPACE`, default every namespace). Each reconcile stamps
//!   the object with a checksum of its data (`operator.example.com/checksum`:
//!   the hash a Deployment's pod template carries to roll out on a config
//!   change), the replica that wrote it (`operator.example.com/reconciled-by`)
//!   and the term's fencing token (`operator.example.com/fencing-token`,
//!   with the Lease it counts on, `operator.example.com/fencing-lease`), in
//!   a merge patch carrying the `resourceVersion` it read, so that a write
//!   from an older term never lands after a newer one's (the crate docs'
//!   *Fencing*). Tokens are compared only with tokens of the same Lease:
//!   another Lease's (a renamed `LEASE_NAME`), or a stamp made with the
//!   election off (`LEADER_ELECT=false`: one replica, token 0), says nothing
//!   about this one's terms. One elector, one renewal loop: both controllers start when
//!   the Lease is won and stop when it is lost.
//! - **Rejoining after any loss**, in process: the controllers are built
//!   again for each term ([`LeaderElector::run_each_term`]); a replica that
//!   lost the Lease (taken over, renew deadline missed) campaigns again and
//!   keeps serving its webhook. Only a shutdown ends the election.
//! - **One HTTPS server on every replica** (`WEBHOOK_ADDR`, default
//!   `0.0.0.0:9443`, controller-runtime's webhook port), leader or not:
//!   - `POST /validate`: a validating admission webhook for `ConfigMaps`,
//!     denying one with a data key containing `password` (secrets belong in
//!     Secrets);
//!   - `GET /readyz`: 200 while the server takes new requests, 503 from
//!     SIGTERM on (the webhook's Service stops routing to this replica);
//!   - `GET /livez`: the elector's health (`probes::liveness`: a leader whose
//!     renewals are overdue, or a replica that has not heard from the API
//!     server for 5 minutes, is restarted);
//!   - `GET /metrics`: the elector's metrics (`LeaseMetrics`), among them the
//!     leader gauge `leader_election_is_leader` (1 while this replica leads,
//!     else 0; summed over the replicas it should be 1) and client-go's
//!     `leader_election_master_status`.
//!
//!   The certificate is read from `WEBHOOK_CERT` and `WEBHOOK_KEY` (PEM
//!   files, reloaded when they change: a deployment mounts the Secret that
//!   cert-manager renews, and gives the API server its CA as the webhook's
//!   `caBundle`); without them a self-signed certificate for `localhost` is
//!   made at start, for local runs only (see `https.rs`).
//!
//! # SIGTERM
//! Endpoints are removed asynchronously: when a pod is deleted, the kubelet's
//! SIGTERM and the removal of the pod from the webhook Service's endpoints
//! start at the same time, and the API server can send webhook requests to
//! this replica for a few seconds more. So, from SIGTERM on:
//!
//! 1. `/readyz` answers 503 at once;
//! 2. reconciling stops and the Lease is released
//!    ([`shutdown`](LeaderElector::shutdown)): the controllers take no new
//!    work, reconciles in flight get `SHUTDOWN_GRACE - WEBHOOK_DRAIN_TIMEOUT`
//!    (15 s with the defaults, `SHUTDOWN_GRACE` in seconds, default 20) to
//!    finish, then the Lease is released so that a standby takes
//!    over at once (if a reconcile had to be stopped, it is left to expire
//!    instead: requests it sent may still land); bounded by
//!    `shutdown_budget` of that grace;
//! 3. the webhook keeps serving, new connections included, until
//!    `WEBHOOK_DRAIN_DELAY` (default 5 s) has passed since SIGTERM (at the
//!    same time as step 2, not after it), each response with `Connection:
//!    close` (so that clients stop reusing connections to this replica
//!    before the drain closes them);
//! 4. the server drains: it stops accepting, lets requests in flight finish
//!    and closes each connection after its response, for up to
//!    `WEBHOOK_DRAIN_TIMEOUT` (default 5 s), then closes what is left;
//! 5. the process exits (0, or 1 if the release failed).
//!
//! Each step is logged with how long it took. Steps 2 and 3 end within
//! `max(shutdown_budget(SHUTDOWN_GRACE - WEBHOOK_DRAIN_TIMEOUT),
//! WEBHOOK_DRAIN_DELAY)` of SIGTERM and step 4 adds at most
//! `WEBHOOK_DRAIN_TIMEOUT`, so, the budget growing with the grace second for
//! second, the whole sequence fits
//! [`LeaseConfig::shutdown_budget`]`(SHUTDOWN_GRACE)` (47 s with the default
//! timings), the figure the pod's `terminationGracePeriodSeconds` must cover
//! (the Helm chart in `deploy/chart/` computes it from the same values, plus
//! a margin: 57 s with the defaults; `tests/tests/chart.rs` checks it). The program refuses, at
//! start, a drain delay and timeout that together exceed it. A second
//! SIGTERM (or Ctrl+C) exits at once, with status 1.
//!
//! # Choices, for readers coming from controller-runtime
//! - **The webhook serves on every replica**, as controller-runtime's
//!   webhook server does (its manager runs it without leader election):
//!   admission must not wait for an election, and `failurePolicy: Fail`
//!   would otherwise block writes during a handover. Validation here reads
//!   only the request; a webhook that needs the controllers' state must keep
//!   its own cache (a reflector) on every replica.
//! - **One port, HTTPS, for everything**: controller-runtime splits the
//!   webhook (9443), probes (8081, HTTP) and metrics (8443); here one
//!   listener and one certificate serve all four paths, so that the
//!   readiness probe (`scheme: HTTPS`; the kubelet does not verify
//!   certificates) goes through the TLS stack the API server uses.
//! - **Readiness drops at SIGTERM and the webhook keeps serving for a
//!   delay**, where controller-runtime users add a `preStop` sleep: it works
//!   without a shell in the image, and the delay is counted in the shutdown
//!   budget.
//! - **A loss is not a restart**: controller-runtime's manager exits when it
//!   loses the Lease (`OnStoppedLeading`), and the pod restarts; here the
//!   replica keeps serving its webhook and campaigns again, with a backoff.
//! - **The validating webhook is plain axum** (`kube::core::admission`), like
//!   kube-rs's `admission_controller` example: a malformed review is
//!   answered with an `invalid` response, as kube-rs does.
//!
//! `tests/tests/operator.rs` runs three replicas of it against a real API
//! server through a SIGTERM handover, a SIGKILL failover and a loss of the
//! Lease to another candidate, with webhook requests to every replica
//! without pause.
//!
//! Other settings, as for every example (see `common.rs`): `LEASE_NAMESPACE`,
//! `LEASE_NAME` (default `operator`), `IDENTITY`, `POD_NAME`, the timings.
//!
//! # Deploying it
//! The Helm chart `deploy/chart/` installs it: a Deployment (2 replicas, a
//! `PodDisruptionBudget`, the identity from the downward API, a restricted
//! security context), RBAC for exactly what it does (`get`, `create`,
//! `update`, `list`, `watch` on `leases`; `list`, `watch`, `patch` on
//! `ConfigMaps` and `Secrets`), the webhook's Service (443 to 9443) and
//! `ValidatingWebhookConfiguration` (`CREATE` and `UPDATE` of labelled
//! `configmaps`, `failurePolicy: Fail`, `sideEffects: None`), and its
//! certificate (generated by Helm, or given). `scripts/e2e.sh` installs it on
//! the real single-node cluster (`docs/real-cluster.md`).

use std::{
    collections::BTreeMap,
    fmt::Debug,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, bail};
use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{StatusCode, header},
    routing::{get, post},
};
use futures::{FutureExt as _, Stream, StreamExt as _};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::{NamespaceResourceScope, serde::de::DeserializeOwned};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview},
    runtime::{Controller, controller::Action, reflector::ObjectRef, watcher},
};
use kube_runtime_lease::{
    LeaderElectionControllerExt as _, LeaderElector, LeaseConfig, metrics::LeaseMetrics,
};
use kube_runtime_lease_examples::{
    client, env_seconds, error_policy, https, init_tracing, lease_config, probes, shutdown_grace,
    shutdown_signal,
};
use prometheus_client::registry::Registry;
use tokio::{net::TcpListener, sync::oneshot, time::Instant};
use tracing::{error, info, warn};

/// The label of the objects the controllers manage.
const MANAGED: &str = "operator.example.com/managed=true";
/// The annotations a reconcile writes.
const CHECKSUM: &str = "operator.example.com/checksum";
const RECONCILED_BY: &str = "operator.example.com/reconciled-by";
const FENCING_TOKEN: &str = "operator.example.com/fencing-token";
/// The Lease whose terms the stamped token counts (`<namespace>/<name>`), or
/// `none` when the election is off.
const FENCING_LEASE: &str = "operator.example.com/fencing-lease";

/// The settings of the shutdown sequence, from the environment.
#[derive(Clone, Copy, Debug)]
struct Shutdown {
    /// `WEBHOOK_DRAIN_DELAY`: how long the webhook keeps serving after SIGTERM.
    delay: Duration,
    /// `WEBHOOK_DRAIN_TIMEOUT`: how long the drain of its connections may take.
    drain: Duration,
    /// The grace of reconciles in flight: `SHUTDOWN_GRACE - drain`.
    grace: Duration,
    /// The whole sequence's bound: `shutdown_budget(SHUTDOWN_GRACE)`.
    budget: Duration,
}

impl Shutdown {
    fn from_env(config: &LeaseConfig) -> anyhow::Result<Self> {
        let delay = env_seconds("WEBHOOK_DRAIN_DELAY", 5.0)?;
        let drain = env_seconds("WEBHOOK_DRAIN_TIMEOUT", 5.0)?;
        let grace = shutdown_grace()?;
        // The crate's limit on every duration (`leaseDurationSeconds` is an
        // `int32`): beyond it, no clock adds the delay to SIGTERM's instant.
        let longest = Duration::from_secs(2_147_483_647);
        for (var, value) in [
            ("WEBHOOK_DRAIN_DELAY", delay),
            ("WEBHOOK_DRAIN_TIMEOUT", drain),
            ("SHUTDOWN_GRACE", grace),
        ] {
            if value > longest {
                bail!("{var} ({value:?}) is longer than {longest:?}");
            }
        }
        let budget = config.shutdown_budget(grace);
        if drain > grace {
            bail!("WEBHOOK_DRAIN_TIMEOUT ({drain:?}) is longer than the whole grace ({grace:?})");
        }
        if delay + drain > budget {
            bail!(
                "WEBHOOK_DRAIN_DELAY ({delay:?}) + WEBHOOK_DRAIN_TIMEOUT ({drain:?}) do not fit the shutdown budget ({budget:?})"
            );
        }
        Ok(Self {
            delay,
            drain,
            grace: grace.saturating_sub(drain),
            budget,
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let client = client().await?;
    let config = lease_config("operator")?;
    let shutdown = Shutdown::from_env(&config)?;
    let identity = config.identity().to_owned();
    info!(%identity, ?shutdown, "starting");
    let mut registry = Registry::default();
    let metrics = LeaseMetrics::register(&mut registry);
    let elector = LeaderElector::new(client.clone(), config)?.with_metrics(&metrics);

    // The webhook, probes and metrics: on every replica, until the drain.
    let draining = Arc::new(AtomicBool::new(false));
    let app = router(elector.clone(), draining.clone(), registry);
    let tls = https::server_config(
        match (std::env::var_os("WEBHOOK_CERT"), std::env::var_os("WEBHOOK_KEY")) {
            (Some(cert), Some(key)) => Some((cert.into(), key.into())),
            (None, None) => {
                warn!(
                    "no WEBHOOK_CERT and WEBHOOK_KEY: serving a self-signed certificate (for local runs only)"
                );
                None
            }
            _ => bail!("set both WEBHOOK_CERT and WEBHOOK_KEY, or neither"),
        },
    )?;
    let addr = std::env::var("WEBHOOK_ADDR").unwrap_or_else(|_| "0.0.0.0:9443".into());
    let listener = TcpListener::bind(&addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    info!(addr = %listener.local_addr()?, "serving /validate, /readyz, /livez and /metrics over HTTPS");
    let (stop_accepting, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(https::serve(
        listener,
        tls,
        app,
        stopped.map(drop),
        shutdown.drain,
    ));

    // The controllers: while leading, again after every loss, until shutdown.
    let namespace = std::env::var("WATCH_NAMESPACE").ok();
    let mut operator = tokio::spawn({
        let (elector, identity) = (elector.clone(), identity.clone());
        async move {
            elector
                .run_each_term(|| controllers(&client, namespace.as_deref(), &elector, &identity))
                .await
        }
    });

    let ended_early = tokio::select! {
        () = shutdown_signal() => {
            info!("SIGTERM: shutting down");
            false
        }
        ended = &mut operator => {
            error!(?ended, "the controllers stopped on their own; shutting down");
            true
        }
    };
    let signalled = Instant::now();
    tokio::spawn(async {
        shutdown_signal().await;
        error!("second signal: exiting at once");
        std::process::exit(1);
    });

    // 1. Not ready: the webhook's Service stops routing here.
    draining.store(true, Ordering::SeqCst);
    info!("step 1/4: /readyz answers 503");
    // 2. Stop reconciling, release the Lease.
    let handed_over = elector.shutdown(shutdown.grace).await;
    // `run_each_term` returned when the shutdown began (`RunEnded::Shutdown`).
    if !ended_early {
        let _ = operator.await;
    }
    match &handed_over {
        Ok(()) => info!(
            took = ?signalled.elapsed(),
            "step 2/4: reconciling stopped, election left (the Lease released if this replica held it)"
        ),
        Err(e) => error!(
            error = %e,
            took = ?signalled.elapsed(),
            "step 2/4: reconciling stopped, election left; the release failed (the Lease will expire)"
        ),
    }
    // 3. Keep serving until the endpoints are gone.
    tokio::time::sleep_until(signalled + shutdown.delay).await;
    info!(took = ?signalled.elapsed(), delay = ?shutdown.delay, "step 3/4: served the webhook for the drain delay");
    // 4. Drain.
    let _ = stop_accepting.send(());
    let drained = server.await?;
    info!(
        open = drained.open,
        cut = drained.cut,
        took = ?drained.took,
        "step 4/4: stopped accepting, connections drained"
    );
    info!(total = ?signalled.elapsed(), budget = ?shutdown.budget, "exiting");
    handed_over?;
    if ended_early {
        bail!("the controllers stopped on their own");
    }
    Ok(())
}

/// The HTTPS server's routes. From SIGTERM on (`draining`), every response
/// says `Connection: close`, and the server closes its connection after it:
/// a client (the API server) learns from the response itself not to reuse
/// that connection, instead of finding it closed under its next request when
/// the drain closes idle connections (an `EOF` for a request that is not
/// retried). Only connections left idle through the whole drain delay are
/// closed by the drain.
fn router(elector: LeaderElector, draining: Arc<AtomicBool>, registry: Registry) -> Router {
    let registry = Arc::new(registry);
    let closing = draining.clone();
    Router::new()
        .route("/validate", post(validate))
        .route(
            "/readyz",
            get(move || async move {
                if draining.load(Ordering::SeqCst) {
                    (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
                } else {
                    (StatusCode::OK, "ok\n")
                }
            }),
        )
        .route(
            "/livez",
            get(|State(elector): State<LeaderElector>| async move { probes::liveness(&elector) }),
        )
        .route(
            "/metrics",
            get(move || async move {
                let mut text = String::new();
                match prometheus_client::encoding::text::encode(&mut text, &registry) {
                    Ok(()) => (
                        StatusCode::OK,
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        text,
                    ),
                    Err(e) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        [(header::CONTENT_TYPE, "text/plain")],
                        e.to_string(),
                    ),
                }
            }),
        )
        .with_state(elector)
        .layer(tower::util::MapResponseLayer::new(
            move |mut response: axum::response::Response| {
                if closing.load(Ordering::SeqCst) {
                    response
                        .headers_mut()
                        .insert(header::CONNECTION, header::HeaderValue::from_static("close"));
                }
                response
            },
        ))
}

/// The validating webhook: denies a `ConfigMap` with a data key that
/// contains `password`.
async fn validate(body: Bytes) -> ([(header::HeaderName, &'static str); 1], Vec<u8>) {
    let response = match serde_json::from_slice::<AdmissionReview<ConfigMap>>(&body)
        .map_err(|e| e.to_string())
        .and_then(|review| {
            let request: Result<AdmissionRequest<ConfigMap>, _> = review.try_into();
            request.map_err(|e| e.to_string())
        }) {
        Ok(request) => review(&request),
        Err(e) => {
            warn!(error = %e, "malformed admission review");
            AdmissionResponse::invalid(e)
        }
    };
    let body = serde_json::to_vec(&response.into_review()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], body)
}

fn review(request: &AdmissionRequest<ConfigMap>) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let Some(cm) = &request.object else {
        return response;
    };
    let keys = cm.data.iter().flat_map(BTreeMap::keys);
    let binary = cm.binary_data.iter().flat_map(BTreeMap::keys);
    match keys
        .chain(binary)
        .find(|k| k.to_ascii_lowercase().contains("password"))
    {
        Some(key) => response.deny(format!(
            "data key {key:?} looks like a secret: put it in a Secret"
        )),
        None => response,
    }
}

/// Both controllers, for one term: a stream that ends when both have.
fn controllers(
    client: &Client,
    namespace: Option<&str>,
    elector: &LeaderElector,
    identity: &str,
) -> impl Stream<Item = ()> + use<> {
    futures::stream::select(
        controller::<ConfigMap>(client, namespace, elector, identity),
        controller::<Secret>(client, namespace, elector, identity),
    )
}

/// A controller of the managed objects of kind `K`.
fn controller<K>(
    client: &Client,
    namespace: Option<&str>,
    elector: &LeaderElector,
    identity: &str,
) -> impl Stream<Item = ()> + use<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Data
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let api = namespace.map_or_else(
        || Api::<K>::all(client.clone()),
        |ns| Api::namespaced(client.clone(), ns),
    );
    let (client, elector, identity) = (client.clone(), elector.clone(), identity.to_owned());
    Controller::new(api, watcher::Config::default().labels(MANAGED))
        // Wires `shutdown_requested` to `graceful_shutdown_on`: on SIGTERM,
        // reconciles in flight finish before the release.
        .with_leader_election(&elector)
        .run(
            move |object, _| reconcile(object, client.clone(), elector.clone(), identity.clone()),
            error_policy,
            Arc::new(()),
        )
        .map(|result| {
            if let Err(e) = result {
                warn!(error = %e, "controller error");
            }
        })
}

/// Stamps `object` with its checksum, this replica and the term's fencing
/// token, unless it already carries them (or a newer term's token).
async fn reconcile<K>(
    object: Arc<K>,
    client: Client,
    elector: LeaderElector,
    identity: String,
) -> Result<Action, kube::Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Data + Clone + Debug + DeserializeOwned,
{
    // The term this reconcile runs in: the Controller runs only while
    // leading, so the guard is there (a term that has just ended: skip).
    let Some(guard) = elector.current_guard() else {
        return Ok(Action::await_change());
    };
    let token = guard.fencing_token();
    let reference = ObjectRef::from_obj(&*object);
    info!(kind = %K::kind(&()), object = %reference, token, "reconcile started");
    let annotations = object.annotations();
    let checksum = object.checksum();
    // Tokens grow along one Lease's terms only: a token stamped under another
    // Lease (or with the election off) is no newer term of ours.
    let config = elector.config();
    let lease = if config.is_enabled() {
        format!("{}/{}", config.namespace(), config.name())
    } else {
        "none".to_owned()
    };
    let stored = (annotations.get(FENCING_LEASE) == Some(&lease))
        .then(|| annotations.get(FENCING_TOKEN).and_then(|t| t.parse::<i64>().ok()))
        .flatten();
    let outcome = if config.is_enabled() && stored.is_some_and(|stored| stored > token) {
        "fenced: a newer term wrote it"
    } else if stored == Some(token) && annotations.get(CHECKSUM) == Some(&checksum) {
        "unchanged"
    } else if !guard.is_valid() {
        "term ended"
    } else {
        let patch = serde_json::json!({
            "metadata": {
                // The precondition: a write from an older term that read an
                // older version fails with 409 instead of landing.
                "resourceVersion": object.resource_version(),
                "annotations": {
                    CHECKSUM: checksum,
                    RECONCILED_BY: identity,
                    FENCING_TOKEN: token.to_string(),
                    FENCING_LEASE: lease,
                },
            },
        });
        let api = Api::<K>::namespaced(client, &object.namespace().unwrap_or_default());
        match api
            .patch(&object.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => "stamped",
            // Changed since it was read: the watch brings the new version.
            Err(kube::Error::Api(status)) if status.code == 409 => "conflict",
            Err(e) => return Err(e),
        }
    };
    info!(kind = %K::kind(&()), object = %reference, token, outcome, "reconcile done");
    Ok(Action::await_change())
}

/// The data of a managed object, for its checksum.
trait Data {
    /// Key and value of each entry, in key order.
    fn entries(&self) -> Vec<(&str, &[u8])>;

    /// FNV-1a (64 bits) of the entries, in hex: stable across builds and
    /// toolchains (std's hasher is not).
    fn checksum(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for (key, value) in self.entries() {
            for byte in key.bytes().chain([0]).chain(value.iter().copied()).chain([0]) {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        format!("{hash:016x}")
    }
}

impl Data for ConfigMap {
    fn entries(&self) -> Vec<(&str, &[u8])> {
        let text = self
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_bytes()));
        let binary = self
            .binary_data
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.0.as_slice()));
        let mut entries: Vec<_> = text.chain(binary).collect();
        entries.sort_unstable();
        entries
    }
}

impl Data for Secret {
    fn entries(&self) -> Vec<(&str, &[u8])> {
        self.data
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.0.as_slice()))
            .collect()
    }
}
