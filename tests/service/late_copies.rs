//! Requests delivered late and twice (a retrying proxy, a duplicated request): a copy that arrives
//! after what it asked for is over must not undo what happened since.

use super::*;

/// x leaves; a copy of x's join, sent before x ever heard back, arrives after the leave. It is
/// refused (`UNKNOWN_MEMBER`) and records nothing, so y takes both shards once x's leave is
/// waited out (one assignment lease). Recorded, the copy was a member nobody runs: one shard
/// waited for it until its member TTL (5 s here).
#[tokio::test]
async fn a_late_copy_of_a_join_after_the_leave_does_not_stall_the_rebalance() {
    let store = MemoryStore::new(87);
    let c = coordinator(&store, "c", PlantedBugs::NONE);
    c.start().await.expect("probe");
    let config = GroupConfig { member_lease_ttl_ms: 5_000, ..fast_config() };
    c.admin(AdminRequest::CreateGroup { group: group(), shard_count: 2, config }).await.expect("create");
    let copy = join("x");
    let x = c.heartbeat(copy.clone()).await.expect("x joins");
    assert_eq!(x.assigned, vec![0, 1]);
    let x = c.heartbeat(next(&x)).await.expect("x steady");
    c.heartbeat(HeartbeatRequest { leave: true, ..next(&x) }).await.expect("x leaves");

    let late = c.heartbeat(copy).await.expect_err("the late copy is refused");
    assert_eq!(late.code, ErrorCode::UnknownMember, "{late:?}");
    let members: Vec<String> = recorded(&store).expect("record").members.into_keys().collect();
    assert!(members.is_empty(), "no member nobody runs: {members:?}");

    let started = tokio::time::Instant::now();
    let mut y = c.heartbeat(join("y")).await.expect("y joins");
    while y.assigned != [0, 1] {
        assert!(started.elapsed() < Duration::from_secs(2), "y waits for a member nobody runs: {y:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.tick_all().await;
        y = c.heartbeat(next(&y)).await.expect("y steady");
    }
}
