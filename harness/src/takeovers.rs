//! The check that nobody took a Lease before it expired, from the test's own
//! records of it ([`LeaseRecorder`](crate::LeaseRecorder)).

use std::time::Duration;

use anyhow::{Result, bail};

use crate::clock::{fmt_delta, fmt_ms, ns};
use crate::events::{Entry, Kind};

/// How much earlier than the protocol allows a takeover may *appear* in the
/// records of a [`LeaseRecorder`](crate::LeaseRecorder): the test sees each write a little after it
/// happened, the old holder's last renewal possibly later than the takeover.
pub const RECORD_SLACK: Duration = Duration::from_millis(100);

/// A field `name=value` of a record's `detail`.
fn record_field<'a>(record: &'a Entry, name: &str) -> &'a str {
    record
        .detail
        .split_whitespace()
        .find_map(|f| f.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        .unwrap_or("")
}

/// A record as client-go compares records: its `LeaderElectionRecord` as
/// JSON, in which times are `metav1.Time`, with whole seconds (RFC 3339).
fn client_go_view(record: &Entry) -> String {
    let seconds = |t: &str| t.split('.').next().unwrap_or("").trim_end_matches('Z').to_owned();
    format!(
        "{}|{}|{}|{}|{}",
        record.who,
        record_field(record, "duration"),
        record_field(record, "transitions"),
        seconds(record_field(record, "acquire")),
        seconds(record_field(record, "renew"))
    )
}

/// Checks the Lease records of `entries` ([`Kind::Record`]): whenever the
/// holder changes from one candidate to another without a release in
/// between, the takeover was seen no earlier than the old holder's record
/// duration after its last renewal was seen (less [`RECORD_SLACK`]). That is,
/// nobody took a Lease before it expired.
///
/// For a client-go taker ([`Flavor::Go`](crate::Flavor::Go)), "its last renewal" is what
/// client-go can see: it notices a change of the record only when the record
/// differs with its times cut to whole seconds (it compares the JSON of a
/// `LeaderElectionRecord`, whose times are `metav1.Time`), so renewals within
/// the same wall-clock second as the previous version do not restart its
/// clock. Such takeovers pass, and are described in the returned notes.
///
/// # Errors
/// One line per early takeover (times relative to `base`).
pub fn check_takeovers(entries: &[Entry], base: u64) -> Result<Vec<String>> {
    let is_go = |name: &str| {
        entries
            .iter()
            .any(|e| e.kind == Kind::Spawned && e.process == name && e.detail.starts_with("Go"))
    };
    let records: Vec<&Entry> = entries.iter().filter(|e| e.kind == Kind::Record).collect();
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    for (i, r) in records.iter().enumerate() {
        // The previous record: a takeover is a change between two holders.
        let Some(prev) = i.checked_sub(1).map(|j| records[j]) else {
            continue;
        };
        if r.who.is_empty() || prev.who.is_empty() || prev.who == r.who {
            continue;
        }
        // The old holder's last renewal as the taker could see it: client-go
        // sees the first of a run of versions that look alike to it.
        let mut seen = prev;
        if is_go(&r.who) {
            let view = client_go_view(prev);
            for earlier in records[..i].iter().rev() {
                if client_go_view(earlier) != view {
                    break;
                }
                seen = earlier;
            }
        }
        let seconds: u64 = record_field(prev, "duration").parse().unwrap_or(0);
        let lease = ns(Duration::from_secs(seconds));
        let allowed = seen.at + lease.saturating_sub(ns(RECORD_SLACK));
        if r.at < allowed {
            problems.push(format!(
                "{} took the lease from {} {} after {}'s last renewal was seen ({}), before its {seconds} s lease duration expired ({} {} -> {})",
                r.who,
                prev.who,
                fmt_ms(r.at.saturating_sub(seen.at)),
                prev.who,
                fmt_delta(base, seen.at),
                fmt_delta(base, r.at),
                seen.detail,
                r.detail
            ));
        } else if r.at < prev.at + lease.saturating_sub(ns(RECORD_SLACK)) {
            notes.push(format!(
                "client-go candidate {} took the lease {} after {}'s last renewal: that renewal fell in the same second as the version before it ({} earlier), which client-go's one-second record comparison cannot tell apart",
                r.who,
                fmt_ms(r.at.saturating_sub(prev.at)),
                prev.who,
                fmt_ms(prev.at - seen.at)
            ));
        }
    }
    if problems.is_empty() {
        Ok(notes)
    } else {
        bail!("a lease was taken before it expired:\n{}", problems.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventLog;
    use crate::intervals::check_log;

    const MS: u64 = 1_000_000;

    #[test]
    fn takeovers_of_unexpired_leases_are_reported() {
        let record = |log: &EventLog, at: u64, who: &str, rv: u32, renew: &str| {
            log.record(
                "lease",
                Kind::Record,
                at * MS,
                who,
                &format!("duration=2 transitions=0 rv={rv} acquire=2026-01-01T00:00:10.1Z renew=2026-01-01T00:00:{renew}Z"),
            );
        };
        // a renews at 0 and 500; b takes over at 2450 (in time, within the
        // slack) after a's last renewal; c after a release at once.
        let log = EventLog::new();
        record(&log, 0, "a", 1, "10.1");
        record(&log, 500, "a", 2, "10.6");
        record(&log, 2450, "b", 3, "12.5");
        record(&log, 2600, "", 4, "12.7");
        record(&log, 2610, "c", 5, "12.7");
        assert!(check_log(&log).is_ok());
        // b takes over 1.5 s after a's last renewal.
        let log = EventLog::new();
        record(&log, 0, "a", 1, "10.1");
        record(&log, 500, "a", 2, "10.6");
        record(&log, 2000, "b", 3, "12.1");
        let err = check_log(&log).unwrap_err().to_string();
        assert!(err.contains("b took the lease from a 1500.000 ms"), "{err}");
        // A client-go taker cannot see a renewal in the same second as the
        // version before it: allowed, with a note; not across seconds.
        let go = |second_renewal: &str| {
            let log = EventLog::new();
            log.record("g", Kind::Spawned, 0, "", "Go, pid 1");
            record(&log, 0, "a", 1, "10.1");
            record(&log, 500, "a", 2, second_renewal);
            record(&log, 2100, "g", 3, "12.2");
            check_log(&log)
        };
        let notes = go("10.6").unwrap().notes;
        assert!(notes[0].contains("same second"), "{notes:?}");
        assert!(go("11.0").is_err());
    }
}
