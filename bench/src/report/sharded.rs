//! Section 7: elected shards.

use std::fmt::Write as _;

use super::Target;
use super::stats::{ms, stats};
use crate::sharded::{ShardedTrial, TIMINGS};

fn cell(values: &[f64]) -> String {
    match stats(values) {
        Some(s) => format!("{} ({}–{})", ms(s.p50), ms(s.min), ms(s.max)),
        None => "n/a".to_owned(),
    }
}

pub(super) fn sharded(md: &mut String, targets: &mut Vec<Target>, trials: &[ShardedTrial]) {
    let Some(first) = trials.first() else { return };
    md.push_str("### 7. Elected shards: throughput across replicas\n\n");
    let _ = writeln!(
        md,
        "One Controller of {} ConfigMaps over {} shards (`ShardedElector`, `bench/src/sharded.rs`; ours only: neither reference shards), each reconcile a simulated external call of {} ms, at most {} in flight per replica. *pass*: SIGUSR1 to every replica (`reconcile_all_on`) → the last of the {} reconciles ended; objects per second over it. *double*: reconciles in the pass beyond one per object; *one owner*: no object or shard worked on by two replicas at once over the whole trial (`check_reconciles`). *settle*: replicas spawned → shards held and balanced (each new Lease is held one lease duration before its first term). *join*: one more replica spawned → balanced again (its roster entry has no creation hold: the join waits for the roster to be stable for a retry period, then the handovers). Lease requests: every verb but WATCH, per minute over a quiet window once settled (first trial of each size), the control plane's own included (kube-apiserver renews its identity Lease: section 3's baseline); each shard is renewed by its holder once per retry period and a roster entry is written only at a join or a leave, so the election's part is S × 60 / retry period, e.g. 16 × 60 = 960/min at a 1 s retry period, 480/min at client-go's 2 s. Lease watches: open now (`apiserver_longrunning_requests`), the control plane's own included: the balancer's two per replica (the roster, and its selection of shards), plus a shard elector's own while it leads or campaigns. Timings {:?}/{:?}/{:?}. Medians, with min–max.\n",
        first.objects,
        first.shards,
        first.reconcile_ms,
        first.concurrency,
        first.objects,
        TIMINGS.lease_duration,
        TIMINGS.renew_deadline,
        TIMINGS.retry_period,
    );
    md.push_str("| replicas | trials | pass | objects/s | speed-up | double | one owner | settle | join → balanced | Lease requests/min | Lease watches |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    let median = |of: &[&ShardedTrial], f: fn(&ShardedTrial) -> f64| {
        stats(&of.iter().map(|t| f(t)).collect::<Vec<_>>()).map(|s| s.p50)
    };
    let single: Vec<&ShardedTrial> = trials.iter().filter(|t| t.replicas == 1).collect();
    let base = median(&single, |t| t.per_second);
    let mut speedup_4 = None;
    let mut doubles = 0;
    let mut all_one_owner = true;
    let mut sizes: Vec<usize> = trials.iter().map(|t| t.replicas).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for replicas in sizes {
        let of: Vec<&ShardedTrial> = trials.iter().filter(|t| t.replicas == replicas).collect();
        let col = |f: fn(&ShardedTrial) -> f64| of.iter().map(|t| f(t)).collect::<Vec<f64>>();
        let rate = median(&of, |t| t.per_second);
        let speedup = rate.zip(base).map(|(r, b)| r / b);
        if replicas == 4 {
            speedup_4 = speedup;
        }
        let double: usize = of.iter().map(|t| t.double_reconciles).sum();
        doubles += double;
        let owner = of.iter().all(|t| t.one_owner);
        all_one_owner &= owner;
        let requests = of.iter().find_map(|t| t.lease_requests_per_min);
        let watches = of.iter().find_map(|t| t.lease_watches);
        let _ = writeln!(
            md,
            "| {replicas} | {} | {} | {} | {} | {double} | {} | {} | {} | {} | {} |",
            of.len(),
            cell(&col(|t| t.pass_ms)),
            rate.map_or("n/a".to_owned(), |r| format!("{r:.0}")),
            speedup.map_or("n/a".to_owned(), |s| format!("{s:.2}×")),
            if owner { "yes" } else { "**no**" },
            cell(&col(|t| t.settle_ms)),
            cell(&col(|t| t.join_rebalance_ms)),
            requests.map_or("n/a".to_owned(), |r| format!("{r:.0}")),
            watches.map_or("n/a".to_owned(), |w| format!("{w:.0}")),
        );
    }
    md.push('\n');
    targets.push(Target {
        what: "elected shards: 4 replicas ≥ 3.6× one replica's throughput (median)".to_owned(),
        value: speedup_4.map_or("n/a".to_owned(), |s| format!("{s:.2}×")),
        met: speedup_4.map(|s| s >= 3.6),
    });
    targets.push(Target {
        what: "elected shards: zero double reconciles, one owner per shard".to_owned(),
        value: format!(
            "{doubles} double; one owner: {}",
            if all_one_owner { "yes" } else { "no" }
        ),
        met: Some(doubles == 0 && all_one_owner),
    });
}
