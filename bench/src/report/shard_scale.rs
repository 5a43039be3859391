//! The shard-scale grid's tables (`shard_scale-<label>.md`), one per timing
//! set: rows by S, then M.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use std::collections::BTreeMap;

use super::Target;
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
    for a in &m.added {
        let _ = writeln!(
            md,
            "Cells added by `{}` at commit {} on {} UTC: {}.\n",
            a.command,
            a.commit,
            a.date,
            a.cells.join(", ")
        );
    }
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

/// Events per replica per retry period, over the share `k = S / M`.
fn per_share(c: &Cell) -> Option<f64> {
    c.watch_events_per_replica_per_s
        .map(|e| e * c.retry_period_s / k_of(c))
}

/// The model's bound of the events a replica receives per retry period
/// (`docs/sharding-design.md`, Cost model): its own renewals twice (its
/// electors' watches and its selection), its backups and the next member's
/// shards (`k` each), and the one extra event per write the apiserver counts
/// (measured: `events_per_write` at M = 1 is one more than the watchers), whose
/// share per replica is `S / M = k` again: `5k`, plus 2 for the roster and the
/// control plane's own traffic.
fn bound_per_rp(c: &Cell) -> f64 {
    5.0 * k_of(c) + 2.0
}

fn key(c: &Cell) -> (String, u16, usize) {
    (c.timing.clone(), c.shards, c.replicas)
}

fn ratio(before: Option<f64>, after: Option<f64>) -> String {
    match (before, after) {
        (Some(b), Some(a)) if a > 0.0 => format!("{:.2}×", b / a),
        _ => "–".to_owned(),
    }
}

/// The before/after comparison (`shard_scale-compare.md`): the cells both
/// runs measured side by side, and the targets judged on `after`.
pub fn compare(before: &ScaleResults, after: &ScaleResults) -> String {
    let mut md = format!(
        "# shard-scale: `{}` against `{}`\n\n",
        before.meta.label, after.meta.label
    );
    md.push_str(&tables(before, after, "##"));
    md.push_str(&super::targets_table("## Targets", &targets(after)));
    md
}

/// The grid in `docs/sharding-design.md`, next to the cost model: the
/// comparison's tables and the targets.
pub(super) fn design_block(before: &ScaleResults, after: &ScaleResults) -> String {
    let mut md = tables(before, after, "####");
    md.push_str(&super::targets_table("#### Targets", &targets(after)));
    md.push('\n');
    md
}

/// Section 8 of BENCHMARKS.md: the comparison's tables, its targets into
/// the summary's.
pub(super) fn section(md: &mut String, all: &mut Vec<Target>, before: &ScaleResults, after: &ScaleResults) {
    md.push_str("### 8. Elected shards at scale: before and after the roster\n\n");
    md.push_str(&tables(before, after, "####"));
    all.extend(targets(after));
}

/// The runs, then one table per timing set (headings at `level`).
#[allow(clippy::too_many_lines)]
fn tables(before: &ScaleResults, after: &ScaleResults, level: &str) -> String {
    let mut md = String::new();
    for (r, what) in [(before, "before"), (after, "after")] {
        let _ = writeln!(
            md,
            "- {}: commit {}, {} UTC, `{}`",
            if r.meta.label == what {
                format!("`{what}`")
            } else {
                format!("`{}` ({what})", r.meta.label)
            },
            r.meta.run.commit,
            r.meta.date,
            r.meta.script_command.as_deref().unwrap_or(&r.meta.run.command)
        );
        for a in &r.meta.added {
            let _ = writeln!(
                md,
                "  - cells added by `{}`: commit {}, {} UTC: {}",
                a.command,
                a.commit,
                a.date,
                a.cells.join(", ")
            );
        }
    }
    md.push_str(
        "\nTwo runs on the same machine, one after the other (with the cells added later, listed above), \
         the same cells in the same order. \
         *ev/RP/k*: Lease watch events per replica per retry period over the share `k = S / M` \
         (the model: at most 5, whatever M). *writes/s*: Lease writes at the apiserver. \
         Ratios: before / after. *join / TERM / KILL*: one replica spawned, then (once balanced) one \
         SIGTERMed, then one SIGKILLed, each timed to balanced again; the SIGTERM comes right after \
         the join, so a shard the join moved between two others is younger than a lease duration \
         and is handed over only once it has been held for one (the oscillation guard): where the \
         leave moves such a shard again, that wait is most of TERM's time.\n\n",
    );
    let by_key: BTreeMap<_, _> = before.cells.iter().map(|c| (key(c), c)).collect();
    let mut timings: Vec<&str> = Vec::new();
    for c in &after.cells {
        if !timings.contains(&c.timing.as_str()) {
            timings.push(&c.timing);
        }
    }
    for t in &timings {
        let mut cells: Vec<&Cell> = after.cells.iter().filter(|c| c.timing == *t).collect();
        cells.sort_by_key(|c| (c.shards, c.replicas));
        let c0 = cells[0];
        let _ = writeln!(
            md,
            "{level} Timing set `{t}` ({} s / {} s / {} s)\n",
            c0.lease_duration_s, c0.renew_deadline_s, c0.retry_period_s
        );
        md.push_str("| S | M | k | watch ev/s/replica before → after | ratio | ev/RP/k before → after | writes/s before → after | replica CPU s/min before → after | apiserver CPU s/min before → after | RSS MiB before → after | speed-up after | join / TERM / KILL after | double, one owner after |\n");
        md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for a in cells {
            let b = by_key.get(&key(a)).copied().filter(|b| b.ran);
            let bf = |f: fn(&Cell) -> Option<f64>| b.and_then(f);
            let k = k_of(a);
            if !a.ran {
                let _ = writeln!(
                    md,
                    "| {} | {} | {k:.0} | {} → **not run** | | | | | | | | | |",
                    a.shards,
                    a.replicas,
                    num(bf(|c| c.watch_events_per_replica_per_s), 1)
                );
                continue;
            }
            let _ = writeln!(
                md,
                "| {} | {} | {k:.0} | {} → {} | {} | {} → {} | {} → {} | {} → {} | {} → {} | {} → {} | {} | {} / {} / {} | {}, {} |",
                a.shards,
                a.replicas,
                if b.is_some() {
                    num(bf(|c| c.watch_events_per_replica_per_s), 1)
                } else {
                    "not run".to_owned()
                },
                num(a.watch_events_per_replica_per_s, 1),
                ratio(
                    bf(|c| c.watch_events_per_replica_per_s),
                    a.watch_events_per_replica_per_s
                ),
                num(b.and_then(per_share), 2),
                num(per_share(a), 2),
                num(bf(|c| c.lease_writes_per_s), 1),
                num(a.lease_writes_per_s, 1),
                num(bf(|c| c.replica_cpu_s_per_min_mean), 2),
                num(a.replica_cpu_s_per_min_mean, 2),
                num(bf(|c| c.apiserver_cpu_s_per_min), 1),
                num(a.apiserver_cpu_s_per_min, 1),
                num(bf(|c| c.replica_rss_mib_mean), 0),
                num(a.replica_rss_mib_mean, 0),
                a.speedup.map_or("–".to_owned(), |s| format!("{s:.2}×")),
                time(a.join_rebalance_ms),
                time(a.term_rebalance_ms),
                time(a.kill_rebalance_ms),
                a.double_reconciles.map_or("–".to_owned(), |d| d.to_string()),
                match a.one_owner {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "–",
                },
            );
        }
        md.push('\n');
    }
    let missing: Vec<String> = after
        .cells
        .iter()
        .filter(|c| !c.ran)
        .map(|c| {
            format!(
                "{} M={} S={}: {}",
                c.timing,
                c.replicas,
                c.shards,
                c.reason.as_deref().unwrap_or("skipped").replace('\n', " ")
            )
        })
        .collect();
    if !missing.is_empty() {
        let _ = writeln!(md, "Not run in `{}`: {}.\n", after.meta.label, missing.join("; "));
    }
    md
}

/// The elected-shard targets, judged on one run.
fn targets(r: &ScaleResults) -> Vec<Target> {
    let mut out = Vec::new();
    let mut push = |what: String, value: String, met: bool| {
        out.push(Target {
            what,
            value,
            met: Some(met),
        })
    };
    let label = &r.meta.label;
    let ran: Vec<&Cell> = r.cells.iter().filter(|c| c.ran).collect();
    let name = |c: &Cell| format!("{} {}×{}", c.timing, c.replicas, c.shards);
    // Watch events per replica: bounded by the share, not the replica count.
    let multi: Vec<&Cell> = ran.iter().copied().filter(|c| c.replicas > 1).collect();
    let over: Vec<String> = multi
        .iter()
        .filter(|c| per_share(c).is_none_or(|v| v * k_of(c) > bound_per_rp(c)))
        .map(|c| name(c))
        .collect();
    let worst = multi
        .iter()
        .filter_map(|c| per_share(c).map(|v| (v, c)))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    push(
        format!(
            "elected shards at scale ({label}): watch events per replica per retry period ≤ 5k + 2 in every cell of M ≥ 2 (k = S / M: bounded by the share, not by M)"
        ),
        format!(
            "{} of {} cells over{}; the most: {} per k ({})",
            over.len(),
            multi.len(),
            if over.is_empty() {
                String::new()
            } else {
                format!(" ({})", over.join(", "))
            },
            worst.map_or("–".to_owned(), |(v, _)| format!("{v:.2}")),
            worst.map_or("–".to_owned(), |(_, c)| name(c)),
        ),
        over.is_empty() && !multi.is_empty(),
    );
    // The same share at different replica counts, side by side.
    let mut groups: BTreeMap<(String, u64), Vec<&Cell>> = BTreeMap::new();
    for c in &multi {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        groups
            .entry((c.timing.clone(), (k_of(c) * 1000.0).round() as u64))
            .or_default()
            .push(c);
    }
    for ((t, k), mut cells) in groups {
        if cells.len() < 2 {
            continue;
        }
        cells.sort_by_key(|c| c.replicas);
        let vals: Vec<String> = cells
            .iter()
            .map(|c| format!("M={}: {}", c.replicas, num(per_share(c), 2)))
            .collect();
        let (lo, hi) = (cells[0], cells[cells.len() - 1]);
        let grew = match (per_share(lo), per_share(hi)) {
            (Some(a), Some(b)) if a > 0.0 => Some(b / a),
            _ => None,
        };
        push(
            format!(
                "elected shards at scale ({label}, {t}, k = {}): watch events per replica per retry period at {}× the replicas ≤ 1.25× (same share)",
                k / 1000,
                hi.replicas / lo.replicas
            ),
            format!("{} (per k); ×{}", vals.join(", "), num(grew, 2)),
            grew.is_some_and(|g| g <= 1.25),
        );
    }
    // Rebalance at 16 × 256 within LD + 2 RP.
    let big: Vec<&Cell> = ran
        .iter()
        .copied()
        .filter(|c| c.replicas == 16 && c.shards == 256)
        .collect();
    for c in &big {
        let bound = (c.lease_duration_s + 2.0 * c.retry_period_s) * 1000.0;
        for (what, v) in [
            ("a join", c.join_rebalance_ms),
            ("a graceful leave (SIGTERM)", c.term_rebalance_ms),
            ("a crash (SIGKILL)", c.kill_rebalance_ms),
        ] {
            push(
                format!(
                    "elected shards at scale ({label}, {}): 16 × 256, {what} → balanced within LD + 2 RP ({})",
                    c.timing,
                    ms(bound)
                ),
                time(v),
                v.is_some_and(|v| v <= bound),
            );
        }
    }
    if big.is_empty() {
        push(
            format!(
                "elected shards at scale ({label}): 16 × 256, a join, a SIGTERM or a SIGKILL → balanced within LD + 2 RP"
            ),
            "not run".to_owned(),
            false,
        );
    }
    // Throughput at 8 replicas.
    for c in ran.iter().filter(|c| c.replicas == 8) {
        push(
            format!(
                "elected shards at scale ({label}, {}): 8 × {}, throughput ≥ 7× one replica's",
                c.timing, c.shards
            ),
            c.speedup.map_or("–".to_owned(), |s| format!("{s:.2}×")),
            c.speedup.is_some_and(|s| s >= 7.0),
        );
    }
    // Safety in every cell.
    let unsafe_cells: Vec<String> = ran
        .iter()
        .filter(|c| c.double_reconciles != Some(0) || c.one_owner != Some(true))
        .map(|c| name(c))
        .collect();
    push(
        format!(
            "elected shards at scale ({label}): 0 double reconciles and one owner per shard in every cell"
        ),
        format!(
            "{} of {} cells{}",
            ran.len() - unsafe_cells.len(),
            ran.len(),
            if unsafe_cells.is_empty() {
                String::new()
            } else {
                format!("; not: {}", unsafe_cells.join(", "))
            }
        ),
        unsafe_cells.is_empty() && !ran.is_empty() && ran.len() == r.cells.len(),
    );
    out
}

fn k_of(c: &Cell) -> f64 {
    f64::from(c.shards) / c.replicas as f64
}

/// Rewrites every `shard_scale-<label>.md` of `dir` from its JSON, and
/// `shard_scale-compare.md` when both `before` and `after` are there.
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
    if let (Some(before), Some(after)) = (
        super::read::<ScaleResults>(dir, "shard_scale-before.json"),
        super::read::<ScaleResults>(dir, "shard_scale-after.json"),
    ) {
        std::fs::write(dir.join("shard_scale-compare.md"), compare(&before, &after))?;
    }
    Ok(())
}
