//! The test harness of kube-runtime-lease: what the integration tests
//! (`tests/`), the benchmarks (`bench/`) and the failover demo share.
//!
//! - **The control plane** ([`TestEnv`], [`control_plane`]): a real etcd and
//!   kube-apiserver on loopback, built from their Go modules
//!   (`harness/go/`) into one binary, `krl-control-plane`; [`shared_env`]
//!   shares one per test binary.
//! - **Candidates**: the processes whose elections the tests judge, all in
//!   this folder: the Rust `candidate` (`harness/candidates/candidate.rs`,
//!   package `kube-runtime-lease-candidate`), client-go's `goelect`
//!   (`harness/go/cmd/goelect`, built with the control plane) and, for the
//!   benchmarks, a k8s-controller candidate
//!   (`harness/candidates/kc_candidate.rs`, built by `bench/`, so that
//!   k8s-controller stays out of this workspace). [`candidates`] builds
//!   their command lines; they all print the line protocol that
//!   [`parse_line`] reads, stamped with `CLOCK_MONOTONIC` ([`now_ns`]).
//! - **Judging them**: [`Process`] spawns a candidate and feeds every line of
//!   its stdout (parsed) and stderr into a shared [`EventLog`], under the
//!   process's name; the test adds what it does itself (signals, exits) to
//!   the same log, stamped with the same clock. A [`LeaseRecorder`] adds
//!   every version of the Lease. [`leadership_intervals`] turns a log into
//!   `[started-leading, stopped-leading]` intervals per process,
//!   [`check_no_overlap`] checks that no two overlap, [`check_takeovers`]
//!   that no Lease was taken before it expired; [`check_log`] does all of
//!   it, plus the check that every `WORK` line lies inside an interval of its
//!   process. [`Runs`] counts repeated runs of a scenario.
//! - **Faults**: [`Proxy`] is a TCP proxy to the apiserver that can
//!   partition, delay and drop the connections of the candidates behind it.
//! - **Chaos** ([`chaos`]): a highly available control plane
//!   ([`control_plane::HaControlPlane`]: three etcd members, two
//!   apiservers), this crate's candidates and client-go's side by side under
//!   a seeded schedule of faults, judged by what their guarded work wrote to
//!   a ledger `ConfigMap` (`scripts/chaos.sh`, RELIABILITY.md).
//!   (The in-memory Lease API double is the library's own test kit,
//!   `kube_runtime_lease::test_util`, behind its `test-util` feature.)

pub mod candidates;
pub mod cargo;
pub mod chaos;
pub mod clock;
pub mod control_plane;
pub mod events;
pub mod fixture;
pub mod intervals;
pub mod lease;
pub mod metrics;
pub mod objects;
pub mod parent_exit;
pub mod process;
pub mod proxy;
pub mod runs;
pub mod shards;
pub mod shared;
pub mod stats;
pub mod takeovers;
pub mod timings;

pub use candidates::{candidate_bin, candidate_path, go_candidate, rust_candidate};
pub use clock::{fmt_delta, fmt_ms, now_ns, ns};
pub use control_plane::{READY_TIMEOUT, TestEnv, bin_dir, workspace_root};
pub use events::{Entry, EventLog, Flavor, Kind, Sig, parse_line};
pub use fixture::Fixture;
pub use intervals::{
    Checked, Interval, check_log, check_no_overlap, describe_intervals, leadership_intervals, wait_seen_by,
    wait_settled,
};
pub use lease::{
    LeaseEvent, LeaseRecorder, LeaseRef, create_lease, free_spec, new_free_lease, watch_lease,
    watch_lease_events,
};
pub use metrics::{configmap_lists, metric_label, metric_samples, requests_served};
pub use objects::create_configmaps;
pub use process::{Outputs, Process, send_signal, take_process};
pub use proxy::{Partition, Proxy, ProxyStats};
pub use runs::Runs;
pub use shards::{
    Reconcile, ReconcilesChecked, balanced, check_reconciles, held_by, parse_shards, wait_balanced,
    wait_covered,
};
pub use shared::{serial, shared_env};
pub use stats::percentile;
pub use takeovers::{RECORD_SLACK, check_takeovers};
pub use timings::Timings;
