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
