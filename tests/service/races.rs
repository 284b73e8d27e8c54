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

/// A join whose read Redis answered before a silent rollback, deciding after it: the section's own
/// load returns the rolled-back record, in which a's join is lost. Before, that load was decided on
/// unjudged (only the read before the section was), and b was answered `OK` for a's shards, with
/// no correction round, while a still read them under its lease. Now the section refuses to decide
/// (`STORE_UNAVAILABLE`) and the next request records the round first: b is granted nothing
/// before the round, and nothing `OK` within it.
#[tokio::test]
async fn a_join_deciding_on_a_load_a_rollback_took_back_is_refused_and_the_round_recorded_first() {
    let store = MemoryStore::new(24);
    let options = CoordinatorOptions {
        instance_id: "c1".into(),
        mutex_ttl_ms: 50,
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        ..CoordinatorOptions::default()
    };
    let c = Coordinator::new(HeldStore::new(store.connect()), options);
    c.start().await.expect("probe");
    let create = AdminRequest::CreateGroup { group: group(), shard_count: 2, config: fast_config() };
    c.admin(create).await.expect("create");
    let kept = store.peek_record(&group()).expect("record").revision;
    let a = c.heartbeat(join("a")).await.expect("join a");
    assert_eq!((a.status, a.assigned.clone()), (HeartbeatStatus::Ok, vec![0, 1]));

    // b's join: its touch reads the record with a's join, and its answer is held.
    let release = c.store().hold_next_touch();
    let joining = tokio::spawn({
        let c = c.clone();
        async move { c.heartbeat(join("b")).await }
    });
    while !c.store().touch_is_held() {
        tokio::task::yield_now().await;
    }
    // The store silently goes back to before a's join.
    while store.peek_record(&group()).expect("record").revision > kept {
        store.rollback(1, RollbackMode::Silent);
    }
    release.send(()).expect("b's join is waiting");
    let answer = joining.await.expect("task");
    match &answer {
        Err(error) => assert_eq!(error.code, ErrorCode::StoreUnavailable, "{error:?}"),
        Ok(r) => assert!(
            r.status != HeartbeatStatus::Ok || r.assigned.is_empty(),
            "b was granted a's shards on a load nobody judged: {r:?}"
        ),
    }
    if answer.is_ok() {
        assert!(recorded(&store).expect("record").correction.is_some(), "a grant without a round");
    }
    // b retries (the rollback may restore a mutex whose release was lost: past its 50 ms TTL):
    // the round is recorded before anything is decided, and no OK comes within it.
    for _ in 0..20 {
        match c.heartbeat(join("b")).await {
            Ok(r) => {
                assert!(recorded(&store).expect("record").correction.is_some(), "decided before the round: {r:?}");
                assert_ne!(r.status, HeartbeatStatus::Ok, "OK within the round: {r:?}");
                return;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(60)).await,
        }
    }
    panic!("b's join was never answered");
}
