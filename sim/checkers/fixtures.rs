//! Hand-built ground truth for the checkers' unit tests: a tiny plan and helpers that append the
//! records a run would produce (grants, reads, adds, stored states, faults).

use std::path::Path;

use rsc::client::TransportError;
use rsc::core::model::{GroupConfig, GroupId, GroupMetadata, Member, MemberState, ShardId, ShardOwner};
use rsc::core::protocol::{
    AdminRequest, AdminResponse, ApiError, ErrorCode, HeartbeatRequest, HeartbeatResponse, HeartbeatStatus,
    RoutingReport, RoutingResponse,
};
use rsc::store::memory::{HistoryEvent, HistoryKind};
use rsc::store::{EntryId, StoredRecord};

use super::{Facts, SplitBrain};
use crate::plan::{NodeRef, Plan, PlanSpec, Role};
use crate::records::{
    AddEvent, AdminCall, CoordinatorCall, Lifecycle, Mark, ProcessId, Processing, ReadEvent, ReadKind, Records, Us,
};

/// Cadence bound of this plan: 2 * (50 + 50) + 4 * 10 + 500 = 740 ms.
const PLAN: &str = r#"
    name = "fixture"
    [topology]
    coordinators = 1
    consumers = 2
    producers = 1
    shards = 4
    [workload]
    poll_interval_ms = 50
    processing_max_ms = 50
    [tuning]
    latency_max_ms = 10
    store_timeout_ms = 500
    [durations]
    run_ms = 60000
    heal_ms = 20000
    liveness_bound_ms = 20000
"#;

pub struct World {
    pub plan: Plan,
    pub group: GroupId,
    pub records: Records,
    pub history: Vec<HistoryEvent>,
    pub split_brains: Vec<SplitBrain>,
    next_entry: u64,
}

impl World {
    pub fn new() -> Self {
        let plan = PlanSpec::parse(PLAN, Path::new("fixture.toml")).unwrap().draw(0).unwrap();
        Self {
            plan,
            group: GroupId::new("sim", "g"),
            records: Records::default(),
            history: Vec::new(),
            split_brains: Vec::new(),
            next_entry: 1,
        }
    }

    pub fn facts(&self) -> Facts<'_> {
        Facts {
            plan: &self.plan,
            group: &self.group,
            records: &self.records,
            history: &self.history,
            end_us: 60_000_000,
            store_reads: &[],
            store_acks: &[],
            fence_refusals: 0,
            split_brains: &self.split_brains,
        }
    }

    pub fn deadline_us(&self) -> Us {
        self.plan.durations.live_by_ms() * 1_000
    }

    fn process(&mut self, role: Role, index: u32) -> ProcessId {
        let process = ProcessId { node: NodeRef::new(role, index), incarnation: 0 };
        self.records.lifecycles.push(Lifecycle { process, started_at_us: 0, stopped_at_us: None, paused: vec![] });
        process
    }

    pub fn consumer(&mut self, index: u32) -> ProcessId {
        self.process(Role::Consumer, index)
    }

    pub fn producer(&mut self, index: u32) -> ProcessId {
        self.process(Role::Producer, index)
    }

    fn lifecycle(&mut self, p: ProcessId) -> &mut Lifecycle {
        self.records.lifecycles.iter_mut().find(|l| l.process == p).unwrap()
    }

    pub fn kill(&mut self, p: ProcessId, at_us: Us) {
        self.lifecycle(p).stopped_at_us = Some(at_us);
    }

    pub fn revive_and_keep(&mut self, p: ProcessId) {
        self.lifecycle(p).stopped_at_us = None;
    }

    pub fn pause(&mut self, p: ProcessId, from_us: Us, to_us: Us) {
        self.lifecycle(p).paused.push((from_us, Some(to_us)));
    }

    fn heartbeat(&mut self, p: ProcessId, sent: Us, received: Us, answer: Result<HeartbeatResponse, TransportError>) {
        let request = HeartbeatRequest {
            metadata_version_proof: None,
            group: self.group.clone(),
            member_id: p.node.to_string(),
            member_epoch: 1,
            metadata_version: answer.as_ref().map_or(1, |r| r.metadata_version),
            assignment_epoch: 1,
            owned: vec![],
            revoking: vec![],
            leave: false,
            member_session: None,
            fenced: Vec::new(),
        };
        let call = CoordinatorCall {
            process: p,
            request,
            sent_at_us: sent,
            received_at_us: Some(received),
            answer: Some(answer),
            hidden: false,
        };
        self.records.heartbeats.push(call);
    }

    fn response(&self, p: ProcessId, status: HeartbeatStatus, shards: &[ShardId], lease_ms: u64) -> HeartbeatResponse {
        HeartbeatResponse {
            metadata_version_proof: None,
            status,
            member_id: p.node.to_string(),
            member_epoch: 1,
            metadata_version: 1,
            assignment_epoch: 1,
            shard_count: 4,
            assigned: shards.to_vec(),
            pending: vec![],
            revoke: vec![],
            drains: vec![],
            assignment_lease_ms: lease_ms,
            heartbeat_interval_ms: 1_000,
            store_revision: 1,
            fences: Vec::new(),
        }
    }

    /// A successful answer with `status`, sent at `at_us`, received 1 ms later.
    pub fn answer(&mut self, p: ProcessId, at_us: Us, status: HeartbeatStatus, shards: &[ShardId], lease_ms: u64) {
        let resp = self.response(p, status, shards, lease_ms);
        self.heartbeat(p, at_us, at_us + 1_000, Ok(resp));
    }

    pub fn grant(&mut self, p: ProcessId, at_us: Us, shards: &[ShardId], lease_ms: u64) {
        self.answer(p, at_us, HeartbeatStatus::Ok, shards, lease_ms);
    }

    pub fn grant_slow(&mut self, p: ProcessId, sent: Us, received: Us, shards: &[ShardId], lease_ms: u64) {
        let resp = self.response(p, HeartbeatStatus::Ok, shards, lease_ms);
        self.heartbeat(p, sent, received, Ok(resp));
    }

    pub fn withdraw(&mut self, p: ProcessId, at_us: Us) {
        self.withdraw_to(p, at_us, &[]);
    }

    pub fn withdraw_to(&mut self, p: ProcessId, at_us: Us, keep: &[ShardId]) {
        self.answer(p, at_us, HeartbeatStatus::RevokePending, keep, 8_000);
    }

    pub fn fence(&mut self, p: ProcessId, at_us: Us) {
        let error = TransportError::Api(ApiError::new(ErrorCode::FencedMemberEpoch, "fenced"));
        self.heartbeat(p, at_us, at_us + 1_000, Err(error));
    }

    /// A successful answer received at `at_us` (sent 1 ms earlier).
    pub fn heartbeat_answer(&mut self, p: ProcessId, at_us: Us, resp: HeartbeatResponse) {
        self.heartbeat(p, at_us - 1_000, at_us, Ok(resp));
    }

    pub fn stream(&self, shard: ShardId) -> String {
        self.group.stream_key(shard)
    }

    pub fn reads(&mut self, p: ProcessId, shard: ShardId, range: std::ops::RangeInclusive<Us>, step: Us) {
        for at in range.step_by(usize::try_from(step).unwrap()) {
            self.read_ids(p, shard, at, &[]);
        }
    }

    pub fn read_ids(&mut self, p: ProcessId, shard: ShardId, at_us: Us, ids: &[EntryId]) {
        self.read_ids_on(NodeRef::REDIS, p, shard, at_us, ids);
    }

    /// A split brain whose old primary `redis-old-n` lived from `fork_us` to `switch_us` (no
    /// metadata of its own); returns its node.
    pub fn split_brain(&mut self, n: u32, fork_us: Us, switch_us: Us) -> NodeRef {
        let server = NodeRef::old_primary(n);
        self.split_brains.push(SplitBrain {
            server,
            fork_us,
            switch_us,
            fork_len: self.history.len(),
            history: self.history.clone(),
            store_reads: Vec::new(),
            store_acks: Vec::new(),
            fence_refusals: 0,
        });
        server
    }

    /// A read the Redis node `server` served (an old primary in a split brain).
    pub fn read_ids_on(&mut self, server: NodeRef, p: ProcessId, shard: ShardId, at_us: Us, ids: &[EntryId]) {
        self.records.reads.push(ReadEvent {
            process: p,
            server,
            consumer: p.node.to_string(),
            stream: self.stream(shard),
            kind: ReadKind::New,
            issued_at_us: at_us,
            served_at_us: at_us + 1_000,
            ids: ids.to_vec(),
        });
    }

    fn push_add(&mut self, p: ProcessId, shard: ShardId, at_us: Us, acknowledged: bool) -> EntryId {
        let id = EntryId { ms: self.next_entry, seq: 0 };
        self.next_entry += 1;
        self.records.adds.push(AddEvent {
            process: p,
            server: NodeRef::REDIS,
            stream: self.stream(shard),
            issued_at_us: at_us,
            served_at_us: at_us + 1_000,
            id,
            acknowledged_at_us: acknowledged.then_some(at_us + 2_000),
        });
        id
    }

    /// An acknowledged XADD the Redis node `server` ran, given the id it answered (a split brain's
    /// old primary can answer an id the primary also hands out).
    pub fn add_on(&mut self, server: NodeRef, p: ProcessId, shard: ShardId, at_us: Us, id: EntryId) {
        self.records.adds.push(AddEvent {
            process: p,
            server,
            stream: self.stream(shard),
            issued_at_us: at_us,
            served_at_us: at_us + 1_000,
            id,
            acknowledged_at_us: Some(at_us + 2_000),
        });
    }

    pub fn add(&mut self, p: ProcessId, shard: ShardId, at_us: Us) -> EntryId {
        self.push_add(p, shard, at_us, true)
    }

    pub fn add_unacknowledged(&mut self, p: ProcessId, shard: ShardId, at_us: Us) -> EntryId {
        self.push_add(p, shard, at_us, false)
    }

    pub fn process_entry(&mut self, p: ProcessId, shard: ShardId, id: EntryId, start: Us, end: Option<Us>) {
        self.push_processing(p, shard, id, (start, end), end.is_some());
    }

    /// A processing cancelled at `end` (its shard was lost): it did not process the entry.
    pub fn cancel_entry(&mut self, p: ProcessId, shard: ShardId, id: EntryId, start: Us, end: Us) {
        self.push_processing(p, shard, id, (start, Some(end)), false);
    }

    fn push_processing(
        &mut self,
        p: ProcessId,
        shard: ShardId,
        id: EntryId,
        (start_us, end_us): (Us, Option<Us>),
        completed: bool,
    ) {
        let stream = self.stream(shard);
        self.records.processing.push(Processing { process: p, stream, id, start_us, end_us, completed });
    }

    pub fn routing(&mut self, p: ProcessId, sent: Us, received: Us, ttl_ms: u64, shard_count: u32) {
        let resp = RoutingResponse {
            metadata_version_proof: None,
            shard_count_proof: None,
            group: self.group.clone(),
            metadata_version: 1,
            shard_count,
            stream_keys: (0..shard_count).map(|s| self.stream(s)).collect(),
            routing_cache_ttl_ms: ttl_ms,
            routing_refresh_interval_ms: ttl_ms / 2,
            store_revision: 1,
            lost_version: None,
            accepts_known_shard_count: true,
        };
        let call = CoordinatorCall {
            process: p,
            request: RoutingReport::NONE,
            sent_at_us: sent,
            received_at_us: Some(received),
            answer: Some(Ok(resp)),
            hidden: false,
        };
        self.records.routings.push(call);
    }

    /// Sets the metadata version of the last routing answer (default 1).
    pub fn set_last_routing_version(&mut self, version: u64) {
        if let Some(Some(Ok(resp))) = self.records.routings.last_mut().map(|call| call.answer.as_mut()) {
            resp.metadata_version = version;
        }
    }

    /// Sets the version the last routing answer declared lost (`lostVersion`).
    pub fn set_last_routing_lost_version(&mut self, version: u64) {
        if let Some(Some(Ok(resp))) = self.records.routings.last_mut().map(|call| call.answer.as_mut()) {
            resp.lost_version = Some(version);
        }
    }

    /// A routing refresh that reported `known_version`, answered.
    pub fn routing_reporting(&mut self, p: ProcessId, known_version: u64, sent: Us, received: Us) {
        self.routing(p, sent, received, 10_000, 1);
        if let Some(call) = self.records.routings.last_mut() {
            call.request = RoutingReport::version(known_version);
        }
    }

    /// From `at_us` on, `p`'s node's clock runs at `rate_ppm` (a `clock-drift` fault).
    pub fn clock_rate(&mut self, p: ProcessId, at_us: Us, rate_ppm: u64) {
        self.records.marks.push(Mark::ClockRate { node: p.node, at_us, rate_ppm });
    }

    pub fn silent_rollback(&mut self, at_us: Us) {
        self.records.marks.push(Mark::SilentRollback { at_us });
    }

    /// A consistent group where `member` owns (and is the target of) `shards`.
    pub fn group_with_member(&self, member: &str, shards: &[ShardId]) -> GroupMetadata {
        let mut g = GroupMetadata::new(self.group.clone(), 4, GroupConfig::default());
        g.members.insert(
            member.to_string(),
            Member {
                member_epoch: 1,
                incarnation_epoch: 1,
                state: MemberState::Active,
                joined_at_version: 1,
                session: None,
            },
        );
        for &shard in shards {
            g.target.insert(shard, member.to_string());
            g.current.insert(
                shard,
                ShardOwner::Owned { member: member.to_string(), since_assignment_epoch: 0, fence: None },
            );
        }
        g
    }

    /// Records `g` as written with `revision` at store time `at_ms`.
    pub fn store(&mut self, at_ms: u64, g: &GroupMetadata, revision: u64) {
        let record = StoredRecord {
            aggregate: serde_json::to_string(g).unwrap(),
            revision,
            schema_version: 1,
            layout_version: 1,
            updated_at_ms: at_ms,
            write_id: format!("w{}-{at_ms}", revision),
        };
        self.history.push(HistoryEvent {
            at_ms,
            kind: HistoryKind::Written { group: self.group.clone(), revision },
            metadata_after: vec![(self.group.clone(), Some(record))],
        });
    }

    pub fn store_group_with_member(&mut self, at_ms: u64, member: &str, shards: &[ShardId]) -> GroupMetadata {
        let g = self.group_with_member(member, shards);
        self.store(at_ms, &g, 1);
        g
    }

    pub fn delete_key(&mut self, at_ms: u64) {
        self.history.push(HistoryEvent {
            at_ms,
            kind: HistoryKind::KeyDeleted { group: self.group.clone() },
            metadata_after: vec![(self.group.clone(), None)],
        });
    }

    /// An admin create sent at `sent`, handled by a coordinator until `received` (or forever).
    pub fn admin_create(&mut self, sent: Us, received: Option<Us>) {
        let request =
            AdminRequest::CreateGroup { group: self.group.clone(), shard_count: 4, config: GroupConfig::default() };
        let answer =
            received.map(|_| Ok(AdminResponse { group: self.group.clone(), store_revision: 1, metadata_version: 1 }));
        let handled = vec![(sent + 1_000, received.map(|r| r - 1_000))];
        self.records.admins.push(AdminCall { request, sent_at_us: sent, received_at_us: received, answer, handled });
    }
}
