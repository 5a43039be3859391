//! Leases of the tests: a free one to start from, and the test's own watch on
//! one ([`LeaseRecorder`]), which records every version into an
//! [`EventLog`].

use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::TestEnv;
use crate::clock::now_ns;
use crate::events::{EventLog, Kind};

/// A Lease used by one scenario run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl LeaseRef {
    /// The Lease API of its namespace.
    #[must_use]
    pub fn api(&self, client: Client) -> Api<Lease> {
        Api::namespaced(client, &self.namespace)
    }
}

/// The spec of a free Lease: holder `""`, a 1 s duration and no transitions
/// yet, as a release leaves it.
#[must_use]
pub fn free_spec() -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(String::new()),
        lease_duration_seconds: Some(1),
        lease_transitions: Some(0),
        ..LeaseSpec::default()
    }
}

/// Creates the Lease `name` with `spec` through `api`.
///
/// # Errors
/// When the API call fails.
pub async fn create_lease(api: &Api<Lease>, name: &str, spec: LeaseSpec) -> Result<Lease> {
    api.create(
        &PostParams::default(),
        &Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
        },
    )
    .await
    .with_context(|| format!("creating lease {name}"))
}

/// Creates a fresh namespace (named after `prefix`) holding a *free* Lease
/// ([`free_spec`]) named `failover`.
///
/// Candidates then take it at once. (A candidate that *creates* the Lease
/// holds it for one lease duration before leading, a safety measure after
/// deletions; pre-creating avoids that delay.)
///
/// # Errors
/// When an API call fails.
pub async fn new_free_lease(env: &TestEnv, client: &Client, prefix: &str) -> Result<LeaseRef> {
    let namespace = env.new_namespace(prefix).await?;
    let lease = LeaseRef {
        namespace,
        name: "failover".to_owned(),
    };
    create_lease(&lease.api(client.clone()), &lease.name, free_spec())
        .await
        .with_context(|| format!("in namespace {}", lease.namespace))?;
    Ok(lease)
}

/// What the test's watch on a Lease saw ([`watch_lease_events`]).
#[derive(Clone, Debug)]
pub enum LeaseEvent {
    /// A version of the Lease: listed (the watch's initial list, or a
    /// re-list, which replays the current version) or changed.
    Applied(Lease),
    /// The Lease was deleted: its last version.
    Deleted(Lease),
    /// A listing is complete: the versions applied so far are the state of
    /// the Lease when the watch (re)started.
    Listed,
}

/// Watches the Lease `name` through `api` on a task of its own: `on_event`
/// gets every event of kube's watcher on it (deletions, and the end of each
/// listing, included; re-lists replay the current version) and when it was
/// seen ([`now_ns`]). The watch retries with kube's default backoff (an
/// erroring watch does not spin); it ends when the task is aborted.
pub fn watch_lease_events(
    api: Api<Lease>,
    name: &str,
    mut on_event: impl FnMut(u64, LeaseEvent) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher};

    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        while let Some(event) = events.next().await {
            let at = now_ns();
            let event = match event {
                Ok(watcher::Event::InitApply(lease) | watcher::Event::Apply(lease)) => {
                    LeaseEvent::Applied(lease)
                }
                Ok(watcher::Event::Delete(lease)) => LeaseEvent::Deleted(lease),
                Ok(watcher::Event::InitDone) => LeaseEvent::Listed,
                Ok(watcher::Event::Init) | Err(_) => continue,
            };
            on_event(at, event);
        }
    })
}

/// Watches `lease` on a task of its own ([`watch_lease_events`]):
/// `on_version` gets every new version of it and when it was seen
/// ([`now_ns`]). A version is passed once: the watch's re-lists replay the
/// current version, which is skipped. Deletions are not reported. It ends
/// when the task is aborted.
pub fn watch_lease(
    client: Client,
    lease: &LeaseRef,
    mut on_version: impl FnMut(u64, Lease) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let mut last_rv = None;
    watch_lease_events(lease.api(client), &lease.name, move |at, event| {
        let LeaseEvent::Applied(object) = event else {
            return;
        };
        if object.metadata.resource_version == last_rv {
            return;
        }
        last_rv.clone_from(&object.metadata.resource_version);
        on_version(at, object);
    })
}

/// The test's own watch on a Lease: records every new version of it (by
/// resourceVersion) into an [`EventLog`] as [`Kind::Record`] entries, stamped
/// when seen. Stops when dropped.
#[derive(Debug)]
pub struct LeaseRecorder {
    /// The Lease watched.
    pub lease: LeaseRef,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LeaseRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::ops::Deref for LeaseRecorder {
    type Target = LeaseRef;

    fn deref(&self) -> &LeaseRef {
        &self.lease
    }
}

impl LeaseRecorder {
    /// Starts watching `lease` and waits for its first version.
    ///
    /// # Errors
    /// When the first version is not seen within 10 s.
    pub async fn start(client: Client, lease: LeaseRef, log: &EventLog) -> Result<Self> {
        let started = now_ns();
        let l = log.clone();
        let task = watch_lease(client, &lease, move |at, object| {
            let rv = object.metadata.resource_version.unwrap_or_default();
            let spec = object.spec.unwrap_or_default();
            l.record(
                "lease",
                Kind::Record,
                at,
                spec.holder_identity.as_deref().unwrap_or(""),
                &format!(
                    "duration={} transitions={} rv={rv} acquire={} renew={}",
                    spec.lease_duration_seconds.unwrap_or(0),
                    spec.lease_transitions.unwrap_or(0),
                    spec.acquire_time.map_or_else(String::new, |t| t.0.to_string()),
                    spec.renew_time.map_or_else(String::new, |t| t.0.to_string()),
                ),
            );
        });
        let recorder = Self { lease, task };
        log.wait_for("the test's watch on the lease", Duration::from_secs(10), |e| {
            e.kind == Kind::Record && e.at >= started
        })
        .await?;
        Ok(recorder)
    }
}
