//! Helpers shared by the test binaries (each includes this module, and
//! uses only some of it).
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use kube_runtime_lease::LeaseConfig;
use kube_runtime_lease_harness::Timings;

/// A candidate `identity` for the Lease `lease` in `ns`, with the short
/// timings of the failover tests ([`Timings::FAST`]).
pub fn fast_config(ns: &str, identity: &str) -> LeaseConfig {
    let t = Timings::FAST;
    LeaseConfig::new(ns, "lease", identity)
        .lease_duration(t.lease_duration)
        .renew_deadline(t.renew_deadline)
        .retry_period(t.retry_period)
}

/// The log lines of one test: a `tracing_subscriber::fmt` writer into a
/// shared buffer, installed as this thread's default subscriber (a
/// current-thread runtime's tasks all log there).
#[derive(Clone, Default)]
pub struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuf {
    /// Captures this thread's log lines at `level` and above until the
    /// guard is dropped.
    pub fn capture(level: tracing::Level) -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = LogBuf::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(level)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned()
    }
}

/// Waits until `ok()` holds, checking every 10 ms: an error naming `what`
/// if it does not within `within`.
pub async fn wait_until(
    what: &str,
    within: std::time::Duration,
    mut ok: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    while !ok() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Ok(())
}

/// A `ConfigMap` `name` whose `data.v` is `v`.
pub fn configmap(name: &str, v: &str) -> k8s_openapi::api::core::v1::ConfigMap {
    k8s_openapi::api::core::v1::ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..kube::api::ObjectMeta::default()
        },
        data: Some(std::collections::BTreeMap::from([("v".to_owned(), v.to_owned())])),
        ..k8s_openapi::api::core::v1::ConfigMap::default()
    }
}
