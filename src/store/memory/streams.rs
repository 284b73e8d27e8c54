//! The shard streams of the fake: per stream key an ordered log of entries, its consumer groups,
//! and each group's pending entries list (PEL), with Redis 7 semantics for XADD, XGROUP CREATE,
//! XREADGROUP, XACK and XAUTOCLAIM.
//!
//! This module owns those semantics. It never reads a clock (the caller passes the store-clock
//! `now_ms`), never fails for fault reasons, and is never rolled back. Invariants: entry ids of a
//! stream are strictly increasing and never reused (the last generated id survives trimming), and
//! a group's `last_delivered` id only moves forward.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::store::{EntryId, GroupStart, ReadFrom, StoreError, StreamEntry};

type Fields = Vec<(String, Vec<u8>)>;

const ZERO_ID: EntryId = EntryId { ms: 0, seq: 0 };

/// One pending (delivered, not acknowledged) entry.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pending {
    consumer: String,
    delivered_at_ms: u64,
    delivery_count: u64,
}

/// One consumer group of a stream.
#[derive(Clone, Debug, Default)]
struct ConsumerGroup {
    last_delivered: Option<EntryId>,
    pending: BTreeMap<EntryId, Pending>,
}

/// One stream key.
#[derive(Clone, Debug, Default)]
struct StreamLog {
    entries: BTreeMap<EntryId, Fields>,
    last_id: Option<EntryId>,
    groups: BTreeMap<String, ConsumerGroup>,
}

impl StreamLog {
    /// The entry as delivered: a pending entry that was trimmed or deleted comes back with no
    /// fields (Redis replies `[id, nil]`); entries added by XADD always have fields.
    fn entry(&self, id: EntryId) -> StreamEntry {
        StreamEntry { id, fields: self.entries.get(&id).cloned().unwrap_or_default() }
    }
}

/// Every stream key.
#[derive(Clone, Debug, Default)]
pub(super) struct Streams {
    logs: BTreeMap<String, StreamLog>,
}

/// The NOGROUP error of XREADGROUP (key or group missing).
fn no_group_xreadgroup(stream: &str, group: &str) -> StoreError {
    StoreError::Protocol(format!(
        "NOGROUP No such key '{stream}' or consumer group '{group}' in XREADGROUP with GROUP option"
    ))
}

/// The NOGROUP error of XAUTOCLAIM (key or group missing).
fn no_group_xautoclaim(stream: &str, group: &str) -> StoreError {
    StoreError::Protocol(format!("NOGROUP No such key '{stream}' or consumer group '{group}'"))
}

/// `count == 0` means no limit, as Redis's `COUNT 0`.
fn limit(count: usize) -> usize {
    if count == 0 {
        usize::MAX
    } else {
        count
    }
}

impl Streams {
    /// `XADD stream [MAXLEN n] * fields…`. The id is `<now_ms>-0` when `now_ms` is past the last
    /// id's ms, else the last id with seq + 1. Trimming is exact (a valid outcome of `MAXLEN ~`,
    /// which may keep more entries but never fewer).
    pub(super) fn xadd(
        &mut self,
        now_ms: u64,
        stream: &str,
        fields: Fields,
        maxlen: Option<u64>,
    ) -> Result<EntryId, StoreError> {
        if fields.is_empty() {
            return Err(StoreError::Protocol("ERR wrong number of arguments for 'xadd' command".into()));
        }
        let log = self.logs.entry(stream.to_string()).or_default();
        let last = log.last_id.unwrap_or(ZERO_ID);
        let id =
            if now_ms > last.ms { EntryId { ms: now_ms, seq: 0 } } else { EntryId { ms: last.ms, seq: last.seq + 1 } };
        log.entries.insert(id, fields);
        log.last_id = Some(id);
        if let Some(maxlen) = maxlen {
            let keep = usize::try_from(maxlen).unwrap_or(usize::MAX);
            while log.entries.len() > keep {
                log.entries.pop_first();
            }
        }
        Ok(id)
    }

    /// `XGROUP CREATE stream group <0|$> MKSTREAM`; an existing group (BUSYGROUP) is left
    /// untouched.
    pub(super) fn create_group(&mut self, stream: &str, group: &str, start: GroupStart) {
        let log = self.logs.entry(stream.to_string()).or_default();
        let last_delivered = match start {
            GroupStart::Beginning => None,
            GroupStart::Latest => log.last_id,
        };
        log.groups.entry(group.to_string()).or_insert_with(|| ConsumerGroup { last_delivered, ..Default::default() });
    }

    /// `XGROUP DESTROY stream group`: the group and its pending entries are gone. Returns whether
    /// it existed.
    pub(super) fn destroy_group(&mut self, stream: &str, group: &str) -> bool {
        self.logs.get_mut(stream).is_some_and(|log| log.groups.remove(group).is_some())
    }

    /// `XREADGROUP GROUP group consumer COUNT count STREAMS …`. Every stream and group is checked
    /// before anything is delivered (NOGROUP fails the whole call). Returns every stream of the
    /// call, in call order, with what it delivered (possibly nothing).
    pub(super) fn xreadgroup(
        &mut self,
        now_ms: u64,
        group: &str,
        consumer: &str,
        streams: &[(String, ReadFrom)],
        count: usize,
    ) -> Result<Vec<(String, ReadFrom, Vec<StreamEntry>)>, StoreError> {
        // Redis parses COUNT as a signed 64-bit integer: a larger one is refused, never read.
        if i64::try_from(count).is_err() {
            return Err(StoreError::Protocol("ERR value is not an integer or out of range (XREADGROUP COUNT)".into()));
        }
        for (stream, _) in streams {
            if !self.logs.get(stream).is_some_and(|log| log.groups.contains_key(group)) {
                return Err(no_group_xreadgroup(stream, group));
            }
        }
        let mut out = Vec::with_capacity(streams.len());
        for (stream, from) in streams {
            let log = self.logs.get_mut(stream).ok_or_else(|| no_group_xreadgroup(stream, group))?;
            let entries = match from {
                ReadFrom::New => read_new(log, now_ms, group, consumer, count),
                ReadFrom::OwnPending => read_own_pending(log, now_ms, group, consumer, count),
            };
            out.push((stream.clone(), *from, entries));
        }
        Ok(out)
    }

    /// `XACK stream group ids…`: the ids that were pending (a missing key or group acks nothing).
    pub(super) fn xack(&mut self, stream: &str, group: &str, ids: &[EntryId]) -> Vec<EntryId> {
        let Some(cg) = self.logs.get_mut(stream).and_then(|log| log.groups.get_mut(group)) else {
            return Vec::new();
        };
        ids.iter().filter(|id| cg.pending.remove(id).is_some()).copied().collect()
    }

    /// XAUTOCLAIM over the whole PEL: every pending entry (of any consumer, `consumer` included)
    /// idle for at least `min_idle_ms` moves to `consumer` with a new delivery time and count + 1.
    /// Pending entries no longer in the stream are removed from the PEL and not returned (Redis 7
    /// reports them as deleted ids).
    pub(super) fn claim_all_pending(
        &mut self,
        now_ms: u64,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let Some(log) = self.logs.get_mut(stream) else { return Err(no_group_xautoclaim(stream, group)) };
        let Some(cg) = log.groups.get_mut(group) else { return Err(no_group_xautoclaim(stream, group)) };
        let idle: Vec<EntryId> = cg
            .pending
            .iter()
            .filter(|(_, p)| now_ms.saturating_sub(p.delivered_at_ms) >= min_idle_ms)
            .map(|(id, _)| *id)
            .collect();
        let mut claimed = Vec::new();
        for id in idle {
            let Some(fields) = log.entries.get(&id) else {
                cg.pending.remove(&id);
                continue;
            };
            if let Some(p) = cg.pending.get_mut(&id) {
                p.consumer = consumer.to_string();
                p.delivered_at_ms = now_ms;
                p.delivery_count += 1;
            }
            claimed.push(StreamEntry { id, fields: fields.clone() });
        }
        Ok(claimed)
    }

    /// The id the doorbell watches after when the caller knows none: the group's last-delivered id
    /// (`0-0` when the stream, the group or any delivery is missing).
    pub(super) fn last_delivered(&self, stream: &str, group: &str) -> EntryId {
        self.logs.get(stream).and_then(|log| log.groups.get(group)).and_then(|cg| cg.last_delivered).unwrap_or(ZERO_ID)
    }

    /// True when the stream holds an entry with an id larger than `after` (XREAD's test).
    pub(super) fn has_newer(&self, stream: &str, after: EntryId) -> bool {
        self.logs.get(stream).and_then(|log| log.entries.keys().next_back()).is_some_and(|last| *last > after)
    }

    /// Peek: the ids in the stream, in order.
    pub(super) fn entry_ids(&self, stream: &str) -> Vec<EntryId> {
        self.logs.get(stream).map(|log| log.entries.keys().copied().collect()).unwrap_or_default()
    }

    /// Peek: the group's pending entries with their consumer and delivery count.
    pub(super) fn pending(&self, stream: &str, group: &str) -> Vec<(EntryId, String, u64)> {
        let Some(cg) = self.logs.get(stream).and_then(|log| log.groups.get(group)) else { return Vec::new() };
        cg.pending.iter().map(|(id, p)| (*id, p.consumer.clone(), p.delivery_count)).collect()
    }
}

/// `>`: entries after the group's last-delivered id; each becomes pending for `consumer`.
fn read_new(log: &mut StreamLog, now_ms: u64, group: &str, consumer: &str, count: usize) -> Vec<StreamEntry> {
    let Some(cg) = log.groups.get_mut(group) else { return Vec::new() };
    // A range from the last-delivered id, not a scan from the stream's start: a read of `>` costs
    // what it delivers, however long the stream grew.
    let after = match cg.last_delivered {
        Some(last) => (Bound::Excluded(last), Bound::Unbounded),
        None => (Bound::Unbounded, Bound::Unbounded),
    };
    let delivered: Vec<StreamEntry> = log
        .entries
        .range(after)
        .take(limit(count))
        .map(|(id, fields)| StreamEntry { id: *id, fields: fields.clone() })
        .collect();
    for entry in &delivered {
        let pending = Pending { consumer: consumer.to_string(), delivered_at_ms: now_ms, delivery_count: 1 };
        cg.pending.insert(entry.id, pending);
        cg.last_delivered = Some(entry.id);
    }
    delivered
}

/// `0`: this consumer's pending entries in id order. Entries still in the stream get a new
/// delivery time and count + 1 (as Redis does); trimmed ones come back without fields.
fn read_own_pending(log: &mut StreamLog, now_ms: u64, group: &str, consumer: &str, count: usize) -> Vec<StreamEntry> {
    let Some(cg) = log.groups.get(group) else { return Vec::new() };
    let ids: Vec<EntryId> =
        cg.pending.iter().filter(|(_, p)| p.consumer == consumer).map(|(id, _)| *id).take(limit(count)).collect();
    let delivered: Vec<StreamEntry> = ids.iter().map(|id| log.entry(*id)).collect();
    if let Some(cg) = log.groups.get_mut(group) {
        for id in ids.iter().filter(|id| log.entries.contains_key(id)) {
            if let Some(p) = cg.pending.get_mut(id) {
                p.delivered_at_ms = now_ms;
                p.delivery_count += 1;
            }
        }
    }
    delivered
}
