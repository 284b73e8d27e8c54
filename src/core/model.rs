//! The group metadata aggregate: everything the coordinator records in Redis for one consumer
//! group (`redis-stream:coord:{streamPrefix:consumerGroup}:metadata`, field `aggregate`).
//!
//! This module owns the *shape* of the recorded state and its structural invariants
//! ([`GroupMetadata::validate`]). It never performs I/O and never reads a clock.
//!
//! Decisions recorded here (filling the seed's gaps, see `DESIGN.md`):
//! - *Pending shards are derived, not stored*: a shard is pending for member `m` when the target
//!   assignment names `m` and the current assignment does not record `m` as owner. Storing it would
//!   be derivable state that can disagree with its source.
//! - *Shard stream keys are derived* from `streamPrefix` and the shard index (`<prefix>:<shard>`);
//!   the shard count and the resharding history are recorded.
//! - Waits that need time to pass (a fenced owner's lease running out, the correction round's
//!   lease wait, rebalance timeouts) are recorded as [`WaitId`]s. Each coordinator process measures
//!   them on its *own* monotonic clock from the moment it first observes them, so no safety
//!   decision ever compares the clocks of two processes.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::proof::ViewKey;

pub use super::fence::Fence;

/// Index of a shard stream, `0..shard_count`.
pub type ShardId = u32;
/// A consumer's id, chosen by the client at join (e.g. a UUID).
pub type MemberId = String;
/// Names one revoke instruction (a shard recorded `Revoking`): drawn from fresh randomness when
/// the revoke is recorded, so it never repeats — not after a cancelled revoke, not after a metadata
/// rollback that reuses wait ids and epochs. A REVOKED report releases the shard only when it names
/// the recorded revoke. At most 2^53 − 1, so it is exact in JavaScript clients too.
pub type RevokeId = u64;
/// Largest [`RevokeId`] (2^53 − 1).
pub const REVOKE_ID_MAX: RevokeId = (1 << 53) - 1;
/// Identifier of a recorded wait, allocated from [`GroupMetadata::next_wait_id`]: it only goes up
/// while the record survives, and a create starts it at a random point
/// ([`super::admin::first_wait_id`]). A rollback rewinds the counter, so a history that replaces
/// the lost one allocates the same ids again: coordinator processes therefore time a wait by its id
/// *and* its [tag](GroupMetadata::wait_tags), which the allocating decision draws from fresh
/// randomness and which does not repeat.
pub type WaitId = u64;

/// JSON schema version of [`GroupMetadata`] this build reads and writes.
pub const SCHEMA_VERSION: u32 = 1;
/// Redis key/field layout version this build reads and writes.
pub const LAYOUT_VERSION: u32 = 1;
/// Largest shard count a group may have. Bounds memory and response sizes.
pub const SHARD_COUNT_MAX: u32 = 65_536;

/// Longest stream prefix or consumer group name, in bytes.
pub const GROUP_NAME_LEN_MAX: usize = 200;
/// Largest number of members a group may have.
pub const MEMBERS_MAX: usize = 10_000;
/// How many liveness fields of ids that are not members a tick leaves in place
/// ([`Observations::orphan_liveness`](super::observe::Observations)); past it, the tick's write
/// removes them all. A few are normal (a join refused after its touch); many are a client sending
/// heartbeats for made-up member ids, and every tick reads the whole liveness hash.
pub const ORPHAN_LIVENESS_MAX: usize = 64;
/// Longest member id accepted.
pub const MEMBER_ID_LEN_MAX: usize = 256;
/// Largest version, epoch or revision a client may send: 2^53 − 1, so every one is also exact in
/// JavaScript clients. It is also the largest the coordinator hands out (versions, member and
/// assignment epochs), so every number in an answer can be sent back. A larger client number is
/// `BAD_REQUEST` at the HTTP edge and in the core's input checks ([`super::input`]).
pub const CLIENT_NUMBER_MAX: u64 = (1 << 53) - 1;
/// How far above the stored metadataVersion a client's report is credited as loss evidence
/// ([`GroupMetadata::max_client_version_seen`], which later bumps go past). No store loses a
/// million version bumps of one group; without a cap, one report of [`CLIENT_NUMBER_MAX`] would use
/// up the version space and no later bump (so no join) could be recorded. A report above the cap
/// still starts a correction round; only the versions between the cap and the report may be
/// handed out again.
pub const CLIENT_VERSION_AHEAD_MAX: u64 = 1 << 20;
/// How far above the stored metadataVersion a report *proven by the record's key* is credited.
/// Such a number was issued by this group's own history, but not necessarily a few bumps ahead:
/// every create starts past the clock (2^16 per second, [`super::admin::first_metadata_version`]),
/// so a recreate that a failover then lost can be millions ahead of the history that came back
/// (swarm 6068: a recreate 42 s after the first create, 2.77 M ahead, was credited only 2^20 and
/// later bumps handed out numbers below it). 2^40 covers recreates up to 194 days apart and still
/// leaves 2^13 such jumps below [`CLIENT_NUMBER_MAX`]; a forger cannot make proven numbers.
pub const PROVEN_VERSION_AHEAD_MAX: u64 = 1 << 40;

/// The identity of a consumer group: `{streamPrefix:consumerGroup}`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupId {
    pub stream_prefix: String,
    pub consumer_group: String,
}

impl GroupId {
    pub fn new(stream_prefix: impl Into<String>, consumer_group: impl Into<String>) -> Self {
        Self { stream_prefix: stream_prefix.into(), consumer_group: consumer_group.into() }
    }

    /// The Redis Cluster hash tag shared by every key of this group.
    pub fn hash_tag(&self) -> String {
        format!("{{{}:{}}}", self.stream_prefix, self.consumer_group)
    }

    /// Stream key of one shard: `<streamPrefix>:<shard>`. Built without the formatting machinery:
    /// the read path names every shard's stream at every poll (1.3% of a simulation's time went to
    /// `format!` here).
    pub fn stream_key(&self, shard: ShardId) -> String {
        let mut digits = [0u8; 10];
        let mut at = digits.len();
        let mut rest = shard;
        loop {
            at -= 1;
            digits[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        let mut key = String::with_capacity(self.stream_prefix.len() + 1 + digits.len() - at);
        key.push_str(&self.stream_prefix);
        key.push(':');
        key.extend(digits[at..].iter().map(|d| char::from(*d)));
        key
    }

    /// Checks the id is safe everywhere it goes (Redis keys and hash tags, URL path segments,
    /// metric labels, logs): 1..=200 bytes of ASCII letters, digits, `.`, `_` and `-`, and `:`
    /// in the stream prefix only (stream keys are `<prefix>:<shard>`, and the group name ends the
    /// hash tag `{prefix:group}`, so a ':' in it would make keys unparseable when the index is
    /// rebuilt from a SCAN). Names made only of dots (`.`, `..`) are refused: they mean something
    /// in paths.
    pub fn validate(&self) -> Result<(), String> {
        for (name, value, colon) in
            [("streamPrefix", &self.stream_prefix, true), ("consumerGroup", &self.consumer_group, false)]
        {
            if value.is_empty() || value.len() > GROUP_NAME_LEN_MAX {
                return Err(format!("{name} must be 1..={GROUP_NAME_LEN_MAX} bytes"));
            }
            let allowed =
                |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-' || (colon && b == b':');
            if !value.bytes().all(allowed) {
                let extra = if colon { ", ':'" } else { "" };
                return Err(format!("{name} may contain only ASCII letters, digits, '.', '_', '-'{extra}"));
            }
            if value.bytes().all(|b| b == b'.') {
                return Err(format!("{name} must not be made of dots only"));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.stream_prefix, self.consumer_group)
    }
}

/// Which assignor computes the target assignment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AssignorKind {
    /// Fewest moves, uniform counts, deterministic tie-breaks.
    #[default]
    StickyUniform,
    /// Contiguous ranges in member-id order (Kafka's range assignor).
    Range,
}

/// The member lease TTL must exceed the assignment lease by this share of it. A consumer measures
/// its lease on its own clock from a heartbeat's send time; a coordinator expires the member once
/// the liveness counter stayed unchanged for the TTL on *its* clock, from a moment after that send.
/// If the two clocks' rates differ by up to ε each way (NTP slews at most 0.05%; a VM's clock under
/// load can be off by more), the lease L lasts up to L(1+ε) real time and the TTL T at least
/// T(1−ε): safety needs T ≥ L(1+ε)/(1−ε) ≈ L(1+2ε). 2% covers ε up to 0.99% (1.02 ≥
/// 1.0099/0.9901; at exactly 1% it would need 2.02%), twenty times NTP's bound. Suspended clocks
/// are a different problem (the client must read a clock that counts suspended time).
pub const CLOCK_RATE_MARGIN_PERCENT: u64 = 2;

/// The clock-rate margin for an assignment lease of `lease_ms` (rounded up).
pub fn clock_rate_margin_ms(lease_ms: u64) -> u64 {
    (lease_ms.saturating_mul(CLOCK_RATE_MARGIN_PERCENT)).div_ceil(100)
}

/// Per-group timing configuration. All durations in milliseconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupConfig {
    /// A member whose liveness record stays unchanged this long (on the deciding coordinator's
    /// clock) is expired.
    pub member_lease_ttl_ms: u64,
    /// How long a consumer may keep reading after *sending* the heartbeat whose response granted
    /// its assignment. `member_lease_ttl_ms` must exceed it by [`CLOCK_RATE_MARGIN_PERCENT`].
    pub assignment_lease_ms: u64,
    /// How often consumers heartbeat. Must be `< assignment_lease_ms` so a healthy consumer renews
    /// its lease before it ends.
    pub heartbeat_interval_ms: u64,
    /// A member that keeps a shard in revoking state longer than this, or does not adopt a
    /// correction round's version within it, is fenced.
    pub rebalance_timeout_ms: u64,
    /// How long a producer may use a routing view after fetching it.
    pub routing_cache_ttl_ms: u64,
    /// How often producers refresh routing; must be `< routing_cache_ttl_ms`.
    pub routing_refresh_interval_ms: u64,
    #[serde(default)]
    pub assignor: AssignorKind,
    /// When a producer reports publishing with more shards than recorded (an `add-shards` the
    /// store lost), add them again so its acknowledged entries are read (DESIGN §8). On by
    /// default; absent in records written before it existed (on).
    #[serde(default = "heal_default")]
    pub heal_lost_add_shards: bool,
    /// Fence every stream operation of a consumer at Redis (DESIGN §10): a grant is recorded only
    /// after its shard's fence was raised, and the consumer library reads, acks and claims through
    /// scripts that refuse any other grant's value. On by default; absent in records written before
    /// it existed (on). Turn it off only for applications that read the streams with their own
    /// code: then a consumer paused past its lease can still read and ack at Redis.
    #[serde(default = "fencing_default")]
    pub fencing: bool,
}

fn fencing_default() -> bool {
    true
}

fn heal_default() -> bool {
    true
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            member_lease_ttl_ms: 10_000,
            assignment_lease_ms: 8_000,
            heartbeat_interval_ms: 1_000,
            rebalance_timeout_ms: 30_000,
            routing_cache_ttl_ms: 10_000,
            routing_refresh_interval_ms: 3_000,
            assignor: AssignorKind::StickyUniform,
            heal_lost_add_shards: true,
            fencing: true,
        }
    }
}

impl GroupConfig {
    /// The longest duration any field of a valid config may hold (24 h). Clients bound the leases
    /// and intervals of answers by it too: a larger one comes from no valid config.
    pub const MS_MAX: u64 = 24 * 3_600_000;

    /// Checks the lease rules of the seed ("the consumer assignment lease must be shorter than or
    /// equal to the coordinator member lease TTL") and the refresh rules.
    pub fn validate(&self) -> Result<(), String> {
        const MS_MAX: u64 = GroupConfig::MS_MAX;
        let fields = [
            ("memberLeaseTtlMs", self.member_lease_ttl_ms),
            ("assignmentLeaseMs", self.assignment_lease_ms),
            ("heartbeatIntervalMs", self.heartbeat_interval_ms),
            ("rebalanceTimeoutMs", self.rebalance_timeout_ms),
            ("routingCacheTtlMs", self.routing_cache_ttl_ms),
            ("routingRefreshIntervalMs", self.routing_refresh_interval_ms),
        ];
        for (name, value) in fields {
            if value == 0 || value > MS_MAX {
                return Err(format!("{name} must be in 1..={MS_MAX}"));
            }
        }
        if self.assignment_lease_ms.saturating_add(clock_rate_margin_ms(self.assignment_lease_ms))
            > self.member_lease_ttl_ms
        {
            return Err(format!(
                "memberLeaseTtlMs must be at least assignmentLeaseMs + {CLOCK_RATE_MARGIN_PERCENT}% (clock-rate margin)"
            ));
        }
        if self.heartbeat_interval_ms >= self.assignment_lease_ms {
            return Err("heartbeatIntervalMs must be < assignmentLeaseMs".into());
        }
        if self.routing_refresh_interval_ms >= self.routing_cache_ttl_ms {
            return Err("routingRefreshIntervalMs must be < routingCacheTtlMs".into());
        }
        Ok(())
    }
}

/// Lifecycle of a member as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum MemberState {
    /// Heartbeating normally; eligible for target assignment.
    Active,
    /// Fenced by the rebalance timeout: every request gets `FENCED_MEMBER_EPOCH` until the member
    /// rejoins with epoch 0 (or expires); it is not a target and holds only `Fenced` shards.
    Fenced,
}

/// One member of the group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// Set to the (never reused) metadataVersion whenever the member joins or is granted a shard.
    pub member_epoch: u64,
    /// The epoch this incarnation joined with. A request carrying any epoch in
    /// `incarnation_epoch..=member_epoch` is accepted when its owned shards are a subset of the
    /// recorded ones (responses carrying later bumps may have been lost — KIP-848's "previous
    /// epoch" rule, widened because two grants can land between two heartbeats). Anything older
    /// is a previous incarnation and is fenced.
    pub incarnation_epoch: u64,
    pub state: MemberState,
    /// metadataVersion at which the member joined (diagnostics).
    pub joined_at_version: u64,
    /// Digest of the session secret of the process behind this incarnation (DESIGN §9). Absent
    /// in records written before sessions existed, or for a client that sent none: such a
    /// member's heartbeats are accepted without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<super::protocol::SessionDigest>,
}

/// The recorded current owner of a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum ShardOwner {
    /// `member` may read the shard (once it receives `OK` listing it).
    Owned {
        member: MemberId,
        since_assignment_epoch: u64,
        /// The fence raised for this grant before it was recorded (DESIGN §10). Absent with
        /// fencing off, in records written before fences existed, and between a refence and the
        /// write that records the new value: with fencing on, such a grant is fenced before it
        /// is answered again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fence: Option<Fence>,
    },
    /// `member` was told to drain; it may still be reading until it reports REVOKED for this very
    /// revoke (`revoke_id`), expires, or is fenced by the rebalance timeout (`wait` measures that
    /// timeout). `revoke_id` is absent in records written before revoke ids existed (or rewritten
    /// by such a binary during a rolling update): no report can release such a shard, which then
    /// waits for the rebalance timeout — slow, never unsafe.
    Revoking {
        member: MemberId,
        since_assignment_epoch: u64,
        wait: WaitId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        revoke_id: Option<RevokeId>,
        /// The fence of the grant being drained (the member acks with it until it reports).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fence: Option<Fence>,
    },
    /// `member` was fenced while it may still hold a lease; the shard is free once the deciding
    /// coordinator has observed `wait` for a full assignment lease.
    Fenced {
        member: MemberId,
        wait: WaitId,
        /// The fence of the grant this member held (it stays in force at Redis until the shard's
        /// next grant raises a newer one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fence: Option<Fence>,
    },
}

impl ShardOwner {
    pub fn member(&self) -> &MemberId {
        match self {
            ShardOwner::Owned { member, .. }
            | ShardOwner::Revoking { member, .. }
            | ShardOwner::Fenced { member, .. } => member,
        }
    }
}

/// One resharding step (shards are only ever added).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReshardRecord {
    pub from_shard_count: u32,
    pub to_shard_count: u32,
    pub metadata_version: u64,
    /// Who asked for it. Absent in records written before it existed (an operator).
    #[serde(default)]
    pub reason: ReshardReason,
}

/// Why shards were added.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReshardReason {
    /// An admin `add-shards` request.
    #[default]
    Operator,
    /// A producer reported publishing with more shards than recorded: the store lost an
    /// `add-shards`, and the coordinator added the shards again (DESIGN §8).
    RecoveredLostAddShards,
}

/// A metadata correction round (seed: "Metadata Version Correction"). Recorded without bumping
/// `metadataVersion`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CorrectionRound {
    /// Why the round started (diagnostics).
    pub reason: LossEvidence,
    /// The lease wait: no `OK` until the deciding coordinator observed this wait for a full
    /// assignment lease.
    pub wait: WaitId,
    /// Members that have heartbeated with the current `metadataVersion` since the round started,
    /// or joined during it (a join's answer is the recorded view, and a new incarnation holds
    /// nothing of a lost history: `Transition::join`). A member not in it a rebalance timeout into
    /// the round is fenced at a tick (`decide_tick`).
    pub synced_members: BTreeSet<MemberId>,
    /// The round began at a recreate that knew no key of the lost record (DESIGN §8): the lost
    /// history's proofs are under a key nothing here has. Until the round ends, a version ahead
    /// nobody can prove is learned (later bumps go past it, so no version is issued twice) but
    /// restarts nothing: the round's wait began after the loss, so it covers every lease the
    /// lost history granted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unverified_lineage: bool,
    /// The highest proven report this round recorded, in a round with
    /// [`unverified_lineage`](Self::unverified_lineage): there `max_client_version_seen` also
    /// holds learned versions, so it cannot say whether a proven report is new evidence; this
    /// does. Zero (absent) means none: a release that drops the field restarts the round at the
    /// next proven report, which only waits longer.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub proven_version: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Evidence that the store lost recent writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum LossEvidence {
    /// A client reported a metadataVersion above the stored one.
    ClientVersionAhead { reported: u64, stored: u64 },
    /// The store's server identity (run id / replication id) changed.
    StoreIdentityChanged,
    /// The store returned a revision lower than one this coordinator read before.
    RevisionRegressed { seen: u64, stored: u64 },
    /// The metadata key of a known group vanished and an operator recreated the group.
    MetadataLost,
}

/// The recorded state of one consumer group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupMetadata {
    pub group: GroupId,
    /// Client-visible version; bumped on every change a client can observe, never reused.
    pub metadata_version: u64,
    /// Bumped every time the target assignment is recomputed.
    pub assignment_epoch: u64,
    pub shard_count: u32,
    pub resharding: Vec<ReshardRecord>,
    pub config: GroupConfig,
    pub members: BTreeMap<MemberId, Member>,
    /// Target assignment: who each shard should belong to.
    pub target: BTreeMap<ShardId, MemberId>,
    /// Current assignment: who holds each shard now (absent = free).
    pub current: BTreeMap<ShardId, ShardOwner>,
    pub correction: Option<CorrectionRound>,
    /// Highest metadataVersion any client ever reported, credited at most
    /// [`CLIENT_VERSION_AHEAD_MAX`] above the stored version; a later bump goes past it (no ABA).
    pub max_client_version_seen: u64,
    /// Next [`WaitId`] to allocate.
    pub next_wait_id: WaitId,
    /// Set when a config change lowered a lease: until the old assignment lease has been observed
    /// to pass, the old (longer) values stay in force, because grants made under them still run.
    #[serde(default)]
    pub lease_transition: Option<LeaseTransition>,
    /// The key of this group's view proofs ([`crate::core::proof`]): drawn at creation (or at the
    /// first write of a group an older release created) and never changed. Absent: every client
    /// report is credited, as before proofs existed. Never part of an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view_key: Option<ViewKey>,
    /// Which incarnation of the group name this record belongs to: the first `metadataVersion` of
    /// its create, never changed by later writes (past the clock, so a later create's is larger
    /// unless the two creating clocks disagree, or both creates fall in one second: then it is
    /// larger half the time, and a smaller one is judged by revision, the conservative case). A
    /// coordinator keeps its revision marks and observation windows per incarnation: a lower
    /// revision of a *newer* incarnation is a delete and a create through other instances, not
    /// lost writes. Absent: a record an older release created or rewrote (nothing is reset then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<u64>,
    /// The latest member incarnations that left, oldest first, at most
    /// [`DEPARTURES_MAX`]: a join from the same session that never saw the departed incarnation
    /// (a late copy of the join that created it) is refused rather than recorded as a member
    /// nobody runs (DESIGN §7). Absent in records of older releases (such a copy is then a member
    /// until its TTL, as before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub departed: Vec<Departure>,
    /// Per recorded wait, the tag the decision that allocated it drew ([`wait_tag`]): 53 bits of
    /// that decision's fresh randomness, never 0. A rollback rewinds [`next_wait_id`](Self::next_wait_id),
    /// and the history that replaces the lost one allocates the same ids again; a coordinator that
    /// observed a lost wait and never read the records in between would credit its time to the new
    /// wait of the same id and end that wait early (a split with fencing off). Processes time a
    /// wait by (id, tag) ([`crate::core::observe::LocalView`]), so a reissued id is a new wait.
    /// Tags of waits no longer recorded are dropped at the next write. Absent in records of older
    /// releases, whose writes drop it: such a wait's tag reads 0. Its timing restarts at processes
    /// that had seen its tag, but 0 is the same tag in every history, so a wait an older release
    /// wrote is timed by id alone again, as older releases do (DESIGN §4: the guarantee holds
    /// once no older binary writes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub wait_tags: BTreeMap<WaitId, u64>,
}

/// The most member departures a record keeps ([`GroupMetadata::departed`]). A late copy of a join
/// delivered after this many later departures re-creates its member, which holds target shards
/// for one member TTL (liveness, never safety: nobody reads them).
pub const DEPARTURES_MAX: usize = 16;

/// A member incarnation that left, kept so a late copy of its join is recognised.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Departure {
    pub member: MemberId,
    /// The departed incarnation's session digest.
    pub session: super::protocol::SessionDigest,
    /// The departed incarnation's epoch: the version its join was recorded at.
    pub incarnation_epoch: u64,
}

/// The leases in force before a config change lowered them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseTransition {
    pub assignment_lease_ms: u64,
    pub member_lease_ttl_ms: u64,
    pub wait: WaitId,
}

impl GroupMetadata {
    /// A fresh group with no members.
    pub fn new(group: GroupId, shard_count: u32, config: GroupConfig) -> Self {
        Self {
            group,
            metadata_version: 1,
            assignment_epoch: 0,
            shard_count,
            resharding: Vec::new(),
            config,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            current: BTreeMap::new(),
            correction: None,
            max_client_version_seen: 0,
            next_wait_id: 1,
            lease_transition: None,
            view_key: None,
            incarnation: None,
            departed: Vec::new(),
            wait_tags: BTreeMap::new(),
        }
    }

    /// Members eligible for target assignment, in id order.
    pub fn active_members(&self) -> impl Iterator<Item = &MemberId> {
        self.members.iter().filter(|(_, m)| m.state == MemberState::Active).map(|(id, _)| id)
    }

    /// Shards the current assignment records as `Owned` by `member`.
    pub fn owned_shards(&self, member: &str) -> Vec<ShardId> {
        self.shards_where(|o| matches!(o, ShardOwner::Owned { member: m, .. } if m == member))
    }

    /// Shards `member` must drain (recorded `Revoking` by it).
    pub fn revoking_shards(&self, member: &str) -> Vec<ShardId> {
        self.shards_where(|o| matches!(o, ShardOwner::Revoking { member: m, .. } if m == member))
    }

    /// Target shards of `member` that it does not own yet.
    pub fn pending_shards(&self, member: &str) -> Vec<ShardId> {
        self.target
            .iter()
            .filter(|(shard, t)| t.as_str() == member && self.is_pending(**shard, member))
            .map(|(shard, _)| *shard)
            .collect()
    }

    /// Whether `shard`, targeted at `member`, is not owned by it yet (one of its pending shards).
    pub fn is_pending(&self, shard: ShardId, member: &str) -> bool {
        !matches!(self.current.get(&shard), Some(ShardOwner::Owned { member: m, .. }) if m == member)
    }

    /// Shards whose recorded owner satisfies `pred`, in shard order.
    pub fn shards_where(&self, pred: impl Fn(&ShardOwner) -> bool) -> Vec<ShardId> {
        self.current.iter().filter(|(_, o)| pred(o)).map(|(s, _)| *s).collect()
    }

    /// The assignment lease any live grant may still be running under.
    pub fn effective_assignment_lease_ms(&self) -> u64 {
        let old = self.lease_transition.as_ref().map_or(0, |t| t.assignment_lease_ms);
        self.config.assignment_lease_ms.max(old)
    }

    /// How long a lease wait lasts on the deciding coordinator's clock: the longest assignment
    /// lease a live grant may run under, plus the clock-rate margin ([`CLOCK_RATE_MARGIN_PERCENT`]):
    /// a consumer whose clock runs slower than the coordinator's holds its grant that much longer
    /// in the coordinator's time.
    ///
    /// `longest_seen_ms` is the longest lease the deciding process has seen recorded
    /// ([`crate::core::Observations::longest_lease_seen_ms`]): a lease increase the store lost in
    /// a rollback still governs the grants made under it.
    pub fn lease_wait_ms(&self, longest_seen_ms: u64) -> u64 {
        let lease = self.effective_assignment_lease_ms().max(longest_seen_ms);
        lease.saturating_add(clock_rate_margin_ms(lease))
    }

    /// How long a correction round waits after its evidence: [`lease_wait_ms`](Self::lease_wait_ms)
    /// of the longest lease a grant of the lost history may run under. That is the longest of the
    /// recorded lease, the longest this process saw recorded, and the deployment's lease ceiling
    /// (`ceiling_ms`, [`crate::core::Observations::lease_ceiling_ms`]): a lease increase the store
    /// lost may have been seen only by processes that are gone, and no coordinator grants a lease
    /// above the ceiling, so grants made under it end by then.
    pub fn round_wait_ms(&self, longest_seen_ms: u64, ceiling_ms: u64) -> u64 {
        self.lease_wait_ms(longest_seen_ms.max(ceiling_ms))
    }

    /// The member lease TTL expiry must wait for.
    pub fn effective_member_lease_ttl_ms(&self) -> u64 {
        let old = self.lease_transition.as_ref().map_or(0, |t| t.member_lease_ttl_ms);
        self.config.member_lease_ttl_ms.max(old)
    }

    /// Allocates a fresh wait id and records its [tag](Self::wait_tags), drawn from `nonce`, the
    /// allocating decision's fresh randomness ([`crate::core::Context::nonce`]).
    pub fn allocate_wait(&mut self, nonce: u64) -> Result<WaitId, CounterExhausted> {
        let id = self.next_wait_id;
        self.next_wait_id = id.checked_add(1).ok_or(CounterExhausted::WaitId)?;
        self.wait_tags.insert(id, wait_tag(nonce, id));
        Ok(id)
    }

    /// The [tag](Self::wait_tags) of `wait`; 0 when none is recorded.
    pub fn wait_tag(&self, wait: WaitId) -> u64 {
        self.wait_tags.get(&wait).copied().unwrap_or(0)
    }

    /// Every wait id this record records (a shard's revoke or fence, the correction round, the
    /// lease transition), possibly more than once.
    pub fn recorded_waits(&self) -> impl Iterator<Item = WaitId> + '_ {
        let shard_waits = self.current.values().filter_map(|o| match o {
            ShardOwner::Revoking { wait, .. } | ShardOwner::Fenced { wait, .. } => Some(*wait),
            ShardOwner::Owned { .. } => None,
        });
        let round = self.correction.as_ref().map(|r| r.wait);
        let lease = self.lease_transition.as_ref().map(|t| t.wait);
        shard_waits.chain(round).chain(lease)
    }

    /// Drops the tags of waits this record no longer records.
    pub(crate) fn prune_wait_tags(&mut self) {
        if self.wait_tags.is_empty() {
            return;
        }
        let recorded: BTreeSet<WaitId> = self.recorded_waits().collect();
        self.wait_tags.retain(|wait, _| recorded.contains(wait));
    }

    /// The client reports the next bump goes past: `max_client_version_seen`, credited at most
    /// [`PROVEN_VERSION_AHEAD_MAX`] above the recorded version (unproven reports at most
    /// [`CLIENT_VERSION_AHEAD_MAX`]). Reports are credited with those caps when recorded, so this
    /// equals `max_client_version_seen` except in a record written before the caps existed (one
    /// unbounded report made every later bump fail): there the cap heals the record at its next
    /// bump.
    fn credited_client_version(&self) -> u64 {
        self.max_client_version_seen.min(self.metadata_version.saturating_add(PROVEN_VERSION_AHEAD_MAX))
    }

    /// The version the next bump records: past everything recorded and every credited client
    /// report, so a version number lost in a rollback is never reused.
    pub fn next_metadata_version(&self) -> Result<u64, CounterExhausted> {
        let past = self.metadata_version.max(self.credited_client_version());
        next_client_number(past).ok_or(CounterExhausted::MetadataVersion(past))
    }

    /// Bumps the client-visible version (see [`next_metadata_version`](Self::next_metadata_version))
    /// and returns it. On exhaustion nothing changes.
    pub fn bump_metadata_version(&mut self) -> Result<u64, CounterExhausted> {
        let version = self.next_metadata_version()?;
        self.max_client_version_seen = self.credited_client_version();
        self.metadata_version = version;
        Ok(version)
    }
}

/// The [tag](GroupMetadata::wait_tags) of wait `wait` allocated by a decision whose fresh randomness
/// is `nonce`: a SplitMix64 finalizer over both (salted apart from revoke ids), in `1..2^53`. Two
/// allocations of one id on different timelines (a rollback rewound the counter) get the same tag
/// with probability about 2^-53: the nonce is fresh randomness, never a counter.
pub fn wait_tag(nonce: u64, wait: WaitId) -> u64 {
    let mut z = nonce ^ 0x5741_4954_5441_4753 ^ wait.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) & CLIENT_NUMBER_MAX).max(1)
}

/// `value + 1` if it is still a number clients may send back ([`CLIENT_NUMBER_MAX`]).
pub fn next_client_number(value: u64) -> Option<u64> {
    value.checked_add(1).filter(|next| *next <= CLIENT_NUMBER_MAX)
}

/// A counter the core steps has no next value. A typed refusal, never a panic or a wrap: the
/// decision that needed the step writes nothing and answers `INTERNAL`. Unreachable in practice
/// (2^53 bumps, or 2^33 reports each credited [`CLIENT_VERSION_AHEAD_MAX`] ahead), but a record
/// edited by hand or written before the bounds existed can get here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CounterExhausted {
    /// The next metadataVersion (and member epoch) would pass [`CLIENT_NUMBER_MAX`].
    #[error("metadataVersion cannot be bumped past {0} (the largest number clients may send back)")]
    MetadataVersion(u64),
    /// The next assignmentEpoch would pass [`CLIENT_NUMBER_MAX`].
    #[error("assignmentEpoch cannot be bumped past {0} (the largest number clients may send back)")]
    AssignmentEpoch(u64),
    /// Every wait id has been allocated.
    #[error("no wait id is left to allocate")]
    WaitId,
    /// The stored revision has no successor.
    #[error("store revision {0} cannot be incremented")]
    StoreRevision(u64),
}

#[cfg(test)]
mod stream_key_tests {
    use super::*;

    #[test]
    fn a_stream_key_is_the_prefix_a_colon_and_the_shard_in_decimal() {
        let group = GroupId::new("orders:eu", "billing");
        for shard in [0, 1, 9, 10, 99, 100, 4_095, 65_535, 1_000_000_000, ShardId::MAX] {
            assert_eq!(group.stream_key(shard), format!("orders:eu:{shard}"));
        }
    }
}
