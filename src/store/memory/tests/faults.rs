//! Every fault knob, each against the behaviour it must produce.

use super::{group, other_group, put, request, stamp};
use crate::core::model::GroupId;
use crate::store::memory::{HistoryKind, IdentityCause, MemoryStore, OutageMode, RollbackMode, CORRUPT_AGGREGATE};
use crate::store::{MetadataStore, StoreError, StreamStore, WriteOutcome};

fn is_reset(result: &Result<impl std::fmt::Debug, StoreError>) -> bool {
    matches!(result, Err(StoreError::Unavailable(m)) if m.starts_with("connection reset"))
}

#[tokio::test]
async fn dropped_writes_are_acknowledged_but_not_applied() {
    let store = MemoryStore::new(1);
    let g = group();
    store.set_write_drop_probability(1.0);
    assert_eq!(store.write(&g, request(None, "a")).await, Ok(WriteOutcome::Written { revision: 1 }));
    assert_eq!(store.load(&g).await, Ok(None));
    let kinds: Vec<HistoryKind> = store.history().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, vec![HistoryKind::WriteDropped { group: g.clone(), revision: 1 }]);
    assert_eq!(store.record_at(&g, 1, store.now_ms()), None, "a dropped write was never in the store");

    store.set_write_drop_probability(0.0);
    assert_eq!(store.write(&g, request(None, "a")).await, Ok(WriteOutcome::Written { revision: 1 }));
    assert_eq!(store.load(&g).await.expect("load").map(|r| r.aggregate), Some("a".into()));

    // Half the writes drop; the seed decides which, identically every run.
    let first = drop_pattern(9).await;
    assert_eq!(first, drop_pattern(9).await);
    assert!(first.contains(&true) && first.contains(&false), "{first:?}");
}

/// Which of 32 writes a store seeded with `seed` applies at drop probability 0.5.
async fn drop_pattern(seed: u64) -> Vec<bool> {
    let store = MemoryStore::new(seed);
    let g = group();
    store.set_write_drop_probability(0.5);
    let mut applied = Vec::new();
    for i in 0..32 {
        let current = store.peek_record(&g).map(|r| r.cas_stamp());
        store.write(&g, request(current, &i.to_string())).await.expect("write");
        applied.push(store.peek_record(&g).is_some_and(|r| r.aggregate == i.to_string()));
    }
    applied
}

#[tokio::test]
async fn failover_rollback_loses_writes_changes_identity_and_breaks_old_handles_once() {
    let store = MemoryStore::new(1);
    let g = group();
    let before = store.identity().await.expect("identity");
    for aggregate in ["a", "b", "c"] {
        put(&store, &g, aggregate).await;
    }
    let stale_clone = store.clone();

    assert_eq!(store.rollback(1, RollbackMode::Failover), 1);
    let fresh = store.connect();

    assert!(is_reset(&store.load(&g).await), "the first call after the failover breaks");
    let after = store.identity().await.expect("reconnected");
    assert_ne!(after.run_id, before.run_id);
    assert_ne!(after.replication_id, before.replication_id);
    assert_eq!(store.load(&g).await.expect("load").map(|r| (r.revision, r.aggregate)), Some((2, "b".into())));
    assert!(is_reset(&stale_clone.identity().await), "a clone made before the failover breaks too");
    assert_eq!(stale_clone.identity().await, Ok(after.clone()));
    assert_eq!(fresh.identity().await, Ok(after), "a connection opened after the failover is fine");
}

#[tokio::test]
async fn a_fork_keeps_the_identity_and_state_then_diverges_from_the_failed_over_primary() {
    let primary = MemoryStore::new(1);
    let g = group();
    for aggregate in ["a", "b", "c"] {
        put(&primary, &g, aggregate).await;
    }
    primary.xadd("s", vec![("k".into(), b"1".to_vec())], None).await.expect("xadd");
    let before = primary.identity().await.expect("identity");
    let on_primary = primary.connect();

    let old = primary.fork(7);
    primary.rollback(1, RollbackMode::Failover);
    let on_old = old.connect();

    // The old primary is the server the clients knew: same identity, the lost write, the stream.
    assert_eq!(on_old.identity().await, Ok(before.clone()));
    assert_eq!(on_old.load(&g).await.expect("load").map(|r| (r.revision, r.aggregate)), Some((3, "c".into())));
    assert_eq!(old.peek_stream_ids("s"), primary.peek_stream_ids("s"));
    assert!(old.read_log().is_empty() && old.add_log().is_empty(), "its logs hold only what it ran itself");
    // The primary failed over.
    assert!(is_reset(&on_primary.load(&g).await));
    assert_ne!(on_primary.identity().await.expect("identity"), before);
    assert_eq!(on_primary.load(&g).await.expect("load").map(|r| r.revision), Some(2));

    // From here on each has its own state.
    put(&on_old, &g, "d").await;
    on_old.xadd("s", vec![("k".into(), b"2".to_vec())], None).await.expect("xadd");
    assert_eq!(on_primary.load(&g).await.expect("load").map(|r| (r.revision, r.aggregate)), Some((2, "b".into())));
    assert_eq!(primary.peek_stream_ids("s").len(), 1);
    assert_eq!(old.peek_stream_ids("s").len(), 2);
    assert_eq!(old.add_log().len(), 1);
}

#[tokio::test]
async fn rollback_undoes_liveness_mutex_and_index_writes_too() {
    let store = MemoryStore::new(1);
    let (g, other) = (group(), other_group());
    put(&store, &g, "a").await; // two writes: the script and the index SADD
    store.touch_and_load(&g, "m1").await.expect("touch");
    store.touch_and_load(&g, "m1").await.expect("touch");
    store.index_add(&other).await.expect("index");
    store.index_add(&other).await.expect("a no-op SADD: not a write");
    store.acquire_mutex(&g, "t1", 60_000).await.expect("mutex");
    store.acquire_mutex(&g, "t2", 60_000).await.expect("failed acquire: not a write");

    assert_eq!(store.rollback(3, RollbackMode::Silent), 3);
    assert_eq!(store.acquire_mutex(&g, "t3", 60_000).await, Ok(true), "t1's acquire was undone");
    assert_eq!(store.index_members().await, Ok(vec![g.clone()]), "the SADD of other was undone");
    assert_eq!(store.liveness(&g).await.expect("liveness").get("m1"), Some(&1), "one increment undone");

    // Left: the create, its SADD, the first increment, and t3's acquire.
    assert_eq!(store.rollback(100, RollbackMode::Silent), 4);
    assert_eq!(store.load(&g).await, Ok(None));
    assert!(store.liveness(&g).await.expect("liveness").is_empty());
    assert_eq!(store.index_members().await, Ok(vec![]));
    assert_eq!(store.acquire_mutex(&g, "t4", 60_000).await, Ok(true));
}

#[tokio::test]
async fn silent_rollback_keeps_identity_and_connections() {
    let store = MemoryStore::new(1);
    let g = group();
    put(&store, &g, "a").await;
    put(&store, &g, "b").await;
    let before = store.identity().await.expect("identity");

    assert_eq!(store.rollback(1, RollbackMode::Silent), 1);
    assert_eq!(store.load(&g).await.expect("no reset").map(|r| r.aggregate), Some("a".into()));
    assert_eq!(store.identity().await, Ok(before));
}

#[tokio::test]
async fn deleting_the_metadata_key_is_not_a_journaled_write() {
    let store = MemoryStore::new(1);
    let g = group();
    put(&store, &g, "a").await;
    put(&store, &g, "b").await;
    store.index_add(&g).await.expect("index");
    assert!(store.delete_metadata_key(&g));
    assert!(!store.delete_metadata_key(&g), "already gone");
    assert_eq!(store.load(&g).await, Ok(None));
    assert_eq!(store.index_members().await, Ok(vec![g.clone()]), "the index still names it");

    // The journal holds the first write, its index SADD and the second write (the explicit SADD
    // was a no-op): undoing two restores the first record.
    assert_eq!(store.rollback(2, RollbackMode::Silent), 2);
    assert_eq!(store.load(&g).await.expect("load").map(|r| r.aggregate), Some("a".into()));
}

#[tokio::test]
async fn outage_errors_fail_every_call_until_healed() {
    let store = MemoryStore::new(1);
    let g = group();
    put(&store, &g, "a").await;
    store.set_outage(Some(OutageMode::Errors));
    assert!(matches!(store.load(&g).await, Err(StoreError::Unavailable(_))));
    assert!(matches!(store.write(&g, request(Some(stamp(1, "a")), "b")).await, Err(StoreError::Unavailable(_))));
    assert!(matches!(store.xadd("s", vec![("k".into(), b"v".to_vec())], None).await, Err(StoreError::Unavailable(_))));
    assert!(matches!(store.probe().await, Err(StoreError::Unavailable(_))));
    store.set_outage(None);
    assert_eq!(store.load(&g).await.expect("healed").map(|r| r.aggregate), Some("a".into()));
}

#[tokio::test]
async fn outage_timeouts_hang_then_fail() {
    let store = MemoryStore::new(1);
    store.set_outage(Some(OutageMode::Timeouts { after_ms: 40 }));
    let started = tokio::time::Instant::now();
    assert_eq!(store.load(&group()).await, Err(StoreError::Unavailable("timeout".into())));
    assert!(started.elapsed() >= std::time::Duration::from_millis(40));
}

#[tokio::test]
async fn latency_is_added_to_every_call_and_the_write_lands_midway() {
    let store = MemoryStore::new(1);
    let g = group();
    store.set_latency_ms(40);
    store.set_latency_jitter_ms(10);
    let sent_ms = store.now_ms();
    let started = tokio::time::Instant::now();
    put(&store, &g, "a").await; // a load and a write
    assert!(started.elapsed() >= std::time::Duration::from_millis(80));
    let written_at_ms = store.history()[0].at_ms;
    assert!(written_at_ms >= sent_ms + 40 + 20, "the write reached the server after half its latency");

    store.set_latency_ms(0);
    store.set_latency_jitter_ms(0);
    let quick = tokio::time::Instant::now();
    store.load(&g).await.expect("load");
    assert!(quick.elapsed() < std::time::Duration::from_millis(1_000));
}

#[tokio::test]
async fn unsupported_commands_fail_the_methods_that_need_them_and_the_probe() {
    let store = MemoryStore::new(1);
    let g = group();
    store.set_unsupported("evalsha");
    let unsupported = |command: &str| StoreError::Unsupported {
        command: command.into(),
        detail: format!("ERR unknown command '{command}'"),
    };
    assert_eq!(store.write(&g, request(None, "a")).await, Err(unsupported("EVALSHA")));
    assert_eq!(store.touch_and_load(&g, "m1").await, Err(unsupported("EVALSHA")));
    assert_eq!(store.load(&g).await, Ok(None), "HGETALL still works");
    assert_eq!(store.probe().await, Err(unsupported("EVALSHA")));

    store.set_unsupported("XAUTOCLAIM");
    store.set_supported("EVALSHA");
    assert_eq!(store.claim_all_pending("s", "cg", "c1", 0).await, Err(unsupported("XAUTOCLAIM")));
    assert_eq!(store.probe().await, Err(unsupported("XAUTOCLAIM")));
    assert!(store.write(&g, request(None, "a")).await.is_ok());

    store.set_unsupported("INFO");
    assert_eq!(store.probe().await, Err(unsupported("INFO")), "the first missing command is named");
    store.clear_unsupported();
    assert!(store.probe().await.is_ok());

    // Commands used inside scripts count too (an ACL can deny them there).
    store.set_unsupported("HMGET");
    store.set_unsupported("HSET");
    assert_eq!(store.load(&g).await, Err(unsupported("HMGET")));
    assert_eq!(store.touch_and_load(&g, "m1").await, Err(unsupported("HMGET")));
    assert_eq!(store.write(&g, request(Some(stamp(1, "a")), "b")).await, Err(unsupported("HSET")));
    assert_eq!(store.liveness(&g).await, Ok(Default::default()), "HGETALL still works");
    assert_eq!(store.probe().await, Err(unsupported("HMGET")));
}

#[tokio::test]
async fn raw_edits_corrupt_the_aggregate_or_set_a_future_schema() {
    let store = MemoryStore::new(1);
    let (g, other) = (group(), other_group());
    put(&store, &g, r#"{"ok":true}"#).await;
    put(&store, &other, r#"{"ok":true}"#).await;
    assert!(!store.corrupt_aggregate(&GroupId::new("missing", "g")));

    assert!(store.corrupt_aggregate(&g));
    let corrupted = store.load(&g).await.expect("load").expect("record");
    assert_eq!((corrupted.aggregate.as_str(), corrupted.revision), (CORRUPT_AGGREGATE, 1));
    assert!(serde_json::from_str::<serde_json::Value>(&corrupted.aggregate).is_err());

    assert!(store.set_future_schema(&other, 99));
    let future = store.load(&other).await.expect("load").expect("record");
    assert_eq!((future.schema_version, future.revision, future.aggregate.as_str()), (99, 1, r#"{"ok":true}"#));

    let kinds: Vec<HistoryKind> = store.history().into_iter().skip(2).map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        vec![
            HistoryKind::AggregateCorrupted { group: g.clone() },
            HistoryKind::SchemaVersionSet { group: other, schema_version: 99 },
        ]
    );
    assert_eq!(store.record_at(&g, 1, store.now_ms()).as_deref(), Some(CORRUPT_AGGREGATE));
    assert_eq!(store.rollback(1, RollbackMode::Silent), 1, "raw edits are not journaled");
    assert_eq!(store.load(&g).await.expect("load").map(|r| r.aggregate), Some(CORRUPT_AGGREGATE.into()));
}

#[tokio::test]
async fn restart_keeps_state_and_flush_all_loses_everything() {
    let store = MemoryStore::new(1);
    let g = group();
    put(&store, &g, "a").await;
    store.index_add(&g).await.expect("index");
    let stream_id = store.xadd("s", vec![("k".into(), b"v".to_vec())], None).await.expect("xadd");
    let first = store.identity().await.expect("identity");

    store.restart();
    assert!(is_reset(&store.load(&g).await));
    let second = store.identity().await.expect("identity");
    assert_ne!(second, first);
    assert_eq!(store.load(&g).await.expect("load").map(|r| r.aggregate), Some("a".into()));
    assert_eq!(store.peek_stream_ids("s"), vec![stream_id]);

    store.flush_all();
    assert!(is_reset(&store.index_members().await));
    assert_ne!(store.identity().await.expect("identity"), second);
    assert_eq!(store.load(&g).await, Ok(None));
    assert_eq!(store.index_members().await, Ok(vec![]));
    assert!(store.peek_stream_ids("s").is_empty());
    assert_eq!(store.rollback(10, RollbackMode::Silent), 0, "the journal went with the data");

    let causes: Vec<IdentityCause> = store
        .history()
        .into_iter()
        .filter_map(|e| match e.kind {
            HistoryKind::IdentityChanged { cause, .. } => Some(cause),
            _ => None,
        })
        .collect();
    assert_eq!(causes, vec![IdentityCause::Restart, IdentityCause::FlushAll]);
    assert_eq!(store.record_at(&g, 1, store.now_ms()).as_deref(), Some("a"), "history outlives the flush");
}
