//! Client numbers are bounded and every counter step is checked (DESIGN.md, "Client numbers are
//! bounded at the edge"), against the pure core: a version, epoch or revision above
//! `CLIENT_NUMBER_MAX` is `BAD_REQUEST` and records nothing; the largest valid report leaves the
//! group working with every number it hands out still echoable; a counter that cannot step is a
//! typed refusal that writes nothing, never a panic or a wrap; and a record poisoned by an
//! unbounded report before these checks existed heals at its next version bump.

mod core_support;

use core_support::{beat, group_id, Client, World};
use rsc::core::model::{
    CorrectionRound, LossEvidence, CLIENT_NUMBER_MAX, CLIENT_VERSION_AHEAD_MAX, PROVEN_VERSION_AHEAD_MAX,
};
use rsc::core::proof::Fact;
use rsc::core::protocol::{AdminRequest, ErrorCode, HeartbeatResponse, HeartbeatStatus, RoutingReport};
use rsc::core::{decide_heartbeat, decide_routing, Context, GroupConfig, Observations, PlantedBugs};

/// Numbers just above the bound and at the top of `u64`.
const ABOVE: [u64; 3] = [CLIENT_NUMBER_MAX + 1, u64::MAX - 1, u64::MAX];

/// Asserts every number of a heartbeat answer can be sent back by a client.
fn assert_echoable(r: &HeartbeatResponse) {
    for (name, value) in [
        ("memberEpoch", r.member_epoch),
        ("metadataVersion", r.metadata_version),
        ("assignmentEpoch", r.assignment_epoch),
    ] {
        assert!(value <= CLIENT_NUMBER_MAX, "{name} {value} handed out above the client bound: {r:?}");
    }
}

#[test]
fn heartbeat_numbers_above_the_client_bound_are_bad_request_and_write_nothing() {
    let mut w = World::new(2);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("a joins");
    for value in ABOVE {
        for field in ["memberEpoch", "metadataVersion", "assignmentEpoch"] {
            for mut req in [Client::new("b").request(), a.request()] {
                match field {
                    "memberEpoch" => req.member_epoch = value,
                    "metadataVersion" => req.metadata_version = value,
                    _ => req.assignment_epoch = value,
                }
                let before = (w.g.clone(), w.revision);
                let refused = w.heartbeat(&req).expect_err("refused");
                assert_eq!(refused.code, ErrorCode::BadRequest, "{field} = {value}: {refused:?}");
                assert!(refused.message.contains(field), "the message names the field: {refused:?}");
                assert_eq!((w.g.clone(), w.revision), before, "{field} = {value} recorded something");
            }
        }
    }
    assert_eq!(beat(&mut w, &mut a).expect("a is undisturbed").status, HeartbeatStatus::Ok);
    let joined = beat(&mut w, &mut Client::new("c")).expect("a later join works");
    assert_echoable(&joined);
}

#[test]
fn a_routing_report_above_the_client_bound_is_bad_request_and_writes_nothing() {
    let mut w = World::new(2);
    beat(&mut w, &mut Client::new("a")).expect("a joins");
    for value in ABOVE {
        let before = (w.g.clone(), w.revision);
        let refused = w.routing(value).expect_err("refused");
        assert_eq!(refused.code, ErrorCode::BadRequest, "knownVersion = {value}: {refused:?}");
        assert!(refused.message.contains("knownVersion"), "{refused:?}");
        assert_eq!((w.g.clone(), w.revision), before, "knownVersion = {value} recorded something");
    }
}

/// The largest valid report is loss evidence like any other, but it is credited at most
/// `PROVEN_VERSION_AHEAD_MAX` above the stored version (it is proven; an unproven one would be
/// credited `CLIENT_VERSION_AHEAD_MAX`): the version space cannot be used up by one request, and
/// every later version, epoch and assignment epoch stays echoable.
#[test]
fn the_largest_valid_report_leaves_the_group_working_and_every_number_echoable() {
    let mut w = World::new(2);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("a joins");
    let stored = w.g.metadata_version;
    let top = RoutingReport::version(CLIENT_NUMBER_MAX).proven(w.proof(Fact::MetadataVersion, CLIENT_NUMBER_MAX), None);
    let told = w.routing_report(top).expect("a valid report");
    assert_eq!(told.lost_version, Some(CLIENT_NUMBER_MAX), "the producer is told its version was lost");
    assert!(w.g.correction.is_some(), "recorded as loss evidence");
    assert_eq!(w.g.max_client_version_seen, stored + PROVEN_VERSION_AHEAD_MAX, "credited up to the cap");

    let mut b = Client::new("b");
    for _ in 0..15 {
        w.advance(1_000);
        w.tick();
        for client in [&mut a, &mut b] {
            let r = beat(&mut w, client).unwrap_or_else(|e| panic!("{} refused: {e:?}", client.id));
            assert_echoable(&r);
        }
    }
    assert_eq!(beat(&mut w, &mut a).expect("a").status, HeartbeatStatus::Ok);
    assert_eq!(beat(&mut w, &mut b).expect("b").status, HeartbeatStatus::Ok);
    assert!(w.g.metadata_version > w.g.max_client_version_seen, "the bump went past the credited report");
    assert!(w.g.metadata_version <= CLIENT_NUMBER_MAX);
}

/// Swarm 6068: every create starts its versions past the clock (2^16 a second), so a recreate 42 s
/// after the first create started 2.77 M higher; a failover lost it and the first history came
/// back. A producer's report of the lost recreate's version is proven by the record's key (the
/// recreate kept it): it is credited whole, and the next bump goes past it. An unproven report (a
/// keyless record credits anything) is still credited only `CLIENT_VERSION_AHEAD_MAX` ahead.
#[test]
fn a_proven_report_millions_ahead_is_credited_whole_and_an_unproven_one_only_up_to_the_cap() {
    let mut w = World::new(2);
    beat(&mut w, &mut Client::new("a")).expect("a joins");
    let stored = w.g.metadata_version;
    let lost = stored + 42 * 65_536;
    assert!(lost > stored + CLIENT_VERSION_AHEAD_MAX);
    let report = RoutingReport::version(lost).proven(w.proof(Fact::MetadataVersion, lost), None);
    assert_eq!(w.routing_report(report).expect("a valid report").lost_version, Some(lost));
    assert_eq!(w.g.max_client_version_seen, lost, "credited whole");
    let joined = beat(&mut w, &mut Client::new("b")).expect("b joins");
    assert!(joined.metadata_version > lost, "the next bump goes past the proven report: {}", joined.metadata_version);

    let mut keyless = World::new(2);
    keyless.g.view_key = None;
    beat(&mut keyless, &mut Client::new("a")).expect("a joins");
    let stored = keyless.g.metadata_version;
    keyless.routing(stored + 42 * 65_536).expect("answered");
    assert!(keyless.g.correction.is_some(), "a keyless group credits the report");
    assert_eq!(keyless.g.max_client_version_seen, stored + CLIENT_VERSION_AHEAD_MAX, "but only up to the cap");
}

#[test]
fn admin_expected_revisions_above_the_client_bound_are_bad_request() {
    let mut w = World::new(2);
    for value in ABOVE {
        let requests = [
            AdminRequest::AddShards { group: group_id(), expected_revision: value, new_shard_count: 4 },
            AdminRequest::ChangeConfig { group: group_id(), expected_revision: value, config: GroupConfig::default() },
            AdminRequest::DeleteGroup { group: group_id(), expected_revision: value },
        ];
        for req in requests {
            let before = (w.g.clone(), w.revision);
            let refused = w.admin(&req).expect_err("refused");
            assert_eq!(refused.code, ErrorCode::BadRequest, "{req:?}: {refused:?}");
            assert!(refused.message.contains("expectedRevision"), "{refused:?}");
            assert_eq!((w.g.clone(), w.revision), before);
        }
    }
}

#[test]
fn a_version_bump_past_the_client_bound_is_refused_and_writes_nothing() {
    let mut w = World::new(2);
    w.g.metadata_version = CLIENT_NUMBER_MAX;
    let revision = w.revision;
    let refused = beat(&mut w, &mut Client::new("a")).expect_err("no version left to hand out");
    assert_eq!(refused.code, ErrorCode::Internal, "{refused:?}");
    assert!(refused.message.contains("metadataVersion"), "{refused:?}");
    assert_eq!(w.revision, revision, "nothing written");
}

#[test]
fn an_assignment_epoch_step_past_the_client_bound_is_refused_and_writes_nothing() {
    let mut w = World::new(2);
    w.g.assignment_epoch = CLIENT_NUMBER_MAX;
    let revision = w.revision;
    let refused = beat(&mut w, &mut Client::new("a")).expect_err("the join retargets");
    assert_eq!(refused.code, ErrorCode::Internal, "{refused:?}");
    assert!(refused.message.contains("assignmentEpoch"), "{refused:?}");
    assert_eq!(w.revision, revision, "nothing written");
}

#[test]
fn wait_id_exhaustion_is_refused_and_writes_nothing() {
    let mut w = World::new(2);
    beat(&mut w, &mut Client::new("a")).expect("a owns both shards");
    w.g.next_wait_id = u64::MAX;
    let revision = w.revision;
    let refused = beat(&mut w, &mut Client::new("b")).expect_err("revoking from a needs a wait");
    assert_eq!(refused.code, ErrorCode::Internal, "{refused:?}");
    assert!(refused.message.contains("wait"), "{refused:?}");
    assert_eq!(w.revision, revision, "nothing written");
}

#[test]
fn a_stored_revision_at_the_top_refuses_writes_and_still_answers_reads() {
    let mut w = World::new(2);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("a joins");
    let obs = Observations::default();
    let ctx = Context {
        fresh_view_key: None,
        wall_clock_secs: 0,
        stored_revision: u64::MAX,
        observations: &obs,
        planted: PlantedBugs::NONE,
        nonce: 1,
    };

    let join = decide_heartbeat(&w.g, &Client::new("b").request(), ctx);
    assert_eq!(join.outcome.as_ref().map_err(|e| e.code), Err(ErrorCode::Internal), "{join:?}");
    assert!(join.write.next.is_none(), "nothing to write");
    let steady = decide_heartbeat(&w.g, &a.request(), ctx);
    assert_eq!(steady.outcome.map(|r| (r.status, r.store_revision)), Ok((HeartbeatStatus::Ok, u64::MAX)));

    let next = w.g.metadata_version + 1;
    let ahead =
        decide_routing(&w.g, RoutingReport::version(next).proven(w.proof(Fact::MetadataVersion, next), None), ctx);
    assert_eq!(ahead.outcome.map_err(|e| e.code), Err(ErrorCode::Internal));
    assert!(ahead.write.next.is_none());
    let read = decide_routing(&w.g, RoutingReport::version(w.g.metadata_version), ctx);
    assert_eq!(read.outcome.map(|r| r.store_revision), Ok(u64::MAX));
}

/// Before the bounds existed, one routing request could record `maxClientVersionSeen` =
/// `u64::MAX` (with a correction round); every later bump then failed. Such a record heals: the
/// next bump credits the report only up to the (proven) cap, and the group goes on.
#[test]
fn a_record_poisoned_by_an_unbounded_report_heals_at_the_next_bump() {
    let mut w = World::new(2);
    let mut a = Client::new("a");
    beat(&mut w, &mut a).expect("a joins");
    let stored = w.g.metadata_version;
    let wait = w.g.next_wait_id;
    w.g.next_wait_id += 1;
    w.g.max_client_version_seen = u64::MAX;
    w.g.correction = Some(CorrectionRound {
        reason: LossEvidence::ClientVersionAhead { reported: u64::MAX, stored },
        wait,
        synced_members: Default::default(),
        unverified_lineage: false,
        proven_version: 0,
    });
    w.g.validate().expect("the poisoned record is still a readable record");

    let joined = beat(&mut w, &mut Client::new("b")).expect("a join works again");
    assert_echoable(&joined);
    assert_eq!(joined.metadata_version, stored + PROVEN_VERSION_AHEAD_MAX + 1);
    assert_eq!(w.g.max_client_version_seen, stored + PROVEN_VERSION_AHEAD_MAX, "the poison is gone");
    let add = AdminRequest::AddShards { group: group_id(), expected_revision: w.revision, new_shard_count: 4 };
    let added = w.admin(&add).expect("add-shards works again");
    assert_eq!(added.metadata_version, joined.metadata_version + 1);
}
