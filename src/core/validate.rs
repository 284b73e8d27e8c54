//! Structural invariants of [`GroupMetadata`]. Called after every transition in tests and before
//! every write by the coordinator: a state that fails here is never recorded.

use std::collections::BTreeSet;

use super::model::{
    GroupConfig, GroupMetadata, MemberState, ShardOwner, CLIENT_NUMBER_MAX, MEMBERS_MAX, SHARD_COUNT_MAX,
};

/// A broken structural invariant; the message names the field and the offending value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid group metadata: {0}")]
pub struct InvariantViolation(pub String);

fn check(cond: bool, msg: impl FnOnce() -> String) -> Result<(), InvariantViolation> {
    if cond {
        Ok(())
    } else {
        Err(InvariantViolation(msg()))
    }
}

impl GroupMetadata {
    /// Checks every structural invariant of the recorded state.
    pub fn validate(&self) -> Result<(), InvariantViolation> {
        self.group.validate().map_err(InvariantViolation)?;
        self.config.validate().map_err(InvariantViolation)?;
        check(self.metadata_version >= 1, || "metadataVersion must be >= 1".into())?;
        // Clients send these numbers back, and a number above the bound is refused at the edge:
        // members of a record beyond it could never heartbeat. (Member epochs are checked against
        // metadataVersion below.)
        check(self.metadata_version <= CLIENT_NUMBER_MAX, || {
            format!("metadataVersion {} above {CLIENT_NUMBER_MAX}", self.metadata_version)
        })?;
        check(self.assignment_epoch <= CLIENT_NUMBER_MAX, || {
            format!("assignmentEpoch {} above {CLIENT_NUMBER_MAX}", self.assignment_epoch)
        })?;
        check((1..=SHARD_COUNT_MAX).contains(&self.shard_count), || {
            format!("shardCount {} outside 1..={SHARD_COUNT_MAX}", self.shard_count)
        })?;
        check(self.members.len() <= MEMBERS_MAX, || format!("more than {MEMBERS_MAX} members"))?;
        self.validate_resharding()?;
        self.validate_members()?;
        self.validate_assignments()?;
        self.validate_lease_transition()?;
        self.validate_correction()
    }

    /// A lease transition keeps an old, longer lease in force for one old lease: its durations
    /// obey the config's bounds and its wait was allocated. Unchecked, a corrupt or foreign record's
    /// transition of 10^15 ms decoded, never ended, kept fenced shards and dead members for ever,
    /// and stayed in every coordinator's longest-lease memory after the record was repaired (a
    /// numbers review); such a record now fails closed as `METADATA_INCOMPATIBLE`.
    fn validate_lease_transition(&self) -> Result<(), InvariantViolation> {
        let Some(transition) = &self.lease_transition else { return Ok(()) };
        for (name, value) in [
            ("assignmentLeaseMs", transition.assignment_lease_ms),
            ("memberLeaseTtlMs", transition.member_lease_ttl_ms),
        ] {
            check((1..=GroupConfig::MS_MAX).contains(&value), || {
                format!("leaseTransition {name} {value} outside 1..={}", GroupConfig::MS_MAX)
            })?;
        }
        check(transition.wait < self.next_wait_id, || "leaseTransition wait not allocated".into())
    }

    fn validate_resharding(&self) -> Result<(), InvariantViolation> {
        let mut previous = None;
        for step in &self.resharding {
            check(step.to_shard_count > step.from_shard_count, || {
                format!("reshard {}->{} does not add shards", step.from_shard_count, step.to_shard_count)
            })?;
            if let Some(prev) = previous {
                check(step.from_shard_count == prev, || "resharding history is not contiguous".into())?;
            }
            check(step.metadata_version <= self.metadata_version, || "reshard version is in the future".into())?;
            previous = Some(step.to_shard_count);
        }
        check(previous.is_none_or(|to| to == self.shard_count), || "last reshard does not end at shardCount".into())
    }

    fn validate_members(&self) -> Result<(), InvariantViolation> {
        for (id, member) in &self.members {
            check(!id.is_empty(), || "empty member id".into())?;
            check(member.incarnation_epoch >= 1 && member.incarnation_epoch <= member.member_epoch, || {
                format!("member {id}: epoch {} / incarnation {}", member.member_epoch, member.incarnation_epoch)
            })?;
            check(member.member_epoch <= self.metadata_version, || format!("member {id}: epoch in the future"))?;
            check(member.joined_at_version <= self.metadata_version, || format!("member {id} joined in the future"))?;
        }
        Ok(())
    }

    fn validate_assignments(&self) -> Result<(), InvariantViolation> {
        for (shard, target) in &self.target {
            check(*shard < self.shard_count, || format!("target shard {shard} >= shardCount"))?;
            let active = self.members.get(target).is_some_and(|m| m.state == MemberState::Active);
            check(active, || format!("target of shard {shard} names non-active member {target}"))?;
        }
        let mut waits = BTreeSet::new();
        for (shard, owner) in &self.current {
            check(*shard < self.shard_count, || format!("current shard {shard} >= shardCount"))?;
            match owner {
                ShardOwner::Owned { member, since_assignment_epoch, .. }
                | ShardOwner::Revoking { member, since_assignment_epoch, .. } => {
                    let active = self.members.get(member).is_some_and(|m| m.state == MemberState::Active);
                    check(active, || format!("shard {shard} held by non-active member {member}"))?;
                    check(*since_assignment_epoch <= self.assignment_epoch, || {
                        format!("shard {shard} owned since a future assignment epoch")
                    })?;
                }
                ShardOwner::Fenced { .. } => {}
            }
            if let ShardOwner::Revoking { wait, .. } | ShardOwner::Fenced { wait, .. } = owner {
                check(*wait < self.next_wait_id, || format!("shard {shard}: wait {wait} not allocated"))?;
                check(waits.insert(*wait) || matches!(owner, ShardOwner::Fenced { .. }), || {
                    format!("shard {shard}: revoking wait {wait} shared")
                })?;
            }
            // A revoking shard must be targeted elsewhere (or nowhere): revoking towards oneself is
            // a lost reconciliation step.
            if let ShardOwner::Revoking { member, .. } = owner {
                check(self.target.get(shard) != Some(member), || {
                    format!("shard {shard} revoking from its own target {member}")
                })?;
            }
        }
        Ok(())
    }

    fn validate_correction(&self) -> Result<(), InvariantViolation> {
        match &self.correction {
            Some(round) => {
                check(round.wait < self.next_wait_id, || "correction wait not allocated".into())?;
                for member in &round.synced_members {
                    check(self.members.contains_key(member), || format!("synced member {member} unknown"))?;
                }
                Ok(())
            }
            None => check(self.max_client_version_seen <= self.metadata_version, || {
                format!(
                    "maxClientVersionSeen {} above metadataVersion {} with no correction round",
                    self.max_client_version_seen, self.metadata_version
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::core::model::{GroupConfig, GroupId, GroupMetadata, LeaseTransition};

    #[test]
    fn a_lease_transition_out_of_bounds_or_with_an_unallocated_wait_is_refused() {
        let mut g = GroupMetadata::new(GroupId::new("orders", "billing"), 2, GroupConfig::default());
        g.next_wait_id = 5;
        let transition = |assignment_lease_ms, member_lease_ttl_ms, wait| {
            Some(LeaseTransition { assignment_lease_ms, member_lease_ttl_ms, wait })
        };
        g.lease_transition = transition(60_000, 90_000, 4);
        assert_eq!(g.validate(), Ok(()));
        for bad in [
            transition(GroupConfig::MS_MAX + 1, 90_000, 4),
            transition(1_000_000_000_000_000, 90_000, 4),
            transition(60_000, 0, 4),
            transition(60_000, 90_000, 5),
        ] {
            g.lease_transition = bad.clone();
            assert!(g.validate().is_err(), "{bad:?}");
        }
    }
}
