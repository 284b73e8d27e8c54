//! A scripted in-process coordinator for the drivers' tests: `OK` with a configurable assignment
//! per member, a routing view, and an on/off switch that makes every call `Unreachable`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::core::fence::{Fence, ShardFence};
use crate::core::model::{GroupId, ShardId};
use crate::core::protocol::{
    ApiError, Drain, ErrorCode, HeartbeatRequest, HeartbeatResponse, HeartbeatStatus, RoutingReport, RoutingResponse,
};

use super::transport::{CoordinatorTransport, TransportError};

pub(crate) struct FakeState {
    pub up: bool,
    pub assigned: BTreeMap<String, Vec<ShardId>>,
    pub assignment_lease_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub routing: RoutingResponse,
    pub heartbeats: Vec<HeartbeatRequest>,
    pub routing_calls: usize,
    /// Routing requests answered `Unreachable` because `up` was false.
    pub routing_calls_down: usize,
    /// The `known_version` of every routing call, in order.
    pub known_versions: Vec<u64>,
    /// The `known_shard_count` of every routing call, in order.
    pub known_shard_counts: Vec<u32>,
    /// Reads `knownShardCount` (a current coordinator); `false` plays an older one, which
    /// refuses the parameter with `BAD_REQUEST` and does not announce it.
    pub reads_shard_count: bool,
    /// The fence every answer gives an assigned shard (a shard not listed is read unfenced).
    pub fences: BTreeMap<ShardId, Fence>,
}

pub(crate) struct FakeCoordinator {
    pub state: Mutex<FakeState>,
}

impl FakeCoordinator {
    pub fn new(group: &GroupId, shard_count: u32, lease_ms: u64, interval_ms: u64) -> Self {
        Self {
            state: Mutex::new(FakeState {
                up: true,
                assigned: BTreeMap::new(),
                assignment_lease_ms: lease_ms,
                heartbeat_interval_ms: interval_ms,
                routing: routing(group, 1, shard_count, lease_ms, interval_ms),
                heartbeats: Vec::new(),
                routing_calls: 0,
                routing_calls_down: 0,
                known_versions: Vec::new(),
                known_shard_counts: Vec::new(),
                reads_shard_count: true,
                fences: BTreeMap::new(),
            }),
        }
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

pub(crate) fn routing(
    group: &GroupId,
    version: u64,
    shard_count: u32,
    ttl_ms: u64,
    interval_ms: u64,
) -> RoutingResponse {
    RoutingResponse {
        metadata_version_proof: None,
        shard_count_proof: None,
        group: group.clone(),
        metadata_version: version,
        shard_count,
        stream_keys: (0..shard_count).map(|s| group.stream_key(s)).collect(),
        routing_cache_ttl_ms: ttl_ms,
        routing_refresh_interval_ms: interval_ms,
        store_revision: version,
        lost_version: None,
        accepts_known_shard_count: true,
    }
}

impl CoordinatorTransport for FakeCoordinator {
    async fn heartbeat(&self, req: HeartbeatRequest) -> Result<HeartbeatResponse, TransportError> {
        self.with(|s| {
            if !s.up {
                return Err(TransportError::Unreachable("fake coordinator is down".into()));
            }
            s.heartbeats.push(req.clone());
            let assigned =
                if req.leave { Vec::new() } else { s.assigned.get(&req.member_id).cloned().unwrap_or_default() };
            let fences = assigned
                .iter()
                .filter_map(|&shard| s.fences.get(&shard).map(|&fence| ShardFence { shard, fence }))
                .collect();
            let revoke: Vec<ShardId> = req.owned.iter().copied().filter(|shard| !assigned.contains(shard)).collect();
            // One revoke instruction per shard, named after it: the fake records no history.
            let drains = revoke.iter().map(|&shard| Drain { shard, revoke_id: u64::from(shard) + 1 }).collect();
            Ok(HeartbeatResponse {
                metadata_version_proof: None,
                status: HeartbeatStatus::Ok,
                member_id: req.member_id.clone(),
                member_epoch: if req.leave { 0 } else { req.member_epoch.max(1) },
                metadata_version: s.routing.metadata_version,
                assignment_epoch: 1,
                shard_count: s.routing.shard_count,
                assigned,
                pending: Vec::new(),
                revoke,
                drains,
                assignment_lease_ms: s.assignment_lease_ms,
                heartbeat_interval_ms: s.heartbeat_interval_ms,
                store_revision: 1,
                fences,
            })
        })
    }

    async fn routing(&self, _group: &GroupId, report: RoutingReport) -> Result<RoutingResponse, TransportError> {
        self.with(|s| {
            if !s.up {
                s.routing_calls_down += 1;
                return Err(TransportError::Unreachable("fake coordinator is down".into()));
            }
            s.routing_calls += 1;
            s.known_versions.push(report.known_version);
            s.known_shard_counts.push(report.known_shard_count);
            if !s.reads_shard_count && report.known_shard_count > 0 {
                return Err(ApiError::new(ErrorCode::BadRequest, "unknown field `knownShardCount`").into());
            }
            let known_version = report.known_version;
            let mut routing = s.routing.clone();
            routing.accepts_known_shard_count = s.reads_shard_count;
            if known_version > routing.metadata_version {
                routing.lost_version = Some(known_version);
            }
            Ok(routing)
        })
    }
}
