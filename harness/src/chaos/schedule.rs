//! The seeded fault schedule: which fault, where, and for how long.
//!
//! A run is replayed by its seed: the same seed draws the same faults in the
//! same order with the same parameters (what the candidates then do is up to
//! the machine's timing, which is the point of running it).

use std::fmt;
use std::time::Duration;

use crate::timings::Timings;

/// A small seeded generator (`SplitMix64`): the schedule needs
/// reproducibility, not statistical quality.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A duration in `[lo, hi]`, in whole milliseconds.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let (lo_ms, hi_ms) = (lo.as_millis(), hi.as_millis().max(lo.as_millis()));
        let span = u64::try_from(hi_ms - lo_ms).unwrap_or(u64::MAX);
        lo + Duration::from_millis(self.below(span.saturating_add(1)))
    }

    /// `true` with probability `percent` %.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Which candidate a candidate fault hits, in each implementation's group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The one that holds the Lease when the fault begins (else slot 0).
    Leader,
    /// This slot.
    Slot(usize),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Leader => f.write_str("leader"),
            Self::Slot(s) => write!(f, "slot {s}"),
        }
    }
}

/// One fault of the schedule. Each one ends by itself (the "healed" time of
/// the run's record is when it has).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL a candidate; a new one takes its slot after `restart_after`.
    Kill {
        /// Whom.
        target: Target,
        /// The replacement's delay.
        restart_after: Duration,
    },
    /// SIGTERM a candidate (it hands over and exits); a new one takes its
    /// slot after `restart_after`.
    Term {
        /// Whom.
        target: Target,
        /// The replacement's delay.
        restart_after: Duration,
    },
    /// SIGSTOP a candidate for `frozen` (longer than the lease), then SIGCONT.
    Stop {
        /// Whom.
        target: Target,
        /// How long.
        frozen: Duration,
    },
    /// Partition a proxied candidate's path to its apiserver for `lasting`.
    Partition {
        /// Whom (a proxied slot, or the leader if it is proxied).
        target: Target,
        /// Silently (black hole) rather than by refusing connections.
        silent: bool,
        /// How long.
        lasting: Duration,
    },
    /// Delay every chunk on a proxied candidate's path by `latency` for `lasting`.
    Latency {
        /// Whom.
        target: Target,
        /// The added one-way latency.
        latency: Duration,
        /// How long.
        lasting: Duration,
    },
    /// SIGKILL apiserver `index`, start it again after `down`.
    RestartApiserver {
        /// Which.
        index: usize,
        /// How long it stays down.
        down: Duration,
    },
    /// SIGKILL the etcd Raft leader, start it again after `down`.
    KillEtcdLeader {
        /// How long it stays down.
        down: Duration,
    },
    /// Delete each implementation's Lease.
    DeleteLease,
    /// Route the candidates' user to a tiny priority level that rejects
    /// (API Priority and Fairness) and load it for `lasting`: the
    /// candidates' requests are answered 429.
    ApfBurst {
        /// How long.
        lasting: Duration,
    },
}

impl Fault {
    /// A short name (the report counts faults by it).
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Kill { .. } => "sigkill",
            Self::Term { .. } => "sigterm",
            Self::Stop { .. } => "sigstop",
            Self::Partition { .. } => "partition",
            Self::Latency { .. } => "latency",
            Self::RestartApiserver { .. } => "apiserver-restart",
            Self::KillEtcdLeader { .. } => "etcd-leader-kill",
            Self::DeleteLease => "lease-delete",
            Self::ApfBurst { .. } => "apf-429",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: &Duration| d.as_millis();
        match self {
            Self::Kill {
                target,
                restart_after,
            } => {
                write!(f, "SIGKILL {target}, replaced after {} ms", ms(restart_after))
            }
            Self::Term {
                target,
                restart_after,
            } => {
                write!(f, "SIGTERM {target}, replaced after {} ms", ms(restart_after))
            }
            Self::Stop { target, frozen } => write!(f, "SIGSTOP {target} for {} ms", ms(frozen)),
            Self::Partition {
                target,
                silent,
                lasting,
            } => write!(
                f,
                "partition ({}) {target} for {} ms",
                if *silent { "silent" } else { "refused" },
                ms(lasting)
            ),
            Self::Latency {
                target,
                latency,
                lasting,
            } => {
                write!(
                    f,
                    "+{} ms latency on {target} for {} ms",
                    ms(latency),
                    ms(lasting)
                )
            }
            Self::RestartApiserver { index, down } => {
                write!(f, "restart apiserver {index} ({} ms down)", ms(down))
            }
            Self::KillEtcdLeader { down } => write!(f, "SIGKILL the etcd leader ({} ms down)", ms(down)),
            Self::DeleteLease => f.write_str("delete the Lease"),
            Self::ApfBurst { lasting } => write!(f, "APF 429 burst for {} ms", ms(lasting)),
        }
    }
}

/// Draws faults for a run: `slots` candidates per implementation, the
/// last `proxied` of them behind a fault proxy, with `timings`.
#[derive(Clone, Debug)]
pub struct Schedule {
    rng: Rng,
    slots: usize,
    proxied: usize,
    timings: Timings,
}

impl Schedule {
    /// A schedule for `seed`.
    #[must_use]
    pub fn new(seed: u64, slots: usize, proxied: usize, timings: Timings) -> Self {
        Self {
            rng: Rng::new(seed),
            slots,
            proxied: proxied.min(slots),
            timings,
        }
    }

    /// The quiet time before the next fault.
    pub fn quiet(&mut self) -> Duration {
        self.rng
            .between(Duration::from_millis(500), self.timings.lease_duration * 2)
    }

    fn target(&mut self) -> Target {
        if self.rng.chance(60) {
            Target::Leader
        } else {
            Target::Slot(usize::try_from(self.rng.below(self.slots as u64)).unwrap_or(0))
        }
    }

    fn proxied_target(&mut self) -> Target {
        if self.proxied == 0 || self.rng.chance(50) {
            Target::Leader
        } else {
            let first = self.slots - self.proxied;
            Target::Slot(first + usize::try_from(self.rng.below(self.proxied as u64)).unwrap_or(0))
        }
    }

    /// The next fault.
    pub fn next_fault(&mut self) -> Fault {
        let t = self.timings;
        let past_lease = t.lease_duration + t.retry_period;
        match self.rng.below(10) {
            0 => Fault::Kill {
                target: self.target(),
                restart_after: self.rng.between(Duration::ZERO, t.lease_duration),
            },
            1 => Fault::Term {
                target: self.target(),
                restart_after: self.rng.between(Duration::ZERO, t.lease_duration),
            },
            2 | 3 => Fault::Stop {
                target: self.target(),
                frozen: self.rng.between(past_lease, past_lease * 2),
            },
            4 => Fault::Partition {
                target: self.proxied_target(),
                silent: self.rng.chance(50),
                lasting: self.rng.between(t.retry_period, t.lease_duration * 2),
            },
            5 => Fault::Latency {
                target: self.proxied_target(),
                latency: self.rng.between(Duration::from_millis(50), t.renew_deadline),
                lasting: self.rng.between(t.lease_duration, t.lease_duration * 3),
            },
            6 => Fault::RestartApiserver {
                index: usize::try_from(self.rng.below(2)).unwrap_or(0),
                down: self.rng.between(Duration::ZERO, t.lease_duration),
            },
            7 => Fault::KillEtcdLeader {
                down: self.rng.between(Duration::ZERO, t.lease_duration),
            },
            8 => Fault::DeleteLease,
            _ => Fault::ApfBurst {
                lasting: self.rng.between(t.renew_deadline, t.lease_duration * 3),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_schedule_and_another_seed_does_not() {
        let draw = |seed| {
            let mut s = Schedule::new(seed, 4, 2, Timings::FAST);
            (0..50).map(|_| (s.next_fault(), s.quiet())).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn every_kind_of_fault_is_drawn_and_parameters_stay_in_range() {
        let t = Timings::FAST;
        let mut s = Schedule::new(1, 4, 2, t);
        let mut names = std::collections::BTreeSet::new();
        for _ in 0..500 {
            let fault = s.next_fault();
            names.insert(fault.name());
            match fault {
                Fault::Stop { frozen, .. } => assert!(frozen > t.lease_duration, "{frozen:?}"),
                Fault::Partition {
                    target: Target::Slot(k),
                    ..
                }
                | Fault::Latency {
                    target: Target::Slot(k),
                    ..
                } => {
                    assert!(
                        (2..4).contains(&k),
                        "network faults hit proxied slots only, got {k}"
                    );
                }
                Fault::Kill {
                    target: Target::Slot(k),
                    ..
                } => assert!(k < 4),
                _ => {}
            }
            assert!(s.quiet() <= t.lease_duration * 2);
        }
        assert_eq!(names.len(), 9, "{names:?}");
    }
}
