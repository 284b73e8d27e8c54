//! Signed views (DESIGN §8), against the pure core: a client's report of a number above the
//! recorded state is evidence of lost writes only with the proof the group's key gave of it. A
//! black-box review grew a 4-shard group to 65,536 shards with one routing request, and kept a
//! group ~90% stalled with forged "version ahead" reports from a heartbeat of an unknown member
//! and from routing requests; here each of those changes nothing, while the honest reports of a
//! real lost history (proofs from before the rollback) still heal and still start a round.

mod core_support;

use core_support::{beat, group_id, test_view_key, Client, World};
use rsc::core::model::{LossEvidence, CLIENT_NUMBER_MAX};
use rsc::core::proof::{Fact, ViewKey};
use rsc::core::protocol::{AdminRequest, AdminResponse, ErrorCode, HeartbeatStatus, RoutingReport};
use rsc::core::{decide_admin, Context, Creation, Decision, Observations, PlantedBug, PlantedBugs};
use std::collections::BTreeSet;

/// A report of `version` and `count` with proofs under a key that is not the group's.
fn forged(version: u64, count: u32) -> RoutingReport {
    let other = ViewKey::from_bytes([0x11; 32]);
    RoutingReport {
        known_version: version,
        known_shard_count: count,
        known_version_proof: Some(other.prove(&group_id(), Fact::MetadataVersion, version)),
        known_shard_count_proof: Some(other.prove(&group_id(), Fact::ShardCount, u64::from(count))),
    }
}

#[test]
fn a_routing_report_of_65536_shards_without_a_valid_proof_changes_nothing() {
    let mut w = World::new(4);
    let (before, revision) = (w.g.clone(), w.revision);
    let stored = w.g.metadata_version;
    for report in [
        RoutingReport { known_shard_count: 65_536, ..RoutingReport::NONE },
        forged(0, 65_536),
        // A proof of another number: the group's own proof of its real count.
        RoutingReport { known_shard_count: 65_536, ..RoutingReport::NONE }.proven(None, w.proof(Fact::ShardCount, 4)),
    ] {
        let answer = w.routing_report(report).expect("answered");
        assert_eq!(answer.shard_count, 4, "{report:?}");
        assert_eq!(answer.metadata_version, stored);
    }
    assert_eq!((w.g.clone(), w.revision), (before, revision), "nothing recorded");
}

#[test]
fn a_version_ahead_without_a_valid_proof_starts_no_round_from_any_request() {
    let mut w = World::new(2);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("a joins");
    assert_eq!(beat(&mut w, &mut a).expect("a").status, HeartbeatStatus::Ok);
    let (before, revision) = (w.g.clone(), w.revision);
    let ahead = w.g.metadata_version + 1;

    // Routing, unproven and forged: answered as lost (an echo of the claim), nothing recorded.
    for report in [RoutingReport::version(ahead), forged(ahead, 0)] {
        let answer = w.routing_report(report).expect("answered");
        assert_eq!(answer.lost_version, Some(ahead));
    }
    // A heartbeat of an unknown member with an epoch: refused, nothing recorded.
    let mut ghost = Client::new("ghost");
    ghost.epoch = 3;
    ghost.version = ahead;
    assert_eq!(w.heartbeat(&ghost.request()).unwrap_err().code, ErrorCode::UnknownMember);
    let seen_before = before.max_client_version_seen;
    assert_eq!((w.g.clone(), w.revision), (before, revision), "nothing recorded");

    // A member's own heartbeat naming a version ahead with a proof of its real version: told to
    // sync (it adopts the recorded view), but no round starts and the others keep OK.
    let mut lying = a.request();
    lying.metadata_version = ahead;
    let answer = w.heartbeat(&lying).expect("answered");
    assert_eq!(answer.status, HeartbeatStatus::SyncMetadata);
    assert!(w.g.correction.is_none(), "no round: {:?}", w.g.correction);
    assert_eq!(w.g.max_client_version_seen, seen_before, "not credited");
    // A join naming a version ahead: joins, no round.
    let mut joiner = Client::new("b");
    joiner.version = ahead;
    let joined = beat(&mut w, &mut joiner).expect("b joins");
    assert_eq!(joined.status, HeartbeatStatus::SyncMetadata);
    assert!(w.g.correction.is_none(), "no round after the join either");
}

#[test]
fn a_client_of_the_lost_history_still_proves_its_version_and_starts_the_round() {
    let mut w = World::new(2);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("a joins");
    let mut b = Client::new("b");
    beat(&mut w, &mut b).expect("b joins");
    let lost = b.version;
    assert!(b.proof.is_some(), "every answer of a keyed group proves its version");
    // The store loses b's join; b still holds the answer, and its proof.
    w.rollback(1, false);
    assert!(w.g.metadata_version < lost);
    let answer = w.heartbeat(&b.request()).unwrap_err();
    assert_eq!(answer.code, ErrorCode::UnknownMember, "b's join is gone");
    match &w.g.correction {
        Some(round) => {
            assert!(matches!(round.reason, LossEvidence::ClientVersionAhead { reported, .. } if reported == lost))
        }
        None => panic!("the proven report of a lost version starts a round"),
    }
    assert_eq!(w.g.max_client_version_seen, lost);
}

#[test]
fn the_key_is_drawn_at_create_kept_across_writes_and_never_answered() {
    let mut w = World::new(2);
    assert_eq!(w.g.view_key, Some(test_view_key()));
    let mut a = Client::new("a");
    for _ in 0..3 {
        beat(&mut w, &mut a).expect("a");
    }
    let add = AdminRequest::AddShards { group: group_id(), expected_revision: w.revision, new_shard_count: 3 };
    w.admin(&add).expect("added");
    assert_eq!(w.g.view_key, Some(test_view_key()), "no write changes the key");
    let answer = serde_json::to_string(&beat(&mut w, &mut a).expect("a")).expect("encode");
    let routing = serde_json::to_string(&w.routing(0).expect("routing")).expect("encode");
    let key = serde_json::to_value(test_view_key()).expect("encode");
    let key = key.as_str().expect("hex");
    assert!(!answer.contains(key) && !routing.contains(key), "the key is in no answer");
    assert!(answer.contains("metadataVersionProof") && routing.contains("shardCountProof"));
}

#[test]
fn a_group_an_older_release_wrote_credits_reports_until_its_first_write_draws_a_key() {
    let mut w = World::new(2);
    w.g.view_key = None;
    let mut a = Client::new("a");
    let joined = beat(&mut w, &mut a).expect("a joins");
    assert_eq!(w.g.view_key, None, "the test world draws no key for later writes");
    assert_eq!(joined.metadata_version_proof, None, "a keyless group proves nothing");
    let quiet = w.g.clone();

    // The service hands a fresh key to any decision on a keyless group; a write keeps it.
    let key = ViewKey::from_bytes([0x77; 32]);
    let add = AdminRequest::AddShards { group: group_id(), expected_revision: w.revision, new_shard_count: 3 };
    let obs = Observations::default();
    let ctx = |revision| Context {
        stored_revision: revision,
        observations: &obs,
        planted: PlantedBugs::NONE,
        nonce: 9,
        fresh_view_key: Some(key),
        wall_clock_secs: 0,
    };
    let decision = decide_admin(Some(&quiet), &add, Creation::Plain, ctx(w.revision));
    assert_eq!(decision.write.next.expect("a write").view_key, Some(key));

    // The compatibility rule's safe case: without a key, a report is credited as before.
    let ahead = w.g.metadata_version + 1;
    w.routing(ahead).expect("answered");
    assert!(w.g.correction.is_some(), "credited: a keyless group cannot tell a forged report");
}

/// Hostile review H1: a keyless group credited every report until its first write *outside* a
/// round, so a forger naming a new version before each round ended kept it in correction rounds
/// for good. Now the write that starts the round draws the key: the forger's next report is
/// unproven and the round ends one lease after it began.
#[test]
fn a_forger_starts_at_most_one_round_in_a_keyless_group() {
    let mut w = World::new(2);
    w.fresh_view_key = Some(ViewKey::from_bytes([0x66; 32]));
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("a joins");
    w.g.view_key = None;
    let stored = w.g.metadata_version;
    w.routing(stored + 1).expect("answered");
    let round = w.g.correction.clone().expect("credited: a keyless group cannot tell a forged report");
    assert_eq!(w.g.view_key, w.fresh_view_key, "the round's first write drew the key");
    for forged in 2..50 {
        w.routing_report(RoutingReport { known_shard_count: 9, ..RoutingReport::version(stored + forged) })
            .expect("answered");
    }
    assert_eq!(w.g.correction, Some(round), "the forged reports restarted nothing");
    assert_eq!((w.g.shard_count, w.g.max_client_version_seen), (2, stored + 1), "and recorded nothing");
}

#[test]
fn a_group_recreated_after_its_record_was_lost_keeps_the_lost_key_when_the_caller_remembers_it() {
    let obs = Observations::default();
    let ctx = Context {
        stored_revision: 0,
        observations: &obs,
        planted: PlantedBugs::NONE,
        nonce: 3,
        fresh_view_key: Some(ViewKey::from_bytes([0x33; 32])),
        wall_clock_secs: 0,
    };
    let create = AdminRequest::CreateGroup { group: group_id(), shard_count: 2, config: Default::default() };
    let fresh = decide_admin(None, &create, Creation::Plain, ctx).write.next.expect("created");
    assert_eq!(fresh.view_key, ctx.fresh_view_key, "a create draws a key");
    assert!(fresh.correction.is_none());

    let lost = ViewKey::from_bytes([0x44; 32]);
    let kept = decide_admin(None, &create, Creation::Recreate { lost_key: Some(lost) }, ctx);
    let kept = kept.write.next.expect("recreated");
    assert_eq!(kept.view_key, Some(lost), "the lost record's key: its history's proofs still verify");
    assert!(kept.correction.is_some(), "a recreate starts a round");
    // A report proven under the lost key is evidence; the same number made up is not.
    let mut w = World::new(2);
    w.g = kept.clone();
    let ahead = w.g.metadata_version + 5;
    let forged = RoutingReport { known_shard_count: 9, ..RoutingReport::version(ahead) };
    w.routing_report(forged).expect("answered");
    assert_eq!((w.g.shard_count, w.g.max_client_version_seen), (2, kept.max_client_version_seen), "unproven");
    let proven =
        RoutingReport::version(ahead).proven(Some(lost.prove(&group_id(), Fact::MetadataVersion, ahead)), None);
    w.routing_report(proven).expect("answered");
    assert_eq!(w.g.max_client_version_seen, ahead, "proven under the lost key: credited");

    let unknown = decide_admin(None, &create, Creation::Recreate { lost_key: None }, ctx);
    let unknown = unknown.write.next.expect("recreated");
    assert_eq!(unknown.view_key, ctx.fresh_view_key, "no key known: a fresh one");
    assert!(unknown.correction.as_ref().is_some_and(|round| round.unverified_lineage));
}

/// A world holding a 2-shard group recreated by a process that knew no key of the lost record;
/// the recreate drew `fresh`.
fn recreated_knowing_no_key(fresh: ViewKey) -> World {
    let obs = Observations::default();
    let ctx = Context {
        stored_revision: 0,
        observations: &obs,
        planted: PlantedBugs::NONE,
        nonce: 3,
        fresh_view_key: Some(fresh),
        wall_clock_secs: 0,
    };
    let create = AdminRequest::CreateGroup { group: group_id(), shard_count: 2, config: Default::default() };
    let recreated = decide_admin(None, &create, Creation::Recreate { lost_key: None }, ctx).write.next.expect("made");
    let mut w = World::new(2);
    w.g = recreated;
    w
}

/// Swarm seeds 5058, 5234 and 5235 of a fresh sweep: every coordinator restarted before an
/// operator recreated a group whose record was lost, so nobody knew its key; the recreate was
/// keyless and credited a forger's shard count (and would have restarted its round at every new
/// forged version). Now the lost history's versions are learned, so none is issued again, and
/// nothing unproven restarts the round or grows the group.
#[test]
fn a_recreate_that_knows_no_key_learns_the_lost_versions_and_credits_nothing_else() {
    let fresh = ViewKey::from_bytes([0x55; 32]);
    let mut w = recreated_knowing_no_key(fresh);
    w.fresh_view_key = Some(ViewKey::from_bytes([0x56; 32]));
    let round = w.g.correction.clone().expect("a recreate starts a round");
    let lost = ViewKey::from_bytes([0x44; 32]);
    let lost_version = w.g.metadata_version + 40;
    let lost_proof = lost.prove(&group_id(), Fact::MetadataVersion, lost_version);
    w.routing_report(RoutingReport::version(lost_version).proven(Some(lost_proof), None)).expect("answered");
    assert_eq!(w.g.max_client_version_seen, lost_version, "learned: later bumps go past it");
    assert_eq!(w.g.correction, Some(round.clone()), "but the round's wait did not restart");
    w.routing_report(forged(lost_version + 10, 9)).expect("answered");
    assert_eq!(w.g.shard_count, 2, "a shard count nobody can prove grows nothing");
    assert_eq!(w.g.correction, Some(round), "a higher made-up version restarts nothing either");
    assert_eq!(w.g.view_key, Some(fresh), "the key stays the recreate's");

    // A version proven under the recreate's own key is this lineage's: it is credited as ever
    // (a rollback of this round's own writes), and the round stays one that learns.
    let own = w.g.metadata_version + 100;
    let proof = fresh.prove(&group_id(), Fact::MetadataVersion, own);
    w.routing_report(RoutingReport::version(own).proven(Some(proof), None)).expect("answered");
    let restarted = w.g.correction.clone().expect("a round");
    assert!(matches!(restarted.reason, LossEvidence::ClientVersionAhead { .. }) && restarted.unverified_lineage);

    // When the round ends, every version is above everything learned.
    let mut a = Client::new("a");
    for _ in 0..200 {
        if w.g.correction.is_none() {
            break;
        }
        beat(&mut w, &mut a).expect("answered");
        w.advance(1_000);
    }
    assert!(w.g.correction.is_none(), "the round ended");
    assert!(w.g.metadata_version > own, "{} is above the learned {own}", w.g.metadata_version);
}

/// Hostile review M1 of the learning round: a learned version sat in `max_client_version_seen`,
/// so a proven report at or below it (a rollback of this lineage's own writes, whose leases the
/// round must wait out again) looked already reported and restarted nothing.
#[test]
fn a_learned_version_hides_no_proven_report_from_the_round() {
    let fresh = ViewKey::from_bytes([0x57; 32]);
    let mut w = recreated_knowing_no_key(fresh);
    let round = w.g.correction.clone().expect("a recreate starts a round");
    let learned = w.g.metadata_version + 50;
    w.routing_report(forged(learned, 2)).expect("answered");
    assert_eq!((w.g.max_client_version_seen, &w.g.correction), (learned, &Some(round.clone())), "learned only");

    let own = w.g.metadata_version + 3;
    let proof = fresh.prove(&group_id(), Fact::MetadataVersion, own);
    let proven = RoutingReport::version(own).proven(Some(proof), None);
    w.routing_report(proven).expect("answered");
    let restarted = w.g.correction.clone().expect("a round");
    assert_ne!(restarted.wait, round.wait, "a proven report below the learned version restarts the wait");
    assert!(restarted.unverified_lineage, "and the round still learns");
    assert_eq!((restarted.proven_version, w.g.max_client_version_seen), (own, learned));

    // A repeat of that report is one the round is already waiting out.
    w.routing_report(proven).expect("answered");
    assert_eq!(w.g.correction, Some(restarted), "a repeat restarts nothing");
}

/// Swarm seed 5278 of a fresh sweep: a silent rollback took the record and its index entry, and
/// every coordinator restarted, so the runbook's create was a plain one (nothing can tell that
/// from a group that never existed) and issued version 2 again to a consumer still holding the
/// lost version 2. Versions now start past the clock's seconds, with random low bits.
#[test]
fn creates_start_their_versions_past_the_clock() {
    let first = |wall_clock_secs: u64, nonce: u64| {
        let made = create_with(Creation::Plain, wall_clock_secs, nonce);
        let g = made.write.next.expect("created");
        assert_eq!(made.outcome.expect("answered").metadata_version, g.metadata_version);
        g.validate().expect("a valid record");
        g.metadata_version
    };
    let now = 1_796_000_000;
    let same_second: BTreeSet<u64> = (0..64u64).map(|i| first(now, i << 48)).collect();
    assert_eq!(same_second.len(), 64, "creates in one second differ by their random bits");
    let earlier = first(now, u64::MAX);
    assert!(first(now + 1, 0) > earlier, "a create a second later starts above any of that second");
    assert!(
        first(now + 60, 0) > earlier + 59 * 65_536,
        "above 65,536 × (60 − 1) versions issued from a create 60 s earlier"
    );
    assert_eq!(first(0, 0), 1, "no clock, no randomness: 1");
    assert_eq!(
        CLIENT_NUMBER_MAX - first(u64::MAX, u64::MAX),
        (1 << 52) - 1,
        "the clock is capped: 2^52 versions remain"
    );
}

/// Hostile review (stop 34): coordinator processes time waits by (group, wait id), and one that
/// did not see a delete and a create through another instance kept timing the old incarnation's
/// waits. Every create counting from wait 1 made the new incarnation's first wait look long
/// observed. Wait ids now start at a random point per create (and still only go up within it).
#[test]
fn creates_start_their_wait_ids_at_random_points() {
    let first_wait = |creation: Creation, nonce: u64| {
        let mut g = create_with(creation, 1_796_000_000, nonce).write.next.expect("created");
        g.validate().expect("a valid record");
        g.allocate_wait(nonce).expect("a wait id")
    };
    let plain: BTreeSet<u64> =
        (1..=64u64).map(|i| first_wait(Creation::Plain, i.wrapping_mul(0x9E37_79B9_7F4A_7C15))).collect();
    assert_eq!(plain.len(), 64, "creates with different randomness start their waits apart");
    assert!(!plain.contains(&1), "no create counts from 1 (only the one whose random bits are all 0)");
    assert_eq!(first_wait(Creation::Plain, 0), 1);
    assert!(first_wait(Creation::Plain, u64::MAX) <= (1 << 48) + 1, "48 random bits, plus one");
    assert!(
        CLIENT_NUMBER_MAX - first_wait(Creation::Plain, u64::MAX) > (1 << 52),
        "room for 2^52 waits below the largest number a client may send"
    );
    // A recreate's correction round takes the first of its randomly placed ids.
    let recreate = |nonce| {
        let creation = Creation::Recreate { lost_key: None };
        let g = create_with(creation, 1_796_000_000, nonce).write.next.expect("created");
        g.correction.expect("a recreate starts a round").wait
    };
    assert_ne!(recreate(7 << 20), recreate(9 << 20));
}

/// The decision on creating a 2-shard group (`creation`) on a process whose wall clock reads
/// `wall_clock_secs`, with the decision randomness `nonce` and a fresh view key.
fn create_with(creation: Creation, wall_clock_secs: u64, nonce: u64) -> Decision<AdminResponse> {
    let obs = Observations::default();
    let create = AdminRequest::CreateGroup { group: group_id(), shard_count: 2, config: Default::default() };
    let ctx = Context {
        stored_revision: 0,
        observations: &obs,
        planted: PlantedBugs::NONE,
        nonce,
        fresh_view_key: Some(ViewKey::from_bytes([0x61; 32])),
        wall_clock_secs,
    };
    decide_admin(None, &create, creation, ctx)
}

/// Hostile review L3: when the OS gives no randomness for the key, a plain create is refused
/// rather than making a keyless group that would credit every report; a recreate that knows no
/// key is refused the same way. One that keeps a remembered key needs no randomness.
#[test]
fn a_plain_create_without_a_fresh_key_is_refused_and_writes_nothing() {
    let obs = Observations::default();
    let ctx = Context {
        stored_revision: 0,
        observations: &obs,
        planted: PlantedBugs::NONE,
        nonce: 3,
        fresh_view_key: None,
        wall_clock_secs: 0,
    };
    let create = AdminRequest::CreateGroup { group: group_id(), shard_count: 2, config: Default::default() };
    let refused = decide_admin(None, &create, Creation::Plain, ctx);
    assert_eq!(refused.outcome.expect_err("refused").code, ErrorCode::Internal);
    assert!(refused.write.next.is_none(), "nothing written");
    let unknown = decide_admin(None, &create, Creation::Recreate { lost_key: None }, ctx);
    assert_eq!(unknown.outcome.expect_err("refused").code, ErrorCode::Internal);
    assert!(unknown.write.next.is_none(), "nothing written");
    let lost = Some(ViewKey::from_bytes([0x44; 32]));
    let kept = decide_admin(None, &create, Creation::Recreate { lost_key: lost }, ctx);
    assert!(kept.write.next.is_some_and(|g| g.view_key == lost && g.correction.is_some()));
}

#[test]
fn the_planted_bug_credits_unproven_reports() {
    let mut w = World::new(4);
    w.planted = PlantedBugs::only(PlantedBug::CreditUnprovenReports);
    let answer = w.routing_report(RoutingReport { known_shard_count: 64, ..RoutingReport::NONE }).expect("answered");
    assert_eq!(answer.shard_count, 64, "grown by a report nobody proved");
    w.routing(w.g.metadata_version + 1).expect("answered");
    assert!(w.g.correction.is_some(), "a round from a report nobody proved");
}
