//! The crate-wide test suites, beside each module's own `tests`: the
//! runtimes and the shared support of the unit tests, the regression tests of the schedules that
//! once broke "exactly one leader, never none", and the deterministic
//! simulation (one Lease; elected shards).

mod never_none;
mod regressions;
pub(crate) mod runtime;
mod simulation;
pub(crate) mod support;
