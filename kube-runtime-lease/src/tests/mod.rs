//! The crate-wide test suites, beside each module's own `tests`: the shared
//! support of the unit tests, the regression tests of the schedules that
//! once broke "exactly one leader, never none", and the deterministic
//! simulation (one Lease; elected shards).

mod regressions;
mod simulation;
pub(crate) mod support;
