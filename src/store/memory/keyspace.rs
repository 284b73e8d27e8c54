//! The coordinator's keys in the fake: metadata hashes, liveness hashes, mutexes and the group
//! index, with the rollback journal, and the `MetadataStore` operations on them.
//!
//! This module owns the semantics each operation must share with the Lua scripts and commands of
//! `RedisStore` (the (revision, writeId) write condition, liveness guards, `SET NX PX`,
//! compare-and-delete, `SADD`/`SCAN`).
//! It never sleeps, never fails for fault reasons (that is the call plumbing's job) and never
//! touches the shard streams. Invariant: every state change made by a client call goes through a
//! `put_*` method, which records the prior value in the call's [`Change`]; so the journal can undo
//! exactly the last k calls (a rollback), newest first.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::core::model::{Fence, GroupId, MemberId};
use crate::store::keys;
use crate::store::{CasStamp, RecordStamp, StoreError, StoredRecord, TouchResult, WriteOutcome, WriteRequest};

use super::history::HistoryKind;
use super::Inner;

/// How many applied writes the rollback journal remembers.
pub const JOURNAL_LEN_MAX: usize = 4096;

/// A held mutex: its token and the store-clock time after which it has expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct MutexEntry {
    token: String,
    /// Like Redis, the key is alive while `now_ms <= expires_at_ms`.
    expires_at_ms: u64,
}

/// The value a key, hash field or set member had before a journaled write changed it.
#[derive(Clone, Debug)]
enum Prior {
    Metadata(GroupId, Option<StoredRecord>),
    Liveness(GroupId, MemberId, Option<u64>),
    Mutex(GroupId, Option<MutexEntry>),
    Index(String, bool),
    Fence(String, Option<Fence>),
}

/// One journaled write: the prior values of everything one call changed, in change order.
#[derive(Clone, Debug, Default)]
pub(super) struct Change {
    priors: Vec<Prior>,
}

/// The bounded journal of applied writes, oldest first.
#[derive(Clone, Debug)]
pub(super) struct Journal {
    changes: VecDeque<Change>,
    /// How many writes it remembers: [`JOURNAL_LEN_MAX`], or 0 in a store that is never rolled
    /// back (one serving real clients).
    len_max: usize,
}

impl Journal {
    pub(super) fn with_len_max(len_max: usize) -> Self {
        Self { changes: VecDeque::new(), len_max }
    }

    /// Forgets every change (the server restarted empty); the length limit stays.
    pub(super) fn clear(&mut self) {
        self.changes.clear();
    }

    pub(super) fn push(&mut self, change: Change) {
        if change.priors.is_empty() {
            return;
        }
        self.changes.push_back(change);
        if self.changes.len() > self.len_max {
            self.changes.pop_front();
        }
    }
}

/// The coordinator's keys.
#[derive(Clone, Debug, Default)]
pub(super) struct Keyspace {
    /// `…:metadata` hashes.
    pub(super) metadata: BTreeMap<GroupId, StoredRecord>,
    /// `…:liveness` hashes (an empty hash does not exist, as in Redis).
    liveness: BTreeMap<GroupId, BTreeMap<MemberId, u64>>,
    /// `…:mutex` strings with their PX deadline.
    mutexes: BTreeMap<GroupId, MutexEntry>,
    /// The `redis-stream:coord:groups` set of index entries.
    index: BTreeSet<String>,
    /// Per-shard fence hashes (`…:fence:<group>`), by key.
    pub(super) fences: BTreeMap<String, Fence>,
    /// The tick roster hash (instance -> pass counter). Not journaled: a rollback that lost
    /// increments would only make a counter change again, which readers take as "alive", as they
    /// do for every increment; nothing else depends on its values.
    roster: BTreeMap<String, u64>,
    /// The heard-relay strings (`redis-stream:coord:heard:…`) with their PX deadline. Not
    /// journaled, like the roster, so no fault loses them (Redis could): journaled, they would
    /// take most of the "last k writes" a rollback fault loses (every instance writes them twice
    /// a second) and leave the metadata writes the faults exist for standing. What a loss would
    /// do: an older blob restored is ignored (readers order a sender's blobs by its sequence
    /// numbers); a lost one costs the owner a read (its members were not heard), except a lost
    /// relayed write, which a member that falls silent at once then pays with a wait of up to
    /// the audit period (`idle_group_audit_ms`) — after a failover every deferral is voided
    /// anyway (the identity changed), so only a silent rollback can cost that.
    relays: BTreeMap<String, (String, u64)>,
}

impl Keyspace {
    /// `HINCRBY redis-stream:coord:tickers <instance> 1`.
    pub(super) fn count_ticker_pass(&mut self, instance: &str) {
        let counter = self.roster.entry(instance.to_string()).or_default();
        *counter = counter.saturating_add(1);
    }

    /// `HGETALL redis-stream:coord:tickers`.
    pub(super) fn tick_roster(&self) -> BTreeMap<String, u64> {
        self.roster.clone()
    }

    /// `SET <key> <blob> PX <ttl>` on a heard-relay key, at store-clock `now_ms`.
    pub(super) fn put_relay(&mut self, key: String, blob: String, now_ms: u64, ttl_ms: u64) {
        self.relays.insert(key, (blob, now_ms.saturating_add(ttl_ms)));
    }

    /// `GET <key>` on a heard-relay key at store-clock `now_ms` (an expired key is removed, as
    /// Redis does on access).
    pub(super) fn get_relay(&mut self, key: &str, now_ms: u64) -> Option<String> {
        match self.relays.get(key) {
            Some((blob, expires_at_ms)) if now_ms <= *expires_at_ms => Some(blob.clone()),
            Some(_) => {
                self.relays.remove(key);
                None
            }
            None => None,
        }
    }

    /// `HDEL redis-stream:coord:tickers <instance>...`.
    pub(super) fn forget_tickers(&mut self, instances: &[String]) {
        for instance in instances {
            self.roster.remove(instance);
        }
    }

    fn liveness_of(&self, group: &GroupId, member: &str) -> u64 {
        self.liveness.get(group).and_then(|fields| fields.get(member)).copied().unwrap_or(0)
    }

    fn put_metadata(&mut self, change: &mut Change, group: &GroupId, value: Option<StoredRecord>) {
        let prior = match value {
            Some(record) => self.metadata.insert(group.clone(), record),
            None => self.metadata.remove(group),
        };
        change.priors.push(Prior::Metadata(group.clone(), prior));
    }

    fn put_liveness(&mut self, change: &mut Change, group: &GroupId, member: &str, value: Option<u64>) {
        let prior = self.set_liveness(group, member, value);
        change.priors.push(Prior::Liveness(group.clone(), member.to_string(), prior));
    }

    fn set_liveness(&mut self, group: &GroupId, member: &str, value: Option<u64>) -> Option<u64> {
        let fields = self.liveness.entry(group.clone()).or_default();
        let prior = match value {
            Some(counter) => fields.insert(member.to_string(), counter),
            None => fields.remove(member),
        };
        if fields.is_empty() {
            self.liveness.remove(group);
        }
        prior
    }

    fn put_mutex(&mut self, change: &mut Change, group: &GroupId, value: Option<MutexEntry>) {
        let prior = match value {
            Some(entry) => self.mutexes.insert(group.clone(), entry),
            None => self.mutexes.remove(group),
        };
        change.priors.push(Prior::Mutex(group.clone(), prior));
    }

    /// Adds or removes an index entry; journals only an actual change (SADD/SREM of a member
    /// already in that state is a no-op, not replicated).
    fn put_index(&mut self, change: &mut Change, entry: &str, present: bool) {
        let was_present = self.index.contains(entry);
        if was_present == present {
            return;
        }
        if present {
            self.index.insert(entry.to_string());
        } else {
            self.index.remove(entry);
        }
        change.priors.push(Prior::Index(entry.to_string(), was_present));
    }

    /// Sets a fence key (journaled, so a rollback can lose a raise like any other write).
    pub(super) fn put_fence(&mut self, change: &mut Change, key: &str, value: Fence) {
        let prior = self.fences.insert(key.to_string(), value);
        change.priors.push(Prior::Fence(key.to_string(), prior));
    }

    /// Lazy expiry, as Redis does on access. Not a journaled write.
    fn expire_mutex(&mut self, group: &GroupId, now_ms: u64) {
        if self.mutexes.get(group).is_some_and(|m| now_ms > m.expires_at_ms) {
            self.mutexes.remove(group);
        }
    }

    /// Reverts one journaled write; returns the groups whose metadata key it touched.
    fn undo(&mut self, change: Change) -> Vec<GroupId> {
        let mut groups = Vec::new();
        for prior in change.priors.into_iter().rev() {
            match prior {
                Prior::Metadata(group, value) => {
                    match value {
                        Some(record) => self.metadata.insert(group.clone(), record),
                        None => self.metadata.remove(&group),
                    };
                    groups.push(group);
                }
                Prior::Liveness(group, member, value) => {
                    self.set_liveness(&group, &member, value);
                }
                Prior::Mutex(group, value) => {
                    match value {
                        Some(entry) => self.mutexes.insert(group, entry),
                        None => self.mutexes.remove(&group),
                    };
                }
                Prior::Fence(key, value) => {
                    match value {
                        Some(fence) => self.fences.insert(key, fence),
                        None => self.fences.remove(&key),
                    };
                }
                Prior::Index(entry, present) => {
                    if present {
                        self.index.insert(entry);
                    } else {
                        self.index.remove(&entry);
                    }
                }
            }
        }
        groups
    }
}

/// The `MetadataStore` operations, each one atomic step of the server.
impl Inner {
    pub(super) fn load(&self, group: &GroupId) -> Option<StoredRecord> {
        self.keys.metadata.get(group).cloned()
    }

    /// HINCRBY liveness member step, then HGETALL metadata.
    pub(super) fn touch_and_load(
        &mut self,
        group: &GroupId,
        member: &str,
        step: u64,
    ) -> Result<TouchResult, StoreError> {
        // Like the Redis script: no metadata, no increment (heartbeats cannot create keys).
        if !self.keys.metadata.contains_key(group) {
            return Ok(TouchResult { liveness: 0, record: None });
        }
        let liveness = self.incremented_liveness(group, member, step, "touch script")?;
        let mut change = Change::default();
        self.keys.put_liveness(&mut change, group, member, Some(liveness));
        self.journal.push(change);
        Ok(TouchResult { liveness, record: self.load(group) })
    }

    /// HINCRBY liveness member step: one command, which creates the liveness hash if it is absent
    /// (as Redis does; RedisStore deletes it afterwards when the metadata key is gone).
    pub(super) fn touch_liveness(&mut self, group: &GroupId, member: &str, step: u64) -> Result<u64, StoreError> {
        let liveness = self.incremented_liveness(group, member, step, "HINCRBY")?;
        let mut change = Change::default();
        self.keys.put_liveness(&mut change, group, member, Some(liveness));
        self.journal.push(change);
        Ok(liveness)
    }

    /// The counter HINCRBY would leave, or its refusal: a hash field holds a signed 64-bit
    /// integer, and Redis refuses an increment past `i64::MAX` and changes nothing (the fake must
    /// not be stronger than Redis by saturating or wrapping). Mapped as `RedisStore` maps it.
    fn incremented_liveness(&self, group: &GroupId, member: &str, step: u64, command: &str) -> Result<u64, StoreError> {
        self.keys
            .liveness_of(group, member)
            .checked_add(step)
            .filter(|n| i64::try_from(*n).is_ok())
            .ok_or_else(|| StoreError::Protocol(format!("ERR increment or decrement would overflow ({command})")))
    }

    /// HMGET metadata revision writeId schemaVersion layoutVersion: whether the stored record is
    /// the one `known` stamps (`None`: the key is absent).
    pub(super) fn stamp_matches(&self, group: &GroupId, known: &RecordStamp) -> Option<bool> {
        let record = self.keys.metadata.get(group)?;
        Some(known.matches(record.revision, &record.write_id, record.schema_version, record.layout_version))
    }

    /// The forget-liveness script: deletes the liveness hash if the metadata key is still absent.
    pub(super) fn forget_liveness_if_absent(&mut self, group: &GroupId) {
        if self.keys.metadata.contains_key(group) {
            return;
        }
        let mut change = Change::default();
        let members: Vec<MemberId> =
            self.keys.liveness.get(group).map(|fields| fields.keys().cloned().collect()).unwrap_or_default();
        for stale in members {
            self.keys.put_liveness(&mut change, group, &stale, None);
        }
        self.journal.push(change);
    }

    pub(super) fn liveness(&self, group: &GroupId) -> BTreeMap<MemberId, u64> {
        self.keys.liveness.get(group).cloned().unwrap_or_default()
    }

    /// The write condition, as both scripts check it: the stored record is the write `expected`
    /// names, revision and writeId (an empty expected writeId matches only a record without one;
    /// see [`CasStamp`]). Revisions alone repeat after a rollback.
    fn holds(&self, group: &GroupId, expected: &CasStamp) -> bool {
        self.keys
            .metadata
            .get(group)
            .is_some_and(|record| record.revision == expected.revision && record.write_id == expected.write_id)
    }

    /// Checks, in this order: the write condition (absent key for a create, else the whole stamp),
    /// then each liveness guard in request order. Only when all pass is anything written (all six
    /// fields, then the liveness removals); a create then adds the group to the index.
    pub(super) fn write(&mut self, group: &GroupId, request: WriteRequest) -> WriteOutcome {
        let current = self.keys.metadata.get(group).map(|record| record.revision);
        let condition_holds = match &request.expected {
            None => current.is_none(),
            Some(expected) => self.holds(group, expected),
        };
        if !condition_holds {
            return WriteOutcome::RevisionConflict { current };
        }
        for (member, expected) in &request.liveness_guards {
            if self.keys.liveness_of(group, member) != *expected {
                return WriteOutcome::LivenessChanged { member: member.clone() };
            }
        }
        let revision = current.map_or(1, |r| r + 1);
        if self.faults.draw_write_drop(&mut self.rng) {
            self.record(HistoryKind::WriteDropped { group: group.clone(), revision }, Vec::new());
            return WriteOutcome::Written { revision };
        }
        let record = StoredRecord {
            aggregate: request.aggregate,
            revision,
            schema_version: request.schema_version,
            layout_version: request.layout_version,
            updated_at_ms: request.updated_at_ms,
            write_id: request.write_id,
        };
        let mut change = Change::default();
        self.keys.put_metadata(&mut change, group, Some(record.clone()));
        for member in &request.liveness_remove {
            if self.keys.liveness.get(group).is_some_and(|fields| fields.contains_key(member)) {
                self.keys.put_liveness(&mut change, group, member, None);
            }
        }
        self.journal.push(change);
        self.record(HistoryKind::Written { group: group.clone(), revision }, vec![(group.clone(), Some(record))]);
        if current.is_none() {
            // RedisStore indexes a created group with a separate SADD after the script (the index
            // key has no hash tag); a rejected SADD leaves the group unindexed, not the write failed.
            self.separate_index_command("SADD", group, true);
        }
        WriteOutcome::Written { revision }
    }

    /// Deletes metadata and liveness when the stored record is the write `expected` names (the
    /// same condition as `write`), then the index entry.
    pub(super) fn delete(&mut self, group: &GroupId, expected: &CasStamp) -> WriteOutcome {
        if !self.holds(group, expected) {
            let current = self.keys.metadata.get(group).map(|record| record.revision);
            return WriteOutcome::RevisionConflict { current };
        }
        let mut change = Change::default();
        self.keys.put_metadata(&mut change, group, None);
        let members: Vec<MemberId> = self.liveness(group).into_keys().collect();
        for member in members {
            self.keys.put_liveness(&mut change, group, &member, None);
        }
        self.journal.push(change);
        let kind = HistoryKind::Deleted { group: group.clone(), revision: expected.revision };
        self.record(kind, vec![(group.clone(), None)]);
        self.separate_index_command("SREM", group, false);
        WriteOutcome::Written { revision: 0 }
    }

    /// The SADD / SREM `RedisStore` sends after a create / delete: its own journaled write, skipped
    /// (as RedisStore only logs the failure) when the server rejects the command.
    fn separate_index_command(&mut self, command: &str, group: &GroupId, present: bool) {
        if self.faults.check_supported(&[command]).is_err() {
            return;
        }
        let mut change = Change::default();
        self.keys.put_index(&mut change, &keys::index_entry(group), present);
        self.journal.push(change);
    }

    /// `SET mutex token NX PX ttl_ms`.
    pub(super) fn acquire_mutex(&mut self, group: &GroupId, token: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        if ttl_ms == 0 {
            return Err(StoreError::Protocol("ERR invalid expire time in 'set' command".into()));
        }
        let now_ms = self.now_ms();
        self.keys.expire_mutex(group, now_ms);
        if self.keys.mutexes.contains_key(group) {
            return Ok(false);
        }
        let entry = MutexEntry { token: token.to_string(), expires_at_ms: now_ms.saturating_add(ttl_ms) };
        let mut change = Change::default();
        self.keys.put_mutex(&mut change, group, Some(entry));
        self.journal.push(change);
        Ok(true)
    }

    /// `if GET mutex == token then DEL mutex`.
    pub(super) fn release_mutex(&mut self, group: &GroupId, token: &str) -> bool {
        let now_ms = self.now_ms();
        self.keys.expire_mutex(group, now_ms);
        if self.keys.mutexes.get(group).is_none_or(|entry| entry.token != token) {
            return false;
        }
        let mut change = Change::default();
        self.keys.put_mutex(&mut change, group, None);
        self.journal.push(change);
        true
    }

    /// `SADD redis-stream:coord:groups <index entry>`.
    pub(super) fn index_add(&mut self, group: &GroupId) {
        let mut change = Change::default();
        self.keys.put_index(&mut change, &keys::index_entry(group), true);
        self.journal.push(change);
    }

    /// `SMEMBERS`, parsed, sorted by `GroupId`. Entries that do not parse are skipped.
    pub(super) fn index_members(&self) -> Vec<GroupId> {
        let groups: BTreeSet<GroupId> = self.keys.index.iter().filter_map(|e| keys::parse_index_entry(e)).collect();
        groups.into_iter().collect()
    }

    /// `SCAN 0 MATCH <metadata pattern>` to the end, then `SADD` of every group found.
    pub(super) fn rebuild_index(&mut self) -> Vec<GroupId> {
        let groups: Vec<GroupId> = self.keys.metadata.keys().cloned().collect();
        let mut change = Change::default();
        for group in &groups {
            self.keys.put_index(&mut change, &keys::index_entry(group), true);
        }
        self.journal.push(change);
        groups
    }

    /// Undoes up to `writes` journaled writes, newest first. Returns how many were undone and the
    /// final value of every metadata key they touched.
    pub(super) fn undo_writes(&mut self, writes: usize) -> (usize, Vec<(GroupId, Option<StoredRecord>)>) {
        let mut groups = BTreeSet::new();
        let mut undone = 0;
        while undone < writes {
            let Some(change) = self.journal.changes.pop_back() else { break };
            groups.extend(self.keys.undo(change));
            undone += 1;
        }
        let metadata_after = groups.into_iter().map(|group| (group.clone(), self.load(&group))).collect();
        (undone, metadata_after)
    }
}
