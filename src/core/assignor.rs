//! Target assignors: pure functions from (shard count, active members, previous target, current
//! assignment) to a new target. Deterministic: the same inputs give the same target, so two
//! coordinators (or a retry) compute the same decision.

use std::collections::BTreeMap;

use super::model::{AssignorKind, MemberId, ShardId, ShardOwner};

/// Computes a target assignment.
pub trait Assignor {
    /// `members` is sorted and non-empty; every shard in `0..shard_count` must be assigned to one
    /// of them.
    fn assign(
        &self,
        shard_count: u32,
        members: &[MemberId],
        previous_target: &BTreeMap<ShardId, MemberId>,
        current: &BTreeMap<ShardId, ShardOwner>,
    ) -> BTreeMap<ShardId, MemberId>;
}

/// Returns the assignor for a configured kind.
pub fn assignor_for(kind: AssignorKind) -> &'static dyn Assignor {
    match kind {
        AssignorKind::StickyUniform => &StickyUniform,
        AssignorKind::Range => &Range,
    }
}

/// Kafka-style range assignor: member `i` (in id order) gets a contiguous range; the first
/// `shard_count % n` members get one extra shard.
pub struct Range;

impl Assignor for Range {
    fn assign(
        &self,
        shard_count: u32,
        members: &[MemberId],
        _previous_target: &BTreeMap<ShardId, MemberId>,
        _current: &BTreeMap<ShardId, ShardOwner>,
    ) -> BTreeMap<ShardId, MemberId> {
        let n = members.len() as u32;
        let (base, extra) = (shard_count / n, shard_count % n);
        let mut target = BTreeMap::new();
        let mut next_shard = 0;
        for (i, member) in members.iter().enumerate() {
            let quota = base + u32::from((i as u32) < extra);
            for shard in next_shard..next_shard + quota {
                target.insert(shard, member.clone());
            }
            next_shard += quota;
        }
        target
    }
}

/// Sticky uniform assignor: every member gets `floor` or `ceil` of shards/members; a shard stays
/// with its previous target (or, failing that, its current holder) whenever quotas allow, so a
/// membership change moves the fewest shards. Ties break by member id, then shard id.
pub struct StickyUniform;

impl Assignor for StickyUniform {
    fn assign(
        &self,
        shard_count: u32,
        members: &[MemberId],
        previous_target: &BTreeMap<ShardId, MemberId>,
        current: &BTreeMap<ShardId, ShardOwner>,
    ) -> BTreeMap<ShardId, MemberId> {
        let index: BTreeMap<&str, usize> = members.iter().enumerate().map(|(i, m)| (m.as_str(), i)).collect();
        // The preferred member of each shard: previous target, else current holder, if still a member.
        let preferred = |shard: ShardId| -> Option<usize> {
            let prev = previous_target.get(&shard).and_then(|m| index.get(m.as_str()));
            prev.or_else(|| current.get(&shard).and_then(|o| index.get(o.member().as_str()))).copied()
        };
        let mut wanted: Vec<Vec<ShardId>> = vec![Vec::new(); members.len()];
        let mut homeless = Vec::new();
        for shard in 0..shard_count {
            match preferred(shard) {
                Some(i) => wanted[i].push(shard),
                None => homeless.push(shard),
            }
        }
        // Members that already want more shards get the `ceil` quotas: fewer moves.
        let n = members.len() as u32;
        let (base, extra) = (shard_count / n, (shard_count % n) as usize);
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(wanted[i].len()), i));
        let mut quota = vec![base as usize; members.len()];
        for &i in order.iter().take(extra) {
            quota[i] += 1;
        }
        let mut target = BTreeMap::new();
        for (i, shards) in wanted.iter().enumerate() {
            for (k, &shard) in shards.iter().enumerate() {
                if k < quota[i] {
                    target.insert(shard, members[i].clone());
                } else {
                    homeless.push(shard);
                }
            }
        }
        homeless.sort_unstable();
        let mut filled: Vec<usize> = (0..members.len()).map(|i| wanted[i].len().min(quota[i])).collect();
        let mut cursor = 0;
        for shard in homeless {
            while filled[cursor] >= quota[cursor] {
                cursor += 1; // safe: total quota == shard_count, so a member with room exists.
            }
            target.insert(shard, members[cursor].clone());
            filled[cursor] += 1;
        }
        target
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<MemberId> {
        (0..n).map(|i| format!("m{i:03}")).collect()
    }

    fn counts(target: &BTreeMap<ShardId, MemberId>) -> BTreeMap<&str, usize> {
        let mut c = BTreeMap::new();
        for m in target.values() {
            *c.entry(m.as_str()).or_default() += 1;
        }
        c
    }

    #[test]
    fn range_gives_contiguous_balanced_ranges() {
        let t = Range.assign(7, &members(3), &BTreeMap::new(), &BTreeMap::new());
        let owners: Vec<&str> = (0..7).map(|s| t[&s].as_str()).collect();
        assert_eq!(owners, ["m000", "m000", "m000", "m001", "m001", "m002", "m002"]);
    }

    #[test]
    fn sticky_is_uniform_and_moves_fewest_shards_on_join() {
        let before = StickyUniform.assign(12, &members(3), &BTreeMap::new(), &BTreeMap::new());
        assert!(counts(&before).values().all(|&c| c == 4));
        let after = StickyUniform.assign(12, &members(4), &before, &BTreeMap::new());
        assert!(counts(&after).values().all(|&c| c == 3));
        let moved = (0..12).filter(|s| before[s] != after[s]).count();
        assert_eq!(moved, 3, "exactly the new member's share moves");
        // Idempotent: assigning again from the result changes nothing.
        assert_eq!(StickyUniform.assign(12, &members(4), &after, &BTreeMap::new()), after);
    }

    #[test]
    fn sticky_reassigns_only_the_leavers_shards() {
        let before = StickyUniform.assign(10, &members(3), &BTreeMap::new(), &BTreeMap::new());
        let remaining: Vec<MemberId> = vec!["m000".into(), "m002".into()];
        let after = StickyUniform.assign(10, &remaining, &before, &BTreeMap::new());
        assert!(counts(&after).values().all(|&c| c == 5));
        for s in 0..10 {
            if before[&s] != "m001" {
                assert_eq!(before[&s], after[&s], "shard {s} of a staying member moved");
            }
        }
    }
}
