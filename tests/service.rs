//! The coordinator workflow (`rsc::service::Coordinator`) over the in-memory store: fail-closed
//! paths, loss evidence, the shutdown gate, and two coordinators sharing one store. Real tokio,
//! short leases; no network.

#![cfg(not(madsim))]

#[path = "service/bounds.rs"]
mod bounds;
#[path = "service/deleting.rs"]
mod deleting;
#[path = "service/held.rs"]
mod held;
#[path = "service/keyless.rs"]
mod keyless;
#[path = "service/late_copies.rs"]
mod late_copies;
#[path = "service/pruning.rs"]
mod pruning;
#[path = "service/races.rs"]
mod races;
#[path = "service/reused_liveness.rs"]
mod reused_liveness;
#[path = "service/reused_waits.rs"]
mod reused_waits;
#[path = "service/sequences.rs"]
mod sequences;
#[path = "service/stalled.rs"]
mod stalled;

use std::time::Duration;

use rsc::core::model::{GroupConfig, GroupId, GroupMetadata, MemberState, ReshardReason, ShardOwner};
use rsc::core::proof::Fact;
use rsc::core::protocol::{
    AdminRequest, ErrorCode, HeartbeatRequest, HeartbeatResponse, HeartbeatStatus, MemberSession, RevokeReport,
    RoutingReport,
};
use rsc::core::{PlantedBug, PlantedBugs};
use rsc::service::{Coordinator, CoordinatorOptions};
use rsc::store::memory::{MemoryStore, OutageMode, RollbackMode};
use rsc::store::{MetadataStore, WriteRequest};

fn group() -> GroupId {
    GroupId::new("orders", "billing")
}

/// Leases short enough for real-time tests: lease 300 ms, member TTL 400 ms.
fn fast_config() -> GroupConfig {
    GroupConfig {
        member_lease_ttl_ms: 400,
        assignment_lease_ms: 300,
        heartbeat_interval_ms: 50,
        rebalance_timeout_ms: 2_000,
        routing_cache_ttl_ms: 1_000,
        routing_refresh_interval_ms: 200,
        ..GroupConfig::default()
    }
}

fn coordinator(store: &MemoryStore, id: &str, planted: PlantedBugs) -> Coordinator<MemoryStore> {
    let options = CoordinatorOptions {
        instance_id: id.into(),
        planted,
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        ..CoordinatorOptions::default()
    };
    Coordinator::new(store.connect(), options)
}

async fn create(c: &Coordinator<MemoryStore>, shards: u32) {
    let req = AdminRequest::CreateGroup { group: group(), shard_count: shards, config: fast_config() };
    c.admin(req).await.expect("create");
}

fn join(member: &str) -> HeartbeatRequest {
    HeartbeatRequest {
        metadata_version_proof: None,
        group: group(),
        member_id: member.into(),
        member_epoch: 0,
        metadata_version: 0,
        assignment_epoch: 0,
        owned: vec![],
        revoking: vec![],
        leave: false,
        member_session: Some(session_of(member)),
        fenced: Vec::new(),
    }
}

/// The session secret of the test's client process `member` (deterministic).
fn session_of(member: &str) -> MemberSession {
    let hex: String = member.bytes().map(|b| format!("{b:02x}")).collect();
    MemberSession(format!("{hex:0>32}").chars().take(64).collect())
}

/// The next heartbeat of a client that applied `r` (drains finish at once).
fn next(r: &HeartbeatResponse) -> HeartbeatRequest {
    HeartbeatRequest {
        metadata_version_proof: None,
        group: group(),
        member_id: r.member_id.clone(),
        member_epoch: r.member_epoch,
        metadata_version: r.metadata_version,
        assignment_epoch: r.assignment_epoch,
        owned: r.assigned.clone(),
        revoking: r.revoked_reports(),
        leave: false,
        member_session: Some(session_of(&r.member_id)),
        fenced: Vec::new(),
    }
}

/// A coordinator with a 50 ms mutex TTL, for tests that roll the store back: a rollback also
/// restores mutexes that were already released.
fn short_mutex(store: &MemoryStore, id: &str) -> Coordinator<MemoryStore> {
    let options = CoordinatorOptions {
        instance_id: id.into(),
        mutex_ttl_ms: 50,
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        ..CoordinatorOptions::default()
    };
    Coordinator::new(store.connect(), options)
}

fn recorded(store: &MemoryStore) -> Option<GroupMetadata> {
    store.peek_record(&group()).map(|r| serde_json::from_str(&r.aggregate).expect("recorded metadata parses"))
}

#[tokio::test]
async fn join_and_steady_heartbeats_write_once_then_answer_from_reads() {
    let store = MemoryStore::new(1);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    c.start().await.expect("probe");
    create(&c, 4).await;
    let joined = c.heartbeat(join("a")).await.expect("join");
    assert_eq!((joined.status, joined.assigned.clone()), (HeartbeatStatus::Ok, vec![0, 1, 2, 3]));
    let revision = store.peek_record(&group()).expect("record").revision;
    assert_eq!(joined.store_revision, revision, "the response names the revision it was derived from");
    let mut r = joined;
    for _ in 0..5 {
        r = c.heartbeat(next(&r)).await.expect("steady");
    }
    assert_eq!(store.peek_record(&group()).expect("record").revision, revision, "steady heartbeats write nothing");
    assert!(c.metrics().render().contains("rsc_heartbeats_total{status=\"OK\"} 6"));
}

/// `group()` of 2 shards, created through a coordinator, member `a` joined (its answer), then
/// its metadata key deleted out of band.
async fn a_member_of_a_group_whose_key_is_deleted(
    seed: u64,
) -> (MemoryStore, Coordinator<MemoryStore>, HeartbeatResponse) {
    let store = MemoryStore::new(seed);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    create(&c, 2).await;
    let r = c.heartbeat(join("a")).await.expect("join");
    assert!(store.delete_metadata_key(&group()));
    (store, c, r)
}

/// Counters that are evidence of trouble exist at 0 before their first event: a series that
/// first appeared at 1 read as no increase to Prometheus, so `increase(...) > 0` alerts missed a
/// process's first identity change and each group's first version regression.
#[tokio::test]
async fn evidence_counters_are_exported_at_zero_before_their_first_event() {
    let store = MemoryStore::new(17);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    let rendered = c.metrics().render();
    for line in ["\nrsc_store_identity_changes_total 0\n", "\nrsc_heard_relay_failures_total 0\n"] {
        assert!(rendered.contains(line), "{line:?} missing from:\n{rendered}");
    }
    create(&c, 2).await;
    c.heartbeat(join("a")).await.expect("join");
    c.tick_all().await;
    let rendered = c.metrics().render();
    let alerted =
        ["rsc_metadata_version_regressions_total", "rsc_metadata_schema_errors_total", "rsc_members_expired_total"];
    for name in alerted {
        let line = format!("\n{name}{{group=\"{}\"}} 0\n", group());
        assert!(rendered.contains(&line), "{line:?} missing from:\n{rendered}");
        assert!(rendered.contains(&format!("# TYPE {name} counter\n")), "{rendered}");
    }
    // Only those the one-shot alerts watch: each is a series per group on every scrape (all
    // twelve per-group counters made /metrics five times larger). Three gauges, four declared
    // counters, and the fences the join raised.
    let group_series = c.debug_sizes().group_series;
    assert!(group_series <= 8, "{group_series} series for one group:\n{rendered}");
}

/// A member that does not drain in time is fenced, and a silent one expires: both are counted,
/// so an alert sees them even when the scrape interval is longer than the gauges that showed them
/// (`rsc_group_revoking_shards` until the fence, a heartbeat age for half a member TTL).
#[tokio::test]
async fn members_fenced_or_expired_by_a_tick_and_their_fenced_shards_are_counted() {
    let store = MemoryStore::new(18);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    let config = GroupConfig { rebalance_timeout_ms: 300, ..fast_config() };
    c.admin(AdminRequest::CreateGroup { group: group(), shard_count: 4, config }).await.expect("create");
    let labels = vec![("group", group().to_string())];
    let counted = |name: &'static str| c.metrics().value(name, &labels);
    let a = c.heartbeat(join("a")).await.expect("a joins");
    let a = c.heartbeat(next(&a)).await.expect("a steady");
    let held = a.assigned.len();
    let b = c.heartbeat(join("b")).await.expect("b joins");
    // a heartbeats on but never drains what it is told to (it reports nothing revoked).
    let mut a_next = next(&a);
    let mut told = c.heartbeat(a_next.clone()).await.expect("a told to drain");
    let draining = told.revoke.len();
    assert!(draining > 0, "{told:?}");
    assert_eq!((counted("rsc_shards_fenced_total"), counted("rsc_members_fenced_total")), (0.0, 0.0));
    let fenced_a =
        || recorded(&store).expect("record").members.get("a").is_some_and(|m| m.state == MemberState::Fenced);
    let started = tokio::time::Instant::now();
    while !fenced_a() {
        assert!(started.elapsed() < Duration::from_secs(3), "a is fenced at the rebalance timeout");
        tokio::time::sleep(Duration::from_millis(25)).await;
        a_next = HeartbeatRequest { revoking: Vec::new(), ..next(&told) };
        if let Ok(answer) = c.heartbeat(a_next.clone()).await {
            told = answer;
        }
        c.heartbeat(next(&b)).await.expect("b steady");
        c.tick_all().await;
    }
    assert_eq!(counted("rsc_members_fenced_total"), 1.0, "{}", c.metrics().render());
    // Every shard a held, the ones it was told to drain and the ones it kept.
    assert_eq!(counted("rsc_shards_fenced_total"), held as f64);
    assert_eq!(counted("rsc_members_expired_total"), 0.0);
    // Both fall silent and expire; the fenced shards were counted once.
    while !recorded(&store).expect("record").members.is_empty() {
        assert!(started.elapsed() < Duration::from_secs(6), "both expire");
        tokio::time::sleep(Duration::from_millis(25)).await;
        c.tick_all().await;
    }
    assert_eq!(counted("rsc_members_expired_total"), 2.0, "{}", c.metrics().render());
    assert_eq!((counted("rsc_members_fenced_total"), counted("rsc_shards_fenced_total")), (1.0, held as f64));
}

/// A best-effort step whose command the server rejects (an ACL changed at run time) is counted
/// like any other: the index add after a create answered nothing and only logged a WARN, so a
/// group that was then never ticked showed in no metric.
#[tokio::test]
async fn a_rejected_index_add_is_counted_as_a_compatibility_and_index_failure() {
    let store = MemoryStore::new(20);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    store.set_unsupported("SADD");
    create(&c, 2).await;
    let metrics = c.metrics();
    assert_eq!(metrics.value("rsc_redis_command_compat_failures_total", &vec![("command", "SADD".to_string())]), 1.0);
    assert_eq!(metrics.value("rsc_group_index_failures_total", &Vec::new()), 1.0, "{}", metrics.render());
}

/// The ticker's progress is visible: the age of its last completed pass grows while it does not
/// pass (dead, stalled, or unable to read the index) and restarts at each pass.
#[tokio::test]
async fn the_age_of_the_last_tick_pass_grows_until_a_pass_completes() {
    let store = MemoryStore::new(21);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    create(&c, 2).await;
    let age = || c.metrics().value("rsc_ticker_last_pass_age_seconds", &Vec::new());
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(age() >= 0.1, "no pass yet: the age counts from the start ({})", age());
    c.tick_all().await;
    assert!(age() < 0.1, "{}", age());
    store.set_outage(Some(OutageMode::Errors));
    tokio::time::sleep(Duration::from_millis(120)).await;
    c.tick_all().await;
    assert!(age() >= 0.1, "a pass that could not read the index did not complete ({})", age());
}

#[tokio::test]
async fn a_deleted_metadata_key_fails_closed_and_is_never_rebuilt() {
    let (store, c, r) = a_member_of_a_group_whose_key_is_deleted(2).await;

    assert_eq!(c.heartbeat(next(&r)).await.unwrap_err().code, ErrorCode::MetadataMissing);
    assert_eq!(c.heartbeat(join("b")).await.unwrap_err().code, ErrorCode::MetadataMissing, "the index knows it");
    assert_eq!(c.routing(&group(), RoutingReport::version(0)).await.unwrap_err().code, ErrorCode::MetadataMissing);
    c.tick_all().await;
    assert!(store.peek_record(&group()).is_none(), "nothing rebuilt from heartbeats or ticks");
    assert!(c.metrics().total("rsc_metadata_missing_total") >= 3.0);

    // An unknown group nobody knew is just not found.
    let mut stranger = join("x");
    stranger.group = GroupId::new("nobody", "here");
    assert_eq!(c.heartbeat(stranger).await.unwrap_err().code, ErrorCode::GroupNotFound);
}

/// `rsc_metadata_missing_total` names a group whose key is missing when this process holds it or
/// the index lists it — so a coordinator that just started, and holds nothing yet, still pages on
/// a listed group's lost key — and counts a group only a client says existed under one shared
/// label (any client can name any group). Before, a process that held nothing counted a listed
/// group under the shared label, which the suggested alert leaves out.
#[tokio::test]
async fn a_missing_key_is_counted_under_its_groups_name_when_the_index_lists_it() {
    let (store, _, r) = a_member_of_a_group_whose_key_is_deleted(21).await;
    let restarted = coordinator(&store, "c2", PlantedBugs::NONE);
    restarted.start().await.expect("probe");
    // Its ticker's first pass reads the index (and finds the key missing: not counted yet).
    restarted.tick_all().await;
    assert_eq!(restarted.heartbeat(next(&r)).await.unwrap_err().code, ErrorCode::MetadataMissing);
    let named = vec![("group", group().to_string())];
    assert_eq!(restarted.metrics().value("rsc_metadata_missing_total", &named), 1.0);
    let made_up = GroupId::new("nobody", "here");
    let refused = restarted.routing(&made_up, RoutingReport::version(7)).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::MetadataMissing, "a client says it existed");
    assert!(refused.message.contains(rsc::service::UNSEEN_MISSING), "{}", refused.message);
    let unseen = vec![("group", "(not seen by this instance)".to_string())];
    assert_eq!(restarted.metrics().value("rsc_metadata_missing_total", &unseen), 1.0);
    let metrics = restarted.metrics().render();
    assert!(!metrics.contains("nobody"), "no series named by a client:\n{metrics}");
}

/// A request naming a group that has no record is judged against the paced index read, not a
/// new one each: a review found every such request (unauthenticated on an open data plane) read
/// the whole index. Here the ticker's pass reads the index, then the index cannot be read again,
/// and every request for an unknown group is still answered from the ticker's read (before: each
/// failed to read it and answered METADATA_MISSING, the cautious answer for an unreadable index).
#[tokio::test]
async fn requests_for_unknown_groups_share_one_index_read_per_refresh_period() {
    let store = MemoryStore::new(3);
    let options = CoordinatorOptions { ticker_refresh_ms: 60_000, ..CoordinatorOptions::default() };
    let c = Coordinator::new(store.connect(), options);
    create(&c, 2).await;
    // The ticker's pass reads the index (paced: kept for `ticker_refresh_ms`).
    c.tick_all().await;
    let stranger = |n: usize| {
        let mut request = join("x");
        request.group = GroupId::new("nobody", format!("here-{n}"));
        request
    };
    assert_eq!(c.heartbeat(stranger(0)).await.unwrap_err().code, ErrorCode::GroupNotFound);
    store.set_unsupported("SMEMBERS");
    for n in 1..50 {
        assert_eq!(c.heartbeat(stranger(n)).await.unwrap_err().code, ErrorCode::GroupNotFound, "request {n}");
        let routing = c.routing(&stranger(n).group, RoutingReport::version(0)).await;
        assert_eq!(routing.unwrap_err().code, ErrorCode::GroupNotFound, "routing {n}");
    }
    // A group the index lists is still told apart: its record lost, it fails closed.
    assert!(store.delete_metadata_key(&group()));
    assert_eq!(c.heartbeat(join("b")).await.unwrap_err().code, ErrorCode::MetadataMissing, "the index knows it");
}

#[tokio::test]
async fn recreating_a_lost_group_starts_with_a_correction_round() {
    let store = MemoryStore::new(3);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    create(&c, 2).await;
    c.heartbeat(join("a")).await.expect("join");
    store.delete_metadata_key(&group());
    create(&c, 2).await;
    let g = recorded(&store).expect("recreated by the operator");
    assert!(g.correction.is_some(), "old consumers may still hold leases: no OK for one lease");
    let r = c.heartbeat(join("a")).await.expect("rejoin");
    assert_ne!(r.status, HeartbeatStatus::Ok);
}

#[tokio::test]
async fn corrupt_or_future_schema_metadata_fails_closed_and_is_never_overwritten() {
    let store = MemoryStore::new(4);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    create(&c, 2).await;
    let r = c.heartbeat(join("a")).await.expect("join");
    assert!(store.corrupt_aggregate(&group()));
    let corrupt = store.peek_record(&group()).expect("record");
    // An out-of-band edit of the aggregate that keeps (revision, writeId) is seen by the steady
    // heartbeat's cached path at the next full read: the tick, every tick_interval_ms.
    c.tick_all().await;
    assert_eq!(c.heartbeat(next(&r)).await.unwrap_err().code, ErrorCode::MetadataIncompatible);
    // Anything that needs a write reads the record in full and fails closed.
    assert_eq!(c.heartbeat(join("b")).await.unwrap_err().code, ErrorCode::MetadataIncompatible);
    let add = AdminRequest::AddShards { group: group(), expected_revision: corrupt.revision, new_shard_count: 4 };
    assert_eq!(c.admin(add).await.unwrap_err().code, ErrorCode::MetadataIncompatible);
    assert_eq!(store.peek_record(&group()), Some(corrupt), "never overwritten");
    assert!(c.metrics().total("rsc_metadata_schema_errors_total") >= 3.0);

    let store = MemoryStore::new(5);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    create(&c, 2).await;
    let r = c.heartbeat(join("a")).await.expect("join");
    assert!(store.set_future_schema(&group(), 2));
    // The schema version is part of the cached stamp: the very next steady heartbeat fails closed.
    assert_eq!(c.heartbeat(next(&r)).await.unwrap_err().code, ErrorCode::MetadataIncompatible);
    assert_eq!(c.heartbeat(join("b")).await.unwrap_err().code, ErrorCode::MetadataIncompatible);
}

#[tokio::test]
async fn a_failover_that_loses_writes_is_detected_and_no_ok_is_given_for_one_lease() {
    let store = MemoryStore::new(6);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    c.start().await.expect("probe");
    create(&c, 2).await;
    let a = c.heartbeat(join("a")).await.expect("a");
    let b = c.heartbeat(join("b")).await.expect("b");
    let a = c.heartbeat(next(&a)).await.expect("a drains");
    let _a = c.heartbeat(next(&a)).await.expect("a REVOKED");
    let b = c.heartbeat(next(&b)).await.expect("b gets its shard");
    assert_eq!((b.status, b.assigned.clone()), (HeartbeatStatus::Ok, vec![1]));

    // The store fails over and loses its recent writes, back to before the release + grant (the
    // journal also holds liveness touches and mutex writes). The store again says a drains shard 1.
    let granted_revision = store.peek_record(&group()).expect("record").revision;
    while store.peek_record(&group()).expect("record").revision == granted_revision {
        store.rollback(1, RollbackMode::Silent);
    }
    store.failover();
    let lost = recorded(&store).expect("record");
    assert!(matches!(lost.current.get(&1), Some(ShardOwner::Revoking { member, .. }) if member == "a"));
    let err = c.heartbeat(next(&b)).await.expect_err("the failover broke the connection");
    assert_eq!(err.code, ErrorCode::StoreUnavailable);
    let started = tokio::time::Instant::now();
    let mut statuses = Vec::new();
    let mut b_req = next(&b);
    loop {
        // The rollback may restore an acquired mutex whose release was lost: the group is locked
        // until the mutex TTL and the coordinator answers a retryable STORE_UNAVAILABLE.
        let r = match c.heartbeat(b_req.clone()).await {
            Ok(r) => r,
            Err(e) if e.code == ErrorCode::StoreUnavailable => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                assert!(started.elapsed() < Duration::from_secs(4), "store stayed unavailable");
                continue;
            }
            Err(e) => panic!("b: {e:?}"),
        };
        statuses.push(r.status);
        if r.status == HeartbeatStatus::Ok {
            break;
        }
        b_req = next(&r);
        // keep a alive and draining
        let g = recorded(&store).expect("record");
        let a_req = HeartbeatRequest {
            member_epoch: g.members["a"].member_epoch,
            metadata_version: g.metadata_version,
            owned: g.owned_shards("a"),
            revoking: g
                .current
                .iter()
                .filter_map(|(&shard, owner)| match owner {
                    ShardOwner::Revoking { member, revoke_id, .. } if member == "a" => {
                        Some(RevokeReport { shard, in_flight: 0, revoked: true, revoke_id: *revoke_id })
                    }
                    _ => None,
                })
                .collect(),
            ..join("a")
        };
        let _ = c.heartbeat(a_req).await;
        c.tick_all().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(started.elapsed() < Duration::from_secs(5), "the round must end: {statuses:?}");
    }
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "no OK before one assignment lease: {statuses:?} after {:?}\n{:#?}",
        started.elapsed(),
        recorded(&store)
    );
    assert_eq!(statuses[0], HeartbeatStatus::SyncMetadata, "b's view is ahead of the store");
    assert!(c.metrics().total("rsc_store_identity_changes_total") >= 1.0);
}

#[tokio::test]
async fn terminating_refuses_new_mutations_but_finishes_entered_sections() {
    let store = MemoryStore::new(7);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    create(&c, 2).await;
    store.set_latency_ms(100);
    let inside = {
        let c = c.clone();
        tokio::spawn(async move { c.heartbeat(join("a")).await })
    };
    tokio::time::sleep(Duration::from_millis(120)).await; // the join is past the gate, inside its write
    c.begin_shutdown();
    assert_eq!(c.heartbeat(join("b")).await.unwrap_err().code, ErrorCode::CoordinatorTerminating);
    let joined = inside.await.expect("task").expect("the entered section finished its write");
    assert_eq!(joined.assigned, vec![0, 1]);
    c.drained().await;
    store.set_latency_ms(0);
    assert!(store.acquire_mutex(&group(), "other", 1_000).await.expect("store"), "the mutex was released");
    assert!(c.metrics().render().contains("rsc_coordinator_terminating 1"));
}

#[tokio::test]
async fn two_coordinators_on_one_store_never_record_two_owners() {
    let store = MemoryStore::new(8);
    let (c1, c2) = (coordinator(&store, "c1", PlantedBugs::NONE), coordinator(&store, "c2", PlantedBugs::NONE));
    create(&c1, 16).await;
    let mut tasks = Vec::new();
    for i in 0..10 {
        let c = if i % 2 == 0 { c1.clone() } else { c2.clone() };
        tasks.push(tokio::spawn(async move {
            let mut r = c.heartbeat(join(&format!("m{i}"))).await?;
            for _ in 0..30 {
                r = c.heartbeat(next(&r)).await?;
                if r.status == HeartbeatStatus::Ok && !r.assigned.is_empty() {
                    break;
                }
            }
            Ok::<_, rsc::core::protocol::ApiError>(r)
        }));
    }
    let mut last = Vec::new();
    for t in tasks {
        last.push(t.await.expect("task").expect("heartbeats succeed despite CAS races"));
    }
    // Keep every member heartbeating (alternating coordinators) until the rebalance settles.
    for round in 0..40 {
        for (i, r) in last.iter_mut().enumerate() {
            let c = if (i + round) % 2 == 0 { &c1 } else { &c2 };
            *r = c.heartbeat(next(r)).await.expect("heartbeat");
        }
        if last.iter().all(|r| r.status == HeartbeatStatus::Ok) {
            break;
        }
    }
    let g = recorded(&store).expect("record");
    g.validate().expect("valid");
    assert_eq!(g.members.len(), 10);
    let owned = g.current.values().filter(|o| matches!(o, ShardOwner::Owned { .. })).count();
    assert_eq!(owned, 16, "every shard owned exactly once after the rebalance settles");
}

#[tokio::test]
async fn the_planted_rebuild_bug_really_rebuilds_so_the_checkers_have_something_to_catch() {
    let store = MemoryStore::new(9);
    let c = coordinator(&store, "c1", PlantedBugs::only(PlantedBug::RebuildMissingMetadata));
    create(&c, 2).await;
    let r = c.heartbeat(join("a")).await.expect("join");
    store.delete_metadata_key(&group());
    let _ = c.heartbeat(next(&r)).await;
    assert!(store.peek_record(&group()).is_some(), "the planted bug resurrects the group");
}

/// The tick expires a silent member; the group (the operator's) stays, empty. The planted
/// `DeleteGroupOfLastExpiredMember` deletes it instead, so the liveness checker has something to
/// catch.
#[tokio::test]
async fn expiring_the_last_member_keeps_the_group_unless_the_planted_bug_deletes_it() {
    for (seed, planted, kept) in
        [(31, PlantedBugs::NONE, true), (32, PlantedBugs::only(PlantedBug::DeleteGroupOfLastExpiredMember), false)]
    {
        let store = MemoryStore::new(seed);
        let c = coordinator(&store, "c1", planted);
        create(&c, 2).await;
        c.heartbeat(join("a")).await.expect("join");
        for _ in 0..20 {
            c.tick_all().await;
            if recorded(&store).is_none_or(|g| g.members.is_empty()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let record = store.peek_record(&group());
        assert_eq!(record.is_some(), kept, "planted {planted:?}");
        if kept {
            assert!(recorded(&store).expect("group").members.is_empty(), "the member expired");
        }
    }
}

/// The decoded-aggregate cache: a steady heartbeat answers from the cached decode only while Redis
/// holds that very write. Another coordinator's write, and a silent rollback followed by a
/// *different* write of the same revision (ABA), are both seen by the next heartbeat.
#[tokio::test]
async fn the_decoded_cache_never_answers_for_a_write_redis_no_longer_holds() {
    let store = MemoryStore::new(12);
    let (c1, c2, c3) = (short_mutex(&store, "c1"), short_mutex(&store, "c2"), short_mutex(&store, "c3"));
    create(&c1, 2).await;
    let mut a = c1.heartbeat(join("a")).await.expect("join");
    for _ in 0..4 {
        a = c1.heartbeat(next(&a)).await.expect("a settles");
    }
    assert_eq!((a.status, a.assigned.clone()), (HeartbeatStatus::Ok, vec![0, 1]));
    let settled = next(&a);
    let steady = c1.heartbeat(settled.clone()).await.expect("steady, from c1's cache");
    assert_eq!(steady.store_revision, a.store_revision);

    // c2 writes (b joins; a must give a shard up): c1's next steady heartbeat sees it.
    c2.heartbeat(join("b")).await.expect("b joins through c2");
    let after_join = store.peek_record(&group()).expect("record");
    let seen = c1.heartbeat(settled.clone()).await.expect("a through c1");
    assert_eq!(seen.store_revision, after_join.revision);
    assert_eq!(seen.revoke.len(), 1, "c1 answered from the new write, not its cached one: {seen:?}");

    // Roll the store back silently to before b's join, then write something else at the very
    // revision c1 has cached (a third coordinator adds shards).
    while store.peek_record(&group()).expect("record").revision >= after_join.revision {
        store.rollback(1, RollbackMode::Silent);
    }
    let base = store.peek_record(&group()).expect("record").revision;
    assert_eq!(base + 1, after_join.revision);
    let add = AdminRequest::AddShards { group: group(), expected_revision: base, new_shard_count: 4 };
    c3.admin(add).await.expect("add shards");
    let rewritten = store.peek_record(&group()).expect("record");
    assert_eq!(rewritten.revision, after_join.revision, "the same revision, another write");
    assert_ne!(rewritten.write_id, after_join.write_id);

    let seen = c1.heartbeat(settled).await.expect("a through c1");
    assert_eq!(seen.shard_count, 4, "c1 answered from the rewritten record: {seen:?}");
    assert!(seen.revoke.is_empty(), "b's join was lost with the rollback: {seen:?}");
}

/// An admin mutation through the instance that holds evidence of a silent rollback records the
/// correction round first, as heartbeats, ticks and deletes do: it used to decide on the rolled-back
/// record with no round, so the new shards' grants were recorded and another instance answered
/// them `OK` beside the lost history's owners until this instance's next tick. The operator's
/// change meets the round's write (REVISION_CONFLICT: the group moved on); done again, it is
/// decided inside the round, which answers no one `OK` until the lost history's leases ended.
#[tokio::test]
async fn an_add_shards_through_the_instance_holding_regression_evidence_records_the_round_first() {
    let store = MemoryStore::new(15);
    let c1 = short_mutex(&store, "c1");
    create(&c1, 2).await;
    let base = store.peek_record(&group()).expect("record").revision;
    let joined = c1.heartbeat(join("x")).await.expect("x joins");
    assert_eq!(joined.status, HeartbeatStatus::Ok);
    while store.peek_record(&group()).expect("record").revision > base {
        store.rollback(1, RollbackMode::Silent);
    }
    assert!(recorded(&store).expect("record").correction.is_none(), "a silent rollback: nothing recorded yet");

    let add = |expected_revision| AdminRequest::AddShards { group: group(), expected_revision, new_shard_count: 4 };
    let refused = c1.admin(add(base)).await.expect_err("the round was recorded first");
    assert_eq!(refused.code, ErrorCode::RevisionConflict, "{refused:?}");
    assert!(refused.message.contains("correction round"), "the conflict says why: {refused:?}");
    let round = recorded(&store).expect("record");
    assert!(round.correction.is_some(), "c1 saw a later revision than the store holds: {round:?}");
    let revision = store.peek_record(&group()).expect("record").revision;
    c1.admin(add(revision)).await.expect("add shards, in the round");
    assert_eq!(recorded(&store).expect("record").shard_count, 4);

    let c2 = short_mutex(&store, "c2");
    let newcomer = c2.heartbeat(join("y")).await.expect("y joins through c2");
    assert_ne!(newcomer.status, HeartbeatStatus::Ok, "no OK while the round runs: {newcomer:?}");
}

/// A fence key that vanished (evicted, flushed, deleted by hand) used to restart at counter 1 on
/// the shard's next grant: below the counters of grants made before, so a late operation under
/// one of those would win the check at Redis, and the fencing token applications compare went
/// backwards. A key without a counter is now raised to the coordinator's wall clock in ms.
#[tokio::test]
async fn a_grant_after_its_fence_key_vanished_gets_a_counter_above_the_earlier_grants() {
    let store = MemoryStore::new(16);
    let c = short_mutex(&store, "c1");
    create(&c, 1).await;
    let fence_of = |r: &HeartbeatResponse| r.fences.iter().find(|f| f.shard == 0).map(|f| f.fence);
    let joined = c.heartbeat(join("a")).await.expect("a joins");
    let first = fence_of(&joined).expect("a's grant is fenced");
    // a leaves without its REVOKED report: its grant runs out a lease later, at a tick.
    c.heartbeat(HeartbeatRequest { leave: true, ..next(&joined) }).await.expect("a leaves");
    assert!(store.delete_fence_key(&rsc::store::keys::fence_key(&group(), 0)), "the key existed");
    tokio::time::sleep(Duration::from_millis(fast_config().assignment_lease_ms * 2)).await;
    c.tick_all().await;
    let mut granted = c.heartbeat(join("b")).await.expect("b joins");
    for _ in 0..20 {
        if fence_of(&granted).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.tick_all().await;
        granted = c.heartbeat(next(&granted)).await.expect("b heartbeats");
    }
    let second = fence_of(&granted).expect("b was granted the shard");
    assert!(second.counter > first.counter, "{second} after {first}: the vanished key restarted below");
}

/// A producer's routing refresh reports its cached version. One above the stored version (an
/// AddShards the store lost) is loss evidence like a consumer's report: recorded once as a
/// correction round, and answered with `lostVersion` so the producer drops the lost view.
#[tokio::test]
async fn a_producer_reporting_a_lost_version_is_told_so_and_the_evidence_is_recorded() {
    let store = MemoryStore::new(13);
    let c = short_mutex(&store, "c1");
    create(&c, 2).await;
    let before = store.peek_record(&group()).expect("record").revision;
    let add = AdminRequest::AddShards { group: group(), expected_revision: before, new_shard_count: 4 };
    c.admin(add).await.expect("add shards");
    let seen = c.routing(&group(), RoutingReport::version(0)).await.expect("routing");
    assert_eq!((seen.shard_count, seen.lost_version), (4, None));
    assert_eq!(
        c.routing(&group(), RoutingReport::version(seen.metadata_version)).await.expect("same version").lost_version,
        None
    );

    while store.peek_record(&group()).expect("record").revision > before {
        store.rollback(1, RollbackMode::Silent);
    }
    let stored = recorded(&store).expect("record");
    assert!(stored.metadata_version < seen.metadata_version && stored.correction.is_none());

    // The producer holds the proof the answer gave of its version (DESIGN §8).
    let report = RoutingReport::version(seen.metadata_version).proven(seen.metadata_version_proof, None);
    assert!(report.known_version_proof.is_some());
    let told = c.routing(&group(), report).await.expect("routing");
    assert_eq!((told.shard_count, told.lost_version), (2, Some(seen.metadata_version)));
    let after = recorded(&store).expect("record");
    assert!(after.correction.is_some(), "a correction round was recorded");
    assert_eq!(after.max_client_version_seen, seen.metadata_version);
    assert_eq!(told.store_revision, store.peek_record(&group()).expect("record").revision, "answered from the write");
    assert!(c.metrics().total("rsc_client_metadata_version_ahead_total") >= 1.0);
    // The gauge the spec's alert reads is exported by the next tick, with per-member series off
    // (the default): it was once set only after their early return, so the alert never fired.
    // (The first tick finds the rollback's revision regression and starts over.)
    assert!(!c.metrics().member_series());
    c.tick_all().await;
    c.tick_all().await;
    let ahead = c.metrics().value("rsc_client_reported_metadata_version_ahead", &vec![("group", group().to_string())]);
    let now = recorded(&store).expect("record");
    assert!(now.max_client_version_seen > now.metadata_version, "{now:?}");
    assert_eq!(ahead, (now.max_client_version_seen - now.metadata_version) as f64, "{}", c.metrics().render());
    // The same report again changes nothing (the round already covers it).
    let revision = store.peek_record(&group()).expect("record").revision;
    assert_eq!(c.routing(&group(), report).await.expect("again").lost_version, told.lost_version);
    assert_eq!(store.peek_record(&group()).expect("record").revision, revision);
}

/// A terminating coordinator cannot write, so it cannot record a producer's proven report of a
/// lost version. It used to answer `lostVersion` anyway, and the producer dropped the version it
/// was the last to hold: later bumps issued those numbers again (swarm seed 10710 of a fresh
/// sweep, during a rolling update). It now refuses (`COORDINATOR_TERMINATING`, retry elsewhere),
/// and the instance the producer asks next records the report.
#[tokio::test]
async fn a_terminating_coordinator_does_not_tell_a_producer_its_version_was_lost_without_recording_it() {
    let store = MemoryStore::new(14);
    let old = short_mutex(&store, "old");
    create(&old, 2).await;
    let before = store.peek_record(&group()).expect("record").revision;
    let add = AdminRequest::AddShards { group: group(), expected_revision: before, new_shard_count: 4 };
    old.admin(add).await.expect("add shards");
    let seen = old.routing(&group(), RoutingReport::version(0)).await.expect("routing");
    while store.peek_record(&group()).expect("record").revision > before {
        store.rollback(1, RollbackMode::Silent);
    }
    let report = RoutingReport::version(seen.metadata_version).proven(seen.metadata_version_proof, None);

    old.begin_shutdown();
    let refused = old.routing(&group(), report).await.expect_err("nothing can be recorded here");
    assert_eq!(refused.code, ErrorCode::CoordinatorTerminating, "{refused:?}");
    assert!(recorded(&store).expect("record").correction.is_none(), "nothing was written");
    // A plain refresh (nothing to record) is still served while terminating.
    let plain = old.routing(&group(), RoutingReport::version(0)).await.expect("served while terminating");
    assert_eq!(plain.lost_version, None);

    let next = short_mutex(&store, "next");
    let told = next.routing(&group(), report).await.expect("another instance records it");
    assert_eq!(told.lost_version, Some(seen.metadata_version));
    let after = recorded(&store).expect("record");
    assert!(after.correction.is_some(), "a correction round was recorded");
    assert_eq!(after.max_client_version_seen, seen.metadata_version, "later bumps go past the lost version");
}

/// Issue #14: the store loses an `add-shards` a producer published with; the producer's routing
/// refresh reports the shard count, and the coordinator records the shards again (reason
/// `recovered-lost-add-shards`, counted in a metric), once: the same report again writes nothing.
#[tokio::test]
async fn a_producer_reporting_the_shards_of_a_lost_add_shards_makes_the_coordinator_add_them_again() {
    let store = MemoryStore::new(14);
    let c = short_mutex(&store, "c1");
    create(&c, 2).await;
    let before = store.peek_record(&group()).expect("record").revision;
    let add = AdminRequest::AddShards { group: group(), expected_revision: before, new_shard_count: 5 };
    c.admin(add).await.expect("add shards");
    let seen = c.routing(&group(), RoutingReport::NONE).await.expect("routing");
    assert!(seen.accepts_known_shard_count, "the answer announces the parameter");
    while store.peek_record(&group()).expect("record").revision > before {
        store.rollback(1, RollbackMode::Silent);
    }
    assert_eq!(recorded(&store).expect("record").shard_count, 2, "the add-shards is lost");

    let report = RoutingReport {
        known_shard_count_proof: seen.shard_count_proof,
        known_version_proof: seen.metadata_version_proof,
        known_version: seen.metadata_version,
        known_shard_count: 5,
    };
    let healed = c.routing(&group(), report).await.expect("routing");
    assert_eq!((healed.shard_count, healed.lost_version), (5, None), "{healed:?}");
    assert!(healed.metadata_version > seen.metadata_version);
    let after = recorded(&store).expect("record");
    assert_eq!(after.shard_count, 5);
    assert_eq!(after.resharding.last().map(|r| r.reason), Some(ReshardReason::RecoveredLostAddShards));
    assert_eq!(healed.store_revision, store.peek_record(&group()).expect("record").revision, "answered from the write");
    assert_eq!(c.metrics().total("rsc_lost_add_shards_healed_total"), 1.0);

    let revision = store.peek_record(&group()).expect("record").revision;
    let again = c.routing(&group(), report).await.expect("again");
    assert_eq!(again.shard_count, 5);
    assert_eq!(store.peek_record(&group()).expect("record").revision, revision, "nothing more to heal");
    assert_eq!(c.metrics().total("rsc_lost_add_shards_healed_total"), 1.0);
}

/// The black-box review's findings, through the service: one routing request naming 65,536 shards
/// grew a 4-shard group for good, and forged "version ahead" reports (routing, a heartbeat of an
/// unknown member) started correction rounds at will. Without the proof the coordinator gave of
/// a number, a report of it changes nothing and is counted; `describe` never shows the key.
#[tokio::test]
async fn reports_above_the_recorded_state_without_their_proof_change_nothing() {
    let store = MemoryStore::new(15);
    let c = short_mutex(&store, "c1");
    create(&c, 4).await;
    let a = c.heartbeat(join("a")).await.expect("a joins");
    assert!(a.metadata_version_proof.is_some(), "answers prove their version");
    let before = store.peek_record(&group()).expect("record");
    let ahead = a.metadata_version + 1_000;

    let grow = RoutingReport { known_shard_count: 65_536, ..RoutingReport::NONE };
    assert_eq!(c.routing(&group(), grow).await.expect("answered").shard_count, 4);
    // The member's real proof, attached to a version it never saw.
    let lie = RoutingReport::version(ahead).proven(a.metadata_version_proof, a.metadata_version_proof);
    assert_eq!(c.routing(&group(), lie).await.expect("answered").lost_version, Some(ahead));
    let ghost = HeartbeatRequest { member_id: "ghost".into(), member_epoch: 3, metadata_version: ahead, ..next(&a) };
    assert_eq!(c.heartbeat(ghost).await.expect_err("refused").code, ErrorCode::UnknownMember);

    let after = store.peek_record(&group()).expect("record");
    assert_eq!(after.revision, before.revision, "nothing was written");
    let g = recorded(&store).expect("record");
    assert_eq!((g.shard_count, g.correction.is_none()), (4, true));
    assert!(c.metrics().total("rsc_unproven_client_reports_total") >= 3.0);
    assert_eq!(c.metrics().total("rsc_client_metadata_version_ahead_total"), 0.0);

    let described = c.describe(&group()).await.expect("describe");
    assert!(g.view_key.is_some() && described.metadata.view_key.is_none(), "the key stays in the store");
}

/// A group an older release wrote has no key: reports are credited as before (the compatibility
/// rule's safe case) until this release's first write of it draws one.
#[tokio::test]
async fn a_group_without_a_key_gets_one_at_its_first_write() {
    let store = MemoryStore::new(16);
    let c = short_mutex(&store, "c1");
    create(&c, 2).await;
    assert!(recorded(&store).expect("record").view_key.is_some(), "a create draws a key");
    keyless::drop_key_as_an_older_release_would(&store).await;
    let c = short_mutex(&store, "c2");
    let a = c.heartbeat(join("a")).await.expect("a joins");
    let keyed = recorded(&store).expect("record");
    assert!(keyed.view_key.is_some(), "the join's write drew a key");
    assert_eq!(
        a.metadata_version_proof,
        keyed.view_key.map(|k| k.prove(&group(), Fact::MetadataVersion, a.metadata_version))
    );
}

/// Found by the simulation (lost-add-shards seed 7, capsule in fault-plans/capsules/): a failover
/// lost the group's record *and* its index entry, and the operator's create made a new group with
/// a new key, under which the old incarnation's proofs no longer verified. A process that held the
/// group and found it gone without deleting it now treats the create as a recreate: a correction
/// round, and the lost record's key, which it remembers, so reports of the lost versions are
/// proven and made-up ones are not. A process that never held the group cannot tell it from a new
/// one: a plain create.
#[tokio::test]
async fn a_create_of_a_group_this_process_saw_vanish_is_a_recreate() {
    let store = MemoryStore::new(17);
    let c = short_mutex(&store, "c1");
    create(&c, 2).await;
    let a = c.heartbeat(join("a")).await.expect("a joins");
    let lost_key = recorded(&store).expect("record").view_key;
    assert!(lost_key.is_some());
    store.flush_all();
    c.tick_all().await;
    c.tick_all().await;
    let create_again = AdminRequest::CreateGroup { group: group(), shard_count: 2, config: fast_config() };
    let fresh = short_mutex(&store, "c2");
    fresh.admin(create_again.clone()).await.expect("created");
    let plain = recorded(&store).expect("record");
    assert!(plain.correction.is_none() && plain.view_key.is_some(), "c2 never held it: a plain create");

    store.flush_all();
    c.tick_all().await;
    c.tick_all().await;
    c.admin(create_again).await.expect("recreated");
    let recreated = recorded(&store).expect("record");
    assert!(recreated.correction.is_some(), "c1 saw it vanish: a recreate, with a round");
    assert_eq!(recreated.view_key, lost_key, "c1 remembers the lost record's key: the recreate keeps it");
    // A made-up count and version, with a token or not, change nothing during the round
    // (the simulation's swarm seed 5014: a forger grew a recreated group from 1 to 53 shards).
    let ahead = recreated.metadata_version.max(a.metadata_version) + 1_000;
    let forged = RoutingReport { known_shard_count: 64, ..RoutingReport::version(ahead) };
    c.routing(&group(), forged).await.expect("routing");
    let after = recorded(&store).expect("record");
    assert_eq!((after.shard_count, after.max_client_version_seen), (2, recreated.max_client_version_seen));
    // A's version from the lost incarnation is proven under the kept key: later versions skip it
    // (credited when ahead; both creates here start past the same second with random low bits, so
    // which is ahead is chance: `tests/core_proofs.rs` credits such a report deterministically).
    let report = RoutingReport::version(a.metadata_version).proven(a.metadata_version_proof, None);
    c.routing(&group(), report).await.expect("routing");
    let after = recorded(&store).expect("record");
    if a.metadata_version > recreated.metadata_version {
        assert_eq!(after.max_client_version_seen, a.metadata_version, "credited");
    }
    assert!(after.next_metadata_version().expect("room") > a.metadata_version, "no lost version is issued again");
}

/// The same without a tick between the loss and the create: the ticker reads the index only every
/// `ticker_refresh_ms`, so no sweep may have noticed the group gone; holding it (and not having
/// deleted it) is enough to know a create of it is a recreate.
#[tokio::test]
async fn a_create_of_a_held_group_whose_record_is_gone_is_a_recreate_before_any_tick() {
    let store = MemoryStore::new(18);
    let c = short_mutex(&store, "c1");
    create(&c, 2).await;
    c.heartbeat(join("a")).await.expect("a joins");
    store.flush_all();
    let create_again = AdminRequest::CreateGroup { group: group(), shard_count: 2, config: fast_config() };
    // The flush broke the connections (a restart): the first call finds out, as an operator's would.
    let first = c.admin(create_again.clone()).await.expect_err("the connection was reset");
    assert_eq!(first.code, ErrorCode::StoreUnavailable, "{first:?}");
    c.admin(create_again).await.expect("recreated");
    let recreated = recorded(&store).expect("record");
    assert!(recreated.correction.is_some(), "c1 held it and did not delete it: a recreate, with a round");
}

/// Issue #9: a heartbeat without the member's session is refused before the liveness touch, on
/// a warm decoded cache and on a cold one (a fresh coordinator): a forger can neither make the
/// member leave nor keep a dead member from expiring. The real member's next heartbeat works.
#[tokio::test]
async fn a_forged_heartbeat_is_refused_before_it_touches_liveness() {
    let store = MemoryStore::new(9);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    create(&c, 2).await;
    let a = c.heartbeat(join("a")).await.expect("a joins");
    let record = store.peek_record(&group()).expect("record");
    let liveness = store.liveness(&group()).await.expect("liveness");
    for fresh in [false, true] {
        let c = if fresh { coordinator(&store, "c2", PlantedBugs::NONE) } else { c.clone() };
        for session in [None, Some(session_of("mallory"))] {
            let forged = [
                HeartbeatRequest { member_session: session.clone(), ..next(&a) },
                HeartbeatRequest { leave: true, member_session: session.clone(), ..next(&a) },
            ];
            for req in forged {
                let refused = c.heartbeat(req).await.expect_err("refused");
                assert_eq!(refused.code, ErrorCode::SessionMismatch, "fresh coordinator: {fresh}");
            }
            let impostor = HeartbeatRequest { member_session: session, ..join("a") };
            assert_eq!(c.heartbeat(impostor).await.expect_err("refused").code, ErrorCode::MemberIdInUse);
        }
        assert_eq!(store.peek_record(&group()), Some(record.clone()), "nothing recorded");
        assert_eq!(store.liveness(&group()).await.expect("liveness"), liveness, "liveness untouched");
        assert!(c.metrics().total("rsc_member_session_refused_total") >= 6.0);
    }
    let steady = c.heartbeat(next(&a)).await.expect("the real member is unaffected");
    assert_eq!(steady.status, HeartbeatStatus::Ok);
}

/// A heartbeat of a made-up member id leaves a liveness field before it is refused, and a tick
/// removes such fields once there are more than `ORPHAN_LIVENESS_MAX` — in a group without members
/// too. Its tick read only the record, so the fields stayed for ever: an unauthenticated flood of
/// made-up ids at a group whose consumers were not started yet grew Redis without bound.
#[tokio::test]
async fn made_up_member_ids_at_a_group_without_members_leave_a_bounded_number_of_liveness_fields() {
    use rsc::core::model::ORPHAN_LIVENESS_MAX;
    let store = MemoryStore::new(13);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    create(&c, 2).await;
    for i in 0..3 * ORPHAN_LIVENESS_MAX {
        let ghost = HeartbeatRequest { member_epoch: 7, ..join(&format!("ghost-{i}")) };
        assert_eq!(c.heartbeat(ghost).await.expect_err("refused").code, ErrorCode::UnknownMember);
        if i % ORPHAN_LIVENESS_MAX == ORPHAN_LIVENESS_MAX - 1 {
            c.tick_all().await;
        }
    }
    c.tick_all().await;
    let left = store.liveness(&group()).await.expect("liveness").len();
    assert!(left <= ORPHAN_LIVENESS_MAX, "{left} liveness fields left");
    assert!(recorded(&store).expect("the group").members.is_empty());
}

// --- What the registry exports about members (issue 9 part 4) ---

#[tokio::test]
async fn the_tick_exports_per_group_aggregates_and_per_member_series_only_when_opted_in() {
    let store = MemoryStore::new(1);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    c.start().await.expect("probe");
    create(&c, 4).await;
    let a = c.heartbeat(join("a")).await.expect("join a");
    c.heartbeat(join("b")).await.expect("join b");
    c.heartbeat(next(&a)).await.expect("a hears of the rebalance");
    let recorded = c.describe(&group()).await.expect("describe").metadata;
    let revoking = recorded.shards_where(|o| matches!(o, ShardOwner::Revoking { .. })).len();
    assert!(revoking > 0, "b's join leaves some of a's shards revoking: {recorded:?}");

    c.tick_all().await;
    let by_group = vec![("group", group().to_string())];
    let metrics = c.metrics();
    assert_eq!(metrics.value("rsc_group_revoking_shards", &by_group), revoking as f64);
    let text = metrics.render();
    assert!(text.contains("rsc_group_member_heartbeat_age_max_seconds{group=\"orders:billing\"}"), "{text}");
    assert!(!text.contains("member=\""), "no member label by default:\n{text}");

    metrics.set_member_series(true);
    c.tick_all().await;
    let of_a = vec![("group", group().to_string()), ("member", "a".to_string())];
    assert_eq!(metrics.value("rsc_member_revoking_shards", &of_a), revoking as f64);
    assert!(metrics.render().contains("rsc_member_heartbeat_age_seconds{group=\"orders:billing\",member=\"b\"}"));

    // b leaves through another instance: this one's next tick no longer exports b's series
    // (they stayed, frozen, on the tick owner for every member that left elsewhere).
    let other = coordinator(&store, "c2", PlantedBugs::NONE);
    let b = other.heartbeat(next(&c.heartbeat(join("b")).await.expect("b"))).await.expect("b steady");
    other.heartbeat(HeartbeatRequest { leave: true, ..next(&b) }).await.expect("b leaves");
    c.tick_all().await;
    let text = metrics.render();
    assert!(!text.contains("member=\"b\""), "no series of the departed member:\n{text}");
    assert!(text.contains("member=\"a\""), "{text}");
}

/// Member ids are the clients' own and repeat across groups: a member that leaves one group
/// keeps its series in the others (removing by the member label alone took them all, until that
/// group's next tick, a quarter TTL away for an idle group).
#[tokio::test]
async fn a_member_leaving_one_group_keeps_its_series_in_another() {
    let store = MemoryStore::new(19);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    c.metrics().set_member_series(true);
    let audit = GroupId::new("orders", "audit");
    create(&c, 2).await;
    let req = AdminRequest::CreateGroup { group: audit.clone(), shard_count: 2, config: fast_config() };
    c.admin(req).await.expect("create audit");
    let in_billing = c.heartbeat(join("m")).await.expect("m joins billing");
    c.heartbeat(HeartbeatRequest { group: audit.clone(), ..join("m") }).await.expect("m joins audit");
    c.tick_all().await;
    let series = |g: &GroupId| format!("rsc_member_heartbeat_age_seconds{{group=\"{g}\",member=\"m\"}}");
    let text = c.metrics().render();
    assert!(text.contains(&series(&group())) && text.contains(&series(&audit)), "{text}");
    c.heartbeat(HeartbeatRequest { leave: true, ..next(&in_billing) }).await.expect("m leaves billing");
    let text = c.metrics().render();
    assert!(!text.contains(&series(&group())), "{text}");
    assert!(text.contains(&series(&audit)), "m's series in the other group stays:\n{text}");
}

/// A group may not configure a lease above the instance's ceiling (correction rounds rely on no
/// coordinator granting a longer one): create and change-config are refused with a typed error and
/// nothing is written; at the ceiling both are accepted.
#[tokio::test]
async fn a_lease_above_the_coordinator_ceiling_is_refused_and_changes_nothing() {
    let store = MemoryStore::new(7);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    let ceiling = c.options().max_assignment_lease_ms;
    let over = GroupConfig { assignment_lease_ms: ceiling + 1, member_lease_ttl_ms: 2 * ceiling, ..fast_config() };
    let refused = c.admin(AdminRequest::CreateGroup { group: group(), shard_count: 2, config: over.clone() }).await;
    assert_eq!(refused.expect_err("over the ceiling").code, ErrorCode::BadRequest);
    assert!(recorded(&store).is_none(), "a refused create writes nothing");
    create(&c, 2).await;
    let before = recorded(&store).expect("created");
    let change = AdminRequest::ChangeConfig { group: group(), expected_revision: 1, config: over };
    assert_eq!(c.admin(change).await.expect_err("over the ceiling").code, ErrorCode::BadRequest);
    assert_eq!(recorded(&store), Some(before), "a refused change writes nothing");
    let at = GroupConfig { assignment_lease_ms: ceiling, member_lease_ttl_ms: 2 * ceiling, ..fast_config() };
    c.admin(AdminRequest::ChangeConfig { group: group(), expected_revision: 1, config: at })
        .await
        .expect("at the ceiling");
}

/// A group whose lease was recorded above the ceiling (created before the ceiling was set: an
/// upgrade to a release that has one, or a ceiling lowered later) can still be changed: keeping or
/// shortening its lease is allowed (turning fencing off must not wait until every instance was
/// restarted with a higher ceiling); raising it further is still refused and writes nothing.
#[tokio::test]
async fn a_lease_recorded_above_a_later_ceiling_can_be_kept_or_shortened_but_not_raised() {
    let store = MemoryStore::new(7);
    let unbounded = Coordinator::new(
        store.connect(),
        CoordinatorOptions { instance_id: "old".into(), max_assignment_lease_ms: 0, ..CoordinatorOptions::default() },
    );
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    let ceiling = c.options().max_assignment_lease_ms;
    let long = GroupConfig { assignment_lease_ms: 4 * ceiling, member_lease_ttl_ms: 8 * ceiling, ..fast_config() };
    unbounded
        .admin(AdminRequest::CreateGroup { group: group(), shard_count: 2, config: long.clone() })
        .await
        .expect("no ceiling on that instance");
    let fencing_off = GroupConfig { fencing: false, ..long.clone() };
    c.admin(AdminRequest::ChangeConfig { group: group(), expected_revision: 1, config: fencing_off.clone() })
        .await
        .expect("the recorded lease kept, fencing turned off");
    let shorter = GroupConfig { assignment_lease_ms: 2 * ceiling, ..fencing_off };
    c.admin(AdminRequest::ChangeConfig { group: group(), expected_revision: 2, config: shorter.clone() })
        .await
        .expect("shortened, still above the ceiling");
    let before = recorded(&store).expect("created");
    let raised = GroupConfig { assignment_lease_ms: 3 * ceiling, ..shorter };
    let refused = c.admin(AdminRequest::ChangeConfig { group: group(), expected_revision: 3, config: raised }).await;
    assert_eq!(refused.expect_err("raised above the ceiling").code, ErrorCode::BadRequest);
    assert_eq!(recorded(&store), Some(before), "a refused change writes nothing");
}

/// Ticks scale with due work, not with groups: an idle group — one member holding every shard,
/// nothing waiting — is not read by the ticker again until a quarter of its member TTL (400 ms
/// here) passed; a write through this process makes it ticked at the next pass; a group without
/// members waits the audit period. With the audit period at 0 every pass reads every group.
/// The member heartbeats through another instance here: heartbeats through this one would keep
/// the group deferred (the next test).
#[tokio::test]
async fn idle_groups_are_not_read_by_every_tick() {
    for audit_ms in [60_000, 0] {
        let store = MemoryStore::new(11);
        let options = CoordinatorOptions {
            instance_id: "c1".into(),
            max_assignment_lease_ms: fast_config().assignment_lease_ms,
            idle_group_audit_ms: audit_ms,
            ..CoordinatorOptions::default()
        };
        let c = Coordinator::new(held::HeldStore::new(store.connect()), options.clone());
        c.start().await.expect("probe");
        let other = Coordinator::new(store.connect(), CoordinatorOptions { instance_id: "c2".into(), ..options });
        other.start().await.expect("probe");
        c.admin(AdminRequest::CreateGroup { group: group(), shard_count: 2, config: fast_config() })
            .await
            .expect("create");
        let empty = GroupId::new("orders", "empty");
        c.admin(AdminRequest::CreateGroup { group: empty.clone(), shard_count: 2, config: fast_config() })
            .await
            .expect("create the empty group");
        let joined = c.heartbeat(join("a")).await.expect("join");
        assert_eq!(joined.status, HeartbeatStatus::Ok);
        c.tick_all().await;
        let after_first = c.store().reads();
        c.tick_all().await;
        c.tick_all().await;
        let skipped = c.store().reads() == after_first;
        assert_eq!(skipped, audit_ms > 0, "audit {audit_ms}: idle groups are skipped unless the audit is 0");
        if audit_ms == 0 {
            continue;
        }
        // A quarter TTL later the group with a member is read again (expiry may come due); the
        // empty one is not (nothing can come due without a request).
        other.heartbeat(next(&joined)).await.expect("steady");
        tokio::time::sleep(Duration::from_millis(120)).await;
        other.heartbeat(next(&joined)).await.expect("steady");
        let before = c.store().reads();
        c.tick_all().await;
        assert_eq!(c.store().reads() - before, 2, "the member's group: its record and its liveness");
        // A write through this process (a second member joins) ends the deferral at once.
        c.heartbeat(join("b")).await.expect("join b");
        let before = c.store().reads();
        c.tick_all().await;
        assert_eq!(c.store().reads() - before, 2, "the group just written to is ticked at the next pass");
    }
}

/// An idle group whose member heartbeats through this instance costs its ticks no read: each
/// heartbeat restarts the member's liveness window here and confirms the decoded record, so the
/// deferral is renewed from them. When the member falls silent, the group is read a quarter TTL
/// (100 ms here) later, and the member expires a TTL (400 ms) after its last heartbeat.
#[tokio::test]
async fn heartbeats_through_this_instance_keep_an_idle_group_deferred_until_a_member_falls_silent() {
    let store = MemoryStore::new(11);
    let options = CoordinatorOptions {
        instance_id: "c1".into(),
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        ..CoordinatorOptions::default()
    };
    let c = Coordinator::new(held::HeldStore::new(store.connect()), options);
    c.start().await.expect("probe");
    c.admin(AdminRequest::CreateGroup { group: group(), shard_count: 2, config: fast_config() }).await.expect("create");
    let joined = c.heartbeat(join("a")).await.expect("join");
    assert_eq!(joined.status, HeartbeatStatus::Ok);
    c.tick_all().await;
    c.tick_all().await;
    // Two and a half TTLs of steady heartbeats, every 50 ms (the group's interval), a tick after
    // each. A step the machine stretched past the quarter TTL (100 ms) is a silence the tick must
    // read after: such a round proves nothing and is run again (a loaded 2-core machine stretched
    // one in half the runs).
    let mut clean_rounds = 0;
    for _round in 0..5 {
        let before = c.store().reads();
        let mut stretched = false;
        for _ in 0..20 {
            let step = tokio::time::Instant::now();
            c.heartbeat(next(&joined)).await.expect("steady");
            tokio::time::sleep(Duration::from_millis(50)).await;
            c.tick_all().await;
            stretched |= step.elapsed() >= Duration::from_millis(90);
        }
        if !stretched {
            // (A steady heartbeat's touch is not a read: it checks the cached record's stamp.)
            assert_eq!(c.store().reads() - before, 0, "no tick read anything");
            clean_rounds += 1;
            break;
        }
    }
    assert_eq!(clean_rounds, 1, "no round of 20 steps ran within the quarter TTL on this machine");
    let renewed = c.metrics().value("rsc_ticks_deferred_without_read_total", &Vec::new());
    // A renewal defers until the member's expiry as heard (about a TTL away): one per TTL or so.
    assert!(renewed >= 2.0, "deferrals renewed from heartbeats: {renewed}");
    // Silent for a quarter TTL: read again (its heartbeats may go to another instance now); not
    // expired until a TTL after its last heartbeat here.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let before = c.store().reads();
    c.tick_all().await;
    assert_eq!(c.store().reads() - before, 2, "a quarter TTL into the silence: its record and liveness");
    assert_eq!(c.describe(&group()).await.expect("describe").metadata.members.len(), 1, "not expired yet");
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.tick_all().await;
    c.tick_all().await;
    let described = c.describe(&group()).await.expect("describe");
    assert!(described.metadata.members.is_empty(), "silent for its TTL: expired");
}

/// Instances share the ticks of quiet groups through the tick roster: with three instances on one
/// store each quiet group is read by one of them, and when one stops ticking, the others take its
/// groups over once its silence passes (`ticker_silence_ms`). With sharing off every instance reads
/// every group. Deferral is off here (audit 0), so only ownership decides who reads.
#[tokio::test]
async fn quiet_groups_are_ticked_by_one_instance_and_a_silent_ones_groups_are_taken_over() {
    const GROUPS: usize = 30;
    for silence_ms in [200, 0] {
        let store = MemoryStore::new(12);
        let instance = |id: &str| {
            let options = CoordinatorOptions {
                instance_id: id.into(),
                max_assignment_lease_ms: fast_config().assignment_lease_ms,
                idle_group_audit_ms: 0,
                ticker_silence_ms: silence_ms,
                ..CoordinatorOptions::default()
            };
            Coordinator::new(held::HeldStore::new(store.connect()), options)
        };
        let coordinators = [instance("c1"), instance("c2"), instance("c3")];
        for c in &coordinators {
            c.start().await.expect("probe");
        }
        for g in 0..GROUPS {
            let group = GroupId::new("orders", format!("g{g}"));
            coordinators[0]
                .admin(AdminRequest::CreateGroup { group, shard_count: 1, config: fast_config() })
                .await
                .expect("create");
        }
        // Two passes each, a roster read period apart (a quarter of the silence): every instance
        // has read the roster with all three counting.
        for _ in 0..2 {
            for c in &coordinators {
                c.tick_all().await;
            }
            tokio::time::sleep(Duration::from_millis(silence_ms / 4 + 5)).await;
        }
        let pass = |cs: &[&Coordinator<held::HeldStore>]| {
            let cs: Vec<Coordinator<held::HeldStore>> = cs.iter().map(|c| (*c).clone()).collect();
            async move {
                let before: Vec<u64> = cs.iter().map(|c| c.store().reads()).collect();
                for c in &cs {
                    c.tick_all().await;
                }
                cs.iter().zip(before).map(|(c, b)| c.store().reads() - b).collect::<Vec<u64>>()
            }
        };
        let all: Vec<&Coordinator<held::HeldStore>> = coordinators.iter().collect();
        let reads = pass(&all).await;
        if silence_ms == 0 {
            assert_eq!(reads, vec![2 * GROUPS as u64; 3], "no sharing: every instance reads every group");
            continue;
        }
        // Memberless groups: a tick reads the record and the liveness hash (made-up member ids
        // may have left fields there), so reads are twice the groups ticked.
        assert_eq!(reads.iter().sum::<u64>(), 2 * GROUPS as u64, "each group ticked once: {reads:?}");
        // Each group's tick gauges are exported by its owner only (every instance exported every
        // group at its first pass, before it knew the others; the others dropped theirs since).
        let exported: usize = coordinators
            .iter()
            .map(|c| c.metrics().render().lines().filter(|l| l.starts_with("rsc_group_revoking_shards{")).count())
            .sum();
        assert_eq!(exported, GROUPS, "one instance exports each group's gauges");
        assert!(reads.iter().all(|r| *r > 0), "the groups are spread over the instances: {reads:?}");
        // c3 stops ticking (it died): within the silence c1 and c2 still leave its groups to it,
        // after it they take them over.
        let survivors: Vec<&Coordinator<held::HeldStore>> = coordinators[..2].iter().collect();
        let reads = pass(&survivors).await;
        assert!(reads.iter().sum::<u64>() < 2 * GROUPS as u64, "c3's groups wait out its silence: {reads:?}");
        // The roster is read at most every quarter silence: c3 counts dead at the first read a
        // silence after the read that saw its last count.
        let read_period = Duration::from_millis(silence_ms / 4 + 5);
        tokio::time::sleep(read_period).await;
        pass(&survivors).await;
        tokio::time::sleep(Duration::from_millis(silence_ms + 50) + read_period).await;
        pass(&survivors).await;
        let reads = pass(&survivors).await;
        assert_eq!(reads.iter().sum::<u64>(), 2 * GROUPS as u64, "c1 and c2 tick every group now: {reads:?}");
        // A write through an instance that does not own the group: that instance ticks the group
        // at its next passes (it knows a wait may have started; the owner may have deferred it).
        let (c1, c2) = (survivors[0], survivors[1]);
        let busy = (0..GROUPS)
            .map(|g| GroupId::new("orders", format!("g{g}")))
            .find(|g| !c1.owns_tick(g) && c2.owns_tick(g))
            .expect("c2 owns some group");
        let base = pass(&[c1]).await[0];
        let joined = c1.heartbeat(HeartbeatRequest { group: busy.clone(), ..join("a") }).await.expect("join");
        assert_eq!(joined.status, HeartbeatStatus::Ok);
        let after_write = pass(&[c1]).await[0];
        assert_eq!(after_write, base + 2, "c1 also ticks the group it wrote: its record and liveness");
    }
}

/// An instance that begins its shutdown leaves the tick roster at once: the other instances tick
/// its groups from their next roster read. Before, it stayed live in their view for
/// `ticker_silence_ms` after its last pass, and its share of the groups went unticked meanwhile
/// (member expiry, rebalance timeouts), at every restart of a rolling update.
#[tokio::test]
async fn an_instance_shutting_down_hands_its_groups_over_at_the_next_roster_read() {
    const GROUPS: usize = 20;
    let silence_ms = 2_000;
    let store = MemoryStore::new(14);
    let instance = |id: &str| {
        let options = CoordinatorOptions {
            instance_id: id.into(),
            max_assignment_lease_ms: fast_config().assignment_lease_ms,
            idle_group_audit_ms: 0,
            ticker_silence_ms: silence_ms,
            ticker_refresh_ms: 20,
            ..CoordinatorOptions::default()
        };
        Coordinator::new(held::HeldStore::new(store.connect()), options)
    };
    let (c1, c2) = (instance("c1"), instance("c2"));
    for c in [&c1, &c2] {
        c.start().await.expect("probe");
    }
    for g in 0..GROUPS {
        let group = GroupId::new("orders", format!("g{g}"));
        c1.admin(AdminRequest::CreateGroup { group, shard_count: 1, config: fast_config() }).await.expect("create");
    }
    let read_period = Duration::from_millis(silence_ms / 4 + 5);
    for _ in 0..2 {
        c1.tick_all().await;
        c2.tick_all().await;
        tokio::time::sleep(read_period).await;
    }
    let groups: Vec<GroupId> = (0..GROUPS).map(|g| GroupId::new("orders", format!("g{g}"))).collect();
    let owned = groups.iter().filter(|g| c1.owns_tick(g)).count();
    assert!(0 < owned && owned < GROUPS, "the groups are shared: c1 owns {owned}");
    c2.begin_shutdown();
    c2.tick_all().await;
    tokio::time::sleep(read_period).await;
    c1.tick_all().await;
    let owned = groups.iter().filter(|g| c1.owns_tick(g)).count();
    assert_eq!(owned, GROUPS, "c1 ticks every group a roster read after c2 began its shutdown");
}

/// Starts two instances sharing ticks, creates `group()` through the first and lets both read
/// the tick roster twice; returns them as (the group's tick owner, the other).
async fn owner_and_other<'a, S: MetadataStore>(
    c1: &'a Coordinator<S>,
    c2: &'a Coordinator<S>,
) -> (&'a Coordinator<S>, &'a Coordinator<S>) {
    for c in [c1, c2] {
        c.start().await.expect("probe");
    }
    c1.admin(AdminRequest::CreateGroup { group: group(), shard_count: 2, config: fast_config() })
        .await
        .expect("create");
    for _ in 0..2 {
        c1.tick_all().await;
        c2.tick_all().await;
    }
    if c1.owns_tick(&group()) {
        (c1, c2)
    } else {
        (c2, c1)
    }
}

/// Heartbeats a load balancer sends to another instance reach the group's tick owner through the
/// heard relay: the owner renews the idle group's deferral without reading it, as it does for
/// heartbeats through itself. Without the relay it reads the group (record and liveness) every
/// quarter TTL, and so it does when the relaying instance holds another store identity (its
/// blobs were written under another primary, whose counters may repeat values: they are
/// ignored). A member that falls silent still expires, a TTL after its last heartbeat plus the
/// relay's lateness, and only from a read.
#[tokio::test]
async fn heartbeats_through_another_instance_are_relayed_to_the_tick_owner() {
    for (relay_ms, same_identity) in [(20, true), (0, true), (20, false)] {
        let store = MemoryStore::new(14);
        let instance = |id: &str| {
            let options = CoordinatorOptions {
                instance_id: id.into(),
                max_assignment_lease_ms: fast_config().assignment_lease_ms,
                ticker_silence_ms: 2_000,
                heard_relay_ms: relay_ms,
                ..CoordinatorOptions::default()
            };
            Coordinator::new(held::HeldStore::new(store.connect()), options)
        };
        let (c1, c2) = (instance("c1"), instance("c2"));
        if !same_identity {
            let elsewhere = rsc::store::ServerIdentity {
                run_id: "another-run".into(),
                replication_id: "another-replication".into(),
                primaries: Vec::new(),
            };
            c2.store().set_identity(elsewhere);
        }
        let (owner, other) = owner_and_other(&c1, &c2).await;
        assert!(!other.owns_tick(&group()), "one owner");
        // The member joins through the owner, then heartbeats through the other instance only.
        let joined = owner.heartbeat(join("a")).await.expect("join");
        assert_eq!(joined.status, HeartbeatStatus::Ok);
        let round = || async {
            other.heartbeat(next(&joined)).await.expect("steady");
            tokio::time::sleep(Duration::from_millis(50)).await;
            other.tick_all().await;
            owner.tick_all().await;
        };
        for _ in 0..10 {
            round().await;
        }
        let before = owner.store().reads();
        // Two and a half TTLs of steady heartbeats.
        for _ in 0..20 {
            round().await;
        }
        let reads = owner.store().reads() - before;
        let restarted = owner.metrics().value("rsc_heard_relay_windows_restarted_total", &Vec::new());
        let sent = other.metrics().value("rsc_heard_relay_blobs_sent_total", &Vec::new());
        if relay_ms == 0 || !same_identity {
            assert!(reads >= 8, "the owner reads the group every quarter TTL ({reads} reads)");
            assert_eq!(restarted, 0.0, "nothing applied");
            assert_eq!(sent > 0.0, relay_ms > 0, "blobs were sent only with the relay on");
            continue;
        }
        // (A pass delayed by a busy machine past the 100 ms quarter TTL may force one read.)
        assert!(reads <= 2, "the relayed heartbeats kept the group deferred without reading it: {reads} reads");
        assert!(restarted >= 10.0, "windows restarted from relays: {restarted}");
        // Silent now: the owner reads again and expires the member from what it read.
        let silent_at = tokio::time::Instant::now();
        let before = owner.store().reads();
        while !owner.describe(&group()).await.expect("describe").metadata.members.is_empty() {
            assert!(silent_at.elapsed() < Duration::from_millis(1_500), "the silent member expires");
            tokio::time::sleep(Duration::from_millis(25)).await;
            owner.tick_all().await;
        }
        let expired_after = silent_at.elapsed();
        assert!(
            expired_after >= Duration::from_millis(fast_config().member_lease_ttl_ms),
            "not before a TTL of silence: {expired_after:?}"
        );
        assert!(owner.store().reads() > before, "decided from a read");
    }
}

/// A member that joins through an instance that does not tick the group and falls silent at
/// once still expires about a TTL later. The group's owner deferred the group while it had no
/// members, for the audit period (120 s); the instance that wrote the join ticks the group
/// itself only until it finds it idle. Found while building the heard relay: the writer now
/// relays its write's stamp, which ends the owner's deferral, and keeps ticking the group until
/// two stored blobs carried it. Without the relay (`heard_relay_ms = 0`) the member waited for
/// the audit.
#[tokio::test]
async fn a_member_joined_through_a_non_owner_that_falls_silent_at_once_expires_within_its_ttl() {
    let store = MemoryStore::new(15);
    let instance = |id: &str| {
        let options = CoordinatorOptions {
            instance_id: id.into(),
            max_assignment_lease_ms: fast_config().assignment_lease_ms,
            ticker_silence_ms: 2_000,
            heard_relay_ms: 20,
            ..CoordinatorOptions::default()
        };
        Coordinator::new(store.connect(), options)
    };
    let (c1, c2) = (instance("c1"), instance("c2"));
    let (owner, other) = owner_and_other(&c1, &c2).await;
    let joined = other.heartbeat(join("a")).await.expect("join");
    assert_eq!(joined.status, HeartbeatStatus::Ok);
    let silent_at = tokio::time::Instant::now();
    // Watched through the other instance: a read through the owner would refresh its copy.
    while !other.describe(&group()).await.expect("describe").metadata.members.is_empty() {
        let waited = silent_at.elapsed();
        assert!(waited < Duration::from_millis(2_000), "the silent member expires (waited {waited:?})");
        tokio::time::sleep(Duration::from_millis(25)).await;
        other.tick_all().await;
        owner.tick_all().await;
    }
}

/// The ticker reuses its last index read for `ticker_refresh_ms`. A group created through another
/// instance since is missing from that list; a member that joins it through this instance, which
/// neither created nor owns it, and falls silent at once must still expire within its TTL plus
/// the refresh period: the write makes the next pass read the index, instead of the stale list
/// dropping the write's notice (and its relay to the owner, which deferred the group while it was
/// empty). Found by review: before the fix the member waited for the owner's 120 s audit.
#[tokio::test]
async fn a_member_joined_through_an_instance_whose_index_read_predates_the_group_expires() {
    let store = MemoryStore::new(16);
    let instance = |id: &str, refresh_ms: u64| {
        let options = CoordinatorOptions {
            instance_id: id.into(),
            max_assignment_lease_ms: fast_config().assignment_lease_ms,
            ticker_silence_ms: 2_000,
            heard_relay_ms: 20,
            ticker_refresh_ms: refresh_ms,
            ..CoordinatorOptions::default()
        };
        Coordinator::new(store.connect(), options)
    };
    // The joiner reuses its index read for a second; the others read the index every pass.
    let all = [instance("c1", 1_000), instance("c2", 0), instance("c3", 0)];
    for c in &all {
        c.start().await.expect("probe");
    }
    for _ in 0..2 {
        for c in &all {
            c.tick_all().await;
        }
        tokio::time::sleep(Duration::from_millis(2_000 / 4 + 5)).await;
    }
    let joiner = &all[0];
    // A group neither created nor owned by the joiner.
    let (group, owner) = (0..64)
        .map(|i| GroupId::new("orders", format!("g{i}")))
        .find_map(|g| all[1..].iter().find(|c| c.owns_tick(&g)).map(|owner| (g, owner)))
        .expect("a group another instance owns");
    let creator = all[1..].iter().find(|c| c.options().instance_id != owner.options().instance_id).expect("creator");
    joiner.tick_all().await; // its index read, before the group exists
    let create = AdminRequest::CreateGroup { group: group.clone(), shard_count: 2, config: fast_config() };
    creator.admin(create).await.expect("create");
    // Creator and owner find the new group empty and defer it.
    creator.tick_all().await;
    owner.tick_all().await;
    let joined = joiner.heartbeat(HeartbeatRequest { group: group.clone(), ..join("a") }).await.expect("join");
    assert_eq!(joined.status, HeartbeatStatus::Ok);
    let silent_at = tokio::time::Instant::now();
    while !creator.describe(&group).await.expect("describe").metadata.members.is_empty() {
        let waited = silent_at.elapsed();
        assert!(waited < Duration::from_millis(3_000), "the silent member expires (waited {waited:?})");
        tokio::time::sleep(Duration::from_millis(25)).await;
        for c in &all {
            c.tick_all().await;
        }
    }
}

/// A refusal from a stale decoded cache is re-read before it stands. Found by the simulation
/// (`standard` seed 31 once instances shared their ticks): a consumer restarted under the same
/// member id was refused `MEMBER_ID_IN_USE` by an instance whose cache still held the old
/// incarnation long after another instance expired it; a refused heartbeat never touches the
/// store, and that instance no longer ticked the group, so nothing refreshed its cache.
#[tokio::test]
async fn a_refusal_from_a_stale_cache_is_checked_against_the_store() {
    let store = MemoryStore::new(13);
    let instance = |id: &str| {
        let options = CoordinatorOptions {
            instance_id: id.into(),
            max_assignment_lease_ms: fast_config().assignment_lease_ms,
            ..CoordinatorOptions::default()
        };
        Coordinator::new(store.connect(), options)
    };
    let (c1, c2) = (instance("c1"), instance("c2"));
    for c in [&c1, &c2] {
        c.start().await.expect("probe");
    }
    c1.admin(AdminRequest::CreateGroup { group: group(), shard_count: 2, config: fast_config() })
        .await
        .expect("create");
    // The first incarnation joins through c2, which caches the group with its session.
    let first = c2.heartbeat(join("a")).await.expect("join");
    assert_eq!(first.status, HeartbeatStatus::Ok);
    // It dies; c1 expires it (c2 does not tick).
    c1.tick_all().await;
    tokio::time::sleep(Duration::from_millis(fast_config().member_lease_ttl_ms + 100)).await;
    c1.tick_all().await;
    assert!(c1.describe(&group()).await.expect("describe").metadata.members.is_empty(), "expired");
    // A new process with the same member id and another session joins through c2.
    let restarted = HeartbeatRequest { member_session: Some(MemberSession("f".repeat(64))), ..join("a") };
    let answer = c2.heartbeat(restarted).await.expect("the new incarnation is admitted");
    assert_eq!(answer.status, HeartbeatStatus::Ok);
}

/// A member heard through this instance does not hide one whose heartbeats go to another: the
/// group is still read about every quarter TTL (100 ms here), so the other's silence is noticed
/// at most a quarter TTL late. Found by review: renewing the deferral from the heard member's
/// heartbeats alone read the group about once per TTL, and the other member expired up to two
/// TTLs after its last heartbeat.
#[tokio::test]
async fn a_member_heard_here_does_not_hide_one_whose_heartbeats_go_elsewhere() {
    let store = MemoryStore::new(11);
    let options = CoordinatorOptions {
        instance_id: "c1".into(),
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        ..CoordinatorOptions::default()
    };
    let c = Coordinator::new(held::HeldStore::new(store.connect()), options.clone());
    c.start().await.expect("probe");
    let other = Coordinator::new(store.connect(), CoordinatorOptions { instance_id: "c2".into(), ..options });
    other.start().await.expect("probe");
    c.admin(AdminRequest::CreateGroup { group: group(), shard_count: 2, config: fast_config() }).await.expect("create");
    let mut a = c.heartbeat(join("a")).await.expect("join a");
    let mut b = other.heartbeat(join("b")).await.expect("join b");
    for _ in 0..40 {
        a = c.heartbeat(next(&a)).await.expect("a through c1");
        b = other.heartbeat(next(&b)).await.expect("b through c2");
        c.tick_all().await;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Steady: a heartbeats through c1 (which ticks the group), b through c2.
    let before = c.store().reads();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(1_000) {
        a = c.heartbeat(next(&a)).await.expect("a through c1");
        b = other.heartbeat(next(&b)).await.expect("b through c2");
        c.tick_all().await;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let reads = c.store().reads() - before;
    // A quarter TTL is 100 ms: about ten reads of record and liveness in a second (before the fix:
    // about two and a half).
    assert!(reads >= 12, "b is read about every quarter TTL: {reads} reads in 1 s");
}

/// On a Redis Cluster a failover is evidence for the groups whose metadata slot the failed
/// primary served, not for the others: with the store's identity switched to a three-primary
/// cluster whose middle primary is then taken over by its replica (new node, new replication
/// id), the group on that primary records a correction round and the group on another does not.
#[tokio::test]
async fn a_cluster_failover_is_evidence_only_for_the_groups_on_the_failed_primary() {
    let (a, b, c3) = ((0, 5460), (5461, 10922), (10923, 16383));
    let before = cluster_identity(vec![primary("a", "xa", a), primary("b", "xb", b), primary("c", "xc", c3)]);
    let after = cluster_identity(vec![primary("a", "xa", a), primary("d", "xd", b), primary("c", "xc", c3)]);
    let (on_b, elsewhere) = correction_rounds_after(before, after, b).await;
    assert!(on_b, "the group on the failed-over primary records a correction round");
    assert!(!elsewhere, "the group on an unchanged primary records none");
}

/// On a Redis Cluster, a primary that stops answering (crashed before its replica takes over, no
/// replica, frozen, or cut off from the coordinator alone) fails only the groups it holds. Its
/// groups' failures make the identity suspect, and a whole identity read needs every primary:
/// before, every request of every group re-read it and failed `STORE_UNAVAILABLE`, so a bystander
/// group's members lost their leases and nobody was ticked. Now each group asks its own primary:
/// the bystander's heartbeats answer `OK` throughout, its silent member is expired by the ticker
/// (whose index read, on the down primary, falls back to the last list), the down primary's group
/// stays refused (fail closed), and when the primary is back everything answers again.
#[tokio::test]
async fn a_cluster_primary_that_does_not_answer_fails_only_its_own_groups() {
    use rsc::store::keys;
    let (a, b) = ((0, 8191), (8192, 16383));
    let on = |range: (u16, u16), name: &str| {
        (0..)
            .map(|i| GroupId::new("orders", format!("{name}{i}")))
            .find(|g| (range.0..=range.1).contains(&keys::group_slot(g)))
            .expect("a group in the range")
    };
    let (down_group, bystander) = (on(a, "g"), on(b, "h"));
    let store = MemoryStore::new(23);
    let options = CoordinatorOptions {
        instance_id: "c1".into(),
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        ..CoordinatorOptions::default()
    };
    let c = Coordinator::new(held::HeldStore::new(store.connect()), options);
    c.store().set_identity(cluster_identity(vec![primary("a", "xa", a), primary("b", "xb", b)]));
    c.store().set_account(primary("a", "xa", a));
    c.store().set_account(primary("b", "xb", b));
    c.start().await.expect("probe");
    let beat = |g: &GroupId, r: &HeartbeatResponse| HeartbeatRequest { group: g.clone(), ..next(r) };
    let mut joined = std::collections::BTreeMap::new();
    for g in [&down_group, &bystander] {
        let create = AdminRequest::CreateGroup { group: g.clone(), shard_count: 2, config: fast_config() };
        c.admin(create).await.expect("create");
        for m in ["m", "n"] {
            let r = c.heartbeat(HeartbeatRequest { group: g.clone(), ..join(m) }).await.expect("join");
            joined.insert((g.clone(), m), r);
        }
    }
    c.tick_all().await;
    // Primary a stops answering; its group's next heartbeat fails, which makes the identity suspect.
    c.store().primary_down(Some(("a", vec![down_group.clone()])));
    let refused = c.heartbeat(beat(&down_group, &joined[&(down_group.clone(), "m")])).await;
    assert_eq!(refused.expect_err("a is down").code, ErrorCode::StoreUnavailable);
    // The bystander's member m heartbeats on, n falls silent: m keeps answering OK, and the ticker
    // expires n and hands both shards to m.
    let mut m = joined[&(bystander.clone(), "m")].clone();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(1_500) {
        // (OK, or REVOKE_PENDING while it hands shard 1 to n before n falls silent.)
        m = c.heartbeat(beat(&bystander, &m)).await.expect("the bystander answers while a is down");
        c.tick_all().await;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        (m.status, m.assigned.clone()),
        (HeartbeatStatus::Ok, vec![0, 1]),
        "n expired, both shards went to m: {m:?}"
    );
    let described = c.describe(&bystander).await.expect("describe the bystander");
    assert!(!described.metadata.members.contains_key("n"), "n was expired by the ticker");
    // The down primary's group stays refused; back up, it answers again.
    let refused = c.heartbeat(beat(&down_group, &joined[&(down_group.clone(), "m")])).await;
    assert_eq!(refused.expect_err("still down").code, ErrorCode::StoreUnavailable);
    c.store().primary_down(None);
    c.tick_all().await;
    let back = c.heartbeat(HeartbeatRequest { group: down_group.clone(), ..join("o") }).await.expect("a is back");
    assert_eq!(back.status, HeartbeatStatus::Ok);
}

/// The same servers, unchanged, and a claims b's slots too: a migration's handover between two
/// unchanged primaries (the target took the slots, the source has not heard yet), no evidence for
/// anyone. b's replica d, promoted on the far side of a partition, claiming them beside b: d is
/// new, so evidence for the groups in b's slots, and only for them. And with the ids unchanged, b
/// disowning its slots with nobody claiming them: the dispute alone is evidence for those slots.
#[tokio::test]
async fn a_slot_two_primaries_claim_is_evidence_only_for_its_groups_unless_they_hand_it_over() {
    let (a, b, c3) = ((0, 5460), (5461, 10922), (10923, 16383));
    let before = || cluster_identity(vec![primary("a", "xa", a), primary("b", "xb", b), primary("c", "xc", c3)]);
    let handing = rsc::store::PrimaryIdentity { claimed: vec![a, b], ..primary("a", "xa", a) };
    let handover = cluster_identity(vec![handing, primary("b", "xb", b), primary("c", "xc", c3)]);
    assert_eq!((&before().run_id, &before().replication_id), (&handover.run_id, &handover.replication_id));
    assert_eq!(correction_rounds_after(before(), handover, b).await, (false, false), "a handover is no evidence");

    let d = rsc::store::PrimaryIdentity { slots: vec![], claimed: vec![b], ..primary("d", "xd", b) };
    let split = cluster_identity(vec![primary("a", "xa", a), primary("b", "xb", b), primary("c", "xc", c3), d]);
    let (on_b, elsewhere) = correction_rounds_after(before(), split, b).await;
    assert!(on_b, "the group in the slots a new primary claims records a correction round");
    assert!(!elsewhere, "the group in undisputed slots records none");

    let disowning = rsc::store::PrimaryIdentity { claimed: vec![], ..primary("b", "xb", b) };
    let disowned = cluster_identity(vec![primary("a", "xa", a), disowning, primary("c", "xc", c3)]);
    assert_eq!((&before().run_id, &before().replication_id), (&disowned.run_id, &disowned.replication_id));
    assert_eq!(correction_rounds_after(before(), disowned, b).await, (true, false), "a dispute alone is evidence");
}

/// Scaling a Cluster out: a node added serves no slot (an idle master, which the identity lists),
/// then a slot migrates onto it and settles. Each read names other servers, but no slot may have
/// lost a write: no correction round and no identity change counted (the path that counts one
/// also resets every tick deferral, which at 10,000 groups is a pass reading every group). A
/// restart of that node while the slot's keys move onto it is still evidence, for that slot's
/// groups only.
#[tokio::test]
async fn adding_a_node_and_migrating_a_slot_onto_it_is_no_evidence_but_its_restart_mid_migration_is() {
    use rsc::store::PrimaryIdentity;
    let (a, b, c3) = ((0, 5460), (5461, 10922), (10923, 16383));
    let three = || vec![primary("a", "xa", a), primary("b", "xb", b), primary("c", "xc", c3)];
    let idle = PrimaryIdentity { slots: vec![], claimed: vec![], idle: true, ..primary("n", "xn", b) };
    let with = |extra: Vec<PrimaryIdentity>| cluster_identity(three().into_iter().chain(extra).collect());
    let moving = b.0;
    let migrating = |n: PrimaryIdentity| {
        let source = PrimaryIdentity { migrating: vec![(moving, "n".into())], ..primary("b", "xb", b) };
        let n = PrimaryIdentity { importing: vec![(moving, "b".into())], ..n };
        cluster_identity(vec![primary("a", "xa", a), source, primary("c", "xc", c3), n])
    };
    let settled = cluster_identity(vec![
        primary("a", "xa", a),
        PrimaryIdentity { slots: vec![(b.0 + 1, b.1)], claimed: vec![(b.0 + 1, b.1)], ..primary("b", "xb", b) },
        primary("c", "xc", c3),
        PrimaryIdentity { slots: vec![(b.0, b.0)], claimed: vec![(b.0, b.0)], ..primary("n", "xn", b) },
    ]);
    let scale_out = vec![with(vec![idle.clone()]), migrating(idle.clone()), settled];
    let (rounds, changes) = correction_rounds_through(with(vec![]), scale_out, (b.0, b.0)).await;
    assert_eq!((rounds, changes), ((false, false), 0.0), "scaling out is no evidence");

    let restarted = PrimaryIdentity { run_id: "run-n-again".into(), ..idle.clone() };
    let lossy = vec![with(vec![idle.clone()]), migrating(idle), migrating(restarted)];
    let (rounds, changes) = correction_rounds_through(with(vec![]), lossy, (b.0, b.0)).await;
    assert_eq!(rounds, (true, false), "the migrating slot's group records a round, no other");
    assert_eq!(changes, 1.0, "the restart is counted, the node's addition is not");
}

/// A Cluster primary that claims exactly the slots the view lists for it.
fn primary(node: &str, replid: &str, slots: (u16, u16)) -> rsc::store::PrimaryIdentity {
    rsc::store::PrimaryIdentity {
        node: node.into(),
        run_id: format!("run-{node}"),
        replication_id: replid.into(),
        slots: vec![slots],
        claimed: vec![slots],
        handed: Vec::new(),
        migrating: Vec::new(),
        importing: Vec::new(),
        idle: false,
    }
}

fn cluster_identity(primaries: Vec<rsc::store::PrimaryIdentity>) -> rsc::store::ServerIdentity {
    let join = |field: fn(&rsc::store::PrimaryIdentity) -> &str| {
        primaries.iter().map(|p| format!("{}={}", p.node, field(p))).collect::<Vec<_>>().join(",")
    };
    rsc::store::ServerIdentity { run_id: join(|p| &p.run_id), replication_id: join(|p| &p.replication_id), primaries }
}

/// With one group whose metadata slot lies in `range` and one elsewhere, both joined and ticked
/// under the store identity `before`, then ticked under `after`: whether each records a
/// correction round.
async fn correction_rounds_after(
    before: rsc::store::ServerIdentity,
    after: rsc::store::ServerIdentity,
    range: (u16, u16),
) -> (bool, bool) {
    correction_rounds_through(before, vec![after], range).await.0
}

/// [`correction_rounds_after`] through each identity of `then` in turn (ticked twice under each),
/// with the identity changes the coordinator counted.
async fn correction_rounds_through(
    before: rsc::store::ServerIdentity,
    then: Vec<rsc::store::ServerIdentity>,
    range: (u16, u16),
) -> ((bool, bool), f64) {
    use rsc::store::keys;
    let in_range = (0..)
        .map(|i| GroupId::new("orders", format!("g{i}")))
        .find(|g| (range.0..=range.1).contains(&keys::group_slot(g)))
        .expect("a group in the range");
    let elsewhere = (0..)
        .map(|i| GroupId::new("orders", format!("h{i}")))
        .find(|g| !(range.0..=range.1).contains(&keys::group_slot(g)))
        .expect("a group elsewhere");
    let store = MemoryStore::new(21);
    let options = CoordinatorOptions {
        instance_id: "c1".into(),
        max_assignment_lease_ms: fast_config().assignment_lease_ms,
        ..CoordinatorOptions::default()
    };
    let c = Coordinator::new(held::HeldStore::new(store.connect()), options);
    c.store().set_identity(before);
    c.start().await.expect("probe");
    for g in [&in_range, &elsewhere] {
        let create = AdminRequest::CreateGroup { group: g.clone(), shard_count: 2, config: fast_config() };
        c.admin(create).await.expect("create");
        let joined = c.heartbeat(HeartbeatRequest { group: g.clone(), ..join("m") }).await.expect("join");
        assert_eq!(joined.status, HeartbeatStatus::Ok);
    }
    c.tick_all().await;
    for g in [&in_range, &elsewhere] {
        assert!(c.describe(g).await.expect("describe").metadata.correction.is_none(), "{g}: no round yet");
    }
    for after in then {
        c.store().set_identity(after);
        c.tick_all().await;
        c.tick_all().await;
    }
    let mut rounds = Vec::new();
    for g in [&in_range, &elsewhere] {
        rounds.push(c.describe(g).await.expect("describe").metadata.correction.is_some());
    }
    ((rounds[0], rounds[1]), c.metrics().total("rsc_store_identity_changes_total"))
}
