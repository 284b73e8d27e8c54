//! Numbers review, finding 1, through the coordinator: a group whose record has no view key (the
//! previous release created it and nothing has written it since, or an older coordinator rewrote
//! it during a rolling update) grew to 65,536 shards, for good, from one unauthenticated routing
//! request. A keyless record now credits no shard count (DESIGN §8, "Keyless records heal no
//! shard count"): the report is answered with the recorded view and counted, and a lost
//! `add-shards` of such a group is restored by the operator's `add-shards`.

use rsc::core::protocol::RoutingResponse;

use super::*;

/// Rewrites the group's record as an older coordinator would: without its view key.
pub(super) async fn drop_key_as_an_older_release_would(store: &MemoryStore) {
    let mut old = recorded(store).expect("record");
    old.view_key = None;
    let stored = store.peek_record(&group()).expect("record");
    let rewrite = WriteRequest {
        expected: Some(stored.cas_stamp()),
        aggregate: serde_json::to_string(&old).expect("encode"),
        schema_version: stored.schema_version,
        layout_version: stored.layout_version,
        updated_at_ms: stored.updated_at_ms,
        write_id: "older-release".into(),
        liveness_guards: Vec::new(),
        liveness_remove: Vec::new(),
    };
    store.write(&group(), rewrite).await.expect("rewritten");
}

fn unproven_counts(c: &Coordinator<MemoryStore>) -> f64 {
    let labels = vec![("group", group().to_string()), ("fact", "shardCount".to_string())];
    c.metrics().value("rsc_unproven_client_reports_total", &labels)
}

fn assert_recorded_view(answer: &RoutingResponse, shard_count: u32) {
    assert_eq!((answer.shard_count, answer.stream_keys.len()), (shard_count, shard_count as usize), "{answer:?}");
    assert_eq!(answer.lost_version, None, "{answer:?}");
}

#[tokio::test]
async fn one_routing_request_no_longer_grows_a_keyless_group_to_65536_shards() {
    let store = MemoryStore::new(31);
    create(&short_mutex(&store, "c1"), 4).await;
    drop_key_as_an_older_release_would(&store).await;
    let before = store.peek_record(&group()).expect("record").revision;
    let c = short_mutex(&store, "c2");

    let attack = RoutingReport { known_shard_count: 65_536, ..RoutingReport::NONE };
    let answer = c.routing(&group(), attack).await.expect("answered with the recorded view");
    assert_recorded_view(&answer, 4);
    assert_eq!(answer.shard_count_proof, None, "a keyless group proves nothing");
    assert_eq!(unproven_counts(&c), 1.0, "counted as an unproven shard count");
    // One shard more at a time walks nothing up either.
    for count in 5..=12 {
        let step = RoutingReport { known_shard_count: count, ..RoutingReport::NONE };
        assert_recorded_view(&c.routing(&group(), step).await.expect("answered"), 4);
    }
    assert_eq!(store.peek_record(&group()).expect("record").revision, before, "nothing was written");
    let g = recorded(&store).expect("record");
    assert_eq!((g.shard_count, g.view_key.is_none()), (4, true));

    // What restores a lost `add-shards` of a keyless group: the operator's, which draws the key.
    let add = AdminRequest::AddShards { group: group(), expected_revision: before, new_shard_count: 8 };
    c.admin(add).await.expect("the operator's add-shards");
    let g = recorded(&store).expect("record");
    assert_eq!((g.shard_count, g.resharding.last().map(|r| r.reason)), (8, Some(ReshardReason::Operator)));
    assert!(g.view_key.is_some(), "its write drew the key");
    assert!(c.routing(&group(), RoutingReport::NONE).await.expect("routing").shard_count_proof.is_some());
}

/// A keyless group still credits a version ahead (one correction round, whose write draws the
/// key); a count in the same report does not ride along on that write.
#[tokio::test]
async fn a_version_ahead_on_a_keyless_group_starts_a_round_without_the_count_beside_it() {
    let store = MemoryStore::new(32);
    create(&short_mutex(&store, "c1"), 4).await;
    drop_key_as_an_older_release_would(&store).await;
    let c = short_mutex(&store, "c2");
    let ahead = recorded(&store).expect("record").metadata_version + 3;

    let report = RoutingReport { known_shard_count: 65_536, ..RoutingReport::version(ahead) };
    let answer = c.routing(&group(), report).await.expect("answered");
    assert_eq!((answer.shard_count, answer.lost_version), (4, Some(ahead)), "{answer:?}");
    let g = recorded(&store).expect("record");
    assert!(g.correction.is_some() && g.view_key.is_some(), "the version started a round, whose write drew the key");
    assert_eq!((g.shard_count, g.resharding.len()), (4, 0), "and added no shard");
    assert_eq!(unproven_counts(&c), 1.0);
}
