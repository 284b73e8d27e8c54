//! Random requests against every route that takes input: arbitrary JSON values, arbitrary bytes,
//! protocol bodies with one edit (a value of the wrong JSON type, a field removed, an unknown field
//! added), random content types, random query strings and path segments. For each: the router
//! does not panic, the status is a 4xx that `docs/openapi.json` documents for the operation (never
//! a 5xx: the store is healthy), the body is an `ApiError`, and nothing was written.

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Map, Value};

use rsc::http::routes::{encode_segment, spec, RouteId};

use super::openapi::{document, documented_statuses};
use super::{join_body, Api, TOKEN};

/// Field names of the protocol bodies, so random objects sometimes hit real fields.
const KEYS: &[&str] = &[
    "group",
    "streamPrefix",
    "consumerGroup",
    "memberId",
    "memberEpoch",
    "metadataVersion",
    "assignmentEpoch",
    "owned",
    "revoking",
    "leave",
    "shardCount",
    "config",
    "expectedRevision",
    "newShardCount",
    "op",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let key = prop_oneof![proptest::sample::select(KEYS).prop_map(str::to_owned), "[a-zA-Z]{0,8}"];
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(key, inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A valid body of `route` for the existing group that still cannot write: the heartbeat is from
/// a member the group does not know (epoch 5: UNKNOWN_MEMBER), the create names the existing group
/// (GROUP_EXISTS), the others name a revision the group never had (REVISION_CONFLICT). An edit
/// can only make it invalid or leave it refused, because no edit keeps a field's JSON type.
fn template(route: RouteId) -> Value {
    let config = json!({"memberLeaseTtlMs": 10000, "assignmentLeaseMs": 8000, "heartbeatIntervalMs": 1000,
        "rebalanceTimeoutMs": 30000, "routingCacheTtlMs": 10000, "routingRefreshIntervalMs": 3000,
        "assignor": "range"});
    match route {
        RouteId::Heartbeat => {
            let mut body = join_body("fuzz");
            body["memberEpoch"] = json!(5);
            body["owned"] = json!([0]);
            body["revoking"] = json!([{"shard": 1, "inFlight": 0, "revoked": true}]);
            body["leave"] = json!(false);
            body
        }
        RouteId::CreateGroup => json!({"group": {"streamPrefix": "orders", "consumerGroup": "billing"},
            "shardCount": 2, "config": config}),
        RouteId::AddShards => json!({"expectedRevision": 999, "newShardCount": 3}),
        _ => json!({"expectedRevision": 999, "config": config}),
    }
}

/// How a template is changed: a value replaced by a random one of another JSON type, a field or
/// element removed, or an unknown field added (at the top or in a nested object).
#[derive(Clone, Debug)]
enum Edit {
    Retype { slot: usize, value: Value },
    Remove { slot: usize },
    AddUnknown { slot: usize, value: Value },
}

/// Every object member and array element of `value`, as JSON pointers.
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                let here = format!("{at}/{key}");
                out.push(here.clone());
                pointers(inner, here, out);
            }
        }
        Value::Array(items) => {
            for (i, inner) in items.iter().enumerate() {
                let here = format!("{at}/{i}");
                out.push(here.clone());
                pointers(inner, here, out);
            }
        }
        _ => {}
    }
}

fn same_type(a: &Value, b: &Value) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// Applies `edit`; `None` when it does not apply (a retype to the same JSON type).
fn edited(mut body: Value, edit: &Edit) -> Option<Value> {
    let mut slots = Vec::new();
    pointers(&body, String::new(), &mut slots);
    match edit {
        Edit::Retype { slot, value } => {
            let target = body.pointer_mut(&slots[slot % slots.len()])?;
            if same_type(target, value) {
                return None;
            }
            *target = value.clone();
        }
        Edit::Remove { slot } => {
            let (parent, key) = slots[slot % slots.len()].rsplit_once('/')?;
            match body.pointer_mut(parent)? {
                Value::Object(map) => {
                    map.remove(key)?;
                }
                Value::Array(items) => {
                    items.remove(key.parse().ok()?);
                }
                _ => return None,
            }
        }
        Edit::AddUnknown { slot, value } => {
            let objects: Vec<String> =
                slots.into_iter().filter(|p| body.pointer(p).is_some_and(Value::is_object)).collect();
            let target =
                if objects.is_empty() || slot % 3 == 0 { String::new() } else { objects[slot % objects.len()].clone() };
            body.pointer_mut(&target)?.as_object_mut()?.insert("unexpectedField".into(), value.clone());
        }
    }
    Some(body)
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), json_value()).prop_map(|(slot, value)| Edit::Retype { slot, value }),
        any::<usize>().prop_map(|slot| Edit::Remove { slot }),
        (any::<usize>(), json_value()).prop_map(|(slot, value)| Edit::AddUnknown { slot, value }),
    ]
}

#[derive(Clone, Debug)]
enum Payload {
    Json(Value),
    Bytes(Vec<u8>),
    Edited(Edit),
}

fn payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        1 => json_value().prop_map(Payload::Json),
        1 => vec(any::<u8>(), 0..200).prop_map(Payload::Bytes),
        2 => edit().prop_map(Payload::Edited),
    ]
}

fn content_type() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![
        6 => Just(Some("application/json")),
        1 => Just(Some("application/json; charset=utf-8")),
        1 => Just(Some("text/plain")),
        1 => Just(None),
    ]
}

#[derive(Clone, Debug)]
enum Case {
    Body { route: RouteId, payload: Payload, content_type: Option<&'static str> },
    DeleteQuery(String),
    RoutingPath(String, String),
}

fn case() -> impl Strategy<Value = Case> {
    let route = proptest::sample::select(vec![
        RouteId::Heartbeat,
        RouteId::CreateGroup,
        RouteId::AddShards,
        RouteId::ChangeConfig,
    ]);
    prop_oneof![
        6 => (route, payload(), content_type())
            .prop_map(|(route, payload, content_type)| Case::Body { route, payload, content_type }),
        1 => "[a-zA-Z0-9=&%+._-]{0,24}".prop_map(Case::DeleteQuery),
        1 => (".{0,10}", ".{0,10}").prop_map(|(p, g)| Case::RoutingPath(p, g)),
    ]
}

/// (route, uri, content type, body) of a case; `None` when the case is skipped.
fn request(case: &Case) -> Option<(RouteId, String, Option<&'static str>, Vec<u8>)> {
    let group_uri = |id| spec(id).path.replace("{streamPrefix}", "orders").replace("{consumerGroup}", "billing");
    Some(match case {
        Case::Body { route, payload, content_type } => {
            let body = match payload {
                Payload::Json(value) => value.to_string().into_bytes(),
                Payload::Bytes(bytes) => bytes.clone(),
                Payload::Edited(edit) => edited(template(*route), edit)?.to_string().into_bytes(),
            };
            (*route, group_uri(*route), *content_type, body)
        }
        Case::DeleteQuery(query) => {
            (RouteId::DeleteGroup, format!("{}?{query}", group_uri(RouteId::DeleteGroup)), None, Vec::new())
        }
        Case::RoutingPath(prefix, group) => {
            let uri = format!("/v1/groups/{}/{}/routing", encode_segment(prefix), encode_segment(group));
            (RouteId::Routing, uri, None, Vec::new())
        }
    })
}

/// The one status some cases must get: 415 without a JSON content type, 400 for an unknown field.
fn exact_status(case: &Case) -> Option<u16> {
    let Case::Body { payload, content_type, .. } = case else { return None };
    if !content_type.is_some_and(|t| t.starts_with("application/json")) {
        return Some(415);
    }
    matches!(payload, Payload::Edited(Edit::AddUnknown { .. })).then_some(400)
}

#[test]
fn random_requests_get_documented_4xx_api_errors_and_write_nothing() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let api = runtime.block_on(Api::with_group(Some(TOKEN), 2));
    let doc = document();
    let before = runtime.block_on(api.snapshot());
    let bearer = format!("Bearer {TOKEN}");
    let mut runner = TestRunner::new(Config { cases: 512, failure_persistence: None, ..Config::default() });
    let outcome = runner.run(&case(), |case| {
        let Some((route, uri, content_type, body)) = request(&case) else { return Ok(()) };
        let route = spec(route);
        let answer = runtime.block_on(api.raw(route.method.as_str(), &uri, content_type, Some(&bearer), body));
        let status = answer.status.as_u16();
        let shown = String::from_utf8_lossy(&answer.body).into_owned();
        if route.id == RouteId::Routing && status == 200 {
            // A random path can name the existing group; that read is a fine answer.
            return Ok(());
        }
        prop_assert!(status < 500, "{} {uri}: {status} {shown}", route.method.as_str());
        prop_assert!((400..500).contains(&status), "accepted: {uri}: {status} {shown}");
        if let Some(expected) = exact_status(&case) {
            prop_assert_eq!(status, expected, "{} {}", uri, shown);
        }
        let documented = documented_statuses(&doc, route.method, route.path);
        prop_assert!(documented.contains(&status), "undocumented {status} for {uri}: {shown}");
        let parsed: Result<rsc::core::protocol::ApiError, _> = serde_json::from_slice(&answer.body);
        prop_assert!(parsed.is_ok(), "not an ApiError: {shown}");
        let after = runtime.block_on(api.snapshot());
        if after != before {
            return Err(TestCaseError::fail(format!("{uri} wrote: {after:?}")));
        }
        Ok(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}
