//! Concurrent requests of one coordinator process: a read that Redis answered *before* another
//! request's write, delivered *after* it, is concurrency and never evidence of lost writes.
//!
//! [`HeldStore::hold_next_touch`] lets the store answer a touch and holds the answer until the test
//! releases it: exactly the order a busy coordinator sees when hundreds of heartbeats overlap a
//! join.

use super::held::HeldStore;
use super::*;

/// A steady heartbeat whose read Redis answered at revision r is delivered after a concurrent
/// join wrote r+1. Returns whether the group ended up in a correction round.
async fn steady_read_overtaken_by_a_join(planted: PlantedBugs) -> bool {
    let store = MemoryStore::new(21);
    let options = CoordinatorOptions {
        instance_id: "c1".into(),
        planted,
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        ..CoordinatorOptions::default()
    };
    let held = HeldStore::new(store.connect());
    let c = Coordinator::new(held, options);
    c.start().await.expect("probe");
    let create = AdminRequest::CreateGroup { group: group(), shard_count: 4, config: fast_config() };
    c.admin(create).await.expect("create");
    let a = c.heartbeat(join("a")).await.expect("join a");
    let before = store.peek_record(&group()).expect("record").revision;

    let release = c.store().hold_next_touch();
    let slow = tokio::spawn({
        let c = c.clone();
        let steady = next(&a);
        async move { c.heartbeat(steady).await }
    });
    // The held touch has executed at the store once the spawned task parks on the hold.
    while !c.store().touch_is_held() {
        tokio::task::yield_now().await;
    }
    c.heartbeat(join("b")).await.expect("join b writes while a's answer is in flight");
    assert!(store.peek_record(&group()).expect("record").revision > before, "the join wrote");
    release.send(()).expect("the slow heartbeat is waiting");
    slow.await.expect("task").expect("the slow heartbeat is answered");

    recorded(&store).expect("record").correction.is_some()
}

#[tokio::test]
async fn a_read_overtaken_by_a_concurrent_write_is_not_loss_evidence() {
    assert!(!steady_read_overtaken_by_a_join(PlantedBugs::NONE).await, "concurrency started a correction round");
}

/// The same interleaving under the planted bug that compares with the process-wide maximum (the
/// behaviour before the fix) starts a correction round: the test above can fail.
#[tokio::test]
async fn the_process_wide_revision_mark_mistakes_the_same_race_for_loss() {
    assert!(steady_read_overtaken_by_a_join(PlantedBugs::only(PlantedBug::ProcessWideRevisionMark)).await);
}

/// The true positive stays: a read issued after a higher revision was observed that returns a
/// lower one (the store really went back) starts a round.
#[tokio::test]
async fn a_later_read_of_a_rolled_back_revision_is_still_evidence() {
    let store = MemoryStore::new(22);
    let c = short_mutex(&store, "c1");
    create(&c, 2).await;
    let a = c.heartbeat(join("a")).await.expect("join a");
    let kept = store.peek_record(&group()).expect("record").revision;
    c.heartbeat(join("b")).await.expect("join b");
    while store.peek_record(&group()).expect("record").revision > kept {
        store.rollback(1, RollbackMode::Silent);
    }
    // The rollback may restore a mutex whose release was lost: retry past its 50 ms TTL.
    for _ in 0..20 {
        let _ = c.heartbeat(next(&a)).await;
        if recorded(&store).expect("record").correction.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    panic!("a real regression was not recorded as evidence");
}

/// A request dropped inside its critical section (the client timed out, hyper dropped the handler)
/// must not leave the group's Redis mutex held until its TTL: every writer would stall for it.
#[tokio::test]
async fn a_critical_section_dropped_mid_way_releases_the_group_mutex() {
    let store = MemoryStore::new(23);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    create(&c, 4).await;
    c.heartbeat(join("a")).await.expect("join a");
    // Each store call takes 40 ms: the join of b holds the mutex (acquired by 40 ms) and is
    // reading the group when the caller gives up at 70 ms.
    store.set_latency_ms(40);
    let dropped = tokio::time::timeout(Duration::from_millis(70), c.heartbeat(join("b"))).await;
    assert!(dropped.is_err(), "the join was cut off inside its critical section");
    store.set_latency_ms(0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The default mutex TTL is 2 s and a busy mutex is retried for about 0.3 s: a leaked mutex
    // answers STORE_UNAVAILABLE here.
    let joined = c.heartbeat(join("c")).await;
    assert!(joined.is_ok(), "the next writer found the mutex still held: {joined:?}");
}
