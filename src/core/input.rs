//! Input checks: what a request may carry, whatever the recorded state. The HTTP edge runs them
//! before it calls the coordinator, the coordinator before it touches the store, and the decision
//! core again before it decides (`decide_*` are public and the simulation calls them directly), so
//! the three can never disagree: one rule, one place.
//!
//! Owns the bound on every number a client sends ([`CLIENT_NUMBER_MAX`] for versions, epochs and
//! revisions; [`SHARD_COUNT_MAX`] for shard ids and counts; the config's own limits for
//! durations). Never reads recorded state: checks that need it (a leave of a known member, a
//! shard count above the current one, a full group) stay with the decision that loads it.
//! Invariant: a request that fails here writes nothing anywhere.

use std::collections::BTreeSet;

use super::model::{ShardId, CLIENT_NUMBER_MAX, MEMBER_ID_LEN_MAX, SHARD_COUNT_MAX};
use super::protocol::{AdminRequest, HeartbeatRequest, RoutingReport};

/// Why a request was refused (`BAD_REQUEST`); the message names the offending field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// A version, epoch or revision above [`CLIENT_NUMBER_MAX`].
    #[error("{field} {value} is above {CLIENT_NUMBER_MAX} (2^53 - 1), the largest number the protocol uses")]
    NumberTooLarge { field: &'static str, value: u64 },
    /// A member id that is empty, too long, or contains control characters.
    #[error("memberId must be 1..={MEMBER_ID_LEN_MAX} bytes without control characters")]
    MemberId,
    /// A member session that is not 32..=128 lowercase hex digits.
    #[error("memberSession must be 32..=128 lowercase hex digits")]
    MemberSession,
    /// A leave heartbeat with epoch 0 (a leave names the incarnation that leaves).
    #[error("leave needs the member's current epoch")]
    LeaveWithoutEpoch,
    /// A shard id at or above [`SHARD_COUNT_MAX`].
    #[error("shard {0} is out of range")]
    ShardOutOfRange(ShardId),
    /// A shard listed twice across `owned` and `revoking`.
    #[error("shard {0} is listed twice in owned/revoking")]
    ShardListedTwice(ShardId),
    /// A shard listed twice in `fenced`.
    #[error("shard {0} is listed twice in fenced")]
    FencedListedTwice(ShardId),
    /// A shard count outside `1..=SHARD_COUNT_MAX`.
    #[error("{field} must be in 1..={SHARD_COUNT_MAX}")]
    ShardCount { field: &'static str },
    /// A config that breaks its own rules (durations, lease ordering).
    #[error("{0}")]
    Config(String),
    /// A created group whose stream prefix lies inside, or above, the coordinator's own keys
    /// ([`COORDINATOR_KEY_NAMESPACE`]).
    #[error(
        "streamPrefix {0:?} is reserved: shard streams under it would share the coordinator's key namespace \
         ({COORDINATOR_KEY_NAMESPACE}:*), and an application's Redis user granted its streams would reach \
         every group's metadata"
    )]
    ReservedPrefix(String),
}

/// The prefix of every key the coordinator itself writes (metadata, index, fences, relays). A
/// group created with a stream prefix `P` such that `P:` starts this namespace (`redis-stream`,
/// `redis-stream:coord`) or with `P` inside it would have shard streams `P:<n>` among those keys:
/// the README's application ACL (`~P:*`) would then grant every group's metadata, and a stream
/// could take the name of a relay key. Groups recorded before this check keep working; only
/// creations are refused.
pub const COORDINATOR_KEY_NAMESPACE: &str = "redis-stream:coord";

/// Whether `prefix` is a stream prefix a new group may not take ([`InputError::ReservedPrefix`]).
pub fn reserved_stream_prefix(prefix: &str) -> bool {
    let namespace = format!("{COORDINATOR_KEY_NAMESPACE}:");
    namespace.starts_with(&format!("{prefix}:")) || prefix.starts_with(&namespace)
}

/// A version, epoch or revision a client sent.
pub fn check_client_number(field: &'static str, value: u64) -> Result<(), InputError> {
    if value > CLIENT_NUMBER_MAX {
        return Err(InputError::NumberTooLarge { field, value });
    }
    Ok(())
}

/// Everything about a routing report that does not depend on the recorded group.
pub fn check_routing_report(report: &RoutingReport) -> Result<(), InputError> {
    check_client_number("knownVersion", report.known_version)?;
    if report.known_shard_count > SHARD_COUNT_MAX {
        return Err(InputError::ShardCount { field: "knownShardCount" });
    }
    Ok(())
}

/// Everything about a heartbeat that does not depend on the recorded group.
pub fn check_heartbeat_request(req: &HeartbeatRequest) -> Result<(), InputError> {
    check_client_number("memberEpoch", req.member_epoch)?;
    check_client_number("metadataVersion", req.metadata_version)?;
    check_client_number("assignmentEpoch", req.assignment_epoch)?;
    if req.member_session.as_ref().is_some_and(|s| !s.is_well_formed()) {
        return Err(InputError::MemberSession);
    }
    let id = &req.member_id;
    if id.is_empty() || id.len() > MEMBER_ID_LEN_MAX || id.chars().any(char::is_control) {
        return Err(InputError::MemberId);
    }
    if req.leave && req.member_epoch == 0 {
        return Err(InputError::LeaveWithoutEpoch);
    }
    for report in &req.revoking {
        // Revoke ids are drawn below 2^53 (`REVOKE_ID_MAX`), like every number a client echoes.
        if let Some(revoke_id) = report.revoke_id {
            check_client_number("revokeId", revoke_id)?;
        }
    }
    let mut seen = BTreeSet::new();
    let shards = req.owned.iter().copied().chain(req.revoking.iter().map(|r| r.shard));
    for shard in shards {
        if shard >= SHARD_COUNT_MAX {
            return Err(InputError::ShardOutOfRange(shard));
        }
        if !seen.insert(shard) {
            return Err(InputError::ShardListedTwice(shard));
        }
    }
    // A fenced report names a shard the member reads (`owned`) or stopped reading because of it.
    let mut fenced = BTreeSet::new();
    for report in &req.fenced {
        if report.shard >= SHARD_COUNT_MAX {
            return Err(InputError::ShardOutOfRange(report.shard));
        }
        if !fenced.insert(report.shard) {
            return Err(InputError::FencedListedTwice(report.shard));
        }
    }
    Ok(())
}

/// Everything about an admin mutation that does not depend on the recorded group (the group name
/// is checked by [`super::model::GroupId::validate`]).
pub fn check_admin_request(req: &AdminRequest) -> Result<(), InputError> {
    let shard_count = |field, count| {
        if count == 0 || count > SHARD_COUNT_MAX {
            return Err(InputError::ShardCount { field });
        }
        Ok(())
    };
    match req {
        AdminRequest::CreateGroup { group, shard_count: count, config, .. } => {
            if reserved_stream_prefix(&group.stream_prefix) {
                return Err(InputError::ReservedPrefix(group.stream_prefix.clone()));
            }
            shard_count("shardCount", *count)?;
            config.validate().map_err(InputError::Config)
        }
        AdminRequest::AddShards { expected_revision, new_shard_count, .. } => {
            check_client_number("expectedRevision", *expected_revision)?;
            shard_count("newShardCount", *new_shard_count)
        }
        AdminRequest::ChangeConfig { expected_revision, config, .. } => {
            check_client_number("expectedRevision", *expected_revision)?;
            config.validate().map_err(InputError::Config)
        }
        AdminRequest::DeleteGroup { expected_revision, .. } => {
            check_client_number("expectedRevision", *expected_revision)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::{GroupConfig, GroupId};
    use crate::core::protocol::RevokeReport;

    fn heartbeat() -> HeartbeatRequest {
        HeartbeatRequest {
            metadata_version_proof: None,
            group: GroupId::new("orders", "billing"),
            member_id: "a".into(),
            member_epoch: 3,
            metadata_version: 3,
            assignment_epoch: 1,
            owned: vec![0],
            revoking: vec![RevokeReport { shard: 1, in_flight: 0, revoked: true, revoke_id: None }],
            leave: false,
            member_session: None,
            fenced: Vec::new(),
        }
    }

    #[test]
    fn the_client_number_bound_is_inclusive() {
        assert_eq!(check_client_number("knownVersion", CLIENT_NUMBER_MAX), Ok(()));
        assert_eq!(
            check_client_number("knownVersion", CLIENT_NUMBER_MAX + 1),
            Err(InputError::NumberTooLarge { field: "knownVersion", value: CLIENT_NUMBER_MAX + 1 })
        );
        assert_eq!(CLIENT_NUMBER_MAX, 9_007_199_254_740_991, "Number.MAX_SAFE_INTEGER");
    }

    #[test]
    fn every_number_of_a_heartbeat_is_bounded() {
        assert_eq!(check_heartbeat_request(&heartbeat()), Ok(()));
        for field in ["memberEpoch", "metadataVersion", "assignmentEpoch"] {
            let with = |value| {
                let mut req = heartbeat();
                match field {
                    "memberEpoch" => req.member_epoch = value,
                    "metadataVersion" => req.metadata_version = value,
                    _ => req.assignment_epoch = value,
                }
                req
            };
            assert_eq!(check_heartbeat_request(&with(CLIENT_NUMBER_MAX)), Ok(()), "{field} at the bound");
            let refused = check_heartbeat_request(&with(u64::MAX)).unwrap_err();
            assert_eq!(refused, InputError::NumberTooLarge { field, value: u64::MAX });
            assert!(refused.to_string().starts_with(field), "{refused}");
        }
        // A REVOKED report's revoke id: drawn at most REVOKE_ID_MAX (= CLIENT_NUMBER_MAX).
        assert_eq!(crate::core::model::REVOKE_ID_MAX, CLIENT_NUMBER_MAX);
        let report = |revoke_id| HeartbeatRequest {
            owned: vec![],
            revoking: vec![RevokeReport { shard: 1, in_flight: 0, revoked: true, revoke_id: Some(revoke_id) }],
            ..heartbeat()
        };
        assert_eq!(check_heartbeat_request(&report(CLIENT_NUMBER_MAX)), Ok(()));
        assert_eq!(
            check_heartbeat_request(&report(CLIENT_NUMBER_MAX + 1)),
            Err(InputError::NumberTooLarge { field: "revokeId", value: CLIENT_NUMBER_MAX + 1 })
        );
    }

    #[test]
    fn heartbeat_shapes_are_checked_without_state() {
        let mut req = heartbeat();
        req.member_id = "x".repeat(MEMBER_ID_LEN_MAX + 1);
        assert_eq!(check_heartbeat_request(&req), Err(InputError::MemberId));
        let req = HeartbeatRequest { member_epoch: 0, leave: true, ..heartbeat() };
        assert_eq!(check_heartbeat_request(&req), Err(InputError::LeaveWithoutEpoch));
        let req = HeartbeatRequest { owned: vec![SHARD_COUNT_MAX], ..heartbeat() };
        assert_eq!(check_heartbeat_request(&req), Err(InputError::ShardOutOfRange(SHARD_COUNT_MAX)));
        let req = HeartbeatRequest { owned: vec![1], ..heartbeat() };
        assert_eq!(check_heartbeat_request(&req), Err(InputError::ShardListedTwice(1)));
    }

    #[test]
    fn admin_revisions_counts_and_configs_are_checked_without_state() {
        let group = GroupId::new("orders", "billing");
        let config = GroupConfig::default();
        let bad_config = GroupConfig { assignment_lease_ms: 0, ..GroupConfig::default() };
        let cases = [
            (AdminRequest::CreateGroup { group: group.clone(), shard_count: 4, config: config.clone() }, true),
            (AdminRequest::CreateGroup { group: group.clone(), shard_count: 0, config: config.clone() }, false),
            (AdminRequest::CreateGroup { group: group.clone(), shard_count: 4, config: bad_config.clone() }, false),
            (AdminRequest::AddShards { group: group.clone(), expected_revision: 7, new_shard_count: 8 }, true),
            (
                AdminRequest::AddShards {
                    group: group.clone(),
                    expected_revision: CLIENT_NUMBER_MAX + 1,
                    new_shard_count: 8,
                },
                false,
            ),
            (
                AdminRequest::AddShards {
                    group: group.clone(),
                    expected_revision: 7,
                    new_shard_count: SHARD_COUNT_MAX + 1,
                },
                false,
            ),
            (AdminRequest::ChangeConfig { group: group.clone(), expected_revision: 7, config: config.clone() }, true),
            (AdminRequest::ChangeConfig { group: group.clone(), expected_revision: u64::MAX, config }, false),
            (AdminRequest::ChangeConfig { group: group.clone(), expected_revision: 7, config: bad_config }, false),
            (AdminRequest::DeleteGroup { group: group.clone(), expected_revision: CLIENT_NUMBER_MAX }, true),
            (AdminRequest::DeleteGroup { group, expected_revision: u64::MAX }, false),
        ];
        for (req, ok) in cases {
            assert_eq!(check_admin_request(&req).is_ok(), ok, "{req:?}");
        }
    }
    #[test]
    fn a_group_is_not_created_with_a_stream_prefix_in_or_above_the_coordinators_keys() {
        let create = |prefix: &str| AdminRequest::CreateGroup {
            group: GroupId::new(prefix, "billing"),
            shard_count: 4,
            config: GroupConfig::default(),
        };
        for prefix in ["redis-stream", "redis-stream:coord", "redis-stream:coord:heard:1:2", "redis-stream:coord:x"] {
            assert_eq!(
                check_admin_request(&create(prefix)),
                Err(InputError::ReservedPrefix(prefix.into())),
                "{prefix}"
            );
        }
        for prefix in ["redis-streams", "redis-stream-orders", "redis", "redis-stream:coordx", "orders:redis-stream"] {
            assert_eq!(check_admin_request(&create(prefix)), Ok(()), "{prefix}");
        }
        // Only creations: a group recorded before the check can still be changed and deleted.
        let group = GroupId::new("redis-stream", "billing");
        let change =
            AdminRequest::ChangeConfig { group: group.clone(), expected_revision: 3, config: GroupConfig::default() };
        assert_eq!(check_admin_request(&change), Ok(()));
        assert_eq!(check_admin_request(&AdminRequest::DeleteGroup { group, expected_revision: 3 }), Ok(()));
    }
}
