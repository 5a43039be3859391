//! The tables of the latency scenarios: the runs, handover, failover.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};

use super::stats::{failed, ms, ratio, stats, values};
use super::svg::svg;
use super::{Target, jiff_like_utc, read};
use crate::chain::Trial;
use crate::impls::{HANDOVER_IMPLS, IMPLS, Impl, TIMINGS};
use crate::machine::Meta;

/// The runs behind the results (`meta-*.json`) and the machine of the last.
pub(super) fn runs(md: &mut String, dir: &Path) {
    let mut metas: Vec<(String, Meta)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    (name.starts_with("meta-") && name.ends_with(".json"))
                        .then(|| read::<Meta>(dir, &name).map(|m| (name, m)))
                        .flatten()
                })
                .collect()
        })
        .unwrap_or_default();
    metas.sort_by_key(|(_, m)| m.started_unix);
    if !metas.is_empty() {
        md.push_str("### Runs\n\n| scenarios | command | started (UTC) | took | 1-min load average during the run (min / mean / max) | commit |\n|---|---|---|---|---|---|\n");
        for (_, m) in &metas {
            let l = &m.loadavg_samples;
            let (lo, hi) = l
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
            let mean = l.iter().sum::<f64>() / l.len().max(1) as f64;
            let started = jiff_like_utc(m.started_unix);
            let _ = writeln!(
                md,
                "| {}{} | `{}` | {started} | {:.1} min | {lo:.1} / {mean:.1} / {hi:.1} on {} cores | {} |",
                m.scenarios.join(", "),
                if m.quick { " (quick)" } else { "" },
                m.command.rsplit('/').next().unwrap_or(&m.command),
                m.duration_s / 60.0,
                m.nproc,
                m.commit
            );
        }
        let m = &metas[metas.len() - 1].1;
        let _ = writeln!(
            md,
            "\nMachine: {} cores ({}), {:.1} GiB, Linux {}; {}; {}; kube-apiserver {}; {}; {}.\n",
            m.nproc,
            m.cpu_model,
            m.mem_total_kib as f64 / 1024.0 / 1024.0,
            m.kernel,
            m.rustc,
            m.go,
            m.kube_apiserver,
            m.client_go.replace("k8s.io/client-go", "client-go"),
            m.k8s_controller
        );
    }
}

/// Section 1: handover after a graceful release.
pub(super) fn handover(md: &mut String, targets: &mut Vec<Target>, trials: &[Trial]) {
    md.push_str("### 1. Handover after graceful release\n\n");
    md.push_str("*release → leader*: from the driver's watch seeing the released Lease (holder `\"\"`) to the new leader's `started-leading`; *SIGTERM → leader*: from the signal to the old leader (includes its shutdown and release request). Ratio: the reference's time divided by ours (above 1: ours is faster). *kube-runtime-lease, kube default client*: the same candidate on the client kube-client 5 builds by default, which leaves TCP_NODELAY off (every other candidate has it on: Go's default, and `examples/common.rs`'s client); see *Handover and TCP_NODELAY* below.\n\n");
    for t in TIMINGS {
        let _ = writeln!(
            md,
            "**{}** (lease / renew deadline / retry period, seconds)\n",
            t.name
        );
        md.push_str("| implementation | trials (failed) | release → leader p50 | p99 | min | max | SIGTERM → leader p50 | p99 | ratio p50 | ratio p99 |\n|---|---|---|---|---|---|---|---|---|---|\n");
        let ours = stats(&values(trials, Impl::Ours, t.name, |x| {
            x.lease_event_to_leader_ms
        }));
        for imp in HANDOVER_IMPLS {
            let rel = stats(&values(trials, imp, t.name, |x| x.lease_event_to_leader_ms));
            let sig = stats(&values(trials, imp, t.name, |x| x.signal_to_leader_ms));
            let (Some(r), Some(s)) = (rel, sig) else {
                let _ = writeln!(
                    md,
                    "| {} | 0 ({}) | | | | | | | | |",
                    imp.name(),
                    failed(trials, imp, t.name)
                );
                continue;
            };
            let (r50, r99) = match (imp, ours) {
                (Impl::Ours, _) | (_, None) => ("1×".to_owned(), "1×".to_owned()),
                (_, Some(o)) => (ratio(r.p50, o.p50), ratio(r.p99, o.p99)),
            };
            let _ = writeln!(
                md,
                "| {} | {} ({}) | {} | {} | {} | {} | {} | {} | {r50} | {r99} |",
                imp.name(),
                r.n,
                failed(trials, imp, t.name),
                ms(r.p50),
                ms(r.p99),
                ms(r.min),
                ms(r.max),
                ms(s.p50),
                ms(s.p99)
            );
        }
        md.push('\n');
        if let Some(o) = ours {
            targets.push(Target {
                what: format!("handover p99 < 250 ms ({})", t.name),
                value: format!(
                    "{} (release → leader); SIGTERM → leader p99 {}",
                    ms(o.p99),
                    stats(&values(trials, Impl::Ours, t.name, |x| x.signal_to_leader_ms))
                        .map_or("?".into(), |s| ms(s.p99))
                ),
                met: Some(o.p99 < 250.0),
            });
            if let Some(g) = stats(&values(trials, Impl::ClientGo, t.name, |x| {
                x.lease_event_to_leader_ms
            })) {
                targets.push(Target {
                    what: format!("client-go's handover p99 at least 20× ours ({})", t.name),
                    value: format!("{} / {} = {}", ms(g.p99), ms(o.p99), ratio(g.p99, o.p99)),
                    met: Some(g.p99 / o.p99.max(1e-9) >= 20.0),
                });
            }
        }
    }
}

/// Section 2: failover after SIGKILL, and its chart.
#[allow(clippy::too_many_lines)]
pub(super) fn failover(
    md: &mut String,
    targets: &mut Vec<Target>,
    trials: &[Trial],
    dir: &Path,
) -> Result<()> {
    md.push_str("### 2. Failover after SIGKILL\n\n");
    md.push_str("*kill → leader*: from SIGKILL of the leader to the new leader's `started-leading`. It can legitimately be shorter than the lease duration (by up to the time since the dead leader's last renewal): expiry counts from the last renewal the followers saw, not from the kill. *last renewal → leader*: from the driver's watch seeing the dead leader's last write to the new leader; this is the safety margin and must never be below the lease duration.\n\n");
    for t in TIMINGS {
        let _ = writeln!(md, "**{}** (lease duration {} ms)\n", t.name, t.lease_ms);
        md.push_str("| implementation | trials (failed) | kill → leader p50 | p99 | min | max | p99 − lease | last renewal → leader min | p50 | p99 | ratio p50 | ratio p99 |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        let ours = stats(&values(trials, Impl::Ours, t.name, |x| x.signal_to_leader_ms));
        for imp in IMPLS {
            let k = stats(&values(trials, imp, t.name, |x| x.signal_to_leader_ms));
            let r = stats(&values(trials, imp, t.name, |x| x.lease_event_to_leader_ms));
            let (Some(k), Some(r)) = (k, r) else {
                let _ = writeln!(
                    md,
                    "| {} | 0 ({}) | | | | | | | | | | |",
                    imp.name(),
                    failed(trials, imp, t.name)
                );
                continue;
            };
            let (k50, k99) = match (imp, ours) {
                (Impl::Ours, _) | (_, None) => ("1×".to_owned(), "1×".to_owned()),
                (_, Some(o)) => (ratio(k.p50, o.p50), ratio(k.p99, o.p99)),
            };
            let _ = writeln!(
                md,
                "| {} | {} ({}) | {} | {} | {} | {} | {:+.0} ms | {} | {} | {} | {k50} | {k99} |",
                imp.name(),
                k.n,
                failed(trials, imp, t.name),
                ms(k.p50),
                ms(k.p99),
                ms(k.min),
                ms(k.max),
                k.p99 - t.lease_ms as f64,
                ms(r.min),
                ms(r.p50),
                ms(r.p99)
            );
            if imp != Impl::Ours {
                targets.push(Target {
                    what: format!(
                        "(reference) {}: last renewal → leader never below the lease duration ({})",
                        imp.name(),
                        t.name
                    ),
                    value: format!("min {} vs lease {} ms", ms(r.min), t.lease_ms),
                    met: Some(r.min >= t.lease_ms as f64),
                });
            }
        }
        md.push('\n');
        if let Some(o) = ours {
            let r = stats(&values(trials, Impl::Ours, t.name, |x| {
                x.lease_event_to_leader_ms
            }));
            targets.push(Target {
                what: format!("failover minimum, kill → leader, never below the lease duration, counted from the kill, not the last renewal ({})", t.name),
                value: format!("min {} vs lease {} ms: expiry counts from the last renewal seen, up to a retry period before the kill (client-go's protocol; the references do the same)", ms(o.min), t.lease_ms),
                met: Some(o.min >= t.lease_ms as f64),
            });
            if let Some(r) = r {
                targets.push(Target {
                    what: format!(
                        "failover minimum, last renewal → leader, never below the lease duration ({})",
                        t.name
                    ),
                    value: format!("min {} vs lease {} ms", ms(r.min), t.lease_ms),
                    met: Some(r.min >= t.lease_ms as f64),
                });
            }
            targets.push(Target {
                what: format!("failover p99 within 250 ms of the lease duration ({})", t.name),
                value: format!(
                    "kill → leader p99 {} = lease {:+.0} ms",
                    ms(o.p99),
                    o.p99 - t.lease_ms as f64
                ),
                met: Some(o.p99 - t.lease_ms as f64 <= 250.0),
            });
        }
    }
    md.push_str("![Failover latencies](bench/results/failover.svg)\n\n");
    std::fs::write(dir.join("failover.svg"), svg(trials)).context("writing failover.svg")?;
    Ok(())
}
