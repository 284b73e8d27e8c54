//! Member sessions (issue #9, DESIGN §9) against the pure core: a heartbeat acts for a member
//! incarnation only with that process's session secret. A forged leave, steady heartbeat or
//! REVOKED report without it is `SESSION_MISMATCH` and records nothing; another process joining a
//! live member's id is `MEMBER_ID_IN_USE` until that incarnation leaves or expires; the same
//! process rejoins at once; records and clients from before sessions keep working.

mod core_support;

use core_support::{beat, config, group_id, session_of, Client, World};
use rsc::core::model::ShardOwner;
use rsc::core::protocol::{ErrorCode, HeartbeatRequest, HeartbeatStatus, MemberSession, RevokeReport};
use rsc::core::{PlantedBug, PlantedBugs};

/// A world where `a` owns every shard of 4 and `b` has just joined (shards moving to it).
fn two_members() -> (World, Client, Client) {
    let mut w = World::new(4);
    let (mut a, mut b) = (Client::new("a"), Client::new("b"));
    beat(&mut w, &mut a).expect("a joins");
    beat(&mut w, &mut b).expect("b joins");
    (w, a, b)
}

/// A's forged leave as an attacker who learned its id, epoch and shards would send it: every
/// shard reported REVOKED, with `session` (none, or another process's).
fn forged_leave(w: &World, victim: &Client, session: Option<MemberSession>) -> HeartbeatRequest {
    let owned: Vec<u32> = w.g.owned_shards(&victim.id);
    HeartbeatRequest {
        metadata_version_proof: None,
        group: group_id(),
        member_id: victim.id.clone(),
        member_epoch: w.g.members[&victim.id].member_epoch,
        metadata_version: w.g.metadata_version,
        assignment_epoch: w.g.assignment_epoch,
        owned: vec![],
        revoking: owned
            .iter()
            .map(|&shard| RevokeReport { shard, in_flight: 0, revoked: true, revoke_id: None })
            .collect(),
        leave: true,
        member_session: session,
        fenced: Vec::new(),
    }
}

#[test]
fn a_forged_leave_without_the_session_is_refused_and_records_nothing() {
    let (mut w, a, _b) = two_members();
    let before = (w.g.clone(), w.revision);
    for session in [None, Some(session_of("mallory"))] {
        let refused = w.heartbeat(&forged_leave(&w, &a, session)).expect_err("refused");
        assert_eq!(refused.code, ErrorCode::SessionMismatch, "{refused:?}");
        assert_eq!((w.g.clone(), w.revision), before, "nothing recorded");
    }
    assert!(w.g.members.contains_key("a"), "the victim is still a member");
}

#[test]
fn the_planted_bug_accepts_the_forged_leave_and_releases_the_victims_shards() {
    let (mut w, a, _b) = two_members();
    w.planted = PlantedBugs::only(PlantedBug::AcceptForgedLeave);
    let owned_before = w.g.owned_shards("a");
    assert!(!owned_before.is_empty());
    w.heartbeat(&forged_leave(&w, &a, None)).expect("the planted bug accepts it");
    assert!(!w.g.members.contains_key("a"), "the victim was removed while it still reads");
}

#[test]
fn a_forged_steady_heartbeat_or_revoked_report_is_session_mismatch() {
    let (mut w, a, _b) = two_members();
    let before = (w.g.clone(), w.revision);
    let mut forged = a.request();
    forged.member_session = Some(session_of("mallory"));
    assert_eq!(w.heartbeat(&forged).expect_err("refused").code, ErrorCode::SessionMismatch);
    forged.member_session = None;
    assert_eq!(w.heartbeat(&forged).expect_err("refused").code, ErrorCode::SessionMismatch);
    assert_eq!((w.g.clone(), w.revision), before);
    // The real member is unaffected.
    assert!(w.heartbeat(&a.request()).is_ok());
}

#[test]
fn another_process_joining_a_live_members_id_waits_until_that_incarnation_expires() {
    let (mut w, mut a, _b) = two_members();
    let mut impostor = Client::new("a");
    impostor.session = session_of("another process");
    let before = (w.g.clone(), w.revision);
    let refused = w.heartbeat(&impostor.request()).expect_err("refused");
    assert_eq!(refused.code, ErrorCode::MemberIdInUse, "{refused:?}");
    assert!(refused.code.retryable());
    assert_eq!((w.g.clone(), w.revision), before, "the live incarnation keeps its epoch and shards");
    assert_eq!(beat(&mut w, &mut a).expect("a keeps working").status, HeartbeatStatus::RevokePending);

    // Once the first process stops heartbeating and its incarnation expires, the id is free.
    w.advance(config().member_lease_ttl_ms + 1);
    w.tick();
    w.advance(config().member_lease_ttl_ms + 1);
    w.tick();
    assert!(!w.g.members.contains_key("a"), "expired");
    let joined = w.heartbeat(&impostor.request()).expect("the id is free again");
    assert!(joined.member_epoch > 0);
}

#[test]
fn the_same_process_rejoins_its_member_id_at_once() {
    let (mut w, mut a, _b) = two_members();
    let incarnation = w.g.members["a"].incarnation_epoch;
    a.epoch = 0; // e.g. after FENCED_MEMBER_EPOCH: same process, same session
    let rejoined = beat(&mut w, &mut a).expect("rejoined");
    assert!(w.g.members["a"].incarnation_epoch > incarnation, "a new incarnation");
    assert_eq!(rejoined.member_epoch, w.g.members["a"].member_epoch);
    // Its previous incarnation's shards are fenced until its lease surely ended.
    assert!(w.g.current.values().any(|o| matches!(o, ShardOwner::Fenced { member, .. } if member == "a")));
}

#[test]
fn members_recorded_without_a_session_and_clients_without_one_keep_working() {
    let mut w = World::new(2);
    let mut old = Client::new("old");
    let mut join = old.request();
    join.member_session = None;
    let r = w.heartbeat(&join).expect("a client without sessions joins");
    old.apply(w.now_ms, w.now_ms, &Ok(r));
    assert_eq!(w.g.members["old"].session, None);
    let mut steady = old.request();
    steady.member_session = None;
    assert!(w.heartbeat(&steady).is_ok(), "no digest recorded: nothing to check");
    // A member recorded with a digest never accepts a heartbeat without its secret, and a
    // member recorded without one gets the digest of its next join.
    let mut new = Client::new("new");
    beat(&mut w, &mut new).expect("joins");
    assert_eq!(w.g.members["new"].session, Some(session_of("new").digest()));
}

#[test]
fn a_malformed_session_is_bad_request() {
    let (mut w, a, _b) = two_members();
    for bad in ["", "abc", "ZZ000000000000000000000000000000", &"a".repeat(129)] {
        let mut req = a.request();
        req.member_session = Some(MemberSession(bad.to_string()));
        assert_eq!(w.heartbeat(&req).expect_err("refused").code, ErrorCode::BadRequest, "{bad:?}");
    }
}

#[test]
fn the_secret_is_never_stored_or_printed() {
    let (w, a, _b) = two_members();
    let stored = serde_json::to_string(&w.g).expect("encode");
    assert!(!stored.contains(&a.session.0), "the record holds only the digest");
    assert!(stored.contains(&a.session.digest().0));
    assert!(!format!("{:?}", a.request()).contains(&a.session.0), "Debug hides the secret");
}

/// A join repeated by the same process that never saw the incarnation it created — a retry after
/// a lost join answer, or a late duplicate from a retrying proxy — is answered with that
/// incarnation's view and records nothing: no new incarnation fences the member's own shards
/// (the liveness hole of duplicated joins).
#[test]
fn a_repeated_join_is_answered_from_the_incarnation_it_created_and_records_nothing() {
    let mut w = World::new(4);
    let mut a = Client::new("a");
    let first_join = a.request();
    let joined = beat(&mut w, &mut a).expect("joins");
    beat(&mut w, &mut a).expect("steady");
    let before = (w.g.clone(), w.revision);
    let repeated = w.heartbeat(&first_join).expect("the repeat is answered");
    assert_eq!(repeated.member_epoch, joined.member_epoch, "the same incarnation");
    assert_eq!(repeated.assigned, w.g.owned_shards("a"));
    assert_eq!((w.g.clone(), w.revision), before, "nothing recorded, no shard fenced");
    assert_eq!(beat(&mut w, &mut a).expect("a keeps working").status, HeartbeatStatus::Ok);
    // Another process's join is still refused, and the same process that saw its incarnation
    // and joins again still gets a new one.
    let mut impostor = first_join.clone();
    impostor.member_session = Some(session_of("another process"));
    assert_eq!(w.heartbeat(&impostor).expect_err("refused").code, ErrorCode::MemberIdInUse);
    a.epoch = 0;
    let rejoined = beat(&mut w, &mut a).expect("rejoined");
    assert!(rejoined.member_epoch > joined.member_epoch);
}

/// A copy of a join delivered after the member it created has left (a retrying proxy, a
/// duplicated request) is refused (`UNKNOWN_MEMBER`) and records nothing. Recorded, it was a
/// member nobody runs: target shards waited on it until its TTL, stalling the rebalance the
/// leave started.
#[test]
fn a_late_copy_of_a_join_after_the_member_left_is_refused_and_records_nothing() {
    let mut w = World::new(4);
    let (mut a, mut b) = (Client::new("a"), Client::new("b"));
    let first_join = a.request();
    beat(&mut w, &mut a).expect("a joins");
    beat(&mut w, &mut b).expect("b joins");
    w.heartbeat(&a.leave_request()).expect("a leaves");
    assert!(!w.g.members.contains_key("a"));
    assert_eq!(w.g.departed.iter().map(|d| d.member.as_str()).collect::<Vec<_>>(), ["a"]);
    let before = (w.g.clone(), w.revision);

    let late = w.heartbeat(&first_join).expect_err("the late copy is refused");
    assert_eq!(late.code, ErrorCode::UnknownMember, "{late:?}");
    assert_eq!((w.g.clone(), w.revision), before, "nothing recorded");
    assert_eq!(w.g.active_members().collect::<Vec<_>>(), ["b"], "b alone is the target of every shard");
}

/// What the refusal must not catch: the process that left and saw its incarnation joins again
/// (naming the version it holds); another process may take the id; and a group written before
/// departures were kept behaves as before.
#[test]
fn the_departed_process_and_other_processes_still_join() {
    let mut w = World::new(4);
    let mut a = Client::new("a");
    let first_join = a.request();
    beat(&mut w, &mut a).expect("a joins");
    w.heartbeat(&a.leave_request()).expect("a leaves");
    let mut again = a.request();
    again.member_epoch = 0;
    let rejoined = w.heartbeat(&again).expect("the process that left joins again");
    assert_eq!(w.g.members["a"].incarnation_epoch, rejoined.member_epoch, "a new incarnation is recorded");
    assert!(w.g.departed.is_empty(), "a live incarnation of the id replaces its departure");
    assert!(w.heartbeat(&first_join).is_ok(), "while a is a member, the copy is a repeat as before");

    let mut w = World::new(4);
    let mut a = Client::new("a");
    let first_join = a.request();
    beat(&mut w, &mut a).expect("a joins");
    w.heartbeat(&a.leave_request()).expect("a leaves");
    let mut other = first_join.clone();
    other.member_session = Some(session_of("a restarted process"));
    assert!(w.heartbeat(&other).is_ok(), "another process takes the id");

    let mut w = World::new(4);
    let mut a = Client::new("a");
    let first_join = a.request();
    beat(&mut w, &mut a).expect("a joins");
    w.heartbeat(&a.leave_request()).expect("a leaves");
    w.g.departed.clear();
    assert!(w.heartbeat(&first_join).is_ok(), "without a recorded departure the copy joins, as before");
}

/// The record keeps the latest `DEPARTURES_MAX` departures, one per member id.
#[test]
fn departures_are_bounded_and_kept_one_per_id() {
    use rsc::core::model::DEPARTURES_MAX;
    let mut w = World::new(4);
    for round in 0..2 {
        for i in 0..DEPARTURES_MAX + 3 {
            let mut c = Client::new(&format!("m{i}"));
            c.session = session_of(&format!("m{i}-{round}"));
            beat(&mut w, &mut c).expect("joins");
            w.heartbeat(&c.leave_request()).expect("leaves");
        }
    }
    let kept: Vec<&str> = w.g.departed.iter().map(|d| d.member.as_str()).collect();
    let expected: Vec<String> = (3..DEPARTURES_MAX + 3).map(|i| format!("m{i}")).collect();
    assert_eq!(kept, expected, "the latest, oldest first, one per id");
    assert!(w.g.departed.iter().all(|d| d.session == session_of(&format!("{}-1", d.member)).digest()));
}
