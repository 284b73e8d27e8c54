//! Ground truth kept by the fake for the simulation's checkers: the metadata history ("was this
//! state in the store at time t?") and the stream call logs (who read, added and acked what, when).
//!
//! This module owns the record types and the lookups over them. It never changes store state and
//! never reads a clock: every time stamp is passed in by the caller (the store clock, in
//! milliseconds since the store was created). Invariant: events are appended in time order, so
//! `at_ms` never decreases along [`History::events`].
//!
//! The simulation keeps everything ([`HistoryLimits::UNBOUNDED`]); a store serving real clients
//! (`coordinator serve` without Redis) has no checker to read it and keeps only the newest
//! records ([`HistoryLimits::SERVING`]), so its memory does not grow with every write.

use std::collections::VecDeque;

use crate::core::model::{Fence, GroupId};
use crate::store::{EntryId, ReadFrom, ServerIdentity, StoreError, StoredRecord};

use super::faults::RollbackMode;

/// One change of the metadata keyspace (or of the server's identity), in store-clock order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEvent {
    /// Store-clock time of the change, ms since the store was created.
    pub at_ms: u64,
    pub kind: HistoryKind,
    /// Every metadata key the event changed and its value right after it (`None`: key absent).
    /// Empty when no metadata key changed (a dropped write, an identity change).
    pub metadata_after: Vec<(GroupId, Option<StoredRecord>)>,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HistoryKind {
    /// A `write` passed its checks and was applied with this revision.
    Written { group: GroupId, revision: u64 },
    /// A `write` passed its checks and was acknowledged with this revision, but the write-drop
    /// fault discarded it.
    WriteDropped { group: GroupId, revision: u64 },
    /// A `delete` matched this revision and removed the group's keys.
    Deleted { group: GroupId, revision: u64 },
    /// Fault: the metadata key was deleted behind the coordinator's back (operator, eviction).
    KeyDeleted { group: GroupId },
    /// Fault: the last `undone` journaled writes (of `requested`) were reverted.
    RolledBack { mode: RollbackMode, requested: usize, undone: usize },
    /// Fault: the aggregate was replaced with bytes that are not JSON.
    AggregateCorrupted { group: GroupId },
    /// Fault: the stored `schemaVersion` was set to a value this build may not know.
    SchemaVersionSet { group: GroupId, schema_version: u32 },
    /// The server's identity changed (failover, restart, flush); open connections were broken.
    IdentityChanged { cause: IdentityCause, identity: ServerIdentity },
}

/// Why the server's identity changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdentityCause {
    /// A replica was promoted (see [`RollbackMode::Failover`]).
    Failover,
    /// The server restarted and reloaded its data.
    Restart,
    /// The server restarted empty (`flush_all`).
    FlushAll,
}

/// What a delivery call read from: the two XREADGROUP modes, or an XAUTOCLAIM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadSource {
    /// XREADGROUP `>`.
    New,
    /// XREADGROUP `0`: the consumer's own pending entries.
    OwnPending,
    /// XAUTOCLAIM (`claim_all_pending`): pending entries taken over from any consumer.
    Claim { min_idle_ms: u64 },
}

impl From<ReadFrom> for ReadSource {
    fn from(from: ReadFrom) -> Self {
        match from {
            ReadFrom::New => ReadSource::New,
            ReadFrom::OwnPending => ReadSource::OwnPending,
        }
    }
}

/// One stream of one delivery call (XREADGROUP or XAUTOCLAIM). Every call is logged, including
/// calls that returned nothing and calls that failed (then `error` is set and `ids` is empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRecord {
    /// Store-clock time the client issued the call (before any injected latency).
    pub issued_at_ms: u64,
    /// Store-clock time the server executed it (or the call failed).
    pub at_ms: u64,
    /// The stream consumer group.
    pub group: String,
    pub consumer: String,
    pub stream: String,
    pub from: ReadSource,
    /// Entry ids delivered to `consumer`, in order (including deleted-but-pending ones).
    pub ids: Vec<EntryId>,
    /// Why the call failed, if it did.
    pub error: Option<StoreError>,
    /// The fence the call presented (`None`: an unfenced call).
    pub fence: Option<Fence>,
    /// How many [`HistoryEvent`]s had happened when the server ran the call: the call came after
    /// exactly those metadata changes (finer than `at_ms`, which several steps may share).
    pub history_len: usize,
}

/// An acknowledged XADD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddRecord {
    pub at_ms: u64,
    pub stream: String,
    pub id: EntryId,
}

/// An executed XACK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckRecord {
    pub at_ms: u64,
    pub stream: String,
    pub group: String,
    /// The ids that were pending and are now acknowledged (ids not pending are left out).
    pub ids: Vec<EntryId>,
    /// The fence the XACK presented (`None`: an unfenced call).
    pub fence: Option<Fence>,
    /// As [`ReadRecord::history_len`].
    pub history_len: usize,
}

/// How many records each part of the [`History`] keeps; the oldest are dropped beyond that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Metadata events ([`HistoryEvent`]).
    pub events_max: usize,
    /// Records of each stream log (reads, adds, acks).
    pub log_len_max: usize,
}

impl HistoryLimits {
    /// Keep everything: the simulation's checkers read all of it.
    pub const UNBOUNDED: Self = Self { events_max: usize::MAX, log_len_max: usize::MAX };
    /// Keep a short tail for debugging: nothing reads more of it in a serving process. Each event
    /// holds whole records (a group of 65,536 shards has an aggregate of several MB), so the
    /// metadata tail is short: 256 events of such records can hold gigabytes (an outside review's
    /// join flood on such groups left 3.77 GB resident on the embedded store, 618 MB on Redis,
    /// after the groups were empty; how much of it was this tail was not measured).
    pub const SERVING: Self = Self { events_max: 16, log_len_max: 256 };
}

impl Default for HistoryLimits {
    fn default() -> Self {
        Self::UNBOUNDED
    }
}

/// Everything recorded, up to its [`HistoryLimits`]. Unbounded in the simulation on purpose:
/// checkers need all of it; a long run can drop the stream logs with `clear_logs`.
#[derive(Clone, Debug, Default)]
pub(super) struct History {
    limits: HistoryLimits,
    events: VecDeque<HistoryEvent>,
    reads: VecDeque<ReadRecord>,
    adds: VecDeque<AddRecord>,
    acks: VecDeque<AckRecord>,
    /// Metadata events ever recorded (kept or dropped): the `history_len` of a stream call.
    events_total: usize,
    /// Fenced operations refused as `FENCED`, by operation (`XREADGROUP`, `XACK`, `XAUTOCLAIM`).
    pub(super) fence_refusals: std::collections::BTreeMap<&'static str, u64>,
}

/// Appends `record`, dropping the oldest beyond `len_max`.
fn push_capped<T>(log: &mut VecDeque<T>, len_max: usize, record: T) {
    if len_max == 0 {
        return;
    }
    if log.len() >= len_max {
        log.pop_front();
    }
    log.push_back(record);
}

impl History {
    pub(super) fn new(limits: HistoryLimits) -> Self {
        Self { limits, ..Self::default() }
    }

    pub(super) fn push_event(
        &mut self,
        at_ms: u64,
        kind: HistoryKind,
        metadata_after: Vec<(GroupId, Option<StoredRecord>)>,
    ) {
        debug_assert!(self.events.back().is_none_or(|last| last.at_ms <= at_ms), "history goes back in time");
        push_capped(&mut self.events, self.limits.events_max, HistoryEvent { at_ms, kind, metadata_after });
        self.events_total += 1;
    }

    /// Metadata events recorded so far, dropped ones included.
    pub(super) fn events_total(&self) -> usize {
        self.events_total
    }

    pub(super) fn push_read(&mut self, record: ReadRecord) {
        push_capped(&mut self.reads, self.limits.log_len_max, record);
    }

    pub(super) fn push_add(&mut self, record: AddRecord) {
        push_capped(&mut self.adds, self.limits.log_len_max, record);
    }

    pub(super) fn push_ack(&mut self, record: AckRecord) {
        push_capped(&mut self.acks, self.limits.log_len_max, record);
    }

    /// Copies of the logs, oldest first.
    pub(super) fn events(&self) -> Vec<HistoryEvent> {
        self.events.iter().cloned().collect()
    }

    pub(super) fn reads(&self) -> Vec<ReadRecord> {
        self.reads.iter().cloned().collect()
    }

    pub(super) fn adds(&self) -> Vec<AddRecord> {
        self.adds.iter().cloned().collect()
    }

    pub(super) fn acks(&self) -> Vec<AckRecord> {
        self.acks.iter().cloned().collect()
    }

    /// How many records are kept: (events, reads, adds, acks).
    pub(super) fn lens(&self) -> (usize, usize, usize, usize) {
        (self.events.len(), self.reads.len(), self.adds.len(), self.acks.len())
    }

    /// The aggregate of the latest state of `group`'s metadata key that had `revision` and was set
    /// at or before `at_ms`. A state set at `t <= at_ms` was in the store at the moment `t`.
    pub(super) fn record_at(&self, group: &GroupId, revision: u64, at_ms: u64) -> Option<String> {
        self.events
            .iter()
            .rev()
            .skip_while(|event| event.at_ms > at_ms)
            .flat_map(|event| event.metadata_after.iter().rev())
            .find_map(|(g, record)| match record {
                Some(record) if g == group && record.revision == revision => Some(record.aggregate.clone()),
                _ => None,
            })
    }

    /// Moves the metadata history and the read and ack logs out, leaving them empty (the add
    /// log and the counters stay).
    pub(super) fn take(&mut self) -> (Vec<HistoryEvent>, Vec<ReadRecord>, Vec<AckRecord>) {
        let events = std::mem::take(&mut self.events).into();
        let reads = std::mem::take(&mut self.reads).into();
        let acks = std::mem::take(&mut self.acks).into();
        (events, reads, acks)
    }

    pub(super) fn clear_logs(&mut self) {
        self.reads.clear();
        self.adds.clear();
        self.acks.clear();
    }
}
