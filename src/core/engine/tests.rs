//! Routing decisions on a record with no view key (one an older release created and this one has
//! not written, or an older coordinator rewrote during a rolling update): a version report is
//! credited as before proofs, a shard count never (numbers review, finding 1; DESIGN §8).

use super::*;
use crate::core::admin::Creation;
use crate::core::model::GroupId;
use crate::core::protocol::AdminRequest;

/// The key the caller hands a decision on a keyless record (the service draws it from the OS).
fn fresh() -> ViewKey {
    ViewKey::from_bytes([0x5a; 32])
}

fn context(obs: &Observations) -> Context<'_> {
    Context {
        stored_revision: 7,
        observations: obs,
        planted: PlantedBugs::NONE,
        nonce: 11,
        fresh_view_key: Some(fresh()),
        wall_clock_secs: 0,
    }
}

/// A 4-shard group as the previous release left it: created, never written since, no key.
fn keyless() -> GroupMetadata {
    let obs = Observations::default();
    let group = GroupId::new("orders", "billing");
    let create = AdminRequest::CreateGroup { group, shard_count: 4, config: Default::default() };
    let mut g = decide_admin(None, &create, Creation::Plain, context(&obs)).write.next.expect("created");
    g.view_key = None;
    g
}

/// One unauthenticated `GET …/routing?knownShardCount=65536` grew a keyless group to 65,536
/// shards for good; a count one above, repeated, would have walked it up the same way. Neither an
/// unproven count nor one proven under a key the record does not hold (the key of a lost write)
/// is evidence: nothing is written and the answer is the recorded view.
#[test]
fn an_unproven_shard_count_grows_no_keyless_group() {
    let g = keyless();
    let obs = Observations::default();
    let elsewhere = ViewKey::from_bytes([0x11; 32]);
    for count in [5, 8, 65_536] {
        let proof = elsewhere.prove(&g.group, Fact::ShardCount, u64::from(count));
        for report in [
            RoutingReport { known_shard_count: count, ..RoutingReport::NONE },
            RoutingReport { known_shard_count: count, ..RoutingReport::NONE }.proven(None, Some(proof)),
        ] {
            assert!(!heals_lost_add_shards(&g, &report, PlantedBugs::NONE), "{report:?}");
            let decision = decide_routing(&g, report, context(&obs));
            assert_eq!(decision.write, Written::default(), "nothing recorded: {report:?}");
            let answer = decision.outcome.expect("answered with the recorded view");
            assert_eq!((answer.shard_count, answer.stream_keys.len()), (4, 4), "{report:?}");
            assert_eq!((answer.metadata_version, answer.lost_version), (g.metadata_version, None));
            assert_eq!((answer.metadata_version_proof, answer.shard_count_proof), (None, None), "no key: no proofs");
        }
    }
}

/// A version ahead on a keyless record is still credited (at most one correction round, whose
/// write draws the key), but a count riding on the same report grows nothing with it.
#[test]
fn a_keyless_version_report_starts_its_round_and_a_count_beside_it_adds_no_shard() {
    let g = keyless();
    let obs = Observations::default();
    let ahead = g.metadata_version + 3;
    let report = RoutingReport { known_shard_count: 65_536, ..RoutingReport::version(ahead) };
    let decision = decide_routing(&g, report, context(&obs));
    let next = decision.write.next.expect("the credited version is recorded");
    assert!(next.correction.is_some(), "a round starts");
    assert_eq!(next.view_key, Some(fresh()), "its write draws the key");
    assert_eq!((next.shard_count, &next.resharding), (4, &g.resharding), "no shard added");
    assert_eq!(decision.outcome.expect("answered").shard_count, 4);
}
