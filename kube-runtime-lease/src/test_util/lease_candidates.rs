//! The double's `coordination.k8s.io/v1beta1` `LeaseCandidate`s, once
//! [`FakeLeaseApi::serve_lease_candidates`] was called: create, get,
//! replace (409 on a stale resourceVersion, 422 without one, no-op updates,
//! create on update), delete, lists and watches (by namespace and
//! `metadata.name`, watches replayed from a resourceVersion), and the API
//! server's ping.

use std::{collections::BTreeMap, time::Duration};

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Method, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{
    FakeLeaseApi, Received,
    wire::{ResBody, Target, created, field_selector_name, forbidden, ok, status, watch_response},
};

/// The key of a `LeaseCandidate`: its name in the namespace `default`,
/// `<namespace>/<name>` in any other (as [`FakeLeaseApi::lease_candidates`]
/// shows them, and the helpers take them).
pub(super) fn display_key(namespace: &str, name: &str) -> String {
    if namespace == "default" {
        name.to_owned()
    } else {
        format!("{namespace}/{name}")
    }
}

/// What the double serves of `LeaseCandidate`s.
#[derive(Default)]
pub(super) struct Served {
    /// The `LeaseCandidate`s, once [`FakeLeaseApi::serve_lease_candidates`]
    /// was called (`None`: answered 404, as by an API server without
    /// Coordinated Leader Election).
    objects: Option<LeaseCandidates>,
    /// The status every `LeaseCandidate` request is answered with, if set
    /// (see [`FakeLeaseApi::refuse_lease_candidates`]).
    refused: Option<u16>,
    /// The verbs (`create`, `get`, `list`, `watch`, `update`, `delete`)
    /// refused with authorization's 403: a Role without them.
    #[cfg(test)]
    forbidden: Vec<&'static str>,
    /// How long every `LeaseCandidate` request takes (paused time).
    latency: Duration,
}

/// The `LeaseCandidate`s kept, their history (for watches from a
/// resourceVersion) and their watchers.
#[derive(Default)]
pub(super) struct LeaseCandidates {
    /// By [`display_key`].
    pub(super) objects: BTreeMap<String, Value>,
    rv: u64,
    /// Every change: (resourceVersion, key, event type, the object).
    history: Vec<(u64, String, &'static str, Value)>,
    /// Watches: the namespace they watch, a name (`None`: all), their events.
    watchers: Vec<(String, Option<String>, mpsc::UnboundedSender<Bytes>)>,
    /// Watches stalled: open, told nothing.
    stalled: Vec<mpsc::UnboundedSender<Bytes>>,
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({ "type": kind, "object": object })).unwrap();
    line.push(b'\n');
    Bytes::from(line)
}

/// Whether `object` is selected by a watch or list of `namespace`
/// and, if given, one name.
fn selects(namespace: &str, only: Option<&str>, object: &Value) -> bool {
    object["metadata"]["namespace"].as_str().unwrap_or("default") == namespace
        && only.is_none_or(|n| object["metadata"]["name"].as_str() == Some(n))
}

impl LeaseCandidates {
    /// Stores `object` under `key` with a new resourceVersion, telling its
    /// watchers.
    fn store(&mut self, key: &str, mut object: Value, kind: &'static str) -> Value {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("candidate-uid-{}", self.rv));
        }
        self.objects.insert(key.to_owned(), object.clone());
        self.emit(key, kind, &object);
        object
    }

    fn emit(&mut self, key: &str, kind: &'static str, object: &Value) {
        self.history.push((self.rv, key.to_owned(), kind, object.clone()));
        let line = event_line(kind, object);
        self.watchers.retain(|(namespace, only, tx)| {
            !selects(namespace, only.as_deref(), object) || tx.unbounded_send(line.clone()).is_ok()
        });
    }

    /// Sets `spec.pingTime` to now, as the API server does before it elects.
    pub(super) fn ping(&mut self, key: &str) -> bool {
        let Some(mut object) = self.objects.get(key).cloned() else {
            return false;
        };
        object["spec"]["pingTime"] =
            serde_json::to_value(MicroTime(crate::record::now())).unwrap_or_default();
        self.store(key, object, "MODIFIED");
        true
    }

    /// Ends every watch with a `410 Gone` error event (etcd compacted past
    /// its resourceVersion): watchers re-list.
    pub(super) fn expire_watches(&mut self) {
        let line = super::server::gone_event_line();
        for (_, _, tx) in self.watchers.drain(..) {
            let _ = tx.unbounded_send(line.clone());
        }
    }

    /// Keeps every watch open but silent from now on (a stalled connection).
    pub(super) fn stall_watches(&mut self) {
        let stalled = self.watchers.drain(..).map(|(_, _, tx)| tx);
        self.stalled.extend(stalled);
    }

    /// Deletes `key` (as someone else would), telling its watchers; what it was.
    pub(super) fn delete(&mut self, key: &str) -> Option<Value> {
        let mut object = self.objects.remove(key)?;
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.emit(key, "DELETED", &object);
        Some(object)
    }

    /// A `replace` of `key` with `object`: 422 without a resourceVersion
    /// (no unconditional update), compare-and-swap on it, no-op updates,
    /// create on update unless the write names a uid that is gone.
    fn replace(&mut self, key: &str, mut object: Value) -> Response<ResBody> {
        let Some(sent) = object["metadata"]["resourceVersion"].as_str().map(str::to_owned) else {
            return status(
                422,
                "Invalid",
                "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
            );
        };
        let Some(stored) = self.objects.get(key) else {
            if !object["metadata"]["uid"].is_null() {
                return status(
                    409,
                    "Conflict",
                    "Precondition failed: UID in precondition does not match",
                );
            }
            return created(&self.store(key, object, "ADDED"));
        };
        if Some(sent.as_str()) != stored["metadata"]["resourceVersion"].as_str() {
            return status(409, "Conflict", "the object has been modified");
        }
        object["metadata"]["uid"] = stored["metadata"]["uid"].clone();
        let meta = |o: &Value, f: &str| o["metadata"][f].clone();
        if object["spec"] == stored["spec"]
            && ["labels", "annotations", "finalizers"]
                .iter()
                .all(|f| meta(&object, f) == meta(stored, f))
        {
            // A no-op: no new resourceVersion, no event.
            return ok(stored);
        }
        ok(&self.store(key, object, "MODIFIED"))
    }

    /// A list, or a watch replayed from its resourceVersion, of the
    /// `LeaseCandidate`s of `namespace` (one name, with a field selector).
    fn list_or_watch(&mut self, namespace: &str, is_watch: bool, query: &str) -> Response<ResBody> {
        let only = field_selector_name(query);
        if is_watch {
            let from = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("resourceVersion="))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(self.rv);
            let (tx, rx) = mpsc::unbounded();
            for (rv, _, kind, object) in &self.history {
                if *rv > from && selects(namespace, only.as_deref(), object) {
                    let _ = tx.unbounded_send(event_line(kind, object));
                }
            }
            self.watchers.push((namespace.to_owned(), only, tx));
            return watch_response(rx);
        }
        let items: Vec<_> = self
            .objects
            .values()
            .filter(|o| selects(namespace, only.as_deref(), o))
            .cloned()
            .collect();
        ok(&json!({
            "apiVersion": "coordination.k8s.io/v1beta1", "kind": "LeaseCandidateList",
            "metadata": { "resourceVersion": self.rv.to_string() }, "items": items,
        }))
    }

    /// Replaces the stored object (as someone else's write would), by its
    /// namespace (`default` when it names none) and name.
    pub(super) fn put(&mut self, mut object: Value) {
        if object["metadata"]["namespace"].is_null() {
            object["metadata"]["namespace"] = json!("default");
        }
        let key = display_key(
            object["metadata"]["namespace"].as_str().unwrap_or("default"),
            object["metadata"]["name"].as_str().unwrap_or_default(),
        );
        if let Some(stored) = self.objects.get(&key) {
            object["metadata"]["uid"] = stored["metadata"]["uid"].clone();
        }
        let kind = if self.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.store(&key, object, kind);
    }
}

impl FakeLeaseApi {
    /// A `LeaseCandidate` request, after the latency set for them.
    pub(super) async fn lease_candidate_request(
        &self,
        target: &Target,
        method: &Method,
        is_watch: bool,
        query: &str,
        body: &[u8],
    ) -> Response<ResBody> {
        let latency = self.lock().candidates.latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        self.lease_candidate(target, method, is_watch, query, body)
    }

    /// A double that also serves `coordination.k8s.io/v1beta1`
    /// `LeaseCandidate`s (create, get, replace with resourceVersion checks,
    /// delete, lists and watches; kept for
    /// [`lease_candidates`](Self::lease_candidates)), as an API server with
    /// Coordinated Leader Election does. It does not elect: a test plays the
    /// API server's part with [`put`](Self::put). Without it, every
    /// `LeaseCandidate` request is answered 404, as where the feature is off.
    #[must_use]
    pub fn serve_lease_candidates(self) -> Self {
        self.lock().candidates.objects = Some(LeaseCandidates::default());
        self
    }

    /// Answers every `LeaseCandidate` request with `status` (403: RBAC
    /// without `leasecandidates`; 500: a failing API server).
    #[must_use]
    pub fn refuse_lease_candidates(self, status: u16) -> Self {
        self.lock().candidates.refused = Some(status);
        self
    }

    /// From now on, answers every `LeaseCandidate` request with `status`
    /// (`None`: serves them again); see
    /// [`refuse_lease_candidates`](Self::refuse_lease_candidates).
    pub fn set_lease_candidates_refused(&self, status: Option<u16>) {
        self.lock().candidates.refused = status;
    }

    /// From now on, refuses the `LeaseCandidate` requests of `verbs`
    /// (`create`, `get`, `list`, `watch`, `update`, `delete`) with
    /// authorization's 403, naming the verb: a Role without them.
    #[cfg(test)]
    pub(crate) fn forbid_lease_candidate_verbs(&self, verbs: &[&'static str]) {
        self.lock().candidates.forbidden = verbs.to_vec();
    }

    /// Makes every `LeaseCandidate` request take `latency` before it is
    /// handled.
    #[must_use]
    pub fn lease_candidates_latency(self, latency: Duration) -> Self {
        self.lock().candidates.latency = latency;
        self
    }

    /// Pings the `LeaseCandidate` `key` (its name in the namespace
    /// `default`, else `<namespace>/<name>`), as the API server does before it
    /// elects (`spec.pingTime` now): a live candidate answers by renewing
    /// (`spec.renewTime` after it). Whether it exists.
    #[must_use]
    pub fn ping_lease_candidate(&self, key: &str) -> bool {
        self.lock()
            .candidates
            .objects
            .as_mut()
            .is_some_and(|c| c.ping(key))
    }

    /// Stores `object` as a `LeaseCandidate` (by its namespace, `default`
    /// when it names none, and name), as someone else's write would: a new
    /// resourceVersion, its watchers told.
    pub fn put_lease_candidate(&self, object: serde_json::Value) {
        if let Some(c) = self.lock().candidates.objects.as_mut() {
            c.put(object);
        }
    }

    /// Deletes the `LeaseCandidate` `key` (as for
    /// [`ping_lease_candidate`](Self::ping_lease_candidate)), as someone else
    /// would (its watchers are told). Whether it existed.
    #[must_use]
    pub fn delete_lease_candidate(&self, key: &str) -> bool {
        self.lock()
            .candidates
            .objects
            .as_mut()
            .is_some_and(|c| c.delete(key).is_some())
    }

    /// Ends every `LeaseCandidate` watch with a `410 Gone` error event, as an
    /// API server does when etcd compacted past a watch's resourceVersion
    /// (after a long disconnection): watchers re-list, and what changed
    /// meanwhile shows only in the list.
    pub fn expire_lease_candidate_watches(&self) {
        if let Some(c) = self.lock().candidates.objects.as_mut() {
            c.expire_watches();
        }
    }

    /// Keeps every `LeaseCandidate` watch open now silent from now on, neither
    /// ending nor failing (a connection that stalled); watches opened later
    /// are told as usual.
    pub fn stall_lease_candidate_watches(&self) {
        if let Some(c) = self.lock().candidates.objects.as_mut() {
            c.stall_watches();
        }
    }

    /// The `LeaseCandidate`s stored now, as JSON, by key: the name in the
    /// namespace `default`, `<namespace>/<name>` in any other.
    #[must_use]
    pub fn lease_candidates(&self) -> std::collections::BTreeMap<String, serde_json::Value> {
        self.lock()
            .candidates
            .objects
            .as_ref()
            .map(|c| c.objects.clone())
            .unwrap_or_default()
    }

    /// A `LeaseCandidate` request (seen as `candidate <verb>`): 404 unless
    /// [`FakeLeaseApi::serve_lease_candidates`] was called.
    fn lease_candidate(
        &self,
        target: &Target,
        method: &Method,
        is_watch: bool,
        query: &str,
        body: &[u8],
    ) -> Response<ResBody> {
        let namespace = target.namespace.as_deref().unwrap_or("default");
        let name = target.name.as_deref();
        let verb = match (method, name, is_watch) {
            (&Method::POST, _, _) => "candidate create",
            (&Method::GET, Some(_), _) => "candidate get",
            (&Method::GET, None, true) => "candidate watch",
            (&Method::GET, None, false) => "candidate list",
            (&Method::PUT, _, _) => "candidate update",
            (&Method::DELETE, _, _) => "candidate delete",
            _ => "candidate other",
        };
        let mut s = self.lock();
        s.received.push(Received {
            at: Instant::now(),
            client: usize::MAX,
            verb,
            name: name.map(str::to_owned),
        });
        if let Some(code) = s.candidates.refused {
            // A 403 is the one of authorization (RBAC without `leasecandidates`).
            if code == 403 {
                return forbidden("leasecandidates", "coordination.k8s.io", "create", None);
            }
            return status(code, "Refused", "refused by the test");
        }
        #[cfg(test)]
        if let Some(verb) = verb.strip_prefix("candidate ")
            && s.candidates.forbidden.contains(&verb)
        {
            return forbidden("leasecandidates", "coordination.k8s.io", verb, None);
        }
        let Some(candidates) = s.candidates.objects.as_mut() else {
            return status(404, "NotFound", "the double serves no lease candidates");
        };
        let parsed = || {
            let mut object = serde_json::from_slice::<Value>(body).ok()?;
            if object["metadata"]["namespace"].is_null() {
                object["metadata"]["namespace"] = json!(namespace);
            }
            Some(object)
        };
        let key = |name: &str| display_key(namespace, name);
        match (method, name) {
            (&Method::POST, _) => match parsed() {
                Some(mut object) => {
                    let Some(name) = object["metadata"]["name"].as_str().map(str::to_owned) else {
                        return status(422, "Invalid", "a LeaseCandidate needs a name");
                    };
                    if candidates.objects.contains_key(&key(&name)) {
                        return status(409, "AlreadyExists", "the LeaseCandidate exists");
                    }
                    object["metadata"]["uid"] = Value::Null;
                    created(&candidates.store(&key(&name), object, "ADDED"))
                }
                None => status(400, "BadRequest", "not JSON"),
            },
            (&Method::GET, Some(name)) => match candidates.objects.get(&key(name)) {
                Some(object) => ok(object),
                None => status(404, "NotFound", "no such LeaseCandidate"),
            },
            (&Method::PUT, Some(name)) => match parsed() {
                Some(object) => candidates.replace(&key(name), object),
                None => status(400, "BadRequest", "not JSON"),
            },
            (&Method::DELETE, Some(name)) => match candidates.delete(&key(name)) {
                Some(object) => ok(&object),
                None => status(404, "NotFound", "no such LeaseCandidate"),
            },
            (&Method::GET, None) => candidates.list_or_watch(namespace, is_watch, query),
            _ => status(405, "MethodNotAllowed", "not served by the double"),
        }
    }
}
