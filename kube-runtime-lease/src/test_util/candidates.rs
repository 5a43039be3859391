//! The double's `coordination.k8s.io/v1beta1` `LeaseCandidate`s, once
//! [`FakeLeaseApi::serve_lease_candidates`] was called: create, get,
//! replace (409 on a stale resourceVersion), delete, lists and watches
//! (filtered by `metadata.name`), and the API server's ping.

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Method, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::wire::{ResBody, created, field_selector_name, ok, status, watch_response};
use super::{FakeLeaseApi, Seen};

/// The `LeaseCandidate`s kept, their resourceVersions and their watchers.
#[derive(Default)]
pub(super) struct Candidates {
    pub(super) objects: std::collections::BTreeMap<String, Value>,
    rv: u64,
    /// Watches, each of one name (`None`: of all).
    watchers: Vec<(Option<String>, mpsc::UnboundedSender<Bytes>)>,
}

impl Candidates {
    /// Stores `object` under `name` with a new resourceVersion, telling its watchers.
    fn store(&mut self, name: &str, mut object: Value, kind: &str) -> Value {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.objects.insert(name.to_owned(), object.clone());
        self.emit(name, kind, &object);
        object
    }

    fn emit(&mut self, name: &str, kind: &str, object: &Value) {
        let mut line = serde_json::to_vec(&json!({ "type": kind, "object": object })).unwrap();
        line.push(b'\n');
        let line = Bytes::from(line);
        self.watchers.retain(|(only, tx)| {
            only.as_deref().is_some_and(|n| n != name) || tx.unbounded_send(line.clone()).is_ok()
        });
    }

    /// Sets `spec.pingTime` to now, as the API server does before it elects.
    pub(super) fn ping(&mut self, name: &str) -> bool {
        let Some(mut object) = self.objects.get(name).cloned() else {
            return false;
        };
        object["spec"]["pingTime"] =
            serde_json::to_value(MicroTime(crate::record::now())).unwrap_or_default();
        self.store(name, object, "MODIFIED");
        true
    }

    /// Deletes `name` (as someone else would), telling its watchers.
    pub(super) fn delete(&mut self, name: &str) -> bool {
        let Some(object) = self.objects.remove(name) else {
            return false;
        };
        self.emit(name, "DELETED", &object);
        true
    }

    /// Replaces the stored object (as someone else's write would).
    pub(super) fn put(&mut self, object: Value) {
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let kind = if self.objects.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.store(&name, object, kind);
    }
}

impl FakeLeaseApi {
    /// A `LeaseCandidate` request (seen as `candidate <verb>`): 404 unless
    /// [`FakeLeaseApi::serve_lease_candidates`] was called.
    pub(super) fn lease_candidate(
        &self,
        method: &Method,
        name: Option<&str>,
        is_watch: bool,
        query: &str,
        body: &[u8],
    ) -> Response<ResBody> {
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
        s.seen.push(Seen {
            at: Instant::now(),
            client: usize::MAX,
            verb,
        });
        if let Some(code) = s.candidates_refused {
            return status(code, "Refused", "refused by the test");
        }
        let Some(candidates) = s.candidates.as_mut() else {
            return status(404, "NotFound", "the double serves no lease candidates");
        };
        let parsed = || serde_json::from_slice::<Value>(body).ok();
        match (method, name) {
            (&Method::POST, _) => match parsed() {
                Some(object) => {
                    let Some(name) = object["metadata"]["name"].as_str().map(str::to_owned) else {
                        return status(422, "Invalid", "a LeaseCandidate needs a name");
                    };
                    if candidates.objects.contains_key(&name) {
                        return status(409, "AlreadyExists", "the LeaseCandidate exists");
                    }
                    created(&candidates.store(&name, object, "ADDED"))
                }
                None => status(400, "BadRequest", "not JSON"),
            },
            (&Method::GET, Some(name)) => match candidates.objects.get(name) {
                Some(object) => ok(object),
                None => status(404, "NotFound", "no such LeaseCandidate"),
            },
            (&Method::PUT, Some(name)) => match (candidates.objects.get(name), parsed()) {
                (Some(stored), Some(object)) => {
                    let sent = object["metadata"]["resourceVersion"].as_str();
                    if sent.is_some_and(|rv| Some(rv) != stored["metadata"]["resourceVersion"].as_str()) {
                        return status(409, "Conflict", "the object has been modified");
                    }
                    let same = |f: &str| object[f] == stored[f];
                    let meta = |o: &Value, f: &str| o["metadata"][f].clone();
                    if same("spec")
                        && ["labels", "annotations"]
                            .iter()
                            .all(|f| meta(&object, f) == meta(stored, f))
                    {
                        // A no-op: no new resourceVersion, no event.
                        return ok(stored);
                    }
                    ok(&candidates.store(name, object, "MODIFIED"))
                }
                // As for Leases, create on update.
                (None, Some(object)) => created(&candidates.store(name, object, "ADDED")),
                (_, None) => status(400, "BadRequest", "not JSON"),
            },
            (&Method::DELETE, Some(name)) => match candidates.objects.get(name).cloned() {
                Some(object) => {
                    candidates.delete(name);
                    ok(&object)
                }
                None => status(404, "NotFound", "no such LeaseCandidate"),
            },
            (&Method::GET, None) => {
                let only = field_selector_name(query);
                if is_watch {
                    // From now on: the double keeps no history of them.
                    let (tx, rx) = mpsc::unbounded();
                    candidates.watchers.push((only, tx));
                    return watch_response(rx);
                }
                let items: Vec<_> = candidates
                    .objects
                    .iter()
                    .filter(|(n, _)| only.as_ref().is_none_or(|o| o == *n))
                    .map(|(_, o)| o.clone())
                    .collect();
                ok(&json!({
                    "apiVersion": "coordination.k8s.io/v1beta1", "kind": "LeaseCandidateList",
                    "metadata": { "resourceVersion": candidates.rv.to_string() }, "items": items,
                }))
            }
            _ => status(405, "MethodNotAllowed", "not served by the double"),
        }
    }
}
