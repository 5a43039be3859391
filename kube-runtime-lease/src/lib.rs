//! Lease-based leader election for [kube-runtime] controllers and streams.
//!
//! Run several replicas of a controller (behind a PodDisruptionBudget) and let
//! exactly one of them reconcile: the replicas campaign for a
//! `coordination.k8s.io/v1` Lease with [client-go's `leaderelection`
//! protocol][client-go], so Rust and Go candidates honour each other, and the
//! guarded work runs only while its replica leads.
//!
//! # Quick start
//! ```no_run
//! use std::{sync::Arc, time::Duration};
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_client::{Api, Client};
//! use kube_runtime::{Controller, controller::Action, watcher};
//! use kube_runtime_lease::{LeaderElectionControllerExt, LeaderElector, LeaseConfig, unique_identity};
//!
//! # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::try_default().await?;
//! // One elector per Lease; the identity must be unique per process.
//! let elector = LeaderElector::new(
//!     client.clone(),
//!     LeaseConfig::new("my-namespace", "my-controller", unique_identity()),
//! )?;
//! // On SIGTERM: finish reconciles in flight (up to 20 s), release, so that a
//! // standby takes over at once.
//! let on_sigterm = elector.clone();
//! tokio::spawn(async move {
//!     tokio::signal::ctrl_c().await.ok();
//!     on_sigterm.shutdown(Duration::from_secs(20)).await
//! });
//! Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
//!     .with_leader_election(&elector)
//!     .run(
//!         |_cm, _ctx| async { Ok::<_, kube_client::Error>(Action::await_change()) },
//!         |_cm, _err, _ctx| Action::requeue(Duration::from_secs(5)),
//!         Arc::new(()),
//!     )
//!     .for_each(|_| async {})
//!     .await;
//! # Ok(())
//! # }
//! ```
//!
//! - [`LeaderElector`] campaigns for one Lease in a background task: one
//!   renewal loop per Lease, shared by every stream and guard given it.
//! - [`LeaderElectionControllerExt::with_leader_election`] and
//!   [`LeaderElectionStreamExt::with_leader_election`] guard a
//!   [`Controller`](kube_runtime::Controller) or any [`Stream`](futures::Stream):
//!   not polled before the Lease is won, dropped the moment it is lost.
//! - [`LeaderElector::acquire`] returns a [`LeaseGuard`], a future resolving to
//!   [`Lost`] when the term ends, with fencing helpers.
//! - [`LeaderElector::run_each_term`] rejoins the election after a loss.
//! - [`LeaderElector::status`], [`subscribe`](LeaderElector::subscribe) and
//!   [`health_check`](LeaderElector::health_check) show who leads; with the
//!   `metrics` feature, `LeaseMetrics` exports Prometheus metrics.
//!
//! # RBAC
//! The candidates' service account needs, in the Lease's namespace:
//! ```yaml
//! apiVersion: rbac.authorization.k8s.io/v1
//! kind: Role
//! metadata: { name: my-controller-leader-election, namespace: my-namespace }
//! rules:
//!   - apiGroups: ["coordination.k8s.io"]
//!     resources: ["leases"]
//!     verbs: ["get", "create", "update", "list", "watch"]
//! ```
//! `get`, `create` and `update` are required; `list` and `watch` make the
//! election watch-driven (see [`LeaseConfig::watch`]); without them it polls,
//! with one warning. A missing verb is logged with the rule to add.
//!
//! # Timings
//! Defaults are client-go's: 15 s lease duration, 10 s renew deadline, 2 s
//! retry period. The lease duration bounds the downtime after a crash (a
//! standby takes over that long after it last saw the Lease change); a
//! graceful handover (SIGTERM, [`LeaderElector::shutdown`]) takes one watch
//! event and one write. The gap between lease duration and renew deadline is
//! the safety margin: it absorbs differences in clock *rate* between nodes
//! (tolerated skew about lease duration / renew deadline) and the time it
//! takes to stop guarded work. Clock *offsets* do not matter: expiry is judged
//! on each candidate's own monotonic clock, never from `renewTime`.
//!
//! ## Handover latency and `TCP_NODELAY`
//! A follower's watch holds its client's one pooled HTTP/1.1 connection, so
//! the write that takes a released Lease goes out on a new connection. kube
//! 5's default [`Client`](kube_client::Client) leaves `TCP_NODELAY` off
//! (hyper-util's default; [kube-rs/kube#2056]), and that first request then
//! waits for a delayed ACK of the TLS handshake: about 40 ms on Linux, against
//! about 4 ms for the whole handover with `TCP_NODELAY` on (as Go, and so
//! client-go, always has it; measured in the repository's `BENCHMARKS.md`).
//! This crate uses the client it is given and does not change it; where those
//! 40 ms matter, build the client from an `HttpConnector` with
//! `set_nodelay(true)`, as the repository's `examples/common.rs` does. Safety
//! does not depend on it.
//!
//! # Choices this crate makes (where client-go is silent or unsafe)
//! - A record with a missing, zero or negative `leaseDurationSeconds` is held
//!   for this candidate's own lease duration (client-go would take it at once).
//! - A candidate that *creates* the Lease holds it, renewing, for one lease
//!   duration before it starts leading: a deleted Lease leaves no trace, and
//!   its last holder may still believe it leads until its renew deadline.
//! - A record naming this candidate is renewed at once only if it is the
//!   Lease object of one of its own terms; otherwise (a write of ours that we
//!   gave up on, landing late) it is treated like anyone else's.
//! - A free Lease whose `preferredHolder` names another candidate is left to
//!   that candidate for one lease duration; a leader whose Lease names another
//!   preferred holder steps down and releases.
//! - Releasing re-reads the Lease and writes it free only if it still names
//!   this candidate, with the resourceVersion just read.
//! - A passed renew deadline is final, as guards and guarded streams see it on
//!   their own clock: a renewal answered after it does not bring the term
//!   back, and no guard of that term is handed out any more.
//! - Why a term ended is exact: [`Lost::Released`] only ever follows
//!   [`LeaderElector::shutdown`], so a loop that campaigns again after any
//!   other loss (as [`LeaderElector::run_each_term`] does) stops only when it
//!   should; a background task lost with its runtime ends terms as
//!   [`Lost::ElectorStopped`] and fails waiting acquisitions with
//!   [`Error::ElectorStopped`].
//!
//! # Features
//! - `metrics`: `LeaseMetrics`, leader-election metrics registered into a
//!   `prometheus-client` registry.
//!
//! This crate does not pick a Kubernetes version: enable one of
//! `k8s-openapi`'s version features in your application, as with kube.
//!
//! [kube-runtime]: https://docs.rs/kube-runtime
//! [kube-rs/kube#2056]: https://github.com/kube-rs/kube/issues/2056
//! [client-go]: https://pkg.go.dev/k8s.io/client-go/tools/leaderelection
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod elector;
mod error;
mod ext;
mod guard;
mod metrics;
mod record;
mod rejoin;
mod stream;

pub use config::{ConfigError, Field, LeaseConfig, unique_identity};
pub use elector::{Acquire, HealthError, LeaderElector, LeaderStatus};
pub use error::{Error, Result};
pub use ext::{ControllerWithLeaderElection, LeaderElectionControllerExt, LeaderElectionStreamExt};
pub use guard::{LeaseGuard, Lost};
#[cfg(feature = "metrics")]
pub use metrics::LeaseMetrics;
pub use stream::WithLeaderElection;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod regressions;
#[cfg(test)]
mod simulation;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;
