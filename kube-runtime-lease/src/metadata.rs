//! Labels, annotations and an owner reference the candidate writes on the
//! Lease ([`LeaseConfig::label`](crate::LeaseConfig::label),
//! [`annotation`](crate::LeaseConfig::annotation),
//! [`owner_reference`](crate::LeaseConfig::owner_reference)), validated as the
//! API server would before any API call.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::config::{ConfigError, dns1123_subdomain};

/// What the candidate writes into the Lease's metadata when it takes the
/// Lease (creating it, or beginning a term on it). Only these keys are
/// written: other labels, annotations and owner references are kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LeaseMetadata {
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) owner: Option<OwnerReference>,
}

impl LeaseMetadata {
    /// Sets the configured keys on `meta`, keeping everything else; an owner
    /// reference already there (same `uid`) is not added twice.
    pub(crate) fn apply(&self, meta: &mut ObjectMeta) {
        if !self.labels.is_empty() {
            let labels = meta.labels.get_or_insert_with(BTreeMap::new);
            labels.extend(self.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        if !self.annotations.is_empty() {
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

    /// The first rule broken, as the API server would refuse the write.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in &self.labels {
            if let Some(rule) = qualified_name(key).or_else(|| label_value(value)) {
                return Err(ConfigError::InvalidLabel {
                    key: key.clone(),
                    value: value.clone(),
                    rule,
                });
            }
        }
        for key in self.annotations.keys() {
            if let Some(rule) = qualified_name(key) {
                return Err(ConfigError::InvalidAnnotation {
                    key: key.clone(),
                    rule,
                });
            }
        }
        let size: usize = self.annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
        if size > 256 * 1024 {
            return Err(ConfigError::InvalidAnnotation {
                key: String::new(),
                rule: "annotations must be no more than 256 KiB in total",
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
mod tests {
    use super::*;

    fn owner(uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "operator".into(),
            uid: uid.into(),
            ..OwnerReference::default()
        }
    }

    #[test]
    fn keys_and_values_follow_the_api_servers_rules() {
        for good in ["app", "example.com/holder-pod", "a.b_c-d", "k8s.io/x"] {
            assert_eq!(qualified_name(good), None, "{good}");
        }
        for bad in [
            "",
            "/x",
            "Example.com/x",
            "x/",
            "-x",
            "x-",
            "a b",
            &"x".repeat(64),
        ] {
            assert!(qualified_name(bad).is_some(), "{bad:?}");
        }
        assert_eq!(label_value(""), None);
        assert_eq!(label_value("pod-a_1.x"), None);
        assert!(label_value("node/1").is_some());
        assert!(label_value(&"v".repeat(64)).is_some());
    }

    #[test]
    fn invalid_metadata_is_a_typed_error() {
        let mut m = LeaseMetadata::default();
        m.labels.insert("holder".into(), "not a value".into());
        assert!(matches!(m.validate(), Err(ConfigError::InvalidLabel { .. })));
        let mut m = LeaseMetadata::default();
        m.annotations.insert("Bad Key".into(), "anything at all".into());
        assert!(matches!(m.validate(), Err(ConfigError::InvalidAnnotation { .. })));
        let m = LeaseMetadata {
            owner: Some(owner("")),
            ..LeaseMetadata::default()
        };
        assert_eq!(
            m.validate(),
            Err(ConfigError::InvalidOwnerReference { field: "uid" })
        );
        let m = LeaseMetadata {
            owner: Some(owner("u1")),
            ..LeaseMetadata::default()
        };
        assert_eq!(m.validate(), Ok(()));
    }

    #[test]
    fn only_the_configured_keys_are_written_and_the_rest_is_kept() {
        let mut m = LeaseMetadata::default();
        m.labels.insert("holder".into(), "pod-b".into());
        m.annotations.insert("example.com/node".into(), "node-2".into());
        m.owner = Some(owner("u1"));
        let mut meta = ObjectMeta {
            labels: Some([("holder".into(), "pod-a".into()), ("team".into(), "x".into())].into()),
            annotations: Some([("kept".into(), "yes".into())].into()),
            owner_references: Some(vec![owner("u0")]),
            ..ObjectMeta::default()
        };
        m.apply(&mut meta);
        m.apply(&mut meta);
        let labels = meta.labels.unwrap();
        assert_eq!(labels["holder"], "pod-b");
        assert_eq!(labels["team"], "x");
        let annotations = meta.annotations.unwrap();
        assert_eq!(annotations["kept"], "yes");
        assert_eq!(annotations["example.com/node"], "node-2");
        let owners: Vec<_> = meta
            .owner_references
            .unwrap()
            .into_iter()
            .map(|o| o.uid)
            .collect();
        assert_eq!(owners, ["u0", "u1"], "added once, the other kept");
    }
}
