//! Stream semantics (XADD, XGROUP CREATE, XREADGROUP, XACK, XAUTOCLAIM) and the call logs.

use super::sleep_ms;
use crate::store::memory::{MemoryStore, ReadSource, RollbackMode};
use crate::store::{EntryId, GroupStart, ReadFrom, StoreError, StreamEntry, StreamStore};

fn fields(value: &str) -> Vec<(String, Vec<u8>)> {
    vec![("payload".to_string(), value.as_bytes().to_vec())]
}

async fn add(store: &MemoryStore, stream: &str, value: &str) -> EntryId {
    store.xadd(stream, fields(value), None).await.expect("xadd")
}

/// One XREADGROUP on one stream; the ids delivered.
async fn read(store: &MemoryStore, consumer: &str, stream: &str, from: ReadFrom, count: usize) -> Vec<EntryId> {
    let streams = [(stream.to_string(), from)];
    let result = store.xreadgroup("cg", consumer, &streams, count, Some(5_000)).await.expect("xreadgroup");
    result
        .into_iter()
        .flat_map(|(s, entries)| {
            assert_eq!(s, stream);
            assert!(!entries.is_empty(), "streams with nothing are omitted");
            entries.into_iter().map(|e| e.id)
        })
        .collect()
}

fn is_nogroup<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::Protocol(m)) if m.starts_with("NOGROUP"))
}

#[tokio::test]
async fn xadd_ids_strictly_increase_and_follow_the_store_clock() {
    let store = MemoryStore::new(1);
    let mut ids = Vec::new();
    for i in 0..50 {
        ids.push(add(&store, "s:0", &i.to_string()).await);
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    sleep_ms(3).await;
    let later = add(&store, "s:0", "later").await;
    assert!(later.ms > ids[49].ms && later.seq == 0, "a new millisecond restarts seq at 0: {later}");
    assert!(later.ms <= store.now_ms());
    assert_eq!(store.peek_stream_ids("s:0").len(), 51);
    let empty = store.xadd("s:0", Vec::new(), None).await;
    assert!(matches!(empty, Err(StoreError::Protocol(ref m)) if m.contains("wrong number of arguments")), "{empty:?}");

    let acks: Vec<EntryId> = store.add_log().into_iter().map(|r| r.id).collect();
    assert_eq!(acks, store.peek_stream_ids("s:0"), "every acknowledged XADD is logged");
}

#[tokio::test]
async fn reading_a_missing_group_or_stream_is_nogroup() {
    let store = MemoryStore::new(1);
    assert!(is_nogroup(&store.xreadgroup("cg", "c1", &[("nostream".into(), ReadFrom::New)], 10, None).await));
    store.ensure_group("s:0", "cg").await.expect("group");
    let both = [("s:0".to_string(), ReadFrom::New), ("s:1".to_string(), ReadFrom::New)];
    assert!(is_nogroup(&store.xreadgroup("cg", "c1", &both, 10, None).await), "one missing stream fails all");
    assert!(is_nogroup(&store.xreadgroup("other", "c1", &both[..1], 10, None).await));
    assert!(is_nogroup(&store.claim_all_pending("s:0", "other", "c1", 0).await));
    assert_eq!(store.xack("s:0", "other", &[EntryId { ms: 1, seq: 0 }]).await, Ok(0), "XACK never fails");
}

#[tokio::test]
async fn ensure_group_starts_at_the_beginning_and_is_idempotent() {
    let store = MemoryStore::new(1);
    let early = add(&store, "s:0", "before the group").await;
    store.ensure_group("s:0", "cg").await.expect("group");
    assert_eq!(read(&store, "c1", "s:0", ReadFrom::New, 10).await, vec![early]);
    let late = add(&store, "s:0", "after").await;
    store.ensure_group("s:0", "cg").await.expect("again: a no-op");
    assert_eq!(read(&store, "c1", "s:0", ReadFrom::New, 10).await, vec![late], "the cursor was kept");
    assert_eq!(store.peek_pending("s:0", "cg").len(), 2, "the PEL was kept");

    store.ensure_group("fresh", "cg").await.expect("MKSTREAM");
    assert!(read(&store, "c1", "fresh", ReadFrom::New, 10).await.is_empty());
}

/// `$` (only the planted `create-group-at-latest` asks for it) skips what the stream already had.
#[tokio::test]
async fn a_group_created_at_latest_skips_earlier_entries() {
    let store = MemoryStore::new(1);
    add(&store, "s:0", "before the group").await;
    store.create_group("s:0", "cg", GroupStart::Latest).await.expect("group");
    let late = add(&store, "s:0", "after").await;
    assert_eq!(read(&store, "c1", "s:0", ReadFrom::New, 10).await, vec![late]);
}

#[tokio::test]
async fn new_delivers_once_and_own_pending_redelivers_only_your_entries() {
    let store = MemoryStore::new(1);
    store.ensure_group("s:0", "cg").await.expect("group");
    let ids: Vec<EntryId> =
        [add(&store, "s:0", "a").await, add(&store, "s:0", "b").await, add(&store, "s:0", "c").await].to_vec();

    assert_eq!(read(&store, "c1", "s:0", ReadFrom::New, 2).await, ids[..2].to_vec(), "COUNT limits");
    assert_eq!(read(&store, "c2", "s:0", ReadFrom::New, 0).await, ids[2..].to_vec(), "COUNT 0: no limit");
    assert!(read(&store, "c1", "s:0", ReadFrom::New, 10).await.is_empty(), "each entry goes to the group once");

    assert_eq!(read(&store, "c1", "s:0", ReadFrom::OwnPending, 10).await, ids[..2].to_vec());
    assert_eq!(read(&store, "c2", "s:0", ReadFrom::OwnPending, 10).await, ids[2..].to_vec());
    assert!(read(&store, "c3", "s:0", ReadFrom::OwnPending, 10).await.is_empty());
    let pending = store.peek_pending("s:0", "cg");
    assert_eq!(pending[0], (ids[0], "c1".to_string(), 2), "a history read counts as a delivery");

    let entries = store.xreadgroup("cg", "c1", &[("s:0".into(), ReadFrom::OwnPending)], 1, None).await.expect("r");
    assert_eq!(entries, vec![("s:0".to_string(), vec![StreamEntry { id: ids[0], fields: fields("a") }])]);
}

#[tokio::test]
async fn xack_removes_entries_from_the_pending_list() {
    let store = MemoryStore::new(1);
    store.ensure_group("s:0", "cg").await.expect("group");
    let a = add(&store, "s:0", "a").await;
    let b = add(&store, "s:0", "b").await;
    read(&store, "c1", "s:0", ReadFrom::New, 10).await;

    let unknown = EntryId { ms: a.ms + 1_000_000, seq: 0 };
    assert_eq!(store.xack("s:0", "cg", &[a, unknown]).await, Ok(1));
    assert_eq!(store.xack("s:0", "cg", &[a]).await, Ok(0), "already acknowledged");
    assert_eq!(read(&store, "c1", "s:0", ReadFrom::OwnPending, 10).await, vec![b]);
    let acks: Vec<Vec<EntryId>> = store.ack_log().into_iter().map(|r| r.ids).collect();
    assert_eq!(acks, vec![vec![a], vec![]]);
}

#[tokio::test]
async fn claim_all_pending_moves_idle_entries_to_the_claimer() {
    let store = MemoryStore::new(1);
    store.ensure_group("s:0", "cg").await.expect("group");
    let a = add(&store, "s:0", "a").await;
    let b = add(&store, "s:0", "b").await;
    read(&store, "old", "s:0", ReadFrom::New, 10).await;

    assert!(store.claim_all_pending("s:0", "cg", "new", 60_000).await.expect("claim").is_empty(), "not idle");
    sleep_ms(20).await;
    let claimed = store.claim_all_pending("s:0", "cg", "new", 10).await.expect("claim");
    assert_eq!(claimed, vec![StreamEntry { id: a, fields: fields("a") }, StreamEntry { id: b, fields: fields("b") }]);
    assert!(read(&store, "old", "s:0", ReadFrom::OwnPending, 10).await.is_empty());
    assert_eq!(read(&store, "new", "s:0", ReadFrom::OwnPending, 10).await, vec![a, b]);
    assert_eq!(store.peek_pending("s:0", "cg")[0], (a, "new".to_string(), 3), "claim and re-read count");
}

#[tokio::test]
async fn maxlen_trims_the_oldest_and_trimmed_pending_entries_lose_their_fields() {
    let store = MemoryStore::new(1);
    store.ensure_group("s:0", "cg").await.expect("group");
    let a = add(&store, "s:0", "a").await;
    read(&store, "c1", "s:0", ReadFrom::New, 10).await;
    let mut ids = vec![a];
    for value in ["b", "c", "d"] {
        ids.push(store.xadd("s:0", fields(value), Some(2)).await.expect("xadd"));
    }
    assert_eq!(store.peek_stream_ids("s:0"), ids[2..].to_vec());

    let own = store.xreadgroup("cg", "c1", &[("s:0".into(), ReadFrom::OwnPending)], 10, None).await.expect("r");
    assert_eq!(own, vec![("s:0".to_string(), vec![StreamEntry { id: a, fields: Vec::new() }])], "id with nil");
    assert!(store.claim_all_pending("s:0", "cg", "c2", 0).await.expect("claim").is_empty());
    assert!(store.peek_pending("s:0", "cg").is_empty(), "XAUTOCLAIM dropped the deleted entry");
    assert_eq!(read(&store, "c2", "s:0", ReadFrom::New, 10).await, ids[2..].to_vec(), "b was never delivered");
}

#[tokio::test]
async fn every_delivery_call_is_logged_even_empty_or_failed() {
    let store = MemoryStore::new(1);
    store.ensure_group("s:0", "cg").await.expect("group");
    let a = add(&store, "s:0", "a").await;
    read(&store, "c1", "s:0", ReadFrom::New, 10).await;
    read(&store, "c1", "s:0", ReadFrom::New, 10).await;
    store.claim_all_pending("s:0", "cg", "c2", 0).await.expect("claim");
    let _ = store.xreadgroup("cg", "c1", &[("s:9".into(), ReadFrom::OwnPending)], 10, None).await;
    store.set_outage(Some(crate::store::memory::OutageMode::Errors));
    let _ = store.xreadgroup("cg", "c1", &[("s:0".into(), ReadFrom::New)], 10, None).await;
    store.set_outage(None);

    let log = store.read_log();
    let summary: Vec<(&str, &str, ReadSource, Vec<EntryId>, bool)> = log
        .iter()
        .map(|r| (r.consumer.as_str(), r.stream.as_str(), r.from, r.ids.clone(), r.error.is_some()))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("c1", "s:0", ReadSource::New, vec![a], false),
            ("c1", "s:0", ReadSource::New, vec![], false),
            ("c2", "s:0", ReadSource::Claim { min_idle_ms: 0 }, vec![a], false),
            ("c1", "s:9", ReadSource::OwnPending, vec![], true),
            ("c1", "s:0", ReadSource::New, vec![], true),
        ]
    );
    assert!(log.iter().all(|r| r.group == "cg" && r.issued_at_ms <= r.at_ms));

    store.clear_logs();
    assert!(store.read_log().is_empty() && store.add_log().is_empty() && store.ack_log().is_empty());
}

#[tokio::test]
async fn streams_survive_metadata_rollbacks() {
    let store = MemoryStore::new(1);
    store.ensure_group("s:0", "cg").await.expect("group");
    let a = add(&store, "s:0", "a").await;
    read(&store, "c1", "s:0", ReadFrom::New, 10).await;
    assert_eq!(store.rollback(10, RollbackMode::Failover), 0, "stream calls are not journaled");
    let _ = store.xack("s:0", "cg", &[]).await; // the connection reset
    assert_eq!(store.peek_stream_ids("s:0"), vec![a]);
    assert_eq!(read(&store, "c1", "s:0", ReadFrom::OwnPending, 10).await, vec![a]);
}
