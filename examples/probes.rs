//! Kubernetes probes for a replica that campaigns: `/livez` (the elector's
//! [`health_check`](LeaderElector::health_check), client-go's healthz
//! watchdog: fails when this replica believes it leads but its renewals are
//! overdue, so that the kubelet restarts a stuck leader; and its
//! [`contact_check`](LeaderElector::contact_check): fails when a replica
//! taking part in the election, standby or leader, has heard nothing from the
//! API server for [`API_SILENCE_LIMIT`]) and `/readyz`
//! (ready always, or only while leading: see [`Readiness`]), served with
//! axum. The example Deployment (`deploy/deployment.yaml`) wires both.

use std::time::Duration;

use axum::{Router, extract::State, http::StatusCode, routing::get};
use kube_runtime_lease::LeaderElector;
use tokio::net::TcpListener;

/// client-go's default tolerance of its healthz watchdog.
pub const LIVENESS_TOLERANCE: Duration = Duration::from_secs(20);

/// How long a replica taking part in the election may go without an answer
/// from the API server before `/livez` fails (a standby whose connection has
/// gone bad is restarted): long enough to ride out an API server outage
/// without restarting every replica at once.
pub const API_SILENCE_LIMIT: Duration = Duration::from_secs(300);

/// When `/readyz` says ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Whenever the process runs (leader or standby): for a replica that
    /// serves something on every replica, such as a webhook, so that a
    /// rollout keeps serving while leadership moves.
    Always,
    /// Only while this replica leads (and until `shutdown` begins): for a
    /// Service that must route to the leader alone. Standbys are then never
    /// Ready: a Deployment's rolling update waits for new pods to be Ready,
    /// so use it only with a rollout strategy that allows for that (or a
    /// Service-only readiness gate).
    WhenLeading,
}

impl Readiness {
    /// From `READY_WHEN` (`leading` or `always`, default `always`).
    #[must_use]
    pub fn from_env() -> Self {
        match std::env::var("READY_WHEN").as_deref() {
            Ok("leading") => Readiness::WhenLeading,
            _ => Readiness::Always,
        }
    }
}

/// The two routes, for `elector`.
pub fn router(elector: LeaderElector, readiness: Readiness) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state((elector, readiness))
}

/// Serves the probes on `listener` until the process ends.
///
/// # Errors
/// When the listener fails.
pub async fn serve(
    listener: TcpListener,
    elector: LeaderElector,
    readiness: Readiness,
) -> std::io::Result<()> {
    axum::serve(listener, router(elector, readiness)).await
}

async fn livez(State((elector, _)): State<(LeaderElector, Readiness)>) -> (StatusCode, String) {
    liveness(&elector)
}

/// The answer of `/livez` for `elector`: 200, or 500 with why (the elector's
/// [`health_check`](LeaderElector::health_check) with
/// [`LIVENESS_TOLERANCE`], then its
/// [`contact_check`](LeaderElector::contact_check) with
/// [`API_SILENCE_LIMIT`]). For a server of its own that serves `/livez` too
/// (`examples/operator.rs`).
#[must_use]
pub fn liveness(elector: &LeaderElector) -> (StatusCode, String) {
    let healthy = elector
        .health_check(LIVENESS_TOLERANCE)
        .and_then(|()| elector.contact_check(API_SILENCE_LIMIT));
    match healthy {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

async fn readyz(
    State((elector, readiness)): State<(LeaderElector, Readiness)>,
) -> (StatusCode, &'static str) {
    match (readiness, elector.is_leader()) {
        (Readiness::Always, _) => (StatusCode::OK, "ok\n"),
        (Readiness::WhenLeading, true) => (StatusCode::OK, "leading\n"),
        (Readiness::WhenLeading, false) => (StatusCode::SERVICE_UNAVAILABLE, "not leading\n"),
    }
}
