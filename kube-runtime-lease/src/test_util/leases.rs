//! The double's Leases, as the API server keeps them: any number, by
//! namespace and name, one resourceVersion sequence and one history for all
//! (as etcd has), lists and watches filtered by namespace, by name
//! (`fieldSelector=metadata.name=`) and by labels (`labelSelector=`), and the
//! API server's rules for each write.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use futures::channel::mpsc;
use http::Response;
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::json;

use super::{
    FakeLeaseApi, Store,
    wire::{
        ResBody, created, field_selector_name, full, in_namespace, invalid_spec, ok, status, watch_response,
        with_type,
    },
};

/// A Lease's namespace and name.
pub(super) type Key = (String, String);

/// The key of `lease` (its namespace `default` when it names none).
pub(super) fn key(lease: &Lease) -> Key {
    (
        lease
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        lease.metadata.name.clone().unwrap_or_default(),
    )
}

/// What a list or a watch selects: a namespace (none: every namespace), a
/// name, and labels (`key=value`, `key==value`, `key!=value`, `key`, `!key`,
/// and the set-based `key in (a,b)` and `key notin (a,b)`; anything else
/// selects nothing).
#[derive(Debug)]
pub(super) struct Filter {
    namespace: Option<String>,
    name: Option<String>,
    labels: Vec<Requirement>,
}

/// One requirement of a label selector.
#[derive(Debug)]
enum Requirement {
    Has(String),
    HasNot(String),
    Is(String, String),
    IsNot(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    /// A requirement the double does not understand.
    Unknown,
}

impl Requirement {
    fn of(r: &str) -> Self {
        let r = r.trim();
        let set = |rest: &str| {
            let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
            Some(
                inner
                    .split(',')
                    .map(|v| v.trim().to_owned())
                    .filter(|v| !v.is_empty())
                    .collect::<BTreeSet<String>>(),
            )
        };
        if let Some((k, rest)) = r.split_once(" notin ") {
            set(rest).map_or(Requirement::Unknown, |vs| {
                Requirement::NotIn(k.trim().to_owned(), vs)
            })
        } else if let Some((k, rest)) = r.split_once(" in ") {
            set(rest).map_or(Requirement::Unknown, |vs| {
                Requirement::In(k.trim().to_owned(), vs)
            })
        } else if r.contains('(') {
            Requirement::Unknown
        } else if let Some((k, v)) = r.split_once("!=") {
            Requirement::IsNot(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
            Requirement::Is(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some(k) = r.strip_prefix('!') {
            Requirement::HasNot(k.trim().to_owned())
        } else {
            Requirement::Has(r.to_owned())
        }
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Has(k) => labels.contains_key(k),
            Requirement::HasNot(k) => !labels.contains_key(k),
            Requirement::Is(k, v) => labels.get(k) == Some(v),
            Requirement::IsNot(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Unknown => false,
        }
    }
}

impl Filter {
    /// The filter of a request to `namespace` with `query`.
    pub(super) fn of(namespace: Option<&str>, query: &str) -> Self {
        let labels = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("labelSelector="))
            .map(|v| {
                split_requirements(&decode(v))
                    .into_iter()
                    .filter(|r| !r.trim().is_empty())
                    .map(Requirement::of)
                    .collect()
            })
            .unwrap_or_default();
        Filter {
            namespace: namespace.map(str::to_owned),
            name: field_selector_name(query),
            labels,
        }
    }

    pub(super) fn matches(&self, lease: &Lease) -> bool {
        let (ns, name) = key(lease);
        let labels = lease.metadata.labels.clone().unwrap_or_default();
        self.namespace.as_ref().is_none_or(|n| *n == ns)
            && self.name.as_ref().is_none_or(|n| *n == name)
            && self.labels.iter().all(|r| r.matches(&labels))
    }
}

/// A selector's requirements: split at the commas outside parentheses.
fn split_requirements(selector: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0u32, 0);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&selector[start..]);
    out
}

/// `%XX` escapes decoded (label selectors arrive percent-encoded).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(hex) = s.get(i + 1..i + 3)
            && let Ok(v) = u8::from_str_radix(hex, 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A watch: its client (partitions end it), what it selects, its events.
pub(super) struct Watcher {
    pub(super) client: usize,
    filter: Filter,
    tx: mpsc::UnboundedSender<Bytes>,
}

/// A list's answer: `items` at `rv`.
fn list(items: impl Iterator<Item = Lease>, rv: u64) -> Response<ResBody> {
    let items: Vec<_> = items.map(|l| with_type(&l)).collect();
    ok(&json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
        "metadata": { "resourceVersion": rv.to_string() }, "items": items,
    }))
}

fn event_line(kind: &str, lease: &Lease) -> Bytes {
    let mut v = serde_json::to_vec(&json!({ "type": kind, "object": with_type(lease) })).unwrap();
    v.push(b'\n');
    v.into()
}

/// Whether a write would leave the stored Lease as it is (the API server
/// then skips it: the same resourceVersion, no watch event).
fn unchanged(lease: &Lease, current: &Lease) -> bool {
    let (a, b) = (&lease.metadata, &current.metadata);
    lease.spec == current.spec
        && a.labels == b.labels
        && a.annotations == b.annotations
        && a.owner_references == b.owner_references
        && a.finalizers == b.finalizers
}

/// The event a watch selecting with `filter` sees for a change from
/// `previous` to `lease` (of `kind`): as the API server's watch cache sends
/// them, an object that starts matching is `ADDED` and one that stops
/// matching is `DELETED`; none if it matched neither before nor after.
fn seen_as(
    filter: &Filter,
    kind: &'static str,
    previous: Option<&Lease>,
    lease: &Lease,
) -> Option<&'static str> {
    let before = previous.is_some_and(|p| filter.matches(p));
    let after = kind != "DELETED" && filter.matches(lease);
    match (before, after) {
        (false, true) => Some("ADDED"),
        (true, true) => Some("MODIFIED"),
        (true, false) => Some("DELETED"),
        (false, false) => None,
    }
}

impl Store {
    /// Stores `lease` under a new resourceVersion (and its uid, if new), and
    /// tells the watchers that select it.
    pub(super) fn store(&mut self, mut lease: Lease, kind: &'static str) -> Lease {
        self.rv += 1;
        lease.metadata.resource_version = Some(self.rv.to_string());
        if lease.metadata.uid.is_none() {
            lease.metadata.uid = Some(format!("uid-{}", self.rv));
        }
        let k = key(&lease);
        lease.metadata.namespace = Some(k.0.clone());
        if self.served.is_none() {
            self.served = Some(k.clone());
        }
        let previous = self.leases.insert(k, lease.clone());
        self.emit(kind, previous.as_ref(), &lease);
        lease
    }

    /// Deletes the Lease `k`, telling its watchers; what it was.
    pub(super) fn remove(&mut self, k: &Key) -> Option<Lease> {
        let previous = self.leases.remove(k)?;
        let mut lease = previous.clone();
        self.rv += 1;
        lease.metadata.resource_version = Some(self.rv.to_string());
        self.emit("DELETED", Some(&previous), &lease);
        Some(lease)
    }

    fn emit(&mut self, kind: &'static str, previous: Option<&Lease>, lease: &Lease) {
        self.history.push((self.rv, kind, lease.clone()));
        let mut sent = Vec::new();
        self.watchers
            .retain(|w| match seen_as(&w.filter, kind, previous, lease) {
                Some(seen) => {
                    sent.push(w.client);
                    w.tx.unbounded_send(event_line(seen, lease)).is_ok()
                }
                None => true,
            });
        for client in sent {
            *self.watch_events.entry(client).or_default() += 1;
        }
    }

    /// The events a watch selecting with `filter` from resourceVersion
    /// `from` is owed: every later change it selects (the history replayed).
    fn replay(&self, filter: &Filter, from: u64) -> Vec<Bytes> {
        let mut last: BTreeMap<Key, Lease> = BTreeMap::new();
        let mut lines = Vec::new();
        for (rv, kind, lease) in &self.history {
            let previous = if *kind == "DELETED" {
                last.remove(&key(lease))
            } else {
                last.insert(key(lease), lease.clone())
            };
            if *rv > from
                && let Some(seen) = seen_as(filter, kind, previous.as_ref(), lease)
            {
                lines.push(event_line(seen, lease));
            }
        }
        lines
    }

    /// Ends every watch of `client` (a partition).
    /// Keeps `client`'s Lease watches open but silent from now on (a
    /// connection that stalled, as behind a proxy that stopped forwarding).
    pub(super) fn stall_watches(&mut self, client: usize) {
        let (stalled, kept) = std::mem::take(&mut self.watchers)
            .into_iter()
            .partition(|w| w.client == client);
        self.watchers = kept;
        let stalled: Vec<Watcher> = stalled;
        self.idle_watches.extend(stalled.into_iter().map(|w| w.tx));
    }

    pub(super) fn cut_watches(&mut self, client: usize) {
        self.watchers.retain(|w| w.client != client);
    }

    /// Ends every watch, each with `line` (a 410 Gone).
    pub(super) fn end_watches(&mut self, line: &Bytes) {
        for w in std::mem::take(&mut self.watchers) {
            let _ = w.tx.unbounded_send(line.clone());
        }
    }

    /// etcd restored from a snapshot taken at resourceVersion `rv`: every
    /// Lease as it was then, and the revision back at `rv`, so later writes
    /// reuse the versions written since.
    pub(super) fn restore(&mut self, rv: u64) {
        self.leases = self.at(rv);
        self.history.retain(|(v, _, _)| *v <= rv);
        self.rv = rv;
    }

    /// The Leases as they were at resourceVersion `rv` (the history replayed).
    fn at(&self, rv: u64) -> BTreeMap<Key, Lease> {
        let mut leases = BTreeMap::new();
        for (_, kind, lease) in self.history.iter().take_while(|(v, _, _)| *v <= rv) {
            if *kind == "DELETED" {
                leases.remove(&key(lease));
            } else {
                leases.insert(key(lease), lease.clone());
            }
        }
        leases
    }

    /// A list one change behind (see [`Fault::StaleList`](super::Fault::StaleList)):
    /// as of just before the last change it selects, at that resourceVersion
    /// (a watch from it then delivers the change); `None` when it selects none.
    pub(super) fn stale_list(&self, filter: &Filter) -> Option<Response<ResBody>> {
        let last = self.history.iter().rev().find(|(rv, _, lease)| {
            filter.matches(lease)
                || self
                    .at(rv - 1)
                    .get(&key(lease))
                    .is_some_and(|p| filter.matches(p))
        })?;
        let before = last.0 - 1;
        Some(list(
            self.at(before).into_values().filter(|l| filter.matches(l)),
            before,
        ))
    }
}

/// One Lease request, as the double handles it.
pub(super) struct LeaseRequest {
    pub(super) client: usize,
    /// See [`Received::verb`](super::Received::verb).
    pub(super) verb: &'static str,
    /// The request path's namespace (none: across namespaces).
    pub(super) namespace: Option<String>,
    /// The request path's name (one object).
    pub(super) name: Option<String>,
    pub(super) query: String,
    pub(super) body: Bytes,
}

impl FakeLeaseApi {
    /// Handles one Lease request.
    pub(super) fn apply(&self, r: &LeaseRequest) -> Response<ResBody> {
        let (client, verb, query, body) = (r.client, r.verb, r.query.as_str(), &r.body[..]);
        let (namespace, name) = (r.namespace.as_deref(), r.name.as_deref());
        let mut s = self.lock();
        let named = || {
            (
                namespace.unwrap_or("default").to_owned(),
                name.unwrap_or_default().to_owned(),
            )
        };
        match verb {
            "get" => match s.leases.get(&named()) {
                Some(l) => ok(&with_type(l)),
                None => not_found(name),
            },
            "list" => {
                let filter = Filter::of(namespace, query);
                list(s.leases.values().filter(|l| filter.matches(l)).cloned(), s.rv)
            }
            "watch" => {
                let filter = Filter::of(namespace, query);
                let from = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("resourceVersion="))
                    .and_then(|v| v.parse::<u64>().ok())
                    .filter(|v| *v > 0);
                let (tx, rx) = mpsc::unbounded();
                match from {
                    Some(from) => {
                        for line in s.replay(&filter, from) {
                            let _ = tx.unbounded_send(line);
                        }
                    }
                    // No resourceVersion, or "0": the current state first,
                    // as synthetic ADDED events.
                    None => {
                        for lease in s.leases.values().filter(|l| filter.matches(l)) {
                            let _ = tx.unbounded_send(event_line("ADDED", lease));
                        }
                    }
                }
                s.watchers.push(Watcher { client, filter, tx });
                let lag = s
                    .clients
                    .get(client)
                    .map_or(std::time::Duration::ZERO, |c| c.watch_latency);
                watch_response(super::wire::lagging(rx, lag))
            }
            "create" => {
                let Ok(mut lease) = serde_json::from_slice::<Lease>(body) else {
                    return status(400, "BadRequest", "bad body");
                };
                if let Some(refused) = in_namespace(&mut lease, namespace) {
                    return refused;
                }
                // Validation comes first, as in the API server.
                if lease.metadata.name.is_none() {
                    return status(
                        422,
                        "Invalid",
                        "metadata.name: Required value: name or generateName is required",
                    );
                }
                if let Some(invalid) = invalid_spec(&lease) {
                    return status(422, "Invalid", invalid);
                }
                if s.leases.contains_key(&key(&lease)) {
                    return status(409, "AlreadyExists", "leases already exists");
                }
                lease.metadata.uid = None;
                created(&with_type(&s.store(lease, "ADDED")))
            }
            "update" => update(&mut s, namespace, name, body),
            "delete" => {
                let Some(current) = s.leases.get(&named()) else {
                    return not_found(name);
                };
                if let Some(failed) = precondition_failed(current, body) {
                    return failed;
                }
                match s.remove(&named()) {
                    Some(lease) => ok(&with_type(&lease)),
                    None => not_found(name),
                }
            }
            _ => status(405, "MethodNotAllowed", "not supported by the double"),
        }
    }
}

/// The API server's 404 for the Lease `name`: a `Status` whose details name it.
fn not_found(name: Option<&str>) -> Response<ResBody> {
    let name = name.unwrap_or_default();
    full(
        404,
        &json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": format!("leases.coordination.k8s.io \"{name}\" not found"),
            "reason": "NotFound",
            "details": { "name": name, "group": "coordination.k8s.io", "kind": "leases" },
            "code": 404,
        }),
    )
}

/// A delete's `DeleteOptions.preconditions` (its body; none when empty)
/// checked against the stored Lease, as the API server checks them: a
/// `resourceVersion` or `uid` that differs is a 409 Conflict, and nothing is
/// deleted.
fn precondition_failed(current: &Lease, body: &[u8]) -> Option<Response<ResBody>> {
    if body.is_empty() {
        return None;
    }
    let Ok(options) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Some(status(400, "BadRequest", "bad body"));
    };
    let pre = options.get("preconditions")?;
    let meta = &current.metadata;
    for (field, stored) in [("uid", &meta.uid), ("resourceVersion", &meta.resource_version)] {
        if let Some(wanted) = pre.get(field).and_then(serde_json::Value::as_str)
            && Some(wanted) != stored.as_deref()
        {
            let message = format!(
                "Precondition failed: {field} in precondition: {wanted}, {field} in object meta: {}",
                stored.as_deref().unwrap_or("")
            );
            return Some(status(409, "Conflict", &message));
        }
    }
    None
}

/// A `replace`: compare-and-swap on the resourceVersion (which must be
/// given); create on update (Leases allow it) unless the write names a uid
/// that is gone.
fn update(s: &mut Store, namespace: Option<&str>, name: Option<&str>, body: &[u8]) -> Response<ResBody> {
    let Ok(mut lease) = serde_json::from_slice::<Lease>(body) else {
        return status(400, "BadRequest", "bad body");
    };
    if let Some(refused) = in_namespace(&mut lease, namespace) {
        return refused;
    }
    if lease.metadata.name.as_deref() != name {
        return status(
            400,
            "BadRequest",
            "the name of the object does not match the name on the URL",
        );
    }
    let Some(current) = s.leases.get(&key(&lease)) else {
        // Leases allow create on update; a write that names the uid of an
        // object that is gone fails its precondition.
        if lease.metadata.uid.is_some() {
            return status(
                409,
                "Conflict",
                "Precondition failed: UID in precondition does not match",
            );
        }
        if let Some(invalid) = invalid_spec(&lease) {
            return status(422, "Invalid", invalid);
        }
        return created(&with_type(&s.store(lease, "ADDED")));
    };
    if lease.metadata.resource_version.is_none() {
        // Leases allow no unconditional update.
        return status(
            422,
            "Invalid",
            "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
        );
    }
    if lease.metadata.resource_version != current.metadata.resource_version
        || lease
            .metadata
            .uid
            .as_ref()
            .is_some_and(|u| Some(u) != current.metadata.uid.as_ref())
    {
        return status(409, "Conflict", "the object has been modified");
    }
    if let Some(invalid) = invalid_spec(&lease) {
        return status(422, "Invalid", invalid);
    }
    // The server keeps the object's identity.
    lease.metadata.uid.clone_from(&current.metadata.uid);
    if unchanged(&lease, current) {
        // A no-op: no new resourceVersion, no event.
        return ok(&with_type(current));
    }
    ok(&with_type(&s.store(lease, "MODIFIED")))
}
