//! Section 6: warm standby against cold.

use std::fmt::Write as _;

use super::Target;
use super::stats::{ms, stats};
use crate::warm::WarmTrial;

fn cell(values: &[f64]) -> String {
    match stats(values) {
        Some(s) => format!("{} ({}–{})", ms(s.p50), ms(s.min), ms(s.max)),
        None => "n/a".to_owned(),
    }
}

pub(super) fn warm(md: &mut String, targets: &mut Vec<Target>, trials: &[WarmTrial]) {
    let objects = trials.first().map_or(0, |t| t.objects);
    md.push_str("### 6. Warm standby against cold\n\n");
    let _ = writeln!(
        md,
        "A standby Controller of {objects} ConfigMaps takes over from a leader that hands over on SIGTERM, cold (`with_leader_election`: it lists once it leads) and warm (`with_leader_election_warm`: its store was filled while following), trials alternating (`bench/src/warm.rs`). *win*: the standby's elector names it holder. Medians, with min–max. LISTs: ConfigMap LIST requests the apiserver served from the SIGTERM to the last reconcile (`apiserver_request_total`; the watcher lists in pages of 500). VmRSS of the standby while following, then as leader once every object was reconciled.\n"
    );
    md.push_str("| mode | trials | SIGTERM → win | win → first reconcile | win → all reconciled | LISTs at takeover | follower VmRSS | leader VmRSS |\n|---|---|---|---|---|---|---|---|\n");
    let mut medians = std::collections::BTreeMap::new();
    for mode in ["cold", "warm"] {
        let of: Vec<&WarmTrial> = trials.iter().filter(|t| t.mode == mode).collect();
        if of.is_empty() {
            continue;
        }
        let col = |f: fn(&WarmTrial) -> f64| of.iter().map(|t| f(t)).collect::<Vec<f64>>();
        let first = col(|t| t.win_to_first_reconcile_ms);
        let all = col(|t| t.win_to_all_reconciled_ms);
        let lists = col(|t| t.lists_at_takeover);
        let rss = |f: fn(&WarmTrial) -> u64| {
            let v: Vec<f64> = of.iter().map(|t| f(t) as f64 / 1024.0).collect();
            stats(&v).map_or("n/a".to_owned(), |s| format!("{:.1} MiB", s.p50))
        };
        let _ = writeln!(
            md,
            "| {mode} | {} | {} | {} | {} | {} | {} | {} |",
            of.len(),
            cell(&col(|t| t.signal_to_win_ms)),
            cell(&first),
            cell(&all),
            stats(&lists).map_or("n/a".to_owned(), |s| format!(
                "{:.0} ({:.0}–{:.0})",
                s.p50, s.min, s.max
            )),
            rss(|t| t.follower_rss_kib),
            rss(|t| t.leader_rss_kib),
        );
        medians.insert(
            mode,
            (
                stats(&first).map(|s| s.p50),
                stats(&all).map(|s| s.p50),
                stats(&lists).map(|s| s.max),
            ),
        );
    }
    md.push('\n');
    if let (
        Some((Some(warm_first), Some(warm_all), Some(warm_lists))),
        Some((Some(cold_first), Some(cold_all), _)),
    ) = (medians.get("warm"), medians.get("cold"))
    {
        let _ = writeln!(
            md,
            "Warm against cold: first reconcile {:.0}× sooner, every object reconciled {:.1}× sooner.\n",
            cold_first / warm_first.max(0.001),
            cold_all / warm_all.max(0.001)
        );
        targets.push(Target {
            what: "warm standby: first reconcile within 10 ms of winning (median)".to_owned(),
            value: format!("{} (cold: {})", ms(*warm_first), ms(*cold_first)),
            met: Some(*warm_first <= 10.0),
        });
        targets.push(Target {
            what: "warm standby: no LIST at takeover".to_owned(),
            value: format!("{warm_lists:.0} at most"),
            met: Some(*warm_lists < 0.5),
        });
    }
}
