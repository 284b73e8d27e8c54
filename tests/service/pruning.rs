//! Bounded memory: every per-group structure of a coordinator process (monitors, decoded cache,
//! observation windows and longest lease, revision marks, evidence bookkeeping, `/metrics` series
//! labelled by group) is forgotten when the group is deleted or found absent, and kept while the
//! group is known to have existed (its index entry remains).

use rsc::core::model::{GroupId, GroupMetadata};
use rsc::core::protocol::{AdminRequest, ErrorCode, HeartbeatRequest, RoutingReport};
use rsc::core::PlantedBugs;
use rsc::service::{Coordinator, CoordinatorOptions, LocalSizes};
use rsc::store::memory::{MemoryStore, RollbackMode};
use rsc::store::MetadataStore;

use super::{coordinator, fast_config, join, next};

/// `ticker_refresh_ms` of [`watcher`]: its ticker re-reads the group index at most this often.
const REFRESH_MS: u64 = 30;

/// An instance whose ticks learn of a delete through another instance at the first pass after
/// [`REFRESH_MS`] (the index read of the pass before is reused until then).
fn watcher(store: &MemoryStore, id: &str) -> Coordinator<MemoryStore> {
    let options = CoordinatorOptions {
        instance_id: id.into(),
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        ticker_refresh_ms: REFRESH_MS,
        ..CoordinatorOptions::default()
    };
    Coordinator::new(store.connect(), options)
}

/// A tick pass once the index read of the last pass is older than [`REFRESH_MS`].
async fn tick_after_refresh(c: &Coordinator<MemoryStore>) {
    tokio::time::sleep(std::time::Duration::from_millis(REFRESH_MS + 5)).await;
    c.tick_all().await;
}

fn named(i: usize) -> GroupId {
    GroupId::new("churn", format!("g{i}"))
}

fn for_group(mut req: HeartbeatRequest, group: &GroupId) -> HeartbeatRequest {
    req.group = group.clone();
    req
}

/// Creates `group`, joins two members, heartbeats, asks for routing and ticks: every per-group
/// structure gets an entry.
async fn use_group(c: &Coordinator<MemoryStore>, group: &GroupId) {
    let create = AdminRequest::CreateGroup { group: group.clone(), shard_count: 4, config: fast_config() };
    c.admin(create).await.expect("create");
    for member in ["a", "b"] {
        let joined = c.heartbeat(for_group(join(member), group)).await.expect("join");
        c.heartbeat(for_group(next(&joined), group)).await.expect("heartbeat");
    }
    c.routing(group, RoutingReport::version(0)).await.expect("routing");
    c.tick_all().await;
}

/// Every recorded member of `group` leaves, as its process would (a delete waits for an empty
/// group: DESIGN §3).
async fn leave_all(c: &Coordinator<MemoryStore>, store: &MemoryStore, group: &GroupId) {
    let record = store.peek_record(group).expect("record");
    let recorded: GroupMetadata = serde_json::from_str(&record.aggregate).expect("aggregate");
    for (id, member) in &recorded.members {
        let leave =
            HeartbeatRequest { leave: true, member_epoch: member.member_epoch, ..for_group(join(id.as_str()), group) };
        c.heartbeat(leave).await.expect("leave");
    }
}

/// Deletes `group` once it is empty: its members leave, and the delete is retried (each time after
/// a tick) until their shards' leases have run out (`GROUP_NOT_EMPTY` until then).
async fn delete(c: &Coordinator<MemoryStore>, store: &MemoryStore, group: &GroupId) {
    leave_all(c, store, group).await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let revision = store.peek_record(group).expect("record").revision;
        match c.admin(AdminRequest::DeleteGroup { group: group.clone(), expected_revision: revision }).await {
            Ok(_) => return,
            Err(e) if e.code == ErrorCode::GroupNotEmpty && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(fast_config().assignment_lease_ms / 3)).await;
                c.tick_all().await;
            }
            Err(e) => panic!("delete of {group}: {e}"),
        }
    }
}

#[tokio::test]
async fn deleted_groups_leave_no_per_group_state_behind() {
    let store = MemoryStore::new(31);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    c.metrics().set_member_series(true);
    c.start().await.expect("probe");
    for i in 0..20 {
        use_group(&c, &named(i)).await;
    }
    let used = c.debug_sizes();
    assert_eq!((used.cache, used.view, used.marks), (20, 20, 20), "{used:?}");
    assert!(used.group_series >= 20 * 2, "group gauges and member series were exported: {used:?}");
    assert_eq!(used.monitors, 0, "no section in flight holds a monitor");
    for i in 0..20 {
        leave_all(&c, &store, &named(i)).await;
    }
    for i in 0..20 {
        delete(&c, &store, &named(i)).await;
    }
    c.tick_all().await;
    assert_eq!(c.debug_sizes(), LocalSizes::default());
}

#[tokio::test]
async fn a_group_deleted_through_another_instance_is_forgotten_at_the_first_tick_that_reads_the_index() {
    let store = MemoryStore::new(32);
    let (c1, c2) = (watcher(&store, "c1"), coordinator(&store, "c2", PlantedBugs::NONE));
    let (gone, kept) = (named(1), named(2));
    use_group(&c1, &gone).await;
    use_group(&c1, &kept).await;
    delete(&c2, &store, &gone).await;
    assert_eq!(c1.debug_sizes().view, 2, "nothing told c1 yet");
    tick_after_refresh(&c1).await;
    let sizes = c1.debug_sizes();
    assert_eq!((sizes.cache, sizes.view, sizes.marks), (1, 1, 1), "{sizes:?}");
    let text = c1.metrics().render();
    assert!(!text.contains("group=\"churn:g1\""), "{text}");
    assert!(text.contains("group=\"churn:g2\""), "{text}");
}

#[tokio::test]
async fn a_group_reported_not_found_is_forgotten_at_once() {
    let store = MemoryStore::new(33);
    let (c1, c2) = (coordinator(&store, "c1", PlantedBugs::NONE), coordinator(&store, "c2", PlantedBugs::NONE));
    let group = named(1);
    use_group(&c1, &group).await;
    delete(&c2, &store, &group).await;
    let refused = c1.heartbeat(for_group(join("c"), &group)).await.expect_err("deleted");
    assert_eq!(refused.code, ErrorCode::GroupNotFound);
    assert_eq!(c1.debug_sizes(), LocalSizes::default());
}

#[tokio::test]
async fn a_group_whose_key_vanished_but_is_still_indexed_keeps_its_evidence() {
    let store = MemoryStore::new(34);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    let group = named(1);
    use_group(&c, &group).await;
    assert!(store.delete_metadata_key(&group));
    let refused = c.heartbeat(for_group(join("c"), &group)).await.expect_err("missing");
    assert_eq!(refused.code, ErrorCode::MetadataMissing);
    c.tick_all().await;
    let sizes = c.debug_sizes();
    // The longest lease seen (in the view) must govern the correction round of a recreate.
    assert_eq!((sizes.view, sizes.marks), (1, 1), "{sizes:?}");
    assert_eq!(sizes.cache, 0, "a decoded copy of a missing key is never kept");
}

#[tokio::test]
async fn a_found_absent_group_keeps_only_its_missing_metadata_counter() {
    let store = MemoryStore::new(35);
    let (c1, c2) = (watcher(&store, "c1"), coordinator(&store, "c2", PlantedBugs::NONE));
    let group = named(1);
    use_group(&c1, &group).await;
    let member = c1.heartbeat(for_group(join("c"), &group)).await.expect("join");
    delete(&c2, &store, &group).await;
    // A client that knew the group: METADATA_MISSING, counted for the operator.
    let refused = c1.heartbeat(for_group(next(&member), &group)).await.expect_err("deleted");
    assert_eq!(refused.code, ErrorCode::MetadataMissing);
    tick_after_refresh(&c1).await;
    let sizes = c1.debug_sizes();
    assert_eq!(sizes.total(), 1, "{sizes:?}");
    assert_eq!(c1.metrics().total("rsc_metadata_missing_total"), 1.0);
}

#[tokio::test]
async fn evidence_bookkeeping_leaves_with_the_group() {
    let store = MemoryStore::new(36);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    c.start().await.expect("probe");
    use_group(&c, &named(1)).await;
    use_group(&c, &named(2)).await;
    store.failover();
    // The first tick's identity read finds its connection reset; the next one sees the change.
    c.tick_all().await;
    c.tick_all().await;
    assert_eq!(c.debug_sizes().evidence_recorded, 2, "each group recorded the identity change");
    for i in [1, 2] {
        delete(&c, &store, &named(i)).await;
    }
    assert_eq!(c.debug_sizes(), LocalSizes::default());
}

#[tokio::test]
async fn concurrent_sections_share_a_monitor_and_leave_none_behind() {
    let store = MemoryStore::new(37);
    store.set_latency_ms(2);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    let group = named(1);
    let create = AdminRequest::CreateGroup { group: group.clone(), shard_count: 8, config: fast_config() };
    c.admin(create).await.expect("create");
    let joins = (0..8).map(|i| {
        let c = c.clone();
        let group = group.clone();
        tokio::spawn(async move { c.heartbeat(for_group(join(&format!("m{i}")), &group)).await })
    });
    for joined in joins.collect::<Vec<_>>() {
        joined.await.expect("task").expect("join");
    }
    assert_eq!(store.liveness(&group).await.expect("liveness").len(), 8, "every join was recorded");
    assert_eq!(c.debug_sizes().monitors, 0);
}

#[tokio::test]
async fn a_series_exported_after_the_group_was_forgotten_goes_at_the_next_index_read() {
    let store = MemoryStore::new(38);
    let (c1, c2) = (watcher(&store, "c1"), coordinator(&store, "c2", PlantedBugs::NONE));
    let group = named(1);
    use_group(&c1, &group).await;
    delete(&c2, &store, &group).await;
    tick_after_refresh(&c1).await;
    assert_eq!(c1.debug_sizes(), LocalSizes::default());
    // A tick that read the group just before the delete exports its gauges after it was forgotten.
    c1.metrics().set("rsc_group_revoking_shards", "h", vec![("group", group.to_string())], 0.0);
    assert_eq!(c1.debug_sizes().group_series, 1);
    tick_after_refresh(&c1).await;
    assert_eq!(c1.debug_sizes(), LocalSizes::default());
}

#[tokio::test]
async fn a_tick_counts_a_missing_key_only_when_the_next_tick_still_finds_it_missing() {
    let store = MemoryStore::new(39);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    let group = named(1);
    use_group(&c, &group).await;
    // An admin delete removes the key, then the index entry: a tick in between sees what a lost
    // key looks like, once. A lost key is still missing at the next tick.
    assert!(store.delete_metadata_key(&group));
    c.tick_all().await;
    assert_eq!(c.metrics().total("rsc_metadata_missing_total"), 0.0);
    assert_eq!(c.debug_sizes().missing_at_tick, 1);
    c.tick_all().await;
    c.tick_all().await;
    assert_eq!(c.metrics().total("rsc_metadata_missing_total"), 2.0);
    // Recreated: found again, no longer pending.
    let create = AdminRequest::CreateGroup { group: group.clone(), shard_count: 4, config: fast_config() };
    c.admin(create).await.expect("recreate");
    c.tick_all().await;
    assert_eq!(c.debug_sizes().missing_at_tick, 0);
}

#[tokio::test]
async fn groups_only_a_client_claims_existed_share_one_missing_metadata_series() {
    let store = MemoryStore::new(40);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    // A black-box review named 4,000 made-up groups with `memberEpoch > 0`: each answer is
    // METADATA_MISSING (the coordinator cannot tell a lost group from one that never was), but
    // each also added a `group` series to /metrics.
    for i in 0..50 {
        let mut request = for_group(join("c"), &named(100 + i));
        request.member_epoch = 3;
        let refused = c.heartbeat(request).await.expect_err("no such group");
        assert_eq!(refused.code, ErrorCode::MetadataMissing);
    }
    assert_eq!(c.metrics().total("rsc_metadata_missing_total"), 50.0, "every one is still counted");
    assert_eq!(c.debug_sizes().group_series, 1, "under one shared label");
    // A group this process served keeps its own label.
    let group = named(1);
    use_group(&c, &group).await;
    let member = c.heartbeat(for_group(join("m"), &group)).await.expect("join");
    assert!(store.delete_metadata_key(&group));
    let refused = c.heartbeat(for_group(next(&member), &group)).await.expect_err("lost");
    assert_eq!(refused.code, ErrorCode::MetadataMissing);
    let missing_series = c.metrics().render().lines().filter(|l| l.starts_with("rsc_metadata_missing_total{")).count();
    assert_eq!(missing_series, 2, "{}", c.metrics().render());
}

/// Heartbeats of member ids nobody joined are answered UNKNOWN_MEMBER, but each touched a liveness
/// field first, which stayed for good (hostile review): a client with a token grew the group's
/// liveness hash without bound, and every tick reads it whole. Past `ORPHAN_LIVENESS_MAX` such
/// fields, the next tick removes them; the members' own fields stay.
#[tokio::test]
async fn made_up_member_ids_leave_no_liveness_fields_behind() {
    let store = MemoryStore::new(41);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    super::create(&c, 2).await;
    let a = c.heartbeat(join("a")).await.expect("a joins");
    let mut forged = next(&a);
    forged.member_session = None;
    for i in 0..3 * rsc::core::model::ORPHAN_LIVENESS_MAX {
        forged.member_id = format!("nobody-{i}");
        let refused = c.heartbeat(forged.clone()).await.expect_err("no such member");
        assert_eq!(refused.code, ErrorCode::UnknownMember);
    }
    let fields = store.liveness(&super::group()).await.expect("liveness").len();
    assert!(fields > rsc::core::model::ORPHAN_LIVENESS_MAX, "the touches left {fields} fields");
    c.tick_all().await;
    let left: Vec<String> = store.liveness(&super::group()).await.expect("liveness").into_keys().collect();
    assert_eq!(left, vec!["a".to_string()], "only the member's own field is left");
    c.heartbeat(next(&a)).await.expect("a is still a member");
}

/// A group whose create's index write was lost (a failed SADD after the create is only logged;
/// here it is undone) is recorded but not indexed, and the ticker walks only the index: the group
/// was never ticked, so a crashed member never expired and its shards never moved, until an
/// operator ran `rebuild-index`. The first index read after a member's heartbeat through this
/// instance found the record adds it back, and from then on the group is ticked.
#[tokio::test]
async fn a_recorded_group_missing_from_the_index_is_added_back_after_a_member_heartbeats() {
    let store = MemoryStore::new(1);
    // A short mutex TTL: undoing the index writes also undoes the release of the create's mutex.
    let options = CoordinatorOptions {
        instance_id: "c1".into(),
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        ticker_refresh_ms: REFRESH_MS,
        mutex_ttl_ms: 50,
        ..CoordinatorOptions::default()
    };
    let c = Coordinator::new(store.connect(), options);
    let group = named(0);
    let create = AdminRequest::CreateGroup { group: group.clone(), shard_count: 4, config: fast_config() };
    c.admin(create).await.expect("create");
    let mut undone = 0;
    while store.index_members().await.expect("index").contains(&group) {
        assert!(undone < 4, "the index entry was not undone");
        undone += store.rollback(1, RollbackMode::Silent);
    }
    assert!(store.load(&group).await.expect("load").is_some(), "the group is still recorded");
    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    tick_after_refresh(&c).await;
    let joined = c.heartbeat(for_group(join("a"), &group)).await.expect("join");
    c.heartbeat(for_group(next(&joined), &group)).await.expect("heartbeat");
    tick_after_refresh(&c).await;
    assert!(store.index_members().await.expect("index").contains(&group), "added back to the index");
    // Ticked from now on: the member stops heartbeating and expires.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        tick_after_refresh(&c).await;
        let members = store.load(&group).await.expect("load").map(|r| {
            serde_json::from_str::<GroupMetadata>(&r.aggregate).map(|g| g.members.len()).unwrap_or(usize::MAX)
        });
        if members == Some(0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the silent member never expired: {members:?}");
    }
}
