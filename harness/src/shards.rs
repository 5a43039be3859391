//! Elected shards across processes: the sharded candidates' lines
//! (`SHARDS`, `RECONCILE`), the shards each process holds, and the check that
//! no shard's work ran in two processes at once.
//!
//! A sharded candidate (`CANDIDATE_MODE=sharded`) prints
//!
//! ```text
//! SHARDS <ns> <identity> <shard,shard,...|->
//! RECONCILE <start ns> <object> <end ns> <shard> <fencing token>
//! ```
//!
//! `SHARDS` whenever the set it holds changes (and once at the start);
//! `RECONCILE` for each reconcile, done or dropped, whose `start` and `end`
//! are its first and last points of work, each stamped *before* a check that
//! the shard's term still holds ([`LeaseGuard::is_valid`]): every instant in
//! `[start, end]` lies inside that process's term on the shard.
//!
//! [`LeaseGuard::is_valid`]: https://docs.rs/kube-runtime-lease

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Result, bail};

use crate::clock::fmt_delta;
use crate::events::{Entry, EventLog, Kind};

/// One reconcile of a sharded candidate (a `RECONCILE` line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reconcile {
    /// The process that ran it.
    pub process: String,
    /// The object (its name).
    pub object: String,
    /// Its first point of work.
    pub start: u64,
    /// Its last point of work.
    pub end: u64,
    /// The object's shard.
    pub shard: u16,
    /// The fencing token of the term it ran in.
    pub token: i64,
}

impl Reconcile {
    /// The reconcile of a `RECONCILE` entry, if it is one.
    #[must_use]
    pub fn of(entry: &Entry) -> Option<Self> {
        if entry.kind != Kind::Reconcile {
            return None;
        }
        let mut rest = entry.detail.split_whitespace();
        Some(Self {
            process: entry.process.clone(),
            object: entry.who.clone(),
            start: entry.at,
            end: rest.next()?.parse().ok()?,
            shard: rest.next()?.parse().ok()?,
            token: rest.next()?.parse().ok()?,
        })
    }
}

/// The shards of a `SHARDS` line's detail (`-` for none).
///
/// # Errors
/// When it is not a list of shard numbers.
pub fn parse_shards(detail: &str) -> Result<BTreeSet<u16>> {
    if detail.trim() == "-" || detail.trim().is_empty() {
        return Ok(BTreeSet::new());
    }
    detail
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<u16>()
                .map_err(|e| anyhow::anyhow!("shard {s:?}: {e}"))
        })
        .collect()
}

/// The shards each of `processes` holds by its last `SHARDS` line among
/// `entries` (none for a process that printed none).
#[must_use]
pub fn held_by(entries: &[Entry], processes: &[&str]) -> BTreeMap<String, BTreeSet<u16>> {
    let mut held: BTreeMap<String, BTreeSet<u16>> = processes
        .iter()
        .map(|p| ((*p).to_owned(), BTreeSet::new()))
        .collect();
    for e in entries.iter().filter(|e| e.kind == Kind::Shards) {
        if let Some(slot) = held.get_mut(&e.process) {
            *slot = parse_shards(&e.detail).unwrap_or_default();
        }
    }
    held
}

/// Whether `held` (shards per process) covers all `shards` shards, each held
/// by exactly one process, and every process holds `floor` or `floor + 1` of
/// them (the balance: `floor = shards / processes`).
pub fn balanced(held: &BTreeMap<String, BTreeSet<u16>>, shards: u16) -> bool {
    let count = u16::try_from(held.len()).unwrap_or(u16::MAX).max(1);
    let floor = shards / count;
    let total: usize = held.values().map(BTreeSet::len).sum();
    let union: BTreeSet<u16> = held.values().flatten().copied().collect();
    total == usize::from(shards)
        && union.len() == usize::from(shards)
        && held
            .values()
            .all(|h| h.len() == usize::from(floor) || h.len() == usize::from(floor) + 1)
}

/// Waits until `live` hold the `shards` shards, balanced ([`balanced`]) and
/// unchanged for `quiet`, by their `SHARDS` lines stamped after `after`
/// or before it; returns when the last of those lines was stamped.
///
/// # Errors
/// After `timeout`, with the shards each one holds.
pub async fn wait_balanced(
    log: &EventLog,
    live: &[&str],
    shards: u16,
    quiet: Duration,
    timeout: Duration,
) -> Result<u64> {
    let mut last = None;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let entries = log.entries();
        let held = held_by(&entries, live);
        let at = entries
            .iter()
            .filter(|e| e.kind == Kind::Shards && live.contains(&e.process.as_str()))
            .map(|e| e.at)
            .max()
            .unwrap_or(0);
        if balanced(&held, shards) {
            match last {
                Some((since, when)) if when == at => {
                    if tokio::time::Instant::now().duration_since(since) >= quiet {
                        return Ok(at);
                    }
                }
                _ => last = Some((tokio::time::Instant::now(), at)),
            }
        } else {
            last = None;
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{live:?} not balanced over {shards} shards within {timeout:?}: {held:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `live` together hold all `shards` shards, each by one of them
/// (by their last `SHARDS` lines); returns when the line that completed it
/// was stamped.
///
/// # Errors
/// After `timeout`, with the shards each one holds.
pub async fn wait_covered(log: &EventLog, live: &[&str], shards: u16, timeout: Duration) -> Result<u64> {
    log.wait_until(
        &format!("{live:?} to hold all {shards} shards"),
        timeout,
        |entries| {
            let held = held_by(entries, live);
            let total: usize = held.values().map(BTreeSet::len).sum();
            let union: BTreeSet<u16> = held.values().flatten().copied().collect();
            (total == usize::from(shards) && union.len() == usize::from(shards)).then(|| {
                entries
                    .iter()
                    .filter(|e| e.kind == Kind::Shards && live.contains(&e.process.as_str()))
                    .map(|e| e.at)
                    .max()
                    .unwrap_or(0)
            })
        },
    )
    .await
    .map_err(|e| {
        let held = held_by(&log.entries(), live);
        e.context(format!("held: {held:?}"))
    })
}

/// What [`check_reconciles`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcilesChecked {
    /// Reconciles in the log.
    pub reconciles: usize,
    /// Objects reconciled.
    pub objects: usize,
    /// Times a shard's work moved from one process to another.
    pub moves: usize,
}

/// Checks the `RECONCILE` lines of `entries`: no object was reconciled by two
/// processes at once, nor any shard worked on by two at once (the stronger
/// rule: a shard's holder changes only after the old one's work stopped), and
/// each shard's fencing tokens grow with its terms: a reconcile that starts
/// after another's has a token at least as large, larger when it runs in
/// another process.
///
/// # Errors
/// Every violation (at most 20 are listed), times relative to the log's first
/// entry.
pub fn check_reconciles(entries: &[Entry]) -> Result<ReconcilesChecked> {
    let base = entries.iter().map(|e| e.at).min().unwrap_or(0);
    let mut by_shard: BTreeMap<u16, Vec<Reconcile>> = BTreeMap::new();
    let mut objects = BTreeSet::new();
    let mut reconciles = 0;
    for r in entries.iter().filter_map(Reconcile::of) {
        reconciles += 1;
        objects.insert(r.object.clone());
        by_shard.entry(r.shard).or_default().push(r);
    }
    let malformed = entries
        .iter()
        .filter(|e| e.kind == Kind::Reconcile && Reconcile::of(e).is_none())
        .count();
    let mut problems = Vec::new();
    if malformed > 0 {
        problems.push(format!("{malformed} malformed RECONCILE lines"));
    }
    let mut moves = 0;
    for (shard, runs) in &mut by_shard {
        runs.sort_by_key(|r| (r.start, r.end));
        // The latest end so far of each process's work on this shard.
        let mut last_end: BTreeMap<&str, (u64, &Reconcile)> = BTreeMap::new();
        let mut previous: Option<&Reconcile> = None;
        for r in runs.iter() {
            for (process, (end, other)) in &last_end {
                if *process != r.process && *end >= r.start {
                    let what = if other.object == r.object {
                        format!(
                            "{} reconciled by {} and {} at once",
                            r.object, other.process, r.process
                        )
                    } else {
                        format!(
                            "shard {shard} worked on by {} ({}) and {} ({}) at once",
                            other.process, other.object, r.process, r.object
                        )
                    };
                    problems.push(format!(
                        "{what}: [{}, {}] and [{}, {}]",
                        fmt_delta(base, other.start),
                        fmt_delta(base, other.end),
                        fmt_delta(base, r.start),
                        fmt_delta(base, r.end)
                    ));
                }
            }
            if let Some(p) = previous {
                let handed_over = p.process != r.process;
                if handed_over {
                    moves += 1;
                }
                if r.token < p.token || (handed_over && r.token == p.token) {
                    problems.push(format!(
                        "shard {shard}: {} at {} has fencing token {} after {}'s {} at {}",
                        r.process,
                        fmt_delta(base, r.start),
                        r.token,
                        p.process,
                        p.token,
                        fmt_delta(base, p.start)
                    ));
                }
            }
            let slot = last_end.entry(r.process.as_str()).or_insert((r.end, r));
            if r.end >= slot.0 {
                *slot = (r.end, r);
            }
            previous = Some(r);
        }
    }
    if problems.is_empty() {
        return Ok(ReconcilesChecked {
            reconciles,
            objects: objects.len(),
            moves,
        });
    }
    let mut text = String::new();
    for p in problems.iter().take(20) {
        let _ = writeln!(text, "  {p}");
    }
    bail!(
        "{} violations of one owner per shard among {reconciles} reconciles:\n{text}",
        problems.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reconcile(process: &str, object: &str, start: u64, end: u64, shard: u16, token: i64) -> Entry {
        Entry {
            seq: 0,
            process: process.to_owned(),
            kind: Kind::Reconcile,
            at: start,
            who: object.to_owned(),
            detail: format!("{end} {shard} {token}"),
        }
    }

    #[test]
    fn handovers_in_order_pass_and_are_counted() {
        let log = [
            reconcile("a", "x", 10, 20, 1, 3),
            reconcile("a", "y", 15, 25, 1, 3),
            reconcile("b", "x", 30, 40, 1, 4),
            reconcile("a", "z", 12, 50, 2, 7),
        ];
        let checked = check_reconciles(&log).unwrap();
        assert_eq!(
            checked,
            ReconcilesChecked {
                reconciles: 4,
                objects: 3,
                moves: 1
            }
        );
    }

    #[test]
    fn overlaps_on_an_object_or_a_shard_and_stale_tokens_fail() {
        let same_object = [
            reconcile("a", "x", 10, 30, 1, 3),
            reconcile("b", "x", 30, 40, 1, 4),
        ];
        let e = check_reconciles(&same_object).unwrap_err().to_string();
        assert!(e.contains("x reconciled by a and b at once"), "{e}");
        let same_shard = [
            reconcile("a", "x", 10, 30, 1, 3),
            reconcile("b", "y", 20, 40, 1, 4),
        ];
        let e = check_reconciles(&same_shard).unwrap_err().to_string();
        assert!(e.contains("shard 1 worked on by a (x) and b (y)"), "{e}");
        let stale = [
            reconcile("a", "x", 10, 20, 1, 3),
            reconcile("b", "x", 30, 40, 1, 3),
        ];
        let e = check_reconciles(&stale).unwrap_err().to_string();
        assert!(e.contains("fencing token 3 after a's 3"), "{e}");
        // Different shards may run at once.
        let apart = [
            reconcile("a", "x", 10, 30, 1, 3),
            reconcile("b", "y", 20, 40, 2, 1),
        ];
        assert!(check_reconciles(&apart).is_ok());
    }

    #[test]
    fn shard_lists_and_the_balance() {
        assert_eq!(parse_shards("-").unwrap(), BTreeSet::new());
        assert_eq!(parse_shards("0,3,11").unwrap(), BTreeSet::from([0, 3, 11]));
        assert!(parse_shards("0,x").is_err());
        let held = |v: &[(&str, &[u16])]| {
            v.iter()
                .map(|(p, s)| ((*p).to_owned(), s.iter().copied().collect::<BTreeSet<_>>()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(balanced(&held(&[("a", &[0, 1]), ("b", &[2, 3, 4])]), 5));
        assert!(
            !balanced(&held(&[("a", &[0]), ("b", &[1, 2, 3, 4])]), 5),
            "off by more than one"
        );
        assert!(
            !balanced(&held(&[("a", &[0, 1, 2]), ("b", &[2, 3])]), 4),
            "shard 2 twice"
        );
        assert!(
            !balanced(&held(&[("a", &[0, 1]), ("b", &[2])]), 4),
            "shard 3 held by none"
        );
    }
}
