//! [`LeaseObserver`]: who holds a Lease, for a process that never campaigns.

use futures::StreamExt;
use kube_client::{Api, Client};
use kube_runtime::{WatchStreamExt, watcher};
use tokio::{sync::watch, task::JoinHandle};
use tracing::debug;

use crate::{ConfigError, LeaderStatus, config::names::check_lease, record::Wire};

/// Follows who holds a Lease without ever campaigning: a dashboard, a CLI,
/// or the webhook-only pods of an operator that want to know the leader.
///
/// It publishes the same [`LeaderStatus`] an elector does (its `holder` and
/// `transitions`; `is_leader` is always `false`), from a watch of that one
/// Lease, and makes no write: RBAC needs only `get`, `list` and `watch` on
/// `leases`. The watch is kube-runtime's `watch_object`, with its default
/// backoff. `holder` is the holder the record names, as an elector shows
/// it: a holder that has stopped renewing is still named until someone
/// takes the Lease over. The watch runs in a task of its own, stopped when
/// the observer is dropped.
///
/// ```no_run
/// use kube_runtime_lease::LeaseObserver;
///
/// # async fn doc(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let observer = LeaseObserver::new(client, "my-namespace", "my-controller")?;
/// let mut status = observer.subscribe();
/// while status.changed().await.is_ok() {
///     println!("leader: {:?}", status.borrow_and_update().holder);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct LeaseObserver {
    status: watch::Receiver<LeaderStatus>,
    task: JoinHandle<()>,
}

impl LeaseObserver {
    /// Starts following the Lease `namespace/name`, on the current Tokio
    /// runtime.
    ///
    /// # Errors
    /// [`ConfigError::InvalidNamespace`] or [`ConfigError::InvalidName`], as
    /// [`LeaseConfig::validate`](crate::LeaseConfig::validate) checks them,
    /// before any API call.
    ///
    /// # Panics
    /// Outside a Tokio runtime, as [`tokio::spawn`] does.
    pub fn new(client: Client, namespace: &str, name: &str) -> Result<Self, ConfigError> {
        check_lease(namespace, name)?;
        let (tx, status) = watch::channel(LeaderStatus::default());
        let api: Api<Wire> = Api::namespaced(client, namespace);
        let mut events = watcher::watch_object(api, name).default_backoff().boxed();
        let task = tokio::spawn(async move {
            while let Some(event) = events.next().await {
                // The Lease as it is now (`None`: it does not exist).
                let seen = match event {
                    Ok(seen) => seen,
                    Err(e) => {
                        debug!(error = %crate::error::Chain(&e), "lease observer: watch failed; retrying");
                        continue;
                    }
                };
                tx.send_if_modified(|s| {
                    let before = s.clone();
                    s.observe(seen.and_then(|Wire(l)| l.spec).as_ref());
                    *s != before
                });
            }
        });
        Ok(LeaseObserver { status, task })
    }

    /// Who holds the Lease, as last observed (`is_leader` is always `false`).
    #[must_use]
    pub fn status(&self) -> LeaderStatus {
        self.status.borrow().clone()
    }

    /// Follows [`status`](Self::status): every change of holder observed.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<LeaderStatus> {
        self.status.clone()
    }
}

impl Drop for LeaseObserver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests;
