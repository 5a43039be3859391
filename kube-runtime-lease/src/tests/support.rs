//! Helpers shared by the unit tests: the Lease fixtures on the in-memory
//! double (and, re-exported, the runners of [`super::runtime`]).
//! <!-- upstream: omit -->
//!
//! The integration tests' helpers live in the harness crate
//! (`kube-runtime-lease-harness`), which these unit tests do not use: the
//! library builds, tests and publishes on its own (as it would inside
//! kube-runtime). Two small helpers therefore exist on both sides of that
//! line, each once per side: the log capture ([`logs_during`]; the harness
//! side's `LogBuf` in `tests/tests/support`) and the metrics scrape.
//! <!-- upstream: end -->

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube_client::core::ObjectMeta;
use tokio::time::Instant;

pub(crate) use super::runtime::paused;
use crate::{LeaderElector, LeaseConfig, test_util::FakeLeaseApi};

/// The text exposition of `registry`, as a Prometheus scrape reads it.
#[cfg(feature = "metrics")]
pub(crate) fn scrape(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("encoding metrics");
    out
}

/// Asserts that a scrape of `registry` has the sample line `sample` (for
/// example `"leader_election_is_leader{name=\"lease\"} 1"`), showing the
/// whole scrape when it has not.
#[cfg(feature = "metrics")]
#[track_caller]
pub(crate) fn assert_scraped(registry: &prometheus_client::registry::Registry, sample: &str) {
    let text = scrape(registry);
    assert!(text.contains(sample), "no `{sample}` in the scrape:\n{text}");
}

/// CPU-bound work (or a blocking call) that takes `d` of paused time: the
/// clock moves on by `d` while the task does not yield, so that no other
/// task of the current-thread runtime runs meanwhile, nor any timer fires.
pub(crate) fn busy(d: std::time::Duration) {
    use std::future::Future as _;
    let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
    // `advance` moves the clock at its first poll, then yields: polled once.
    let _ = std::pin::pin!(tokio::time::advance(d)).poll(&mut cx);
}

/// Why a term ended that `holder` took over.
pub(crate) fn taken_by(holder: &str) -> crate::Lost {
    crate::Lost::TakenOver {
        holder: holder.to_owned(),
    }
}

/// A double holding a free (released) Lease, so that acquisition is one write.
pub(crate) fn free() -> FakeLeaseApi {
    let fake = FakeLeaseApi::default();
    let mut lease = held_by("", 1);
    lease.spec.as_mut().unwrap().lease_transitions = Some(0);
    lease.metadata.labels = None;
    fake.put(lease);
    fake
}

pub(crate) fn config(identity: &str) -> LeaseConfig {
    LeaseConfig::new("default", "lease", identity)
}

pub(crate) fn elector(fake: &FakeLeaseApi, config: LeaseConfig) -> (LeaderElector, usize) {
    let (client, id) = fake.client();
    (LeaderElector::new(client, config).unwrap(), id)
}

pub(crate) fn held_by(holder: &str, duration: i32) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("lease".into()),
            namespace: Some("default".into()),
            labels: Some([("app".to_owned(), "x".to_owned())].into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(duration),
            lease_transitions: Some(4),
            ..Default::default()
        }),
    }
}

pub(crate) fn spec(fake: &FakeLeaseApi) -> LeaseSpec {
    fake.lease().unwrap().spec.unwrap()
}

pub(crate) fn count(fake: &FakeLeaseApi, client: usize, verb: &str, since: Instant) -> usize {
    fake.requests()
        .iter()
        .filter(|s| s.client == client && s.verb == verb && s.at > since)
        .count()
}

/// When `client` first sent `verb` after `since`, as [`count`] selects.
pub(crate) fn first_after(fake: &FakeLeaseApi, client: usize, verb: &str, since: Instant) -> Option<Instant> {
    fake.requests()
        .iter()
        .find(|s| s.client == client && s.verb == verb && s.at > since)
        .map(|s| s.at)
}

pub(crate) fn holder(fake: &FakeLeaseApi) -> Option<String> {
    fake.lease().and_then(|l| l.spec).and_then(|s| s.holder_identity)
}

/// Log lines written at `level` and above while `body` runs on this thread
/// (the paused runtime's, whose tasks log there too).
pub(crate) fn logs_during(level: tracing::Level, body: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    exact_interest();
    let buffer = Buffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let buffer = buffer.clone();
            move || buffer.clone()
        })
        .with_ansi(false)
        .with_max_level(level)
        .finish();
    tracing::subscriber::with_default(subscriber, body);
    let bytes = buffer.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

/// Keeps each log statement's cached interest exact while tests on other
/// threads log with no subscriber. With at most one subscriber alive,
/// tracing-core asks only the default subscriber of the thread that first
/// reaches a log statement (`has_just_one`): a statement first reached on a
/// thread with none is then cached as "never", and a capture on another
/// thread ([`logs_during`]) silently misses it. Two subscribers that live for
/// the whole run and answer "sometimes" (never enabled) keep the registry in
/// its exact mode, where each statement asks the subscriber of the thread it
/// runs on.
fn exact_interest() {
    struct Nobody;
    impl tracing::Subscriber for Nobody {
        fn register_callsite(&self, _: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
            tracing::subscriber::Interest::sometimes()
        }
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            false
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }
    static NOBODY: std::sync::OnceLock<[tracing::Dispatch; 2]> = std::sync::OnceLock::new();
    NOBODY.get_or_init(|| [tracing::Dispatch::new(Nobody), tracing::Dispatch::new(Nobody)]);
}

/// Consumes `stream` in a task that keeps it once it ended (as a stream
/// pinned in `main` while another task shuts the elector down, or a loop
/// that reads `lost()` after it): resolves as it ends.
#[cfg(any(feature = "warm-standby", feature = "unstable-shards"))]
pub(crate) fn kept_once_ended(
    stream: impl futures::Stream + Send + 'static,
) -> futures::channel::oneshot::Receiver<()> {
    use futures::StreamExt;
    let (ended, end) = futures::channel::oneshot::channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
        let _ = ended.send(());
        std::future::pending::<()>().await;
    });
    end
}

/// Watch events (each a line of a watch's body) for the Lease `other`, not
/// `lease`: it changed (held by `z`), and it was deleted.
pub(crate) const OTHER_LEASE_EVENTS: [&str; 2] = [
    concat!(
        r#"{"type":"MODIFIED","object":{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":"#,
        r#"{"name":"other","namespace":"default","uid":"other-uid","resourceVersion":"900"},"#,
        r#""spec":{"holderIdentity":"z","leaseDurationSeconds":15}}}"#,
        "\n"
    ),
    concat!(
        r#"{"type":"DELETED","object":{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":"#,
        r#"{"name":"other","namespace":"default","uid":"other-uid","resourceVersion":"901"}}}"#,
        "\n"
    ),
];
