//! Leader-election metrics, behind the `metrics` feature: [`LeaseMetrics`],
//! and the observer of an elector's transitions that records them.

use std::{collections::BTreeMap, sync::Arc};

use parking_lot::Mutex;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        MetricType,
        counter::Counter,
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};
use tokio::time::Instant;

use crate::{
    LeaderElector,
    elector::{Observer, Transition},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct LeaseLabels {
    namespace: String,
    lease: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RenewalLabels {
    namespace: String,
    lease: String,
    outcome: &'static str,
}

/// client-go's label set: the Lease's name only.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GoLabels {
    name: String,
}

type LastRenewals = Arc<Mutex<BTreeMap<LeaseLabels, Instant>>>;

/// Leader-election metrics, registered once into a `prometheus-client`
/// [`Registry`] and shared by any number of electors (one label set per
/// Lease: `namespace`, `lease`).
///
/// | metric | type | meaning |
/// |---|---|---|
/// | `leader_election_is_leader` | gauge | 1 while this replica leads; summed over replicas it should be 1 |
/// | `leader_election_transitions_total` | counter | changes of holder observed by this replica (its first look at the Lease is none) |
/// | `leader_election_renewals_total{outcome}` | counter | renewal writes by outcome: `success`, `late` (answered after the renew deadline), `conflict`, `not_found`, `error` |
/// | `leader_election_renew_duration_seconds` | histogram | latency of renewal writes |
/// | `leader_election_seconds_since_last_renewal` | gauge | while leading: time since the instant before the last successful renewal (or the write that began the term) was sent |
/// | `leader_election_coordinated` | gauge | 1 while Coordinated Leader Election is in force (`LeaseConfig::coordinated`, feature `coordinated`, served by the API server), 0 for the ordinary election |
///
/// With the `unstable-shards` feature, a sharded election
/// (`shard::ShardedElector::with_metrics`)
/// adds, labelled by its base name as `lease`:
///
/// | metric | type | meaning |
/// |---|---|---|
/// | `leader_election_shards_held` | gauge | shards this replica holds now; summed over replicas it should be the number of shards |
/// | `leader_election_shard_rebalances_total` | counter | shards this replica handed over to balance the shares (graceful releases, not losses) |
///
/// And, so that dashboards and alerts written for Go controllers keep
/// working when a controller moves to Rust, client-go's own two (as
/// `k8s.io/component-base` and controller-runtime export them), labelled
/// by the Lease's `name` only:
///
/// | metric | type | meaning |
/// |---|---|---|
/// | `leader_election_master_status{name}` | gauge | 1 while this replica leads, else 0 (client-go's `leaderOn`/`leaderOff`) |
/// | `leader_election_slowpath_total{name}` | counter | renewals that could not be made with the cached record and fell back to reading the Lease (client-go's `slowpathExercised`: here, a renewal answered 409) |
///
/// Example alerts (PromQL):
/// ```text
/// # No leader for 5 minutes.
/// sum by (namespace, lease) (leader_election_is_leader) == 0   (for: 5m)
/// # More than one replica believes it leads.
/// sum by (namespace, lease) (leader_election_is_leader) > 1    (for: 1m)
/// # A leader whose renewals are overdue (stuck election task).
/// leader_election_seconds_since_last_renewal > 25
/// ```
///
/// ```no_run
/// use prometheus_client::registry::Registry;
/// use kube_runtime_lease::{LeaderElector, LeaseConfig, metrics::LeaseMetrics, unique_identity};
///
/// # fn doc(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let mut registry = Registry::default();
/// let metrics = LeaseMetrics::register(&mut registry);
/// let elector = LeaderElector::new(client, LeaseConfig::new("default", "my-controller", unique_identity()))?
///     .with_metrics(&metrics);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LeaseMetrics {
    is_leader: Family<LeaseLabels, Gauge>,
    transitions: Family<LeaseLabels, Counter>,
    renewals: Family<RenewalLabels, Counter>,
    renew_duration: Family<LeaseLabels, Histogram, fn() -> Histogram>,
    last_renewal: LastRenewals,
    master_status: Family<GoLabels, Gauge>,
    slowpath: Family<GoLabels, Counter>,
    coordinated: Family<LeaseLabels, Gauge>,
    #[cfg(feature = "unstable-shards")]
    shards_held: Family<LeaseLabels, Gauge>,
    #[cfg(feature = "unstable-shards")]
    shard_rebalances: Family<LeaseLabels, Counter>,
}

fn renew_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 12))
}

impl LeaseMetrics {
    /// Creates the metrics and registers them into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = LeaseMetrics {
            is_leader: Family::default(),
            transitions: Family::default(),
            renewals: Family::default(),
            renew_duration: Family::new_with_constructor(renew_histogram),
            last_renewal: LastRenewals::default(),
            master_status: Family::default(),
            slowpath: Family::default(),
            coordinated: Family::default(),
            #[cfg(feature = "unstable-shards")]
            shards_held: Family::default(),
            #[cfg(feature = "unstable-shards")]
            shard_rebalances: Family::default(),
        };
        #[cfg(feature = "unstable-shards")]
        {
            registry.register(
                "leader_election_shards_held",
                "Shards of a sharded election this replica holds",
                metrics.shards_held.clone(),
            );
            registry.register(
                "leader_election_shard_rebalances",
                "Shards this replica handed over to balance the shares",
                metrics.shard_rebalances.clone(),
            );
        }
        registry.register(
            "leader_election_coordinated",
            "Whether Coordinated Leader Election is in force (1) or the ordinary election (0)",
            metrics.coordinated.clone(),
        );
        registry.register(
            "leader_election_is_leader",
            "Whether this replica leads (1) or not (0)",
            metrics.is_leader.clone(),
        );
        registry.register(
            "leader_election_transitions",
            "Changes of holder observed by this replica",
            metrics.transitions.clone(),
        );
        registry.register(
            "leader_election_renewals",
            "Renewal writes by outcome",
            metrics.renewals.clone(),
        );
        registry.register(
            "leader_election_renew_duration_seconds",
            "Latency of renewal writes",
            metrics.renew_duration.clone(),
        );
        registry.register_collector(Box::new(SinceLastRenewal(metrics.last_renewal.clone())));
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            metrics.master_status.clone(),
        );
        registry.register(
            "leader_election_slowpath",
            "Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease.",
            metrics.slowpath.clone(),
        );
        metrics
    }
}

#[derive(Debug)]
struct SinceLastRenewal(LastRenewals);

impl Collector for SinceLastRenewal {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let now = Instant::now();
        let snapshot: Vec<_> = self.0.lock().iter().map(|(l, t)| (l.clone(), now - *t)).collect();
        let mut metric = encoder.encode_descriptor(
            "leader_election_seconds_since_last_renewal",
            "While leading: seconds since the last successful renewal was sent",
            None,
            MetricType::Gauge,
        )?;
        for (labels, age) in snapshot {
            ConstGauge::new(age.as_secs_f64()).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(feature = "unstable-shards")]
impl LeaseMetrics {
    /// The series of the sharded election `base` in `namespace`: shards
    /// held, and shards handed over to balance.
    pub(crate) fn shards(&self, namespace: &str, base: &str) -> (Gauge, Counter) {
        let labels = LeaseLabels {
            namespace: namespace.to_owned(),
            lease: base.to_owned(),
        };
        let held = self.shards_held.get_or_create(&labels).clone();
        held.set(0);
        (held, self.shard_rebalances.get_or_create(&labels).clone())
    }
}

impl LeaderElector {
    /// Records this elector's metrics into `metrics` (see [`LeaseMetrics`]).
    /// The first call sets where they go; a later call only sets the
    /// series' starting values in the metrics it is given.
    #[must_use]
    pub fn with_metrics(self, metrics: &LeaseMetrics) -> Self {
        let config = self.config();
        let labels = LeaseLabels {
            namespace: config.namespace.clone(),
            lease: config.name.clone(),
        };
        let go = GoLabels {
            name: config.name.clone(),
        };
        let observer = ElectorMetrics {
            metrics: metrics.clone(),
            labels,
            go,
        };
        let gauges = (
            observer.metrics.is_leader.get_or_create(&observer.labels).clone(),
            observer.metrics.master_status.get_or_create(&observer.go).clone(),
            observer
                .metrics
                .coordinated
                .get_or_create(&observer.labels)
                .clone(),
        );
        for gauge in [&gauges.0, &gauges.1, &gauges.2] {
            gauge.set(0);
        }
        // The counters' series exist from the start, at 0: a first
        // increment is then an increase to Prometheus, not a new series.
        let m = &observer.metrics;
        let _ = m.transitions.get_or_create(&observer.labels);
        let _ = m.slowpath.get_or_create(&observer.go);
        for outcome in ["success", "late", "conflict", "not_found", "error"] {
            let _ = m.renewals.get_or_create(&RenewalLabels {
                namespace: observer.labels.namespace.clone(),
                lease: observer.labels.lease.clone(),
                outcome,
            });
        }
        // Added, the observer is told the last state told (whether this
        // candidate leads, which election is in force) before any later
        // change: its series start at the truth. Metrics given to a later
        // call are not recorded into, but start at the truth too.
        if !self.add_observer(observer) {
            let (leading, coordinated) = self.told_state();
            gauges.0.set(i64::from(leading));
            gauges.1.set(i64::from(leading));
            gauges.2.set(i64::from(coordinated));
        }
        self
    }
}

/// Records one elector's transitions into its series of [`LeaseMetrics`].
struct ElectorMetrics {
    metrics: LeaseMetrics,
    labels: LeaseLabels,
    go: GoLabels,
}

impl Observer for ElectorMetrics {
    fn observe(&self, transition: Transition<'_>) {
        let (m, labels, go) = (&self.metrics, &self.labels, &self.go);
        match transition {
            Transition::Leading(leading) => {
                m.is_leader.get_or_create(labels).set(i64::from(leading));
                m.master_status.get_or_create(go).set(i64::from(leading));
                if !leading {
                    m.last_renewal.lock().remove(labels);
                }
            }
            Transition::Renewal {
                outcome,
                latency,
                sent,
            } => {
                if outcome == "conflict" {
                    m.slowpath.get_or_create(go).inc();
                }
                let l = RenewalLabels {
                    namespace: labels.namespace.clone(),
                    lease: labels.lease.clone(),
                    outcome,
                };
                m.renewals.get_or_create(&l).inc();
                m.renew_duration
                    .get_or_create(labels)
                    .observe(latency.as_secs_f64());
                if outcome == "success"
                    && let Some(last) = m.last_renewal.lock().get_mut(labels)
                {
                    *last = sent;
                }
            }
            // From the write that began the term: a leader stuck before its
            // first renewal shows it too. (Renewals during a creation hold,
            // when this candidate does not lead, are not shown.)
            Transition::TermBegan { sent, .. } => {
                m.last_renewal.lock().insert(labels.clone(), sent);
            }
            Transition::HolderChanged => {
                m.transitions.get_or_create(labels).inc();
            }
            Transition::Coordinated(coordinated) => {
                m.coordinated.get_or_create(labels).set(i64::from(coordinated));
            }
            Transition::TermEnded { .. } => {}
        }
    }
}
