//! A lost `add-shards` heals from producer reports (issue #14, DESIGN §8), against the pure core:
//! a producer that published with more shards than recorded makes the coordinator add them again,
//! recorded as `recovered-lost-add-shards`, at a version above every version a client reported,
//! so the producer adopts the healed view; the group can turn it off; a count above the bound is
//! `BAD_REQUEST` and writes nothing; and a report at or below the recorded count changes nothing.

mod core_support;

use core_support::{config, group_id, World};
use rsc::core::model::{ReshardReason, SHARD_COUNT_MAX};
use rsc::core::proof::Fact;
use rsc::core::protocol::{AdminRequest, ErrorCode, RoutingReport};
use rsc::core::{GroupConfig, PlantedBug, PlantedBugs};

fn add_shards(w: &mut World, to: u32) {
    let req = AdminRequest::AddShards { group: group_id(), expected_revision: w.revision, new_shard_count: to };
    w.admin(&req).expect("add-shards recorded");
}

/// A world whose `add-shards` 4 → 8 was seen by a producer and then lost (the store rolled back).
/// Returns the version the producer cached.
fn lost_add_shards(w: &mut World) -> u64 {
    add_shards(w, 8);
    let seen = w.routing(0).expect("routing");
    assert_eq!(seen.shard_count, 8);
    w.rollback(1, true);
    assert_eq!(w.g.shard_count, 4, "the add-shards is lost");
    seen.metadata_version
}

#[test]
fn a_producer_that_published_with_lost_shards_makes_the_coordinator_add_them_again() {
    let mut w = World::new(4);
    let cached = lost_add_shards(&mut w);
    let answer = w
        .routing_report(RoutingReport {
            known_shard_count_proof: w.proof(Fact::ShardCount, 8),
            known_version_proof: w.proof(Fact::MetadataVersion, cached),
            known_version: cached,
            known_shard_count: 8,
        })
        .expect("the heal is recorded");

    assert_eq!(answer.shard_count, 8, "{answer:?}");
    assert_eq!(answer.stream_keys.len(), 8);
    assert!(answer.metadata_version > cached, "the healed view is newer than the lost one the producer holds");
    assert_eq!(answer.lost_version, None, "the healed version is above the reported one: nothing is lost any more");
    assert!(answer.accepts_known_shard_count);
    assert_eq!(w.g.shard_count, 8);
    let record = w.g.resharding.last().expect("a resharding record");
    assert_eq!((record.from_shard_count, record.to_shard_count), (4, 8));
    assert_eq!(record.reason, ReshardReason::RecoveredLostAddShards);
    assert_eq!(record.metadata_version, w.g.metadata_version);
    assert!(w.g.correction.is_some(), "the reported version is loss evidence too: a correction round runs");
}

#[test]
fn a_producer_whose_version_was_overtaken_still_heals_its_shards() {
    // After the loss, other writes reused the version numbers before the producer reported: its
    // version is not ahead, but the shard count it published with still is.
    let mut w = World::new(4);
    let cached = lost_add_shards(&mut w);
    while w.g.metadata_version <= cached {
        let to = w.g.shard_count + 1;
        add_shards(&mut w, to);
    }
    let before = w.g.shard_count;
    let answer = w
        .routing_report(RoutingReport {
            known_shard_count_proof: w.proof(Fact::ShardCount, 8),
            known_version_proof: w.proof(Fact::MetadataVersion, cached),
            known_version: cached,
            known_shard_count: 8,
        })
        .expect("routing");
    assert!(before < 8);
    assert_eq!(answer.shard_count, 8);
    assert_eq!(answer.lost_version, None);
}

#[test]
fn healing_turned_off_leaves_the_count_and_only_records_the_version_evidence() {
    let mut w = World::with_config(4, GroupConfig { heal_lost_add_shards: false, ..config() });
    let cached = lost_add_shards(&mut w);
    let answer = w
        .routing_report(RoutingReport {
            known_shard_count_proof: w.proof(Fact::ShardCount, 8),
            known_version_proof: w.proof(Fact::MetadataVersion, cached),
            known_version: cached,
            known_shard_count: 8,
        })
        .expect("routing");
    assert_eq!(answer.shard_count, 4);
    assert_eq!(answer.lost_version, Some(cached), "the producer is still told its view is lost");
    assert_eq!(w.g.shard_count, 4);
}

#[test]
fn the_planted_bug_skips_the_heal() {
    let mut w = World::new(4);
    let cached = lost_add_shards(&mut w);
    w.planted = PlantedBugs::only(PlantedBug::SkipAddShardsHealing);
    let answer = w
        .routing_report(RoutingReport {
            known_shard_count_proof: w.proof(Fact::ShardCount, 8),
            known_version_proof: w.proof(Fact::MetadataVersion, cached),
            known_version: cached,
            known_shard_count: 8,
        })
        .expect("routing");
    assert_eq!(answer.shard_count, 4);
}

#[test]
fn a_count_at_or_below_the_recorded_one_writes_nothing() {
    let mut w = World::new(4);
    let revision = w.revision;
    for known_shard_count in [0, 1, 4] {
        let version = w.g.metadata_version;
        let answer = w
            .routing_report(RoutingReport {
                known_shard_count_proof: None,
                known_version_proof: None,
                known_version: version,
                known_shard_count,
            })
            .expect("read");
        assert_eq!(answer.shard_count, 4);
    }
    assert_eq!(w.revision, revision, "a read writes nothing");
}

#[test]
fn a_count_above_the_bound_is_bad_request_and_writes_nothing() {
    let mut w = World::new(4);
    let revision = w.revision;
    for known_shard_count in [SHARD_COUNT_MAX + 1, u32::MAX] {
        let version = w.g.metadata_version;
        let refused = w
            .routing_report(RoutingReport {
                known_shard_count_proof: None,
                known_version_proof: None,
                known_version: version,
                known_shard_count,
            })
            .expect_err("refused");
        assert_eq!(refused.code, ErrorCode::BadRequest);
        assert!(refused.message.contains("knownShardCount"), "{refused:?}");
    }
    assert_eq!(w.revision, revision);
    assert_eq!(w.g.shard_count, 4);
    // The bound itself is a valid report.
    let answer = w
        .routing_report(RoutingReport {
            known_shard_count_proof: w.proof(Fact::ShardCount, u64::from(SHARD_COUNT_MAX)),
            known_version_proof: None,
            known_version: 0,
            known_shard_count: SHARD_COUNT_MAX,
        })
        .expect("the largest count is valid");
    assert_eq!(answer.shard_count, SHARD_COUNT_MAX);
}

#[test]
fn old_records_without_the_new_fields_decode_with_their_safe_defaults() {
    let w = World::new(4);
    let mut json: serde_json::Value = serde_json::to_value(&w.g).expect("encode");
    json["config"].as_object_mut().expect("config").remove("healLostAddShards");
    let decoded: rsc::core::GroupMetadata = serde_json::from_value(json).expect("an old record decodes");
    assert!(decoded.config.heal_lost_add_shards, "absent means on");
    let record = serde_json::json!({ "fromShardCount": 4, "toShardCount": 8, "metadataVersion": 3 });
    let decoded: rsc::core::model::ReshardRecord = serde_json::from_value(record).expect("an old record decodes");
    assert_eq!(decoded.reason, ReshardReason::Operator);
}
