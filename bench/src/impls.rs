//! The implementations compared, and the timing sets they run with.

use std::time::Duration;

use kube_runtime_lease_harness::Timings;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Impl {
    #[serde(rename = "kube-runtime-lease")]
    Ours,
    #[serde(rename = "client-go")]
    ClientGo,
    #[serde(rename = "k8s-controller")]
    K8sController,
    /// Our candidate on kube's default client (`KUBE_TCP_NODELAY=0`): Nagle
    /// on, as kube-client 5 leaves it. Handover only.
    #[serde(rename = "kube-runtime-lease, kube default client")]
    OursKubeDefault,
}

pub const IMPLS: [Impl; 3] = [Impl::Ours, Impl::ClientGo, Impl::K8sController];
/// The handover scenario also runs our candidate on kube's default client,
/// to show what TCP_NODELAY is worth (see BENCHMARKS.md).
pub const HANDOVER_IMPLS: [Impl; 4] = [
    Impl::Ours,
    Impl::OursKubeDefault,
    Impl::ClientGo,
    Impl::K8sController,
];

impl Impl {
    pub fn name(self) -> &'static str {
        match self {
            Impl::Ours => "kube-runtime-lease",
            Impl::ClientGo => "client-go",
            Impl::K8sController => "k8s-controller",
            Impl::OursKubeDefault => "kube-runtime-lease, kube default client",
        }
    }
    pub fn short(self) -> &'static str {
        match self {
            Impl::Ours => "krl",
            Impl::ClientGo => "go",
            Impl::K8sController => "kc",
            Impl::OursKubeDefault => "krl-dflt",
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Timing {
    pub name: &'static str,
    pub lease_ms: u64,
    pub renew_ms: u64,
    pub retry_ms: u64,
}

pub const TIMINGS: [Timing; 2] = [
    Timing {
        name: "15/10/2",
        lease_ms: 15_000,
        renew_ms: 10_000,
        retry_ms: 2_000,
    },
    // The failover tests' timings.
    Timing {
        name: "2/1.5/0.5",
        lease_ms: millis(Timings::FAST.lease_duration),
        renew_ms: millis(Timings::FAST.renew_deadline),
        retry_ms: millis(Timings::FAST.retry_period),
    },
];

const fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Timing {
    /// The timings as the harness's candidates take them.
    pub fn timings(&self) -> Timings {
        Timings {
            lease_duration: Duration::from_millis(self.lease_ms),
            renew_deadline: Duration::from_millis(self.renew_ms),
            retry_period: Duration::from_millis(self.retry_ms),
        }
    }
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
    pub fn retry(&self) -> Duration {
        Duration::from_millis(self.retry_ms)
    }
}
