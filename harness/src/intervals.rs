//! Leadership intervals from an event log, and the checks on them: no two
//! overlap, every piece of work lies inside one.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Result, bail};
use tokio::time::Instant;

use crate::clock::{fmt_delta, fmt_ms, now_ns};
use crate::events::{Entry, EventLog, Kind, Sig};
use crate::takeovers::check_takeovers;

/// One term of one process: from its `started-leading` to its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    /// The process.
    pub process: String,
    /// Its `started-leading` time.
    pub start: u64,
    /// Its end (see [`leadership_intervals`]).
    pub end: u64,
    /// Whether the process still leads (the end is the time of the check).
    pub open: bool,
    /// How the end was determined.
    pub end_note: String,
}

impl Interval {
    fn describe(&self, base: u64) -> String {
        format!(
            "{} [{} .. {}] ({}{})",
            self.process,
            fmt_delta(base, self.start),
            fmt_delta(base, self.end),
            self.end_note,
            if self.open { ", still open" } else { "" }
        )
    }
}

/// The leadership intervals of every process of `entries`, in log order per
/// process. `now` ends the intervals of processes still leading.
///
/// An interval runs from a `started-leading` line to the process's next
/// `stopped-leading`; without one, to the process's death: the time the test
/// sent SIGKILL, reaped it or saw its stdout close (the earliest), or its last
/// line if later. Two refinements, both of which only shorten an interval to
/// when the process demonstrably could not act any more:
///
/// - **Frozen**: a process `SIGSTOPped` while leading cannot act until SIGCONT.
///   If it prints no `WORK` line stamped after the SIGSTOP before its
///   `stopped-leading`, its interval ends at the SIGSTOP. A `WORK` line after
///   the resume keeps the whole interval, so that acting on a stale term still
///   shows as an overlap.
/// - **client-go release**: `goelect` ([`Flavor::Go`](crate::Flavor::Go)) prints `stopped-leading`
///   after releasing on SIGTERM, but client-go cancels the leading context
///   (ends the leader's work) before it writes the release, so a `SIGTERMed`
///   goelect's interval ends at the SIGTERM.
#[must_use]
pub fn leadership_intervals(entries: &[Entry], now: u64) -> Vec<Interval> {
    let mut order: Vec<&str> = Vec::new();
    let mut by_process: HashMap<&str, Vec<&Entry>> = HashMap::new();
    for e in entries {
        if !by_process.contains_key(e.process.as_str()) {
            order.push(&e.process);
        }
        by_process.entry(&e.process).or_default().push(e);
    }
    let mut out = Vec::new();
    for process in order {
        let own = &by_process[process];
        let flavor_go = own
            .iter()
            .any(|e| e.kind == Kind::Spawned && e.detail.starts_with("Go"));
        let death = own
            .iter()
            .filter(|e| {
                matches!(
                    e.kind,
                    Kind::Signal(Sig::Kill) | Kind::Exited | Kind::StdoutClosed
                )
            })
            .map(|e| e.at)
            .min();
        let last_line = own
            .iter()
            .filter(|e| e.is_own_line())
            .map(|e| e.at)
            .max()
            .unwrap_or(0);
        let mut raw = Vec::new();
        let mut start = None;
        for e in own {
            match e.kind {
                Kind::StartedLeading => start = Some(e.at),
                Kind::StoppedLeading => {
                    if let Some(s) = start.take() {
                        raw.push(Interval {
                            process: process.to_owned(),
                            start: s,
                            end: e.at,
                            open: false,
                            end_note: format!("stopped-leading {}", e.detail),
                        });
                    }
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            let (end, open, note) = match death {
                Some(d) => (d.max(last_line), false, "died while leading".to_owned()),
                None => (now.max(last_line), true, "leading".to_owned()),
            };
            raw.push(Interval {
                process: process.to_owned(),
                start: s,
                end,
                open,
                end_note: note,
            });
        }
        for mut iv in raw {
            refine(&mut iv, own, flavor_go);
            out.push(iv);
        }
    }
    out
}

/// Applies the refinements documented on [`leadership_intervals`].
fn refine(iv: &mut Interval, own: &[&Entry], flavor_go: bool) {
    let (start, end) = (iv.start, iv.end);
    let in_term = move |at: u64| at >= start && at < end;
    if let Some(stop) = own
        .iter()
        .find(|e| e.kind == Kind::Signal(Sig::Stop) && in_term(e.at))
    {
        let worked_after = own
            .iter()
            .any(|e| e.kind == Kind::Work && e.at > stop.at && e.at <= iv.end);
        if !worked_after {
            let resumed = own
                .iter()
                .find(|e| e.kind == Kind::Signal(Sig::Cont) && e.at > stop.at)
                .map_or_else(
                    || "not resumed".to_owned(),
                    |c| format!("resumed {}", fmt_delta(stop.at, c.at)),
                );
            iv.end_note = format!(
                "frozen by SIGSTOP, no WORK after it ({resumed} after the stop; then {})",
                iv.end_note
            );
            iv.end = stop.at;
            iv.open = false;
        }
    }
    if flavor_go
        && let Some(term) = own
            .iter()
            .find(|e| e.kind == Kind::Signal(Sig::Term) && in_term(e.at))
    {
        iv.end_note = format!(
            "client-go leading context cancelled on SIGTERM (then {} at {})",
            iv.end_note,
            fmt_delta(term.at, iv.end)
        );
        iv.end = iv.end.min(term.at);
        iv.open = false;
    }
}

/// Checks that no two intervals overlap: sorted by start, each interval's end
/// is at or before the next one's start.
///
/// # Errors
/// One line per overlap, naming both intervals (times relative to `base`).
pub fn check_no_overlap(intervals: &[Interval], base: u64) -> Result<()> {
    let mut sorted: Vec<&Interval> = intervals.iter().collect();
    sorted.sort_by_key(|iv| (iv.start, iv.end));
    let mut problems = Vec::new();
    let mut latest: Option<&Interval> = None;
    for iv in sorted {
        if let Some(prev) = latest {
            if prev.end > iv.start {
                problems.push(format!(
                    "OVERLAP by {}: {}  and  {}",
                    fmt_ms(prev.end.min(iv.end) - iv.start),
                    prev.describe(base),
                    iv.describe(base)
                ));
            }
            if iv.end > prev.end {
                latest = Some(iv);
            }
        } else {
            latest = Some(iv);
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        bail!("two candidates led at once:\n{}", problems.join("\n"))
    }
}

/// The result of [`check_log`].
#[derive(Clone, Debug)]
pub struct Checked {
    /// The leadership intervals.
    pub intervals: Vec<Interval>,
    /// Remarks of [`check_takeovers`] (client-go takeovers that relied on its
    /// one-second record comparison).
    pub notes: Vec<String>,
}

/// Checks `log` (now): no two leadership intervals overlap
/// ([`check_no_overlap`]), no takeover of an unexpired Lease in the test's
/// own records ([`check_takeovers`]), every `WORK` line lies inside an
/// interval of its own process, and no shard's work of sharded candidates ran
/// in two processes at once ([`check_reconciles`](crate::check_reconciles)).
///
/// # Errors
/// Every violation, with the intervals.
pub fn check_log(log: &EventLog) -> Result<Checked> {
    let entries = log.entries();
    let base = entries.iter().map(|e| e.at).min().unwrap_or(0);
    let intervals = leadership_intervals(&entries, now_ns());
    check_no_overlap(&intervals, base)?;
    let mut notes = check_takeovers(&entries, base)?;
    let stray: Vec<String> = entries
        .iter()
        .filter(|e| e.kind == Kind::Work)
        .filter(|e| {
            !intervals
                .iter()
                .any(|iv| iv.process == e.process && iv.start <= e.at && e.at <= iv.end)
        })
        .map(|e| format!("{} WORK at {}", e.process, fmt_delta(base, e.at)))
        .collect();
    if !stray.is_empty() {
        bail!(
            "WORK outside its process's leadership intervals: {}\nintervals:\n{}",
            stray.join(", "),
            describe_intervals(&intervals, base)
        );
    }
    if entries.iter().any(|e| e.kind == Kind::Reconcile) {
        let r = crate::shards::check_reconciles(&entries)?;
        notes.push(format!(
            "{} reconciles of {} objects, one owner per shard throughout ({} moves between processes)",
            r.reconciles, r.objects, r.moves
        ));
    }
    Ok(Checked { intervals, notes })
}

/// The intervals as text, one per line, times relative to `base`.
#[must_use]
pub fn describe_intervals(intervals: &[Interval], base: u64) -> String {
    intervals
        .iter()
        .map(|iv| iv.describe(base))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until the election has settled among the live processes `live`:
/// exactly one of them leads, and every other one's last `new-leader` line
/// names it. Returns the leader's name.
///
/// # Errors
/// After `timeout`.
pub async fn wait_settled(log: &EventLog, live: &[&str], timeout: Duration) -> Result<String> {
    log.wait_until("exactly one leader, seen by all the others", timeout, |entries| {
        let intervals = leadership_intervals(entries, now_ns());
        let leading: Vec<&Interval> = intervals
            .iter()
            .filter(|iv| iv.open && live.contains(&iv.process.as_str()))
            .collect();
        let [leader] = leading.as_slice() else {
            return None;
        };
        let seen_by_all = live.iter().filter(|p| **p != leader.process).all(|p| {
            entries
                .iter()
                .rev()
                .find(|e| e.process == *p && e.kind == Kind::NewLeader)
                .is_some_and(|e| e.who == leader.process)
        });
        seen_by_all.then(|| leader.process.clone())
    })
    .await
}

/// Waits until each of `observers` has printed a `new-leader` line naming
/// `leader`, stamped at or after `after`.
///
/// # Errors
/// After `timeout` (for all of them together).
pub async fn wait_seen_by(
    log: &EventLog,
    observers: &[&str],
    leader: &str,
    after: u64,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    for observer in observers {
        log.wait_for(
            &format!("{observer} to see {leader} lead"),
            deadline.saturating_duration_since(Instant::now()),
            |e| e.process == *observer && e.kind == Kind::NewLeader && e.who == leader && e.at >= after,
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::parse_line;

    const MS: u64 = 1_000_000;

    fn log_of(lines: &[(&str, &str)]) -> EventLog {
        let log = EventLog::new();
        for (process, line) in lines {
            if let Some(rest) = line.strip_prefix("spawned ") {
                log.record(process, Kind::Spawned, 0, "", rest);
            } else if let Some((sig, at)) = line.strip_prefix("signal ").and_then(|r| r.split_once(' ')) {
                let sig = match sig {
                    "KILL" => Sig::Kill,
                    "TERM" => Sig::Term,
                    "STOP" => Sig::Stop,
                    _ => Sig::Cont,
                };
                log.record(
                    process,
                    Kind::Signal(sig),
                    at.parse::<u64>().unwrap() * MS,
                    "",
                    "",
                );
            } else {
                let (kind, at, who, detail) = parse_line(line).expect("a candidate line");
                log.record(process, kind, at * MS, &who, &detail);
            }
        }
        log
    }

    #[test]
    fn overlap_is_reported_with_both_intervals() {
        let log = log_of(&[
            ("a", "EVENT started-leading 100 a"),
            ("b", "EVENT started-leading 250 b"),
            ("a", "EVENT stopped-leading 300 a RenewDeadlineExceeded"),
        ]);
        let err = check_log(&log).unwrap_err().to_string();
        assert!(err.contains("OVERLAP by 50.000 ms"), "{err}");
        assert!(err.contains("a [") && err.contains("b ["), "{err}");
    }

    #[test]
    fn back_to_back_terms_pass() {
        let log = log_of(&[
            ("a", "EVENT started-leading 100 a"),
            ("a", "WORK 150"),
            ("a", "EVENT stopped-leading 300 a Shutdown"),
            ("b", "EVENT started-leading 300 b"),
            ("b", "signal KILL 400"),
            ("c", "EVENT started-leading 2400 c"),
        ]);
        let intervals = check_log(&log).unwrap().intervals;
        assert_eq!(intervals.len(), 3);
        assert_eq!(intervals[1].end, 400 * MS);
        assert!(intervals[2].open);
    }

    #[test]
    fn a_killed_leader_leads_until_its_kill() {
        let log = log_of(&[
            ("a", "EVENT started-leading 100 a"),
            ("a", "signal KILL 1000"),
            ("b", "EVENT started-leading 900 b"),
        ]);
        assert!(check_log(&log).is_err());
    }

    #[test]
    fn a_frozen_leader_ends_at_the_freeze_unless_it_works_after() {
        let frozen = [
            ("a", "EVENT started-leading 100 a"),
            ("a", "WORK 150"),
            ("a", "signal STOP 200"),
            ("b", "EVENT started-leading 2300 b"),
            ("a", "signal CONT 4200"),
            ("a", "EVENT stopped-leading 4201 a RenewDeadlineExceeded"),
        ];
        let intervals = check_log(&log_of(&frozen)).unwrap().intervals;
        assert_eq!(intervals[0].end, 200 * MS);

        let mut worked = frozen.to_vec();
        worked.insert(5, ("a", "WORK 4200"));
        let err = check_log(&log_of(&worked)).unwrap_err().to_string();
        assert!(err.contains("OVERLAP"), "{err}");
    }

    #[test]
    fn work_outside_a_term_is_reported() {
        let log = log_of(&[
            ("a", "EVENT started-leading 100 a"),
            ("a", "EVENT stopped-leading 200 a Shutdown"),
            ("a", "WORK 250"),
        ]);
        let err = check_log(&log).unwrap_err().to_string();
        assert!(err.contains("WORK outside"), "{err}");
    }

    #[test]
    fn a_sigtermed_goelect_ends_at_the_signal_but_a_rust_candidate_does_not() {
        let lines = |flavor: &'static str| {
            log_of(&[
                ("g", flavor),
                ("g", "EVENT started-leading 100 g"),
                ("g", "signal TERM 500"),
                ("r", "EVENT started-leading 520 r"),
                ("g", "EVENT stopped-leading 530 g"),
            ])
        };
        assert!(check_log(&lines("spawned Go, pid 1")).is_ok());
        assert!(check_log(&lines("spawned Rust, pid 1")).is_err());
    }
}
