//! The ledger and its checker: what the candidates' guarded work wrote.
//!
//! Every write appends one line to the ledger `ConfigMap`'s `ledger` key:
//!
//! ```text
//! <n> <token> <identity> <term> <seq> <ns>
//! ```
//!
//! `n` numbers the writes (each write reads the count and writes it plus one,
//! with the resourceVersion read as precondition, so `n` is the write's
//! position in the object's history); `token` is the term's fencing token
//! (`-` for client-go, which has none); `term` names the writer's term
//! (`<pid>:<count of its terms>`); `seq` counts the term's writes and `ns` is
//! `CLOCK_MONOTONIC` at the write. The object keeps its last lines only; the
//! run watches every version through both apiservers, so the union of what
//! it saw is the whole history ([`Checked::unobserved`] counts what is missing).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::clock::fmt_ms;

/// One line of the ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// The write's number.
    pub n: u64,
    /// The term's fencing token (`None`: client-go).
    pub token: Option<i64>,
    /// The writer.
    pub identity: String,
    /// The writer's term.
    pub term: String,
    /// The write's number within its term.
    pub seq: u64,
    /// When it was written (`CLOCK_MONOTONIC` ns).
    pub at: u64,
}

impl Line {
    /// Parses a ledger line.
    #[must_use]
    pub fn parse(line: &str) -> Option<Self> {
        let mut p = line.split_whitespace();
        let n = p.next()?.parse().ok()?;
        let token = match p.next()? {
            "-" => None,
            t => Some(t.parse().ok()?),
        };
        Some(Self {
            n,
            token,
            identity: p.next()?.to_owned(),
            term: p.next()?.to_owned(),
            seq: p.next()?.parse().ok()?,
            at: p.next()?.parse().ok()?,
        })
    }

    fn term_key(&self) -> (&str, &str) {
        (&self.identity, &self.term)
    }
}

/// What the run saw of a ledger: every line by number, and lines that
/// claimed a number another line had (a lost update).
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// The lines, by `n`.
    pub lines: BTreeMap<u64, Line>,
    /// Lines whose `n` was already taken by a different line.
    pub collisions: Vec<(Line, Line)>,
}

impl Seen {
    /// Adds every line of one version of the ledger's `ledger` key.
    pub fn add_version(&mut self, text: &str) {
        for line in text.lines().filter_map(Line::parse) {
            match self.lines.get(&line.n) {
                Some(old) if *old != line => self.collisions.push((old.clone(), line)),
                Some(_) => {}
                None => {
                    self.lines.insert(line.n, line);
                }
            }
        }
    }
}

/// A fault's time in the run: from when it began to when it had healed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// When it began (ns).
    pub start: u64,
    /// When it had ended (ns).
    pub healed: u64,
}

/// The verdict on a ledger.
#[derive(Clone, Debug, Default)]
pub struct Checked {
    /// Writes in the ledger.
    pub writes: usize,
    /// Numbers below the highest one that the run never saw.
    pub unobserved: u64,
    /// Terms that wrote.
    pub terms: usize,
    /// Writes from a term after a later term's first write (a stale write),
    /// and lost updates (two writes with one number); one line per term (or
    /// lost update).
    pub stale: Vec<String>,
    /// The stale writes and lost updates, counted one by one.
    pub stale_writes: usize,
    /// When each entry of [`Checked::stale`] happened (its first stale write).
    pub stale_at: Vec<u64>,
    /// Terms whose token was not above every earlier term's (fenced writers only).
    pub tokens_backwards: Vec<String>,
    /// The longest time between two writes (or from the start to the first).
    pub longest_gap: u64,
    /// The longest time between two writes that no fault explains: counted
    /// from the later of the earlier write and the last fault's healing, to
    /// the later write or the next fault's start.
    pub longest_unexplained_gap: u64,
    /// Unexplained gaps above the bound, one line each.
    pub unbounded_gaps: Vec<String>,
}

/// The part of the gap `[a, b]` that no fault of `faults` explains: from
/// the later of `a` and the last healing at or before `b`, to the earlier of
/// `b` and the next fault's start; zero while a fault is active.
#[must_use]
pub fn unexplained(a: u64, b: u64, faults: &[Window]) -> u64 {
    let from = faults
        .iter()
        .map(|f| f.healed)
        .filter(|h| *h <= b)
        .fold(a, u64::max);
    if faults.iter().any(|f| f.start <= from && f.healed > from) {
        return 0;
    }
    let to = faults
        .iter()
        .map(|f| f.start)
        .filter(|s| *s >= from)
        .fold(b, u64::min);
    to.saturating_sub(from)
}

/// Judges a ledger: `started` is when the candidates were up, `end` when
/// the run stopped looking, `bound` the longest unexplained gap allowed
/// (lease duration + renew deadline, plus the slack of the run).
#[must_use]
pub fn check(seen: &Seen, faults: &[Window], started: u64, end: u64, bound: u64) -> Checked {
    let mut out = Checked {
        writes: seen.lines.len(),
        unobserved: seen
            .lines
            .keys()
            .next_back()
            .map_or(0, |last| last - seen.lines.len() as u64),
        ..Checked::default()
    };
    out.stale_writes = seen.collisions.len();
    for (old, new) in &seen.collisions {
        out.stale_at.push(new.at);
        out.stale.push(format!(
            "lost update: write {} is both {} {} and {} {}",
            old.n, old.identity, old.term, new.identity, new.term
        ));
    }
    let mut finished: HashSet<(&str, &str)> = HashSet::new();
    let mut current: Option<(&str, &str)> = None;
    let mut highest_token: Option<i64> = None;
    let mut stale_by_term: HashMap<(&str, &str), (u64, u64, u64)> = HashMap::new();
    let mut previous_at = started;
    let note_gap = |a: u64, b: u64, what: &str, out: &mut Checked| {
        out.longest_gap = out.longest_gap.max(b.saturating_sub(a));
        let gap = unexplained(a, b, faults);
        out.longest_unexplained_gap = out.longest_unexplained_gap.max(gap);
        if gap > bound {
            out.unbounded_gaps.push(format!(
                "no write for {} after the faults had healed ({what}), above the bound of {}",
                fmt_ms(gap),
                fmt_ms(bound)
            ));
        }
    };
    for line in seen.lines.values() {
        note_gap(
            previous_at,
            line.at,
            &format!("before write {}", line.n),
            &mut out,
        );
        previous_at = previous_at.max(line.at);
        let key = line.term_key();
        if current == Some(key) {
            continue;
        }
        if finished.contains(&key) {
            // An older term writes again after another term has written.
            let e = stale_by_term.entry(key).or_insert((line.n, 0, line.at));
            e.1 += 1;
            out.stale_writes += 1;
            continue;
        }
        if let Some(prev) = current {
            finished.insert(prev);
        }
        current = Some(key);
        out.terms += 1;
        if let Some(token) = line.token {
            if let Some(high) = highest_token.filter(|h| token <= *h) {
                out.tokens_backwards.push(format!(
                    "term {} {} began at write {} with token {token}, not above {high}",
                    line.identity, line.term, line.n
                ));
            }
            highest_token = Some(highest_token.map_or(token, |h| h.max(token)));
        }
    }
    note_gap(previous_at, end, "at the end of the run", &mut out);
    let mut stale: Vec<_> = stale_by_term.into_iter().collect();
    stale.sort_by_key(|(_, (first, _, _))| *first);
    for ((identity, term), (first, count, at)) in stale {
        out.stale_at.push(at);
        out.stale.push(format!(
            "stale: term {identity} {term} wrote {count} time(s) after a later term's first write (first at write {first})"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn seen(lines: &[&str]) -> Seen {
        let mut seen = Seen::default();
        seen.add_version(&lines.join("\n"));
        seen
    }

    #[test]
    fn an_orderly_ledger_passes() {
        let s = seen(&[
            "1 5 a 10:1 1 1000000000",
            "2 5 a 10:1 2 1100000000",
            "3 6 b 11:1 1 3000000000",
            "4 7 a 10:2 1 4000000000",
        ]);
        let c = check(&s, &[], S, 4 * S, 3 * S);
        assert_eq!((c.writes, c.terms, c.unobserved), (4, 3, 0));
        assert!(
            c.stale.is_empty() && c.tokens_backwards.is_empty() && c.unbounded_gaps.is_empty(),
            "{c:?}"
        );
        assert_eq!(c.longest_gap, 19 * S / 10);
    }

    #[test]
    fn a_term_that_writes_after_its_successor_is_a_stale_write() {
        let s = seen(&[
            "1 - a 10:1 1 1000000000",
            "2 - b 11:1 1 2000000000",
            "3 - a 10:1 2 2100000000",
            "4 - a 10:1 3 2200000000",
            "5 - b 11:1 2 2300000000",
        ]);
        let c = check(&s, &[], S, 3 * S, 3 * S);
        // a's two late writes are stale; b, the newest term, writing on is not.
        assert_eq!((c.stale.len(), c.stale_writes), (1, 2), "{:?}", c.stale);
        assert!(
            c.stale[0].contains("term a 10:1 wrote 2 time(s)"),
            "{:?}",
            c.stale
        );
        assert!(c.tokens_backwards.is_empty(), "client-go has no tokens to judge");
    }

    #[test]
    fn a_new_term_with_a_token_not_above_the_last_goes_backwards() {
        let s = seen(&[
            "1 5 a 10:1 1 1000000000",
            "2 5 b 11:1 1 2000000000",
            "3 4 c 12:1 1 2500000000",
        ]);
        let c = check(&s, &[], S, 3 * S, 3 * S);
        assert_eq!(c.tokens_backwards.len(), 2, "{:?}", c.tokens_backwards);
        assert!(c.stale.is_empty());
    }

    #[test]
    fn two_lines_with_one_number_are_a_lost_update_and_missing_numbers_are_counted() {
        let mut s = seen(&["1 5 a 10:1 1 1000000000", "3 5 a 10:1 3 1200000000"]);
        s.add_version("3 6 b 11:1 1 1300000000");
        let c = check(&s, &[], S, 2 * S, 3 * S);
        assert_eq!(c.unobserved, 1);
        assert_eq!((c.stale.len(), c.stale_writes), (1, 1), "{:?}", c.stale);
        assert!(c.stale[0].starts_with("lost update: write 3"), "{:?}", c.stale);
    }

    #[test]
    fn a_gap_counts_only_from_the_last_healing_and_until_the_next_fault() {
        // Writes at 1 s and 20 s; a fault from 2 s to 15 s.
        let faults = [Window {
            start: 2 * S,
            healed: 15 * S,
        }];
        assert_eq!(unexplained(S, 20 * S, &faults), 5 * S);
        // A second fault from 17 s, still active at 20 s: 2 s unexplained.
        let two = [
            faults[0],
            Window {
                start: 17 * S,
                healed: 30 * S,
            },
        ];
        assert_eq!(unexplained(S, 20 * S, &two), 2 * S);
        // Wholly inside a fault: nothing to explain.
        assert_eq!(unexplained(3 * S, 10 * S, &faults), 0);
        let s = seen(&["1 5 a 10:1 1 1000000000", "2 6 b 11:1 1 20000000000"]);
        let c = check(&s, &faults, S, 20 * S, 3 * S);
        assert_eq!(c.longest_unexplained_gap, 5 * S);
        assert_eq!(c.unbounded_gaps.len(), 1, "{:?}", c.unbounded_gaps);
        let c = check(&s, &faults, S, 20 * S, 6 * S);
        assert!(c.unbounded_gaps.is_empty(), "{:?}", c.unbounded_gaps);
    }

    #[test]
    fn silence_at_the_end_of_the_run_counts() {
        let s = seen(&["1 5 a 10:1 1 1000000000"]);
        let c = check(&s, &[], S, 10 * S, 3 * S);
        assert_eq!(c.unbounded_gaps.len(), 1, "{:?}", c.unbounded_gaps);
        assert!(c.unbounded_gaps[0].contains("at the end of the run"));
    }
}
