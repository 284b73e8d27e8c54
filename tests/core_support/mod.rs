//! A pure test world for the decision core: one recorded state (with its write history, so tests
//! can roll the store back), liveness counters, and one coordinator's observation view with a
//! manual clock. No I/O and no async: every step is a call into the pure core.

#![allow(dead_code)]

use std::collections::BTreeMap;

use rsc::core::fence::{attach_fences, unfenced_grants, CarriesFences};
use rsc::core::index::MemberShards;
use rsc::core::model::{Fence, GroupConfig, GroupId, GroupMetadata, LossEvidence, MemberId, RevokeId, ShardId};
use rsc::core::proof::{Fact, ViewKey, ViewProof};
use rsc::core::protocol::{
    AdminRequest, ApiError, HeartbeatRequest, HeartbeatResponse, MemberSession, RevokeReport, RoutingReport,
    RoutingResponse,
};
use rsc::core::{
    decide_admin, decide_evidence, decide_heartbeat, decide_heartbeat_indexed, decide_routing, decide_tick, Context,
    Creation, Decision, GroupIndex, LocalView,
};

/// The view-proof key of every test world's group (DESIGN §8); tests that forge proofs use
/// another.
pub fn test_view_key() -> ViewKey {
    ViewKey::from_bytes([0x5a; 32])
}

pub fn group_id() -> GroupId {
    GroupId::new("orders", "billing")
}

/// Short leases so tests read easily: lease 8 s, member TTL 10 s, heartbeat 1 s, rebalance 30 s.
pub fn config() -> GroupConfig {
    GroupConfig::default()
}

pub struct World {
    pub g: GroupMetadata,
    pub revision: u64,
    pub now_ms: u64,
    pub view: LocalView,
    pub liveness: BTreeMap<MemberId, u64>,
    /// Every recorded (state, revision), oldest first.
    pub history: Vec<(GroupMetadata, u64)>,
    /// Count of writes refused because a liveness guard failed.
    pub guard_failures: u64,
    /// Deliberate mistakes (negative tests of the checkers).
    pub planted: rsc::core::PlantedBugs,
    /// Source of each decision's nonce: a counter never repeats, which is all the core needs of it.
    pub nonces: u64,
    /// The shards' fence counters (the fence keys at "Redis").
    pub fence_counters: BTreeMap<ShardId, u64>,
    /// The key the service would hand a decision on a keyless group (none by default).
    pub fresh_view_key: Option<rsc::core::proof::ViewKey>,
}

impl World {
    pub fn new(shard_count: u32) -> Self {
        Self::with_config(shard_count, config())
    }

    pub fn with_config(shard_count: u32, config: GroupConfig) -> Self {
        let create = AdminRequest::CreateGroup { group: group_id(), shard_count, config };
        let obs = Default::default();
        let ctx = Context {
            fresh_view_key: Some(test_view_key()),
            wall_clock_secs: 0,
            stored_revision: 0,
            observations: &obs,
            planted: Default::default(),
            nonce: 1,
        };
        let decision = decide_admin(None, &create, Creation::Plain, ctx);
        let g = decision.write.next.expect("create writes");
        g.validate().expect("valid");
        Self {
            history: vec![(g.clone(), 1)],
            g,
            revision: 1,
            now_ms: 0,
            view: LocalView::default(),
            liveness: BTreeMap::new(),
            guard_failures: 0,
            planted: Default::default(),
            nonces: 1,
            fence_counters: BTreeMap::new(),
            fresh_view_key: None,
        }
    }

    fn nonce(&mut self) -> u64 {
        self.nonces += 1;
        self.nonces
    }

    pub fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
    }

    /// Applies a decision's write (if its guards hold) and returns whether it was recorded. Like the
    /// coordinator, it first raises a fence for every grant that needs one (a per-shard counter
    /// here, with the decision counter as nonce) and derives the answer again from the result.
    fn apply<R: CarriesFences>(&mut self, decision: &mut Decision<R>) -> bool {
        if let Some(next) = decision.write.next.as_mut() {
            let mut raised = BTreeMap::new();
            for shard in unfenced_grants(next) {
                let counter = self.fence_counters.entry(shard).or_default();
                *counter += 1;
                raised.insert(shard, Fence { counter: *counter, nonce: self.nonces });
            }
            if !raised.is_empty() {
                attach_fences(next, &raised);
                if let Ok(answer) = decision.outcome.as_mut() {
                    answer.refresh_fences(next);
                }
            }
        }
        let Some(next) = &decision.write.next else { return false };
        for (member, value) in &decision.write.liveness_guards {
            if self.liveness.get(member).copied().unwrap_or(0) != *value {
                self.guard_failures += 1;
                return false;
            }
        }
        next.validate().unwrap_or_else(|e| panic!("invalid state recorded: {e}\n{next:#?}"));
        for member in &decision.write.liveness_remove {
            self.liveness.remove(member);
        }
        self.g = next.clone();
        self.revision += 1;
        self.history.push((self.g.clone(), self.revision));
        // The writer starts its observation windows the moment its write is recorded.
        self.view.observe(self.now_ms, &self.g, None);
        true
    }

    /// Processes a heartbeat as the service would: touch liveness, observe, decide, record.
    pub fn heartbeat(&mut self, req: &HeartbeatRequest) -> Result<HeartbeatResponse, ApiError> {
        *self.liveness.entry(req.member_id.clone()).or_default() += 1;
        let obs = self.view.observe(self.now_ms, &self.g, None);
        let ctx = Context {
            fresh_view_key: self.fresh_view_key,
            wall_clock_secs: 0,
            stored_revision: self.revision,
            observations: &obs,
            planted: self.planted,
            nonce: self.nonce(),
        };
        let mut decision = decide_heartbeat(&self.g, req, ctx);
        // The coordinator answers steady heartbeats from the state's per-member index: every
        // heartbeat of every scenario and property test is decided both ways here.
        let index = GroupIndex::build(&self.g);
        assert_eq!(
            decide_heartbeat_indexed(&self.g, Some(&index), req, ctx),
            decision,
            "the index answers as the scan does"
        );
        for member in self.g.members.keys() {
            assert_eq!(index.member(member), MemberShards::scan(&self.g, member), "{member}'s shards");
        }
        let decided_write = decision.write.next.is_some();
        let recorded = self.apply(&mut decision);
        assert!(!decided_write || recorded, "heartbeat decisions carry no liveness guards: they always record");
        if let Ok(response) = &decision.outcome {
            assert_eq!(response.store_revision, self.revision, "the response names the recorded revision");
        }
        decision.outcome
    }

    /// Runs one tick with a fresh liveness read.
    pub fn tick(&mut self) {
        let obs = self.view.observe(self.now_ms, &self.g, Some(&self.liveness));
        let ctx = Context {
            fresh_view_key: self.fresh_view_key,
            wall_clock_secs: 0,
            stored_revision: self.revision,
            observations: &obs,
            planted: self.planted,
            nonce: self.nonce(),
        };
        let mut decision = decide_tick(&self.g, ctx);
        self.apply(&mut decision);
    }

    pub fn admin(&mut self, req: &AdminRequest) -> Result<rsc::core::protocol::AdminResponse, ApiError> {
        let obs = self.view.observe(self.now_ms, &self.g, None);
        let ctx = Context {
            fresh_view_key: self.fresh_view_key,
            wall_clock_secs: 0,
            stored_revision: self.revision,
            observations: &obs,
            planted: self.planted,
            nonce: self.nonce(),
        };
        let mut decision = decide_admin(Some(&self.g), req, Creation::Plain, ctx);
        self.apply(&mut decision);
        decision.outcome
    }

    /// The proof this group's key gives of `fact = value`: what a client that really saw the
    /// number holds (an honest report from a lost history).
    pub fn proof(&self, fact: Fact, value: u64) -> Option<ViewProof> {
        self.g.view_key.map(|key| key.prove(&self.g.group, fact, value))
    }

    /// Processes a producer's routing refresh reporting `known_version`, as the service would.
    pub fn routing(&mut self, known_version: u64) -> Result<RoutingResponse, ApiError> {
        self.routing_report(RoutingReport::version(known_version))
    }

    /// Processes a producer's routing refresh reporting `report`, as the service would.
    pub fn routing_report(&mut self, report: RoutingReport) -> Result<RoutingResponse, ApiError> {
        let obs = self.view.observe(self.now_ms, &self.g, None);
        let ctx = Context {
            fresh_view_key: self.fresh_view_key,
            wall_clock_secs: 0,
            stored_revision: self.revision,
            observations: &obs,
            planted: self.planted,
            nonce: self.nonce(),
        };
        let mut decision = decide_routing(&self.g, report, ctx);
        self.apply(&mut decision);
        decision.outcome
    }

    /// The store loses its last `k` writes. `failover`: the coordinator sees the identity change,
    /// resets its windows and records a correction round.
    pub fn rollback(&mut self, k: usize, failover: bool) {
        let keep = self.history.len().saturating_sub(k).max(1);
        self.history.truncate(keep);
        let (g, revision) = self.history.last().cloned().expect("history keeps the create");
        self.g = g;
        self.revision = revision;
        if failover {
            self.view.reset_all();
            let obs = self.view.observe(self.now_ms, &self.g, None);
            let ctx = Context {
                fresh_view_key: self.fresh_view_key,
                wall_clock_secs: 0,
                stored_revision: self.revision,
                observations: &obs,
                planted: self.planted,
                nonce: self.nonce(),
            };
            let mut decision = decide_evidence(&self.g, LossEvidence::StoreIdentityChanged, ctx);
            self.apply(&mut decision);
        }
    }
}

/// A minimal protocol-faithful consumer used by the core tests (the real one is `rsc::client`).
#[derive(Clone, Debug)]
pub struct Client {
    pub id: MemberId,
    pub epoch: u64,
    pub version: u64,
    pub assignment_epoch: u64,
    /// Shards it reads while `now < lease_end_ms`.
    pub reading: std::collections::BTreeSet<ShardId>,
    /// Shards it is draining; drained ones are reported REVOKED.
    pub revoking: std::collections::BTreeSet<ShardId>,
    /// The revoke instruction behind each draining shard, named in its REVOKED report.
    pub drains: BTreeMap<ShardId, RevokeId>,
    pub lease_end_ms: u64,
    /// This client process's member session secret (derived from its id: deterministic).
    pub session: MemberSession,
    /// The last answer's proof of `version`, sent back with it.
    pub proof: Option<ViewProof>,
}

/// A well-formed session secret derived from `id` (the tests need no randomness).
pub fn session_of(id: &str) -> MemberSession {
    let hex: String = id.bytes().map(|b| format!("{b:02x}")).collect();
    MemberSession(format!("{hex:0>32}").chars().take(64).collect())
}

impl Client {
    pub fn new(id: &str) -> Self {
        Self {
            id: id.into(),
            epoch: 0,
            version: 0,
            assignment_epoch: 0,
            reading: Default::default(),
            revoking: Default::default(),
            drains: BTreeMap::new(),
            lease_end_ms: 0,
            session: session_of(id),
            proof: None,
        }
    }

    /// The heartbeat it would send now (drains finish instantly: revoking shards report REVOKED).
    pub fn request(&self) -> HeartbeatRequest {
        HeartbeatRequest {
            metadata_version_proof: self.proof,
            group: group_id(),
            member_id: self.id.clone(),
            member_epoch: self.epoch,
            metadata_version: self.version,
            assignment_epoch: self.assignment_epoch,
            owned: self.reading.iter().copied().collect(),
            revoking: self
                .revoking
                .iter()
                .map(|&shard| {
                    let revoke_id = self.drains.get(&shard).copied();
                    RevokeReport { shard, in_flight: 0, revoked: true, revoke_id }
                })
                .collect(),
            leave: false,
            member_session: Some(self.session.clone()),
            fenced: Vec::new(),
        }
    }

    pub fn leave_request(&self) -> HeartbeatRequest {
        HeartbeatRequest { leave: true, ..self.request() }
    }

    /// Applies a response to the request sent at `sent_at_ms` (the lease counts from the send),
    /// received at `now_ms`. Like the real consumer, shards stop when the lease ends, before any
    /// answer is applied: REVOKE_PENDING / SYNC_METADATA keep only shards still being read, and a
    /// late answer cannot revive a shard whose lease ran out while it was in flight.
    pub fn apply(&mut self, now_ms: u64, sent_at_ms: u64, result: &Result<HeartbeatResponse, ApiError>) {
        use rsc::core::protocol::HeartbeatStatus;
        if now_ms >= self.lease_end_ms {
            self.reading.clear();
        }
        match result {
            Ok(r) => {
                let assigned: std::collections::BTreeSet<ShardId> = r.assigned.iter().copied().collect();
                self.reading = match r.status {
                    HeartbeatStatus::Ok => assigned,
                    HeartbeatStatus::RevokePending | HeartbeatStatus::SyncMetadata => {
                        self.reading.intersection(&assigned).copied().collect()
                    }
                };
                // Drains finish at once in this model; keep reporting REVOKED while still listed.
                self.revoking = r.revoke.iter().copied().filter(|s| !self.reading.contains(s)).collect();
                self.drains = r.drains.iter().map(|d| (d.shard, d.revoke_id)).collect();
                self.epoch = r.member_epoch;
                self.version = r.metadata_version;
                self.proof = r.metadata_version_proof;
                self.assignment_epoch = r.assignment_epoch;
                self.lease_end_ms = sent_at_ms + r.assignment_lease_ms;
            }
            Err(e)
                if matches!(
                    e.code,
                    rsc::core::protocol::ErrorCode::UnknownMember | rsc::core::protocol::ErrorCode::FencedMemberEpoch
                ) =>
            {
                self.reading.clear();
                self.revoking.clear();
                self.drains.clear();
                self.epoch = 0;
            }
            Err(_) => {}
        }
    }

    /// Shards it may read at `now_ms` (fail closed at lease end).
    pub fn reads_at(&self, now_ms: u64) -> std::collections::BTreeSet<ShardId> {
        if now_ms < self.lease_end_ms {
            self.reading.clone()
        } else {
            Default::default()
        }
    }
}

/// The id of the revoke recorded for `shard`, if it is draining.
pub fn recorded_revoke_id(g: &GroupMetadata, shard: ShardId) -> Option<RevokeId> {
    match g.current.get(&shard) {
        Some(rsc::core::model::ShardOwner::Revoking { revoke_id, .. }) => *revoke_id,
        _ => None,
    }
}

/// Sends a heartbeat from `client` at the world's current time and applies the response.
pub fn beat(world: &mut World, client: &mut Client) -> Result<HeartbeatResponse, ApiError> {
    let sent = world.now_ms;
    let result = world.heartbeat(&client.request());
    client.apply(world.now_ms, sent, &result);
    result
}
