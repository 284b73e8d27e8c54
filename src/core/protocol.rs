//! Wire types of the coordinator protocol: what consumers, producers and operators send, and the
//! responses derived from recorded metadata. Shared by the HTTP edge, the client libraries and the
//! simulation, so production and simulation speak exactly the same protocol.
//!
//! Every successful response names the `storeRevision` it was derived from; the simulation's
//! recorded-response checker uses it to prove no decision was ever sent that was not in the store.

use serde::{Deserialize, Serialize};

use super::fence::ShardFence;
use super::model::{GroupConfig, GroupId, MemberId, RevokeId, ShardId};
use super::proof::ViewProof;

/// A consumer's report on one shard it is draining.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevokeReport {
    pub shard: ShardId,
    /// Entries read but not yet acknowledged on this shard.
    pub in_flight: u32,
    /// True once the consumer stopped reading and has no in-flight work (`REVOKED`).
    pub revoked: bool,
    /// The revoke instruction this report answers (`HeartbeatResponse::drains`). A REVOKED report
    /// releases the shard only when this names the revoke recorded now: a report that arrives
    /// late or twice, after the revoke was cancelled and issued again, releases nothing. Absent
    /// from clients that predate revoke ids: such a report never releases a shard (the shard waits
    /// for the rebalance timeout instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoke_id: Option<RevokeId>,
}

/// A member session secret: 32 to 128 lowercase hex digits, drawn by the client process from the
/// OS (`MemberSession::generate`: 128 bits). Never logged: `Debug` shows only its length.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MemberSession(pub String);

impl MemberSession {
    /// Shortest and longest accepted secret, in hex digits.
    pub const LEN_MIN: usize = 32;
    pub const LEN_MAX: usize = 128;

    /// A fresh secret from the OS's random source (madsim's deterministic one in the simulation).
    pub fn generate() -> Self {
        let mut bytes = [0u8; 16];
        // safe: getrandom fails only when the OS has no random source at all; a coordinator
        // client without one cannot run safely, and says so.
        getrandom::fill(&mut bytes).expect("the OS random source is available");
        Self(base16ct::lower::encode_string(&bytes))
    }

    /// True for 32..=128 lowercase hex digits.
    pub fn is_well_formed(&self) -> bool {
        (Self::LEN_MIN..=Self::LEN_MAX).contains(&self.0.len())
            && self.0.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }

    /// The digest the coordinator records (SHA-256, hex): the secret itself is never stored.
    pub fn digest(&self) -> SessionDigest {
        use sha2::{Digest, Sha256};
        let hash = Sha256::digest(self.0.as_bytes());
        SessionDigest(base16ct::lower::encode_string(&hash))
    }
}

impl std::fmt::Debug for MemberSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemberSession(<{} hex digits>)", self.0.len())
    }
}

/// The recorded SHA-256 digest of a member session secret (hex).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionDigest(pub String);

impl SessionDigest {
    /// Whether `session` is the secret behind this digest, compared in constant time.
    pub fn admits(&self, session: Option<&MemberSession>) -> bool {
        use subtle::ConstantTimeEq;
        session.is_some_and(|s| bool::from(s.digest().0.as_bytes().ct_eq(self.0.as_bytes())))
    }
}

/// A consumer heartbeat: join (`memberEpoch == 0`), steady, revoke reports, or leave.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeartbeatRequest {
    pub group: GroupId,
    pub member_id: MemberId,
    /// 0 to join (or rejoin as a new incarnation).
    pub member_epoch: u64,
    /// The highest metadataVersion this client has observed.
    pub metadata_version: u64,
    pub assignment_epoch: u64,
    /// Shards the consumer is currently allowed to read.
    #[serde(default)]
    pub owned: Vec<ShardId>,
    /// Shards the consumer is draining, with REVOKED acks.
    #[serde(default)]
    pub revoking: Vec<RevokeReport>,
    /// True on the final heartbeat of a clean leave (after every shard was reported REVOKED).
    #[serde(default)]
    pub leave: bool,
    /// The member session secret this client process drew (hex, see [`MemberSession`]): sent with
    /// every heartbeat, the join included. The coordinator records only its digest; a heartbeat of
    /// a member whose record holds one must present the secret (DESIGN §9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_session: Option<MemberSession>,
    /// Shards whose stream operations Redis refused as `FENCED` although the member held them
    /// with exactly this fence (DESIGN §10): the recorded fence is no longer the one at Redis (a
    /// newer value whose grant was never recorded, or a rollback), so the coordinator raises a new
    /// one for the same owner. A report whose fence is not the recorded one changes nothing. Sent
    /// only when non-empty, and only to coordinators whose answers carry fences (older ones refuse
    /// unknown fields).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fenced: Vec<ShardFence>,
    /// The proof an answer gave of `metadataVersion` ([`HeartbeatResponse::metadata_version_proof`]).
    /// A version above the stored one is evidence of lost writes only with a proof that verifies
    /// (DESIGN §4, §8). Sent only when an answer gave one (older coordinators give none and
    /// refuse unknown fields).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_version_proof: Option<ViewProof>,
}

/// Status of a successful heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HeartbeatStatus {
    /// The consumer may read every shard in `assigned` (the only status that lets it start new ones).
    Ok,
    /// The client saw a newer version than the store holds: apply this view as the truth, keep only
    /// shards already being read that are still in `assigned`, drain the rest, heartbeat again.
    SyncMetadata,
    /// Keep reading the assigned shards already being read; drain `revoke`; start nothing new.
    RevokePending,
}

/// A heartbeat's successful response, derived from recorded metadata only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatResponse {
    pub status: HeartbeatStatus,
    pub member_id: MemberId,
    pub member_epoch: u64,
    pub metadata_version: u64,
    pub assignment_epoch: u64,
    pub shard_count: u32,
    /// Shards the member owns (readable under `OK`; keepable under the other statuses).
    pub assigned: Vec<ShardId>,
    /// Target shards it will get once their previous owners release them.
    pub pending: Vec<ShardId>,
    /// Shards to stop reading, drain, and report REVOKED.
    pub revoke: Vec<ShardId>,
    /// The revoke instruction behind each shard of `revoke` (in shard order; a shard revoked by a
    /// binary that predates revoke ids has none). The REVOKED report must name it.
    #[serde(default)]
    pub drains: Vec<Drain>,
    pub assignment_lease_ms: u64,
    pub heartbeat_interval_ms: u64,
    /// The store revision this response was derived from.
    pub store_revision: u64,
    /// The fence of every shard in `assigned` and `revoke` that has one (DESIGN §10), in shard
    /// order: the member's stream operations on that shard must present it. A shard without one
    /// is read unfenced (fencing off for the group, or granted by a binary that predates fences).
    /// Absent from older coordinators.
    #[serde(default)]
    pub fences: Vec<ShardFence>,
    /// Proof that this deployment recorded `metadataVersion` for this group: the client sends it
    /// back with that version. Absent from older coordinators and for groups without a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_version_proof: Option<ViewProof>,
}

impl HeartbeatResponse {
    /// REVOKED reports for every shard of `revoke`, each naming its instruction: what a client
    /// with nothing in flight sends next.
    /// The first drain of each shard answers for it, looked up in a map (a linear search per shard
    /// was quadratic: 10^9 steps for half of a 65,536-shard group; a scale review).
    pub fn revoked_reports(&self) -> Vec<RevokeReport> {
        let mut drains = std::collections::BTreeMap::new();
        for drain in &self.drains {
            drains.entry(drain.shard).or_insert(drain.revoke_id);
        }
        self.revoke
            .iter()
            .map(|&shard| RevokeReport { shard, in_flight: 0, revoked: true, revoke_id: drains.get(&shard).copied() })
            .collect()
    }
}

/// One revoke instruction: drain `shard` and report REVOKED naming `revoke_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Drain {
    pub shard: ShardId,
    pub revoke_id: RevokeId,
}

/// Producer routing view (seed: "Producer Routing During Failures").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutingResponse {
    pub group: GroupId,
    pub metadata_version: u64,
    pub shard_count: u32,
    /// `<streamPrefix>:<shard>` for every shard, in shard order.
    pub stream_keys: Vec<String>,
    pub routing_cache_ttl_ms: u64,
    pub routing_refresh_interval_ms: u64,
    pub store_revision: u64,
    /// The request's `knownVersion` when it is above the stored metadataVersion: that version came
    /// from writes the store has lost, so this (older) view is the truth and a producer whose
    /// cache holds exactly that version adopts it at once, instead of publishing on a lost view
    /// until its cache lease ends. The coordinator records the report as loss evidence (a
    /// correction round). `null` otherwise.
    #[serde(default)]
    pub lost_version: Option<u64>,
    /// This coordinator reads `knownShardCount` in routing requests; a producer sends it only
    /// after an answer said so, because an older coordinator refuses unknown query parameters
    /// (DESIGN §6, rule 2). Absent (false) from older coordinators.
    #[serde(default)]
    pub accepts_known_shard_count: bool,
    /// Proofs that this deployment recorded `metadataVersion` and `shardCount` for this group
    /// (DESIGN §8): a producer reports them with `knownVersion` and `knownShardCount`. Absent from
    /// older coordinators and for groups without a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_version_proof: Option<ViewProof>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_count_proof: Option<ViewProof>,
}

/// What a producer reports with a routing request (`0`: nothing to report).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutingReport {
    /// The metadataVersion of the producer's cached view.
    pub known_version: u64,
    /// The highest shard count this producer published with. Above the recorded count, it is
    /// evidence of a lost `add-shards` whose shards hold acknowledged entries (DESIGN §8).
    pub known_shard_count: u32,
    /// The proofs the coordinator gave of those numbers: a report above the recorded state is
    /// evidence only with a proof that verifies (DESIGN §8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_version_proof: Option<ViewProof>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_shard_count_proof: Option<ViewProof>,
}

impl RoutingReport {
    /// Nothing cached, nothing published.
    pub const NONE: RoutingReport = RoutingReport {
        known_version: 0,
        known_shard_count: 0,
        known_version_proof: None,
        known_shard_count_proof: None,
    };

    pub fn version(known_version: u64) -> Self {
        Self { known_version, ..Self::NONE }
    }

    /// The report with its proofs: for tests and clients that hold them.
    pub fn proven(self, version: Option<ViewProof>, shard_count: Option<ViewProof>) -> Self {
        Self { known_version_proof: version, known_shard_count_proof: shard_count, ..self }
    }
}

/// Admin mutations; every one but `CreateGroup` carries the store revision it was computed from and
/// fails with `REVISION_CONFLICT` if the metadata moved on (never a silent overwrite).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", deny_unknown_fields)]
pub enum AdminRequest {
    #[serde(rename_all = "camelCase")]
    CreateGroup { group: GroupId, shard_count: u32, config: GroupConfig },
    #[serde(rename_all = "camelCase")]
    AddShards { group: GroupId, expected_revision: u64, new_shard_count: u32 },
    #[serde(rename_all = "camelCase")]
    ChangeConfig { group: GroupId, expected_revision: u64, config: GroupConfig },
    #[serde(rename_all = "camelCase")]
    DeleteGroup { group: GroupId, expected_revision: u64 },
}

impl AdminRequest {
    pub fn group(&self) -> &GroupId {
        match self {
            AdminRequest::CreateGroup { group, .. }
            | AdminRequest::AddShards { group, .. }
            | AdminRequest::ChangeConfig { group, .. }
            | AdminRequest::DeleteGroup { group, .. } => group,
        }
    }
}

/// Result of a successful admin mutation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdminResponse {
    pub group: GroupId,
    /// Revision written (0 after a delete).
    pub store_revision: u64,
    pub metadata_version: u64,
}

/// Typed error codes of `DESIGN.md`, shared by every edge. The HTTP status of each is fixed by
/// [`ErrorCode::http_status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// The member id is not recorded: stop reading every shard and rejoin with epoch 0.
    UnknownMember,
    /// The request's member epoch is stale or the member was fenced: stop every shard, rejoin.
    FencedMemberEpoch,
    /// No such group is recorded (and none is known to have existed).
    GroupNotFound,
    /// The metadata key of a group that is known to exist is gone: fail closed, nothing rebuilt.
    MetadataMissing,
    /// The stored metadata has an unknown schema/layout version or cannot be parsed.
    MetadataIncompatible,
    /// The store is unreachable, timed out, or rejected a command.
    StoreUnavailable,
    /// This coordinator is shutting down; retry against another instance (HTTP 503).
    CoordinatorTerminating,
    /// The request is malformed or violates a limit.
    BadRequest,
    /// An admin mutation's expected revision does not match the stored one.
    RevisionConflict,
    /// The group already exists (create).
    GroupExists,
    /// A delete of a group that still has members, held shards or a correction round: retry once
    /// its members have left or expired and their leases have run out (Kafka's `GROUP_NOT_EMPTY`).
    GroupNotEmpty,
    /// Missing or wrong admin token, or a data-plane request without a valid client token.
    Unauthorized,
    /// A valid client token that may not touch this group.
    Forbidden,
    /// The heartbeat does not carry the session secret of the member incarnation it names (a
    /// forged or misdirected request): nothing was recorded, liveness included.
    SessionMismatch,
    /// A join names a member id whose live incarnation belongs to another process (another
    /// session): retry once that incarnation has left or expired (at most `memberLeaseTtlMs`).
    MemberIdInUse,
    /// A bug in the coordinator (e.g. it refused to record a state that failed validation).
    /// Nothing was written; the body never carries internals.
    Internal,
}

impl ErrorCode {
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::UnknownMember | ErrorCode::FencedMemberEpoch => 409,
            ErrorCode::GroupNotFound => 404,
            ErrorCode::RevisionConflict | ErrorCode::GroupExists | ErrorCode::GroupNotEmpty => 409,
            ErrorCode::BadRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden | ErrorCode::SessionMismatch => 403,
            ErrorCode::MemberIdInUse => 409,
            ErrorCode::MetadataMissing | ErrorCode::MetadataIncompatible | ErrorCode::Internal => 500,
            ErrorCode::StoreUnavailable | ErrorCode::CoordinatorTerminating => 503,
        }
    }

    /// True when the client should retry the same request later (possibly elsewhere).
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::StoreUnavailable
                | ErrorCode::CoordinatorTerminating
                | ErrorCode::RevisionConflict
                | ErrorCode::MemberIdInUse
                | ErrorCode::GroupNotEmpty
        )
    }
}

/// An error response body: a code and a human-readable message that never leaks internals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "camelCase")]
#[error("{code:?}: {message}")]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}
