//! The chaos run (`scripts/chaos.sh`): an HA control plane, this crate's
//! candidates and client-go's side by side, a seeded schedule of faults, and
//! the verdict on what each group wrote (see
//! `kube_runtime_lease_harness::chaos`).
//!
//! ```text
//! chaos [--minutes N | --seconds N] [--seed S] [--log-dir DIR] [--report FILE]
//! ```
//!
//! Prints the side-by-side table and every fault; exits 1 when this crate's
//! column has a stale write, a fencing token going backwards, an overlap, an
//! unbounded gap or writes it could not judge (client-go's column is
//! reported, not judged: it has no fencing).

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use kube_runtime_lease_harness::chaos::{Config, Implementation, run};

fn random_seed() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish() % 1_000_000
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut duration = Duration::from_secs(180);
    let mut seed = None;
    let (mut log_dir, mut report_file) = (None, None);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--minutes" => duration = Duration::from_secs(value("--minutes")?.parse::<u64>()? * 60),
            "--seconds" => duration = Duration::from_secs(value("--seconds")?.parse()?),
            "--seed" => seed = Some(value("--seed")?.parse()?),
            "--log-dir" => log_dir = Some(value("--log-dir")?.into()),
            "--report" => report_file = Some(value("--report")?),
            "-h" | "--help" => {
                println!("chaos [--minutes N | --seconds N] [--seed S] [--log-dir DIR] [--report FILE]");
                return Ok(());
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    let seed = seed.unwrap_or_else(random_seed);
    let mut config = Config::new(duration, seed);
    config.log_dir = log_dir;
    eprintln!("chaos: seed {seed}, {} s of faults", duration.as_secs());
    let report = run(&config).await?;
    let by_fault = Implementation::ALL
        .iter()
        .map(|i| format!("{}: {:?}", i.label(), report.stale_by_fault(*i)))
        .collect::<Vec<_>>()
        .join("\n");
    let text = format!(
        "{}\nstale terms by the last fault begun before them:\n{by_fault}\n\n```text\n{}```\n\n```text\n{}```\n",
        report.table(),
        report.fault_log(),
        report.details()
    );
    println!("{text}");
    if let Some(path) = report_file {
        std::fs::write(&path, &text).with_context(|| format!("writing {path}"))?;
    }
    let failures = report.column(Implementation::Ours).failures();
    if !failures.is_empty() {
        bail!(
            "kube-runtime-lease failed the chaos run (seed {seed}):\n{}",
            failures.join("\n")
        );
    }
    Ok(())
}
