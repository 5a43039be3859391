//! The test suites across the modules, beside each module's own `tests`:
//! the runtimes and the shared support of the unit tests, and the
//! regression tests of the schedules that once broke "exactly one leader,
//! never none".
//! <!-- upstream: omit -->
//! And the deterministic simulation (one Lease; elected shards).
//! <!-- upstream: end -->

mod bigstore;
mod client_stack;
mod log_lines;
mod misuse;
mod never_none;
mod regressions;
pub(crate) mod runtime;
pub(crate) mod simulation;
pub(crate) mod support;
