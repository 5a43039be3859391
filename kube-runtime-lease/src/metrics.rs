//! Leader-election metrics (behind the `metrics` feature).

#![allow(clippy::unused_self)]

use std::time::Duration;

use tokio::time::Instant;

use crate::config::LeaseConfig;

/// Metric hooks called by the election task; no-ops without the `metrics` feature.
#[derive(Default)]
pub(crate) struct Metrics {}

impl Metrics {
    pub(crate) fn new(_config: &LeaseConfig) -> Self {
        Metrics {}
    }

    pub(crate) fn leading(&self, _leading: bool) {}

    pub(crate) fn renewal(&self, _outcome: &'static str, _latency: Duration, _sent: Instant) {}
}
