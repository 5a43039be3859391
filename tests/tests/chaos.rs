//! The chaos run, short (the long one is `scripts/chaos.sh --minutes 30`,
//! see RELIABILITY.md): an HA control plane (three etcd members, two
//! apiservers), this crate's candidates and client-go's side by side, a
//! seeded schedule of faults, and the verdict on what their guarded work
//! wrote (`kube_runtime_lease_harness::chaos`).
//!
//! Two runs: a fixed seed, then a random one, printed for replay
//! (`scripts/chaos.sh --seconds 90 --seed <seed>`). Each fails on any stale
//! write, fencing token going backwards, overlapping term or unbounded gap in
//! this crate's column; client-go's column is printed, not judged (it has no
//! fencing).

use std::time::Duration;

use anyhow::{Result, ensure};
use kube_runtime_lease_harness::chaos::{Config, Implementation, run};

/// Faults are injected this long per run.
const RUN: Duration = Duration::from_secs(90);
/// The fixed seed.
const FIXED_SEED: u64 = 24;

fn random_seed() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    h.finish() % 1_000_000
}

async fn judged_run(seed: u64) -> Result<()> {
    println!(
        "chaos: seed {seed} (replay: scripts/chaos.sh --seconds {} --seed {seed})",
        RUN.as_secs()
    );
    let config = Config::new(RUN, seed);
    // Bounded: the faults, the control plane's start and each fault's healing.
    let report = tokio::time::timeout(RUN + Duration::from_secs(300), run(&config))
        .await
        .map_err(|_| anyhow::anyhow!("the chaos run (seed {seed}) did not finish in time"))??;
    println!("{}\n{}\n{}", report.table(), report.fault_log(), report.details());
    let ours = report.column(Implementation::Ours);
    let failures = ours.failures();
    ensure!(
        failures.is_empty(),
        "seed {seed}: kube-runtime-lease failed the chaos run:\n{}",
        failures.join("\n")
    );
    // The run did what it is for: faults, and handovers under them.
    ensure!(
        report.faults.len() >= 8,
        "seed {seed}: only {} faults injected",
        report.faults.len()
    );
    for column in &report.columns {
        ensure!(
            column.ledger.writes > 100 && column.ledger.terms >= 3,
            "seed {seed}: {} wrote {} times in {} terms: the run did not exercise it",
            column.implementation.label(),
            column.ledger.writes,
            column.ledger.terms
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_an_ha_control_plane_leaves_no_stale_write() -> Result<()> {
    judged_run(FIXED_SEED).await?;
    judged_run(random_seed()).await
}
