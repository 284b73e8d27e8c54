//! Per-member index of one recorded state, so that a steady heartbeat costs what its member holds
//! rather than what its group holds.
//!
//! Owns: [`GroupIndex`], derived from one [`GroupMetadata`] in one pass over its shards: every
//! member's [`MemberShards`] (what its view lists), the waits the state records, and the parts of
//! [`is_quiescent`](super::transition::is_quiescent) that do not depend on time. A steady
//! heartbeat's answer on an unchanged state then reads its member's entry instead of walking
//! every shard several times (at 16,384 shards that walk cost about half a millisecond per
//! heartbeat, for every member of the group, every heartbeat interval).
//! Never: outlives or mixes with another state. An index describes exactly the state it was built
//! from: the caller keeps it beside that state (the coordinator's decoded cache builds it once
//! per cached record, on that record's first heartbeat that may be steady) and uses it with
//! nothing else; a decision given an index whose fingerprint (group, metadata version, epochs,
//! sizes) is not its state's ignores it and walks the state.
//! Invariant: for the state it was built from, every answer equals the scan's — `MemberShards` of
//! a member equals [`MemberShards::scan`], and [`GroupIndex::quiescent`] equals `is_quiescent` for
//! every observation (the core property tests decide every heartbeat both ways and compare).

use std::collections::{BTreeMap, BTreeSet};

use super::fence::ShardFence;
use super::model::{GroupId, GroupMetadata, MemberId, ShardId, ShardOwner, WaitId};
use super::observe::Observations;
use super::planted::{PlantedBug, PlantedBugs};
use super::protocol::Drain;
use super::transition::{for_each_shard, quiescent_around_shards, shard_keeps_whatever_the_time};

/// What a member's view lists of one recorded state, in shard order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberShards {
    /// `Owned` by the member.
    pub assigned: Vec<ShardId>,
    /// `Revoking` by the member (draining).
    pub revoke: Vec<ShardId>,
    /// The revoke instruction of each `Revoking` entry that names one.
    pub drains: Vec<Drain>,
    /// Target shards of the member it does not own yet.
    pub pending: Vec<ShardId>,
    /// The fence of each `Owned` or `Revoking` entry of the member that carries one.
    pub fences: Vec<ShardFence>,
}

impl MemberShards {
    /// The member's shards, by walking the whole state (what an index answers without the walk).
    pub fn scan(g: &GroupMetadata, member: &str) -> Self {
        let mut shards = Self::default();
        for (shard, owner) in &g.current {
            match owner {
                ShardOwner::Owned { member: m, .. } | ShardOwner::Revoking { member: m, .. } if m == member => {
                    shards.note_current(*shard, owner);
                }
                _ => {}
            }
        }
        shards.pending = g.pending_shards(member);
        shards
    }

    fn note_current(&mut self, shard: ShardId, owner: &ShardOwner) {
        match owner {
            ShardOwner::Owned { fence, .. } => {
                self.assigned.push(shard);
                if let Some(fence) = fence {
                    self.fences.push(ShardFence { shard, fence: *fence });
                }
            }
            ShardOwner::Revoking { revoke_id, fence, .. } => {
                self.revoke.push(shard);
                if let Some(revoke_id) = revoke_id {
                    self.drains.push(Drain { shard, revoke_id: *revoke_id });
                }
                if let Some(fence) = fence {
                    self.fences.push(ShardFence { shard, fence: *fence });
                }
            }
            ShardOwner::Fenced { .. } => {}
        }
    }
}

/// The index of one recorded state (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupIndex {
    /// What identifies the state it was built from, checked at every use ([`Self::describes`]):
    /// a caller that kept an index across a write would be told another state's shards.
    built_from: Fingerprint,
    members: BTreeMap<MemberId, MemberShards>,
    /// Every shard's reconciliation step is `Keep` whatever the time, except `Fenced` shards'.
    steady_shards: bool,
    /// The waits of the `Fenced` shards (a fenced member's shards share one): each one's release
    /// is due once its wait passed a lease.
    fenced_waits: BTreeSet<WaitId>,
    /// Any shard recorded `Revoking` (a planted bug releases those at once). Like the two fields
    /// above, only what `steady_shards` walked before it stopped: it stops at the first shard that
    /// is not steady, and then the state is not quiescent whatever these say.
    any_revoking: bool,
    /// The waits the state records, each once ([`GroupMetadata::recorded_waits`] lists a wait
    /// once per shard that records it).
    waits: Vec<WaitId>,
}

/// Fields of a state that any change of what an index answers changes (`metadata_version` is
/// bumped by every change a client can observe), with the sizes of what it indexes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fingerprint {
    group: GroupId,
    metadata_version: u64,
    assignment_epoch: u64,
    shard_count: u32,
    members: usize,
    current: usize,
    target: usize,
    next_wait_id: WaitId,
}

impl Fingerprint {
    fn of(g: &GroupMetadata) -> Self {
        Self {
            group: g.group.clone(),
            metadata_version: g.metadata_version,
            assignment_epoch: g.assignment_epoch,
            shard_count: g.shard_count,
            members: g.members.len(),
            current: g.current.len(),
            target: g.target.len(),
            next_wait_id: g.next_wait_id,
        }
    }
}

impl GroupIndex {
    /// Indexes `g`: one pass over its current and target assignments.
    pub fn build(g: &GroupMetadata) -> Self {
        let mut members: BTreeMap<MemberId, MemberShards> = BTreeMap::new();
        for (shard, owner) in &g.current {
            match owner {
                ShardOwner::Owned { member, .. } | ShardOwner::Revoking { member, .. } => {
                    members.entry(member.clone()).or_default().note_current(*shard, owner);
                }
                ShardOwner::Fenced { .. } => {}
            }
        }
        for (shard, member) in &g.target {
            if g.is_pending(*shard, member) {
                members.entry(member.clone()).or_default().pending.push(*shard);
            }
        }
        let (mut fenced_waits, mut any_revoking) = (BTreeSet::new(), false);
        let steady_shards = for_each_shard(g, |_, current, target| match current {
            Some(ShardOwner::Fenced { wait, .. }) => {
                fenced_waits.insert(*wait);
                true
            }
            _ => {
                any_revoking |= matches!(current, Some(ShardOwner::Revoking { .. }));
                shard_keeps_whatever_the_time(current, target, g.config.fencing)
            }
        });
        let waits: BTreeSet<WaitId> = g.recorded_waits().collect();
        Self {
            built_from: Fingerprint::of(g),
            members,
            steady_shards,
            fenced_waits,
            any_revoking,
            waits: waits.into_iter().collect(),
        }
    }

    /// Whether this index was built from `g` as far as its fingerprint tells (the coordinator
    /// also keeps each index with the very state it was built from). Compared field by field:
    /// every steady heartbeat asks, and building `g`'s fingerprint would copy its group name.
    pub fn describes(&self, g: &GroupMetadata) -> bool {
        let f = &self.built_from;
        f.group == g.group
            && f.metadata_version == g.metadata_version
            && f.assignment_epoch == g.assignment_epoch
            && f.shard_count == g.shard_count
            && f.members == g.members.len()
            && f.current == g.current.len()
            && f.target == g.target.len()
            && f.next_wait_id == g.next_wait_id
    }

    /// `member`'s shards (none when the state records none for it).
    pub fn member(&self, member: &str) -> MemberShards {
        self.members.get(member).cloned().unwrap_or_default()
    }

    /// `is_quiescent(g, obs, planted)` for the state this index was built from, without walking
    /// its shards.
    pub fn quiescent(&self, g: &GroupMetadata, obs: &Observations, planted: PlantedBugs) -> bool {
        if !self.steady_shards || (self.any_revoking && planted.has(PlantedBug::AssignBeforeRelease)) {
            return false;
        }
        let lease = g.lease_wait_ms(obs.longest_lease_seen_ms);
        quiescent_around_shards(g, obs, planted) && self.fenced_waits.iter().all(|wait| obs.waited_ms(*wait) < lease)
    }

    /// The waits the state records (what [`GroupMetadata::recorded_waits`] walks the shards for).
    pub fn waits(&self) -> &[WaitId] {
        &self.waits
    }
}
