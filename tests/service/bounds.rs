//! Client numbers above `CLIENT_NUMBER_MAX` through the coordinator workflow: refused with
//! `BAD_REQUEST` before the store is touched (no liveness touch, no mutex, no write), and the
//! group keeps answering joins, heartbeats and admin mutations afterwards.

use rsc::core::model::CLIENT_NUMBER_MAX;
use rsc::core::protocol::{ApiError, RoutingReport};

use super::*;

/// Everything a refused request could have changed: the metadata record and the liveness hash.
async fn touched(store: &MemoryStore) -> (Option<rsc::store::StoredRecord>, std::collections::BTreeMap<String, u64>) {
    (store.peek_record(&group()), store.liveness(&group()).await.expect("liveness"))
}

fn assert_bad_request(result: Result<impl std::fmt::Debug, ApiError>, field: &str) {
    let error = result.expect_err("refused");
    assert_eq!(error.code, ErrorCode::BadRequest, "{field}: {error:?}");
    assert!(error.message.contains(field), "the message names {field}: {error:?}");
}

#[tokio::test]
async fn an_unbounded_routing_report_records_nothing_and_the_group_keeps_working() {
    let store = MemoryStore::new(21);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    create(&c, 2).await;
    let a = c.heartbeat(join("a")).await.expect("a joins");
    let before = touched(&store).await;
    for value in [CLIENT_NUMBER_MAX + 1, u64::MAX] {
        assert_bad_request(c.routing(&group(), RoutingReport::version(value)).await, "knownVersion");
    }
    assert_eq!(touched(&store).await, before, "nothing recorded");

    let b = c.heartbeat(join("b")).await.expect("a join still works");
    assert!(b.metadata_version <= CLIENT_NUMBER_MAX);
    c.heartbeat(next(&a)).await.expect("a's heartbeat still works");
    let revision = store.peek_record(&group()).expect("record").revision;
    let add = AdminRequest::AddShards { group: group(), expected_revision: revision, new_shard_count: 4 };
    c.admin(add).await.expect("add-shards still works");
}

#[tokio::test]
async fn heartbeats_and_admin_requests_with_unbounded_numbers_touch_nothing() {
    let store = MemoryStore::new(22);
    let c = coordinator(&store, "c1", PlantedBugs::NONE);
    create(&c, 2).await;
    let a = c.heartbeat(join("a")).await.expect("a joins");
    let before = touched(&store).await;
    for value in [CLIENT_NUMBER_MAX + 1, u64::MAX] {
        for base in [join("b"), next(&a)] {
            let mut req = base.clone();
            req.member_epoch = value;
            assert_bad_request(c.heartbeat(req).await, "memberEpoch");
            let mut req = base.clone();
            req.metadata_version = value;
            assert_bad_request(c.heartbeat(req).await, "metadataVersion");
            let mut req = base;
            req.assignment_epoch = value;
            assert_bad_request(c.heartbeat(req).await, "assignmentEpoch");
        }
        let requests = [
            AdminRequest::AddShards { group: group(), expected_revision: value, new_shard_count: 4 },
            AdminRequest::ChangeConfig { group: group(), expected_revision: value, config: fast_config() },
            AdminRequest::DeleteGroup { group: group(), expected_revision: value },
        ];
        for req in requests {
            assert_bad_request(c.admin(req).await, "expectedRevision");
        }
    }
    assert_eq!(touched(&store).await, before, "no liveness touch, no write");
    assert_eq!(c.heartbeat(next(&a)).await.expect("a is undisturbed").status, HeartbeatStatus::Ok);
}
