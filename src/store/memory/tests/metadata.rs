//! Metadata, liveness, mutex, index, identity and history semantics without faults.

use super::{group, other_group, put, request, sleep_ms, stamp};
use crate::core::model::GroupId;
use crate::store::memory::{HistoryKind, MemoryStore, RollbackMode, SERVER_VERSION};
use crate::store::{MetadataStore, StoreError, StoredRecord, WriteOutcome, WriteRequest};

#[tokio::test]
async fn create_is_only_if_absent_and_cas_needs_the_stored_stamp() {
    let store = MemoryStore::new(1);
    let g = group();
    let conflict = |current| Ok(WriteOutcome::RevisionConflict { current });

    assert_eq!(store.write(&g, request(Some(stamp(1, "a")), "a")).await, conflict(None));
    assert_eq!(store.write(&g, request(None, "a")).await, Ok(WriteOutcome::Written { revision: 1 }));
    assert_eq!(store.write(&g, request(None, "b")).await, conflict(Some(1)));
    assert_eq!(store.write(&g, request(Some(stamp(0, "a")), "b")).await, conflict(Some(1)));
    assert_eq!(store.write(&g, request(Some(stamp(2, "a")), "b")).await, conflict(Some(1)));
    // The stored revision with another writeId is another write: a conflict, never an overwrite.
    assert_eq!(store.write(&g, request(Some(stamp(1, "x")), "b")).await, conflict(Some(1)));
    assert_eq!(store.write(&g, request(Some(stamp(1, "")), "b")).await, conflict(Some(1)));
    let mut update = request(Some(stamp(1, "a")), "b");
    update.schema_version = 3;
    update.layout_version = 4;
    update.updated_at_ms = 42;
    assert_eq!(store.write(&g, update).await, Ok(WriteOutcome::Written { revision: 2 }));

    let expected = StoredRecord {
        aggregate: "b".into(),
        revision: 2,
        schema_version: 3,
        layout_version: 4,
        updated_at_ms: 42,
        write_id: "w-b".into(),
    };
    assert_eq!(store.load(&g).await, Ok(Some(expected)));
    assert_eq!(store.load(&other_group()).await, Ok(None));
}

#[tokio::test]
async fn touch_and_load_increments_the_counter_and_reads_the_record() {
    let store = MemoryStore::new(1);
    let g = group();

    let first = store.touch_and_load(&g, "m1").await.expect("touch");
    assert_eq!((first.liveness, first.record), (0, None), "no metadata: nothing written");
    assert!(store.liveness(&g).await.expect("liveness").is_empty());
    put(&store, &g, "a").await;
    store.touch_and_load(&g, "m1").await.expect("touch");
    let second = store.touch_and_load(&g, "m1").await.expect("touch");
    assert_eq!(second.liveness, 2);
    assert_eq!(second.record.map(|r| (r.aggregate, r.revision)), Some(("a".to_string(), 1)));
    store.touch_and_load(&g, "m2").await.expect("touch");

    let liveness = store.liveness(&g).await.expect("liveness");
    assert_eq!(liveness.into_iter().collect::<Vec<_>>(), vec![("m1".to_string(), 2), ("m2".to_string(), 1)]);
    assert!(store.liveness(&other_group()).await.expect("liveness").is_empty());
}

#[tokio::test]
async fn a_failed_liveness_guard_writes_nothing_and_removals_delete_fields() {
    let store = MemoryStore::new(1);
    let g = group();
    put(&store, &g, "a").await;
    store.touch_and_load(&g, "m1").await.expect("touch");
    store.touch_and_load(&g, "m1").await.expect("touch");
    store.touch_and_load(&g, "m2").await.expect("touch");

    // m1 heartbeated after the decision saw 1: the expiry must not be recorded.
    let stale = WriteRequest {
        liveness_guards: vec![("m3".into(), 0), ("m1".into(), 1)],
        liveness_remove: vec!["m1".into()],
        ..request(Some(stamp(1, "a")), "m1 expired")
    };
    assert_eq!(store.write(&g, stale).await, Ok(WriteOutcome::LivenessChanged { member: "m1".into() }));
    assert_eq!(store.load(&g).await.expect("load").map(|r| r.revision), Some(1));
    assert_eq!(store.liveness(&g).await.expect("liveness").get("m1"), Some(&2));

    // A revision conflict is reported before a guard failure.
    let both_wrong = WriteRequest { liveness_guards: vec![("m1".into(), 1)], ..request(Some(stamp(7, "a")), "x") };
    assert_eq!(store.write(&g, both_wrong).await, Ok(WriteOutcome::RevisionConflict { current: Some(1) }));

    // Absent counters compare as 0; removed fields disappear.
    let fresh = WriteRequest {
        liveness_guards: vec![("m1".into(), 2), ("never".into(), 0)],
        liveness_remove: vec!["m1".into(), "never".into()],
        ..request(Some(stamp(1, "a")), "m1 expired")
    };
    assert_eq!(store.write(&g, fresh).await, Ok(WriteOutcome::Written { revision: 2 }));
    let liveness = store.liveness(&g).await.expect("liveness");
    assert_eq!(liveness.into_iter().collect::<Vec<_>>(), vec![("m2".to_string(), 1)]);
}

#[tokio::test]
async fn delete_needs_the_stamp_and_removes_metadata_liveness_and_index_entry() {
    let store = MemoryStore::new(1);
    let g = group();
    assert_eq!(store.delete(&g, &stamp(1, "a")).await, Ok(WriteOutcome::RevisionConflict { current: None }));
    put(&store, &g, "a").await;
    put(&store, &other_group(), "other").await;
    store.index_add(&g).await.expect("index");
    store.index_add(&other_group()).await.expect("index");
    store.touch_and_load(&g, "m1").await.expect("touch");

    assert_eq!(store.delete(&g, &stamp(2, "a")).await, Ok(WriteOutcome::RevisionConflict { current: Some(1) }));
    assert_eq!(store.delete(&g, &stamp(1, "x")).await, Ok(WriteOutcome::RevisionConflict { current: Some(1) }));
    assert!(store.load(&g).await.expect("load").is_some());
    assert_eq!(store.delete(&g, &stamp(1, "a")).await, Ok(WriteOutcome::Written { revision: 0 }));

    assert_eq!(store.load(&g).await, Ok(None));
    assert!(store.liveness(&g).await.expect("liveness").is_empty());
    assert_eq!(store.index_members().await, Ok(vec![other_group()]));
    assert!(store.load(&other_group()).await.expect("load").is_some(), "other groups are untouched");
}

#[tokio::test]
async fn mutex_is_set_nx_with_a_ttl_and_released_by_compare_and_delete() {
    let store = MemoryStore::new(1);
    let g = group();

    assert_eq!(store.acquire_mutex(&g, "t1", 200).await, Ok(true));
    assert_eq!(store.acquire_mutex(&g, "t2", 200).await, Ok(false), "NX: held by t1");
    assert_eq!(store.acquire_mutex(&other_group(), "t2", 200).await, Ok(true), "one mutex per group");
    assert_eq!(store.release_mutex(&g, "t2").await, Ok(false), "only the holder's token deletes it");
    assert_eq!(store.release_mutex(&g, "t1").await, Ok(true));
    assert_eq!(store.release_mutex(&g, "t1").await, Ok(false), "already released");
    assert_eq!(store.acquire_mutex(&g, "t2", 30).await, Ok(true));

    let acquired_at_ms = store.now_ms();
    sleep_ms(60).await;
    assert!(store.now_ms() > acquired_at_ms + 30);
    assert_eq!(store.release_mutex(&g, "t2").await, Ok(false), "t2's mutex expired");
    assert_eq!(store.acquire_mutex(&g, "t3", 200).await, Ok(true), "an expired mutex is free");

    let zero = store.acquire_mutex(&g, "t4", 0).await;
    assert!(matches!(zero, Err(StoreError::Protocol(ref m)) if m.contains("invalid expire time")), "{zero:?}");
}

#[tokio::test]
async fn index_is_a_set_rebuildable_from_the_metadata_keys() {
    let store = MemoryStore::new(1);
    let (g, other) = (group(), other_group());
    store.index_add(&g).await.expect("index");
    store.index_add(&g).await.expect("index");
    assert_eq!(store.index_members().await, Ok(vec![g.clone()]));

    put(&store, &other, "b").await;
    assert_eq!(store.index_members().await, Ok(vec![other.clone(), g.clone()]), "a create indexes the group");
    // The index lost `other` (its SADD was rolled back; the index is never trusted as truth): a
    // rebuild finds it again from the SCAN.
    assert_eq!(store.rollback(1, RollbackMode::Silent), 1);
    assert_eq!(store.index_members().await, Ok(vec![g.clone()]));
    put(&store, &g, "a").await;
    assert_eq!(store.rebuild_index().await, Ok(vec![other.clone(), g.clone()]));
    assert_eq!(store.index_members().await, Ok(vec![other.clone(), g.clone()]));

    // A rebuild only adds: a deleted key's index entry is not removed by it.
    store.delete_metadata_key(&other);
    assert_eq!(store.rebuild_index().await, Ok(vec![g.clone()]));
    assert_eq!(store.index_members().await, Ok(vec![other, g.clone()]));

    // The SADD after a create is best effort: a rejected SADD leaves the group unindexed.
    let third = GroupId::new("third", "g");
    store.set_unsupported("SADD");
    assert_eq!(store.write(&third, request(None, "c")).await, Ok(WriteOutcome::Written { revision: 1 }));
    store.clear_unsupported();
    assert!(!store.index_members().await.expect("index").contains(&third));
}

#[tokio::test]
async fn identity_and_probe_come_from_the_seed() {
    let store = MemoryStore::new(7);
    let identity = store.identity().await.expect("identity");
    assert_eq!(identity.run_id.len(), 40);
    assert_ne!(identity.run_id, identity.replication_id);
    assert_eq!(MemoryStore::new(7).identity().await, Ok(identity.clone()), "same seed, same identity");
    assert_ne!(MemoryStore::new(8).identity().await, Ok(identity.clone()));

    let report = store.probe().await.expect("probe");
    assert_eq!(report.server_version, SERVER_VERSION);
    assert_eq!(report.identity, identity);
}

#[tokio::test]
async fn record_at_answers_which_aggregate_had_a_revision_at_a_time() {
    let store = MemoryStore::new(1);
    let g = group();
    let before_ms = store.now_ms();
    assert_eq!(store.record_at(&g, 1, before_ms), None);

    put(&store, &g, "a").await; // revision 1
    sleep_ms(5).await;
    put(&store, &g, "b").await; // revision 2
    sleep_ms(5).await;
    let b_seen_ms = store.now_ms();
    sleep_ms(5).await;
    assert_eq!(store.rollback(1, RollbackMode::Silent), 1);
    put(&store, &g, "c").await; // revision 2 again, another aggregate
    let now_ms = store.now_ms();

    assert_eq!(store.record_at(&g, 1, now_ms).as_deref(), Some("a"));
    assert_eq!(store.record_at(&g, 2, b_seen_ms).as_deref(), Some("b"), "the lost write was recorded then");
    assert_eq!(store.record_at(&g, 2, now_ms).as_deref(), Some("c"), "the latest state with revision 2");
    assert_eq!(store.record_at(&g, 3, now_ms), None);
    assert_eq!(store.record_at(&other_group(), 1, now_ms), None);

    let kinds: Vec<HistoryKind> = store.history().into_iter().map(|e| e.kind).collect();
    assert!(
        matches!(
            kinds.as_slice(),
            [
                HistoryKind::Written { revision: 1, .. },
                HistoryKind::Written { revision: 2, .. },
                HistoryKind::RolledBack { requested: 1, undone: 1, .. },
                HistoryKind::Written { revision: 2, .. },
            ]
        ),
        "{kinds:?}"
    );
    let history = store.history();
    assert!(history.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "history is in time order");
    assert_eq!(history[2].metadata_after, vec![(g.clone(), store.history()[0].metadata_after[0].1.clone())]);
}

/// `touch_and_check` is what RedisStore sends: a pipeline of HINCRBY and HMGET, each atomic, that
/// another client's command can interleave. A write landing between the two is seen by the HMGET
/// (the check answers `Changed` with the new record), after the increment was applied. Run as
/// one step under one lock, the fake was stronger than Redis: the write could never land there.
#[tokio::test]
async fn a_write_can_land_between_the_touch_and_the_stamp_check() {
    use crate::store::TouchCheck;
    let store = MemoryStore::new(1);
    let g = group();
    put(&store, &g, "a").await;
    let known = store.load(&g).await.expect("load").expect("record").stamp().expect("stamp");
    let writer = store.connect();
    let (checked, written) = tokio::join!(store.touch_and_check(&g, "m1", &known), async {
        // Ready while the pipeline is between its two commands.
        writer.write(&g, request(Some(stamp(1, "a")), "b")).await
    });
    assert_eq!(written, Ok(WriteOutcome::Written { revision: 2 }));
    match checked.expect("answered") {
        TouchCheck::Changed(touched) => {
            assert_eq!(touched.liveness, 1, "the HINCRBY ran");
            assert_eq!(touched.record.map(|r| r.aggregate), Some("b".to_string()), "the HMGET saw the write");
        }
        TouchCheck::Unchanged { .. } => panic!("the write could not interleave the pipeline"),
    }
}
