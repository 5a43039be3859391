//! Kubernetes Events on transitions ([`LeaderElector::with_events`]): one
//! when this candidate becomes leader, one when it stops leading (with the
//! reason), on the Lease as the involved object, as client-go's resource lock
//! records them (reason `LeaderElection`). Nothing else is published: no
//! event per renewal, so the rate is bounded by the transitions.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event as K8sEvent},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube_client::{Api, api::PostParams};
use kube_runtime::events::{Event, EventType, Reporter};
use tracing::{debug, warn};

use crate::{
    elector::{LeaderElector, Observer, Transition},
    term::Lost,
};

/// How long one publication may take before it is given up.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// Publishes the Events: an observer of the election's transitions.
struct Events {
    /// Where and as whom to publish: a new Event for each transition, as a
    /// new kube-runtime `Recorder` for each would create it (one `Recorder`
    /// kept would fold a repeat of a type, reason and action on the Lease,
    /// within minutes, into the first Event's series, which keeps the first
    /// note: a second takeover would name the first's holder), but with a
    /// name the API server accepts for a Lease of any valid name.
    client: kube_client::Client,
    reporter: Reporter,
    /// The candidate's identity, and the Lease the Events are about.
    identity: String,
    namespace: String,
    name: String,
    /// Whether a failure was already logged as a warning since the last
    /// Event published (one warning per outage).
    warned: Arc<AtomicBool>,
}

impl LeaderElector {
    /// Publishes Kubernetes Events on this candidate's transitions, as
    /// kube-runtime's [`Recorder`](kube_runtime::events::Recorder) publishes
    /// them as `reporter`: `Normal` "became leader" when
    /// a term begins, and "stopped leading" with the reason when it ends
    /// (`Warning` for a loss, `Normal` for a shutdown, a step-down or a term
    /// given up because nobody wanted it any more), on the
    /// Lease. Events never delay the election: each is sent from a task of
    /// its own, bounded, and a failure is logged (as a warning once per
    /// outage: until an Event is published again). Needs
    /// `create` on `events` in `events.k8s.io` in the Lease's
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
        let config = &self.inner.config;
        self.add_observer(Events {
            client: self.inner.api.client(),
            reporter,
            identity: config.identity.clone(),
            namespace: config.namespace.clone(),
            name: config.name.clone(),
            warned: Arc::new(AtomicBool::new(false)),
        });
        self
    }
}

/// The longest note the API server stores (an Event's `message`: at most
/// 1024 characters).
const MAX_NOTE: usize = 1024;

/// `note` cut to [`MAX_NOTE`] bytes (so at most as many characters), on a
/// character boundary, ending with `…` when cut: a note naming a long
/// `holderIdentity` (someone else's: the API server sets no limit on it)
/// would otherwise be refused, and the Event lost.
fn fit_note(mut note: String) -> String {
    if note.len() <= MAX_NOTE {
        return note;
    }
    let mut end = MAX_NOTE - '…'.len_utf8();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    note.push('…');
    note
}

/// The note, type and action of the Event for the end of a term: why (the
/// note), whether it is a loss (a warning), and the kind of end as the
/// action.
fn ended(reason: &Lost) -> (String, bool, &'static str) {
    match reason {
        Lost::Shutdown => ("the elector was shut down".to_owned(), false, "Shutdown"),
        Lost::GivenUp => ("nobody wants leadership any more".to_owned(), false, "GivenUp"),
        Lost::SteppedDown { .. } => (reason.to_string(), false, "SteppedDown"),
        Lost::TakenOver { .. } => (reason.to_string(), true, "TakenOver"),
        Lost::Deleted => (reason.to_string(), true, "Deleted"),
        Lost::RenewDeadlineExceeded => (reason.to_string(), true, "RenewDeadlineExceeded"),
        Lost::ElectorStopped => (reason.to_string(), true, "ElectorStopped"),
    }
}

impl Observer for Events {
    fn observe(&self, transition: Transition<'_>) {
        let identity = &self.identity;
        let (type_, note, action, uid) = match transition {
            Transition::TermBegan { uid, .. } => (
                EventType::Normal,
                format!("{identity} became leader"),
                "BecameLeader",
                uid,
            ),
            Transition::TermEnded { reason, uid } => {
                let (why, warning, action) = ended(reason);
                let type_ = if warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                };
                (type_, format!("{identity} stopped leading: {why}"), action, uid)
            }
            _ => return,
        };
        let event = Event {
            type_,
            reason: "LeaderElection".into(),
            note: Some(fit_note(note)),
            action: action.into(),
            secondary: None,
        };
        let reference = ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: uid.map(str::to_owned),
            ..ObjectReference::default()
        };
        let event = self.event(&event, reference);
        let events = Api::<K8sEvent>::namespaced(self.client.clone(), &self.namespace);
        let warned = self.warned.clone();
        // Named on its own lines: the span the task is spawned from (the
        // election's, or none) is not the spawned task's.
        let lease = format!("{}/{}", self.namespace, self.name);
        let publishing = async move {
            let params = PostParams::default();
            let publish = events.create(&params, &event);
            let result = tokio::time::timeout(PUBLISH_TIMEOUT, publish)
                .await
                .map(|r| r.map(drop));
            let (error, denied) = match result {
                // A failure after this one is another outage: warned again.
                Ok(Ok(())) => return warned.store(false, Ordering::Relaxed),
                Ok(Err(e)) => {
                    let denied = crate::error::refused_by_rbac(&e);
                    (e.to_string(), denied)
                }
                Err(_) => (format!("timed out after {PUBLISH_TIMEOUT:?}"), false),
            };
            if warned.swap(true, Ordering::Relaxed) {
                debug!(%lease, %error, "publishing a leader election event failed");
            } else if denied {
                warn!(
                    %lease,
                    %error,
                    "publishing a leader election event failed (RBAC: create on `events` in `events.k8s.io`); \
                     further failures are logged at debug level until one is published"
                );
            } else {
                warn!(
                    %lease,
                    %error,
                    "publishing a leader election event failed; further failures are logged at debug level until one is published"
                );
            }
        };
        // (No runtime, or one shutting down, with the task that ran under it.)
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(tracing::Instrument::in_current_span(publishing));
        }
    }
}

/// The longest name the API server accepts for an Event (a DNS subdomain).
const MAX_EVENT_NAME: usize = 253;

impl Events {
    /// The Event kube-runtime's `Recorder` would create for `event` about
    /// `regarding`, named `<Lease name>.<hex of now in ns>` as it names them,
    /// but with the Lease's name cut so that the whole is a name the API
    /// server accepts: a Lease name may be 253 characters long itself, and
    /// the `Recorder` would then name every Event of it past the limit (422).
    fn event(&self, event: &Event, regarding: ObjectReference) -> K8sEvent {
        let now = k8s_openapi::jiff::Timestamp::now();
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding),
            note: event.note.clone(),
            metadata: ObjectMeta {
                namespace: Some(self.namespace.clone()),
                name: Some(event_name(&self.name, now.as_nanosecond())),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            related: event.secondary.clone(),
            ..K8sEvent::default()
        }
    }
}

/// `<lease>.<nanos in hex>`, the Lease's name (a DNS subdomain, so ASCII)
/// cut so that the whole is at most [`MAX_EVENT_NAME`] characters and still
/// a DNS subdomain (no `-` or `.` before the dot).
fn event_name(lease: &str, nanos: i128) -> String {
    let suffix = format!(".{nanos:x}");
    let cut = lease.len().min(MAX_EVENT_NAME.saturating_sub(suffix.len()));
    let base = lease.get(..cut).unwrap_or(lease).trim_end_matches(['-', '.']);
    format!("{base}{suffix}")
}
