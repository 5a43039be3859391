//! [`Runs`]: repeated runs of one scenario, counted and checked.

use anyhow::{Result, bail};
use tokio::time::Instant;

use crate::events::EventLog;
use crate::intervals::check_log;

/// Runs of one scenario: prints each run's outcome, counts them, and fails at
/// the end if any run failed.
#[derive(Debug)]
pub struct Runs {
    scenario: String,
    total: usize,
    failures: Vec<String>,
    started: Instant,
}

impl Runs {
    /// Starts counting runs of `scenario`.
    #[must_use]
    pub fn new(scenario: &str) -> Self {
        println!("== {scenario}");
        Self {
            scenario: scenario.to_owned(),
            total: 0,
            failures: Vec::new(),
            started: Instant::now(),
        }
    }

    /// Records run `run`: its result (a summary of its measurements) and the
    /// check of its log by [`check_log`], which applies to every run, failed
    /// or not. On failure the whole log is printed; with `KRL_FAILOVER_VERBOSE`
    /// set, the logs of passing runs too.
    pub fn record(&mut self, run: usize, result: Result<String>, log: &EventLog) {
        self.total += 1;
        let checked = check_log(log);
        let failure = match (&result, &checked) {
            (Ok(_), Ok(_)) => None,
            (Err(e), Ok(_)) => Some(format!("{e:#}")),
            (Ok(_), Err(c)) => Some(format!("{c:#}")),
            (Err(e), Err(c)) => Some(format!("{e:#}\nand: {c:#}")),
        };
        match (failure, result) {
            (None, Ok(summary)) => {
                println!("[{} #{run}] ok: {summary}", self.scenario);
                for note in checked.iter().flat_map(|c| &c.notes) {
                    println!("[{} #{run}] note: {note}", self.scenario);
                }
                if std::env::var_os("KRL_FAILOVER_VERBOSE").is_some() {
                    println!("--- log of the run ---\n{}--- end ---", log.dump());
                }
            }
            (failure, _) => {
                let f = failure.unwrap_or_default();
                println!(
                    "[{} #{run}] FAILED: {f}\n--- event log of the run ---\n{}--- end of log ---",
                    self.scenario,
                    log.dump()
                );
                self.failures.push(format!("run #{run}: {f}"));
            }
        }
    }

    /// Prints the count of runs that passed.
    ///
    /// # Errors
    /// When any run failed: every failure.
    pub fn finish(self) -> Result<()> {
        let passed = self.total - self.failures.len();
        println!(
            "== {}: {passed}/{} runs passed ({:.1} s)",
            self.scenario,
            self.total,
            self.started.elapsed().as_secs_f64()
        );
        if self.failures.is_empty() {
            Ok(())
        } else {
            bail!(
                "{}: {} of {} runs failed:\n{}",
                self.scenario,
                self.failures.len(),
                self.total,
                self.failures.join("\n")
            )
        }
    }
}
