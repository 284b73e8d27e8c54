//! Invariant 2, **consumer fail-closed**: a consumer reads a shard only under the lease it actually
//! holds, and never after it was told to stop.
//!
//! The checker recomputes each consumer process's permission from what its transport handed it
//! (see [`super::grants`]), never from the consumer's own state:
//! - A successful heartbeat response received at `r`, for a heartbeat *sent* at `s`, that lists a
//!   shard in `assigned` grants it until `s + assignment_lease_ms` (of that response, counted on the process's own clock
//!   when a `clock-drift` fault changed its rate) — if the
//!   status is `OK`, or if the shard was already granted and its lease still ran at `r` (the
//!   `REVOKE_PENDING` / `SYNC_METADATA` "keep what you are already reading" rule). Under any other
//!   status a shard the process was not reading is not granted: only `OK` starts a shard.
//! - A successful response that does not list a granted shard withdraws it at `r` (DRAIN, or a
//!   sync that dropped it); `FENCED_MEMBER_EPOCH` / `UNKNOWN_MEMBER` withdraws every shard.
//! - Heartbeat failures (timeouts, 503s, store errors) change nothing: the lease keeps running
//!   out, and a withdrawn shard stays withdrawn (no resume on failure).
//!
//! Each read (XREADGROUP or XAUTOCLAIM the Redis node executed) is judged at the instant the
//! consumer issued it — the instant of its lease check — against the permission at that instant.

use std::collections::BTreeMap;
use std::fmt;

use rsc::core::model::ShardId;
use rsc::core::protocol::HeartbeatStatus;

use super::grants::{Grants, Said};
use super::Facts;
use crate::records::{fmt_us, ProcessId, Us};

/// A violation of invariant 2 (consumer fail-closed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Invariant 2: a read after the lease (send time + assignment lease) had ended.
    ReadAfterLease { process: ProcessId, shard: ShardId, at_us: Us, lease_end_us: Us },
    /// Invariant 2: a read of a shard the process was told to drain or drop, with no new grant.
    ReadAfterRevoke { process: ProcessId, shard: ShardId, at_us: Us, revoked_at_us: Us },
    /// Invariant 2: a read after the process was fenced or declared unknown, with no new grant.
    ReadAfterFence { process: ProcessId, shard: ShardId, at_us: Us, fenced_at_us: Us },
    /// Invariant 2: a read of a shard that was listed only under a non-OK status (only OK starts
    /// a shard).
    StartedWithoutOk { process: ProcessId, shard: ShardId, at_us: Us, status: HeartbeatStatus },
    /// Invariant 2: a read of a shard never granted to this process.
    ReadWithoutGrant { process: ProcessId, shard: ShardId, at_us: Us },
}

impl super::Violation for Violation {
    fn kind(&self) -> &'static str {
        match self {
            Violation::ReadAfterLease { .. } => "read-after-lease",
            Violation::ReadAfterRevoke { .. } => "read-after-revoke",
            Violation::ReadAfterFence { .. } => "read-after-fence",
            Violation::StartedWithoutOk { .. } => "started-without-ok",
            Violation::ReadWithoutGrant { .. } => "read-without-grant",
        }
    }

    fn at_us(&self) -> Us {
        match self {
            Violation::ReadAfterLease { at_us, .. }
            | Violation::ReadAfterRevoke { at_us, .. }
            | Violation::ReadAfterFence { at_us, .. }
            | Violation::StartedWithoutOk { at_us, .. }
            | Violation::ReadWithoutGrant { at_us, .. } => *at_us,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = |us: &Us| format!("{}s", fmt_us(*us).trim());
        match self {
            Violation::ReadAfterLease { process, shard, lease_end_us, .. } => {
                write!(f, "{process} read shard {shard} after its lease ended at {}", t(lease_end_us))
            }
            Violation::ReadAfterRevoke { process, shard, revoked_at_us, .. } => {
                write!(f, "{process} read shard {shard} after being told at {} to stop it", t(revoked_at_us))
            }
            Violation::ReadAfterFence { process, shard, fenced_at_us, .. } => {
                write!(f, "{process} read shard {shard} after being fenced at {}", t(fenced_at_us))
            }
            Violation::StartedWithoutOk { process, shard, status, .. } => {
                write!(f, "{process} started shard {shard} listed only under {status:?}")
            }
            Violation::ReadWithoutGrant { process, shard, .. } => {
                write!(f, "{process} read shard {shard} that was never granted to it")
            }
        }
    }
}

/// Permission of one process on one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Permission {
    Never,
    /// Listed only under a non-OK status while not being read.
    NotStarted(HeartbeatStatus),
    Granted {
        lease_end_us: Us,
    },
    Withdrawn {
        at_us: Us,
        fenced: bool,
    },
}

/// Per shard: the permission and an episode number bumped on every change.
type Permissions = BTreeMap<ShardId, (Permission, u32)>;

fn set(perms: &mut Permissions, shard: ShardId, next: Permission) {
    let entry = perms.entry(shard).or_insert((Permission::Never, 0));
    if entry.0 != next {
        *entry = (next, entry.1 + 1);
    }
}

/// Applies one answer to the permissions of a process. `lease_end` maps a lease length to the true
/// instant it ends when counted from the heartbeat's send time on the process's own clock.
fn apply(perms: &mut Permissions, received_at_us: Us, lease_end: impl Fn(Us) -> Us, said: &Said) {
    match said {
        Said::Granted { status, assigned, lease_us } => {
            let current: Vec<(ShardId, Permission)> = perms.iter().map(|(s, (p, _))| (*s, *p)).collect();
            for (shard, permission) in current {
                if matches!(permission, Permission::Granted { .. }) && !assigned.contains(&shard) {
                    set(perms, shard, Permission::Withdrawn { at_us: received_at_us, fenced: false });
                }
            }
            for &shard in assigned {
                let reading = matches!(
                    perms.get(&shard),
                    Some((Permission::Granted { lease_end_us }, _)) if *lease_end_us >= received_at_us
                );
                if *status == HeartbeatStatus::Ok || reading {
                    set(perms, shard, Permission::Granted { lease_end_us: lease_end(*lease_us) });
                } else if !matches!(perms.get(&shard), Some((Permission::Withdrawn { .. }, _))) {
                    set(perms, shard, Permission::NotStarted(*status));
                }
            }
        }
        Said::Fenced(_) => {
            let granted: Vec<ShardId> =
                perms.iter().filter(|(_, (p, _))| matches!(p, Permission::Granted { .. })).map(|(s, _)| *s).collect();
            for shard in granted {
                set(perms, shard, Permission::Withdrawn { at_us: received_at_us, fenced: true });
            }
        }
    }
}

/// Checks invariant 2 for every consumer process.
pub fn check(facts: &Facts<'_>) -> Vec<Violation> {
    let grants = Grants::from_records(facts.records);
    let mut reads: BTreeMap<ProcessId, Vec<(Us, ShardId)>> = BTreeMap::new();
    for read in &facts.records.reads {
        if let Some(shard) = facts.shard_of(&read.stream) {
            reads.entry(read.process).or_default().push((read.issued_at_us, shard));
        }
    }
    let mut violations = Vec::new();
    for (process, mut list) in reads {
        list.sort_unstable();
        let told = grants.of(process);
        let mut next = 0;
        let mut perms = Permissions::new();
        // Report once per (shard, permission episode), not once per read.
        let mut reported = std::collections::BTreeSet::new();
        for (at_us, shard) in list {
            // An instruction counts from strictly after the instant it was received: a read issued
            // in the same simulated instant ran concurrently with the response's arrival (the
            // response is recorded off the wire, before the consumer processed it), and such
            // events have no order. The split-ownership checker still guards the real property.
            while next < told.len() && told[next].received_at_us < at_us {
                let sent_at_us = told[next].sent_at_us;
                let lease_end = |lease_us| facts.clock_deadline_us(process.node, sent_at_us, lease_us);
                apply(&mut perms, told[next].received_at_us, lease_end, &told[next].what);
                next += 1;
            }
            let (permission, episode) = perms.get(&shard).copied().unwrap_or((Permission::Never, 0));
            let violation = match permission {
                Permission::Granted { lease_end_us } if at_us <= lease_end_us => None,
                Permission::Granted { lease_end_us } => {
                    Some(Violation::ReadAfterLease { process, shard, at_us, lease_end_us })
                }
                Permission::Withdrawn { at_us: when, fenced: false } => {
                    Some(Violation::ReadAfterRevoke { process, shard, at_us, revoked_at_us: when })
                }
                Permission::Withdrawn { at_us: when, fenced: true } => {
                    Some(Violation::ReadAfterFence { process, shard, at_us, fenced_at_us: when })
                }
                Permission::NotStarted(status) => Some(Violation::StartedWithoutOk { process, shard, at_us, status }),
                Permission::Never => Some(Violation::ReadWithoutGrant { process, shard, at_us }),
            };
            if let Some(v) = violation {
                let lease_episode = matches!(v, Violation::ReadAfterLease { .. });
                if reported.insert((shard, episode, lease_episode)) {
                    violations.push(v);
                }
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn reads_inside_the_lease_are_clean_and_the_first_read_after_it_is_reported_once() {
        let mut w = World::new();
        let a = w.consumer(1);
        w.grant(a, 1_000_000, &[0], 8_000); // lease from the send time: until 9.0 s
        w.reads(a, 0, 1_100_000..=9_000_000, 100_000);
        assert_eq!(check(&w.facts()), vec![]);
        w.reads(a, 0, 9_050_000..=9_500_000, 100_000);
        let violations = check(&w.facts());
        assert_eq!(
            violations,
            vec![Violation::ReadAfterLease { process: a, shard: 0, at_us: 9_050_000, lease_end_us: 9_000_000 }]
        );
    }

    #[test]
    fn a_lease_is_counted_on_the_consumers_own_drifting_clock() {
        let mut w = World::new();
        let a = w.consumer(1);
        // From 0.5 s the clock runs 1% slow: 8 s of it from 1 s end at 9.0808... s true time.
        w.clock_rate(a, 500_000, 990_000);
        w.grant(a, 1_000_000, &[0], 8_000);
        w.reads(a, 0, 9_080_000..=9_080_000, 1);
        assert_eq!(check(&w.facts()), vec![], "inside the lease on the consumer's clock");
        // Back to nominal at 5 s: 3.96 s of clock time passed, 4.04 s remain, ending at 9.04 s.
        w.clock_rate(a, 5_000_000, 1_000_000);
        assert!(matches!(check(&w.facts())[..], [Violation::ReadAfterLease { lease_end_us: 9_040_000, .. }]));
    }

    #[test]
    fn the_lease_counts_from_the_send_time_not_the_receive_time() {
        let mut w = World::new();
        let a = w.consumer(1);
        // Sent at 1 s, answered 3 s later: the lease ends at 9 s, not 12 s.
        w.grant_slow(a, 1_000_000, 4_000_000, &[0], 8_000);
        w.reads(a, 0, 10_000_000..=10_000_000, 1);
        assert!(matches!(check(&w.facts())[..], [Violation::ReadAfterLease { lease_end_us: 9_000_000, .. }]));
    }

    #[test]
    fn a_drained_shard_must_not_be_read_again_without_a_new_ok() {
        let mut w = World::new();
        let a = w.consumer(1);
        w.grant(a, 0, &[0, 1], 8_000);
        w.withdraw_to(a, 2_000_000, &[1]); // DRAIN shard 0
        w.reads(a, 1, 2_100_000..=2_100_000, 1);
        w.reads(a, 0, 2_200_000..=2_200_000, 1);
        assert!(matches!(
            check(&w.facts())[..],
            [Violation::ReadAfterRevoke { shard: 0, revoked_at_us: 2_001_000, .. }]
        ));
    }

    #[test]
    fn only_ok_starts_a_shard_but_revoke_pending_keeps_one_being_read() {
        let mut w = World::new();
        let a = w.consumer(1);
        w.grant(a, 0, &[0], 8_000);
        w.answer(a, 2_000_000, HeartbeatStatus::RevokePending, &[0, 1], 8_000);
        w.reads(a, 0, 9_500_000..=9_500_000, 1); // kept and extended to 10 s: clean
        w.reads(a, 1, 3_000_000..=3_000_000, 1); // never started under OK
        assert!(matches!(
            check(&w.facts())[..],
            [Violation::StartedWithoutOk { shard: 1, status: HeartbeatStatus::RevokePending, .. }]
        ));
    }

    #[test]
    fn a_fence_stops_every_shard() {
        let mut w = World::new();
        let a = w.consumer(1);
        w.grant(a, 0, &[0, 1], 8_000);
        w.fence(a, 1_000_000);
        w.reads(a, 1, 1_500_000..=1_500_000, 1);
        assert!(matches!(check(&w.facts())[..], [Violation::ReadAfterFence { shard: 1, .. }]));
    }
}
