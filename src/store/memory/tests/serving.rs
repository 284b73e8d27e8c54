//! A serving store's bounds: the simulation keeps its whole history and a rollback journal, a
//! store serving real clients only the newest history records and no journal.

use super::{group, put};
use crate::core::model::GroupId;
use crate::store::memory::{HistoryKind, HistoryLimits, MemoryStore, RollbackMode};
use crate::store::{GroupStart, MetadataStore, ReadFrom, StreamStore};

/// `n` creates and deletes of distinct groups, plus one XADD, XREADGROUP and XACK each.
async fn churn(store: &MemoryStore, n: u32) {
    store.create_group("s:0", "cg", GroupStart::Latest).await.expect("XGROUP");
    for i in 0..n {
        let g = GroupId::new("churn", format!("g{i}"));
        put(store, &g, "a").await;
        let stamp = store.load(&g).await.expect("load").expect("record").cas_stamp();
        store.delete(&g, &stamp).await.expect("delete");
        let id = store.xadd("s:0", vec![("k".into(), b"v".to_vec())], Some(10)).await.expect("XADD");
        let streams = [("s:0".to_string(), ReadFrom::New)];
        store.xreadgroup("cg", "c", &streams, 0, None).await.expect("XREADGROUP");
        store.xack("s:0", "cg", &[id]).await.expect("XACK");
    }
}

#[tokio::test]
async fn the_simulation_store_keeps_every_record() {
    let store = MemoryStore::new(1);
    churn(&store, 300).await;
    assert_eq!(store.history_lens(), (600, 300, 300, 300));
}

#[tokio::test]
async fn a_serving_store_keeps_only_the_newest_records() {
    let store = MemoryStore::new_serving(1);
    let limits = HistoryLimits::SERVING;
    churn(&store, 300).await;
    assert_eq!(store.history_lens(), (limits.events_max, limits.log_len_max, limits.log_len_max, limits.log_len_max));
    // The oldest were dropped: the last event is the last delete, and the first kept is recent.
    let history = store.history();
    let last = GroupId::new("churn", "g299");
    assert_eq!(history.last().map(|e| e.kind.clone()), Some(HistoryKind::Deleted { group: last, revision: 1 }));
    assert!(!history
        .iter()
        .any(|e| matches!(&e.kind, HistoryKind::Written { group, .. } if *group == GroupId::new("churn", "g0"))));
    // The store itself still works as before.
    put(&store, &group(), "a").await;
    assert_eq!(store.peek_record(&group()).map(|r| r.revision), Some(1));
}

#[tokio::test]
async fn a_zero_limit_keeps_nothing() {
    let store = MemoryStore::with_history_limits(1, HistoryLimits { events_max: 0, log_len_max: 0 });
    churn(&store, 3).await;
    assert_eq!(store.history_lens(), (0, 0, 0, 0));
}

#[tokio::test]
async fn only_the_simulation_store_can_be_rolled_back() {
    for (store, undone) in [(MemoryStore::new(1), 1), (MemoryStore::new_serving(1), 0)] {
        put(&store, &group(), "a").await;
        put(&store, &group(), "b").await;
        assert_eq!(store.rollback(1, RollbackMode::Silent), undone);
        let expected = if undone == 1 { "a" } else { "b" };
        assert_eq!(store.peek_record(&group()).map(|r| r.aggregate).as_deref(), Some(expected));
    }
}
