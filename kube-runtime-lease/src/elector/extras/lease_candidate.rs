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

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::{FutureExt, StreamExt};
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::{SignedDuration, Timestamp},
};
use kube_client::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams, Preconditions},
};
use kube_runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::{
    config::{LeaseConfig, extras::coordinated::Coordinated},
    elector::{
        Inner, State, Transition,
        task::{LeaseView, Rule, Task},
    },
    error::Chain,
    record::{self, Asker, Observed, Verdict},
};

/// How often `renewTime` is refreshed without a ping (client-go's
/// `requeueInterval`): the API server treats a `LeaseCandidate` not renewed for 15
/// minutes as a reason to re-elect, and collects it after 30.
const REFRESH: Duration = Duration::from_secs(300);
/// The longest wait before a `LeaseCandidate` the API server does not serve
/// is published again.
const REPUBLISH_MAX: Duration = Duration::from_secs(300);

/// The waits before a `LeaseCandidate` the API server does not serve is
/// published again, one per 404 in a row: 10 s, doubling up to
/// [`REPUBLISH_MAX`] (an optional API that is not there, so no faster).
fn republish_backoff() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_secs(10))
        .with_max_delay(REPUBLISH_MAX)
        .without_max_times()
        .build()
}

/// The bound of each request.
const BOUND: Duration = crate::config::extras::coordinated::REQUEST_BOUND;
/// How far ahead of our clock an API server's ping may be for the answer to
/// be stamped just after it: the API server's election duration (it waits
/// that long for answers, and counts a candidate renewed within it as
/// live), so that a candidate is never counted as live for longer than an
/// election after its last answer.
const PING_AHEAD_MAX: Duration = Duration::from_secs(5);
/// How long the API server's election may take to give an expired Lease to a
/// new holder: its requeue interval and its election duration (the pings'
/// window), 5 s each (`leaderelection_controller.go`).
const API_SERVER_ELECTION: Duration = Duration::from_secs(10);

/// When to watch the `LeaseCandidate` anew while the API server's election
/// stays due (the Lease missing, free or expired): a watch that stalled
/// (open and silent) misses the API server's pings, and the API server
/// elects only candidates that answered, then pings again only once a
/// `LeaseCandidate` changes. A re-list shows a ping missed (answered at
/// once), and the new watch the next one. First once the election has
/// been due for two of the API server's ([`API_SERVER_ELECTION`]: one
/// missed, or late by this candidate's view of the Lease), then after a
/// wait doubling up to [`REFRESH`]: a LIST and a WATCH each, while a
/// coordinated Lease has no leader (no GET: the refreshes' pace is kept).
#[derive(Default)]
struct Rewatch {
    /// The last re-watch, and the wait after it.
    last: Option<(tokio::time::Instant, Duration)>,
}

impl Rewatch {
    /// Whether to watch anew at `now`, the election due since `since`
    /// (`None`: not due, which starts the backoff again).
    fn due(&mut self, since: Option<tokio::time::Instant>, now: tokio::time::Instant) -> bool {
        let Some(since) = since else {
            self.last = None;
            return false;
        };
        let (from, wait) = self.last.unwrap_or((since, API_SERVER_ELECTION * 2));
        if now < from + wait {
            return false;
        }
        info!(
            due_for = ?now.saturating_duration_since(since),
            "coordinated leader election: the Lease still has no leader; watching the LeaseCandidate anew, \
             in case its watch missed a ping"
        );
        self.last = Some((now, wait.saturating_mul(2).min(REFRESH)));
        true
    }
}

/// How many times one publication goes round create, read, replace when the
/// object keeps changing under it (created or deleted by someone else).
const PUBLISH_ROUNDS: usize = 3;

/// A failed request about the `LeaseCandidate`.
#[derive(Debug)]
enum CallError {
    Api(kube_client::Error),
    Timeout,
    /// Its creation was answered 404: the API server does not serve
    /// `coordination.k8s.io/v1beta1` `LeaseCandidate` (the feature gate is
    /// off, or it is still starting, or one of an HA pair is older).
    NotServed(kube_client::Error),
    /// An object of our name names another Lease (another process campaigns
    /// with our identity for it): not ours to take over.
    NotOurs {
        lease: String,
    },
    /// The object kept changing under the publication.
    Raced,
}

impl CallError {
    fn status(&self) -> Option<u16> {
        match self {
            CallError::Api(e) | CallError::NotServed(e) => crate::error::status_of(e),
            CallError::Timeout | CallError::NotOurs { .. } | CallError::Raced => None,
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Api(e) | CallError::NotServed(e) => write!(f, "{}", Chain(e)),
            CallError::Timeout => write!(f, "no answer within {BOUND:?}"),
            CallError::NotOurs { lease } => write!(
                f,
                "a LeaseCandidate named after this identity exists for the Lease {lease:?} (another process has \
                 this identity): left alone; each coordinated Lease needs an identity of its own"
            ),
            CallError::Raced => write!(
                f,
                "the LeaseCandidate was created or deleted by someone else {PUBLISH_ROUNDS} times during its publication"
            ),
        }
    }
}

async fn bounded<T>(fut: impl Future<Output = kube_client::Result<T>>) -> Result<T, CallError> {
    crate::elector::api::bounded(BOUND, fut, CallError::Api, || CallError::Timeout).await
}

/// Runs `elect` (a task campaigning and leading) with this elector's
/// `LeaseCandidate` published, for as long as `elect` runs, and deletes the
/// candidate before returning. The `LeaseCandidate` lives as long as the task
/// campaigns or leads. After a fallback (the API server answered 404: it does
/// not serve `LeaseCandidate`, or not yet), the ordinary election runs and
/// the `LeaseCandidate` is published again with backoff (10 s doubling to
/// 5 min, across tasks), with one warning; once the API server serves it,
/// Coordinated Leader Election is in force from the next campaign attempt.
pub(in crate::elector) async fn while_published<T>(inner: &Inner, elect: impl Future<Output = T>) -> T {
    let lease_candidate = inner
        .config
        .extras
        .coordinated
        .as_ref()
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
    // Only a published LeaseCandidate is deleted (none is, after a fallback).
    if let Some(lease_candidate) = &lease_candidate
        && inner.lock().extras.election == Election::Coordinated
    {
        lease_candidate.delete().await;
    }
    result
}

/// Which election is in force.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::elector) enum Election {
    /// The ordinary election: the one configured, or the fallback where the
    /// API server does not serve `LeaseCandidate`.
    #[default]
    Ordinary,
    /// Coordinated Leader Election asked for, and the API server has not yet
    /// answered the `LeaseCandidate`'s creation: nothing to do yet.
    Pending,
    /// Coordinated Leader Election in force.
    Coordinated,
    /// Coordinated Leader Election asked for, but the API server answered
    /// the `LeaseCandidate`'s creation 404 (it does not serve the API, or
    /// not yet): the ordinary election runs, and the `LeaseCandidate` is
    /// published again at `retry_at` (`republish_backoff`: 10 s doubling to
    /// 5 min; `fails` 404s in a row, counted across election tasks).
    FellBack {
        retry_at: tokio::time::Instant,
        fails: usize,
    },
}

/// Coordinated Leader Election's say in an attempt to acquire: wait
/// (`Err`: until when) while the API server has not answered the
/// `LeaseCandidate`'s creation, or while it is in force and the Lease is
/// missing (only the API server creates a coordinated Lease); once it is
/// in force, its rule for the record ([`coordinated_verdict`]),
/// else `ordinary`.
pub(in crate::elector) fn rule(task: &Task, ordinary: Rule, now: Instant) -> Result<Rule, Instant> {
    let wait = now + task.inner.config.retry_period;
    let mut state = task.inner.lock();
    if state.extras.election != Election::Coordinated {
        return if state.extras.election == Election::Pending {
            Err(wait)
        } else {
            Ok(ordinary)
        };
    }
    // Noted for `keep`: an election due for long may be one whose ping the
    // `LeaseCandidate`'s watch missed.
    let due = match &task.view {
        LeaseView::Known { observed, .. } => {
            let d = record::lease_duration(&observed.spec, task.inner.config.lease_duration);
            record::holder(&observed.spec).is_none() || now >= record::later(observed.at, d)
        }
        LeaseView::Missing => true,
        LeaseView::Unknown => false,
    };
    state.extras.election_due = due.then(|| state.extras.election_due.unwrap_or(now));
    if matches!(task.view, LeaseView::Missing) {
        Err(wait)
    } else {
        Ok(coordinated_verdict)
    }
}

/// What a candidate in Coordinated Leader Election may do with `observed`:
/// never take a Lease the API server did not give it. It takes a record
/// naming it holder, with no `preferredHolder`, that is either its own term's
/// or the API server's assignment (which has no `acquireTime`: the API server
/// never writes one, and every term of ours does); a record naming it that is
/// neither (another process with its identity) is waited out for one lease
/// duration, as in the ordinary election. Anything else is the API server's
/// to change: wait (a watch event wakes the candidate sooner).
///
/// Except its own term's record, its end marked for another candidate (it
/// stepped down with its work alive, so it did not release), that nobody
/// took: the API server gives an expired Lease to a new holder only, so with
/// the preferred holder gone and this candidate its choice again, it writes
/// nothing, and the Lease would stay without a leader. Once the record has
/// been unchanged for twice its duration and the API server's election
/// (its requeue and ping windows, [`API_SERVER_ELECTION`]), the candidate
/// takes it back, with no `preferredHolder` (see `Extras::prepare`), so that
/// the API server can mark the end of that term again.
fn coordinated_verdict(observed: &Observed, asker: Asker<'_>, now: Instant) -> Verdict {
    let spec = &observed.spec;
    let duration = record::lease_duration(spec, asker.fallback);
    let named = record::holder(spec) == Some(asker.identity);
    match record::preferred_holder(spec) {
        None if named && (asker.own_term || spec.acquire_time.is_none()) => Verdict::Take,
        None if named => record::after_unchanged(observed, duration, now),
        Some(p) if named && asker.own_term && p != asker.identity => {
            let left_alone = duration.saturating_mul(2).saturating_add(API_SERVER_ELECTION);
            record::after_unchanged(observed, left_alone, now)
        }
        _ => Verdict::WaitUntil(record::later(now, duration)),
    }
}

/// Sets up Coordinated Leader Election for a new elector, if `config` asks for
/// it: the identity is the `LeaseCandidate`'s name (one per Lease), and the
/// election waits for the API server's first answer.
pub(in crate::elector) fn set_up(mut config: LeaseConfig, mut state: State) -> (LeaseConfig, State) {
    if config.extras.coordinated.is_some() {
        config.identity = candidate_name(&config.identity, &config.name);
        state.extras.election = Election::Pending;
    }
    (config, state)
}

impl Inner {
    /// Which election is in force, once the API server answered the
    /// `LeaseCandidate`'s creation: `Coordinated`, or `FellBack` (the
    /// ordinary election, and when to publish again). Observers hear of a
    /// change of the election in force only (before the first answer, the
    /// ordinary one is: nothing is coordinated yet). Wakes the task, which may
    /// wait for it.
    fn set_election(&self, election: Election) {
        let coordinated = election == Election::Coordinated;
        let before = std::mem::replace(&mut self.lock().extras.election, election);
        self.update_status(|s| s.coordinated = coordinated);
        if (before == Election::Coordinated) != coordinated {
            self.observers.tell(Transition::Coordinated(coordinated));
        }
        self.wake.notify_one();
    }
}

/// This elector's `LeaseCandidate`.
pub(super) struct LeaseCandidate {
    api: Api<DynamicObject>,
    resource: ApiResource,
    name: String,
    namespace: String,
    lease: String,
    settings: Coordinated,
    /// The uid of the object this task published (created or adopted): the
    /// only one it deletes.
    uid: parking_lot::Mutex<Option<String>>,
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
            uid: parking_lot::Mutex::new(None),
        }
    }

    /// Remembers the object published, for its deletion.
    fn published(&self, object: &DynamicObject) {
        (*self.uid.lock()).clone_from(&object.metadata.uid);
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
    /// force once the first creation is answered, and falls back to the
    /// ordinary election when a later publication is answered 404 (the API
    /// server no longer serves `LeaseCandidate`, so nobody elects any more),
    /// to publish again with backoff as after a first 404. Never returns.
    pub(super) async fn run(&self, inner: &Inner) {
        loop {
            self.publish_until_answered(inner).await;
            self.keep(inner).await;
            let delay = republish_backoff().next().unwrap_or(REPUBLISH_MAX);
            warn!(
                retry_in = ?delay,
                "coordinated leader election: the API server no longer serves coordination.k8s.io/v1beta1 \
                 LeaseCandidate (the CoordinatedLeaderElection feature gate was turned off): falling back to the \
                 ordinary election, and publishing again with backoff"
            );
            inner.set_election(Election::FellBack {
                retry_at: tokio::time::Instant::now() + delay,
                fails: 0,
            });
        }
    }

    /// Publishes the `LeaseCandidate` until it is published (retrying with
    /// backoff, and after a 404 at the fallback's times), telling `inner`
    /// which election is in force.
    async fn publish_until_answered(&self, inner: &Inner) {
        let mut backoff = None;
        loop {
            // After a fallback, the next try is at its time, whichever task.
            let fell_back = match inner.lock().extras.election {
                Election::FellBack { retry_at, fails } => Some((retry_at, fails)),
                _ => None,
            };
            if let Some((retry_at, _)) = fell_back {
                tokio::time::sleep_until(retry_at).await;
            }
            match self.publish().await {
                Ok(()) => {
                    if fell_back.is_some() {
                        info!(
                            lease_candidate = %self.name,
                            "coordinated leader election: the API server serves LeaseCandidate now: published; \
                             the API server's election is in force from the next campaign"
                        );
                    } else {
                        info!(lease_candidate = %self.name, "coordinated leader election: LeaseCandidate published");
                    }
                    inner.set_election(Election::Coordinated);
                    break;
                }
                Err(e @ CallError::NotServed(_)) => {
                    let fails = fell_back.map_or(0, |(_, fails)| fails.saturating_add(1));
                    let delay = republish_backoff().nth(fails).unwrap_or(REPUBLISH_MAX);
                    if fell_back.is_none() {
                        warn!(
                            error = %e,
                            retry_in = ?delay,
                            "coordinated leader election: the API server does not serve coordination.k8s.io/v1beta1 \
                             LeaseCandidate (the CoordinatedLeaderElection feature gate is off, or it is still \
                             starting): falling back to the ordinary election, and publishing again with backoff"
                        );
                    } else {
                        debug!(error = %e, retry_in = ?delay, "coordinated leader election: LeaseCandidate still not served");
                    }
                    inner.set_election(Election::FellBack {
                        retry_at: tokio::time::Instant::now() + delay,
                        fails,
                    });
                }
                Err(e) => {
                    let delay = backoff.get_or_insert_with(|| inner.config.retry_backoff()).next();
                    if matches!(&e, CallError::Api(e) if crate::error::refused_by_rbac(e)) {
                        warn!(
                            error = %e,
                            retry_in = ?delay,
                            "coordinated leader election: forbidden to publish the LeaseCandidate: {RBAC_RULE}; this \
                             candidate cannot be elected until then"
                        );
                    } else {
                        warn!(error = %e, retry_in = ?delay, "coordinated leader election: publishing the LeaseCandidate failed");
                    }
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Keeps the published `LeaseCandidate`: answers pings, refreshes it,
    /// re-creates it if it is deleted. Returns when a publication is answered
    /// 404 (tried when the object is gone, or a read or the watch is answered
    /// 404): the API server no longer serves `LeaseCandidate`.
    ///
    /// A renewal that fails (an answer to a ping, a refresh) brings the
    /// refresh forward, after the elector's retry backoff: the API server
    /// pings again only a candidate that answered its last ping, and stops
    /// its election when none did, until a `LeaseCandidate` changes; a late
    /// answer starts it again.
    async fn keep(&self, inner: &Inner) {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let watch = || {
            watcher(self.api.clone(), config.clone())
                .default_backoff()
                .boxed()
        };
        let mut events = watch();
        // Each retry period, whether the API server's election has been due
        // long enough to watch the candidate anew (`Rewatch`).
        let mut due_check = tokio::time::interval(inner.config.retry_period);
        let mut rewatch = Rewatch::default();
        let mut refresh = tokio::time::interval_at(tokio::time::Instant::now() + REFRESH, REFRESH);
        let mut backoff = None;
        // The last ping answered.
        let mut answered: Option<Timestamp> = None;
        // Whether the watch's current (re-)list showed the object: one that
        // did not was deleted while the watch was away (a re-list after
        // `410 Gone` brings no `DELETED` event).
        let mut listed = false;
        // While the watch is refused by RBAC (no `list`/`watch` on
        // `leasecandidates`): a read every retry period, so that pings are
        // still answered within the API server's election.
        let mut poll: Option<tokio::time::Interval> = None;
        loop {
            // Whether a renewal landed, if one was sent.
            let mut renewed = None;
            let polled = next_read(poll.as_mut());
            let served = futures::select_biased! {
                event = events.next().fuse() => match watch_allowed(event, &mut poll) {
                    Some(Ok(watcher::Event::Init)) => {
                        listed = false;
                        true
                    }
                    Some(Ok(watcher::Event::InitDone)) if !listed => {
                        info!("coordinated leader election: the LeaseCandidate is gone (re-listed): publishing it again");
                        self.publish_again(&mut renewed).await
                    }
                    Some(Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object))) => {
                        listed = true;
                        // Each ping is answered once: an answer that did not
                        // land after it (a clock further behind the API
                        // server's than `PING_AHEAD_MAX`) is not sent again
                        // on every event of our own writes.
                        if let Some(ping) = unanswered_ping(&object)
                            && answered.replace(ping) != Some(ping)
                        {
                            debug!("coordinated leader election: pinged by the API server");
                            renewed = Some(self.renew(object).await);
                        }
                        true
                    }
                    Some(Ok(watcher::Event::Delete(_))) => {
                        info!("coordinated leader election: the LeaseCandidate was deleted: publishing it again");
                        self.publish_again(&mut renewed).await
                    }
                    Some(Ok(_)) => true,
                    Some(Err(e)) if crate::error::watch_refused_by_rbac(&e) => {
                        refused_watch(&e, &mut poll, inner.config.retry_period);
                        true
                    }
                    Some(Err(e)) => {
                        debug!(error = %Chain(&e), "coordinated leader election: watch of the LeaseCandidate failed");
                        // The list or watch answered 404: is the API still served?
                        crate::error::watch_status(&e) != Some(404) || self.publish_again(&mut renewed).await
                    }
                    None => pending().await,
                },
                _ = due_check.tick().fuse() => {
                    let due = inner.lock().extras.election_due;
                    if rewatch.due(due, tokio::time::Instant::now()) {
                        events = watch();
                    }
                    true
                }
                () = polled.fuse() => self.read_for_a_ping(&mut answered, &mut renewed).await,
                _ = refresh.tick().fuse() => {
                    match bounded(self.api.get_opt(&self.name)).await {
                        Ok(Some(object)) => {
                            renewed = Some(self.renew(object).await);
                            true
                        }
                        Ok(None) => self.publish_again(&mut renewed).await,
                        Err(e) if e.status() == Some(404) => self.publish_again(&mut renewed).await,
                        Err(e) => {
                            warn!(error = %e, "coordinated leader election: reading the LeaseCandidate failed{}", rbac_hint(&e, "get"));
                            renewed = Some(false);
                            true
                        }
                    }
                }
            };
            if !served {
                return;
            }
            match renewed {
                Some(false) => {
                    let delay = backoff.get_or_insert_with(|| inner.config.retry_backoff()).next();
                    debug!(retry_in = ?delay, "coordinated leader election: renewing the LeaseCandidate again soon");
                    refresh.reset_after(delay);
                }
                Some(true) => backoff = None,
                None => {}
            }
        }
    }

    /// Reads the `LeaseCandidate` in place of its refused watch, and answers
    /// a ping it shows, once (as [`keep`](Self::keep) answers one delivered);
    /// publishes it again if it is gone. `false` when that is answered 404.
    async fn read_for_a_ping(&self, answered: &mut Option<Timestamp>, renewed: &mut Option<bool>) -> bool {
        match bounded(self.api.get_opt(&self.name)).await {
            Ok(Some(object)) => {
                if let Some(ping) = unanswered_ping(&object)
                    && answered.replace(ping) != Some(ping)
                {
                    debug!("coordinated leader election: pinged by the API server (read)");
                    *renewed = Some(self.renew(object).await);
                }
                true
            }
            Ok(None) => self.publish_again(renewed).await,
            Err(e) if e.status() == Some(404) => self.publish_again(renewed).await,
            Err(e) => {
                debug!(error = %e, "coordinated leader election: reading the LeaseCandidate failed");
                true
            }
        }
    }

    /// Publishes the `LeaseCandidate` again (it is gone, or may be): `false`
    /// when its creation is answered 404 (the API server no longer serves it).
    /// Sets `renewed` to whether it landed: a publication that failed is
    /// tried again after the retry backoff, as a failed renewal is (the
    /// object may be gone: until it is back, the API server cannot elect
    /// this candidate).
    async fn publish_again(&self, renewed: &mut Option<bool>) -> bool {
        match self.publish().await {
            Ok(()) => {
                *renewed = Some(true);
                true
            }
            Err(CallError::NotServed(_)) => false,
            Err(e) => {
                warn!(error = %e, "coordinated leader election: publishing the LeaseCandidate failed");
                *renewed = Some(false);
                true
            }
        }
    }

    /// Creates the `LeaseCandidate`, or renews the one that exists (ours from an
    /// earlier task or process: same name, same Lease). An object of our
    /// name for another Lease is not ours: it is left alone. An object
    /// created or deleted by someone else meanwhile sends the publication
    /// round again, a few times.
    async fn publish(&self) -> Result<(), CallError> {
        for _ in 0..PUBLISH_ROUNDS {
            let created = match bounded(self.api.create(&PostParams::default(), &self.object())).await {
                Err(CallError::Api(e)) if crate::error::status_of(&e) == Some(404) => {
                    return Err(CallError::NotServed(e));
                }
                created => created,
            };
            match created {
                Ok(object) => {
                    self.published(&object);
                    return Ok(());
                }
                Err(e) if e.status() == Some(409) => {}
                Err(e) => return Err(e),
            }
            // It exists: ours from an earlier task or process, if it names our Lease.
            let Some(mut existing) = bounded(self.api.get_opt(&self.name)).await? else {
                continue; // deleted since: create it again
            };
            let lease = existing.data["spec"]["leaseName"].as_str().unwrap_or_default();
            if lease != self.lease {
                return Err(CallError::NotOurs {
                    lease: lease.to_owned(),
                });
            }
            // Ours now: our settings (an older binary of ours may have
            // published other versions), renewed now.
            if let Some(spec) = existing.data.get_mut("spec").and_then(|s| s.as_object_mut()) {
                spec.insert("binaryVersion".into(), json!(self.settings.binary_version));
                spec.insert("emulationVersion".into(), json!(self.settings.emulation_version));
                spec.insert("strategy".into(), json!(self.settings.strategy));
            }
            set_renewed(&mut existing);
            match bounded(self.api.replace(&self.name, &PostParams::default(), &existing)).await {
                Ok(object) => {
                    self.published(&object);
                    return Ok(());
                }
                // Deleted or changed since the read: round again.
                Err(e) if matches!(e.status(), Some(404 | 409)) => {}
                Err(e) => return Err(e),
            }
        }
        Err(CallError::Raced)
    }

    /// Answers a ping (or refreshes): `renewTime` now (after the ping, see
    /// [`set_renewed_after`]), with the resourceVersion read; a conflict is
    /// retried once after a fresh read. Whether it landed (a conflict twice,
    /// or an object deleted meanwhile, counts as landed: the watch tells
    /// what changed).
    async fn renew(&self, mut object: DynamicObject) -> bool {
        let ping = unanswered_ping(&object);
        for attempt in 0..2 {
            set_renewed_after(&mut object, ping);
            match bounded(self.api.replace(&self.name, &PostParams::default(), &object)).await {
                Ok(_) => return true,
                Err(e) if e.status() == Some(409) && attempt == 0 => {
                    match bounded(self.api.get_opt(&self.name)).await {
                        Ok(Some(fresh)) => object = fresh,
                        Ok(None) => return true,
                        Err(e) => {
                            warn!(error = %e, "coordinated leader election: reading the LeaseCandidate failed{}", rbac_hint(&e, "get"));
                            return false;
                        }
                    }
                }
                Err(e) => {
                    warn!(error = %e, "coordinated leader election: renewing the LeaseCandidate failed{}", rbac_hint(&e, "update"));
                    return false;
                }
            }
        }
        true
    }

    /// Deletes the `LeaseCandidate` this task published (the election task
    /// ends), bounded: with its uid as the precondition, so that an object of
    /// the same name published since by another elector is left alone.
    pub(super) async fn delete(&self) {
        let Some(uid) = self.uid.lock().clone() else {
            return;
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match bounded(self.api.delete(&self.name, &params)).await {
            Err(e) if e.status() == Some(409) => {
                debug!("coordinated leader election: the LeaseCandidate is another's now: left alone");
            }
            Ok(_) => debug!("coordinated leader election: LeaseCandidate deleted"),
            Err(e) if e.status() == Some(404) => {}
            Err(e) => warn!(
                error = %e,
                "coordinated leader election: deleting the LeaseCandidate failed{}",
                rbac_hint(&e, "delete")
            ),
        }
    }
}

/// The Role rule a candidate needs on its `LeaseCandidate`, as its warnings
/// name it.
const RBAC_RULE: &str = "RBAC needs verbs create, get, list, watch, update, delete on resource `leasecandidates` in API group \
     `coordination.k8s.io`";

/// What a failed call on the `LeaseCandidate` (`verb`) adds to its warning:
/// the missing RBAC verb, when authorization refused it.
fn rbac_hint(e: &CallError, verb: &str) -> String {
    if matches!(e, CallError::Api(e) if crate::error::refused_by_rbac(e)) {
        format!(": forbidden: {RBAC_RULE}; `{verb}` is missing")
    } else {
        String::new()
    }
}

/// The next read of the `LeaseCandidate` in place of its refused watch
/// (never, while it is allowed).
async fn next_read(poll: Option<&mut tokio::time::Interval>) {
    match poll {
        Some(poll) => drop(poll.tick().await),
        None => pending::<()>().await,
    }
}

/// The `LeaseCandidate`'s watch refused by RBAC (`e`): warned once, naming
/// the verbs, until it is allowed, with reads every `retry_period` in its
/// place (`poll`) from now on, so that pings are still answered within the
/// API server's election (it elects only candidates that answered).
fn refused_watch(e: &watcher::Error, poll: &mut Option<tokio::time::Interval>, retry_period: Duration) {
    if poll.is_some() {
        return;
    }
    warn!(
        error = %Chain(e),
        "coordinated leader election: forbidden to watch the LeaseCandidate: {RBAC_RULE}; `list` and `watch` are \
         missing: reading it every retry period instead, to answer the API server's pings"
    );
    let mut every = tokio::time::interval(retry_period);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    *poll = Some(every);
}

/// `event` of the `LeaseCandidate`'s watch, ending the reads that stand in
/// for it (`poll`) once it delivers (a list begun, `Init`, is not yet
/// allowed: the watcher announces each attempt so).
fn watch_allowed<T>(
    event: Option<Result<watcher::Event<T>, watcher::Error>>,
    poll: &mut Option<tokio::time::Interval>,
) -> Option<Result<watcher::Event<T>, watcher::Error>> {
    if matches!(&event, Some(Ok(e)) if !matches!(e, watcher::Event::Init)) && poll.take().is_some() {
        info!("coordinated leader election: the LeaseCandidate's watch is allowed again");
    }
    event
}

/// The identity a coordinated candidate campaigns with for the Lease
/// `lease`, and the name of its `LeaseCandidate`: `<identity>.<lease>`. The
/// API server writes the elected `LeaseCandidate`'s name as the Lease's
/// holder, so the name must be the candidate's identity; and so that a
/// process with one identity and several Leases (two controllers under one
/// `unique_identity()`) publishes one candidate per Lease, the name carries
/// the Lease. (client-go's components name theirs after the identity alone,
/// with one Lease per process.) A name longer than the API allows (253)
/// keeps its first 236 characters and appends a stable hash of the whole.
pub(crate) fn candidate_name(identity: &str, lease: &str) -> String {
    let name = format!("{identity}.{lease}");
    if name.len() <= 253 {
        return name;
    }
    // FNV-1a: stable across processes and versions (std's hasher is not).
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut cut = 236;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-{hash:016x}", &name[..cut])
}

/// Sets `spec.renewTime` to now.
fn set_renewed(object: &mut DynamicObject) {
    set_renewed_after(object, None);
}

/// Sets `spec.renewTime` to now, or, answering the ping `ping` made on an
/// API server's clock ahead of ours by at most [`PING_AHEAD_MAX`], just after
/// it: the API server counts an answer only if its `renewTime` is after the
/// ping.
fn set_renewed_after(object: &mut DynamicObject, ping: Option<Timestamp>) {
    let now = record::now();
    let after_ping = ping
        .filter(|ping| {
            *ping >= now
                && ping.duration_since(now) <= SignedDuration::try_from(PING_AHEAD_MAX).unwrap_or_default()
        })
        .and_then(|ping| ping.checked_add(SignedDuration::from_micros(1)).ok());
    let renewed = after_ping.unwrap_or(now);
    if let Some(spec) = object.data.get_mut("spec").and_then(|s| s.as_object_mut()) {
        spec.insert(
            "renewTime".into(),
            serde_json::to_value(MicroTime(renewed)).unwrap_or_default(),
        );
    }
}

/// The `spec` time `field` of `object`.
fn spec_time(object: &DynamicObject, field: &str) -> Option<Timestamp> {
    object
        .data
        .get("spec")
        .and_then(|s| s.get(field))
        .and_then(|v| serde_json::from_value::<MicroTime>(v.clone()).ok())
        .map(|t| t.0)
}

/// Whether the API server pinged the `LeaseCandidate`: `pingTime` after `renewTime`
/// (or no `renewTime` at all).
#[cfg(test)]
fn pinged(object: &DynamicObject) -> bool {
    unanswered_ping(object).is_some()
}

/// The API server's ping of the `LeaseCandidate` not answered yet: its
/// `pingTime`, if after `renewTime` (or with no `renewTime` at all).
fn unanswered_ping(object: &DynamicObject) -> Option<Timestamp> {
    let ping = spec_time(object, "pingTime")?;
    spec_time(object, "renewTime")
        .is_none_or(|renew| ping > renew)
        .then_some(ping)
}

#[cfg(test)]
mod tests;
