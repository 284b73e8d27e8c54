//! The decoded-aggregate cache: one parsed [`GroupMetadata`] per group, reused while the stored
//! record is provably the same write.
//!
//! Owns: the map group -> (stored record, decoded metadata, and that metadata's per-member index
//! once a steady heartbeat asked for it). A steady heartbeat sends the cached
//! [`RecordStamp`] to [`MetadataStore::touch_and_check`](crate::store::MetadataStore::touch_and_check)
//! and, when Redis still holds that stamp, answers from the cached copy without transferring or
//! parsing the aggregate.
//! Never: trusts a revision alone. Revisions repeat after a silent rollback (r lost, then r written
//! again with other content), so an entry is keyed by the stamp (revision, writeId, schema and
//! layout versions), and a full read reuses an entry only when the whole record, aggregate bytes
//! included, is equal. A record without a `writeId` (written by hand) is never cached.
//! Invariant: every entry's metadata is exactly `decode(entry.record)`; a record that does not
//! decode removes its group's entry, so the next heartbeat reads in full and fails closed.
//! Out-of-band edits of the `aggregate` field that keep the stamp are seen at the next full read
//! (a tick's, an idle group's audit, a routing request's); until then heartbeats, which answer
//! by the stamp, repeat the last decoded state. Routing reads in full: answered from the cached
//! copy of a corrupted aggregate, a producer kept publishing where the full read fails closed,
//! into shards a recreated group no longer had (`fault-plans/capsules/swarm-5202.toml`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::core::index::GroupIndex;
use crate::core::model::{GroupId, GroupMetadata};
use crate::store::{RecordStamp, StoredRecord};

/// One cached record and its decoded metadata.
#[derive(Debug)]
pub(super) struct CachedRecord {
    pub(super) stamp: RecordStamp,
    pub(super) record: StoredRecord,
    pub(super) metadata: Arc<GroupMetadata>,
    /// The per-member index of `metadata`, built by the first heartbeat that may be steady.
    index: OnceLock<Arc<GroupIndex>>,
}

/// Decoded metadata per group, shared by every request of one coordinator process.
#[derive(Debug, Default)]
pub(super) struct DecodedCache {
    entries: Mutex<BTreeMap<GroupId, Arc<CachedRecord>>>,
}

impl DecodedCache {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<GroupId, Arc<CachedRecord>>> {
        // A poisoned lock only means a panic elsewhere; every entry is still self-consistent.
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The cached entry of `group`, if any.
    pub(super) fn get(&self, group: &GroupId) -> Option<Arc<CachedRecord>> {
        self.lock().get(group).cloned()
    }

    /// The decoded metadata of `record`: the cached copy when the whole record is the cached one,
    /// else `decode(record)`, which then replaces the entry (or removes it when it fails).
    pub(super) fn decode<E>(
        &self,
        group: &GroupId,
        record: &StoredRecord,
        decode: impl FnOnce(&StoredRecord) -> Result<GroupMetadata, E>,
    ) -> Result<Arc<GroupMetadata>, E> {
        if let Some(entry) = self.get(group).filter(|entry| entry.record == *record) {
            return Ok(Arc::clone(&entry.metadata));
        }
        match decode(record) {
            Ok(metadata) => {
                let metadata = Arc::new(metadata);
                self.put(group, record.clone(), Arc::clone(&metadata));
                Ok(metadata)
            }
            Err(e) => {
                self.forget(group);
                Err(e)
            }
        }
    }

    /// Caches what this process just wrote (the written record and the state it encodes).
    pub(super) fn put(&self, group: &GroupId, record: StoredRecord, metadata: Arc<GroupMetadata>) {
        let Some(stamp) = record.stamp() else {
            self.forget(group);
            return;
        };
        let entry = Arc::new(CachedRecord { stamp, record, metadata, index: OnceLock::new() });
        self.lock().insert(group.clone(), entry);
    }

    /// The index of `metadata` when it is the cached metadata of its group (the same allocation,
    /// so exactly the state the index describes), built on first use; `None` for any other state.
    pub(super) fn index_of(&self, metadata: &Arc<GroupMetadata>) -> Option<Arc<GroupIndex>> {
        let entry = self.get(&metadata.group).filter(|entry| Arc::ptr_eq(&entry.metadata, metadata))?;
        Some(Arc::clone(entry.index.get_or_init(|| Arc::new(GroupIndex::build(metadata)))))
    }

    pub(super) fn forget(&self, group: &GroupId) {
        self.lock().remove(group);
    }

    /// Keeps only the entries of groups for which `keep` is true.
    pub(super) fn retain(&self, keep: impl Fn(&GroupId) -> bool) {
        self.lock().retain(|group, _| keep(group));
    }

    /// The groups with an entry (tests).
    #[cfg(test)]
    pub(super) fn groups(&self) -> Vec<GroupId> {
        self.lock().keys().cloned().collect()
    }

    /// How many groups have an entry.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Forgets every entry (the store's identity changed).
    pub(super) fn clear(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::GroupConfig;

    fn metadata(group: &GroupId) -> GroupMetadata {
        GroupMetadata::new(group.clone(), 4, GroupConfig::default())
    }

    fn record(revision: u64, write_id: &str, aggregate: &str) -> StoredRecord {
        StoredRecord {
            aggregate: aggregate.into(),
            revision,
            schema_version: 1,
            layout_version: 1,
            updated_at_ms: 0,
            write_id: write_id.into(),
        }
    }

    #[test]
    fn a_record_is_decoded_once_while_it_is_unchanged() {
        let group = GroupId::new("p", "g");
        let cache = DecodedCache::default();
        let mut decodes = 0;
        for _ in 0..3 {
            let got = cache.decode(&group, &record(1, "w1", "a"), |_| {
                decodes += 1;
                Ok::<_, ()>(metadata(&group))
            });
            assert!(got.is_ok());
        }
        assert_eq!(decodes, 1);
        assert_eq!(cache.get(&group).map(|e| e.stamp.clone()), record(1, "w1", "a").stamp());
    }

    #[test]
    fn a_repeated_revision_with_another_write_or_other_bytes_is_decoded_again() {
        let group = GroupId::new("p", "g");
        let cache = DecodedCache::default();
        let mut decodes = 0;
        let mut read = |r: StoredRecord| {
            let _ = cache.decode(&group, &r, |_| {
                decodes += 1;
                Ok::<_, ()>(metadata(&group))
            });
        };
        read(record(5, "w1", "a"));
        read(record(5, "w2", "a")); // the same revision written again after a rollback
        read(record(5, "w2", "b")); // the aggregate edited by hand, stamp kept
        read(record(5, "", "b")); // no writeId: decoded, never cached
        read(record(5, "", "b"));
        assert_eq!(decodes, 5);
        assert!(cache.get(&group).is_none());
    }

    #[test]
    fn retain_drops_the_entries_of_groups_no_longer_listed() {
        let (kept, gone) = (GroupId::new("p", "kept"), GroupId::new("p", "gone"));
        let cache = DecodedCache::default();
        for group in [&kept, &gone] {
            assert!(cache.decode(group, &record(1, "w1", "a"), |_| Ok::<_, ()>(metadata(group))).is_ok());
        }
        cache.retain(|group| *group == kept);
        assert_eq!(cache.groups(), vec![kept]);
    }

    #[test]
    fn a_record_that_fails_to_decode_removes_the_entry() {
        let group = GroupId::new("p", "g");
        let cache = DecodedCache::default();
        assert!(cache.decode(&group, &record(1, "w1", "a"), |_| Ok::<_, ()>(metadata(&group))).is_ok());
        assert!(cache.decode(&group, &record(1, "w1", "corrupt"), |_| Err(())).is_err());
        assert!(cache.get(&group).is_none());
    }

    #[test]
    fn an_index_is_only_ever_the_index_of_the_cached_state_itself() {
        let group = GroupId::new("p", "g");
        let cache = DecodedCache::default();
        let first = cache.decode(&group, &record(1, "w1", "a"), |_| Ok::<_, ()>(metadata(&group))).expect("decodes");
        let index = cache.index_of(&first).expect("the cached state has an index");
        assert!(Arc::ptr_eq(&index, &cache.index_of(&first).expect("again")), "built once per cached state");
        // An equal state that is not the cached allocation gets none: nothing ties it to the entry.
        assert!(cache.index_of(&Arc::new(metadata(&group))).is_none());
        // A new write replaces the entry: the old state has no index any more, the new one a new one.
        let mut next = metadata(&group);
        next.shard_count = 8;
        let next = Arc::new(next);
        cache.put(&group, record(2, "w2", "b"), Arc::clone(&next));
        assert!(cache.index_of(&first).is_none());
        let rebuilt = cache.index_of(&next).expect("the new cached state has an index");
        assert!(!Arc::ptr_eq(&index, &rebuilt));
        assert_eq!(*rebuilt, GroupIndex::build(&next));
    }
}
