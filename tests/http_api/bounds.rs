//! Numbers above `CLIENT_NUMBER_MAX` (2^53 − 1) in any request are a typed 400 at the HTTP edge:
//! the review's one-request break (`routing?knownVersion=18446744073709551615`, no credential) and
//! a heartbeat carrying `u64::MAX` leave the stored record byte-identical and the liveness hash
//! untouched, and the group keeps answering joins, heartbeats and admin mutations.

use axum::http::StatusCode;
use serde_json::{json, Value};

use rsc::core::model::{CLIENT_NUMBER_MAX, SHARD_COUNT_MAX};
use rsc::core::protocol::ErrorCode;
use rsc::store::MetadataStore;

use super::{group, join_body, Answer, Api, DELETE, HEARTBEAT, ROUTING, SHARDS};

fn assert_bad_request(answer: &Answer, field: &str, what: &str) {
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{what}: {:?}", answer.body);
    let error = answer.error();
    assert_eq!(error.code, ErrorCode::BadRequest, "{what}");
    assert!(error.message.contains(field), "{what}: the message names {field}: {error:?}");
}

/// The heartbeat a client sends after applying `answer` (a steady heartbeat echoing it).
fn echo(answer: &Value) -> Value {
    json!({
        "group": {"streamPrefix": "orders", "consumerGroup": "billing"},
        "memberId": answer["memberId"], "memberEpoch": answer["memberEpoch"],
        "metadataVersion": answer["metadataVersion"], "assignmentEpoch": answer["assignmentEpoch"],
        "owned": answer["assigned"]
    })
}

#[tokio::test]
async fn unbounded_routing_reports_and_heartbeats_are_400_and_leave_the_record_byte_identical() {
    let api = Api::with_group(None, 2).await;
    let a = api.json("POST", HEARTBEAT, Some(join_body("a"))).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let a = a.json();
    let before = api.snapshot().await;
    let liveness = api.store.liveness(&group()).await.expect("liveness");

    let above = [u64::MAX, CLIENT_NUMBER_MAX + 1];
    for value in above {
        let uri = format!("{ROUTING}?knownVersion={value}");
        assert_bad_request(&api.raw("GET", &uri, None, None, "").await, "knownVersion", &uri);
    }
    for value in [u64::from(SHARD_COUNT_MAX) + 1, u64::from(u32::MAX)] {
        let uri = format!("{ROUTING}?knownShardCount={value}");
        assert_bad_request(&api.raw("GET", &uri, None, None, "").await, "knownShardCount", &uri);
    }
    let uri = format!("{ROUTING}?knownShardCount={}", u64::MAX);
    assert_eq!(api.raw("GET", &uri, None, None, "").await.status, StatusCode::BAD_REQUEST, "{uri}");
    for value in above {
        for field in ["memberEpoch", "metadataVersion", "assignmentEpoch"] {
            for mut body in [echo(&a), join_body("b")] {
                body[field] = json!(value);
                let what = format!("heartbeat {body}");
                assert_bad_request(&api.json("POST", HEARTBEAT, Some(body)).await, field, &what);
            }
        }
        let mut all = echo(&a);
        for field in ["memberEpoch", "metadataVersion", "assignmentEpoch"] {
            all[field] = json!(value);
        }
        assert_eq!(api.json("POST", HEARTBEAT, Some(all)).await.status, StatusCode::BAD_REQUEST);
        let body = json!({"expectedRevision": value, "newShardCount": 4});
        assert_bad_request(&api.json("POST", SHARDS, Some(body)).await, "expectedRevision", "add-shards");
        let uri = format!("{DELETE}?expectedRevision={value}");
        assert_bad_request(&api.json("DELETE", &uri, None).await, "expectedRevision", &uri);
    }
    assert_eq!(api.snapshot().await, before, "the stored record is byte-identical");
    assert_eq!(api.store.liveness(&group()).await.expect("liveness"), liveness, "no liveness touch either");

    let steady = api.json("POST", HEARTBEAT, Some(echo(&a))).await;
    assert_eq!((steady.status, steady.json()["status"].as_str()), (StatusCode::OK, Some("OK")));
    let joined = api.json("POST", HEARTBEAT, Some(join_body("b"))).await;
    assert_eq!(joined.status, StatusCode::OK, "a well-formed join still works: {:?}", joined.body);
    let body = json!({"expectedRevision": api.revision(), "newShardCount": 4});
    assert_eq!(api.json("POST", SHARDS, Some(body)).await.status, StatusCode::OK, "add-shards still works");
}

/// The largest valid numbers are accepted: the bound is inclusive.
#[tokio::test]
async fn the_largest_valid_routing_report_is_accepted_and_later_joins_still_work() {
    let api = Api::with_group(None, 2).await;
    let uri = format!("{ROUTING}?knownVersion={CLIENT_NUMBER_MAX}");
    let told = api.raw("GET", &uri, None, None, "").await;
    assert_eq!(told.status, StatusCode::OK, "{:?}", told.body);
    assert_eq!(told.json()["lostVersion"].as_u64(), Some(CLIENT_NUMBER_MAX));
    let joined = api.json("POST", HEARTBEAT, Some(join_body("a"))).await;
    assert_eq!(joined.status, StatusCode::OK, "{:?}", joined.body);
    let joined = joined.json();
    for field in ["memberEpoch", "metadataVersion", "assignmentEpoch"] {
        let value = joined[field].as_u64().expect("a number");
        assert!(value <= CLIENT_NUMBER_MAX, "{field} {value} cannot be echoed");
    }
    let steady = api.json("POST", HEARTBEAT, Some(echo(&joined))).await;
    assert_eq!(steady.status, StatusCode::OK, "the echo is accepted: {:?}", steady.body);
}
