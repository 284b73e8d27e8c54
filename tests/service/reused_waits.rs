//! A silent rollback (a failover that lost writes and kept the server identity) rewinds the
//! record's wait counter, and the history that replaces the lost one allocates the same wait ids
//! again. A coordinator that observed a lost wait, even through one heartbeat, and did not read the
//! records in between (the new history goes past its revision mark) must not credit the time it
//! watched the lost wait to the new wait of the same id: each wait is timed by its id and the tag
//! its allocating decision drew (`GroupMetadata::wait_tags`). When the new history stops exactly
//! at the marked revision, the `writeId` tells the two apart: loss evidence. Fencing is off, so the
//! lease waits are all that keeps two consumers apart.

use rsc::core::model::LossEvidence;

use super::deleting::retry_busy;
use super::*;

fn unfenced() -> AdminRequest {
    let config = GroupConfig { fencing: false, ..fast_config() };
    AdminRequest::CreateGroup { group: group(), shard_count: 2, config }
}

/// A write that records no wait and moves the revision on: a config change of an unwatched knob.
async fn bump(c: &Coordinator<MemoryStore>, store: &MemoryStore) {
    let expected_revision = store.peek_record(&group()).expect("record").revision;
    let config = GroupConfig { fencing: false, routing_cache_ttl_ms: 1_000 + expected_revision, ..fast_config() };
    let change = AdminRequest::ChangeConfig { group: group(), expected_revision, config };
    retry_busy(|| c.admin(change.clone())).await.expect("a config change");
}

/// A heartbeat of a member id nobody joined: refused, but it reads the record through `c`.
fn made_up() -> HeartbeatRequest {
    HeartbeatRequest { member_epoch: 7, metadata_version: 1, ..join("nobody") }
}

/// Undoes writes until the record is back at `revision`; nobody is told.
fn roll_back_to(store: &MemoryStore, revision: u64) {
    while store.peek_record(&group()).expect("record").revision > revision {
        store.rollback(1, RollbackMode::Silent);
    }
}

fn wait_ids(store: &MemoryStore) -> Vec<u64> {
    let metadata = recorded(store).expect("record");
    let mut waits: Vec<u64> = metadata.recorded_waits().collect();
    waits.dedup();
    waits
}

/// x joins and leaves through cb (wait W: x may read until its lease ends). `ca` reads that record
/// once, through a heartbeat of a made-up member. The store silently loses everything after the
/// create. Through cc, x2 joins, holds both shards for a second and leaves: wait W again, one
/// revision past the one `ca` last read. y's join through `ca` must wait out x2's lease; `ca` had
/// credited its second of watching the lost W to it and granted both shards at once.
#[tokio::test]
async fn a_wait_id_reissued_after_a_silent_rollback_is_waited_out_again() {
    let store = MemoryStore::new(91);
    let (ca, cb, cc) = (short_mutex(&store, "ca"), short_mutex(&store, "cb"), short_mutex(&store, "cc"));
    for c in [&ca, &cb, &cc] {
        c.start().await.expect("probe");
    }
    cb.admin(unfenced()).await.expect("create");
    let x = cb.heartbeat(join("x")).await.expect("x joins");
    assert_eq!(x.assigned, vec![0, 1]);
    cb.heartbeat(HeartbeatRequest { leave: true, ..next(&x) }).await.expect("x leaves");
    let lost = wait_ids(&store);
    assert_eq!(lost.len(), 1, "x's leave is waited out: {:?}", recorded(&store));
    let looked = ca.heartbeat(made_up()).await.expect_err("nobody is no member");
    assert_eq!(looked.code, ErrorCode::UnknownMember, "{looked:?}");
    let seen_revision = store.peek_record(&group()).expect("record").revision;

    roll_back_to(&store, 1);
    let mut x2 = retry_busy(|| cc.heartbeat(join("x2"))).await.expect("x2 joins through cc");
    assert_eq!(x2.assigned, vec![0, 1]);
    bump(&cc, &store).await;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        x2 = cc.heartbeat(next(&x2)).await.expect("x2 steady");
        assert_eq!(x2.assigned, vec![0, 1]);
    }
    cc.heartbeat(HeartbeatRequest { leave: true, ..next(&x2) }).await.expect("x2 leaves");
    assert_eq!(wait_ids(&store), lost, "the rewound counter reissued the lost wait's id");
    let revision = store.peek_record(&group()).expect("record").revision;
    assert_eq!(revision, seen_revision + 1, "past ca's mark: no regression to see");

    let started = tokio::time::Instant::now();
    let mut y = ca.heartbeat(join("y")).await.expect("y joins through ca");
    assert!(y.assigned.is_empty(), "y was granted the shards x2 may read until its lease ends: {y:?}");
    assert!(recorded(&store).expect("record").correction.is_none(), "no loss evidence was at hand");
    // Not stuck either: y takes both once ca has watched x2's lease pass.
    while y.assigned != [0, 1] {
        assert!(started.elapsed() < Duration::from_secs(3), "y never got the shards: {y:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        y = ca.heartbeat(next(&y)).await.expect("y steady");
    }
    assert!(started.elapsed() >= Duration::from_millis(300), "one lease passed first");
}

/// x joins and leaves (wait W); `ca` reads that record once. W is waited out and L takes both
/// shards. The store silently loses everything after the create; cb, which had read L's grant,
/// sees the revision go back and records a correction round, whose wait is W's id again. z joins
/// through cb, and one more write takes the record past the revision `ca` last read. z's heartbeat
/// through `ca` must not be answered OK with L's shards until a lease into the round (L's grant was
/// lost, and L may read until its lease ends); `ca` had credited the lost W to the round and
/// answered OK at once.
#[tokio::test]
async fn a_correction_round_that_reissues_a_lost_wait_id_waits_a_full_lease() {
    let store = MemoryStore::new(93);
    let (ca, cb) = (short_mutex(&store, "ca"), short_mutex(&store, "cb"));
    for c in [&ca, &cb] {
        c.start().await.expect("probe");
    }
    cb.admin(unfenced()).await.expect("create");
    let x = cb.heartbeat(join("x")).await.expect("x joins");
    cb.heartbeat(HeartbeatRequest { leave: true, ..next(&x) }).await.expect("x leaves");
    let lost = wait_ids(&store);
    assert_eq!(lost.len(), 1, "x's leave is waited out: {:?}", recorded(&store));
    ca.heartbeat(made_up()).await.expect_err("nobody is no member");
    let seen_revision = store.peek_record(&group()).expect("record").revision;

    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut l = cb.heartbeat(join("l")).await.expect("l joins");
    while l.assigned != [0, 1] {
        tokio::time::sleep(Duration::from_millis(20)).await;
        l = cb.heartbeat(next(&l)).await.expect("l steady");
    }

    roll_back_to(&store, 1);
    cb.tick_all().await;
    let round = recorded(&store).expect("record").correction.expect("cb saw the revision go back");
    assert_eq!(vec![round.wait], lost, "the round reissued the lost wait's id");
    let z = retry_busy(|| cb.heartbeat(join("z"))).await.expect("z joins through cb");
    bump(&cb, &store).await;
    let revision = store.peek_record(&group()).expect("record").revision;
    assert_eq!(revision, seen_revision + 1, "past ca's mark: no regression to see");

    let z = ca.heartbeat(next(&z)).await.expect("z through ca");
    assert!(
        z.status != HeartbeatStatus::Ok || !z.assigned.iter().any(|s| l.assigned.contains(s)),
        "z was told to read L's shards inside L's lease: {z:?}"
    );
}

/// As in the first test, but the new history stops exactly at the revision `ca` last read: the
/// number is the same, the write behind it is not. `ca` judges the record by its `writeId` too and
/// records a correction round before answering y (the tags alone would make y wait out x2's lease;
/// the round also covers grants of the lost history nobody timed).
#[tokio::test]
async fn the_marked_revision_written_again_by_another_history_is_loss_evidence() {
    let store = MemoryStore::new(95);
    let (ca, cb, cc) = (short_mutex(&store, "ca"), short_mutex(&store, "cb"), short_mutex(&store, "cc"));
    for c in [&ca, &cb, &cc] {
        c.start().await.expect("probe");
    }
    cb.admin(unfenced()).await.expect("create");
    let x = cb.heartbeat(join("x")).await.expect("x joins");
    cb.heartbeat(HeartbeatRequest { leave: true, ..next(&x) }).await.expect("x leaves");
    ca.heartbeat(made_up()).await.expect_err("nobody is no member");
    let seen_revision = store.peek_record(&group()).expect("record").revision;

    roll_back_to(&store, 1);
    let x2 = retry_busy(|| cc.heartbeat(join("x2"))).await.expect("x2 joins through cc");
    cc.heartbeat(HeartbeatRequest { leave: true, ..next(&x2) }).await.expect("x2 leaves");
    assert_eq!(store.peek_record(&group()).expect("record").revision, seen_revision, "ca's mark is reached again");
    assert!(recorded(&store).expect("record").correction.is_none());

    let y = ca.heartbeat(join("y")).await.expect("y joins through ca");
    assert!(y.assigned.is_empty(), "{y:?}");
    let round = recorded(&store).expect("record").correction.expect("ca recorded a correction round");
    assert_eq!(round.reason, LossEvidence::RevisionRegressed { seen: seen_revision, stored: seen_revision });
}
