//! Kubernetes name rules (DNS-1123), as the API server checks them.

use super::ConfigError;

/// Checks the Lease `namespace/name` as the API server would: the namespace
/// a DNS-1123 label, the name a DNS-1123 subdomain.
pub(crate) fn check_lease(namespace: &str, name: &str) -> Result<(), ConfigError> {
    match (dns1123_label(namespace), dns1123_subdomain(name)) {
        (Some(rule), _) => Err(ConfigError::InvalidNamespace {
            value: namespace.to_owned(),
            rule,
        }),
        (None, Some(rule)) => Err(ConfigError::InvalidName {
            value: name.to_owned(),
            rule,
        }),
        (None, None) => Ok(()),
    }
}

/// The rule `part` breaks as a DNS-1123 label (a namespace, or one
/// dot-separated part of a subdomain), if any: `empty` and `chars` are the
/// messages for an empty part and for a character outside the label's set.
fn label_rule(part: &str, empty: &'static str, chars: &'static str) -> Option<&'static str> {
    let b = part.as_bytes();
    let in_set = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    if b.is_empty() {
        Some(empty)
    } else if !b.iter().all(in_set) {
        Some(chars)
    } else if !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        Some("must start and end with an alphanumeric character")
    } else {
        None
    }
}

/// `None` when `s` is a DNS-1123 label (RFC 1123, as Kubernetes checks namespaces).
fn dns1123_label(s: &str) -> Option<&'static str> {
    if s.len() > 63 {
        return Some("must be no more than 63 characters");
    }
    let chars = "must consist of lower case alphanumeric characters or '-'";
    label_rule(s, "must not be empty", chars)
}

/// `None` when `s` is a DNS-1123 subdomain (as Kubernetes checks object names).
pub(crate) fn dns1123_subdomain(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        return Some("must not be empty");
    }
    if s.len() > 253 {
        return Some("must be no more than 253 characters");
    }
    let chars = "must consist of lower case alphanumeric characters, '-' or '.'";
    s.split('.')
        .find_map(|part| label_rule(part, "must not contain empty dot-separated parts", chars))
}
