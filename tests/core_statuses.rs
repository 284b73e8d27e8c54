//! Every heartbeat status and error of the pure core, and the admin mutations, with the exact
//! response and the recorded next state.

mod core_support;

use core_support::{beat, group_id, Client, World};
use rsc::core::model::{GroupConfig, MemberState, ShardOwner};
use rsc::core::proof::Fact;
use rsc::core::protocol::{AdminRequest, ErrorCode, HeartbeatStatus, RevokeReport};
use rsc::core::{decide_admin, Context, Creation, LocalView};

#[test]
fn join_of_a_single_member_gets_ok_with_every_shard_and_a_never_reused_epoch() {
    let mut w = World::new(3);
    let mut a = Client::new("a");
    let r = beat(&mut w, &mut a).expect("join");
    assert_eq!(r.status, HeartbeatStatus::Ok);
    assert_eq!((r.assigned, r.pending, r.revoke), (vec![0, 1, 2], vec![], vec![]));
    assert_eq!(r.metadata_version, 2, "create is version 1, the join bumps it");
    assert_eq!(r.member_epoch, r.metadata_version, "epochs are drawn from metadata versions");
    assert_eq!((r.assignment_lease_ms, r.heartbeat_interval_ms), (8_000, 1_000));
    assert_eq!(r.store_revision, w.revision);
}

#[test]
fn steady_heartbeat_that_changes_nothing_writes_nothing() {
    let mut w = World::new(3);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("join");
    let revision = w.revision;
    for _ in 0..3 {
        w.advance(1_000);
        let r = beat(&mut w, &mut a).expect("steady");
        assert_eq!(r.status, HeartbeatStatus::Ok);
    }
    assert_eq!(w.revision, revision, "steady heartbeats never rewrite the aggregate");
}

#[test]
fn unknown_member_with_an_epoch_gets_unknown_member_and_nothing_is_written() {
    let mut w = World::new(3);
    let mut ghost = Client::new("ghost");
    ghost.epoch = 7;
    let revision = w.revision;
    let err = beat(&mut w, &mut ghost).expect_err("unknown");
    assert_eq!(err.code, ErrorCode::UnknownMember);
    assert_eq!(w.revision, revision);
}

#[test]
fn stale_future_and_previous_incarnation_epochs_are_fenced() {
    let mut w = World::new(2);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("join");
    let mut future = a.request();
    future.member_epoch += 1;
    assert_eq!(w.heartbeat(&future).unwrap_err().code, ErrorCode::FencedMemberEpoch);

    let old_incarnation = a.request();
    // The same process joins again after seeing its incarnation (e.g. after FENCED): a new one.
    let mut rejoining = a.clone();
    rejoining.epoch = 0;
    beat(&mut w, &mut rejoining).expect("rejoin as a new incarnation");
    assert!(rejoining.epoch > a.epoch);
    let err = w.heartbeat(&old_incarnation).expect_err("old incarnation");
    assert_eq!(err.code, ErrorCode::FencedMemberEpoch);
}

#[test]
fn a_member_reporting_shards_not_recorded_as_its_own_is_fenced() {
    let mut w = World::new(4);
    let (mut a, mut b) = (Client::new("a"), Client::new("b"));
    beat(&mut w, &mut a).expect("a");
    beat(&mut w, &mut b).expect("b");
    let mut lying = b.request();
    lying.owned = vec![0];
    let err = w.heartbeat(&lying).expect_err("b does not own 0");
    assert_eq!(err.code, ErrorCode::FencedMemberEpoch);
}

#[test]
fn an_older_epoch_of_the_same_incarnation_is_accepted_when_owned_is_a_subset() {
    let mut w = World::new(4);
    let (mut a, mut b) = (Client::new("a"), Client::new("b"));
    beat(&mut w, &mut a).expect("a");
    beat(&mut w, &mut b).expect("b joins, pending 2 and 3");
    let b_before = b.request();
    beat(&mut w, &mut a).expect("drain");
    beat(&mut w, &mut a).expect("REVOKED: 2 and 3 granted to b, b's epoch bumped");
    assert!(w.g.members["b"].member_epoch > b_before.member_epoch);
    let r = w.heartbeat(&b_before).expect("the response with the bump was lost; old epoch still fine");
    assert_eq!((r.status, r.assigned), (HeartbeatStatus::Ok, vec![2, 3]));
}

#[test]
fn malformed_heartbeats_are_bad_requests_and_write_nothing() {
    let mut w = World::new(4);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("join");
    let revision = w.revision;
    let mut dup = a.request();
    dup.owned = vec![1, 1];
    assert_eq!(w.heartbeat(&dup).unwrap_err().code, ErrorCode::BadRequest);
    let mut both = a.request();
    both.revoking = vec![RevokeReport { shard: 0, in_flight: 0, revoked: true, revoke_id: None }];
    assert_eq!(w.heartbeat(&both).unwrap_err().code, ErrorCode::BadRequest, "owned and revoking overlap");
    let mut leave0 = Client::new("x").request();
    leave0.leave = true;
    assert_eq!(w.heartbeat(&leave0).unwrap_err().code, ErrorCode::BadRequest);
    let mut empty = a.request();
    empty.member_id = String::new();
    assert_eq!(w.heartbeat(&empty).unwrap_err().code, ErrorCode::BadRequest);
    let mut huge = a.request();
    huge.owned = vec![u32::MAX];
    assert_eq!(w.heartbeat(&huge).unwrap_err().code, ErrorCode::BadRequest);
    assert_eq!(w.revision, revision, "nothing written by bad input");
}

#[test]
fn in_flight_work_keeps_a_shard_revoking() {
    let mut w = World::new(2);
    let (mut a, mut b) = (Client::new("a"), Client::new("b"));
    beat(&mut w, &mut a).expect("a");
    beat(&mut w, &mut b).expect("b");
    beat(&mut w, &mut a).expect("a learns it must drain 1");
    let mut busy = a.request();
    busy.revoking = vec![RevokeReport { shard: 1, in_flight: 3, revoked: false, revoke_id: None }];
    let r = w.heartbeat(&busy).expect("still draining");
    assert_eq!((r.status, r.revoke), (HeartbeatStatus::RevokePending, vec![1]));
    assert!(matches!(w.g.current.get(&1), Some(ShardOwner::Revoking { .. })));
}

#[test]
fn rebalance_timeout_fences_the_member_and_its_shards_wait_one_lease() {
    let mut w = World::new(2);
    let (mut a, mut b) = (Client::new("a"), Client::new("b"));
    beat(&mut w, &mut a).expect("a");
    beat(&mut w, &mut b).expect("b");
    // a keeps heartbeating but never finishes draining shard 1.
    let mut stuck = a.request();
    stuck.revoking = vec![RevokeReport { shard: 1, in_flight: 1, revoked: false, revoke_id: None }];
    stuck.owned = vec![0];
    let mut fenced_at = None;
    for _ in 0..40 {
        w.advance(1_000);
        w.tick();
        if w.g.members["a"].state == MemberState::Fenced {
            fenced_at = Some(w.now_ms);
            break;
        }
        w.heartbeat(&stuck).expect("a still a member");
        beat(&mut w, &mut b).expect("b stays alive, waiting for shard 1");
    }
    let fenced_at = fenced_at.expect("fenced by the rebalance timeout");
    assert!(fenced_at >= 30_000);
    assert_eq!(w.heartbeat(&stuck).unwrap_err().code, ErrorCode::FencedMemberEpoch);
    assert!(matches!(w.g.current.get(&1), Some(ShardOwner::Fenced { .. })), "not granted at once");
    // b gets shard 0 and 1 only after one assignment lease of observed waiting.
    loop {
        w.advance(1_000);
        w.tick();
        let r = beat(&mut w, &mut b).expect("b");
        if r.assigned == vec![0, 1] {
            assert!(w.now_ms >= fenced_at + 8_000, "granted at {} before a's lease surely ended", w.now_ms);
            break;
        }
        assert!(w.now_ms < fenced_at + 20_000);
    }
}

#[test]
fn clean_leave_releases_at_once_and_unclean_leave_waits_a_lease() {
    let mut w = World::new(2);
    let (mut a, mut b) = (Client::new("a"), Client::new("b"));
    beat(&mut w, &mut a).expect("a");
    beat(&mut w, &mut b).expect("b");
    beat(&mut w, &mut a).expect("drain 1");
    beat(&mut w, &mut a).expect("REVOKED 1");
    beat(&mut w, &mut b).expect("b owns 1");
    // Clean leave: b drained 1 and reports it with the leave.
    let mut leave = b.request();
    leave.owned.clear();
    leave.revoking = vec![RevokeReport { shard: 1, in_flight: 0, revoked: true, revoke_id: None }];
    leave.leave = true;
    let left = w.heartbeat(&leave).expect("left");
    assert_eq!((left.member_epoch, left.assigned.len()), (0, 0));
    assert!(!w.g.members.contains_key("b"));
    // a gets 1 back; a then leaves without draining 0 and 1: they wait a lease.
    assert_eq!(beat(&mut w, &mut a).expect("a").assigned, vec![0, 1]);
    let mut c = Client::new("c");
    beat(&mut w, &mut c).expect("c joins");
    w.heartbeat(&a.leave_request()).expect("a leaves holding shards");
    assert!(matches!(w.g.current.get(&0), Some(ShardOwner::Fenced { .. })));
    w.advance(7_000);
    w.tick();
    assert!(beat(&mut w, &mut c).expect("c").assigned.is_empty(), "not before a's lease ends");
    w.advance(1_500);
    w.tick();
    assert_eq!(beat(&mut w, &mut c).expect("c").assigned, vec![0, 1]);
}

#[test]
fn version_bumps_go_past_every_version_a_client_reported() {
    let mut w = World::new(2);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("a");
    let mut ahead = a.request();
    ahead.metadata_version = 50;
    ahead.metadata_version_proof = w.proof(Fact::MetadataVersion, 50);
    assert_eq!(w.heartbeat(&ahead).expect("sync").status, HeartbeatStatus::SyncMetadata);
    let mut b = Client::new("b");
    let r = beat(&mut w, &mut b).expect("a join bumps the version");
    assert!(r.metadata_version > 50, "never reuse a version a client may hold: got {}", r.metadata_version);
}

#[test]
fn admin_mutations_check_revisions_and_inputs() {
    let mut w = World::new(2);
    let group = group_id();
    let stale = AdminRequest::AddShards { group: group.clone(), expected_revision: 99, new_shard_count: 4 };
    assert_eq!(w.admin(&stale).unwrap_err().code, ErrorCode::RevisionConflict);
    let shrink = AdminRequest::AddShards { group: group.clone(), expected_revision: w.revision, new_shard_count: 1 };
    assert_eq!(w.admin(&shrink).unwrap_err().code, ErrorCode::BadRequest);
    let create = AdminRequest::CreateGroup { group: group.clone(), shard_count: 2, config: GroupConfig::default() };
    assert_eq!(w.admin(&create).unwrap_err().code, ErrorCode::GroupExists);
    let bad = GroupConfig { assignment_lease_ms: 20_000, ..GroupConfig::default() };
    let change = AdminRequest::ChangeConfig { group: group.clone(), expected_revision: w.revision, config: bad };
    assert_eq!(w.admin(&change).unwrap_err().code, ErrorCode::BadRequest, "lease above member TTL");
    // Equal leases leave no room for clock-rate differences: the TTL must be 2% longer.
    let equal = GroupConfig { member_lease_ttl_ms: 8_000, ..GroupConfig::default() };
    assert!(equal.validate().is_err(), "assignment lease == member TTL");
    let margin = GroupConfig { member_lease_ttl_ms: 8_160, ..GroupConfig::default() };
    assert_eq!(margin.validate(), Ok(()), "8,000 ms + 2% = 8,160 ms");
    let short = GroupConfig { member_lease_ttl_ms: 8_159, ..GroupConfig::default() };
    assert!(short.validate().is_err());

    let obs = Default::default();
    let ctx = Context {
        fresh_view_key: None,
        stored_revision: 0,
        observations: &obs,
        planted: Default::default(),
        nonce: 1,
        wall_clock_secs: 0,
    };
    let missing = AdminRequest::DeleteGroup { group: group.clone(), expected_revision: 1 };
    assert_eq!(decide_admin(None, &missing, Creation::Plain, ctx).outcome.unwrap_err().code, ErrorCode::GroupNotFound);

    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("a");
    let version = w.g.metadata_version;
    let add = AdminRequest::AddShards { group: group.clone(), expected_revision: w.revision, new_shard_count: 4 };
    let added = w.admin(&add).expect("add shards");
    assert!(added.metadata_version > version);
    assert_eq!(w.g.resharding.last().map(|r| (r.from_shard_count, r.to_shard_count)), Some((2, 4)));
    assert_eq!(beat(&mut w, &mut a).expect("a").assigned, vec![0, 1, 2, 3], "new shards are granted");
}

#[test]
fn lowering_the_lease_keeps_the_old_one_in_force_for_one_old_lease() {
    let mut w = World::new(2);
    let shorter = GroupConfig { member_lease_ttl_ms: 4_000, assignment_lease_ms: 3_000, ..GroupConfig::default() };
    let change = AdminRequest::ChangeConfig { group: group_id(), expected_revision: w.revision, config: shorter };
    w.admin(&change).expect("change");
    assert_eq!(w.g.effective_assignment_lease_ms(), 8_000);
    assert_eq!(w.g.effective_member_lease_ttl_ms(), 10_000);
    w.tick();
    w.advance(8_000);
    w.tick();
    assert!(w.g.lease_transition.is_some(), "one old lease is not enough: a slower client clock holds it 2% longer");
    w.advance(160);
    w.tick();
    assert!(w.g.lease_transition.is_none(), "over after one old lease plus the clock-rate margin");
    assert_eq!(w.g.effective_assignment_lease_ms(), 3_000);
}

/// A group whose member holds a grant under a lease raised from 8 s to 30 s, then a failover that
/// loses the raise and starts a correction round. `view`: the observations of the process that
/// decides from then on (`None`: the one that saw the raise).
fn lease_increase_lost(view: Option<LocalView>) -> (World, Client) {
    let mut w = World::new(2);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("join");
    let longer = GroupConfig { member_lease_ttl_ms: 40_000, assignment_lease_ms: 30_000, ..w.g.config.clone() };
    let change = AdminRequest::ChangeConfig { group: group_id(), expected_revision: w.revision, config: longer };
    w.admin(&change).expect("raise the lease");
    let granted = beat(&mut w, &mut a).expect("a heartbeat under the longer lease");
    assert_eq!(granted.assignment_lease_ms, 30_000);
    if let Some(view) = view {
        w.view = view;
    }
    w.rollback(1, true);
    assert_eq!(w.g.config.assignment_lease_ms, 8_000, "the increase is lost");
    assert!(w.g.correction.is_some(), "the failover starts a correction round");
    (w, a)
}

/// A lease *increase* the store lost in a rollback: grants made under the longer lease may still
/// run, so the correction round's wait lasts the longest lease this coordinator saw recorded (plus
/// the clock-rate margin), not the shorter one the store went back to.
#[test]
fn a_lease_increase_lost_in_a_rollback_still_governs_the_correction_wait() {
    let (mut w, mut a) = lease_increase_lost(None);
    // Every member syncs at once; only the wait remains.
    beat(&mut w, &mut a).expect("sync");
    w.advance(8_000 * 103 / 100);
    let r = beat(&mut w, &mut a).expect("still waiting");
    assert_ne!(r.status, HeartbeatStatus::Ok, "a grant under the lost 30 s lease may still run");
    w.advance(30_000 * 102 / 100 - 8_000 * 103 / 100 + 1);
    w.tick();
    let r = beat(&mut w, &mut a).expect("after the longest lease");
    assert_eq!(r.status, HeartbeatStatus::Ok, "{r:?}");
}

/// The same lost increase, decided by a process that never saw it (the one that did is gone): only
/// the deployment's lease ceiling bounds the lost lease, so the round waits the ceiling. Without a
/// ceiling (`0`) that process ends the round after the restored 8 s lease while a grant under the
/// lost 30 s lease may still run: the case DESIGN §7 describes, kept here as the control.
#[test]
fn a_lease_increase_no_live_process_saw_is_covered_by_the_lease_ceiling() {
    for (ceiling, covered) in [(30_000, true), (0, false)] {
        // The process that saw the increase dies; a new one (with the deployment's ceiling) decides.
        let (mut w, mut a) = lease_increase_lost(Some(LocalView::with_lease_ceiling(ceiling)));
        beat(&mut w, &mut a).expect("sync");
        w.advance(8_000 * 103 / 100);
        w.tick();
        let r = beat(&mut w, &mut a).expect("after the restored lease");
        assert_eq!(r.status != HeartbeatStatus::Ok, covered, "ceiling {ceiling}: {r:?}");
        if covered {
            w.advance(30_000 * 102 / 100 - 8_000 * 103 / 100 + 1);
            w.tick();
            let r = beat(&mut w, &mut a).expect("after the ceiling");
            assert_eq!(r.status, HeartbeatStatus::Ok, "{r:?}");
        }
    }
}

#[test]
fn a_delete_waits_until_nobody_may_still_read_a_shard() {
    let mut w = World::new(2);
    let group = group_id();
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("a joins and owns both shards");
    let delete = |w: &World| AdminRequest::DeleteGroup { group: group.clone(), expected_revision: w.revision };

    let revision = w.revision;
    let err = w.admin(&delete(&w)).expect_err("a member lives");
    assert_eq!(err.code, ErrorCode::GroupNotEmpty, "{}", err.message);
    assert!(err.code.retryable());
    assert_eq!(w.revision, revision, "a refused delete writes nothing");

    // The member leaves: its shards stay fenced for one assignment lease, since it may still be
    // reading them (a leave is not a report that reading stopped).
    let leave = a.leave_request();
    w.heartbeat(&leave).expect("leave");
    assert!(w.g.members.is_empty());
    assert!(!w.g.current.is_empty(), "the leaver's shards wait for its lease");
    let err = w.admin(&delete(&w)).expect_err("leases still live");
    assert_eq!(err.code, ErrorCode::GroupNotEmpty, "{}", err.message);

    // One full lease later (and the clock-rate margin) a tick frees the shards, and the delete
    // goes through.
    w.advance(w.g.config.assignment_lease_ms * 11 / 10);
    w.tick();
    assert!(w.g.current.is_empty(), "the tick freed the shards: {:?}", w.g.current);
    w.admin(&delete(&w)).expect("an empty group is deleted");
}
