//! Contract cases for `MetadataStore`: each runs unchanged against every store implementation.

use std::collections::BTreeMap;

use rsc::core::model::GroupId;
use rsc::store::{CasStamp, MetadataStore, StoreError, StoredRecord, StreamStore, WriteOutcome, WriteRequest};

/// A group whose prefix contains ':' (allowed; the group name may not).
pub fn group() -> GroupId {
    GroupId::new("orders:v1", "billing")
}

/// A fresh `writeId` per request, as the coordinator draws one per write.
pub fn write_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    format!("w{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

pub fn create(aggregate: &str) -> WriteRequest {
    WriteRequest {
        expected: None,
        aggregate: aggregate.to_string(),
        schema_version: 1,
        layout_version: 1,
        updated_at_ms: 1_700_000_000_000,
        write_id: write_id(),
        liveness_guards: Vec::new(),
        liveness_remove: Vec::new(),
    }
}

/// A write of `aggregate` conditioned on `expected`, as the coordinator writes after a load.
pub fn cas(expected: &CasStamp, aggregate: &str) -> WriteRequest {
    WriteRequest { expected: Some(expected.clone()), ..create(aggregate) }
}

/// The stamp of the write `group` holds now (what a coordinator's load would condition on).
pub async fn stored<S: MetadataStore>(store: &S, group: &GroupId) -> CasStamp {
    store.load(group).await.expect("load").expect("a record").cas_stamp()
}

/// A stamp no store holds at `revision` (no write ever used this id).
pub fn never_written(revision: u64) -> CasStamp {
    CasStamp { revision, write_id: "never-written".into() }
}

pub fn written(revision: u64) -> WriteOutcome {
    WriteOutcome::Written { revision }
}

pub async fn contract_create_only_if_absent<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let g = group();
    assert_eq!(store.load(&g).await, Ok(None));
    let aggregate = r#"{"shards":4,"note":"ünïcode ✓"}"#;
    let request = WriteRequest { schema_version: 3, layout_version: 2, updated_at_ms: 42, ..create(aggregate) };
    let id = request.write_id.clone();
    assert_eq!(store.write(&g, request).await, Ok(written(1)));
    let expected = StoredRecord {
        aggregate: aggregate.to_string(),
        revision: 1,
        schema_version: 3,
        layout_version: 2,
        updated_at_ms: 42,
        write_id: id,
    };
    assert_eq!(store.load(&g).await, Ok(Some(expected.clone())));
    // A create also indexes the group (RedisStore: a separate SADD, the index has no hash tag).
    assert_eq!(store.index_members().await, Ok(vec![g.clone()]));
    // A second create loses and reports the stored revision; nothing changes.
    assert_eq!(store.write(&g, create("other")).await, Ok(WriteOutcome::RevisionConflict { current: Some(1) }));
    assert_eq!(store.load(&g).await, Ok(Some(expected)));
    assert_eq!(store.index_members().await, Ok(vec![g]));
}

pub async fn contract_cas_success_and_conflict<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let g = group();
    let conflict = |current| Ok(WriteOutcome::RevisionConflict { current });
    assert_eq!(store.write(&g, cas(&never_written(1), "x")).await, conflict(None));
    assert_eq!(store.write(&g, create("v1")).await, Ok(written(1)));
    assert_eq!(store.write(&g, cas(&stored(store, &g).await, "v2")).await, Ok(written(2)));
    let v2 = stored(store, &g).await;
    assert_eq!(store.write(&g, cas(&v2, "v3")).await, Ok(written(3)));
    // A stale writer (it read revision 2) loses and learns the current revision.
    assert_eq!(store.write(&g, cas(&v2, "stale")).await, conflict(Some(3)));
    assert_eq!(store.write(&g, cas(&never_written(4), "ahead")).await, conflict(Some(3)));
    // The stored revision under another writeId, or under none, is another write.
    assert_eq!(store.write(&g, cas(&never_written(3), "same revision")).await, conflict(Some(3)));
    let no_id = CasStamp { revision: 3, write_id: String::new() };
    assert_eq!(store.write(&g, cas(&no_id, "same revision")).await, conflict(Some(3)));
    let record = store.load(&g).await.expect("load").expect("record");
    assert_eq!((record.revision, record.aggregate.as_str()), (3, "v3"));

    // Racing writers that all read revision 3: exactly one wins, the others see 4.
    let v3 = record.cas_stamp();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..10 {
        let (store, g, v3) = (store.clone(), g.clone(), v3.clone());
        tasks.spawn(async move { store.write(&g, cas(&v3, &format!("racer {i}"))).await });
    }
    let mut outcomes = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        outcomes.push(joined.expect("task").expect("write"));
    }
    let winners = outcomes.iter().filter(|o| **o == written(4)).count();
    let losers = outcomes.iter().filter(|o| **o == WriteOutcome::RevisionConflict { current: Some(4) }).count();
    assert_eq!((winners, losers), (1, 9), "{outcomes:?}");
}

/// A write whose expected revision has no successor is a `Protocol` error that writes nothing,
/// never a wrap or a panic (RedisStore computes the new revision in Rust before the script runs).
pub async fn contract_revision_without_successor_is_refused<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let g = group();
    assert_eq!(store.write(&g, create("v1")).await, Ok(written(1)));
    let before = store.load(&g).await.expect("load");
    let mut at_max = stored(store, &g).await;
    at_max.revision = u64::MAX;
    let refused = store.write(&g, cas(&at_max, "wrapped")).await;
    assert!(matches!(refused, Err(StoreError::Protocol(_))), "{refused:?}");
    assert_eq!(store.load(&g).await.expect("load"), before, "nothing written");
}

pub async fn contract_liveness_guard_failure_writes_nothing<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let g = group();
    assert_eq!(store.write(&g, create("v1")).await, Ok(written(1)));
    let v1 = stored(store, &g).await;
    assert_eq!(store.touch_and_load(&g, "m1").await.map(|t| t.liveness), Ok(1));
    let before = store.load(&g).await.expect("load");

    // m1 heartbeated after the decision saw 0: the write must not happen.
    let stale = WriteRequest {
        liveness_guards: vec![("m2".into(), 0), ("m1".into(), 0)],
        liveness_remove: vec!["m1".into()],
        ..cas(&v1, "expire m1")
    };
    assert_eq!(store.write(&g, stale).await, Ok(WriteOutcome::LivenessChanged { member: "m1".into() }));
    assert_eq!(store.load(&g).await.expect("load"), before);
    assert_eq!(store.liveness(&g).await, Ok(BTreeMap::from([("m1".to_string(), 1)])));

    // An absent member's counter is 0, so a guard expecting 3 fails.
    let absent = WriteRequest { liveness_guards: vec![("ghost".into(), 3)], ..cas(&v1, "x") };
    assert_eq!(store.write(&g, absent).await, Ok(WriteOutcome::LivenessChanged { member: "ghost".into() }));

    // The write condition is checked before the guards.
    let both_stale = WriteRequest { liveness_guards: vec![("m1".into(), 0)], ..cas(&never_written(7), "x") };
    assert_eq!(store.write(&g, both_stale).await, Ok(WriteOutcome::RevisionConflict { current: Some(1) }));

    // Guards that match (absent = 0) let the write through.
    let fresh = WriteRequest { liveness_guards: vec![("m1".into(), 1), ("ghost".into(), 0)], ..cas(&v1, "v2") };
    assert_eq!(store.write(&g, fresh).await, Ok(written(2)));
    assert_eq!(store.load(&g).await.expect("load").map(|r| r.aggregate), Some("v2".to_string()));
}

pub async fn contract_liveness_removal<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let g = group();
    assert_eq!(store.write(&g, create("v1")).await, Ok(written(1)));
    // More members than one server-side batch of removals (200) to cover batching.
    let members: Vec<String> = (0..250).map(|i| format!("member-{i:03}")).collect();
    for member in &members {
        assert_eq!(store.touch_and_load(&g, member).await.map(|t| t.liveness), Ok(1));
    }
    assert_eq!(store.touch_and_load(&g, "member-007").await.map(|t| t.liveness), Ok(2));
    let remove: Vec<String> = members.iter().filter(|m| m.as_str() != "member-007").cloned().collect();
    let request = WriteRequest { liveness_remove: remove, ..cas(&stored(store, &g).await, "v2") };
    assert_eq!(store.write(&g, request).await, Ok(written(2)));
    assert_eq!(store.liveness(&g).await, Ok(BTreeMap::from([("member-007".to_string(), 2)])));
    // Removing a member that has no counter is not an error.
    let request = WriteRequest { liveness_remove: vec!["nobody".into()], ..cas(&stored(store, &g).await, "v3") };
    assert_eq!(store.write(&g, request).await, Ok(written(3)));
    assert_eq!(store.liveness(&g).await.map(|l| l.len()), Ok(1));
}

pub async fn contract_touch_and_load<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let g = group();
    // No metadata: nothing is written (heartbeats for unknown groups create no keys).
    let touched = store.touch_and_load(&g, "early").await.expect("touch");
    assert_eq!((touched.liveness, touched.record), (0, None));
    assert_eq!(store.liveness(&g).await, Ok(BTreeMap::new()));

    assert_eq!(store.write(&g, create("v1")).await, Ok(written(1)));
    let touched = store.touch_and_load(&g, "m1").await.expect("touch");
    assert_eq!(touched.liveness, 1);
    assert_eq!(touched.record, store.load(&g).await.expect("load"));
    assert_eq!(touched.record.map(|r| r.revision), Some(1));

    // Concurrent heartbeats: every increment is atomic, so each caller sees a distinct value.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let (store, g) = (store.clone(), g.clone());
        tasks.spawn(async move { store.touch_and_load(&g, "m2").await.map(|t| t.liveness) });
    }
    let mut seen = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        seen.push(joined.expect("task").expect("touch"));
    }
    seen.sort_unstable();
    assert_eq!(seen, (1..=20).collect::<Vec<u64>>());
    let expected = BTreeMap::from([("m1".to_string(), 1), ("m2".to_string(), 20)]);
    assert_eq!(store.liveness(&g).await, Ok(expected));

    // The coordinator's touches add a random step (`store::LIVENESS_STEP_MAX`), both ways.
    let step = rsc::store::LIVENESS_STEP_MAX;
    let touched = store.touch_and_load_by(&g, "m1", step).await.expect("touch by a step");
    assert_eq!(touched.liveness, 1 + step);
    let known = touched.record.and_then(|r| r.stamp()).expect("a stamped record");
    let checked = store.touch_and_check_by(&g, "m1", &known, 7).await.expect("check by a step");
    assert!(matches!(checked, rsc::store::TouchCheck::Unchanged { liveness } if liveness == 8 + step), "{checked:?}");
}

pub async fn contract_delete_if_stamp<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let g = group();
    let other = GroupId::new("other", "g");
    assert_eq!(store.delete(&g, &never_written(1)).await, Ok(WriteOutcome::RevisionConflict { current: None }));
    for group in [&g, &other] {
        assert_eq!(store.write(group, create("v1")).await, Ok(written(1)));
        store.index_add(group).await.expect("index add");
        store.touch_and_load(group, "m1").await.expect("touch");
    }
    let v1 = stored(store, &g).await;
    assert_eq!(store.write(&g, cas(&v1, "v2")).await, Ok(written(2)));
    assert!(store.acquire_mutex(&g, "holder", 60_000).await.expect("mutex"));

    assert_eq!(store.delete(&g, &v1).await, Ok(WriteOutcome::RevisionConflict { current: Some(2) }));
    assert_eq!(store.delete(&g, &never_written(2)).await, Ok(WriteOutcome::RevisionConflict { current: Some(2) }));
    assert_eq!(store.load(&g).await.expect("load").map(|r| r.revision), Some(2));

    assert_eq!(store.delete(&g, &stored(store, &g).await).await, Ok(WriteOutcome::Written { revision: 0 }));
    assert_eq!(store.load(&g).await, Ok(None));
    assert_eq!(store.liveness(&g).await, Ok(BTreeMap::new()));
    assert_eq!(store.index_members().await, Ok(vec![other.clone()]));
    // The mutex belongs to its holder, not to the metadata.
    assert!(!store.acquire_mutex(&g, "someone-else", 60_000).await.expect("mutex"));
    assert!(store.release_mutex(&g, "holder").await.expect("release"));
    // The other group is untouched.
    assert_eq!(store.load(&other).await.expect("load").map(|r| r.revision), Some(1));
    assert_eq!(store.liveness(&other).await.map(|l| l.len()), Ok(1));
    // After a delete the group can be created again from revision 1.
    assert_eq!(store.write(&g, create("again")).await, Ok(written(1)));
}

pub async fn contract_mutex<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let g = group();
    assert!(store.acquire_mutex(&g, "t1", 60_000).await.expect("acquire"));
    assert!(!store.acquire_mutex(&g, "t2", 60_000).await.expect("acquire"));
    // Compare-and-delete: a non-holder's release does nothing.
    assert!(!store.release_mutex(&g, "t2").await.expect("release"));
    assert!(!store.acquire_mutex(&g, "t3", 60_000).await.expect("acquire"));
    assert!(store.release_mutex(&g, "t1").await.expect("release"));
    assert!(!store.release_mutex(&g, "t1").await.expect("release"));

    // TTL expiry frees the mutex; the stalled holder's late release must not free the new one.
    assert!(store.acquire_mutex(&g, "stalled", 150).await.expect("acquire"));
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert!(store.acquire_mutex(&g, "next", 60_000).await.expect("acquire"));
    assert!(!store.release_mutex(&g, "stalled").await.expect("release"));
    assert!(!store.acquire_mutex(&g, "third", 60_000).await.expect("acquire"));

    // Racing acquirers: exactly one gets it.
    assert!(store.release_mutex(&g, "next").await.expect("release"));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..10 {
        let (store, g) = (store.clone(), g.clone());
        tasks.spawn(async move { store.acquire_mutex(&g, &format!("racer {i}"), 60_000).await });
    }
    let mut acquired = 0;
    while let Some(joined) = tasks.join_next().await {
        acquired += usize::from(joined.expect("task").expect("acquire"));
    }
    assert_eq!(acquired, 1);

    // Mutexes of different groups are independent.
    assert!(store.acquire_mutex(&GroupId::new("other", "g"), "t1", 60_000).await.expect("acquire"));

    // Redis rejects a zero expiry.
    assert!(matches!(store.acquire_mutex(&g, "t", 0).await, Err(StoreError::Protocol(_))));
}

pub async fn contract_index_and_rebuild<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let a = group(); // prefix with ':'
    let b = GroupId::new("p", "g2");
    let c = GroupId::new("zeta:x:y", "c");
    assert_eq!(store.index_members().await, Ok(vec![]));
    assert_eq!(store.rebuild_index().await, Ok(vec![]));

    store.index_add(&c).await.expect("index add");
    store.index_add(&c).await.expect("index add is idempotent");
    assert_eq!(store.index_members().await, Ok(vec![c.clone()]));

    for g in [&b, &a] {
        assert_eq!(store.write(g, create("v1")).await, Ok(written(1)));
    }
    assert_eq!(store.index_members().await, Ok(vec![a.clone(), b.clone(), c.clone()]));
    // Rebuild finds exactly the groups with a metadata key, sorted, and indexes them; it does
    // not remove an entry without metadata (c).
    assert_eq!(store.rebuild_index().await, Ok(vec![a.clone(), b.clone()]));
    assert_eq!(store.index_members().await, Ok(vec![a.clone(), b.clone(), c.clone()]));

    assert_eq!(store.delete(&b, &stored(store, &b).await).await, Ok(WriteOutcome::Written { revision: 0 }));
    assert_eq!(store.rebuild_index().await, Ok(vec![a.clone()]));
    assert_eq!(store.index_members().await, Ok(vec![a, c]));
}

/// The heard relay between coordinator instances: what a sender leaves for each owner reaches
/// that owner only, under its own key whatever colons the ids hold, and is gone after its TTL.
pub async fn contract_heard_relay_blobs_reach_their_owner_and_expire<S: MetadataStore + StreamStore + Clone>(
    store: &S,
) {
    let senders = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // Nothing relayed yet.
    assert_eq!(store.exchange_heard("b", &[], 1_000, &senders(&["a", "c"])).await, Ok(vec![None, None]));
    let outgoing = vec![("b".to_string(), "for b".to_string()), ("x:y".to_string(), "for x:y".to_string())];
    assert_eq!(store.exchange_heard("a", &outgoing, 60_000, &[]).await, Ok(vec![]));
    // b reads a's blob (not c's, which never wrote); the owner "x:y" and sender "a" do not meet
    // the owner "x" and sender "y:a".
    assert_eq!(
        store.exchange_heard("b", &[], 1_000, &senders(&["a", "c"])).await,
        Ok(vec![Some("for b".to_string()), None])
    );
    assert_eq!(store.exchange_heard("x:y", &[], 1_000, &senders(&["a"])).await, Ok(vec![Some("for x:y".into())]));
    assert_eq!(store.exchange_heard("x", &[], 1_000, &senders(&["y:a"])).await, Ok(vec![None]));
    // A sender's next blob replaces its last; a short-lived one expires.
    let short = vec![("b".to_string(), "again".to_string())];
    assert_eq!(store.exchange_heard("a", &short, 150, &senders(&["b"])).await, Ok(vec![None]));
    assert_eq!(store.exchange_heard("b", &[], 1_000, &senders(&["a"])).await, Ok(vec![Some("again".into())]));
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(store.exchange_heard("b", &[], 1_000, &senders(&["a"])).await, Ok(vec![None]));
}

pub async fn contract_identity_and_probe<S: MetadataStore + StreamStore + Clone>(store: &S) {
    let first = store.identity().await.expect("identity");
    assert!(!first.run_id.is_empty() && !first.replication_id.is_empty(), "{first:?}");
    assert_eq!(store.write(&group(), create("v1")).await, Ok(written(1)));
    assert_eq!(store.identity().await, Ok(first.clone()));

    let report = store.probe().await.expect("probe");
    assert!(!report.server_version.is_empty());
    assert_eq!(report.identity, first);
    // The probe leaves nothing that looks like a group or an index entry behind.
    assert_eq!(store.rebuild_index().await, Ok(vec![group()]));
    assert_eq!(store.index_members().await, Ok(vec![group()]));
    assert_eq!(store.probe().await.map(|r| r.identity), Ok(first));
}

/// The store must lack XAUTOCLAIM (renamed away on Redis, `set_unsupported` on the fake).
pub async fn contract_probe_names_a_missing_command<S: MetadataStore + StreamStore + Clone>(store: &S) {
    match store.probe().await {
        Err(StoreError::Unsupported { command, .. }) => assert_eq!(command, "XAUTOCLAIM"),
        other => panic!("probe must fail naming XAUTOCLAIM, got {other:?}"),
    }
    // Methods that do not need the command keep working; the one that does fails the same way.
    assert_eq!(store.write(&group(), create("v1")).await, Ok(written(1)));
    store.ensure_group("s:0", "g").await.expect("ensure");
    match store.claim_all_pending("s:0", "g", "c", 0).await {
        Err(StoreError::Unsupported { command, .. }) => assert_eq!(command, "XAUTOCLAIM"),
        other => panic!("claim_all_pending must be Unsupported, got {other:?}"),
    }
}
