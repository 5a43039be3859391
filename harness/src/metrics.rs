//! Reading kube-apiserver's metrics ([`TestEnv::metrics_text`](crate::TestEnv::metrics_text),
//! the Prometheus text format): the samples of one metric, their labels, and
//! the request counts the tests and benchmarks compare.

/// The samples of the metric `name` in `metrics` (one per line, `name{labels}
/// value`): each sample's whole line and its value. Lines without labels, and
/// values that do not parse, are skipped.
pub fn metric_samples<'a>(metrics: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    metrics
        .lines()
        .filter(move |l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{')))
        .filter_map(|l| Some((l, l.rsplit(' ').next()?.parse::<f64>().ok()?)))
}

/// The value of `label` in a sample line (`verb` in `...{resource="leases",verb="GET"} 3`),
/// if it has that label.
#[must_use]
pub fn metric_label<'a>(sample: &'a str, label: &str) -> Option<&'a str> {
    let key = format!("{label}=\"");
    let (labels, _) = sample.split_once('}')?;
    let (_, labels) = labels.split_once('{')?;
    labels
        .split(',')
        .find_map(|pair| pair.strip_prefix(&key)?.strip_suffix('"'))
}

/// Requests of `verb` (`LIST`, `GET`, ...) on `resource` (`configmaps`) the
/// apiserver has served, summed over the other labels, from the text of
/// [`TestEnv::metrics_text`](crate::TestEnv::metrics_text) (`apiserver_request_total`).
#[must_use]
pub fn requests_served(metrics: &str, resource: &str, verb: &str) -> f64 {
    metric_samples(metrics, "apiserver_request_total")
        .filter(|(l, _)| {
            metric_label(l, "resource") == Some(resource) && metric_label(l, "verb") == Some(verb)
        })
        .map(|(_, v)| v)
        .sum()
}

/// The `ConfigMap` LISTs the apiserver has served so far ([`requests_served`]):
/// what a warm standby must not add at its takeover.
#[must_use]
pub fn configmap_lists(metrics: &str) -> f64 {
    requests_served(metrics, "configmaps", "LIST")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_request_total Counter of apiserver requests.
apiserver_request_total{code="200",component="apiserver",resource="configmaps",subresource="",verb="LIST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",resource="configmaps",subresource="",verb="GET",version="v1"} 5
apiserver_request_total{code="500",component="apiserver",resource="configmaps",subresource="",verb="LIST",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",resource="pods",subresource="configmaps",verb="LIST",version="v1"} 7
apiserver_request_total_other{resource="configmaps",verb="LIST"} 11
apiserver_longrunning_requests{resource="leases",verb="WATCH"} 2
"#;

    #[test]
    fn counts_by_label_not_by_substring() {
        assert!((requests_served(TEXT, "configmaps", "LIST") - 4.0).abs() < f64::EPSILON);
        assert!((configmap_lists(TEXT) - 4.0).abs() < f64::EPSILON);
        assert!((requests_served(TEXT, "configmaps", "GET") - 5.0).abs() < f64::EPSILON);
        let watches: Vec<_> = metric_samples(TEXT, "apiserver_longrunning_requests").collect();
        assert_eq!(watches.len(), 1);
        assert_eq!(metric_label(watches[0].0, "verb"), Some("WATCH"));
        assert_eq!(metric_label(watches[0].0, "code"), None);
    }
}
