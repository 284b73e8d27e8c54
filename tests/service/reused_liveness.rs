//! Hostile review: a silent rollback also rewinds the liveness counters (the INCRs of heartbeat
//! touches are ordinary writes). A live member's later heartbeats reissue the very counter values
//! an instance already saw. An instance that read value `v` once and reads `v` again a member TTL
//! later (its window is keyed by incarnation epoch and value only) believes the counter never moved,
//! expires the member and frees its shards at once, while the member, heartbeating every interval
//! through another instance, holds them under a lease granted in the surviving history. Fencing is
//! off. No record write is lost, so no instance sees any regression. (Found by the stop 37 hostile
//! review.) Every touch now adds a random step (`store::LIVENESS_STEP_MAX`), so the climb back
//! does not land on the value seen before.

use super::*;

fn unfenced() -> AdminRequest {
    let config = GroupConfig { fencing: false, ..fast_config() };
    AdminRequest::CreateGroup { group: group(), shard_count: 2, config }
}

/// Short mutex, no tick sharing (this instance ticks every group).
fn ticker(store: &MemoryStore, id: &str) -> Coordinator<MemoryStore> {
    let options = CoordinatorOptions {
        instance_id: id.into(),
        mutex_ttl_ms: 50,
        ticker_silence_ms: 0,
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        ..CoordinatorOptions::default()
    };
    Coordinator::new(store.connect(), options)
}

async fn counter(store: &MemoryStore, member: &str) -> u64 {
    store.liveness(&group()).await.expect("liveness").get(member).copied().unwrap_or(0)
}

#[tokio::test]
async fn a_liveness_value_reissued_after_a_silent_rollback_does_not_expire_a_live_member() {
    let store = MemoryStore::new(97);
    let (ca, cb) = (ticker(&store, "ca"), ticker(&store, "cb"));
    for c in [&ca, &cb] {
        c.start().await.expect("probe");
    }
    cb.admin(unfenced()).await.expect("create");
    let mut x = cb.heartbeat(join("x")).await.expect("x joins");
    while x.assigned != [0, 1] {
        tokio::time::sleep(Duration::from_millis(20)).await;
        x = cb.heartbeat(next(&x)).await.expect("x steady");
    }
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        x = cb.heartbeat(next(&x)).await.expect("x steady");
        assert_eq!(x.assigned, vec![0, 1]);
    }
    // ca ticks once: it reads x's counter at `seen`.
    ca.tick_all().await;
    let t0 = tokio::time::Instant::now();
    let seen = counter(&store, "x").await;
    let revision = store.peek_record(&group()).expect("record").revision;
    assert!(recorded(&store).expect("record").members.contains_key("x"));

    // The store silently loses x's last 8 touches, and nothing else of the record.
    let mut lost = 0;
    while lost < 8 {
        let before = counter(&store, "x").await;
        store.rollback(1, RollbackMode::Silent);
        lost += usize::from(counter(&store, "x").await < before);
    }
    let rolled_back = tokio::time::Instant::now();
    assert_eq!(store.peek_record(&group()).expect("record").revision, revision, "no record write was lost");

    // x stays alive: it heartbeats every 60 ms through cb and is answered OK with both shards.
    let mut last_ok = tokio::time::Instant::now();
    while counter(&store, "x").await < seen {
        tokio::time::sleep(Duration::from_millis(60)).await;
        last_ok = tokio::time::Instant::now();
        x = cb.heartbeat(next(&x)).await.expect("x steady");
        assert_eq!((x.status, x.assigned.clone()), (HeartbeatStatus::Ok, vec![0, 1]), "x is live: {x:?}");
    }
    // With steps of 1 the counter now reads `seen` again; with random steps it went past it
    // (which may take fewer touches: then wait, quietly, for a TTL on ca's clock).
    while t0.elapsed() < Duration::from_millis(420) || rolled_back.elapsed() <= Duration::from_millis(300) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // ca ticks again: with steps of 1 the counter reads `seen`, as it did a TTL ago.
    ca.tick_all().await;
    let y = ca.heartbeat(join("y")).await.expect("y joins through ca");
    let x_lease_left = last_ok.elapsed() < Duration::from_millis(300);
    assert!(x_lease_left, "the test proves nothing once x's lease ended");
    assert!(
        !(x_lease_left && y.assigned.iter().any(|s| x.assigned.contains(s))),
        "y was granted {:?} {} ms after x (heartbeating every 60 ms) was last answered OK with {:?} \
         (lease 300 ms), {} ms after the rollback; members now: {:?}",
        y.assigned,
        last_ok.elapsed().as_millis(),
        x.assigned,
        rolled_back.elapsed().as_millis(),
        recorded(&store).map(|g| g.members.keys().cloned().collect::<Vec<_>>())
    );
}
