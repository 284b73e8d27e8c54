//! [`InFlight`]: the entries the consumer handed to the application and that were not settled yet
//! (acked or abandoned), per shard, with the time each was handed out.
//!
//! Owns the bookkeeping only; the rules (what is delivered, when an entry is given up, when a
//! shard is drained) are the core's. Keeps two views that always hold the same entries: per shard
//! (a shard's drain, its reads) and oldest first (the in-flight limit,
//! `ConsumerConfig::max_in_flight_ms`, and the status's oldest age), so finding what timed out
//! costs only what timed out. A shard with nothing in flight has no key: the maps hold nothing
//! but entries in flight.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::model::ShardId;
use crate::store::EntryId;

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub(super) struct InFlight {
    /// Per shard, each entry in flight and when it was handed out.
    by_shard: BTreeMap<ShardId, BTreeMap<EntryId, u64>>,
    /// The same entries as `(handed out at, shard, entry)`: the oldest first.
    oldest_first: BTreeSet<(u64, ShardId, EntryId)>,
}

impl InFlight {
    /// `entry` of `shard` was handed out at `now_ms` (again, if it already was in flight: its age
    /// starts over).
    pub(super) fn insert(&mut self, shard: ShardId, entry: EntryId, now_ms: u64) {
        if let Some(before_ms) = self.by_shard.entry(shard).or_default().insert(entry, now_ms) {
            let was = self.oldest_first.remove(&(before_ms, shard, entry));
            debug_assert!(was, "both views hold the same entries");
        }
        self.oldest_first.insert((now_ms, shard, entry));
    }

    /// Settles `entry` of `shard`; false if it was not in flight.
    pub(super) fn remove(&mut self, shard: ShardId, entry: EntryId) -> bool {
        let Some(entries) = self.by_shard.get_mut(&shard) else { return false };
        let Some(handed_ms) = entries.remove(&entry) else { return false };
        if entries.is_empty() {
            self.by_shard.remove(&shard);
        }
        let was = self.oldest_first.remove(&(handed_ms, shard, entry));
        debug_assert!(was, "both views hold the same entries");
        true
    }

    pub(super) fn contains(&self, shard: ShardId, entry: EntryId) -> bool {
        self.by_shard.get(&shard).is_some_and(|entries| entries.contains_key(&entry))
    }

    /// Entries in flight on `shard`.
    pub(super) fn count(&self, shard: ShardId) -> usize {
        self.by_shard.get(&shard).map_or(0, BTreeMap::len)
    }

    /// Entries in flight per shard (shards with none are left out).
    pub(super) fn counts(&self) -> BTreeMap<ShardId, usize> {
        self.by_shard.iter().map(|(shard, entries)| (*shard, entries.len())).collect()
    }

    /// The shards with entries in flight.
    pub(super) fn shards(&self) -> Vec<ShardId> {
        self.by_shard.keys().copied().collect()
    }

    /// When the oldest entry in flight was handed out.
    pub(super) fn oldest_ms(&self) -> Option<u64> {
        self.oldest_first.first().map(|(handed_ms, ..)| *handed_ms)
    }

    /// Settles every entry of `shard`, in id order.
    pub(super) fn take(&mut self, shard: ShardId) -> Vec<EntryId> {
        let entries = self.by_shard.remove(&shard).unwrap_or_default();
        for (entry, handed_ms) in &entries {
            let was = self.oldest_first.remove(&(*handed_ms, shard, *entry));
            debug_assert!(was, "both views hold the same entries");
        }
        entries.into_keys().collect()
    }

    /// Settles every entry handed out at or before `cutoff_ms`, the oldest first.
    pub(super) fn take_handed_out_by(&mut self, cutoff_ms: u64) -> Vec<(ShardId, EntryId)> {
        let mut taken = Vec::new();
        while let Some((handed_ms, shard, entry)) = self.oldest_first.first().copied() {
            if handed_ms > cutoff_ms {
                break;
            }
            self.remove(shard, entry);
            taken.push((shard, entry));
        }
        taken
    }
}
