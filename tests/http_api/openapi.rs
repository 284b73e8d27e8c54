//! `docs/openapi.json` against the router: the documented operations are exactly the route table
//! (`rsc::http::routes::ROUTES`, which the router is built from), every one of them is served on
//! its method, other methods on a documented path get 405, the admin flag matches the documented
//! security, and the document the coordinator serves is the file in the repository.

use std::collections::BTreeSet;

use axum::http::{header, StatusCode};
use serde_json::Value;

use rsc::core::protocol::ErrorCode;
use rsc::http::health::OPENAPI_JSON;
use rsc::http::routes::{HttpMethod, ROUTES};

use super::{Api, TOKEN};

pub fn document() -> Value {
    let text = include_str!("../../docs/openapi.json");
    serde_json::from_str(text).expect("docs/openapi.json is JSON")
}

/// The operation object of `method` on `path`.
pub fn operation<'a>(doc: &'a Value, method: HttpMethod, path: &str) -> &'a Value {
    &doc["paths"][path][method.as_str().to_ascii_lowercase()]
}

/// The status codes documented for an operation.
pub fn documented_statuses(doc: &Value, method: HttpMethod, path: &str) -> BTreeSet<u16> {
    let responses = operation(doc, method, path)["responses"].as_object().expect("responses");
    responses.keys().map(|code| code.parse().expect("numeric status")).collect()
}

/// `path` with its parameters filled with an existing group.
fn concrete(path: &str) -> String {
    path.replace("{streamPrefix}", "orders").replace("{consumerGroup}", "billing")
}

#[test]
fn the_document_lists_exactly_the_route_table() {
    let doc = document();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            documented.insert((method.to_ascii_uppercase(), path.clone()));
        }
    }
    let served: BTreeSet<_> = ROUTES.iter().map(|r| (r.method.as_str().to_owned(), r.path.to_owned())).collect();
    assert_eq!(documented, served, "docs/openapi.json and rsc::http::routes::ROUTES disagree");
    for route in ROUTES {
        let security = operation(&doc, route.method, route.path)["security"].as_array().expect("security declared");
        let schemes: BTreeSet<&str> =
            security.iter().flat_map(|s| s.as_object().expect("requirement").keys()).map(String::as_str).collect();
        let expected: BTreeSet<&str> = match route.auth {
            rsc::http::routes::RouteAuth::Open => BTreeSet::new(),
            rsc::http::routes::RouteAuth::Client => ["clientToken"].into(),
            rsc::http::routes::RouteAuth::Admin => ["adminToken"].into(),
        };
        assert_eq!(schemes, expected, "{} {}: documented security vs the route's", route.method.as_str(), route.path);
    }
}

#[tokio::test]
async fn every_documented_operation_is_served_on_its_method_only() {
    let api = Api::with_group(Some(TOKEN), 2).await;
    let doc = document();
    for route in ROUTES {
        let uri = concrete(route.path);
        let answer = api.json(route.method.as_str(), &uri, Some(Value::Object(Default::default()))).await;
        let what = format!("{} {uri} -> {} {:?}", route.method.as_str(), answer.status, answer.body);
        let unrouted = answer.status == StatusCode::NOT_FOUND
            && serde_json::from_slice::<rsc::core::protocol::ApiError>(&answer.body)
                .is_ok_and(|e| e.code == ErrorCode::BadRequest);
        assert!(!unrouted, "not routed: {what}");
        assert_ne!(answer.status, StatusCode::METHOD_NOT_ALLOWED, "{what}");
        let documented = documented_statuses(&doc, route.method, route.path);
        assert!(documented.contains(&answer.status.as_u16()), "undocumented status: {what}");
    }
    let paths: BTreeSet<&str> = ROUTES.iter().map(|r| r.path).collect();
    for path in paths {
        let allowed: BTreeSet<&str> = ROUTES.iter().filter(|r| r.path == path).map(|r| r.method.as_str()).collect();
        for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            if allowed.contains(method) {
                continue;
            }
            let answer = api.json(method, &concrete(path), None).await;
            assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            assert_eq!(answer.error().code, ErrorCode::BadRequest);
            let allow = answer.headers.get(header::ALLOW).expect("Allow header").to_str().expect("ascii");
            let listed: BTreeSet<&str> = allow.split(", ").collect();
            assert_eq!(listed, allowed, "{method} {path}");
        }
    }
}

#[tokio::test]
async fn the_served_document_is_the_repository_file() {
    let api = Api::new(None).await;
    let answer = api.json("GET", "/v1/openapi.json", None).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, OPENAPI_JSON.as_bytes());
    assert_eq!(answer.json(), document());
}

/// Every documented body schema lists exactly the fields the serde type writes (every optional
/// field set in the sample), so the document cannot drift from the types a client generates from.
#[test]
fn the_body_schemas_name_exactly_the_fields_of_the_types() {
    use rsc::core::model::{GroupConfig, GroupId};
    use rsc::core::protocol::{
        AdminResponse, ApiError, Drain, HeartbeatRequest, HeartbeatResponse, HeartbeatStatus, MemberSession,
        RevokeReport, RoutingResponse,
    };
    let group = GroupId::new("orders", "billing");
    let proof: rsc::core::proof::ViewProof = "0".repeat(32).parse().expect("a proof");
    let report = RevokeReport { shard: 1, in_flight: 0, revoked: true, revoke_id: Some(7) };
    let samples: Vec<(&str, Value)> = vec![
        ("ApiError", serde_json::to_value(ApiError::new(ErrorCode::BadRequest, "m")).expect("json")),
        ("GroupId", serde_json::to_value(&group).expect("json")),
        ("GroupConfig", serde_json::to_value(GroupConfig::default()).expect("json")),
        ("RevokeReport", serde_json::to_value(&report).expect("json")),
        (
            "HeartbeatRequest",
            serde_json::to_value(HeartbeatRequest {
                metadata_version_proof: Some(proof),
                group: group.clone(),
                member_id: "a".into(),
                member_epoch: 1,
                metadata_version: 1,
                assignment_epoch: 1,
                owned: vec![0],
                revoking: vec![report],
                leave: false,
                member_session: Some(MemberSession("0".repeat(32))),
                fenced: vec![rsc::core::fence::ShardFence {
                    shard: 0,
                    fence: rsc::core::model::Fence { counter: 1, nonce: 2 },
                }],
            })
            .expect("json"),
        ),
        (
            "HeartbeatResponse",
            serde_json::to_value(HeartbeatResponse {
                metadata_version_proof: Some(proof),
                status: HeartbeatStatus::Ok,
                member_id: "a".into(),
                member_epoch: 1,
                metadata_version: 1,
                assignment_epoch: 1,
                shard_count: 2,
                assigned: vec![0],
                pending: vec![],
                revoke: vec![1],
                drains: vec![Drain { shard: 1, revoke_id: 7 }],
                assignment_lease_ms: 1,
                heartbeat_interval_ms: 1,
                store_revision: 1,
                fences: Vec::new(),
            })
            .expect("json"),
        ),
        (
            "RoutingResponse",
            serde_json::to_value(RoutingResponse {
                metadata_version_proof: Some(proof),
                shard_count_proof: Some(proof),
                group: group.clone(),
                metadata_version: 1,
                shard_count: 1,
                stream_keys: vec!["orders:0".into()],
                routing_cache_ttl_ms: 1,
                routing_refresh_interval_ms: 1,
                store_revision: 1,
                lost_version: Some(2),
                accepts_known_shard_count: true,
            })
            .expect("json"),
        ),
        (
            "AdminResponse",
            serde_json::to_value(AdminResponse { group, store_revision: 1, metadata_version: 1 }).expect("json"),
        ),
    ];
    let doc = document();
    for (name, sample) in samples {
        let written: BTreeSet<&str> = sample.as_object().expect("an object").keys().map(String::as_str).collect();
        let documented: BTreeSet<&str> = doc["components"]["schemas"][name]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("schema {name} documented"))
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(documented, written, "docs/openapi.json schema {name} vs the serde type");
    }
}

/// Real answers of the router, over a group's life and its error paths, validated against the
/// schema `docs/openapi.json` documents for their operation and status.
#[tokio::test]
async fn real_answers_match_the_documented_schemas() {
    use super::schema::validate;
    use super::{create_body, join_body, CONFIG, CREATE, DESCRIBE, HEARTBEAT, ROUTING, SHARDS};

    let api = Api::new(Some(TOKEN)).await;
    let doc = document();
    let mut checked = 0;
    let mut check = |method: HttpMethod, template: &str, answer: &super::Answer| {
        let status = answer.status.as_u16().to_string();
        let schema = &operation(&doc, method, template)["responses"][&status]["content"]["application/json"]["schema"];
        assert!(!schema.is_null(), "{} {template} {status}: undocumented", method.as_str());
        let value: Value = serde_json::from_slice(&answer.body).expect("a JSON body");
        let errors = validate(&doc, schema, &value, "$");
        assert!(errors.is_empty(), "{} {template} {status}: {errors:?}\n{value}", method.as_str());
        checked += 1;
    };
    let group_route = "/v1/groups/{streamPrefix}/{consumerGroup}";
    let heartbeat = "/v1/groups/{streamPrefix}/{consumerGroup}/heartbeat";
    let routing = "/v1/groups/{streamPrefix}/{consumerGroup}/routing";
    let shards = "/v1/admin/groups/{streamPrefix}/{consumerGroup}/shards";
    let config = "/v1/admin/groups/{streamPrefix}/{consumerGroup}/config";

    check(HttpMethod::Post, "/v1/admin/groups", &api.json("POST", CREATE, Some(create_body(2))).await);
    check(HttpMethod::Post, "/v1/admin/groups", &api.json("POST", CREATE, Some(create_body(2))).await);
    let a = api.json("POST", HEARTBEAT, Some(join_body("a"))).await;
    check(HttpMethod::Post, heartbeat, &a);
    check(HttpMethod::Post, heartbeat, &api.json("POST", HEARTBEAT, Some(join_body("b"))).await);
    let mut unknown = join_body("ghost");
    unknown["memberEpoch"] = serde_json::json!(5);
    check(HttpMethod::Post, heartbeat, &api.json("POST", HEARTBEAT, Some(unknown)).await);
    check(HttpMethod::Post, heartbeat, &api.json("POST", HEARTBEAT, Some(serde_json::json!({"x": 1}))).await);
    check(HttpMethod::Get, routing, &api.json("GET", ROUTING, None).await);
    check(HttpMethod::Get, routing, &api.json("GET", &format!("{ROUTING}?knownVersion=99"), None).await);
    check(HttpMethod::Get, routing, &api.json("GET", "/v1/groups/none/such/routing", None).await);
    let described = api.json("GET", DESCRIBE, None).await;
    check(HttpMethod::Get, group_route, &described);
    let revision = described.json()["storeRevision"].as_u64().expect("revision");
    let add = serde_json::json!({"expectedRevision": revision, "newShardCount": 4});
    check(HttpMethod::Post, shards, &api.json("POST", SHARDS, Some(add.clone())).await);
    check(HttpMethod::Post, shards, &api.json("POST", SHARDS, Some(add)).await);
    let set = serde_json::json!({"expectedRevision": 1, "config": {}});
    check(HttpMethod::Put, config, &api.json("PUT", CONFIG, Some(set)).await);
    let unauthenticated = api.raw("GET", DESCRIBE, None, None, "").await;
    check(HttpMethod::Get, group_route, &unauthenticated);
    check(HttpMethod::Get, "/healthz", &api.json("GET", "/healthz", None).await);
    check(HttpMethod::Get, "/readyz", &api.json("GET", "/readyz", None).await);
    assert_eq!(checked, 16, "every answer above was checked");
    assert_eq!(a.status, StatusCode::OK);
}
