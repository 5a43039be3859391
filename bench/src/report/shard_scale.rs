//! The shard-scale grid's tables (`shard_scale-<label>.md`), one per timing
//! set: rows by S, then M.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::stats::ms;
use crate::shard_scale::{Cell, ScaleResults};

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".to_owned(), |v| format!("{v:.digits$}"))
}

fn pair(a: Option<f64>, b: Option<f64>, digits: usize) -> String {
    match (a, b) {
        (None, None) => "–".to_owned(),
        _ => format!("{} / {}", num(a, digits), num(b, digits)),
    }
}

fn time(v: Option<f64>) -> String {
    v.map_or("–".to_owned(), ms)
}

/// The markdown of one run of the grid.
pub fn markdown(r: &ScaleResults) -> String {
    let m = &r.meta;
    let mut md = String::new();
    let _ = writeln!(md, "# shard-scale: `{}`\n", m.label);
    let _ = writeln!(
        md,
        "Made by `{}`",
        m.script_command.as_deref().unwrap_or(&m.run.command)
    );
    let _ = writeln!(
        md,
        "at commit {} on {} UTC; {} cores ({}), kube-apiserver {}. {} ConfigMaps, reconciles of {} ms, at most {} in flight per replica.\n",
        m.run.commit,
        m.date,
        m.run.nproc,
        m.run.cpu_model,
        m.run.kube_apiserver,
        m.objects,
        m.reconcile_ms,
        m.concurrency
    );
    md.push_str(
        "Columns: Lease *writes*/s (PUT+POST+PATCH+DELETE) and *reads*/s (GET+LIST) at the apiserver over the quiet, settled window, the control plane's own included (*idle* writes/s: before the cell's replicas started); *watch ev/s/replica*: Lease watch events delivered (`apiserver_watch_events_total`) over the window, less the idle rate, / M; *watches*: Lease watches open; CPU seconds per minute over the window (replicas: mean / max); RSS at the end of the window (mean / max); *pass*: SIGUSR1 → every object reconciled once, objects/s and the speed-up over M = 1 of the same S; *join* / *TERM* / *KILL*: one replica spawned / SIGTERMed / SIGKILLed → balanced again. *load*: 1-minute loadavg at the end of the window.\n\n",
    );
    let mut timings: Vec<&str> = Vec::new();
    for c in &r.cells {
        if !timings.contains(&c.timing.as_str()) {
            timings.push(&c.timing);
        }
    }
    for t in timings {
        let cells: Vec<&Cell> = r.cells.iter().filter(|c| c.timing == t).collect();
        let c0 = cells[0];
        let _ = writeln!(
            md,
            "## Timing set `{t}` ({} s / {} s / {} s; window {} s, idle window {} s)\n",
            c0.lease_duration_s, c0.renew_deadline_s, c0.retry_period_s, c0.window_s, c0.idle_window_s
        );
        md.push_str("| S | M | settle | writes/s | idle writes/s | reads/s | watch ev/s/replica | watches | apiserver CPU s/min | etcd CPU s/min | replica CPU s/min | RSS MiB | pass | objects/s | speed-up | double | one owner | join | TERM | KILL | load |\n");
        md.push_str(
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        let mut sorted = cells.clone();
        sorted.sort_by_key(|c| (c.shards, c.replicas));
        let mut notes = Vec::new();
        for c in sorted {
            if !c.ran {
                let _ = writeln!(
                    md,
                    "| {} | {} | **not run** | | | | | | | | | | | | | | | | | | {:.1} |",
                    c.shards, c.replicas, c.loadavg_before
                );
            } else {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}{} |",
                    c.shards,
                    c.replicas,
                    time(c.settle_ms),
                    num(c.lease_writes_per_s, 1),
                    num(c.idle_lease_writes_per_s, 1),
                    num(c.lease_reads_per_s, 2),
                    num(c.watch_events_per_replica_per_s, 1),
                    num(c.lease_watches, 0),
                    num(c.apiserver_cpu_s_per_min, 1),
                    num(c.etcd_cpu_s_per_min, 1),
                    pair(c.replica_cpu_s_per_min_mean, c.replica_cpu_s_per_min_max, 2),
                    pair(c.replica_rss_mib_mean, c.replica_rss_mib_max, 0),
                    time(c.pass_ms),
                    num(c.per_second, 0),
                    c.speedup.map_or("–".to_owned(), |s| format!("{s:.2}×")),
                    c.double_reconciles.map_or("–".to_owned(), |d| d.to_string()),
                    match c.one_owner {
                        Some(true) => "yes",
                        Some(false) => "**no**",
                        None => "–",
                    },
                    time(c.join_rebalance_ms),
                    time(c.term_rebalance_ms),
                    time(c.kill_rebalance_ms),
                    num(c.loadavg_window, 1),
                    if c.saturated { " (saturated)" } else { "" },
                );
            }
            if let Some(reason) = &c.reason {
                notes.push(format!(
                    "- S={} M={}: {}",
                    c.shards,
                    c.replicas,
                    reason.replace('\n', " ")
                ));
            }
            if let Some(why) = &c.saturated_why {
                notes.push(format!("- S={} M={}: saturated: {why}", c.shards, c.replicas));
            }
        }
        md.push('\n');
        if !notes.is_empty() {
            md.push_str(&notes.join("\n"));
            md.push_str("\n\n");
        }
    }
    md
}

/// Rewrites every `shard_scale-<label>.md` of `dir` from its JSON.
///
/// # Errors
/// When a file cannot be written.
pub fn regenerate(dir: &Path) -> Result<()> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in rd.filter_map(std::result::Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(label) = name
            .strip_prefix("shard_scale-")
            .and_then(|n| n.strip_suffix(".json"))
            && let Some(results) = super::read::<ScaleResults>(dir, &name)
        {
            std::fs::write(dir.join(format!("shard_scale-{label}.md")), markdown(&results))?;
        }
    }
    Ok(())
}
