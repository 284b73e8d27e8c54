//! The seed's priority scenarios that need no network, against the pure core. Each test is a
//! story: arrange members, act (with lost responses, expiry, rollbacks), assert exact responses.

mod core_support;

use core_support::{beat, recorded_revoke_id, Client, World};
use rsc::core::model::{MemberState, ShardOwner, ORPHAN_LIVENESS_MAX};
use rsc::core::proof::Fact;
use rsc::core::protocol::{ErrorCode, HeartbeatStatus, RevokeReport};
use rsc::core::{tick_deferral_ms, PlantedBugs};

/// A owns all 4 shards; B joins and 2, 3 move to B (A must drain them first).
fn rebalancing_world() -> (World, Client, Client) {
    let mut w = World::new(4);
    let (mut a, mut b) = (Client::new("a"), Client::new("b"));
    let joined = beat(&mut w, &mut a).expect("a joins");
    assert_eq!((joined.status, joined.assigned.clone()), (HeartbeatStatus::Ok, vec![0, 1, 2, 3]));
    let b_join = beat(&mut w, &mut b).expect("b joins");
    assert_eq!(b_join.status, HeartbeatStatus::RevokePending);
    assert_eq!((b_join.assigned.clone(), b_join.pending.clone()), (vec![], vec![2, 3]));
    (w, a, b)
}

/// [`rebalancing_world`] once a drained 2 and 3 and b got them, then the release and grant (one
/// write) are lost: the store again says a is draining 2 and 3, and b holds a lost version.
fn handover_then_lost() -> (World, Client, Client) {
    let (mut w, mut a, mut b) = rebalancing_world();
    beat(&mut w, &mut a).expect("drain");
    beat(&mut w, &mut a).expect("REVOKED");
    assert_eq!(beat(&mut w, &mut b).expect("b").assigned, vec![2, 3]);
    w.rollback(1, false);
    (w, a, b)
}

#[test]
fn drain_written_then_response_lost_next_heartbeat_returns_the_same_drain() {
    let (mut w, a, _b) = rebalancing_world();
    let request = a.request();
    let lost = w.heartbeat(&request).expect("drain");
    assert_eq!(lost.status, HeartbeatStatus::RevokePending);
    assert_eq!((lost.assigned.clone(), lost.revoke.clone()), (vec![0, 1], vec![2, 3]));
    w.advance(1_000);
    let again = w.heartbeat(&request).expect("drain again");
    assert_eq!(again, lost, "the drain is a recorded state, repeated verbatim");
}

#[test]
fn revoked_written_then_response_lost_new_owner_gets_the_shard_on_next_heartbeat() {
    let (mut w, mut a, mut b) = rebalancing_world();
    beat(&mut w, &mut a).expect("a learns the drain");
    assert_eq!(a.revoking.iter().copied().collect::<Vec<_>>(), vec![2, 3]);
    let revoked_request = a.request();
    let before = w.revision;
    let _lost = w.heartbeat(&revoked_request).expect("REVOKED recorded");
    assert_eq!(w.revision, before + 1, "the release was written");
    let b_view = beat(&mut w, &mut b).expect("b");
    assert_eq!(
        (b_view.status, b_view.assigned.clone(), b_view.pending.clone()),
        (HeartbeatStatus::Ok, vec![2, 3], vec![])
    );
    // A retries the same REVOKED report: a duplicate ack is ignored, nothing is written.
    let revision = w.revision;
    let retry = w.heartbeat(&revoked_request).expect("duplicate ack");
    assert_eq!(w.revision, revision, "duplicate REVOKED writes nothing");
    assert_eq!((retry.status, retry.assigned, retry.revoke), (HeartbeatStatus::Ok, vec![0, 1], vec![]));
}

#[test]
fn previous_owner_expires_while_draining_new_owner_gets_the_shard_after_expiry() {
    let (mut w, mut a, mut b) = rebalancing_world();
    let a_last_send_ms = w.now_ms;
    beat(&mut w, &mut a).expect("a learns the drain, then goes silent");
    let mut granted_at = None;
    for _ in 0..20 {
        w.advance(1_000);
        w.tick();
        let view = beat(&mut w, &mut b).expect("b keeps heartbeating");
        if view.assigned.contains(&2) {
            granted_at = Some(w.now_ms);
            assert_eq!(view.status, HeartbeatStatus::Ok);
            assert_eq!(view.assigned, vec![0, 1, 2, 3], "a expired: b takes everything");
            break;
        }
        assert_eq!(view.status, HeartbeatStatus::RevokePending, "still blocked by a at {} ms", w.now_ms);
    }
    let granted_at = granted_at.expect("b got the shards once a expired");
    assert!(!w.g.members.contains_key("a"), "a was expired");
    assert!(
        granted_at >= a_last_send_ms + w.g.config.assignment_lease_ms,
        "granted at {granted_at} ms while a's lease (from {a_last_send_ms} ms) could still run"
    );
    assert!(granted_at >= w.g.config.member_lease_ttl_ms, "not before the member lease TTL");
}

#[test]
fn client_at_version_n_store_back_at_n_minus_1_gets_sync_metadata_for_n_minus_1() {
    let (mut w, mut a, mut b) = rebalancing_world();
    beat(&mut w, &mut a).expect("drain");
    beat(&mut w, &mut a).expect("REVOKED");
    let n = a.version;
    assert_eq!(n, w.g.metadata_version);
    w.rollback(1, false); // silent: only the client's report reveals the loss
    let n_minus_1 = w.g.metadata_version;
    assert!(n_minus_1 < n);
    let sync = w.heartbeat(&a.request()).expect("sync");
    assert_eq!(sync.status, HeartbeatStatus::SyncMetadata);
    assert_eq!(sync.metadata_version, n_minus_1, "SYNC carries the store's version, not the client's");
    assert_eq!(w.g.metadata_version, n_minus_1, "starting the round does not bump the version");
    assert!(w.g.correction.is_some(), "the correction round is recorded");
    assert_eq!(w.g.max_client_version_seen, n);
    let _ = &mut b;
}

#[test]
fn sync_metadata_lost_next_high_version_heartbeat_gets_the_same_sync() {
    let (mut w, mut a, _b) = rebalancing_world();
    beat(&mut w, &mut a).expect("drain");
    beat(&mut w, &mut a).expect("REVOKED");
    w.rollback(1, false);
    let request = a.request();
    let first = w.heartbeat(&request).expect("sync");
    let revision = w.revision;
    w.advance(500);
    let second = w.heartbeat(&request).expect("sync again");
    assert_eq!(second, first, "the same recorded SYNC_METADATA");
    assert_eq!(w.revision, revision, "repeating it writes nothing");
}

#[test]
fn sync_then_drain_then_revoke_pending_until_revoked_and_lease_wait_then_ok() {
    let (mut w, mut a, mut b) = handover_then_lost();
    assert!(matches!(w.g.current.get(&2), Some(ShardOwner::Revoking { member, .. }) if member == "a"));
    let evidence_at = w.now_ms;

    let sync = beat(&mut w, &mut a).expect("a: sync");
    assert_eq!(
        (sync.status, sync.assigned.clone(), sync.revoke.clone()),
        (HeartbeatStatus::SyncMetadata, vec![0, 1], vec![2, 3])
    );
    let sync_b = beat(&mut w, &mut b).expect("b: sync");
    assert_eq!(sync_b.status, HeartbeatStatus::SyncMetadata);
    assert!(b.reads_at(w.now_ms).is_empty(), "b keeps only shards the store says it owns");

    let mut statuses = Vec::new();
    loop {
        w.advance(1_000);
        w.tick();
        let ra = beat(&mut w, &mut a).expect("a");
        let rb = beat(&mut w, &mut b).expect("b");
        statuses.push((ra.status, rb.status));
        if ra.status == HeartbeatStatus::Ok && rb.status == HeartbeatStatus::Ok {
            assert_eq!((ra.assigned, rb.assigned), (vec![0, 1], vec![2, 3]));
            break;
        }
        assert_ne!(rb.status, HeartbeatStatus::Ok, "no OK before the round ends");
        assert!(w.now_ms < evidence_at + 20_000, "the round must end: {statuses:?}");
    }
    assert!(
        w.now_ms >= evidence_at + w.g.config.assignment_lease_ms,
        "OK only after one full assignment lease since the evidence"
    );
    assert!(statuses.iter().all(|(a, _)| *a != HeartbeatStatus::SyncMetadata), "a synced at once: {statuses:?}");
    assert_eq!(statuses[0].0, HeartbeatStatus::RevokePending);
    assert!(w.g.metadata_version > w.g.max_client_version_seen, "the next bump went past the lost versions");
}

#[test]
fn concurrent_stale_revokes_in_a_correction_round_are_accepted_only_when_they_match_recorded_ownership() {
    let mut w = World::new(6);
    let (mut a, mut b, mut c) = (Client::new("a"), Client::new("b"), Client::new("c"));
    beat(&mut w, &mut a).expect("a joins with everything");
    beat(&mut w, &mut b).expect("b joins");
    beat(&mut w, &mut c).expect("c joins");
    // Record the loss evidence: a report from a client ahead of the store.
    let mut ahead = a.request();
    ahead.metadata_version = w.g.metadata_version + 5;
    ahead.metadata_version_proof = w.proof(Fact::MetadataVersion, ahead.metadata_version);
    w.heartbeat(&ahead).expect("sync");
    assert!(w.g.correction.is_some());
    let revoking_a: Vec<u32> = w.g.revoking_shards("a");
    let owned_a: Vec<u32> = w.g.owned_shards("a");
    assert!(!revoking_a.is_empty() && !owned_a.is_empty());

    // a acks one shard it really drains and one it still owns; c acks a's shard and its own nothing.
    let mut stale_a = a.request();
    stale_a.revoking = vec![
        RevokeReport {
            shard: revoking_a[0],
            in_flight: 0,
            revoked: true,
            revoke_id: recorded_revoke_id(&w.g, revoking_a[0]),
        },
        RevokeReport { shard: owned_a[0], in_flight: 0, revoked: true, revoke_id: None },
    ];
    stale_a.owned.retain(|s| *s != owned_a[0] && *s != revoking_a[0]);
    let mut stale_c = c.request();
    stale_c.revoking = vec![RevokeReport { shard: revoking_a[1], in_flight: 0, revoked: true, revoke_id: None }];
    w.heartbeat(&stale_a).expect("a acks");
    w.heartbeat(&stale_c).expect("c acks");

    assert!(
        !matches!(w.g.current.get(&revoking_a[0]), Some(ShardOwner::Revoking { member, .. }) if member == "a"),
        "a's matching ack released the shard"
    );
    assert!(
        matches!(w.g.current.get(&owned_a[0]), Some(ShardOwner::Owned { member, .. }) if member == "a"),
        "an ack for a shard a owns and keeps is ignored"
    );
    assert!(
        matches!(w.g.current.get(&revoking_a[1]), Some(ShardOwner::Revoking { member, .. }) if member == "a"),
        "c cannot release a's shard"
    );
    let _ = (&mut b, &mut c);
}

/// Found by the simulation (swarm seed 1027): a round whose lease wait had passed ended in the very
/// write that recorded new evidence, so the reporting client got OK right after it.
#[test]
fn new_evidence_during_a_round_whose_wait_is_over_restarts_the_wait() {
    let (mut w, mut a, mut b) = rebalancing_world();
    beat(&mut w, &mut a).expect("drain");
    beat(&mut w, &mut a).expect("REVOKED");
    w.rollback(1, true); // failover: a round starts at once
    for _ in 0..2 {
        beat(&mut w, &mut a).expect("a syncs");
        beat(&mut w, &mut b).expect("b syncs");
    }
    let round = w.g.correction.clone().expect("round active");
    assert!(round.synced_members.contains("a") && round.synced_members.contains("b"));
    // The lease wait passes with no decision in between (no tick, no heartbeat) ...
    w.advance(w.g.config.assignment_lease_ms + 1_000);
    // ... and the first decision is new evidence: a synced member reports a version the store
    // lost meanwhile.
    let mut ahead = a.request();
    ahead.metadata_version = w.g.metadata_version + 3;
    ahead.metadata_version_proof = w.proof(Fact::MetadataVersion, ahead.metadata_version);
    let evidence_at = w.now_ms;
    let sync = w.heartbeat(&ahead).expect("sync");
    assert_eq!(sync.status, HeartbeatStatus::SyncMetadata);
    a.apply(w.now_ms, evidence_at, &Ok(sync));
    assert!(w.g.correction.is_some(), "new evidence keeps the round open");
    let mut ok_at = None;
    for _ in 0..40 {
        w.advance(500);
        w.tick();
        let ra = beat(&mut w, &mut a).expect("a");
        beat(&mut w, &mut b).expect("b");
        if ra.status == HeartbeatStatus::Ok {
            ok_at = Some(w.now_ms);
            break;
        }
    }
    let ok_at = ok_at.expect("the round ends");
    assert!(ok_at >= evidence_at + w.g.config.assignment_lease_ms, "OK at {ok_at} ms, evidence at {evidence_at} ms");
}

/// The review's split (issue: "a REVOKED report is not tied to the revoke it answers"): a is told to
/// drain 2 and 3, and its REVOKED report is held up (a paused coordinator, a retrying proxy). The
/// revoke is cancelled (b leaves), a reads 2 and 3 again, then c joins and they are revoked again
/// while a still has entries in flight. The old report arrives now. Returns whether it released
/// shard 3, and who holds it afterwards.
fn stale_revoked_after_a_cancelled_revoke(planted: rsc::core::PlantedBugs) -> (bool, Option<ShardOwner>) {
    let (mut w, mut a, b) = rebalancing_world();
    w.planted = planted;
    beat(&mut w, &mut a).expect("a learns the drain");
    let stale = a.request();
    assert_eq!(stale.revoking.iter().filter(|r| r.revoked && r.revoke_id.is_some()).count(), 2);

    let left = w.heartbeat(&b.leave_request()).expect("b leaves before it got anything");
    assert_eq!(left.member_epoch, 0);
    let back = beat(&mut w, &mut a).expect("the revoke is cancelled");
    assert_eq!((back.assigned.clone(), back.revoke.clone()), (vec![0, 1, 2, 3], vec![]));
    let mut c = Client::new("c");
    beat(&mut w, &mut c).expect("c joins");
    let again = beat(&mut w, &mut a).expect("a must drain 2 and 3 again");
    assert_eq!(again.revoke, vec![2, 3]);
    let old_ids: Vec<_> = stale.revoking.iter().map(|r| r.revoke_id).collect();
    let new_ids: Vec<_> = again.drains.iter().map(|d| Some(d.revoke_id)).collect();
    assert_ne!(old_ids, new_ids, "a new revoke is a new instruction");

    // a still has entries in flight on 3 (its current report says so); the old report arrives.
    let before = w.g.current.get(&3).cloned();
    assert!(matches!(before, Some(ShardOwner::Revoking { ref member, .. }) if member == "a"));
    let _ = w.heartbeat(&stale);
    let after = w.g.current.get(&3).cloned();
    (after != before, after)
}

#[test]
fn a_revoked_report_for_an_earlier_revoke_never_releases_a_later_one() {
    let (released, owner) = stale_revoked_after_a_cancelled_revoke(rsc::core::PlantedBugs::NONE);
    assert!(!released, "the stale report released shard 3: {owner:?}");
}

/// The planted bug (release on any REVOKED from the drainer) reproduces the split: the test above
/// fails on the code before revoke ids.
#[test]
fn accepting_stale_revoked_reports_releases_the_later_revoke() {
    let planted = rsc::core::PlantedBugs::only(rsc::core::PlantedBug::AcceptStaleRevoked);
    let (released, owner) = stale_revoked_after_a_cancelled_revoke(planted);
    assert!(released, "{owner:?}");
    assert!(matches!(owner, Some(ShardOwner::Owned { member, .. }) if member == "c"), "granted to c at once");
}

/// A REVOKED report that names no revoke (a client that predates revoke ids) releases nothing; the
/// shard waits for the rebalance timeout instead (slow, never unsafe).
#[test]
fn a_revoked_report_naming_no_revoke_releases_nothing() {
    let (mut w, mut a, _b) = rebalancing_world();
    beat(&mut w, &mut a).expect("a learns the drain");
    let mut old_client = a.request();
    for report in &mut old_client.revoking {
        report.revoke_id = None;
    }
    w.heartbeat(&old_client).expect("answered");
    assert_eq!(w.g.revoking_shards("a"), vec![2, 3]);
    beat(&mut w, &mut a).expect("a names the revokes");
    assert!(w.g.revoking_shards("a").is_empty());
}

/// The tick deferral of an idle group (`tick_deferral_ms`): it ends a quarter TTL after this
/// process last learnt anything of a member — from a read, a quarter TTL from now; from the
/// member's own heartbeat here (`heard`), a quarter TTL after that heartbeat — and no later than
/// the member's expiry as observed.
#[test]
fn a_tick_deferral_ends_a_quarter_ttl_after_the_last_news_of_a_member() {
    let mut w = World::new(2);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("a joins");
    beat(&mut w, &mut a).expect("a owns every shard");
    w.tick();
    let ttl = w.g.effective_member_lease_ttl_ms();
    let deferral = |w: &mut World, liveness: Option<&std::collections::BTreeMap<String, u64>>| {
        let obs = w.view.observe(w.now_ms, &w.g, liveness);
        tick_deferral_ms(&w.g, &obs, PlantedBugs::NONE)
    };
    let read = w.liveness.clone();
    assert_eq!(deferral(&mut w, Some(&read)), Some(ttl / 4), "known by a read just now");
    let counter = w.liveness["a"];
    w.view.note_heartbeat(w.now_ms, &w.g, "a", counter);
    w.advance(ttl / 10);
    assert_eq!(deferral(&mut w, None), Some(ttl / 4 - ttl / 10), "a quarter TTL after the heartbeat heard");
    // Silent past a quarter TTL: a read of the same value; from then on a quarter TTL from each
    // read, and never past the expiry (a TTL after the heartbeat heard).
    w.advance(ttl / 4);
    assert_eq!(deferral(&mut w, Some(&read)), Some(ttl / 4));
    w.advance(ttl / 2);
    assert_eq!(deferral(&mut w, Some(&read)), Some(ttl - ttl / 10 - ttl / 4 - ttl / 2), "its expiry comes first");
    w.advance(ttl);
    assert_eq!(deferral(&mut w, None), None, "silent for its TTL: due now");
}

/// Hostile review L3: a client that never adopts the version a correction round answers (a forger
/// with a client token, or a broken client) kept every shard of the group in the round for good,
/// since the round ends only when every active member has synced. It is now fenced a rebalance
/// timeout after the round began, as a member that does not release a revoked shard is; the
/// honest members then get OK.
#[test]
fn a_member_that_never_syncs_is_fenced_a_rebalance_timeout_into_the_round() {
    let (mut w, mut a, b) = handover_then_lost();
    let seen_by_b = b.version;
    beat(&mut w, &mut a).expect("a: sync");
    let round_at = w.now_ms;
    assert!(w.g.correction.is_some(), "a round");
    let timeout = w.g.config.rebalance_timeout_ms;
    // b keeps reporting the version it held, whatever it is answered.
    let mut stubborn = b.request();
    loop {
        w.advance(1_000);
        w.tick();
        beat(&mut w, &mut a).expect("a");
        stubborn.metadata_version = seen_by_b;
        let answer = w.heartbeat(&stubborn);
        if w.now_ms < round_at + timeout {
            let answer = answer.expect("b is still a member");
            assert_eq!(answer.status, HeartbeatStatus::SyncMetadata, "b never syncs");
            assert!(w.g.correction.is_some(), "so the round holds");
        } else {
            break;
        }
    }
    w.advance(1_000);
    w.tick();
    assert_eq!(w.g.members.get("b").map(|m| m.state.clone()), Some(MemberState::Fenced), "fenced past the timeout");
    let mut ok = None;
    for _ in 0..20 {
        w.advance(1_000);
        w.tick();
        let answer = beat(&mut w, &mut a).expect("a");
        if answer.status == HeartbeatStatus::Ok {
            ok = Some(answer);
            break;
        }
    }
    assert_eq!(ok.expect("the round ended").assigned, vec![0, 1, 2, 3], "a gets every shard");
}

/// Second review of the L3 fix: a member that joined during the round was unsynced until its own
/// heartbeat matched the version, so joins of fresh ids that never heartbeat again (a forger with
/// a token joining one every few seconds, or a consumer crash-looping at startup) kept the round
/// open for good, each expiring as the next arrived. A join during a round now counts as synced;
/// one naming a version ahead is answered SYNC_METADATA and stays unsynced, so such joiners are
/// fenced once the round is a sync timeout old, and the round ends all the same.
fn ghosts_joining_every_3_s(ghost_version_ahead: bool) -> (u64, u64, rsc::core::model::GroupConfig) {
    let (mut w, mut a, mut b) = handover_then_lost();
    beat(&mut w, &mut a).expect("a: sync");
    beat(&mut w, &mut b).expect("b: sync");
    let round_at = w.now_ms;
    assert!(w.g.correction.is_some(), "a round");
    let mut joined = 0;
    let ended = loop {
        if (w.now_ms - round_at) % 3_000 == 0 {
            let ghost = Client::new(&format!("ghost-{joined}"));
            let mut req = ghost.request();
            if ghost_version_ahead {
                req.metadata_version = w.g.metadata_version + 1_000;
            }
            let answer = w.heartbeat(&req).expect("a fresh id joins");
            if let Some(round) = &w.g.correction {
                assert_eq!(round.synced_members.contains(&ghost.id), !ghost_version_ahead, "{:?}", answer.status);
            }
            joined += 1;
        }
        w.advance(1_000);
        w.tick();
        let ra = beat(&mut w, &mut a).expect("a");
        let rb = beat(&mut w, &mut b).expect("b");
        if w.g.correction.is_none() && ra.status == HeartbeatStatus::Ok && rb.status == HeartbeatStatus::Ok {
            break w.now_ms - round_at;
        }
        assert!(w.now_ms < round_at + 90_000, "the round must end while fresh ids keep joining");
    };
    (ended, joined, w.g.config.clone())
}

#[test]
fn joins_that_never_heartbeat_again_do_not_hold_a_round() {
    let (ended, joined, config) = ghosts_joining_every_3_s(false);
    assert!(ended >= config.assignment_lease_ms, "not before the round's lease wait ({ended} ms)");
    assert!(ended < config.rebalance_timeout_ms, "and without fencing anyone ({ended} ms)");
    assert!(joined >= 2, "ids joined during the round: {joined}");
    let (ended, joined, config) = ghosts_joining_every_3_s(true);
    assert!(ended >= config.rebalance_timeout_ms, "joiners naming a version ahead wait for the sync timeout");
    assert!(joined >= 10, "ids joined during the round: {joined}");
}

/// Hostile review: every heartbeat touches its member's liveness field before it is decided, so
/// heartbeats of made-up member ids (answered UNKNOWN_MEMBER) left one field each for good, and
/// every tick reads the whole hash. A tick now removes such fields once they pass
/// `ORPHAN_LIVENESS_MAX`; a few (a refused join's) are left alone, and no member's field is touched.
#[test]
fn a_tick_removes_the_liveness_fields_of_made_up_members_past_a_bound() {
    let mut w = World::new(2);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("a joins");
    let mut forged = a.request();
    for i in 0..ORPHAN_LIVENESS_MAX {
        forged.member_id = format!("nobody-{i}");
        let refused = w.heartbeat(&forged).expect_err("not a member");
        assert_eq!(refused.code, ErrorCode::UnknownMember);
    }
    assert_eq!(w.liveness.len(), ORPHAN_LIVENESS_MAX + 1, "each left its field");
    let revision = w.revision;
    w.tick();
    assert_eq!((w.revision, w.liveness.len()), (revision, ORPHAN_LIVENESS_MAX + 1), "up to the bound: no write");
    forged.member_id = "one-too-many".into();
    w.heartbeat(&forged).expect_err("not a member");
    w.tick();
    assert_eq!(w.revision, revision + 1, "past it, the tick writes");
    assert_eq!(w.liveness.keys().collect::<Vec<_>>(), vec!["a"], "and only a's field is left");
    assert_eq!(w.history[w.history.len() - 2].0, w.g, "the record is rewritten unchanged");
    assert_eq!(beat(&mut w, &mut a).expect("a").status, HeartbeatStatus::Ok);
}
