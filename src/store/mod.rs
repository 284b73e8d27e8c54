//! The metadata and stream stores: the only place the coordinator and the clients touch Redis.
//!
//! [`MetadataStore`] is the narrow contract the coordinator needs (consistent load, a write and a
//! delete conditioned on the whole stamp `(revision, writeId)` of the write they were computed
//! from ([`CasStamp`]), mutex, liveness, index, server identity, compatibility probe).
//! [`StreamStore`] is what the consumer and producer libraries need (XADD, XREADGROUP, XACK,
//! XAUTOCLAIM). Two implementations
//! keep the same contract, proven by `tests/store_contract.rs`:
//! - `RedisStore` (real Redis via the `redis` crate; not built under `--cfg madsim`),
//! - `MemoryStore` (in-memory fake with fault knobs, for the simulation and unit tests).
//!
//! Stores never parse the aggregate: they move bytes. Parsing and schema checks belong to the
//! coordinator, which turns them into `METADATA_INCOMPATIBLE`.

mod concurrent;
pub mod keys;
pub mod memory;
#[cfg(not(madsim))]
pub mod redis;

use std::collections::BTreeMap;
use std::future::Future;

use serde::{Deserialize, Serialize};

pub(crate) use self::concurrent::join_all;

use crate::core::model::{Fence, GroupId, MemberId};

/// A store failure. Never carries secrets (URLs with passwords are not included).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Unreachable, timed out, connection broken, or the server is loading / read-only.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The server rejected a command this layout needs (unknown, disabled, or ACL-denied).
    #[error("store command unsupported: {command}: {detail}")]
    Unsupported { command: String, detail: String },
    /// The server answered something the contract does not allow (a bug or a foreign key), or the
    /// caller asked for something it does not allow (a write without a `writeId`; nothing was sent).
    #[error("unexpected store reply: {0}")]
    Protocol(String),
    /// The store's client settings are invalid (a malformed URL, an unreadable or invalid TLS
    /// file, TLS files without `rediss://`): nothing was sent. Fix the configuration.
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// A fenced stream operation presented a fence that is not the shard's (DESIGN §10): another
    /// grant of the shard is newer. Nothing was read, acknowledged or claimed. The consumer stops
    /// the shard at once (`on_lost`).
    #[error("fenced: {key} holds {current}, not the presented fence")]
    Fenced { key: String, current: String },
    /// The metadata hash exists but is not in this layout: a required field is missing or does not
    /// parse (an out-of-band edit). The coordinator fails closed as `METADATA_INCOMPATIBLE`.
    #[error("metadata hash not in this layout: {0}")]
    Layout(String),
}

/// Every Redis command the layout needs, directly or from a script, in the order `probe` checks
/// them. Shared by `RedisStore` (which also needs `COMMAND` for the probe itself) and the fake.
pub const REQUIRED_COMMANDS: &[&str] = &[
    "PING",
    "INFO",
    "HGET",
    "HMGET",
    "HSET",
    "HDEL",
    "HINCRBY",
    "HGETALL",
    "EXISTS",
    "PEXPIRE",
    "DEL",
    "GET",
    "SET",
    "SADD",
    "SREM",
    "SMEMBERS",
    "SCAN",
    "EVALSHA",
    "SCRIPT",
    "XADD",
    "XGROUP",
    "XREADGROUP",
    "XACK",
    "XAUTOCLAIM",
    "XREAD",
    "XINFO",
    // Fenced batch acks by an optimistic transaction (`RedisStoreOptions::watched_acks`).
    "MULTI",
    "EXEC",
    "WATCH",
];

/// The hash fields of the metadata key, as stored: the seed's five plus `writeId`. Its `Debug`
/// shows the aggregate's length, not its text, which holds the group's secret view key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRecord {
    /// `aggregate`: GroupMetadata JSON (unparsed).
    pub aggregate: String,
    /// `revision`: the storeRevision, +1 on every write.
    pub revision: u64,
    /// `schemaVersion`, as stored (may be unknown to this build).
    pub schema_version: u32,
    /// `layoutVersion`, as stored.
    pub layout_version: u32,
    /// `updatedAt`: display only (milliseconds since the Unix epoch of the writer's wall clock).
    pub updated_at_ms: u64,
    /// `writeId`: a random id the writer chose for this write (empty when the field is absent, as
    /// in a hash written by hand or by a build older than `writeId`). Revisions can repeat after a
    /// rollback (revision r lost, then written again with other content), so (revision, writeId)
    /// is what identifies one write: a write or delete is conditioned on both ([`CasStamp`]), and a
    /// decoded copy of the aggregate is reused only while both match ([`RecordStamp`]).
    pub write_id: String,
}

impl StoredRecord {
    /// The condition for a write or delete computed from this record.
    pub fn cas_stamp(&self) -> CasStamp {
        CasStamp { revision: self.revision, write_id: self.write_id.clone() }
    }

    /// The stamp of this write, or `None` when it has no `writeId` (then it cannot be cached).
    pub fn stamp(&self) -> Option<RecordStamp> {
        (!self.write_id.is_empty()).then(|| RecordStamp {
            revision: self.revision,
            write_id: self.write_id.clone(),
            schema_version: self.schema_version,
            layout_version: self.layout_version,
        })
    }
}

/// Identifies one stored write: (revision, writeId), plus the schema and layout versions so that
/// an out-of-band edit of either is seen by the next heartbeat. See [`StoredRecord::write_id`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordStamp {
    pub revision: u64,
    pub write_id: String,
    pub schema_version: u32,
    pub layout_version: u32,
}

impl RecordStamp {
    /// True when a record with these four fields carries this stamp (never for an empty id).
    pub fn matches(&self, revision: u64, write_id: &str, schema_version: u32, layout_version: u32) -> bool {
        !self.write_id.is_empty()
            && self.revision == revision
            && self.write_id == write_id
            && self.schema_version == schema_version
            && self.layout_version == layout_version
    }
}

/// The condition of a conditional write or delete: the `(revision, writeId)` of the write the
/// caller loaded and computed from. The store applies the request only if the metadata key holds
/// exactly that write; otherwise it changes nothing and answers `RevisionConflict`.
///
/// Why both: revisions repeat. A failover or silent rollback loses revisions r..r+k-1 and new
/// writes then make those revisions again with other content. A coordinator that loaded r before
/// the loss and writes after it would, with a revision-only condition, record a state computed
/// from lost history (wiping a correction round, reusing a lost `metadataVersion`). The new write
/// of r has another `writeId`, so the full condition refuses it.
///
/// Records without a `writeId` (written before the field existed, or by hand): `write_id` is
/// empty, and an empty expected `writeId` matches only a stored record whose `writeId` field is
/// absent (or empty, which a read cannot tell apart from absent) at the expected revision. This is
/// safe because the stores refuse to write an empty `writeId`: every write by this build carries
/// a fresh one, so a lost id-less revision rewritten by this build no longer matches, and a
/// record written by this build never matches an id-less expectation. What it cannot catch is an
/// id-less revision lost and rewritten id-less, i.e. by hand or by a pre-`writeId` build still
/// writing during a rolling update (which conditions its own writes on the revision alone anyway).
/// The alternatives are worse: an empty id matching any stored id lets exactly the ABA above
/// through, and an empty id matching nothing would leave every pre-`writeId` group unwritable.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CasStamp {
    pub revision: u64,
    /// Empty: the stored `writeId` field must be absent (or empty).
    pub write_id: String,
}

impl std::fmt::Display for CasStamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.write_id.is_empty() {
            write!(f, "revision {} (no writeId)", self.revision)
        } else {
            write!(f, "revision {} (writeId {})", self.revision, self.write_id)
        }
    }
}

/// A conditional write of the metadata key. Its `Debug` shows the aggregate's length, not its
/// text (see [`StoredRecord`]).
#[derive(Clone, PartialEq, Eq)]
pub struct WriteRequest {
    /// `None`: create, only if the key does not exist. `Some(stamp)`: only if the key holds the
    /// write `stamp` names (see [`CasStamp`]).
    pub expected: Option<CasStamp>,
    pub aggregate: String,
    pub schema_version: u32,
    pub layout_version: u32,
    pub updated_at_ms: u64,
    /// Stored as `writeId`; must be unique per write (the coordinator draws 64 random bits) and is
    /// never empty (the stores refuse an empty one: see [`CasStamp`] for why).
    pub write_id: String,
    /// Each (member, value): the member's liveness counter must still equal value (absent = 0).
    /// This makes an expiry decision atomic with the heartbeats it did not see.
    pub liveness_guards: Vec<(MemberId, u64)>,
    /// Liveness counters to delete with the write (members removed by it).
    pub liveness_remove: Vec<MemberId>,
}

/// How an aggregate appears in `Debug` output: its length only.
struct AggregateText<'a>(&'a str);

impl std::fmt::Debug for AggregateText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes of JSON>", self.0.len())
    }
}

impl std::fmt::Debug for StoredRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredRecord")
            .field("aggregate", &AggregateText(&self.aggregate))
            .field("revision", &self.revision)
            .field("schema_version", &self.schema_version)
            .field("layout_version", &self.layout_version)
            .field("updated_at_ms", &self.updated_at_ms)
            .field("write_id", &self.write_id)
            .finish()
    }
}

impl std::fmt::Debug for WriteRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteRequest")
            .field("expected", &self.expected)
            .field("aggregate", &AggregateText(&self.aggregate))
            .field("schema_version", &self.schema_version)
            .field("layout_version", &self.layout_version)
            .field("updated_at_ms", &self.updated_at_ms)
            .field("write_id", &self.write_id)
            .field("liveness_guards", &self.liveness_guards)
            .field("liveness_remove", &self.liveness_remove)
            .finish()
    }
}

impl WriteRequest {
    /// The check both stores make before sending anything: a write must carry a `writeId`.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        if self.write_id.is_empty() {
            return Err(StoreError::Protocol("a metadata write needs a non-empty writeId".into()));
        }
        Ok(())
    }
}

/// Result of a conditional write or delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Written; the new revision (`expected + 1`, or 1 on create). 0 after a delete.
    Written { revision: u64 },
    /// The stored write is not the expected one; `current` is the stored revision (`None`: key
    /// absent). It may equal the expected revision: that revision was lost and written again.
    RevisionConflict { current: Option<u64> },
    /// A liveness guard failed: a heartbeat arrived after the decision was computed.
    LivenessChanged { member: MemberId },
}

/// Who the store server is. A change of either field between two reads is evidence that the
/// server failed over or restarted and may have lost recent writes; on a Cluster, so is a slot
/// whose serving primary the read could not confirm by that primary's own account
/// ([`disputed`](Self::disputed)).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServerIdentity {
    pub run_id: String,
    pub replication_id: String,
    /// On a Redis Cluster, each primary the view lists serving slots, with those slots and the
    /// ones it claims itself (empty: one server). Its slots are not part of
    /// [`same_servers`](Self::same_servers), only their disputes: a slot migration moves keys
    /// between unchanged primaries and loses nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub primaries: Vec<PrimaryIdentity>,
}

/// One serving primary of a Redis Cluster, as [`ServerIdentity::primaries`] records it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PrimaryIdentity {
    /// `host:port/node id`.
    pub node: String,
    pub run_id: String,
    pub replication_id: String,
    /// Inclusive slot ranges the view lists it serving: the CLUSTER SLOTS of the one node that
    /// answered it, which may be stale (mid-failover, or one side of a partition).
    pub slots: Vec<(u16, u16)>,
    /// Inclusive slot ranges it serves by its own account: its own CLUSTER SLOTS, the ranges under
    /// its own node id; none when its own INFO says it is a replica (a demoted primary the view
    /// still lists). Absent in an identity recorded without it, which reads as claiming nothing:
    /// every slot the view lists for it is disputed, the safe case (DESIGN §6).
    #[serde(default)]
    pub claimed: Vec<(u16, u16)>,
    /// Inclusive slot ranges its own CLUSTER SLOTS names another node for, with that node (its id,
    /// or `host:port` when the reply names no id): whom it handed them to, by its own account.
    /// Empty when it claims nothing (a demoted primary vouches for nobody), and in an identity
    /// recorded without it (a disowned slot is then disputed, the safe case).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handed: Vec<(u16, u16, String)>,
    /// Slots its own account says it is migrating (`CLUSTER NODES`, `[slot->-id]` on its own
    /// line), each with the node it migrates them to: keys of such a slot may already live on that
    /// node, written there through `ASK` or moved by `MIGRATE`, before the slot is handed over.
    /// Empty when it claims nothing, when the coordinator may not run `CLUSTER NODES` (only
    /// `CLUSTER SLOTS`, which shows no migration), and in an identity recorded without it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrating: Vec<(u16, String)>,
    /// Slots its own account says it is importing (`[slot-<-id]`), each with the node it imports
    /// them from. Empty in the same cases as [`Self::migrating`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub importing: Vec<(u16, String)>,
    /// A primary the view lists for no slot (CLUSTER SLOTS names only primaries serving slots):
    /// a new node added before its first slot, or one whose slots all moved away, found as a
    /// master in a listed primary's `CLUSTER NODES` and confirmed a master by its own INFO. It is
    /// live like a primary that claims slots, so a slot migrating to it is held by it and its
    /// source, compared read to read by its ids, rather than disputed. False in an identity
    /// recorded without it: such a node was not listed then, the safe case.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle: bool,
}

impl PrimaryIdentity {
    /// The node id in [`Self::node`] (`host:port/node id`), or `host:port` when it names none:
    /// how other primaries' [`Self::handed`] name it.
    pub fn node_key(&self) -> &str {
        match self.node.split_once('/') {
            Some((_, id)) if !id.is_empty() => id,
            Some((address, _)) => address,
            None => &self.node,
        }
    }

    /// Whether it is a live primary: one that claims slots by its own account, or an [idle](Self::idle)
    /// master. A primary the view lists whose own INFO says it is a replica (a demoted primary)
    /// claims nothing and is not live: it vouches for nobody.
    fn live(&self) -> bool {
        !self.claimed.is_empty() || self.idle
    }

    /// Whether its own account hands `slot` to `other`.
    fn hands(&self, slot: u16, other: &PrimaryIdentity) -> bool {
        self.handed.iter().any(|(start, end, to)| (*start..=*end).contains(&slot) && to == other.node_key())
    }
}

impl ServerIdentity {
    /// Whether both name the same servers, unchanged: no failover, restart or replacement between
    /// the two reads, and on a Cluster the same [disputed](Self::disputed) slots (a dispute that
    /// starts or ends is a change; one that lasts is not news). Slots moving between the same
    /// primaries, views and claims agreeing, is no change.
    pub fn same_servers(&self, other: &ServerIdentity) -> bool {
        self.run_id == other.run_id
            && self.replication_id == other.replication_id
            && self.disputes() == other.disputes()
    }

    /// Whether the change from `self` to `newer` may have lost writes to keys in `slot`. On one
    /// server, always. On a Cluster, not when the same primaries, unchanged (node, `run_id` and
    /// `master_replid`: a promoted replica takes a new replication id), [held](Self::holders)
    /// `slot` in both reads — one primary, or both ends of a migration that lasts: the failover of
    /// one primary costs writes only to the slots it held. Nor when `slot` moved, or was being handed over in either read, between primaries
    /// that are all still there unchanged — the two reads list the same primaries, each with the
    /// same `run_id` and replication id: that is a migration, and MIGRATE moves keys
    /// synchronously, losing nothing. A failover, restart, addition or removal of any primary
    /// between the two reads makes a moved slot count (its keys may have passed through that
    /// primary: a promoted replica claiming a slot beside its deposed primary is what a lost write
    /// looks like from outside). A slot either read found disputed or unserved counts.
    pub fn may_have_lost(&self, newer: &ServerIdentity, slot: u16) -> bool {
        let (before, after) = (self.holders(slot), newer.holders(slot));
        let same_nodes =
            before.len() == after.len() && before.iter().all(|b| after.iter().any(|a| a.node_key() == b.node_key()));
        match (before.as_slice(), after.as_slice()) {
            ([], _) | (_, []) => true,
            // The same holders in both reads (one primary, or both ends of a migration or of a
            // handover that lasts): lost only if one of them changed, whatever changed elsewhere.
            _ if same_nodes => !before.iter().all(|b| newer.lists_unchanged(b)),
            _ => {
                !(self.primaries.iter().all(|p| newer.lists_unchanged(p))
                    && newer.primaries.iter().all(|p| self.lists_unchanged(p)))
            }
        }
    }

    /// The one primary holding `slot` by this read, when it alone decides the slot: the primary
    /// the view lists, claiming it by its own account, and no migration, handover or dispute of
    /// it ([`Self::holders`] is that one primary). `None` otherwise, and on one server.
    pub fn sole_holder(&self, slot: u16) -> Option<&PrimaryIdentity> {
        match self.holders(slot).as_slice() {
            [one] if in_ranges(&one.slots, slot) && in_ranges(&one.claimed, slot) => Some(*one),
            _ => None,
        }
    }

    /// Whether `now`, the own account of this read's [sole holder](Self::sole_holder) of `slot`
    /// read again from that node alone ([`MetadataStore::primary_account`]), shows the slot
    /// unchanged since this read: the same node, `run_id` and replication id (no restart,
    /// failover or replacement), still claiming `slot` itself, and neither handing it to another
    /// node nor migrating or importing it. Then nothing written to `slot`'s keys since this read
    /// can have been lost by a change of its primary, whatever the other primaries did: a
    /// failover costs only the slots the failed primary held (DESIGN §11). False whenever this
    /// read has no sole holder of `slot`.
    pub fn slot_unchanged(&self, slot: u16, now: &PrimaryIdentity) -> bool {
        let Some(held) = self.sole_holder(slot) else { return false };
        held.node_key() == now.node_key()
            && held.run_id == now.run_id
            && held.replication_id == now.replication_id
            && in_ranges(&now.claimed, slot)
            && !now.handed.iter().any(|(start, end, _)| (*start..=*end).contains(&slot))
            && !now.migrating.iter().any(|(s, _)| *s == slot)
            && !now.importing.iter().any(|(s, _)| *s == slot)
    }

    /// Whether this read cannot name the primaries holding `slot` ([`Self::holders`] is empty):
    /// no listed primary claims it, more than two do, two do and the view lists neither, or the
    /// one the view lists does not claim it and is not a live primary that handed it to the one
    /// other claimant. Never on one server (no slot map).
    pub fn disputed(&self, slot: u16) -> bool {
        !self.primaries.is_empty() && self.holders(slot).is_empty()
    }

    /// The primaries holding `slot` by this read's accounts, checked against each other:
    /// - one: the one the view lists, when it claims the slot itself; or, when the listed one
    ///   disowns it but is a live primary (it claims other slots) whose own account hands it to
    ///   the one other listed primary that claims it, that one — the node that answered the view
    ///   had not yet learnt of a migration's handover, which both primaries have settled
    ///   (`redis-cli --cluster reshard` updates the primaries one slot after another, replicas
    ///   learn by gossip);
    /// - two: both claim it and the view lists one of them — a migration's handover under way
    ///   (the target took the slot, the source has not yet heard), or two primaries after a
    ///   partition; only the read before can tell (a promoted replica is new in it), so
    ///   [`Self::may_have_lost`] asks it. Or neither claims it, the listed one (live) hands it to
    ///   the other and the other (live) still names the listed one for it: the same handover
    ///   the other way round (the source heard first);
    /// - none (disputed): no claimant, more than two, a listed primary that claims nothing (a
    ///   demoted primary the view still lists) or that hands the slot to someone else than its
    ///   one claimant, a claimant the view lists nobody for; and on one server.
    fn holders(&self, slot: u16) -> Vec<&PrimaryIdentity> {
        let claimants: Vec<&PrimaryIdentity> = self.primaries.iter().filter(|p| in_ranges(&p.claimed, slot)).collect();
        let Some(listed) = self.serving(slot) else { return Vec::new() };
        let lists = |p: &&PrimaryIdentity| std::ptr::eq(*p, listed);
        let live = PrimaryIdentity::live;
        // A live primary whose own account names, for this slot, a node the view does not list
        // (a replica promoted on the other side of a partition, say): the view is from the side
        // that has not heard, and its claimants cannot be trusted.
        // (An idle master is left out: it claims nothing, and its account naming an owner for
        // every slot is only as fresh as its gossip.)
        let unknown_owner = self.primaries.iter().filter(|p| !p.claimed.is_empty()).any(|p| {
            p.handed.iter().any(|(start, end, to)| {
                (*start..=*end).contains(&slot) && !self.primaries.iter().any(|q| q.node_key() == to)
            })
        });
        if unknown_owner {
            return Vec::new();
        }
        let holders = match claimants.as_slice() {
            [one] if lists(one) || (live(listed) && listed.hands(slot, one)) => claimants,
            [a, b] if lists(a) || lists(b) => claimants,
            // In flight: the listed primary handed it to another live listed primary that still
            // names the listed one for it (the last `SETSLOT … NODE` reached the source first).
            [] if live(listed) => {
                match self.primaries.iter().find(|to| live(to) && listed.hands(slot, to) && to.hands(slot, listed)) {
                    Some(to) => vec![listed, to],
                    None => Vec::new(),
                }
            }
            _ => Vec::new(),
        };
        self.with_migration(slot, holders)
    }

    /// `holders` of `slot`, joined by the primaries a migration of it involves: the node a holder
    /// migrates it to (its keys may already be there, moved by `MIGRATE` or written through
    /// `ASK`, so a failover of that node can lose them while the slot is still listed for the
    /// unchanged source) and a listed primary importing it from a holder. Disputed (none) when a
    /// holder migrates it to a node that is not a live listed primary: a node this read has no
    /// identity for (an idle master it could not reach, or the demoted target of a failover)
    /// cannot be compared with the next read's.
    fn with_migration<'a>(&'a self, slot: u16, mut holders: Vec<&'a PrimaryIdentity>) -> Vec<&'a PrimaryIdentity> {
        let live = PrimaryIdentity::live;
        let mut next = 0;
        while let Some(holder) = holders.get(next).copied() {
            next += 1;
            for (_, to) in holder.migrating.iter().filter(|(s, _)| *s == slot) {
                match self.primaries.iter().find(|p| p.node_key() == to) {
                    Some(target) if live(target) => {
                        if !holders.iter().any(|h| std::ptr::eq(*h, target)) {
                            holders.push(target);
                        }
                    }
                    _ => return Vec::new(),
                }
            }
        }
        let importers: Vec<&PrimaryIdentity> = self
            .primaries
            .iter()
            .filter(|p| live(p) && !holders.iter().any(|h| std::ptr::eq(*h, *p)))
            .filter(|p| p.importing.iter().any(|(s, from)| *s == slot && holders.iter().any(|h| h.node_key() == from)))
            .collect();
        holders.extend(importers);
        holders
    }

    /// Whether this read lists `primary` (same node: its id, or its address when the view names no
    /// id — not the address text, which CLUSTER SLOTS and CLUSTER NODES spell differently when the
    /// cluster announces hostnames) with the same `run_id` and replication id.
    fn lists_unchanged(&self, primary: &PrimaryIdentity) -> bool {
        self.primaries.iter().any(|p| {
            p.node_key() == primary.node_key()
                && p.run_id == primary.run_id
                && p.replication_id == primary.replication_id
        })
    }

    /// The [disputed](Self::disputed) slots of this read as inclusive ranges, ascending, each with
    /// every node the accounts name for it (the view's, the claimants', and whom a live primary
    /// hands or migrates it to), sorted: how [`Self::same_servers`] compares two reads' disputes,
    /// so that a dispute that lasts is no news while its nodes stay the same, and churn behind it
    /// (the unlisted owner a live primary names replaced by another node) is a change.
    fn disputes(&self) -> Vec<(u16, u16, Vec<&str>)> {
        let mut disputes: Vec<(u16, u16, Vec<&str>)> = Vec::new();
        for (start, end) in self.disputed_slots() {
            for slot in start..=end {
                let names = self.named_for(slot);
                match disputes.last_mut() {
                    Some((_, last, same)) if last.checked_add(1) == Some(slot) && *same == names => *last = slot,
                    _ => disputes.push((slot, slot, names)),
                }
            }
        }
        disputes
    }

    /// Every node this read's accounts name for `slot`, sorted and without repeats.
    fn named_for(&self, slot: u16) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for p in &self.primaries {
            if in_ranges(&p.slots, slot) || in_ranges(&p.claimed, slot) {
                names.push(p.node_key());
            }
            let handed = p.handed.iter().filter(|(start, end, _)| (*start..=*end).contains(&slot)).map(|(_, _, to)| to);
            let migrating = p.migrating.iter().filter(|(s, _)| *s == slot).map(|(_, to)| to);
            names.extend(handed.chain(migrating).map(String::as_str));
        }
        names.sort_unstable();
        names.dedup();
        names
    }

    /// The [disputed](Self::disputed) slots of this read as inclusive ranges, ascending.
    pub fn disputed_slots(&self) -> Vec<(u16, u16)> {
        let mut ranges: Vec<(u16, u16)> = Vec::new();
        if self.primaries.is_empty() {
            // One server: no slot map, and this runs on every identity check.
            return ranges;
        }
        for slot in (0..keys::CLUSTER_SLOTS).filter(|slot| self.disputed(*slot)) {
            match ranges.last_mut() {
                Some((_, end)) if end.checked_add(1) == Some(slot) => *end = slot,
                _ => ranges.push((slot, slot)),
            }
        }
        ranges
    }

    /// The primary the view lists serving `slot` (`None`: one server, or no primary served it).
    fn serving(&self, slot: u16) -> Option<&PrimaryIdentity> {
        self.primaries.iter().find(|p| in_ranges(&p.slots, slot))
    }
}

/// Whether `slot` lies in one of the inclusive `ranges`.
fn in_ranges(ranges: &[(u16, u16)], slot: u16) -> bool {
    ranges.iter().any(|(start, end)| (*start..=*end).contains(&slot))
}

/// What the startup compatibility probe found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    pub server_version: String,
    pub identity: ServerIdentity,
}

/// Result of a heartbeat's atomic liveness touch + load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TouchResult {
    /// The member's liveness counter after the increment; 0 (and nothing written) when the
    /// metadata key is absent, so heartbeats for unknown groups cannot create keys.
    pub liveness: u64,
    pub record: Option<StoredRecord>,
}

/// Result of [`MetadataStore::touch_and_check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TouchCheck {
    /// The stored record still carries the caller's stamp; `liveness` as in [`TouchResult`].
    Unchanged { liveness: u64 },
    /// The record changed (or vanished): here it is, read after the increment.
    Changed(TouchResult),
}

/// The largest step by which the coordinator increments a liveness counter at one touch
/// ([`MetadataStore::touch_and_load_by`]): steps are drawn in `1..=2^24`. A silent rollback winds a
/// counter back, and the member's later touches then climbed through the very values an instance
/// had already seen, so a live member looked unchanged for a TTL and was expired with its leases
/// still running (hostile review, stop 37). With random steps the climb lands on a value seen
/// before with probability about 2^-23 per value. Counters stay increasing (a relay compares
/// them) and take 2^39 touches on average to pass 2^63.
pub const LIVENESS_STEP_MAX: u64 = 1 << 24;

/// The coordinator's view of Redis. Every method is one atomic server-side step.
pub trait MetadataStore: Send + Sync + 'static {
    /// Consistent read of all five fields of the metadata key (`None`: key absent).
    fn load(&self, group: &GroupId) -> impl Future<Output = Result<Option<StoredRecord>, StoreError>> + Send;

    /// Atomically increments `member`'s liveness counter by 1 and reads the metadata key
    /// ([`touch_and_load_by`](Self::touch_and_load_by) with step 1).
    fn touch_and_load(
        &self,
        group: &GroupId,
        member: &str,
    ) -> impl Future<Output = Result<TouchResult, StoreError>> + Send {
        self.touch_and_load_by(group, member, 1)
    }

    /// Atomically increments `member`'s liveness counter by `step` and reads the metadata key: the
    /// steady heartbeat's single round trip. The coordinator draws `step` at random
    /// ([`LIVENESS_STEP_MAX`]) so that a counter a rollback wound back does not climb through the
    /// values it had before.
    fn touch_and_load_by(
        &self,
        group: &GroupId,
        member: &str,
        step: u64,
    ) -> impl Future<Output = Result<TouchResult, StoreError>> + Send;

    /// [`touch_and_check_by`](Self::touch_and_check_by) with step 1.
    fn touch_and_check(
        &self,
        group: &GroupId,
        member: &str,
        known: &RecordStamp,
    ) -> impl Future<Output = Result<TouchCheck, StoreError>> + Send {
        self.touch_and_check_by(group, member, known, 1)
    }

    /// The steady heartbeat against a decoded copy the caller holds: increments `member`'s
    /// liveness counter by `step` and returns `Unchanged` when the record still carries `known`,
    /// else the record as `touch_and_load` would. On Redis: HINCRBY + HMGET of four short fields,
    /// pipelined (two commands, one round trip, no aggregate transfer; on a Cluster one script
    /// running both); a changed record costs one more read. The stamp is read after the
    /// increment, never before it: an expiry that ran before the stamp read is then seen, one
    /// that ran after it saw the increment. Never leaves a liveness key behind for an absent metadata key.
    fn touch_and_check_by(
        &self,
        group: &GroupId,
        member: &str,
        known: &RecordStamp,
        step: u64,
    ) -> impl Future<Output = Result<TouchCheck, StoreError>> + Send;

    /// Every member's liveness counter.
    fn liveness(&self, group: &GroupId) -> impl Future<Output = Result<BTreeMap<MemberId, u64>, StoreError>> + Send;

    /// Conditional write, atomically: the stored write must be `request.expected` (the whole
    /// [`CasStamp`]), then every liveness guard must hold. A request with an empty `write_id` is
    /// refused with `Protocol` before anything is sent.
    fn write(
        &self,
        group: &GroupId,
        request: WriteRequest,
    ) -> impl Future<Output = Result<WriteOutcome, StoreError>> + Send;

    /// Deletes the metadata key, the liveness key and the index entry if the key holds the write
    /// `expected` names (the whole [`CasStamp`]).
    fn delete(
        &self,
        group: &GroupId,
        expected: &CasStamp,
    ) -> impl Future<Output = Result<WriteOutcome, StoreError>> + Send;

    /// `SET mutex token NX PX ttl`; true when acquired.
    fn acquire_mutex(
        &self,
        group: &GroupId,
        token: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Compare-and-delete of the mutex; true when this token held it.
    fn release_mutex(&self, group: &GroupId, token: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Adds the group to the rebuildable index `redis-stream:coord:groups`.
    fn index_add(&self, group: &GroupId) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Groups listed in the index (never trusted as truth).
    fn index_members(&self) -> impl Future<Output = Result<Vec<GroupId>, StoreError>> + Send;

    /// Rebuilds the index from a SCAN of metadata keys; returns the groups found, sorted.
    fn rebuild_index(&self) -> impl Future<Output = Result<Vec<GroupId>, StoreError>> + Send;

    /// Counts one ticker pass of `instance` in the tick roster ([`keys::TICK_ROSTER_KEY`], a hash
    /// instance -> pass counter: HINCRBY, then HGETALL, pipelined: two atomic steps other clients
    /// may interleave) and returns every instance's counter. Coordinators share the tick work by
    /// it (`service::roster`); it is never truth about anything else.
    fn tick_roster(&self, instance: &str) -> impl Future<Output = Result<BTreeMap<String, u64>, StoreError>> + Send;

    /// Removes `instances` from the tick roster (HDEL): those a coordinator saw silent for long.
    /// A live instance that was removed adds itself again at its next pass.
    fn forget_tickers(&self, instances: &[String]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The heard relay between coordinator instances (`service::relay`), one round trip: stores
    /// each `(owner, blob)` of `outgoing` under [`keys::heard_relay_key`]`(owner, sender)` for
    /// `ttl_ms` (`SET … PX`), then reads what each of `senders` left for `sender` (`GET`, `None`:
    /// nothing, or expired). Every command is its own atomic step: other clients may interleave.
    /// Never truth about anything: a lost or stale blob only makes the reader read the store.
    fn exchange_heard(
        &self,
        sender: &str,
        outgoing: &[(String, String)],
        ttl_ms: u64,
        senders: &[String],
    ) -> impl Future<Output = Result<Vec<Option<String>>, StoreError>> + Send;

    /// The server's current identity.
    fn identity(&self) -> impl Future<Output = Result<ServerIdentity, StoreError>> + Send;

    /// On a Redis Cluster, the current own account of one primary an earlier
    /// [`identity`](Self::identity) read listed (`listed`, from [`ServerIdentity::primaries`]),
    /// read from that node alone: its `run_id`, replication id and the slots it claims, hands and
    /// migrates by its own account, as the identity read records them. Lets one group's requests
    /// confirm their own slot ([`ServerIdentity::slot_unchanged`]) while another primary does not
    /// answer, which a whole identity read cannot. `Ok(None)`: not a Cluster (one server's
    /// identity is read whole, [`identity`](Self::identity)).
    fn primary_account(
        &self,
        listed: &PrimaryIdentity,
    ) -> impl Future<Output = Result<Option<PrimaryIdentity>, StoreError>> + Send {
        let _ = listed;
        std::future::ready(Ok(None))
    }

    /// Startup compatibility probe: server version, every command the layout needs, and (on
    /// Redis) a primary whose `maxmemory-policy` does not evict keys without a TTL. Fails with
    /// `Unsupported` naming the first missing command (or `maxmemory-policy`, or `role` for a
    /// replica).
    fn probe(&self) -> impl Future<Output = Result<ProbeReport, StoreError>> + Send;

    /// Raises each fence key: increments its counter and stores the raise's nonce with it, one
    /// atomic step per key (a script), all keys in one round trip per node (pipelined; the steps
    /// of different keys may interleave with other clients' commands). Returns the new fence of
    /// each key, in order. A key that holds no counter (new, or vanished) starts at the raise's
    /// [`FenceRaise::floor`] (1 for a floor of 0).
    fn raise_fences(&self, raises: &[FenceRaise]) -> impl Future<Output = Result<Vec<Fence>, StoreError>> + Send;

    /// The fence each key holds now (`None`: never raised), in order. For operators and tests.
    fn read_fences(&self, keys: &[String]) -> impl Future<Output = Result<Vec<Option<Fence>>, StoreError>> + Send;
}

/// One fence to raise ([`MetadataStore::raise_fences`]): the shard's fence key, the random
/// nonce the coordinator drew for this grant, and the least counter the raise may give.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceRaise {
    pub key: String,
    pub nonce: u64,
    /// The counter a raise gives a key that holds none (0 counts as 1); a key that holds one is
    /// raised by one. The coordinator passes its wall clock in milliseconds, so a fence key that
    /// vanished (evicted, flushed, a restart without persistence, a `DEL` by hand) does not start
    /// again at 1, below the counters of grants made before it: a late operation under one of
    /// those would then win the check, and the fencing token applications compare would go
    /// backwards. Counters stay below the clock unless a key is raised more than once a
    /// millisecond on average, so a vanished key's next value is above every earlier one as long
    /// as coordinators' clocks move forward.
    pub floor: u64,
}

/// The fence a stream operation presents ([`StreamStore::fenced_xreadgroup`] and friends).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceCheck {
    /// The shard's fence key ([`keys::fence_key`]), in the stream's own hash slot.
    pub key: String,
    pub fence: Fence,
}

/// One read of [`StreamStore::fenced_xreadgroup_many`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedRead {
    pub fence: FenceCheck,
    pub stream: String,
    pub from: ReadFrom,
    pub count: usize,
}

/// One ack of [`StreamStore::fenced_xack_many`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedAck {
    pub fence: FenceCheck,
    pub stream: String,
    pub ids: Vec<EntryId>,
}

/// A stream entry id `<ms>-<seq>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EntryId {
    pub ms: u64,
    pub seq: u64,
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

impl std::str::FromStr for EntryId {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || StoreError::Protocol(format!("bad entry id {s:?}"));
        let (ms, seq) = s.split_once('-').ok_or_else(bad)?;
        Ok(EntryId { ms: ms.parse().map_err(|_| bad())?, seq: seq.parse().map_err(|_| bad())? })
    }
}

/// One stream entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamEntry {
    pub id: EntryId,
    pub fields: Vec<(String, Vec<u8>)>,
}

/// Where an XREADGROUP starts on one stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom {
    /// `>`: entries never delivered to the group.
    New,
    /// `0`: this consumer's own pending entries (redelivery after a restart).
    OwnPending,
}

/// Where a new consumer group starts (the id argument of `XGROUP CREATE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupStart {
    /// `0`: every entry of the stream, including those published before the group existed.
    Beginning,
    /// `$`: only entries added after the group was created. Never right for a shard stream:
    /// entries published before the first consumer set the shard up would be skipped.
    Latest,
}

/// What [`StreamStore::wait_for_entries`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Doorbell {
    /// True when some stream held an entry newer than its id before `block_ms` passed (or at
    /// once). False after the full wait with nothing newer.
    pub rang: bool,
    /// The id each stream was watched after, in the order asked: the caller's id, or the group's
    /// last-delivered id where the caller gave none. The caller keeps these for its next wait.
    pub after: Vec<EntryId>,
}

/// The consumer and producer libraries' view of the shard streams.
pub trait StreamStore: Send + Sync + 'static {
    /// XADD with an optional approximate MAXLEN; returns the new entry's id.
    fn xadd(
        &self,
        stream: &str,
        fields: Vec<(String, Vec<u8>)>,
        maxlen: Option<u64>,
    ) -> impl Future<Output = Result<EntryId, StoreError>> + Send;

    /// XGROUP CREATE <stream> <group> 0 MKSTREAM unless the group exists (then a no-op). New groups
    /// start at the stream's beginning (`0`) so nothing published before the first consumer is
    /// skipped.
    fn ensure_group(&self, stream: &str, group: &str) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.create_group(stream, group, GroupStart::Beginning)
    }

    /// XGROUP CREATE <stream> <group> <start> MKSTREAM unless the group exists (then a no-op).
    /// Callers use [`StreamStore::ensure_group`]; only a planted bug starts elsewhere.
    fn create_group(
        &self,
        stream: &str,
        group: &str,
        start: GroupStart,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// XREADGROUP GROUP group consumer COUNT count [BLOCK block_ms] STREAMS ... Returns entries per
    /// stream (streams with none are omitted). The in-memory fake never blocks.
    fn xreadgroup(
        &self,
        group: &str,
        consumer: &str,
        streams: &[(String, ReadFrom)],
        count: usize,
        block_ms: Option<u64>,
    ) -> impl Future<Output = Result<Vec<(String, Vec<StreamEntry>)>, StoreError>> + Send;

    /// XACK; returns how many entries were acknowledged.
    fn xack(&self, stream: &str, group: &str, ids: &[EntryId]) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// XAUTOCLAIM stream group consumer min_idle_ms 0-0 COUNT count, repeated until the whole
    /// pending list was scanned: moves every other consumer's pending entries to `consumer` and
    /// returns them (the new owner of a shard redelivers what the previous owner never acked).
    fn claim_all_pending(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> impl Future<Output = Result<Vec<StreamEntry>, StoreError>> + Send;

    /// `XREADGROUP … COUNT count STREAMS stream <from>` (never `BLOCK`) if `fence` is the shard's
    /// fence, in one atomic step with the check. The check accepts exactly the fence the key
    /// holds, or a fence with a strictly larger counter, which then replaces it (a raise a
    /// failover lost heals on first use by the newer grant); anything else is
    /// [`StoreError::Fenced`] and nothing is read.
    fn fenced_xreadgroup(
        &self,
        fence: &FenceCheck,
        group: &str,
        consumer: &str,
        stream: &str,
        from: ReadFrom,
        count: usize,
    ) -> impl Future<Output = Result<Vec<StreamEntry>, StoreError>> + Send;

    /// `XACK` under the same fence check as [`StreamStore::fenced_xreadgroup`].
    fn fenced_xack(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        ids: &[EntryId],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Several [`StreamStore::fenced_xreadgroup`] calls for one consumer, one result per read, in
    /// order. Each read's check and read are one atomic step; the reads together are not (other
    /// clients' commands may run between them). `Err`: the outcome of every read is unknown (the
    /// connection failed, the call timed out, or the server is no longer a writable master);
    /// some reads may have run, and what they delivered stays pending at Redis.
    ///
    /// The default sends every read at once, each its own call (a pipeline's worth of steps,
    /// which other clients' commands may interleave), so no read waits for another after the
    /// caller's checks — a consumer checks its lease right before this call, not between its
    /// reads. `RedisStore` reads through its gates as one pipeline of plain `XREADGROUP`s and
    /// the rest as one script call (a second round trip only when a gate is missing), per slot;
    /// `MemoryStore` as one round trip in which each read is its own step, other clients'
    /// commands running in between.
    fn fenced_xreadgroup_many(
        &self,
        group: &str,
        consumer: &str,
        reads: &[FencedRead],
    ) -> impl Future<Output = Result<Vec<Result<Vec<StreamEntry>, StoreError>>, StoreError>> + Send {
        let calls = reads
            .iter()
            .map(|read| self.fenced_xreadgroup(&read.fence, group, consumer, &read.stream, read.from, read.count));
        let calls: Vec<_> = calls.collect();
        async move { Ok(join_all(calls).await) }
    }

    /// Several [`StreamStore::fenced_xack`] calls, one result per ack, in order; atomic per ack,
    /// not together, like [`StreamStore::fenced_xreadgroup_many`] (on Redis one transaction or one
    /// script call, `RedisStoreOptions::watched_acks`).
    fn fenced_xack_many(
        &self,
        group: &str,
        acks: &[FencedAck],
    ) -> impl Future<Output = Result<Vec<Result<u64, StoreError>>, StoreError>> + Send {
        let calls: Vec<_> = acks.iter().map(|ack| self.fenced_xack(&ack.fence, &ack.stream, group, &ack.ids)).collect();
        async move { Ok(join_all(calls).await) }
    }

    /// The consumer's doorbell: waits up to `block_ms` (> 0) until some stream holds an entry with
    /// an id larger than its given id, reading nothing for the group (`XREAD COUNT 1 BLOCK block_ms
    /// STREAMS s1.. id1..`). It is unfenced: it neither delivers, acks nor claims, so a stale
    /// owner waiting on it can do no harm. Never `$`: an entry added between the caller's empty
    /// read and the XREAD would not ring.
    ///
    /// A stream given `None` is watched after `group`'s last-delivered id, read first (XINFO
    /// GROUPS, one more round trip): right after a read of `>` returned nothing, every entry of the
    /// stream is delivered, so this id is race-free — entries added later have larger ids (ids
    /// only grow). A missing group or stream is watched after `0-0`. The ids used are returned so
    /// the caller can pass them next time.
    ///
    /// On a Redis Cluster one XREAD cannot span slots: `RedisStore` blocks one connection per slot,
    /// concurrently, and rings when the first does (the consumer still sends one call for all its
    /// shards). The in-memory fake never blocks the store: it sleeps until an XADD (or the deadline) and
    /// re-checks at the next step boundary (tokio time).
    fn wait_for_entries(
        &self,
        group: &str,
        streams: &[(String, Option<EntryId>)],
        block_ms: u64,
    ) -> impl Future<Output = Result<Doorbell, StoreError>> + Send;

    /// [`StreamStore::claim_all_pending`] under the same fence check, each page in one atomic
    /// step with its own check. On Redis a page is one script call of up to 1,000 entries (an
    /// unfenced page one XAUTOCLAIM of 100), so other clients' commands run between pages, and a
    /// claim can stop midway (an error, or `Fenced` by a raise between pages) with its earlier
    /// pages already moved to `consumer`; the fake claims everything in one step.
    fn fenced_claim_all_pending(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> impl Future<Output = Result<Vec<StreamEntry>, StoreError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The aggregate holds the group's secret view key: `Debug` (logs, panics) must not show it.
    #[test]
    fn debug_output_of_a_record_or_a_write_does_not_show_the_aggregate() {
        let secret = "{\"viewKey\":\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"}";
        let record = StoredRecord {
            aggregate: secret.into(),
            revision: 3,
            schema_version: 1,
            layout_version: 1,
            updated_at_ms: 0,
            write_id: "w".into(),
        };
        let write = WriteRequest {
            expected: Some(record.cas_stamp()),
            aggregate: secret.into(),
            schema_version: 1,
            layout_version: 1,
            updated_at_ms: 0,
            write_id: "w2".into(),
            liveness_guards: Vec::new(),
            liveness_remove: Vec::new(),
        };
        for shown in [format!("{record:?}"), format!("{write:?}"), format!("{record:#?}")] {
            assert!(!shown.contains("00112233"), "{shown}");
            assert!(shown.contains(&format!("<{} bytes of JSON>", secret.len())), "{shown}");
        }
        assert!(format!("{record:?}").contains("revision: 3"));
    }

    /// A primary that claims itself exactly the slots the view lists for it.
    fn primary(node: &str, run_id: &str, replid: &str, slots: &[(u16, u16)]) -> PrimaryIdentity {
        PrimaryIdentity {
            node: node.into(),
            run_id: run_id.into(),
            replication_id: replid.into(),
            slots: slots.to_vec(),
            claimed: slots.to_vec(),
            handed: Vec::new(),
            migrating: Vec::new(),
            importing: Vec::new(),
            idle: false,
        }
    }

    fn claiming(primary: &PrimaryIdentity, claimed: &[(u16, u16)]) -> PrimaryIdentity {
        PrimaryIdentity { claimed: claimed.to_vec(), ..primary.clone() }
    }

    /// Three primaries that agree with the view, the cluster every case below starts from.
    fn three() -> [PrimaryIdentity; 3] {
        [
            primary("a:1/a", "ra", "xa", &[(0, 5460)]),
            primary("b:1/b", "rb", "xb", &[(5461, 10922)]),
            primary("c:1/c", "rc", "xc", &[(10923, 16383)]),
        ]
    }

    fn cluster(primaries: Vec<PrimaryIdentity>) -> ServerIdentity {
        let join = |f: fn(&PrimaryIdentity) -> &str| {
            primaries.iter().map(|p| format!("{}={}", p.node, f(p))).collect::<Vec<_>>().join(",")
        };
        ServerIdentity { run_id: join(|p| &p.run_id), replication_id: join(|p| &p.replication_id), primaries }
    }

    /// A slot's own primary, read again alone, confirms the slot only when it alone held it at
    /// the last read and is still the same server claiming it, with no handover or migration.
    #[test]
    fn a_slot_is_confirmed_by_its_sole_holder_read_again_unchanged() {
        let [a, b, c] = three();
        let seen = cluster(vec![a.clone(), b.clone(), c.clone()]);
        assert_eq!(seen.sole_holder(7000).map(PrimaryIdentity::node_key), Some("b"));
        assert!(seen.slot_unchanged(7000, &b), "unchanged");
        assert!(!seen.slot_unchanged(7000, &a), "another node");
        assert!(!seen.slot_unchanged(0, &b), "not the slot's holder");
        let changed = [
            PrimaryIdentity { run_id: "rb2".into(), ..b.clone() },
            PrimaryIdentity { replication_id: "xb2".into(), ..b.clone() },
            claiming(&b, &[]),
            claiming(&b, &[(5461, 6999)]),
            PrimaryIdentity { handed: vec![(7000, 7000, "a".into())], ..b.clone() },
            PrimaryIdentity { migrating: vec![(7000, "a".into())], ..b.clone() },
            PrimaryIdentity { importing: vec![(7000, "a".into())], ..b.clone() },
        ];
        for now in changed {
            assert!(!seen.slot_unchanged(7000, &now), "{now:?}");
        }
        // A slot the last read found migrating, or disputed, has no sole holder: no verdict.
        let migrating =
            cluster(vec![a.clone(), PrimaryIdentity { migrating: vec![(7000, "c".into())], ..b.clone() }, c.clone()]);
        assert_eq!(migrating.sole_holder(7000), None);
        assert!(!migrating.slot_unchanged(7000, &b));
        let disputed = cluster(vec![a.clone(), claiming(&b, &[]), c]);
        assert_eq!(disputed.sole_holder(7000), None);
        // One server: no slot map.
        let one = ServerIdentity { run_id: "r".into(), replication_id: "x".into(), primaries: Vec::new() };
        assert_eq!(one.sole_holder(7000), None);
        assert!(!one.slot_unchanged(7000, &b));
    }

    #[test]
    fn a_failover_of_one_primary_may_have_lost_only_the_slots_it_served() {
        let a = primary("a:1/a", "ra", "xa", &[(0, 5460)]);
        let b = primary("b:1/b", "rb", "xb", &[(5461, 10922)]);
        let c = primary("c:1/c", "rc", "xc", &[(10923, 16383)]);
        let before = cluster(vec![a.clone(), b.clone(), c.clone()]);
        // b's replica took over: a new node with a new replication id serves b's slots.
        let after = cluster(vec![a.clone(), primary("d:1/d", "rd", "xd2", &[(5461, 10922)]), c.clone()]);
        assert!(!before.same_servers(&after));
        assert!(before.may_have_lost(&after, 7000));
        assert!(!before.may_have_lost(&after, 0) && !before.may_have_lost(&after, 16383));
        // b restarted in place (new run id), or was promoted again (new replication id).
        for b2 in [primary("b:1/b", "rb2", "xb", &[(5461, 10922)]), primary("b:1/b", "rb", "xb2", &[(5461, 10922)])] {
            let after = cluster(vec![a.clone(), b2, c.clone()]);
            assert!(before.may_have_lost(&after, 5461) && !before.may_have_lost(&after, 5460));
        }
        // Slots moved between unchanged primaries: the same servers, and a migration loses
        // nothing, whatever else made the coordinator compare the two reads.
        let migrated = cluster(vec![
            primary("a:1/a", "ra", "xa", &[(0, 5459)]),
            primary("b:1/b", "rb", "xb", &[(5460, 10922)]),
            c.clone(),
        ]);
        assert!(before.same_servers(&migrated));
        assert!(!before.may_have_lost(&migrated, 5460) && !before.may_have_lost(&migrated, 5459));
        // A slot that moved while any primary failed over or restarted counts: its keys may have
        // passed through that primary. One that stayed on an unchanged primary does not.
        let migrated_and_failed_over = cluster(vec![
            primary("a:1/a", "ra", "xa", &[(0, 5459)]),
            primary("b:1/b", "rb", "xb", &[(5460, 10922)]),
            primary("d:1/d", "rd", "xd", &[(10923, 16383)]),
        ]);
        assert!(before.may_have_lost(&migrated_and_failed_over, 5460));
        // A primary added between the reads (it may have held the slot on the way): counts too.
        let via_new = cluster(vec![
            primary("a:1/a", "ra", "xa", &[(0, 5459)]),
            primary("b:1/b", "rb", "xb", &[(5460, 10922)]),
            c.clone(),
            primary("e:1/e", "re", "xe", &[]),
        ]);
        assert!(before.may_have_lost(&via_new, 5460) && !before.may_have_lost(&via_new, 5459));
        assert!(!before.may_have_lost(&migrated_and_failed_over, 5459));
        assert!(before.may_have_lost(&migrated_and_failed_over, 16383));
        // An unserved slot, and one server (no slot map), always count as lost.
        let partial = cluster(vec![a, b]);
        assert!(before.may_have_lost(&partial, 16000));
        let single = ServerIdentity { run_id: "r".into(), replication_id: "x".into(), primaries: Vec::new() };
        let restarted = ServerIdentity { run_id: "r2".into(), ..single.clone() };
        assert!(single.may_have_lost(&restarted, 0) && single.may_have_lost(&single, 0));
    }

    #[test]
    fn a_failover_of_a_migrations_target_may_have_lost_the_slot_the_source_still_serves() {
        let [a, b, c] = three();
        let before = cluster(vec![a.clone(), b.clone(), c.clone()]);
        // Slot 7000 is migrating from b to c: b still claims it and the view lists b, but keys may
        // already be on c (moved by MIGRATE, or written there through ASK).
        let b_migrating = PrimaryIdentity { migrating: vec![(7000, "c".into())], ..b.clone() };
        let c_importing = PrimaryIdentity { importing: vec![(7000, "b".into())], ..c.clone() };
        let during = cluster(vec![a.clone(), b_migrating.clone(), c_importing.clone()]);
        assert_eq!(during.disputed_slots(), vec![], "a migration between listed primaries is no dispute");
        assert!(before.same_servers(&during) && !before.may_have_lost(&during, 7000));
        // Either side's account alone names the target (the importer is set first, the source second).
        for one_side in [
            cluster(vec![a.clone(), b_migrating.clone(), c.clone()]),
            cluster(vec![a.clone(), b.clone(), c_importing.clone()]),
        ] {
            assert_eq!(one_side.holders(7000).len(), 2, "{one_side:?}");
        }
        // c fails over (its replica d takes its slots, with a new replication id) while the slot is
        // still listed for b: the keys already on c may be lost, so the slot counts; b's other slots
        // and a's do not.
        let d = primary("d:1/d", "rd", "xd", &[(10923, 16383)]);
        let after = cluster(vec![a.clone(), b_migrating.clone(), d.clone()]);
        assert!(during.may_have_lost(&after, 7000) && during.may_have_lost(&after, 12000));
        assert!(!during.may_have_lost(&after, 7001) && !during.may_have_lost(&after, 100));
        // The read after the failover alone says as much: b migrates the slot to a node it does not
        // list, so the slot is disputed (even to a reader that never saw the migration start).
        assert_eq!(after.disputed_slots(), vec![(7000, 7000)]);
        assert!(before.may_have_lost(&after, 7000) && !before.may_have_lost(&after, 7001));
        // Another primary fails over while the migration lasts (a reshard keeps one slot open for
        // as long as it runs): b and c are unchanged, so the slot they both hold lost nothing.
        let a_failed_over =
            cluster(vec![primary("e:1/e", "re", "xe", &[(0, 5460)]), b_migrating.clone(), c_importing.clone()]);
        assert!(during.may_have_lost(&a_failed_over, 100) && !during.may_have_lost(&a_failed_over, 7000));
        // The migration ends between unchanged primaries: nothing lost, no change.
        let settled = cluster(vec![
            a.clone(),
            claiming(
                &PrimaryIdentity { slots: vec![(5461, 6999), (7001, 10922)], ..b.clone() },
                &[(5461, 6999), (7001, 10922)],
            ),
            claiming(
                &PrimaryIdentity { slots: vec![(7000, 7000), (10923, 16383)], ..c.clone() },
                &[(7000, 7000), (10923, 16383)],
            ),
        ]);
        assert!(during.same_servers(&settled) && !during.may_have_lost(&settled, 7000));
        // A target that claims nothing (a demoted primary the view still lists) is no holder to
        // compare: disputed.
        let c_demoted = PrimaryIdentity { claimed: vec![], ..c };
        assert_eq!(cluster(vec![a, b_migrating, c_demoted]).holders(7000), Vec::<&PrimaryIdentity>::new());
    }

    #[test]
    fn a_slot_resharded_onto_an_idle_master_loses_nothing_unless_that_master_changes() {
        let [a, b, c] = three();
        // n is a master serving no slot (a node just added to scale out): no view lists it, a
        // listed primary's CLUSTER NODES names it, and its own INFO says master.
        let n = PrimaryIdentity { idle: true, ..primary("n:1/n", "rn", "xn", &[]) };
        let before = cluster(vec![a.clone(), b.clone(), c.clone(), n.clone()]);
        assert_eq!(before.disputed_slots(), vec![]);
        // `redis-cli --cluster reshard` moves slot 7000 from b to n: a migration between listed,
        // live primaries, held by both while it lasts.
        let b_migrating = PrimaryIdentity { migrating: vec![(7000, "n".into())], ..b.clone() };
        let n_importing = PrimaryIdentity { importing: vec![(7000, "b".into())], ..n.clone() };
        let during = cluster(vec![a.clone(), b_migrating.clone(), c.clone(), n_importing.clone()]);
        assert_eq!(during.disputed_slots(), vec![], "a migration onto an idle master is no dispute");
        assert_eq!(during.holders(7000).len(), 2);
        assert!(before.same_servers(&during) && !before.may_have_lost(&during, 7000));
        // The handover reached n first: n claims the slot the view still lists for b, and names b
        // for nothing else: the two unchanged primaries hold it.
        let n_claims = claiming(&n, &[(7000, 7000)]);
        let handing = cluster(vec![a.clone(), b_migrating.clone(), c.clone(), n_claims.clone()]);
        assert_eq!(handing.disputed_slots(), vec![]);
        assert!(!during.may_have_lost(&handing, 7000) && !before.may_have_lost(&handing, 7000));
        // Settled: the view lists n for the slot. Nothing lost, whichever read came before.
        let b_after = PrimaryIdentity { slots: vec![(5461, 6999), (7001, 10922)], ..b.clone() };
        let n_after = PrimaryIdentity { slots: vec![(7000, 7000)], idle: false, ..n_claims.clone() };
        let settled = cluster(vec![a.clone(), claiming(&b_after, &b_after.slots.clone()), c.clone(), n_after]);
        assert_eq!(settled.disputed_slots(), vec![]);
        for earlier in [&before, &during, &handing] {
            assert!(!earlier.may_have_lost(&settled, 7000), "{earlier:?}");
        }
        // A cluster that announces hostnames: CLUSTER SLOTS names n by hostname once it serves a
        // slot, CLUSTER NODES named it by IP while it was idle. The node id is what matches.
        let by_hostname = cluster(
            settled
                .primaries
                .iter()
                .map(|p| PrimaryIdentity { node: p.node.replace("n:1/", "host-n:1/"), ..p.clone() })
                .collect(),
        );
        for earlier in [&before, &during, &handing] {
            assert!(!earlier.may_have_lost(&by_hostname, 7000), "{earlier:?}");
        }
        // An idle master's own account names an owner for every slot, as fresh as its gossip:
        // one it names that no read lists (a demoted primary, say) disputes nothing.
        let n_lagging = PrimaryIdentity { handed: vec![(0, 16383, "gone".into())], ..n.clone() };
        assert_eq!(cluster(vec![a.clone(), b.clone(), c.clone(), n_lagging]).disputed_slots(), vec![]);
        // n restarts without its data (a new run id) before the handover: the keys MIGRATE moved
        // there are gone, so the slot counts; b's other slots do not.
        let n_restarted = PrimaryIdentity { run_id: "rn2".into(), ..n_importing.clone() };
        let restarted = cluster(vec![a.clone(), b_migrating.clone(), c.clone(), n_restarted]);
        assert!(during.may_have_lost(&restarted, 7000) && !during.may_have_lost(&restarted, 7001));
        // A read that could not reach n leaves it out: b migrates the slot to a node that read
        // does not list, so the slot is disputed, the safe case.
        let unreached = cluster(vec![a.clone(), b_migrating.clone(), c.clone()]);
        assert_eq!(unreached.disputed_slots(), vec![(7000, 7000)]);
        assert!(during.may_have_lost(&unreached, 7000));
        // Without the idle master in the identity (before this was read), the same migration was
        // disputed: the false evidence an operator's scale-out used to cause.
        let without_n = cluster(vec![a, b_migrating, c]);
        assert_eq!(without_n.disputed_slots(), vec![(7000, 7000)]);
        // An identity recorded before `idle` existed reads it as false.
        let old: PrimaryIdentity =
            serde_json::from_str(r#"{"node":"n:1/n","run_id":"rn","replication_id":"xn","slots":[],"claimed":[]}"#)
                .expect("an old identity decodes");
        assert!(!old.idle && !old.live());
    }

    #[test]
    fn an_unchanged_cluster_whose_primaries_confirm_the_view_lost_nothing() {
        let [a, b, c] = three();
        let before = cluster(vec![a.clone(), b.clone(), c.clone()]);
        let again = cluster(vec![a, b, c]);
        assert_eq!(before.disputed_slots(), vec![]);
        assert!(before.same_servers(&again));
        assert!((0..keys::CLUSTER_SLOTS).all(|slot| !before.may_have_lost(&again, slot)));
    }

    #[test]
    fn two_unchanged_primaries_claiming_a_slot_are_a_handover_and_a_new_claimant_is_a_loss() {
        let [a, b, c] = three();
        let before = cluster(vec![a.clone(), b.clone(), c.clone()]);
        // The view lists b for its slots, and a claims 5461..=6000 too: both primaries are the
        // ones of the read before, unchanged — a migration's handover (or a source that has not
        // learnt of it yet). Not disputed, no change, nothing lost.
        let handover = cluster(vec![claiming(&a, &[(0, 6000)]), b.clone(), c.clone()]);
        assert_eq!(handover.disputed_slots(), vec![]);
        assert!(before.same_servers(&handover));
        assert!((0..keys::CLUSTER_SLOTS).all(|slot| !before.may_have_lost(&handover, slot)));
        // b's replica d was promoted on the other side of a partition and claims b's slots, and
        // the deposed b still does: d is new, so b's slots may have lost writes, a's did not.
        let d = primary("d:1/d", "rd", "xd", &[]);
        let split = cluster(vec![a.clone(), b.clone(), c.clone(), claiming(&d, &[(5461, 10922)])]);
        assert_eq!(split.disputed_slots(), vec![], "two claimants, the view lists one: only the read before tells");
        assert!(!before.same_servers(&split), "a new primary is a change");
        assert!(before.may_have_lost(&split, 5461) && before.may_have_lost(&split, 10922));
        assert!(!before.may_have_lost(&split, 0) && !before.may_have_lost(&split, 16383));
        // Two claimants the view lists neither of: a dispute.
        let b_listed_less = PrimaryIdentity { slots: vec![(5462, 10922)], ..b.clone() };
        let unlisted_pair = cluster(vec![claiming(&a, &[(0, 5461)]), b_listed_less, c.clone()]);
        assert_eq!(unlisted_pair.disputed_slots(), vec![(5461, 5461)]);
        // Nobody claims 5461..=6000: b (listed) names a for them, and a still names b: a handover
        // whose last SETSLOT reached the source b first. Held by both, no change, nothing lost.
        let b_handed = PrimaryIdentity { handed: vec![(5461, 6000, "a".into())], ..claiming(&b, &[(6001, 10922)]) };
        let a_still_names_b = PrimaryIdentity { handed: vec![(5461, 10922, "b".into())], ..a.clone() };
        let in_flight = cluster(vec![a_still_names_b.clone(), b_handed.clone(), c.clone()]);
        assert_eq!(in_flight.disputed_slots(), vec![]);
        assert!(before.same_servers(&in_flight));
        assert!(!before.may_have_lost(&in_flight, 5461) && !in_flight.may_have_lost(&handover, 5461));
        // If a does not name b back (it heard of another owner), or b claims nothing (demoted):
        // disputed.
        let a_names_c = PrimaryIdentity { handed: vec![(5461, 10922, "c".into())], ..a.clone() };
        let crossed = cluster(vec![a_names_c, b_handed.clone(), c.clone()]);
        assert_eq!(crossed.disputed_slots(), vec![(5461, 6000)]);
        let b_demoted = PrimaryIdentity { claimed: vec![], ..b_handed };
        assert_eq!(cluster(vec![a_still_names_b, b_demoted, c.clone()]).disputed_slots(), vec![(5461, 10922)]);
        // A listed primary that claims nothing does not vouch, even naming the claimant; nor does
        // an in-flight target that claims nothing.
        let b_demoted_naming_a =
            PrimaryIdentity { claimed: vec![], handed: vec![(5461, 10922, "a".into())], ..b.clone() };
        let b_demoted = cluster(vec![a.clone(), b_demoted_naming_a, c.clone()]);
        assert_eq!(b_demoted.disputed_slots(), vec![(5461, 10922)]);
        let a_demoted_naming_b =
            PrimaryIdentity { claimed: vec![], handed: vec![(5461, 6000, "b".into())], ..a.clone() };
        let b_handing_to_a =
            PrimaryIdentity { handed: vec![(5461, 6000, "a".into())], ..claiming(&b, &[(6001, 10922)]) };
        assert_eq!(
            cluster(vec![a_demoted_naming_b, b_handing_to_a, c.clone()]).disputed_slots(),
            vec![(0, 6000)],
            "a claims nothing: its own slots and the in-flight ones are disputed"
        );
        // c's own account names for b's slots a node the view does not list (b's replica,
        // promoted on the other side of a partition): the view's side has not heard, disputed.
        let c_names_e = PrimaryIdentity { handed: vec![(5461, 10922, "e".into())], ..c.clone() };
        let behind = cluster(vec![a.clone(), b.clone(), c_names_e]);
        assert_eq!(behind.disputed_slots(), vec![(5461, 10922)]);
        assert!(before.may_have_lost(&behind, 7000) && !before.may_have_lost(&behind, 0));
        // Three claimants are a dispute whatever came before.
        let three_way = cluster(vec![claiming(&a, &[(0, 6000)]), b, claiming(&c, &[(5461, 5461), (10923, 16383)])]);
        assert_eq!(three_way.disputed_slots(), vec![(5461, 5461)]);
        assert!(before.may_have_lost(&three_way, 5461) && !before.may_have_lost(&three_way, 5462));
    }

    #[test]
    fn a_demoted_primary_the_view_still_lists_serves_nothing() {
        let [a, b, c] = three();
        let before = cluster(vec![a.clone(), b.clone(), c.clone()]);
        // b's own INFO says `role:slave`: it claims nothing, and nobody else claims its slots.
        let demoted = cluster(vec![a, claiming(&b, &[]), c]);
        assert_eq!(demoted.disputed_slots(), vec![(5461, 10922)]);
        assert!(!before.same_servers(&demoted));
        assert!(before.may_have_lost(&demoted, 7000));
        assert!(!before.may_have_lost(&demoted, 0) && !before.may_have_lost(&demoted, 16383));
    }

    #[test]
    fn a_view_behind_a_settled_handover_is_judged_by_the_claimant_and_other_disagreements_are_disputes() {
        let [a, b, c] = three();
        let before = cluster(vec![a.clone(), b.clone(), c.clone()]);
        // The view lists a for 5000..=5460; a, a live primary, says c serves them now, and c
        // agrees: the view's node has not yet learnt of the migration. Not disputed, served by c.
        let c_took = &[(5000, 5460), (10923, 16383)];
        let a_handed = PrimaryIdentity { handed: vec![(5000, 5460, "c".into())], ..claiming(&a, &[(0, 4999)]) };
        let stale = cluster(vec![a_handed.clone(), b.clone(), claiming(&c, c_took)]);
        assert_eq!(stale.disputed_slots(), vec![]);
        assert!(before.same_servers(&stale));
        assert!(!before.may_have_lost(&stale, 5000) && !before.may_have_lost(&stale, 4999));
        // The same stale view while c failed over to d, whom the view already knows: 5000..=5460
        // are judged by their claimant d, a new server, so they count.
        let d = primary("d:1/d", "rd", "xd", &[(10923, 16383)]);
        let a_handed_to_d = PrimaryIdentity { handed: vec![(5000, 5460, "d".into())], ..a_handed.clone() };
        let stale_failed_over = cluster(vec![a_handed_to_d, b.clone(), claiming(&d, c_took)]);
        assert_eq!(stale_failed_over.disputed_slots(), vec![]);
        assert!(before.may_have_lost(&stale_failed_over, 5000) && before.may_have_lost(&stale_failed_over, 16383));
        assert!(!before.may_have_lost(&stale_failed_over, 4999));
        // a handed them to c, but d claims them (c's replica, promoted behind a's back, while c has
        // not heard yet... or anything else a's account does not explain): disputed.
        let unexplained = cluster(vec![a_handed.clone(), b.clone(), claiming(&d, c_took)]);
        assert_eq!(unexplained.disputed_slots(), vec![(5000, 5460)]);
        assert!(before.may_have_lost(&unexplained, 5000));
        // a disowns them without naming anyone (an identity recorded before `handed`): disputed.
        let unnamed = cluster(vec![claiming(&a, &[(0, 4999)]), b.clone(), claiming(&c, c_took)]);
        assert_eq!(unnamed.disputed_slots(), vec![(5000, 5460)]);
        // A listed primary that claims nothing (demoted) does not vouch for another claimant.
        let demoted = cluster(vec![claiming(&a, &[]), b.clone(), claiming(&c, &[(0, 5460), (10923, 16383)])]);
        assert_eq!(demoted.disputed_slots(), vec![(0, 5460)]);
        assert!(before.may_have_lost(&demoted, 5000));
        // A slot the view lists nobody for but one primary claims is disputed as well.
        let unlisted =
            cluster(vec![primary("a:1/a", "ra", "xa", &[(0, 5459)]), claiming(&b, &[(5460, 10922)]), c.clone()]);
        assert_eq!(unlisted.disputed_slots(), vec![(5460, 5460)]);
        // A slot nobody claims or lists (a Cluster without full coverage) is disputed too.
        let uncovered = cluster(vec![a.clone(), b.clone()]);
        assert_eq!(uncovered.disputed_slots(), vec![(10923, 16383)]);
    }

    #[test]
    fn a_dispute_that_lasts_is_no_news_and_its_end_is() {
        let [a, b, c] = three();
        // b disowns 5461..=6000 (`CLUSTER DELSLOTS` on it alone) and nobody claims them.
        let disowned = cluster(vec![a.clone(), claiming(&b, &[(6001, 10922)]), c.clone()]);
        assert_eq!(disowned.disputed_slots(), vec![(5461, 6000)]);
        assert!(disowned.same_servers(&disowned.clone()), "the same dispute read again");
        let healed = cluster(vec![a.clone(), b.clone(), c.clone()]);
        assert!(!disowned.same_servers(&healed), "a dispute that ends is a change");
        assert!(disowned.may_have_lost(&healed, 6000) && !disowned.may_have_lost(&healed, 6001));

        // Behind a partition: b names x, a node the view does not list, for 5461..=6000 (a replica
        // promoted on the far side). The same account read again is no news; x replaced by y (its
        // own replica taking over) is a change, evidence for those slots only.
        let b_names = |to: &str| {
            cluster(vec![
                a.clone(),
                PrimaryIdentity { handed: vec![(5461, 6000, to.into())], ..claiming(&b, &[(6001, 10922)]) },
                c.clone(),
            ])
        };
        let behind_x = b_names("x");
        assert_eq!(behind_x.disputed_slots(), vec![(5461, 6000)]);
        assert!(behind_x.same_servers(&b_names("x")));
        let behind_y = b_names("y");
        assert_eq!(behind_y.disputed_slots(), behind_x.disputed_slots());
        assert!(!behind_x.same_servers(&behind_y), "churn behind a lasting dispute is a change");
        assert!(behind_x.may_have_lost(&behind_y, 5461) && !behind_x.may_have_lost(&behind_y, 6001));
    }

    #[test]
    fn an_identity_recorded_without_claims_reads_as_disputed() {
        let json = r#"{"run_id":"a:1/a=ra","replication_id":"a:1/a=xa","primaries":
            [{"node":"a:1/a","run_id":"ra","replication_id":"xa","slots":[[0,16383]]}]}"#;
        let old: ServerIdentity = serde_json::from_str(json).expect("decodes without `claimed`");
        assert_eq!(old.primaries[0].claimed, vec![]);
        assert_eq!(old.disputed_slots(), vec![(0, 16383)]);
        let now = cluster(vec![primary("a:1/a", "ra", "xa", &[(0, 16383)])]);
        assert!(!old.same_servers(&now) && old.may_have_lost(&now, 0));
    }
}
