//! Percentiles and the formatting of the tables' figures.

use crate::chain::Trial;
use crate::impls::Impl;

#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
}

/// Nearest-rank percentiles (with 20 samples, p99 is the maximum).
pub fn stats(values: &[f64]) -> Option<Stats> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = |p: f64| kube_runtime_lease_harness::percentile(&v, p);
    Some(Stats {
        n: v.len(),
        p50: rank(0.5),
        p99: rank(0.99),
        min: v[0],
        max: v[v.len() - 1],
    })
}

pub(super) fn ms(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.2} s", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

pub(super) fn ratio(reference: f64, ours: f64) -> String {
    if ours <= 0.0 {
        return "n/a".into();
    }
    format!("{:.1}×", reference / ours)
}

pub(super) fn values(
    trials: &[Trial],
    imp: Impl,
    timing: &str,
    f: impl Fn(&Trial) -> Option<f64>,
) -> Vec<f64> {
    trials
        .iter()
        .filter(|t| t.implementation == imp && t.timing == timing && t.error.is_none())
        .filter_map(f)
        .collect()
}

pub(super) fn failed(trials: &[Trial], imp: Impl, timing: &str) -> usize {
    trials
        .iter()
        .filter(|t| t.implementation == imp && t.timing == timing && t.error.is_some())
        .count()
}
