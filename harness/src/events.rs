//! The event log: every line the candidates print (parsed) and everything the
//! test does, in one order, stamped with one clock; and waiting on it.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Result, bail};
use rustix::process::Signal;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::{fmt_delta, now_ns};

/// A signal the test sends to a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sig {
    /// SIGKILL: dies at once.
    Kill,
    /// SIGTERM: hands over and exits.
    Term,
    /// SIGSTOP: frozen.
    Stop,
    /// SIGCONT: resumed.
    Cont,
    /// SIGUSR1: the sharded candidate reconciles every object again.
    Usr1,
}

impl Sig {
    pub(crate) fn signal(self) -> Signal {
        match self {
            Sig::Kill => Signal::KILL,
            Sig::Term => Signal::TERM,
            Sig::Stop => Signal::STOP,
            Sig::Cont => Signal::CONT,
            Sig::Usr1 => Signal::USR1,
        }
    }
}

/// Which implementation a candidate process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// The Rust `candidate` binary (this crate's library).
    Rust,
    /// client-go's `goelect`. It prints `stopped-leading` only after its
    /// release on SIGTERM (client-go calls `OnStoppedLeading` when `Run`
    /// returns), although it cancels the leading context before releasing:
    /// see [`leadership_intervals`](crate::leadership_intervals).
    Go,
}

/// What an [`Entry`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The test spawned the process (`detail` is its [`Flavor`]).
    Spawned,
    /// `READY`: the candidate runs.
    Ready,
    /// `EVENT started-leading`.
    StartedLeading,
    /// `EVENT stopped-leading` (`detail` holds the reason, if printed).
    StoppedLeading,
    /// `EVENT new-leader` (`who` is the holder it observed, `""` when free).
    NewLeader,
    /// `WORK`: one piece of guarded work.
    Work,
    /// `EXIT`: the Rust candidate is about to exit.
    Exit,
    /// `SYNCED`: a Controller candidate's store holds its initial listing
    /// (`who` is the number of objects in it).
    Synced,
    /// `SHARDS`: the shards a sharded candidate holds now (`who` is its
    /// identity, `detail` the list: see [`shards`](crate::shards)).
    Shards,
    /// `RECONCILE`: one reconcile of a sharded candidate, stamped with its
    /// start (`who` is the object, `detail` `<end> <shard> <token>`: see
    /// [`shards`](crate::shards)).
    Reconcile,
    /// `LEDGER`: what a chaos-run candidate's write to the ledger did (`who`
    /// is the outcome: `written`, `term-ended`, `fenced`, `conflict` or
    /// `error`; `detail` the rest: see [`chaos`](crate::chaos)).
    Ledger,
    /// The test sent this signal (stamped after sending, except SIGCONT:
    /// before sending).
    Signal(Sig),
    /// The test reaped the process (`detail` is the exit status).
    Exited,
    /// The process's stdout reached EOF (it exited, or at least closed it).
    StdoutClosed,
    /// A line of stderr (stamped when the test read it).
    Stderr,
    /// A note by the test.
    Note,
    /// A new version of the Lease, seen by the test's own watch
    /// ([`LeaseRecorder`](crate::LeaseRecorder)): `who` is the holder (`""` when free), `detail`
    /// `duration=<s> transitions=<n> rv=<resourceVersion> acquire=<RFC 3339>
    /// renew=<RFC 3339>`.
    Record,
    /// A stdout line that is none of the above.
    Other,
}

/// One record of the [`EventLog`].
#[derive(Clone, Debug)]
pub struct Entry {
    /// Position in the log.
    pub seq: usize,
    /// The process it is about.
    pub process: String,
    /// What happened.
    pub kind: Kind,
    /// When (`CLOCK_MONOTONIC` ns): printed by the process for its own lines,
    /// taken by the test for the rest.
    pub at: u64,
    /// The identity named by the line (the leader for `new-leader`), or `""`.
    pub who: String,
    /// The rest: a stop reason, a signal, an exit status, a raw line.
    pub detail: String,
}

impl Entry {
    /// Whether this is a line the process printed on stdout itself.
    #[must_use]
    pub fn is_own_line(&self) -> bool {
        matches!(
            self.kind,
            Kind::Ready
                | Kind::StartedLeading
                | Kind::StoppedLeading
                | Kind::NewLeader
                | Kind::Work
                | Kind::Exit
                | Kind::Synced
                | Kind::Shards
                | Kind::Reconcile
                | Kind::Ledger
                | Kind::Other
        )
    }
}

/// Parses a candidate's stdout line into `(kind, at, who, detail)`.
///
/// Knows both formats: the Rust candidate's (`READY <ns> <id>`, `EVENT <kind>
/// <ns> <id> [reason]`, `WORK <ns>`, `EXIT <ns>`) and goelect's (`READY <ns>`,
/// `EVENT <kind> <ns> <id>`, the identity possibly empty).
#[must_use]
pub fn parse_line(line: &str) -> Option<(Kind, u64, String, String)> {
    let mut parts = line.split_whitespace();
    let head = parts.next()?;
    let (kind, at) = match head {
        "READY" => (Kind::Ready, parts.next()?.parse().ok()?),
        "WORK" => (Kind::Work, parts.next()?.parse().ok()?),
        "EXIT" => (Kind::Exit, parts.next()?.parse().ok()?),
        "SYNCED" => (Kind::Synced, parts.next()?.parse().ok()?),
        "SHARDS" => (Kind::Shards, parts.next()?.parse().ok()?),
        "RECONCILE" => (Kind::Reconcile, parts.next()?.parse().ok()?),
        "LEDGER" => (Kind::Ledger, parts.next()?.parse().ok()?),
        "EVENT" => {
            let kind = match parts.next()? {
                "started-leading" => Kind::StartedLeading,
                "stopped-leading" => Kind::StoppedLeading,
                "new-leader" => Kind::NewLeader,
                _ => return None,
            };
            (kind, parts.next()?.parse().ok()?)
        }
        _ => return None,
    };
    let who = parts.next().unwrap_or("").to_owned();
    let detail = parts.collect::<Vec<_>>().join(" ");
    Some((kind, at, who, detail))
}

struct LogInner {
    entries: Mutex<Vec<Entry>>,
    changed: watch::Sender<usize>,
}

/// The shared, append-only log of everything candidates print and the test
/// does, with waiting on conditions.
#[derive(Clone)]
pub struct EventLog {
    inner: Arc<LogInner>,
}

impl Default for EventLog {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog")
            .field("entries", &self.lock().len())
            .finish()
    }
}

impl EventLog {
    /// An empty log.
    #[must_use]
    pub fn new() -> Self {
        Self {
            inner: Arc::new(LogInner {
                entries: Mutex::new(Vec::new()),
                changed: watch::Sender::new(0),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Entry>> {
        self.inner
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends an entry; returns its `at`.
    #[allow(
        clippy::must_use_candidate,
        reason = "called for its effect; the value is for the callers that want it"
    )]
    pub fn record(&self, process: &str, kind: Kind, at: u64, who: &str, detail: &str) -> u64 {
        let len = {
            let mut entries = self.lock();
            let seq = entries.len();
            entries.push(Entry {
                seq,
                process: process.to_owned(),
                kind,
                at,
                who: who.to_owned(),
                detail: detail.to_owned(),
            });
            entries.len()
        };
        self.inner.changed.send_replace(len);
        at
    }

    /// Appends a note by the test, stamped now; returns the stamp.
    #[allow(
        clippy::must_use_candidate,
        reason = "called for its effect; the value is for the callers that want it"
    )]
    pub fn note(&self, text: &str) -> u64 {
        self.record("test", Kind::Note, now_ns(), "", text)
    }

    /// A copy of every entry so far.
    #[must_use]
    pub fn entries(&self) -> Vec<Entry> {
        self.lock().clone()
    }

    /// The first entry (in log order) matching `pred`, if any yet.
    pub fn find(&self, mut pred: impl FnMut(&Entry) -> bool) -> Option<Entry> {
        self.lock().iter().find(|e| pred(e)).cloned()
    }

    /// Every entry matching `pred`.
    pub fn filter(&self, mut pred: impl FnMut(&Entry) -> bool) -> Vec<Entry> {
        self.lock().iter().filter(|e| pred(e)).cloned().collect()
    }

    /// Waits until an entry matches `pred` (checking those already there
    /// first) and returns the first that does.
    ///
    /// # Errors
    /// After `timeout`, with `what` and the whole log in the message.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&Entry) -> bool,
    ) -> Result<Entry> {
        let mut rx = self.inner.changed.subscribe();
        let deadline = Instant::now() + timeout;
        let mut checked = 0;
        loop {
            rx.borrow_and_update();
            {
                let entries = self.lock();
                if let Some(e) = entries[checked..].iter().find(|e| pred(e)) {
                    return Ok(e.clone());
                }
                checked = entries.len();
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
    }

    /// Waits until `check`, given every entry so far, returns `Some` (checked
    /// at once, then on every new entry) and returns its value.
    ///
    /// # Errors
    /// After `timeout`, with `what` in the message.
    pub async fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&[Entry]) -> Option<T>,
    ) -> Result<T> {
        let mut rx = self.inner.changed.subscribe();
        let deadline = Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            if let Some(found) = check(&self.lock()) {
                return Ok(found);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
    }

    /// Waits for the first `started-leading` stamped after `after` by any
    /// process but `not`.
    ///
    /// # Errors
    /// After `timeout`.
    pub async fn next_leader(&self, after: u64, not: &str, timeout: Duration) -> Result<Entry> {
        self.wait_for(
            &format!("someone other than {not} to start leading"),
            timeout,
            |e| e.kind == Kind::StartedLeading && e.at > after && e.process != not,
        )
        .await
    }

    /// Waits for `process`'s first `stopped-leading` stamped after `after`.
    ///
    /// # Errors
    /// After `timeout`.
    pub async fn stopped_leading(&self, process: &str, after: u64, timeout: Duration) -> Result<Entry> {
        self.wait_for(&format!("{process} to stop leading"), timeout, |e| {
            e.kind == Kind::StoppedLeading && e.process == process && e.at > after
        })
        .await
    }

    /// The flavor `process` was spawned with, if it was.
    #[must_use]
    pub fn flavor_of(&self, process: &str) -> Option<Flavor> {
        self.lock()
            .iter()
            .find(|e| e.kind == Kind::Spawned && e.process == process)
            .map(|e| {
                if e.detail.starts_with("Go") {
                    Flavor::Go
                } else {
                    Flavor::Rust
                }
            })
    }

    /// The time the test's watch saw `holder`'s last write to the Lease
    /// before `before` ([`Kind::Record`] entries), if any.
    #[must_use]
    pub fn last_write_seen(&self, holder: &str, before: u64) -> Option<u64> {
        self.lock()
            .iter()
            .filter(|e| e.kind == Kind::Record && e.who == holder && e.at < before)
            .map(|e| e.at)
            .max()
    }

    /// The log as text, times relative to its first entry, runs of `WORK`
    /// lines of one process folded into one line.
    #[must_use]
    pub fn dump(&self) -> String {
        let entries = self.entries();
        let base = entries.iter().map(|e| e.at).min().unwrap_or(0);
        let mut out = String::new();
        let mut i = 0;
        while i < entries.len() {
            let e = &entries[i];
            if matches!(e.kind, Kind::Work | Kind::Reconcile | Kind::Ledger) {
                // Fold this process's consecutive WORK (or RECONCILE) lines
                // (others' lines in between end the run).
                let mut j = i;
                while j + 1 < entries.len()
                    && entries[j + 1].kind == e.kind
                    && entries[j + 1].process == e.process
                {
                    j += 1;
                }
                let _ = writeln!(
                    out,
                    "{:>14}  {:<10} {} x{} (last at {})",
                    fmt_delta(base, e.at),
                    e.process,
                    match e.kind {
                        Kind::Work => "WORK",
                        Kind::Ledger => "LEDGER",
                        _ => "RECONCILE",
                    },
                    j - i + 1,
                    fmt_delta(base, entries[j].at)
                );
                i = j + 1;
                continue;
            }
            let what = match e.kind {
                Kind::Signal(s) => format!("<test sent {s:?}>"),
                Kind::Exited => format!("<reaped: {}>", e.detail),
                Kind::StdoutClosed => "<stdout closed>".to_owned(),
                Kind::Spawned => format!("<spawned, {}>", e.detail),
                Kind::Stderr => format!("stderr: {}", e.detail),
                Kind::Note => format!("NOTE {}", e.detail),
                Kind::Record => format!("RECORD holder={:?} {}", e.who, e.detail),
                Kind::Other => format!("? {}", e.detail),
                k => format!("{k:?} {} {}", e.who, e.detail),
            };
            let _ = writeln!(out, "{:>14}  {:<10} {what}", fmt_delta(base, e.at), e.process);
            i += 1;
        }
        out
    }

    /// The log as text without stderr lines (see [`EventLog::dump`]).
    #[must_use]
    pub fn dump_events(&self) -> String {
        self.dump()
            .lines()
            .filter(|l| !l.contains(" stderr: "))
            .fold(String::new(), |mut s, l| {
                s.push_str(l);
                s.push('\n');
                s
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_formats() {
        assert_eq!(
            parse_line("EVENT stopped-leading 12 a TakenOver { holder: \"b\" }"),
            Some((
                Kind::StoppedLeading,
                12,
                "a".to_owned(),
                "TakenOver { holder: \"b\" }".to_owned()
            ))
        );
        assert_eq!(
            parse_line("EVENT new-leader 7 "),
            Some((Kind::NewLeader, 7, String::new(), String::new()))
        );
        assert_eq!(
            parse_line("READY 5"),
            Some((Kind::Ready, 5, String::new(), String::new()))
        );
        assert_eq!(
            parse_line("SYNCED 9 5000"),
            Some((Kind::Synced, 9, "5000".to_owned(), String::new()))
        );
        assert_eq!(
            parse_line("SHARDS 4 a 0,3"),
            Some((Kind::Shards, 4, "a".to_owned(), "0,3".to_owned()))
        );
        assert_eq!(
            parse_line("RECONCILE 10 cm-1 20 3 7"),
            Some((Kind::Reconcile, 10, "cm-1".to_owned(), "20 3 7".to_owned()))
        );
        assert_eq!(parse_line("WORK x"), None);
    }

    #[tokio::test]
    async fn wait_for_sees_later_entries_and_times_out() {
        let log = EventLog::new();
        let l = log.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            l.record("a", Kind::StartedLeading, 5, "a", "");
        });
        let e = log
            .wait_for("a leads", Duration::from_secs(5), |e| {
                e.kind == Kind::StartedLeading
            })
            .await
            .unwrap();
        assert_eq!(e.process, "a");
        assert!(
            log.wait_for("never", Duration::from_millis(20), |_| false)
                .await
                .is_err()
        );
    }
}
