//! The fault knobs of the in-memory Redis: what the simulation turns to make the store misbehave
//! the ways a real Redis deployment does (see `DESIGN.md`, "fault model tiers", Redis tier).
//!
//! This module owns the fault settings ([`Faults`]) and the knob methods on [`MemoryStore`]. Knobs
//! act immediately, never wait and never fail: they are the simulator's hands, not client calls,
//! so outages and latency do not apply to them. Invariants: randomness comes only from the
//! store's seeded RNG, and a probability knob at 0 draws nothing from it (so turning a fault off
//! does not shift the rest of a seeded run).

use std::collections::BTreeSet;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::core::model::GroupId;
use crate::store::{ServerIdentity, StoreError, StoredRecord};

use super::history::{HistoryKind, IdentityCause};
use super::{Inner, MemoryStore};

/// Bytes stored by [`MemoryStore::corrupt_aggregate`]: not JSON, so the coordinator must fail closed.
pub const CORRUPT_AGGREGATE: &str = "\u{1}corrupt-aggregate: this is not JSON {";

/// How a store outage shows itself to clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutageMode {
    /// Every call fails at once with `Unavailable` (connection refused).
    Errors,
    /// Every call hangs `after_ms` of store-clock time, then fails with `Unavailable("timeout")`.
    Timeouts { after_ms: u64 },
}

/// How a rollback of recent writes shows itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RollbackMode {
    /// A replica that had not received the last writes was promoted: the identity (run id and
    /// replication id) changes and every connection open before it fails its next call once.
    Failover,
    /// The writes vanish with no visible sign (e.g. a restore from a backup behind the operator's
    /// back). No protocol can detect this; the simulation measures its damage.
    Silent,
}

/// The fault settings. All off after [`MemoryStore::new`].
#[derive(Clone, Debug, Default)]
pub(super) struct Faults {
    write_drop_probability: f64,
    outage: Option<OutageMode>,
    latency_ms: u64,
    latency_jitter_ms: u64,
    /// Upper-case command names the server rejects.
    unsupported: BTreeSet<String>,
}

impl Faults {
    pub(super) fn outage(&self) -> Option<OutageMode> {
        self.outage
    }

    /// This call's injected latency: the base plus a uniform jitter in `0..=latency_jitter_ms`.
    pub(super) fn draw_latency_ms(&self, rng: &mut SmallRng) -> u64 {
        let jitter_ms = if self.latency_jitter_ms > 0 { rng.gen_range(0..=self.latency_jitter_ms) } else { 0 };
        self.latency_ms.saturating_add(jitter_ms)
    }

    /// Whether the write about to be applied is silently dropped instead.
    pub(super) fn draw_write_drop(&self, rng: &mut SmallRng) -> bool {
        self.write_drop_probability > 0.0 && rng.gen_bool(self.write_drop_probability)
    }

    /// Fails with `Unsupported` naming the first of `commands` the server rejects.
    pub(super) fn check_supported(&self, commands: &[&str]) -> Result<(), StoreError> {
        match commands.iter().find(|c| self.unsupported.contains(**c)) {
            Some(command) => Err(unsupported(command)),
            None => Ok(()),
        }
    }
}

/// The error a real Redis gives for a renamed, disabled or unknown command.
pub(super) fn unsupported(command: &str) -> StoreError {
    StoreError::Unsupported { command: command.to_string(), detail: format!("ERR unknown command '{command}'") }
}

/// A fresh server identity: two 40-character hex ids, like Redis's `run_id` and `master_replid`.
pub(super) fn random_identity(rng: &mut SmallRng) -> ServerIdentity {
    let mut hex40 = || (0..40).map(|_| char::from(b"0123456789abcdef"[rng.gen_range(0..16)])).collect::<String>();
    ServerIdentity { run_id: hex40(), replication_id: hex40(), primaries: Vec::new() }
}

impl Inner {
    /// A new server incarnation: new identity, and every connection opened before is broken.
    /// `metadata_after` lists the metadata keys that changed with it (all of them for a flush).
    pub(super) fn change_identity(
        &mut self,
        cause: IdentityCause,
        metadata_after: Vec<(GroupId, Option<StoredRecord>)>,
    ) {
        self.identity = random_identity(&mut self.rng);
        self.generation += 1;
        let identity = self.identity.clone();
        self.record(HistoryKind::IdentityChanged { cause, identity }, metadata_after);
    }

    /// Applies a raw edit to a stored record (not journaled: an operator or a bug did it).
    fn edit_record(&mut self, group: &GroupId, kind: HistoryKind, edit: impl FnOnce(&mut StoredRecord)) -> bool {
        let Some(record) = self.keys.metadata.get_mut(group) else { return false };
        edit(record);
        let after = Some(record.clone());
        self.record(kind, vec![(group.clone(), after)]);
        true
    }
}

impl MemoryStore {
    /// Fault 1: each later `write` that passes its checks is, with probability `p` (clamped to
    /// 0..=1, NaN = 0), acknowledged as `Written { revision }` but not applied. Only `write` is
    /// affected. Recorded as [`HistoryKind::WriteDropped`].
    pub fn set_write_drop_probability(&self, p: f64) {
        let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
        self.lock().faults.write_drop_probability = p;
    }

    /// Fault 2: undoes the last `writes` applied writes to the metadata, liveness, mutex and index
    /// keys (one journal entry per state-changing server command: `write`, `delete`,
    /// `touch_and_load`, `acquire_mutex`, `release_mutex`, `index_add`, `rebuild_index`, and the
    /// index SADD / SREM that follows a create / delete), newest first. Returns how
    /// many were undone (the journal keeps the last `JOURNAL_LEN_MAX`). With
    /// [`RollbackMode::Failover`] the identity changes and open handles fail their next call once,
    /// even when nothing was undone (`rollback(0, Failover)` is a lossless failover).
    ///
    /// Shard streams are *not* rolled back: in our model they may live on another deployment, and
    /// metadata loss is what the coordinator must survive.
    pub fn rollback(&self, writes: usize, mode: RollbackMode) -> usize {
        let mut inner = self.lock();
        let (undone, metadata_after) = inner.undo_writes(writes);
        inner.record(HistoryKind::RolledBack { mode, requested: writes, undone }, metadata_after);
        if mode == RollbackMode::Failover {
            inner.change_identity(IdentityCause::Failover, Vec::new());
        }
        undone
    }

    /// Fault 9 (split brain): a second server that starts as an exact copy of this one now — the
    /// same identity, generation, keys, streams, journal, fault settings and metadata history —
    /// and from here on has state of its own (an old primary cut off from the replica promoted in
    /// its place). Its read, add and ack logs start empty, so they hold only what it executed
    /// itself; its RNG is reseeded from `seed`. Call it before failing this server over: the copy
    /// keeps the identity clients knew. Every call on either server stays one atomic step on that
    /// server's state.
    pub fn fork(&self, seed: u64) -> MemoryStore {
        let inner = self.lock();
        let mut copy = Inner {
            created_at: inner.created_at,
            rng: SmallRng::seed_from_u64(seed),
            identity: inner.identity.clone(),
            generation: inner.generation,
            faults: inner.faults.clone(),
            keys: inner.keys.clone(),
            journal: inner.journal.clone(),
            streams: inner.streams.clone(),
            history: inner.history.clone(),
            planted: inner.planted,
            appended: std::sync::Arc::default(),
        };
        copy.history.clear_logs();
        copy.history.fence_refusals.clear();
        let generation = copy.generation;
        MemoryStore {
            shared: std::sync::Arc::new(std::sync::Mutex::new(copy)),
            connected_generation: std::sync::atomic::AtomicU64::new(generation),
        }
    }

    /// A lossless failover: `rollback(0, RollbackMode::Failover)`.
    pub fn failover(&self) {
        self.rollback(0, RollbackMode::Failover);
    }

    /// Fault 3: deletes the group's metadata key (operator mistake, eviction). Not a journaled
    /// write; the liveness, mutex and index keys stay. Returns whether the key existed.
    pub fn delete_metadata_key(&self, group: &GroupId) -> bool {
        let mut inner = self.lock();
        if inner.keys.metadata.remove(group).is_none() {
            return false;
        }
        inner.record(HistoryKind::KeyDeleted { group: group.clone() }, vec![(group.clone(), None)]);
        true
    }

    /// Deletes a fence key (eviction under an `allkeys-*` policy, a `DEL` by hand). Not a
    /// journaled write. Returns whether the key existed.
    pub fn delete_fence_key(&self, key: &str) -> bool {
        self.lock().keys.fences.remove(key).is_some()
    }

    /// An operator's `XGROUP DESTROY` of a shard stream's consumer group: reads of that stream
    /// fail with `NOGROUP` until the group is created again. Returns whether it existed.
    pub fn destroy_consumer_group(&self, stream: &str, group: &str) -> bool {
        self.lock().streams.destroy_group(stream, group)
    }

    /// Fault 4: starts (`Some`) or ends (`None`) an outage. Calls already past their admission
    /// and still in flight fail too when they reach the server during an outage.
    pub fn set_outage(&self, mode: Option<OutageMode>) {
        self.lock().faults.outage = mode;
    }

    /// Fault 5: latency added to every call (half before the server executes it, half after).
    pub fn set_latency_ms(&self, latency_ms: u64) {
        self.lock().faults.latency_ms = latency_ms;
    }

    /// Fault 5: extra latency per call, uniform in `0..=jitter_ms`, drawn from the seeded RNG.
    pub fn set_latency_jitter_ms(&self, jitter_ms: u64) {
        self.lock().faults.latency_jitter_ms = jitter_ms;
    }

    /// Fault 6: the server rejects `command` (case-insensitive), like a renamed or ACL-denied
    /// command. Every method needing it fails with `StoreError::Unsupported` and `probe` names it
    /// (the command table is in the module docs).
    pub fn set_unsupported(&self, command: &str) {
        self.lock().faults.unsupported.insert(command.to_ascii_uppercase());
    }

    /// Heals fault 6 for one command.
    pub fn set_supported(&self, command: &str) {
        self.lock().faults.unsupported.remove(&command.to_ascii_uppercase());
    }

    /// Heals fault 6 for every command.
    pub fn clear_unsupported(&self) {
        self.lock().faults.unsupported.clear();
    }

    /// Fault 7: replaces the stored aggregate with [`CORRUPT_AGGREGATE`] (revision and the other
    /// fields unchanged). A raw edit, not a journaled write. Returns whether the key existed.
    pub fn corrupt_aggregate(&self, group: &GroupId) -> bool {
        let kind = HistoryKind::AggregateCorrupted { group: group.clone() };
        self.lock().edit_record(group, kind, |record| record.aggregate = CORRUPT_AGGREGATE.to_string())
    }

    /// Fault 7: sets the stored `schemaVersion` (e.g. one from a future build). A raw edit, not a
    /// journaled write. Returns whether the key existed.
    pub fn set_future_schema(&self, group: &GroupId, schema_version: u32) -> bool {
        let kind = HistoryKind::SchemaVersionSet { group: group.clone(), schema_version };
        self.lock().edit_record(group, kind, |record| record.schema_version = schema_version)
    }

    /// Fault 8: the server restarts with persistence: identity changes, open handles fail their
    /// next call once, every key and stream is kept (the journal too).
    pub fn restart(&self) {
        self.lock().change_identity(IdentityCause::Restart, Vec::new());
    }

    /// Fault 8: the server restarts empty: identity changes, open handles fail their next call
    /// once, every key, stream and the journal are gone. The history and logs are kept.
    pub fn flush_all(&self) {
        let mut inner = self.lock();
        let metadata_after = inner.keys.metadata.keys().map(|group| (group.clone(), None)).collect();
        inner.keys = Default::default();
        inner.journal.clear();
        inner.streams = Default::default();
        inner.change_identity(IdentityCause::FlushAll, metadata_after);
    }
}
