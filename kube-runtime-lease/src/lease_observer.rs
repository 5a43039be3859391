//! [`LeaseObserver`]: who holds a Lease, for a process that never campaigns.

use std::{future::Future, time::Duration};

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::{Api, Client};
use kube_runtime::{WatchStreamExt, watcher};
use tokio::{sync::watch, task::JoinHandle};
use tracing::{debug, error, info, warn};

use crate::{ConfigError, LeaderStatus, config::names::check_lease, elector::Silence, record::Wire};

/// Follows who holds a Lease without ever campaigning: a dashboard, a CLI,
/// or the webhook-only pods of an operator that want to know the leader.
///
/// It publishes the same [`LeaderStatus`] an elector does (its `holder` and
/// `transitions`; `is_leader` is always `false`), from a watch of that one
/// Lease, and makes no write: RBAC needs only `get`, `list` and `watch` on
/// `leases` (a refusal is warned once until it is allowed, naming the
/// missing verb when RBAC's). The watch is kube-runtime's `watch_object`, with its default
/// backoff. `holder` is the holder the record names, as an elector shows
/// it: a holder that has stopped renewing is still named until someone
/// takes the Lease over. A watch silent (or failing: refused without
/// `list`/`watch`, say) for the held record's lease duration (at most a
/// minute; 15 s when the Lease is free or missing) is checked with a read:
/// one that shows a record the watch did not deliver is reported; at the
/// second such read in a row (a stalled watch: open, neither ending nor
/// failing) it is warned, once until the watch delivers again, and the
/// watch is started again. The watch runs in a task of its own, stopped
/// when the observer is dropped; a task that panics (logged at ERROR)
/// leaves a status naming no holder, and ends its subscribers' `changed()`.
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
#[must_use = "the observer stops following the Lease when it is dropped"]
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
        let lease = format!("{namespace}/{name}");
        let span = span(namespace, name);
        let name = name.to_owned();
        let task = spawn_in(span, tx.clone(), async move {
            let open = || watch(api.clone(), &name).boxed();
            let mut events = open();
            // The last record delivered or read (`None`: none, or gone), and
            // what reads after a silence showed since the watch delivered.
            let mut last: Option<Lease> = None;
            let mut stall = Silence::Heard;
            // When the watch last delivered, or the Lease was last read: a
            // watch that fails (retried with backoff) delivers nothing, so
            // its errors do not put the checking read off.
            let mut heard = tokio::time::Instant::now();
            // Whether a refusal (401, 403) was warned, until the request is
            // allowed again: the watch's, the read's.
            let (mut watch_refused, mut get_refused) = (false, false);
            loop {
                let silence = silence(last.as_ref());
                let seen = match tokio::time::timeout_at(heard + silence, events.next()).await {
                    Ok(None) => return,
                    Ok(Some(Ok(seen))) => {
                        heard = tokio::time::Instant::now();
                        watch_refused = false;
                        if stall.heard() {
                            info!("lease observer: the watch delivers again");
                        }
                        seen.map(|Wire(l)| l)
                    }
                    Ok(Some(Err(e))) => {
                        // A refusal is warned once until allowed: RBAC's
                        // naming the verbs, any other (a refused
                        // impersonation, bad credentials) with its message.
                        if !warn_once(crate::error::watch_status(&e), &mut watch_refused) {
                            debug!(error = %crate::error::Chain(&e), "lease observer: watch failed; retrying");
                        } else if crate::error::watch_refused_by_rbac(&e) {
                            warn!(
                                error = %crate::error::Chain(&e),
                                "lease observer: forbidden to watch lease {lease}: RBAC needs verbs get, list, watch \
                                 on resource `leases` in API group `coordination.k8s.io`; `list` and `watch` are \
                                 missing: reading the Lease every {silence:?} instead until the watch is allowed"
                            );
                        } else {
                            warn!(error = %crate::error::Chain(&e), "lease observer: watching lease {lease} refused; retrying");
                        }
                        continue;
                    }
                    // Silent for the record's lease duration: a held record
                    // is renewed well within it, so the watch may be
                    // stalled (open, neither ending nor failing). A read
                    // tells; one that shows what the watch did not is
                    // reported, and, at two such reads in a row, starts the
                    // watch again (its stale events never come). One alone
                    // is no stall: the silence ends when the candidates take
                    // over from a dead holder, and the read may overtake the
                    // watch's event of the takeover.
                    Err(_) => {
                        heard = tokio::time::Instant::now();
                        let read = match read(&api, &name, silence).await {
                            Ok(read) => {
                                get_refused = false;
                                read.map(|Wire(l)| l)
                            }
                            Err(e) => {
                                if !warn_once(crate::error::status_of(&e), &mut get_refused) {
                                    debug!(error = %crate::error::Chain(&e), "lease observer: reading the Lease failed");
                                } else if crate::error::refused_by_rbac(&e) {
                                    warn!(
                                        error = %crate::error::Chain(&e),
                                        "lease observer: forbidden to get lease {lease}: RBAC needs verbs get, list, \
                                         watch on resource `leases` in API group `coordination.k8s.io`; `get` is \
                                         missing"
                                    );
                                } else {
                                    warn!(error = %crate::error::Chain(&e), "lease observer: reading lease {lease} refused");
                                }
                                continue;
                            }
                        };
                        let version =
                            |l: &Option<Lease>| l.as_ref().and_then(|l| l.metadata.resource_version.clone());
                        if version(&read) == version(&last) {
                            continue;
                        }
                        match stall.changed() {
                            None => debug!(
                                "lease observer: a read after a silence shows a change the watch has not delivered"
                            ),
                            Some(warn) => {
                                if warn {
                                    warn!(
                                        ?silence,
                                        "lease observer: the watch delivered nothing while the Lease changed: it \
                                         may be stalled; reporting the Lease as read, and watching it anew"
                                    );
                                }
                                events = open();
                            }
                        }
                        read
                    }
                };
                tx.send_if_modified(|s| {
                    let before = s.clone();
                    s.observe(seen.as_ref().and_then(|l| l.spec.as_ref()));
                    *s != before
                });
                last = seen;
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

/// The span of the observer's lines, naming the Lease: its task is in none
/// of its spawner's. At ERROR level, as an elector's
/// (`LeaseConfig::span`), so that a filter at WARN
/// keeps it.
fn span(namespace: &str, name: &str) -> tracing::Span {
    tracing::error_span!(
        parent: None,
        "lease_observer",
        lease.namespace = %namespace,
        lease.name = %name,
    )
}

/// Spawns `follow` in `span`. A panic (in a request's future, which runs
/// there: a layer of the Client's stack, kube's own) ends the following:
/// `status` then names no holder, rather than the last one as if current.
fn spawn_in(
    span: tracing::Span,
    status: watch::Sender<LeaderStatus>,
    follow: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    let task = async move {
        if std::panic::AssertUnwindSafe(follow).catch_unwind().await.is_err() {
            error!("lease observer: its task panicked: it follows the Lease no more, and names no holder");
            status.send_replace(LeaderStatus::default());
        }
    };
    tokio::spawn(tracing::Instrument::instrument(task, span))
}

/// Whether a failure answered `status` is warned: a refusal (401, 403),
/// once until the request is allowed again (`warned`).
fn warn_once(status: Option<u16>, warned: &mut bool) -> bool {
    matches!(status, Some(401 | 403)) && !std::mem::replace(warned, true)
}

/// Reads the Lease, within `bound`: kube sets no read timeout, and a read
/// on a dead kept-alive connection (the watch's silence and such a read
/// often go together) would stop the observer for as long as TCP takes to
/// notice (about 15 minutes). A timeout is a `Service` error. `None` only
/// for the API server's `NotFound` naming the Lease (`error::lease_gone`),
/// not any 404, as kube's `get_opt` takes it; a `2xx` that is not the Lease
/// is an error (`Wire::answer_for`).
pub(crate) async fn read(api: &Api<Wire>, name: &str, bound: Duration) -> kube_client::Result<Option<Wire>> {
    match tokio::time::timeout(bound, api.get(name)).await {
        Ok(Ok(read)) => read.answer_for(name).map(Some),
        Ok(Err(e)) if crate::error::lease_gone(&e, name) => Ok(None),
        Ok(Err(e)) => Err(e),
        Err(elapsed) => Err(kube_client::Error::Service(Box::new(elapsed))),
    }
}

/// kube-runtime's `watch_object` on the Lease `name`, with its default
/// backoff, taking in only the Lease's own events as news: one of another
/// object (from something in front of the API server that ignores the
/// field selector), which `watch_object` hands on as the Lease (taken over)
/// or its deletion, and one older than an event delivered before (a watch
/// resumed from an old BOOKMARK's resourceVersion replays the history
/// since: the last holder's records) are dropped; a list is taken as it is
/// (etcd restored from a snapshot), and what follows it judged against it. The election's watch and
/// [`LeaseObserver`]'s.
pub(crate) fn watch(api: Api<Wire>, name: &str) -> impl Stream<Item = watcher::Result<Option<Wire>>> + use<> {
    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
    let name = name.to_owned();
    let fields = format!("metadata.name={name}");
    // Whether the list under way showed the Lease (none: gone), and the
    // newest resourceVersion delivered.
    watcher(api, watcher::Config::default().fields(&fields))
        .scan((false, None), move |(seen, newest), event| {
            let version = |l: &Wire| crate::record::version_of(&l.0);
            let item = match event {
                Ok(Apply(l) | InitApply(l) | Delete(l)) if l.0.metadata.name.as_ref() != Some(&name) => {
                    debug!(other = ?l.0.metadata.name, "the lease watch delivered another object's event: ignored");
                    None
                }
                Ok(Apply(l) | Delete(l)) if version(&l).zip(*newest).is_some_and(|(v, n)| v < n) => {
                    debug!(version = ?version(&l), ?newest, "the lease watch delivered an older version: ignored");
                    None
                }
                Ok(Init) => {
                    (*seen, *newest) = (false, None);
                    None
                }
                Ok(InitApply(l)) => {
                    (*seen, *newest) = (true, version(&l));
                    Some(Ok(Some(l)))
                }
                Ok(Apply(l)) => {
                    *newest = version(&l).max(*newest);
                    Some(Ok(Some(l)))
                }
                Ok(Delete(l)) => {
                    *newest = version(&l).max(*newest);
                    Some(Ok(None))
                }
                Ok(InitDone) => (!*seen).then_some(Ok(None)),
                Err(e) => Some(Err(e)),
            };
            std::future::ready(Some(item))
        })
        .filter_map(std::future::ready)
        .default_backoff()
}

/// How long a watch may be silent before a read checks it: a held record's
/// lease duration (its holder renews well within it), at most a minute (a
/// holder renews every retry period however long its duration: an hour's
/// silence is a stall); otherwise (free, missing, or no duration) the
/// default lease duration, 15 s: a free Lease changes only when taken, so
/// a read every 15 s at most.
fn silence(last: Option<&Lease>) -> Duration {
    const DEFAULT: Duration = Duration::from_secs(15);
    match last.and_then(|l| l.spec.as_ref()) {
        Some(spec) if crate::record::holder(spec).is_some() => crate::record::lease_duration(spec, DEFAULT)
            .clamp(Duration::from_secs(1), Duration::from_secs(60)),
        _ => DEFAULT,
    }
}

impl Drop for LeaseObserver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests;
