//! The coordinator's HTTP API (`rsc::http::router::app`) driven in-process with
//! `tower::ServiceExt::oneshot` over a `MemoryStore`: the consumer/admin story, typed rejections
//! that write nothing, the shutdown gate, the admin token, metrics, readiness and the rule that a
//! 5xx body never leaks internals; one test goes over real TCP with the clients' `HttpTransport`
//! to pin that its paths reach the router. `http_api/openapi.rs` checks the route table against
//! `docs/openapi.json`; `http_api/fuzz.rs` throws random bodies at every mutating route.
//!
//! Run: `cargo test --test http_api`. Real tokio; not built under `--cfg madsim`.

#![cfg(not(madsim))]

#[path = "http_api/bounds.rs"]
mod bounds;
#[path = "http_api/client_auth.rs"]
mod client_auth;
#[path = "http_api/fuzz.rs"]
mod fuzz;
#[path = "http_api/openapi.rs"]
mod openapi;
#[path = "http_api/schema.rs"]
mod schema;

use axum::body::Body;
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use rsc::core::model::GroupId;
use rsc::core::protocol::{ApiError, ErrorCode, RoutingReport};
use rsc::http::error::public_message;
use rsc::http::router::{app, HttpOptions, Readiness};
use rsc::service::{Coordinator, CoordinatorOptions};
use rsc::store::memory::{MemoryStore, OutageMode};
use rsc::store::{MetadataStore, StoredRecord};

pub const TOKEN: &str = "s3cret-admin-token";
pub const HEARTBEAT: &str = "/v1/groups/orders/billing/heartbeat";
pub const ROUTING: &str = "/v1/groups/orders/billing/routing";
pub const DESCRIBE: &str = "/v1/groups/orders/billing";
pub const CREATE: &str = "/v1/admin/groups";
pub const SHARDS: &str = "/v1/admin/groups/orders/billing/shards";
pub const CONFIG: &str = "/v1/admin/groups/orders/billing/config";
pub const DELETE: &str = "/v1/admin/groups/orders/billing";
pub const REBUILD: &str = "/v1/admin/index/rebuild";

pub fn group() -> GroupId {
    GroupId::new("orders", "billing")
}

/// A router over a fresh `MemoryStore`, with the startup probe recorded.
pub struct Api {
    pub app: Router,
    pub coordinator: Coordinator<MemoryStore>,
    pub store: MemoryStore,
    pub readiness: Readiness,
    /// Sent as the bearer token by [`Api::json`] (and configured on the router when `Some`).
    pub token: Option<String>,
}

/// One answer: status, headers, raw body.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// The body as an `ApiError` (panics otherwise: every error body must be one).
    pub fn error(&self) -> ApiError {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not an ApiError ({e}): {:?}", self.body))
    }
}

/// Everything a request could have written.
#[derive(Debug, PartialEq)]
pub struct Snapshot {
    pub record: Option<StoredRecord>,
    pub history_len: usize,
}

impl Api {
    pub async fn new(token: Option<&str>) -> Self {
        Self::with_client_tokens(token, &[]).await
    }

    /// [`Api::new`] whose data plane requires one of `client_tokens` (`[SCOPE=]TOKEN`).
    pub async fn with_client_tokens(token: Option<&str>, client_tokens: &[&str]) -> Self {
        let store = MemoryStore::new(7);
        let coordinator = Coordinator::new(store.connect(), CoordinatorOptions::default());
        let readiness = Readiness::default();
        readiness.probe(&coordinator).await.expect("the memory store passes the probe");
        let options = HttpOptions {
            admin_token: token.map(str::to_owned),
            client_tokens: rsc::http::auth::ClientTokens::parse(client_tokens).expect("valid client tokens"),
            readiness: readiness.clone(),
            ..HttpOptions::default()
        };
        let app = app(coordinator.clone(), options);
        Self { app, coordinator, store, readiness, token: token.map(str::to_owned) }
    }

    /// An API whose group `orders/billing` exists with `shards` shards.
    pub async fn with_group(token: Option<&str>, shards: u32) -> Self {
        let api = Self::new(token).await;
        let created = api.json("POST", CREATE, Some(create_body(shards))).await;
        assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
        api
    }

    /// Sends a raw request.
    pub async fn raw(
        &self,
        method: &str,
        uri: &str,
        content_type: Option<&str>,
        authorization: Option<&str>,
        body: impl Into<Body>,
    ) -> Answer {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(content_type) = content_type {
            request = request.header(header::CONTENT_TYPE, content_type);
        }
        if let Some(authorization) = authorization {
            request = request.header(header::AUTHORIZATION, authorization);
        }
        let request = request.body(body.into()).expect("request builds");
        let response = self.app.clone().oneshot(request).await.expect("the router is infallible");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("body reads").to_bytes();
        Answer { status: parts.status, headers: parts.headers, body }
    }

    /// Sends JSON (or nothing) with this API's token.
    pub async fn json(&self, method: &str, uri: &str, body: Option<Value>) -> Answer {
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        self.raw(method, uri, Some("application/json"), auth.as_deref(), bytes).await
    }

    pub async fn snapshot(&self) -> Snapshot {
        Snapshot { record: self.store.peek_record(&group()), history_len: self.store.history().len() }
    }

    pub fn revision(&self) -> u64 {
        self.store.peek_record(&group()).map_or(0, |r| r.revision)
    }
}

pub fn create_body(shards: u32) -> Value {
    json!({"group": {"streamPrefix": "orders", "consumerGroup": "billing"}, "shardCount": shards})
}

pub fn join_body(member: &str) -> Value {
    json!({
        "group": {"streamPrefix": "orders", "consumerGroup": "billing"},
        "memberId": member, "memberEpoch": 0, "metadataVersion": 0, "assignmentEpoch": 0
    })
}

fn shard_list(value: &Value) -> Vec<u64> {
    value.as_array().expect("array").iter().map(|v| v.as_u64().expect("shard")).collect()
}

#[tokio::test]
async fn a_group_lives_through_create_join_describe_route_reshard_and_delete() {
    let api = Api::with_group(None, 4).await;
    let again = api.json("POST", CREATE, Some(create_body(4))).await;
    assert_eq!((again.status, again.error().code), (StatusCode::CONFLICT, ErrorCode::GroupExists));

    let a = api.json("POST", HEARTBEAT, Some(join_body("a"))).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let a = a.json();
    assert_eq!((a["status"].as_str(), shard_list(&a["assigned"])), (Some("OK"), vec![0, 1, 2, 3]));
    assert_eq!(a["storeRevision"].as_u64(), Some(api.revision()), "answered from what was written");

    let b = api.json("POST", HEARTBEAT, Some(join_body("b"))).await.json();
    assert_eq!(b["status"].as_str(), Some("REVOKE_PENDING"), "{b}");
    assert!(shard_list(&b["assigned"]).is_empty(), "b may read nothing until a released: {b}");
    assert_eq!(shard_list(&b["pending"]).len(), 2, "{b}");

    let described = api.json("GET", DESCRIBE, None).await;
    assert_eq!(described.status, StatusCode::OK);
    let described = described.json();
    let revision = api.revision();
    assert_eq!(described["storeRevision"].as_u64(), Some(revision));
    let members: Vec<&String> = described["metadata"]["members"].as_object().expect("members").keys().collect();
    assert_eq!(members, ["a", "b"]);

    let routing = api.json("GET", ROUTING, None).await.json();
    assert_eq!(routing["shardCount"].as_u64(), Some(4));
    assert_eq!(routing["streamKeys"], json!(["orders:0", "orders:1", "orders:2", "orders:3"]));

    let stale = api.json("POST", SHARDS, Some(json!({"expectedRevision": revision - 1, "newShardCount": 6}))).await;
    assert_eq!((stale.status, stale.error().code), (StatusCode::CONFLICT, ErrorCode::RevisionConflict));
    assert_eq!(api.revision(), revision, "a conflict writes nothing");
    let added = api.json("POST", SHARDS, Some(json!({"expectedRevision": revision, "newShardCount": 6}))).await;
    assert_eq!(added.status, StatusCode::OK, "{:?}", added.body);
    assert_eq!(added.json()["storeRevision"].as_u64(), Some(revision + 1));
    assert_eq!(api.json("GET", ROUTING, None).await.json()["shardCount"].as_u64(), Some(6));

    let config = |lease: u64| {
        json!({"memberLeaseTtlMs": 12000, "assignmentLeaseMs": lease, "heartbeatIntervalMs": 1000,
            "rebalanceTimeoutMs": 30000, "routingCacheTtlMs": 10000, "routingRefreshIntervalMs": 3000})
    };
    // Above the coordinator's lease ceiling (the default, 8 s): a typed refusal that writes nothing.
    let over = api.json("PUT", CONFIG, Some(json!({"expectedRevision": revision + 1, "config": config(9000)}))).await;
    assert_eq!((over.status, over.error().code), (StatusCode::BAD_REQUEST, ErrorCode::BadRequest));
    assert_eq!(api.revision(), revision + 1, "a refused change writes nothing");
    let changed =
        api.json("PUT", CONFIG, Some(json!({"expectedRevision": revision + 1, "config": config(7000)}))).await;
    assert_eq!(changed.status, StatusCode::OK, "{:?}", changed.body);
    let described = api.json("GET", DESCRIBE, None).await.json();
    assert_eq!(described["metadata"]["config"]["assignmentLeaseMs"].as_u64(), Some(7000));

    let ghost = json!({"group": {"streamPrefix": "orders", "consumerGroup": "billing"}, "memberId": "ghost",
        "memberEpoch": 3, "metadataVersion": 1, "assignmentEpoch": 1});
    let unknown = api.json("POST", HEARTBEAT, Some(ghost)).await;
    assert_eq!((unknown.status, unknown.error().code), (StatusCode::CONFLICT, ErrorCode::UnknownMember));

    let revision = api.revision();
    let stale = api.json("DELETE", &format!("{DELETE}?expectedRevision={}", revision - 1), None).await;
    assert_eq!((stale.status, stale.error().code), (StatusCode::CONFLICT, ErrorCode::RevisionConflict));
    assert!(api.store.peek_record(&group()).is_some());
    // a and b are members: a create after this delete would grant at once what they still read.
    let before = api.snapshot().await;
    let busy = api.json("DELETE", &format!("{DELETE}?expectedRevision={revision}"), None).await;
    assert_eq!((busy.status, busy.error().code), (StatusCode::CONFLICT, ErrorCode::GroupNotEmpty), "{:?}", busy.body);
    assert_eq!(api.snapshot().await, before, "a refused delete changes nothing");

    // A group nobody joined is empty: deleted.
    let api = Api::with_group(None, 4).await;
    let revision = api.revision();
    let deleted = api.json("DELETE", &format!("{DELETE}?expectedRevision={revision}"), None).await;
    assert_eq!(deleted.status, StatusCode::OK, "{:?}", deleted.body);
    assert_eq!(deleted.json()["storeRevision"].as_u64(), Some(0));
    assert!(api.store.peek_record(&group()).is_none());
    let gone = api.json("GET", DESCRIBE, None).await;
    assert_eq!((gone.status, gone.error().code), (StatusCode::NOT_FOUND, ErrorCode::GroupNotFound));

    let rebuilt = api.json("POST", REBUILD, None).await;
    assert_eq!((rebuilt.status, rebuilt.json()), (StatusCode::OK, json!({"groups": []})));
}

#[tokio::test]
async fn malformed_requests_are_typed_4xx_and_write_nothing() {
    let api = Api::with_group(None, 2).await;
    let join = join_body("a").to_string();
    let with = |from: &str, to: &str| join.replace(from, to);
    let huge = format!(r#"{{"memberId":"{}"}}"#, "x".repeat(2 * 1024 * 1024));
    let json = Some("application/json");
    let cases: Vec<(&str, String, Option<&str>, String, StatusCode)> = vec![
        ("POST", HEARTBEAT.into(), json, "{not json".into(), StatusCode::BAD_REQUEST),
        ("POST", HEARTBEAT.into(), json, String::new(), StatusCode::BAD_REQUEST),
        ("POST", HEARTBEAT.into(), json, with(r#""memberEpoch":0"#, r#""memberEpoch":"0""#), StatusCode::BAD_REQUEST),
        ("POST", HEARTBEAT.into(), json, with(r#""memberEpoch":0"#, r#""memberEpoch":-1"#), StatusCode::BAD_REQUEST),
        ("POST", HEARTBEAT.into(), json, with(r#""memberEpoch":0,"#, ""), StatusCode::BAD_REQUEST),
        ("POST", HEARTBEAT.into(), json, with(r#""memberId""#, r#""surprise":1,"memberId""#), StatusCode::BAD_REQUEST),
        ("POST", HEARTBEAT.into(), json, with(r#""billing""#, r#""billing","x":1"#), StatusCode::BAD_REQUEST),
        ("POST", HEARTBEAT.into(), json, with(r#""billing""#, r#""other""#), StatusCode::BAD_REQUEST),
        ("POST", HEARTBEAT.into(), json, "[1,2,3]".into(), StatusCode::BAD_REQUEST),
        ("POST", HEARTBEAT.into(), Some("text/plain"), join.clone(), StatusCode::UNSUPPORTED_MEDIA_TYPE),
        ("POST", HEARTBEAT.into(), None, join.clone(), StatusCode::UNSUPPORTED_MEDIA_TYPE),
        ("POST", HEARTBEAT.into(), json, huge, StatusCode::PAYLOAD_TOO_LARGE),
        ("POST", "/v1/groups/orders/bil%FFling/heartbeat".into(), json, join.clone(), StatusCode::BAD_REQUEST),
        (
            "POST",
            "/v1/groups/ord%20ers/billing/heartbeat".into(),
            json,
            with("orders", "ord ers"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "POST",
            CREATE.into(),
            json,
            r#"{"group":{"streamPrefix":"o","consumerGroup":"g"},"shardCount":-1}"#.into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "POST",
            CREATE.into(),
            json,
            r#"{"group":{"streamPrefix":"o","consumerGroup":"g"},"shardCount":0}"#.into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "POST",
            CREATE.into(),
            json,
            r#"{"group":{"streamPrefix":"o","consumerGroup":"g"},"shardCount":2,"config":{"memberLeaseTtlMs":1}}"#
                .into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "POST",
            CREATE.into(),
            json,
            r#"{"group":{"streamPrefix":"o","consumerGroup":"g:h"},"shardCount":2}"#.into(),
            StatusCode::BAD_REQUEST,
        ),
        ("POST", SHARDS.into(), json, r#"{"expectedRevision":"1","newShardCount":4}"#.into(), StatusCode::BAD_REQUEST),
        ("POST", SHARDS.into(), json, r#"{"expectedRevision":1,"newShardCount":1}"#.into(), StatusCode::BAD_REQUEST),
        ("PUT", CONFIG.into(), json, r#"{"expectedRevision":1,"config":{}}"#.into(), StatusCode::BAD_REQUEST),
        ("DELETE", DELETE.into(), None, String::new(), StatusCode::BAD_REQUEST),
        ("DELETE", format!("{DELETE}?expectedRevision=abc"), None, String::new(), StatusCode::BAD_REQUEST),
        ("DELETE", format!("{DELETE}?expectedRevision=1&force=true"), None, String::new(), StatusCode::BAD_REQUEST),
        ("GET", "/v1/nothing/here".into(), None, String::new(), StatusCode::NOT_FOUND),
        ("PATCH", HEARTBEAT.into(), json, join.clone(), StatusCode::METHOD_NOT_ALLOWED),
    ];
    let before = api.snapshot().await;
    let liveness_before = api.store.liveness(&group()).await.expect("liveness");
    for (method, uri, content_type, body, expected) in cases {
        let answer = api.raw(method, &uri, content_type, None, body.clone()).await;
        let shown = &body[..body.len().min(120)];
        assert_eq!(answer.status, expected, "{method} {uri} {shown}: {:?}", answer.body);
        assert_eq!(answer.error().code, ErrorCode::BadRequest, "{method} {uri} {shown}");
        assert_eq!(answer.headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()), Some(&b"application/json"[..]));
    }
    assert_eq!(api.snapshot().await, before, "no rejected request wrote anything");
    assert_eq!(api.store.liveness(&group()).await.expect("liveness"), liveness_before, "no liveness touch either");
}

#[tokio::test]
async fn terminating_refuses_mutations_with_503_while_healthz_stays_up_and_readyz_goes_down() {
    let api = Api::with_group(None, 2).await;
    assert_eq!(api.json("POST", HEARTBEAT, Some(join_body("a"))).await.status, StatusCode::OK);
    assert_eq!(api.json("GET", "/readyz", None).await.status, StatusCode::OK);
    let revision = api.revision();
    let before = api.snapshot().await;

    api.coordinator.begin_shutdown();
    let mutations = [
        ("POST", HEARTBEAT.to_owned(), Some(join_body("b"))),
        (
            "POST",
            CREATE.to_owned(),
            Some(json!({"group": {"streamPrefix": "o", "consumerGroup": "g"}, "shardCount": 1})),
        ),
        ("POST", SHARDS.to_owned(), Some(json!({"expectedRevision": revision, "newShardCount": 3}))),
        (
            "PUT",
            CONFIG.to_owned(),
            Some(json!({"expectedRevision": revision, "config": rsc::core::model::GroupConfig::default()})),
        ),
        ("DELETE", format!("{DELETE}?expectedRevision={revision}"), None),
        ("POST", REBUILD.to_owned(), None),
    ];
    for (method, uri, body) in mutations {
        let answer = api.json(method, &uri, body).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{method} {uri}");
        let error = answer.error();
        assert_eq!(error.code, ErrorCode::CoordinatorTerminating, "{method} {uri}");
        assert_eq!(error.message, public_message(ErrorCode::CoordinatorTerminating));
    }
    assert_eq!(api.snapshot().await, before, "nothing written while terminating");

    let health = api.json("GET", "/healthz", None).await;
    assert_eq!((health.status, health.json()), (StatusCode::OK, json!({"status": "alive", "terminating": true})));
    let ready = api.json("GET", "/readyz", None).await;
    assert_eq!(
        (ready.status, ready.error().code),
        (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::CoordinatorTerminating)
    );
    // Reads keep working, so producers can ride out a rolling update.
    assert_eq!(api.json("GET", ROUTING, None).await.status, StatusCode::OK);
    assert_eq!(api.json("GET", DESCRIBE, None).await.status, StatusCode::OK);
}

#[tokio::test]
async fn admin_routes_need_the_bearer_token_and_consumer_routes_do_not() {
    let api = Api::new(Some(TOKEN)).await;
    let body = create_body(2).to_string();
    let json = Some("application/json");
    for auth in [None, Some("Bearer wrong-token"), Some("Basic czNjcmV0"), Some(TOKEN)] {
        let answer = api.raw("POST", CREATE, json, auth, body.clone()).await;
        assert_eq!(
            (answer.status, answer.error().code),
            (StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized),
            "{auth:?}"
        );
        assert_eq!(answer.headers.get(header::WWW_AUTHENTICATE).map(|v| v.as_bytes()), Some(&b"Bearer"[..]));
    }
    assert!(api.store.peek_record(&group()).is_none(), "an unauthorized create wrote nothing");
    for (method, uri) in [("GET", DESCRIBE), ("POST", REBUILD), ("DELETE", DELETE), ("PUT", CONFIG), ("POST", SHARDS)] {
        let answer = api.raw(method, uri, json, None, "{}").await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{method} {uri}: checked before the body is parsed");
    }
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(api.raw("POST", CREATE, json, Some(&bearer), body).await.status, StatusCode::CREATED);
    let joined = api.raw("POST", HEARTBEAT, json, None, join_body("a").to_string()).await;
    assert_eq!(joined.status, StatusCode::OK, "consumers need no admin token");
    assert_eq!(api.raw("GET", ROUTING, None, None, "").await.status, StatusCode::OK);
    assert_eq!(api.raw("GET", "/metrics", None, None, "").await.status, StatusCode::OK);
    assert_eq!(api.raw("GET", DESCRIBE, None, Some(&bearer), "").await.status, StatusCode::OK);
}

#[tokio::test]
async fn metrics_render_coordinator_and_http_counters() {
    let api = Api::with_group(None, 2).await;
    assert_eq!(api.json("POST", HEARTBEAT, Some(join_body("a"))).await.status, StatusCode::OK);
    let metrics = api.raw("GET", "/metrics", None, None, "").await;
    assert_eq!(metrics.status, StatusCode::OK);
    let content_type = metrics.headers.get(header::CONTENT_TYPE).expect("content type").to_str().expect("ascii");
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let text = String::from_utf8(metrics.body.to_vec()).expect("utf-8");
    assert!(text.contains("rsc_heartbeats_total{status=\"OK\"} 1"), "{text}");
    let route = "/v1/groups/{streamPrefix}/{consumerGroup}/heartbeat";
    assert!(text.contains(&format!("rsc_http_requests_total{{method=\"POST\",route=\"{route}\",status=\"200\"}} 1")));
    assert!(text.contains("rsc_http_requests_total{method=\"POST\",route=\"/v1/admin/groups\",status=\"201\"} 1"));
    assert!(text.contains(&format!("rsc_http_request_duration_seconds_count{{route=\"{route}\"}} 1")), "{text}");
}

#[tokio::test]
async fn readyz_waits_for_the_probe_and_lists_warnings() {
    let store = MemoryStore::new(3);
    let coordinator = Coordinator::new(store.connect(), CoordinatorOptions::default());
    let readiness = Readiness::default();
    readiness.add_warning("in-memory store: nothing is durable");
    let router = app(coordinator.clone(), HttpOptions { readiness: readiness.clone(), ..HttpOptions::default() });
    let api = Api { app: router, coordinator, store, readiness, token: None };

    let before = api.json("GET", "/readyz", None).await;
    assert_eq!((before.status, before.error().code), (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::StoreUnavailable));
    assert!(before.error().message.contains("nothing is durable"), "{:?}", before.error());
    api.readiness.probe(&api.coordinator).await.expect("probe");
    let after = api.json("GET", "/readyz", None).await;
    assert_eq!(after.status, StatusCode::OK);
    let body = after.json();
    assert_eq!(body["status"], "ready");
    assert_eq!(body["warnings"], json!(["in-memory store: nothing is durable"]));
    assert!(body["storeServerVersion"].as_str().is_some_and(|v| !v.is_empty()));
}

#[tokio::test]
async fn server_errors_carry_a_fixed_message_and_never_store_details() {
    let api = Api::with_group(None, 2).await;
    api.store.set_outage(Some(OutageMode::Errors));
    for (method, uri, body) in [("GET", ROUTING, None), ("POST", HEARTBEAT, Some(join_body("a")))] {
        let answer = api.json(method, uri, body).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{uri}");
        let error = answer.error();
        assert_eq!(error, ApiError::new(ErrorCode::StoreUnavailable, public_message(ErrorCode::StoreUnavailable)));
        assert!(!error.message.contains("outage") && !error.message.contains("refused"));
    }
    api.store.set_outage(None);
    assert!(api.store.corrupt_aggregate(&group()));
    let answer = api.json("GET", DESCRIBE, None).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.error(),
        ApiError::new(ErrorCode::MetadataIncompatible, public_message(ErrorCode::MetadataIncompatible))
    );
}

/// Group names are restricted to a safe set (issue #9): `..`, `a/b`, spaces, percent signs,
/// non-ASCII and a ':' in the group name are refused at create with a typed 400 naming the field,
/// and nothing is created.
#[tokio::test]
async fn unsafe_group_names_are_refused_at_create() {
    let api = Api::new(None).await;
    for (prefix, group, field) in [
        ("..", "billing", "streamPrefix"),
        (".", "billing", "streamPrefix"),
        ("a/b", "billing", "streamPrefix"),
        ("orders", "..", "consumerGroup"),
        ("orders", "bill/ing", "consumerGroup"),
        ("orders", "bill:ing", "consumerGroup"),
        ("or ders", "billing", "streamPrefix"),
        ("orders%2F", "billing", "streamPrefix"),
        ("ordérs", "billing", "streamPrefix"),
    ] {
        let body = json!({"group": {"streamPrefix": prefix, "consumerGroup": group}, "shardCount": 2});
        let answer = api.json("POST", CREATE, Some(body)).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{prefix:?}/{group:?}: {:?}", answer.body);
        assert!(answer.error().message.contains(field), "{prefix:?}/{group:?}: {:?}", answer.error());
    }
    assert_eq!(api.store.history().len(), 0, "nothing was created");
}

#[tokio::test]
async fn the_client_transport_reaches_the_router_over_tcp_with_encoded_group_names() {
    use rsc::client::transport::{CoordinatorTransport, TransportError};
    use rsc::core::protocol::{HeartbeatRequest, HeartbeatStatus};
    use rsc::http::client::HttpTransport;

    let api = Api::new(None).await;
    let group = GroupId::new("orders:eu.v1", "billing_2-b");
    let create = json!({"group": {"streamPrefix": "orders:eu.v1", "consumerGroup": "billing_2-b"}, "shardCount": 3});
    assert_eq!(api.json("POST", CREATE, Some(create)).await.status, StatusCode::CREATED);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(rsc::http::serve::serve(listener, api.app.clone(), async {
        let _ = stopped.await;
    }));

    let transport = HttpTransport::with_addrs(vec![addr]);
    let join = HeartbeatRequest {
        metadata_version_proof: None,
        group: group.clone(),
        member_id: "a".into(),
        member_epoch: 0,
        metadata_version: 0,
        assignment_epoch: 0,
        owned: vec![],
        revoking: vec![],
        leave: false,
        member_session: None,
        fenced: Vec::new(),
    };
    let joined = transport.heartbeat(join.clone()).await.expect("heartbeat over TCP");
    assert_eq!((joined.status, joined.assigned), (HeartbeatStatus::Ok, vec![0, 1, 2]));
    let routing = transport.routing(&group, RoutingReport::version(0)).await.expect("routing over TCP");
    assert_eq!(routing.stream_keys, ["orders:eu.v1:0", "orders:eu.v1:1", "orders:eu.v1:2"]);

    api.coordinator.begin_shutdown();
    let refused = transport.heartbeat(join).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::CoordinatorTerminating), "{refused}");
    assert!(matches!(refused, TransportError::Api(_)));
    let _ = stop.send(());
    server.await.expect("server stops");
}

/// Sends `request` on a new connection and reads the answer until the server closes it.
async fn tcp_exchange(addr: std::net::SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read the answer");
    String::from_utf8_lossy(&answer).into_owned()
}

/// A request without its route's credential is refused on its headers, before any of its body is
/// read. A black-box review filled the shared body budget with unauthenticated slow bodies (64 of
/// about 1 MiB each, renewed at every body read deadline): bodies were read before the credential
/// check, so every group's heartbeats waited behind them. Each request here declares a body and
/// never sends it; before the fix none was answered until the body read deadline (408).
#[tokio::test]
async fn a_request_without_its_credential_is_refused_before_its_body_is_read() {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const CLIENT: &str = "a-client-token-of-orders";
    let api = Api::with_group(Some(TOKEN), 2).await;
    let options = HttpOptions {
        admin_token: Some(TOKEN.to_string()),
        client_tokens: rsc::http::auth::ClientTokens::parse(&[format!("orders:*={CLIENT}")]).expect("valid"),
        readiness: api.readiness.clone(),
        ..HttpOptions::default()
    };
    let router = app(api.coordinator.clone(), options);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = rsc::http::serve::ServeConfig { header_read_timeout: Duration::from_secs(5), ..Default::default() };
    let server = tokio::spawn(rsc::http::serve::serve_with(listener, router, config, async {
        let _ = stopped.await;
    }));

    let cases = [
        ("POST", HEARTBEAT, None, "401"),
        ("POST", HEARTBEAT, Some("a-wrong-token-of-some-length"), "401"),
        ("GET", ROUTING, None, "401"),
        ("POST", SHARDS, None, "401"),
        ("POST", CREATE, Some(CLIENT), "401"),
        // A path whose group is not UTF-8 once decoded names no group to check a token against:
        // refused as the handler would refuse it, before the body too.
        ("POST", "/v1/groups/%FF/billing/heartbeat", None, "400"),
        ("POST", "/v1/groups/%FF/billing/heartbeat", Some(CLIENT), "400"),
    ];
    for (method, path, bearer, status) in cases {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let auth = bearer.map_or(String::new(), |token| format!("Authorization: Bearer {token}\r\n"));
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}Content-Length: 1000\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.expect("send the head");
        let mut answer = vec![0; 64];
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut answer)).await;
        let n =
            read.unwrap_or_else(|_| panic!("{method} {path} was not answered before its body arrived")).expect("read");
        let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
        assert!(answer.starts_with(&format!("HTTP/1.1 {status}")), "{method} {path}: {answer}");
    }
    let _ = stop.send(());
    server.await.expect("server stops");
}

/// A black-box review held every concurrency slot with slow request bodies (1,100 connections
/// sending a byte a second): heartbeats waited for the body read deadline and every member of
/// every group expired. Bodies are now read before a request takes a slot, so slow ones hold
/// connections only, and are answered 408 at the deadline.
#[tokio::test]
async fn slow_request_bodies_take_no_concurrency_slot_from_other_requests() {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let api = Api::with_group(None, 2).await;
    let options = HttpOptions { concurrency_max: 2, readiness: api.readiness.clone(), ..HttpOptions::default() };
    let router = app(api.coordinator.clone(), options);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = rsc::http::serve::ServeConfig { header_read_timeout: Duration::from_secs(3), ..Default::default() };
    let server = tokio::spawn(rsc::http::serve::serve_with(listener, router, config, async {
        let _ = stopped.await;
    }));

    // Three times as many stalled bodies as there are slots.
    let mut stalled = Vec::new();
    for _ in 0..6 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let head = format!(
            "POST {HEARTBEAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
        );
        stream.write_all(head.as_bytes()).await.expect("send the head and one byte");
        stalled.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let join = json!({"group": {"streamPrefix": "orders", "consumerGroup": "billing"}, "memberId": "a",
        "memberEpoch": 0, "metadataVersion": 0, "assignmentEpoch": 0});
    let body = join.to_string();
    let heartbeat = format!(
        "POST {HEARTBEAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let answered = tokio::time::timeout(Duration::from_secs(1), tcp_exchange(addr, &heartbeat)).await;
    let answer = answered.expect("a heartbeat is answered while slow bodies are open");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let health = tokio::time::timeout(
        Duration::from_secs(1),
        tcp_exchange(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
    .await
    .expect("/healthz is answered while slow bodies are open");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");

    // Each stalled body is answered 408 at the body read deadline.
    for mut stream in stalled {
        let mut answer = vec![0; 64];
        let read = tokio::time::timeout(Duration::from_secs(6), stream.read(&mut answer)).await;
        let n = read.expect("a stalled body is answered by its deadline").expect("read");
        let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    let _ = stop.send(());
    server.await.expect("server stops");
}

/// The operational routes have slots of their own: `/healthz`, `/readyz` and `/metrics` queued
/// behind heartbeats for the API's slots, so an overload (here: the only slot held by a heartbeat
/// waiting on a slow store) failed liveness probes, which restart the pod, and scrapes.
#[tokio::test]
async fn probes_and_scrapes_are_answered_while_every_api_slot_is_taken() {
    use std::time::Duration;

    let api = Api::with_group(None, 2).await;
    let options = HttpOptions { concurrency_max: 1, readiness: api.readiness.clone(), ..HttpOptions::default() };
    let router = app(api.coordinator.clone(), options);
    api.store.set_latency_ms(1_000);
    let request = |method: &str, uri: &str, body: String| {
        let request = Request::builder().method(method).uri(uri).header(header::CONTENT_TYPE, "application/json");
        request.body(Body::from(body)).expect("request builds")
    };
    let heartbeat = tokio::spawn(router.clone().oneshot(request("POST", HEARTBEAT, join_body("a").to_string())));
    // On this current-thread runtime the heartbeat runs up to its store call, slot held.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for uri in ["/healthz", "/readyz", "/metrics"] {
        let answered = tokio::time::timeout(
            Duration::from_millis(500),
            router.clone().oneshot(request("GET", uri, String::new())),
        );
        let response =
            answered.await.unwrap_or_else(|_| panic!("{uri} waited for the heartbeat's slot")).expect("infallible");
        assert_eq!(response.status(), StatusCode::OK, "{uri}");
    }
    assert!(!heartbeat.is_finished(), "the heartbeat still held the only API slot");
    let response = heartbeat.await.expect("task").expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
}

/// A request whose client gave up is counted: hyper drops the handler when the client closes the
/// connection, and such requests were counted nowhere (neither the request counter, the latency
/// histogram, nor the heartbeat counter), so the dashboards went quiet during a slow store.
#[tokio::test]
async fn a_request_dropped_before_its_answer_is_counted() {
    use std::time::Duration;

    let api = Api::with_group(None, 2).await;
    api.store.set_latency_ms(1_000);
    let request = Request::builder()
        .method("POST")
        .uri(HEARTBEAT)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(join_body("a").to_string()))
        .expect("request builds");
    let gave_up = tokio::time::timeout(Duration::from_millis(100), api.app.clone().oneshot(request)).await;
    assert!(gave_up.is_err(), "the client gave up before the answer");
    let metrics = api.coordinator.metrics();
    let text = metrics.render();
    let route = "/v1/groups/{streamPrefix}/{consumerGroup}/heartbeat";
    let counted = format!("rsc_http_requests_total{{method=\"POST\",route=\"{route}\",status=\"499\"}} 1");
    assert!(text.lines().any(|l| l == counted), "{counted} missing from:\n{text}");
    let observed = format!("rsc_http_request_duration_seconds_count{{route=\"{route}\"}} 1");
    assert!(text.lines().any(|l| l == observed), "{text}");
    assert_eq!(metrics.value("rsc_heartbeats_total", &vec![("status", "CANCELLED".to_string())]), 1.0, "{text}");
}
