//! Labels, annotations and an owner reference the candidate writes on the
//! Lease ([`LeaseConfig::label`](crate::LeaseConfig::label),
//! [`annotation`](crate::LeaseConfig::annotation),
//! [`owner_reference`](crate::LeaseConfig::owner_reference)), validated as the
//! API server would before any API call. Behind the `lease-metadata` feature.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use tracing::warn;

use crate::{
    config::{ConfigError, LeaseConfig, names::dns1123_subdomain},
    record::{MAX_ANNOTATIONS_SIZE, annotations_size},
};

/// The prefix of the labels the sharded election finds its roster and shard
/// Leases by (`shard::OF_LABEL` and the others): reserved, so that no
/// configured label makes another Lease look like one of them.
pub(crate) const RESERVED_LABEL_PREFIX: &str = "leases.kube-runtime-lease/";

/// What the candidate writes into the Lease's metadata when it takes the
/// Lease (creating it, or beginning a term on it). Only these keys are
/// written: other labels, annotations and owner references are kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LeaseMetadata {
    pub(crate) labels: BTreeMap<String, String>,
    /// The crate's own labels (the sharded election's, under
    /// [`RESERVED_LABEL_PREFIX`]), set after the configured ones.
    pub(crate) own_labels: BTreeMap<String, String>,
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) owner: Option<OwnerReference>,
}

impl LeaseConfig {
    /// A label the candidate sets on the Lease when it takes it (creating it,
    /// or beginning a term) and again at each renewal (one removed or edited
    /// meanwhile comes back), for example the holder's pod and node, so that
    /// `kubectl get lease -l ...` finds it. Only the configured keys are
    /// written; other labels are kept. Checked by [`validate`](Self::validate)
    /// as the API server would. Keys under `leases.kube-runtime-lease/` are
    /// reserved (elected shards find their Leases by them): `validate`
    /// refuses them.
    ///
    /// ```
    /// use kube_runtime_lease::LeaseConfig;
    ///
    /// let config = LeaseConfig::new("default", "my-controller", "pod-a_1f3x")
    ///     .label("app.kubernetes.io/name", "my-controller")
    ///     .annotation("example.com/holder-node", "node-7");
    /// assert!(config.validate().is_ok());
    /// assert!(LeaseConfig::new("default", "x", "me").label("bad key", "v").validate().is_err());
    /// ```
    #[must_use]
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extras.metadata.labels.insert(key.into(), value.into());
        self
    }

    /// One of the crate's own labels (see [`RESERVED_LABEL_PREFIX`]), set
    /// after the configured ones.
    #[cfg(feature = "unstable-shards")]
    #[must_use]
    pub(crate) fn own_label(mut self, key: &str, value: impl Into<String>) -> Self {
        self.extras
            .metadata
            .own_labels
            .insert(key.to_owned(), value.into());
        self
    }

    /// An annotation the candidate sets on the Lease when it takes it, as
    /// [`label`](Self::label) does. The key `leases.kube.rs/fencing-token`
    /// is reserved (each term stores its fencing token there):
    /// [`validate`](Self::validate) refuses it.
    #[must_use]
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extras.metadata.annotations.insert(key.into(), value.into());
        self
    }

    /// An owner the Lease is garbage-collected with (for example the
    /// operator's Deployment, in the Lease's namespace), set when the
    /// candidate takes the Lease; owner references already there are kept.
    /// Leave `controller` and `blockOwnerDeletion` unset unless the
    /// candidate may set them (a second controller owner, or
    /// `blockOwnerDeletion` without permission on the owner's finalizers,
    /// makes every write refused, and the candidate never leads). Where the
    /// admission plugin `OwnerReferencesPermissionEnforcement` runs, setting
    /// an owner also needs `delete` on `leases`.
    ///
    /// Labels, annotations and owners are written when this candidate takes
    /// the Lease (labels again at each renewal); another implementation's
    /// writes (client-go's) may keep them
    /// or not, so a holder label can lag behind the holder.
    #[must_use]
    pub fn owner_reference(mut self, owner: OwnerReference) -> Self {
        self.extras.metadata.owner = Some(owner);
        self
    }
}

impl LeaseMetadata {
    /// Sets the configured keys on `meta`, keeping everything else; an owner
    /// reference already there (same `uid`) is not added twice. The
    /// configured annotations are left out (warned), and their keys removed
    /// where an earlier write left them (any value: each replica may write
    /// its own), when, beside the ones `meta` has (someone else's, and the
    /// fencing token), they would pass the API server's
    /// limit on the annotations' total size: the write would be refused
    /// with 422 at every attempt (or, by `Task::acquisition`, taken without
    /// the token).
    pub(crate) fn apply(&self, meta: &mut ObjectMeta) {
        self.relabel(meta);
        let size = |(k, v): (&String, &String)| k.len() + v.len();
        let had = meta.annotations.as_ref();
        let replaced: usize = self
            .annotations
            .keys()
            .filter_map(|k| had?.get_key_value(k))
            .map(size)
            .sum();
        let after = annotations_size(had) - replaced + self.annotations.iter().map(size).sum::<usize>();
        if after > MAX_ANNOTATIONS_SIZE {
            warn!(
                annotations_bytes = annotations_size(had),
                "the lease's annotations leave no room for the configured annotations (the API server's limit is \
                 256 KiB): writing it without them"
            );
            // Those an earlier write left (ours, or another replica's value)
            // give way too.
            if let Some(annotations) = meta.annotations.as_mut() {
                annotations.retain(|k, _| !self.annotations.contains_key(k));
            }
        } else if !self.annotations.is_empty() {
            let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
            annotations.extend(self.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        if let Some(owner) = &self.owner {
            let owners = meta.owner_references.get_or_insert_with(Vec::new);
            if !owners.iter().any(|o| o.uid == owner.uid) {
                owners.push(owner.clone());
            }
        }
    }

    /// Sets the configured labels (and the crate's own) on `meta`, keeping
    /// every other.
    pub(crate) fn relabel(&self, meta: &mut ObjectMeta) {
        if !self.labels.is_empty() || !self.own_labels.is_empty() {
            let labels = meta.labels.get_or_insert_with(BTreeMap::new);
            let all = self.labels.iter().chain(&self.own_labels);
            labels.extend(all.map(|(k, v)| (k.clone(), v.clone())));
        }
    }

    /// The first rule broken, as the API server would refuse the write.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(key) = self.labels.keys().find(|k| k.starts_with(RESERVED_LABEL_PREFIX)) {
            // Elected shards find their roster entries and shard Leases by
            // these: another Lease labelled so would read as one of them
            // (a member that never takes its share, evicted and deleted).
            return Err(ConfigError::InvalidLabel {
                key: key.clone(),
                value: self.labels[key].clone(),
                rule: "reserved: elected shards find their Leases by the labels under leases.kube-runtime-lease/",
            });
        }
        for (key, value) in self.labels.iter().chain(&self.own_labels) {
            if let Some(rule) = qualified_name(key).or_else(|| label_value(value)) {
                return Err(ConfigError::InvalidLabel {
                    key: key.clone(),
                    value: value.clone(),
                    rule,
                });
            }
        }
        for key in self.annotations.keys() {
            if key == crate::record::TOKEN_ANNOTATION {
                // Each term stores its fencing token there: a configured
                // value would replace it, and tokens would repeat.
                return Err(ConfigError::InvalidAnnotation {
                    key: key.clone(),
                    rule: "reserved: each term stores its fencing token under this key",
                });
            }
            if let Some(rule) = qualified_name(key) {
                return Err(ConfigError::InvalidAnnotation {
                    key: key.clone(),
                    rule,
                });
            }
        }
        // Every term writes its fencing token beside them (the reserved key
        // and an `i64`): configured annotations that leave it no room under
        // the API server's limit would have every term taken without its
        // token stored (and without them: see `Task::acquisition`).
        let size = annotations_size(Some(&self.annotations));
        let token = crate::record::TOKEN_ANNOTATION.len() + i64::MIN.to_string().len();
        if size + token > MAX_ANNOTATIONS_SIZE {
            return Err(ConfigError::InvalidAnnotation {
                key: String::new(),
                rule: "annotations must be no more than 256 KiB in total, with room for the fencing token's",
            });
        }
        if let Some(owner) = &self.owner {
            let missing = [
                ("apiVersion", &owner.api_version),
                ("kind", &owner.kind),
                ("name", &owner.name),
                ("uid", &owner.uid),
            ]
            .into_iter()
            .find(|(_, v)| v.is_empty());
            if let Some((field, _)) = missing {
                return Err(ConfigError::InvalidOwnerReference { field });
            }
        }
        Ok(())
    }
}

/// `None` when `s` is a qualified name (a label or annotation key): an
/// optional DNS-1123 subdomain prefix and `/`, then a name of at most 63
/// characters, alphanumeric at both ends, with `-`, `_` and `.` inside.
fn qualified_name(s: &str) -> Option<&'static str> {
    let name = match s.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() {
                return Some("the prefix before '/' must not be empty");
            }
            if dns1123_subdomain(prefix).is_some() {
                return Some("the prefix before '/' must be a DNS-1123 subdomain");
            }
            name
        }
        None => s,
    };
    if name.is_empty() {
        return Some("the name must not be empty");
    }
    if name.len() > 63 {
        return Some("the name must be no more than 63 characters");
    }
    name_chars(name)
}

/// `None` when `s` is a valid label value: empty, or at most 63 characters,
/// alphanumeric at both ends, with `-`, `_` and `.` inside.
fn label_value(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        return None;
    }
    if s.len() > 63 {
        return Some("a label value must be no more than 63 characters");
    }
    name_chars(s)
}

fn name_chars(s: &str) -> Option<&'static str> {
    let b = s.as_bytes();
    if !b
        .iter()
        .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        return Some("must consist of alphanumerics, '-', '_' or '.'");
    }
    if !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return Some("must start and end with an alphanumeric character");
    }
    None
}

#[cfg(test)]
mod tests;
