//! A coordinator that stalls between its load and its write (a GC pause, a paused VM, a slow
//! network) while the store loses the revision it loaded and another coordinator writes that
//! revision again with other content (ABA). Its write was computed from lost history and must be
//! refused: the write condition is the whole stamp `(revision, writeId)`, never the revision alone.
//!
//! [`HeldStore::stall_next_mutation`] holds the next write or delete *before* it reaches the store
//! until the test lets it go.

use rsc::store::StoredRecord;

use super::deleting::retry_busy;
use super::held::HeldStore;
use super::*;

/// A coordinator on a [`HeldStore`], with the 50 ms mutex TTL of [`short_mutex`]: its stall
/// outlasts its mutex, which is exactly when only the write condition keeps its write out.
pub(super) fn stalling(store: &MemoryStore, id: &str) -> Coordinator<HeldStore> {
    let options = CoordinatorOptions {
        instance_id: id.into(),
        mutex_ttl_ms: 50,
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        ..CoordinatorOptions::default()
    };
    Coordinator::new(HeldStore::new(store.connect()), options)
}

async fn wait_until_stalled(c: &Coordinator<HeldStore>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !c.store().is_stalled() {
        assert!(tokio::time::Instant::now() < deadline, "the armed mutation was never sent");
        tokio::task::yield_now().await;
    }
}

/// Revision 2 (the group grown to 4 shards) is loaded by the stalled coordinator, lost in a silent
/// rollback, and written again by a third coordinator with other content (grown to 8 shards).
/// Returns that rewritten record's stamp after checking it is an ABA: same revision, other write.
async fn lose_revision_2_and_rewrite_it(store: &MemoryStore, lost: &StoredRecord) -> StoredRecord {
    while store.peek_record(&group()).expect("record").revision >= lost.revision {
        store.rollback(1, RollbackMode::Silent);
    }
    let c3 = short_mutex(store, "c3");
    let base = store.peek_record(&group()).expect("record").revision;
    let add = AdminRequest::AddShards { group: group(), expected_revision: base, new_shard_count: 8 };
    c3.admin(add).await.expect("c3 adds shards on the rolled-back record");
    let rewritten = store.peek_record(&group()).expect("record");
    assert_eq!(rewritten.revision, lost.revision, "the same revision again");
    assert_ne!(rewritten.write_id, lost.write_id, "another write");
    rewritten
}

/// The group at revision 2 with 4 shards, written by c1.
async fn grown_to_4_shards(store: &MemoryStore) -> StoredRecord {
    let c1 = short_mutex(store, "c1");
    create(&c1, 2).await;
    let add = AdminRequest::AddShards { group: group(), expected_revision: 1, new_shard_count: 4 };
    c1.admin(add).await.expect("c1 adds shards");
    let loaded = store.peek_record(&group()).expect("record");
    assert_eq!(loaded.revision, 2);
    loaded
}

/// A join decided on the lost revision 2 (4 shards) and written after revision 2 was rewritten
/// (8 shards) would record the join on the lost record, undoing the rewrite's reshard (shards are
/// only ever added). The write is refused, and the retry joins the member to the stored record.
#[tokio::test]
async fn a_stalled_write_computed_from_a_lost_revision_is_refused_after_that_revision_is_rewritten() {
    let store = MemoryStore::new(31);
    let lost = grown_to_4_shards(&store).await;

    let c2 = stalling(&store, "c2");
    let resume = c2.store().stall_next_mutation();
    let join_a = tokio::spawn({
        let c2 = c2.clone();
        async move { c2.heartbeat(join("a")).await }
    });
    wait_until_stalled(&c2).await; // c2 loaded revision 2 (4 shards) and decided; its write waits
    let rewritten = lose_revision_2_and_rewrite_it(&store, &lost).await;

    resume.send(()).expect("the stalled join is waiting");
    let joined = join_a.await.expect("task").expect("the join is answered from a fresh decision");
    let g = recorded(&store).expect("record");
    assert_eq!(g.shard_count, 8, "the rewrite's reshard survives: {g:#?}");
    assert!(g.members.contains_key("a"), "the join was recorded on the stored record");
    let stored = store.peek_record(&group()).expect("record");
    // Two more writes: the retry's load found revision 2 under another write than the one c2 had
    // loaded (the store lost a write c2 saw: evidence), so the section recorded the correction
    // round first, then the join on the record the round wrote.
    assert_eq!(stored.revision, rewritten.revision + 2, "the round, then the retried join");
    assert!(g.correction.is_some(), "the lost revision 2 is evidence: {g:#?}");
    assert_eq!((joined.shard_count, joined.store_revision), (8, stored.revision));
    assert!(c2.metrics().total("rsc_metadata_revision_conflicts_total") >= 1.0, "the first write lost the CAS");
}

/// An operator's delete of revision 2, decided on the lost record and sent after revision 2 was
/// rewritten, must not remove the rewritten record (nobody decided to delete that one).
#[tokio::test]
async fn a_stalled_delete_of_a_lost_revision_leaves_the_rewritten_record() {
    let store = MemoryStore::new(32);
    let lost = grown_to_4_shards(&store).await;

    let c2 = stalling(&store, "c2");
    let resume = c2.store().stall_next_mutation();
    let delete = tokio::spawn({
        let c2 = c2.clone();
        async move { c2.admin(AdminRequest::DeleteGroup { group: group(), expected_revision: 2 }).await }
    });
    wait_until_stalled(&c2).await;
    let rewritten = lose_revision_2_and_rewrite_it(&store, &lost).await;

    resume.send(()).expect("the stalled delete is waiting");
    let refused = delete.await.expect("task").expect_err("the delete must be refused");
    assert_eq!(refused.code, ErrorCode::RevisionConflict, "{refused:?}");
    assert_eq!(store.peek_record(&group()), Some(rewritten), "the rewritten record is untouched");
}

/// Sections of one group run one at a time, and every request waiting for the group's section
/// holds one of the process's request slots. Before, nothing bounded how many waited: a burst in
/// one group (a 1,000-member restart, or a client that never times out) took every slot, and
/// other groups' heartbeats waited until their leases ended. Now at most `group_sections_max` of
/// a group's requests hold or wait for its section; the next is refused `STORE_UNAVAILABLE` at
/// once (clients retry), another group is not, and the ones admitted all complete.
#[tokio::test]
async fn a_group_whose_section_is_held_refuses_requests_beyond_its_share_at_once() {
    let store = MemoryStore::new(33);
    let options = CoordinatorOptions {
        instance_id: "c1".into(),
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        group_sections_max: 3,
        ..CoordinatorOptions::default()
    };
    let c = Coordinator::new(HeldStore::new(store.connect()), options);
    c.start().await.expect("probe");
    let other = GroupId::new("orders", "other");
    for g in [group(), other.clone()] {
        c.admin(AdminRequest::CreateGroup { group: g, shard_count: 2, config: fast_config() }).await.expect("create");
    }
    // a's join holds the group's section, its write stalled; b and c wait for the section.
    let resume = c.store().stall_next_mutation();
    let spawn_join = |member: &'static str| {
        let c = c.clone();
        tokio::spawn(async move { c.heartbeat(join(member)).await })
    };
    let a = spawn_join("a");
    wait_until_stalled(&c).await;
    let (b, waiting_c) = (spawn_join("b"), spawn_join("c"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // d is one more than the group's share: refused at once, not queued.
    let refused = tokio::time::timeout(Duration::from_millis(500), c.heartbeat(join("d")))
        .await
        .expect("refused at once, not queued behind the held section");
    let error = refused.expect_err("beyond the group's share");
    assert_eq!(error.code, ErrorCode::StoreUnavailable, "{error:?}");
    assert!(error.message.contains("busy"), "{error:?}");
    assert_eq!(c.metrics().total("rsc_group_busy_refusals_total"), 1.0);
    // Another group's section is not refused.
    let elsewhere = tokio::time::timeout(
        Duration::from_millis(500),
        c.heartbeat(HeartbeatRequest { group: other.clone(), ..join("x") }),
    )
    .await
    .expect("another group is not held up");
    assert_eq!(elsewhere.expect("x joins the other group").status, HeartbeatStatus::Ok);
    resume.send(()).expect("a's write is waiting");
    for (name, task) in [("a", a), ("b", b), ("c", waiting_c)] {
        task.await.expect("task").unwrap_or_else(|e| panic!("{name} was admitted and is answered: {e:?}"));
    }
    let joined = retry_busy(|| c.heartbeat(join("d"))).await.expect("d joins once there is room");
    assert!(joined.member_epoch > 0);
}
