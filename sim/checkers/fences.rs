//! Fencing at the resource (DESIGN §10), judged from ground truth: every read, claim and ack that
//! *succeeded at Redis* on a shard of a group with fencing on must have presented the fence of
//! that shard's latest grant recorded in the store at that instant. No exemption for pauses, clock
//! faults or calls that timed out client-side and ran later: that is the point of fencing.
//!
//! Ground truth, not the fake's fence key: the store's execution logs (which fence each call
//! presented, and after which metadata change it ran: `history_len`) against the store's metadata
//! history. "Latest grant" of a shard at an instant: the fence recorded in the shard's entry of the
//! group's state then (owned, revoking or fenced), or, for a shard with no entry, the fence of its
//! last entry in that timeline (a record deleted, corrupted or recreated empty grants nothing
//! newer: the last recorded grant stays the latest).
//!
//! What no protocol prevents is measured, not failed: a call presenting a fence that was recorded
//! only in writes the store later lost (a rollback undid them, or an acknowledged write was
//! dropped) — its grant was answered, then forgotten. Those are counted as stale successes after
//! loss, but only until a grant of the shard with a counter at least the presented one's is
//! recorded with no loss since: that grant's fence was raised in the key before it was recorded
//! (DESIGN §10) and nothing has lowered the key since, so the rule refuses the lost fence from
//! then on (same counter, another nonce: exactly the case the nonce exists for). Refusals
//! (`FENCED`) are counted too: each is a stale operation the fence stopped.
//!
//! This leans on the fake keeping fence keys and metadata in one journal, so a rollback that
//! undoes a grant undoes its raise too and never a raise alone. On a Redis Cluster they are on
//! different nodes and can roll back apart (DESIGN §10): the simulation does not model that.
//!
//! A split brain's old primary is judged the same way against its own history and logs. A call on
//! one side presenting a fence only the other side recorded after the failover (a grant of the
//! other timeline, which a higher counter lets through) is counted too, until that split brain's
//! damage window closes ([`super::SplitBrain::damage_until_us`]); after it, it is a violation.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use rsc::core::model::{Fence, GroupMetadata, ShardId, ShardOwner};
use rsc::store::memory::{AckRecord, HistoryEvent, HistoryKind, IdentityCause, ReadRecord, ReadSource};

use super::{Facts, Violation};
use crate::records::{fmt_us, Us};

/// A violated fencing invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceViolation {
    /// A call presented a fence other than the shard's latest recorded grant's, and Redis ran it.
    StaleFenceSucceeded {
        at_us: Us,
        op: &'static str,
        consumer: String,
        shard: ShardId,
        presented: Fence,
        latest: Option<Fence>,
    },
    /// A call presented no fence on a shard whose grant is fenced, and Redis ran it.
    UnfencedOperation { at_us: Us, op: &'static str, consumer: String, shard: ShardId, latest: Fence },
}

impl Violation for FenceViolation {
    fn kind(&self) -> &'static str {
        match self {
            FenceViolation::StaleFenceSucceeded { .. } => "stale-fence-succeeded",
            FenceViolation::UnfencedOperation { .. } => "unfenced-operation",
        }
    }

    fn at_us(&self) -> Us {
        match self {
            FenceViolation::StaleFenceSucceeded { at_us, .. } | FenceViolation::UnfencedOperation { at_us, .. } => {
                *at_us
            }
        }
    }
}

impl fmt::Display for FenceViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceViolation::StaleFenceSucceeded { at_us, op, consumer, shard, presented, latest } => {
                let latest = latest.map_or_else(|| "none".to_string(), |l| l.to_string());
                write!(
                    f,
                    "{op} by {consumer} on shard {shard} at {}s ran at Redis with fence {presented}, but the shard's \
                     latest recorded grant has fence {latest}",
                    fmt_us(*at_us).trim()
                )
            }
            FenceViolation::UnfencedOperation { at_us, op, consumer, shard, latest } => write!(
                f,
                "{op} by {consumer} on shard {shard} at {}s ran at Redis without a fence, but the shard's grant is \
                 fenced ({latest})",
                fmt_us(*at_us).trim()
            ),
        }
    }
}

/// What fencing did in one run (measured).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FenceCounts {
    /// Operations Redis refused as `FENCED`.
    pub refused: u64,
    /// Operations that presented the fence of a grant the store later lost, and ran (no protocol
    /// prevents these; DESIGN §7).
    pub stale_after_loss: usize,
    /// Fenced operations that ran (the denominator).
    pub fenced_ok: usize,
    /// Operations that ran presenting a fence only the other side of a split brain recorded.
    pub stale_across_split_brain: usize,
}

/// One Redis node's execution logs and the metadata history they refer to.
struct Log<'a> {
    history: &'a [HistoryEvent],
    reads: &'a [ReadRecord],
    acks: &'a [AckRecord],
    refusals: u64,
}

/// Fences only one side of a split brain recorded, and until when a call presenting one of them
/// on the other side is measured rather than failed.
type Foreign = Vec<(BTreeSet<Fence>, Us)>;

/// The group's fencing state after one metadata change.
#[derive(Clone, Debug, Default)]
struct Snapshot {
    fencing: bool,
    /// The latest grant's fence per shard, in this timeline.
    latest: BTreeMap<ShardId, Fence>,
    /// Per shard, the largest counter of a grant recorded since the last change that can lower
    /// fence keys (a rollback, a restart empty): the key holds at least this.
    floor: BTreeMap<ShardId, u64>,
}

/// One operation that ran at Redis.
struct Op<'a> {
    op: &'static str,
    consumer: &'a str,
    stream: &'a str,
    at_ms: u64,
    history_len: usize,
    fence: Option<Fence>,
}

pub fn check(facts: &Facts<'_>) -> (Vec<FenceViolation>, FenceCounts) {
    let lease_us = facts.assignment_lease_us();
    let after_fork = |history: &[HistoryEvent], fork_len: usize| {
        Timeline::build(facts, history.get(fork_len..).unwrap_or(&[])).recorded
    };
    let old_timelines: Foreign = facts
        .split_brains
        .iter()
        .map(|split| (after_fork(&split.history, split.fork_len), split.damage_until_us(lease_us)))
        .collect();
    let mut counts = FenceCounts::default();
    let primary = Log {
        history: facts.history,
        reads: facts.store_reads,
        acks: facts.store_acks,
        refusals: facts.fence_refusals,
    };
    let mut violations = check_log(facts, &primary, &old_timelines, &mut counts);
    for split in facts.split_brains {
        let primary_timeline = vec![(after_fork(facts.history, split.fork_len), split.damage_until_us(lease_us))];
        let old = Log {
            history: &split.history,
            reads: &split.store_reads,
            acks: &split.store_acks,
            refusals: split.fence_refusals,
        };
        violations.extend(check_log(facts, &old, &primary_timeline, &mut counts));
    }
    (violations, counts)
}

/// Judges one Redis node's operations against its own history; `foreign` are the other side's
/// fences of a split brain.
fn check_log(facts: &Facts<'_>, log: &Log<'_>, foreign: &Foreign, counts: &mut FenceCounts) -> Vec<FenceViolation> {
    let (reads, acks) = (log.reads, log.acks);
    let timeline = Timeline::build(facts, log.history);
    counts.refused += log.refusals;
    let mut violations = Vec::new();
    let ops = reads
        .iter()
        .filter(|r| r.error.is_none() && r.group == facts.group.consumer_group)
        .map(|r| Op {
            op: match r.from {
                ReadSource::Claim { .. } => "XAUTOCLAIM",
                _ => "XREADGROUP",
            },
            consumer: &r.consumer,
            stream: &r.stream,
            at_ms: r.at_ms,
            history_len: r.history_len,
            fence: r.fence,
        })
        .chain(acks.iter().filter(|a| a.group == facts.group.consumer_group).map(|a| Op {
            op: "XACK",
            consumer: "(ack)",
            stream: &a.stream,
            at_ms: a.at_ms,
            history_len: a.history_len,
            fence: a.fence,
        }));
    for op in ops {
        let Some(shard) = facts.shard_of(op.stream) else { continue };
        let snapshot = timeline.at(op.history_len);
        if !snapshot.fencing {
            continue;
        }
        let latest = snapshot.latest.get(&shard).copied();
        let at_us = op.at_ms * 1_000;
        match (op.fence, latest) {
            (Some(presented), Some(latest)) if presented == latest => counts.fenced_ok += 1,
            (Some(presented), latest) => {
                // The key holds at least this counter: the rule refuses the presented fence,
                // whatever was lost before.
                let superseded = snapshot.floor.get(&shard).is_some_and(|floor| *floor >= presented.counter);
                // Only a loss before the operation excuses it (an outside review: a loss or drop
                // anywhere in the run did): until then the history still held what it presented.
                let before_op = |index: usize| index < op.history_len;
                let forgotten = timeline.lost.get(&presented).is_some_and(|index| before_op(*index))
                    || (timeline.first_drop.is_some_and(before_op) && !timeline.recorded.contains(&presented));
                if forgotten && !superseded {
                    counts.stale_after_loss += 1;
                } else if !superseded
                    && foreign.iter().any(|(fences, until_us)| fences.contains(&presented) && at_us <= *until_us)
                {
                    counts.stale_across_split_brain += 1;
                } else {
                    let consumer = op.consumer.to_string();
                    violations.push(FenceViolation::StaleFenceSucceeded {
                        at_us,
                        op: op.op,
                        consumer,
                        shard,
                        presented,
                        latest,
                    });
                }
            }
            (None, Some(latest)) => {
                let consumer = op.consumer.to_string();
                violations.push(FenceViolation::UnfencedOperation { at_us, op: op.op, consumer, shard, latest });
            }
            (None, None) => {}
        }
    }
    violations
}

/// The group's fencing state after every history event, and which fences were lost.
struct Timeline {
    /// `(history index, snapshot after it)`, for the events that changed the group's record.
    snapshots: Vec<(usize, Snapshot)>,
    /// Fences recorded in some state that a later rollback undid (their grants were forgotten),
    /// with the history index of the first event that lost them.
    lost: BTreeMap<Fence, usize>,
    /// Every fence any recorded state held.
    recorded: BTreeSet<Fence>,
    /// The history index of the first acknowledged write the store dropped (its grant's fence was
    /// never recorded), if any.
    first_drop: Option<usize>,
}

impl Timeline {
    fn build(facts: &Facts<'_>, history: &[HistoryEvent]) -> Self {
        let mut snapshots: Vec<(usize, Snapshot)> = Vec::new();
        let mut lost = BTreeMap::new();
        let mut recorded = BTreeSet::new();
        let mut first_drop = None;
        let mut current = Snapshot::default();
        for (index, event) in history.iter().enumerate() {
            if matches!(event.kind, HistoryKind::WriteDropped { .. }) {
                first_drop.get_or_insert(index);
            }
            // Before the record's own change: a restart empty lowers fence keys even where the
            // group's record was already gone (it then names no record, and the lowered floor
            // gets a snapshot of its own).
            let lowered = lowers_fence_keys(event);
            if lowered {
                current.floor.clear();
            }
            let Some((_, record)) = event.metadata_after.iter().rev().find(|(g, _)| g == facts.group) else {
                if lowered {
                    snapshots.push((index, current.clone()));
                }
                continue;
            };
            let state: Option<GroupMetadata> = record.as_ref().and_then(|r| serde_json::from_str(&r.aggregate).ok());
            let before = current.clone();
            // A key deleted, corrupted or recreated empty records no newer grant: each shard's
            // latest grant stays the last one recorded (the fence keys outlive the record too).
            if let Some(g) = &state {
                current.fencing = g.config.fencing;
                for (shard, owner) in &g.current {
                    let fence = match owner {
                        ShardOwner::Owned { fence, .. }
                        | ShardOwner::Revoking { fence, .. }
                        | ShardOwner::Fenced { fence, .. } => *fence,
                    };
                    match fence {
                        Some(fence) => {
                            current.latest.insert(*shard, fence);
                            recorded.insert(fence);
                            // After a rollback too: the surviving state's raises survived with
                            // it (the journal loses a suffix, and a raise comes before its grant).
                            let floor = current.floor.entry(*shard).or_default();
                            *floor = (*floor).max(fence.counter);
                        }
                        None => {
                            current.latest.remove(shard);
                        }
                    }
                }
            }
            if is_loss(event) {
                let kept: BTreeSet<Fence> = current.latest.values().copied().collect();
                for fence in before.latest.values().filter(|f| !kept.contains(f)) {
                    lost.entry(*fence).or_insert(index);
                }
            }
            snapshots.push((index, current.clone()));
        }
        Timeline { snapshots, lost, recorded, first_drop }
    }

    /// The snapshot after the first `history_len` events.
    fn at(&self, history_len: usize) -> Snapshot {
        let i = self.snapshots.partition_point(|(index, _)| *index < history_len);
        i.checked_sub(1).map(|i| self.snapshots[i].1.clone()).unwrap_or_default()
    }
}

/// A change that loses writes: a rollback, or a deletion of the key behind everyone's back.
fn is_loss(event: &HistoryEvent) -> bool {
    matches!(event.kind, HistoryKind::RolledBack { .. } | HistoryKind::KeyDeleted { .. })
}

/// A change that can lower a fence key: a rollback (it may undo raises), a restart empty (every
/// key gone). A deleted metadata key leaves the fence keys alone.
fn lowers_fence_keys(event: &HistoryEvent) -> bool {
    matches!(
        event.kind,
        HistoryKind::RolledBack { .. } | HistoryKind::IdentityChanged { cause: IdentityCause::FlushAll, .. }
    )
}

#[cfg(test)]
mod tests {
    use rsc::core::model::{Fence, GroupMetadata, ShardOwner};
    use rsc::store::memory::{AckRecord, HistoryKind, RollbackMode};

    use super::{check, FenceCounts, FenceViolation};
    use crate::checkers::fixtures::World;

    /// The fixture group with `member` owning shard 0 under `fence`.
    fn owning(world: &World, member: &str, fence: Fence) -> GroupMetadata {
        let mut g = world.group_with_member(member, &[0]);
        g.current.insert(0, ShardOwner::Owned { member: member.into(), since_assignment_epoch: 0, fence: Some(fence) });
        g
    }

    /// An XACK on shard 0 presenting `fence`, run after the first `history_len` metadata changes.
    fn ack(world: &World, fence: Fence, history_len: usize) -> AckRecord {
        let stream = world.group.stream_key(0);
        let group = world.group.consumer_group.clone();
        AckRecord { at_ms: 1_000 * history_len as u64, stream, group, ids: Vec::new(), fence: Some(fence), history_len }
    }

    /// The checker's verdict on `world` with these XACKs run at Redis.
    fn judged(world: &World, acks: &[AckRecord]) -> (Vec<FenceViolation>, FenceCounts) {
        check(&super::super::Facts { store_acks: acks, ..world.facts() })
    }

    /// Records `g` (revision `revision`) as the state a silent rollback at `at_ms` went back to.
    fn rolled_back_to(world: &mut World, at_ms: u64, g: &GroupMetadata, revision: u64) {
        world.store(at_ms, g, revision);
        let rollback = HistoryKind::RolledBack { mode: RollbackMode::Silent, requested: 1, undone: 1 };
        world.history.last_mut().expect("just stored").kind = rollback;
    }

    /// m1 granted 5.a, m2 granted 6.b, a silent rollback back to 5.a (6.b lost), m3 granted 6.c:
    /// four metadata changes.
    fn lost_then_regranted() -> (World, [Fence; 3]) {
        let mut world = World::new();
        let (a, b, c) =
            (Fence { counter: 5, nonce: 0xa }, Fence { counter: 6, nonce: 0xb }, Fence { counter: 6, nonce: 0xc });
        let first = owning(&world, "m1", a);
        world.store(1, &first, 1);
        world.store(2, &owning(&world, "m2", b), 2);
        rolled_back_to(&mut world, 3, &first, 1);
        world.store(4, &owning(&world, "m3", c), 2);
        (world, [a, b, c])
    }

    #[test]
    fn a_lost_fence_is_measured_until_a_grant_as_new_is_recorded() {
        let (world, [_, lost, _]) = lost_then_regranted();
        // Right after the rollback the key may hold 5.a: 6.b is strictly newer and the rule lets
        // it through. No protocol prevents that.
        let acks = [ack(&world, lost, 3)];
        let (violations, counts) = judged(&world, &acks);
        assert_eq!(violations, Vec::new());
        assert_eq!(counts.stale_after_loss, 1);
    }

    /// A loss or a dropped write excuses only the operations after it: a fence nobody recorded
    /// that succeeded before any write was dropped came from no lost history (the excuse used to
    /// span the whole run). The same fence after the drop is measured.
    #[test]
    fn only_a_loss_before_the_operation_excuses_it() {
        let mut world = World::new();
        let (a, b) = (Fence { counter: 5, nonce: 0xa }, Fence { counter: 6, nonce: 0xb });
        world.store(1, &owning(&world, "m1", a), 1);
        world.store(2, &owning(&world, "m2", b), 2);
        world.history.push(rsc::store::memory::HistoryEvent {
            at_ms: 3,
            kind: HistoryKind::WriteDropped { group: world.group.clone(), revision: 3 },
            metadata_after: vec![],
        });
        let never_recorded = Fence { counter: 9, nonce: 0xd };
        let (violations, counts) = judged(&world, &[ack(&world, never_recorded, 2)]);
        assert!(matches!(violations.as_slice(), [FenceViolation::StaleFenceSucceeded { .. }]), "{violations:?}");
        assert_eq!(counts.stale_after_loss, 0);
        let (violations, counts) = judged(&world, &[ack(&world, never_recorded, 3)]);
        assert_eq!((violations, counts.stale_after_loss), (Vec::new(), 1));
        // A rollback likewise: 6.b, lost by the rollback at index 2, used before it was even
        // recorded (index 1) is not excused by that later loss.
        let (world, [_, lost, _]) = lost_then_regranted();
        let (violations, counts) = judged(&world, &[ack(&world, lost, 1)]);
        assert!(matches!(violations.as_slice(), [FenceViolation::StaleFenceSucceeded { .. }]), "{violations:?}");
        assert_eq!(counts.stale_after_loss, 0);
    }

    #[test]
    fn a_lost_fence_that_succeeds_after_a_grant_as_new_is_a_violation() {
        let (world, [_, lost, regranted]) = lost_then_regranted();
        // 6.c was raised before it was recorded: the key holds 6.c, and the rule refuses 6.b
        // (same counter, another nonce). Code comparing counters only would let it through.
        let acks = [ack(&world, lost, 4)];
        let (violations, counts) = judged(&world, &acks);
        assert_eq!(counts.stale_after_loss, 0);
        assert!(
            matches!(
                violations.as_slice(),
                [FenceViolation::StaleFenceSucceeded { presented, latest: Some(latest), .. }]
                    if *presented == lost && *latest == regranted
            ),
            "{violations:?}"
        );
    }

    #[test]
    fn a_restart_empty_excuses_the_lost_fence_again_even_with_the_record_gone() {
        let (mut world, [_, lost, _]) = lost_then_regranted();
        // The record is deleted, then the server restarts empty: every fence key is gone, so any
        // counter is let through again. The restart names no record (there is none).
        world.delete_key(5);
        let identity =
            rsc::store::ServerIdentity { run_id: "r2".into(), replication_id: "x2".into(), primaries: Vec::new() };
        world.history.push(rsc::store::memory::HistoryEvent {
            at_ms: 6,
            kind: HistoryKind::IdentityChanged { cause: rsc::store::memory::IdentityCause::FlushAll, identity },
            metadata_after: Vec::new(),
        });
        let acks = [ack(&world, lost, 5), ack(&world, lost, 6)];
        let (violations, counts) = judged(&world, &acks);
        assert_eq!(violations.len(), 1, "before the restart the key still held 6.c: {violations:?}");
        assert_eq!(counts.stale_after_loss, 1, "after it, the lost fence is what no protocol prevents");
    }

    #[test]
    fn a_second_rollback_excuses_the_lost_fence_again() {
        let (mut world, [_, lost, _]) = lost_then_regranted();
        // Another rollback may have undone 6.c's raise with its grant: the key may hold 5.a again.
        let first = owning(&world, "m1", Fence { counter: 5, nonce: 0xa });
        rolled_back_to(&mut world, 5, &first, 1);
        let acks = [ack(&world, lost, 5)];
        let (violations, counts) = judged(&world, &acks);
        assert_eq!(violations, Vec::new());
        assert_eq!(counts.stale_after_loss, 1);
    }
}
