//! Kubernetes Events on transitions ([`LeaderElector::with_events`]): one
//! when this candidate becomes leader, one when it stops leading (with the
//! reason), on the Lease as the involved object, as client-go's resource lock
//! records them (reason `LeaderElection`). Nothing else is published: no
//! event per renewal, so the rate is bounded by the transitions.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use k8s_openapi::api::core::v1::ObjectReference;
use kube_runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::{debug, warn};

use super::{Inner, LeaderElector};

/// How long one publication may take before it is given up.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// The recorder, and whether a failure was already logged as a warning.
pub(super) struct Events {
    recorder: Recorder,
    warned: AtomicBool,
}

impl LeaderElector {
    /// Publishes Kubernetes Events on this candidate's transitions, through
    /// kube-runtime's [`Recorder`] as `reporter`: `Normal` "became leader" when
    /// a term begins, and "stopped leading" with the reason when it ends
    /// (`Warning` for a loss, `Normal` for a shutdown or a step-down), on the
    /// Lease. Events never delay the election: each is sent from a task of
    /// its own, bounded, and a failure is logged (once as a warning). Needs
    /// `create` and `patch` on `events` in `events.k8s.io` in the Lease's
    /// namespace. The first call sets the reporter; later calls change
    /// nothing. The event of a shutdown is sent from a task of its own: a
    /// process that exits right after `shutdown` returns may not send it.
    ///
    /// ```no_run
    /// use kube_runtime::events::Reporter;
    /// use kube_runtime_lease::{LeaderElector, LeaseConfig, unique_identity};
    ///
    /// # fn doc(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let elector = LeaderElector::new(client, LeaseConfig::new("default", "my-controller", unique_identity()))?
    ///     .with_events(Reporter {
    ///         controller: "my-controller".into(),
    ///         instance: std::env::var("POD_NAME").ok(),
    ///     });
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_events(self, reporter: Reporter) -> Self {
        let recorder = Recorder::new(self.inner.api.client(), reporter);
        let _ = self.inner.events.set(Events {
            recorder,
            warned: AtomicBool::new(false),
        });
        self
    }
}

impl Inner {
    /// Publishes a transition of ours on the Lease object `uid`: became leader
    /// (`stopped` is `None`), or stopped leading: why (the note), whether it
    /// is a loss (a warning), and the kind of end as the event's action. (The
    /// recorder folds repeats of one type, reason and action on one object
    /// into a series that keeps its first note: the action tells ends apart.)
    pub(super) fn publish_transition(
        self: &std::sync::Arc<Self>,
        uid: Option<String>,
        stopped: Option<(String, bool, &'static str)>,
    ) {
        if self.events.get().is_none() {
            return;
        }
        let identity = &self.config.identity;
        let (type_, note, action) = match stopped {
            None => (
                EventType::Normal,
                format!("{identity} became leader"),
                "BecameLeader",
            ),
            Some((why, warning, action)) => (
                if warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                format!("{identity} stopped leading: {why}"),
                action,
            ),
        };
        let event = Event {
            type_,
            reason: "LeaderElection".into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        let reference = ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            namespace: Some(self.config.namespace.clone()),
            name: Some(self.config.name.clone()),
            uid,
            ..ObjectReference::default()
        };
        let inner = self.clone();
        tokio::spawn(async move {
            let Some(events) = inner.events.get() else { return };
            let result =
                tokio::time::timeout(PUBLISH_TIMEOUT, events.recorder.publish(&event, &reference)).await;
            let error = match result {
                Ok(Ok(())) => return,
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("timed out after {PUBLISH_TIMEOUT:?}"),
            };
            if events.warned.swap(true, Ordering::Relaxed) {
                debug!(%error, "publishing a leader election event failed");
            } else {
                warn!(
                    %error,
                    "publishing a leader election event failed (RBAC: create and patch on `events` in `events.k8s.io`); \
                     further failures are logged at debug level"
                );
            }
        });
    }
}
