//! Client credentials and member sessions at the router (issue #9): with client tokens
//! configured, the data plane answers 401 without a valid token and 403 for a token scoped to
//! another group, while health, metrics and the API description stay open; and no sequence of
//! unauthenticated, wrongly scoped, or session-less requests changes the stored record or the
//! liveness hash, or makes a valid member's next heartbeat fail.

use axum::http::StatusCode;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};

use rsc::core::protocol::ErrorCode;
use rsc::store::MetadataStore;

use super::{create_body, group, Api, CREATE, HEARTBEAT, ROUTING};

const VALID: &str = "valid-client-token-0001";
const OTHER_SCOPE: &str = "payments-client-token-01";
const SESSION: &str = "00112233445566778899aabbccddeeff";
const WRONG_SESSION: &str = "ffeeddccbbaa99887766554433221100";

async fn api() -> Api {
    let other = format!("payments:*={OTHER_SCOPE}");
    let api = Api::with_client_tokens(None, &[VALID, &other]).await;
    let created = api.json("POST", CREATE, Some(create_body(2))).await;
    assert_eq!(created.status, StatusCode::CREATED);
    api
}

fn join(member: &str, session: &str) -> Value {
    json!({
        "group": {"streamPrefix": "orders", "consumerGroup": "billing"},
        "memberId": member, "memberEpoch": 0, "metadataVersion": 0, "assignmentEpoch": 0,
        "memberSession": session
    })
}

async fn send(api: &Api, method: &str, uri: &str, auth: Option<&str>, body: Option<&Value>) -> super::Answer {
    let body = body.map(Value::to_string).unwrap_or_default();
    api.raw(method, uri, Some("application/json"), auth, body).await
}

#[tokio::test]
async fn data_plane_routes_need_a_client_token_in_scope_and_the_rest_stays_open() {
    let api = api().await;
    let valid = format!("Bearer {VALID}");
    let other = format!("Bearer {OTHER_SCOPE}");
    for (auth, status, code) in [
        (None, StatusCode::UNAUTHORIZED, Some(ErrorCode::Unauthorized)),
        (Some("Bearer not-a-configured-token"), StatusCode::UNAUTHORIZED, Some(ErrorCode::Unauthorized)),
        (Some(other.as_str()), StatusCode::FORBIDDEN, Some(ErrorCode::Forbidden)),
        (Some(valid.as_str()), StatusCode::OK, None),
    ] {
        let routing = send(&api, "GET", ROUTING, auth, None).await;
        assert_eq!(routing.status, status, "routing with {auth:?}");
        let heartbeat = send(&api, "POST", HEARTBEAT, auth, Some(&join("a", SESSION))).await;
        assert_eq!(heartbeat.status, status, "heartbeat with {auth:?}: {:?}", heartbeat.body);
        if let Some(code) = code {
            assert_eq!((routing.error().code, heartbeat.error().code), (code, code));
        }
    }
    for open in ["/healthz", "/readyz", "/metrics", "/v1/openapi.json"] {
        assert_eq!(send(&api, "GET", open, None, None).await.status, StatusCode::OK, "{open}");
    }
    let metrics = String::from_utf8_lossy(&send(&api, "GET", "/metrics", None, None).await.body).into_owned();
    assert!(!metrics.contains(VALID) && !metrics.contains(SESSION), "no secret is exported");
}

/// One request of an attacker without the right credential or session.
#[derive(Clone, Debug)]
enum Attack {
    /// A leave for `a` reporting every shard REVOKED, with a wrong or no session.
    ForgedLeave { session: bool },
    /// A steady heartbeat for `a` with a wrong session.
    ForgedSteady,
    /// Another process joining with `a`'s id.
    ImpostorJoin,
    /// Loss evidence: a version above the stored one, or more shards than recorded.
    Evidence { ahead: u64, shards: u32 },
}

fn attack() -> impl Strategy<Value = (Option<&'static str>, Attack)> {
    let auth = prop_oneof![
        Just(None),
        Just(Some("Bearer not-a-configured-token")),
        Just(Some("Basic dmFsaWQ=")),
        Just(Some("Bearer payments-client-token-01")),
        // A valid token: only requests without the member's session are attacks then.
        Just(Some("Bearer valid-client-token-0001")),
    ];
    let what = prop_oneof![
        any::<bool>().prop_map(|session| Attack::ForgedLeave { session }),
        Just(Attack::ForgedSteady),
        Just(Attack::ImpostorJoin),
        (1..1_000u64, 3..64u32).prop_map(|(ahead, shards)| Attack::Evidence { ahead, shards }),
    ];
    (auth, what)
}

#[test]
fn no_sequence_of_unauthenticated_or_session_less_requests_changes_anything_or_hurts_a_member() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut runner = TestRunner::new(Config { cases: 64, failure_persistence: None, ..Config::default() });
    let outcome = runner.run(&proptest::collection::vec(attack(), 1..12), |attacks| {
        runtime.block_on(async {
            let api = api().await;
            let valid = format!("Bearer {VALID}");
            let joined = send(&api, "POST", HEARTBEAT, Some(&valid), Some(&join("a", SESSION))).await;
            prop_assert_eq!(joined.status, StatusCode::OK);
            let a = joined.json();
            let before = (api.snapshot().await, api.store.liveness(&group()).await.expect("liveness"));
            let shards: Vec<Value> = a["assigned"]
                .as_array()
                .expect("assigned")
                .iter()
                .map(|s| json!({"shard": s, "inFlight": 0, "revoked": true}))
                .collect();
            let steady = json!({
                "group": {"streamPrefix": "orders", "consumerGroup": "billing"},
                "memberId": "a", "memberEpoch": a["memberEpoch"], "metadataVersion": a["metadataVersion"],
                "assignmentEpoch": a["assignmentEpoch"], "owned": a["assigned"], "memberSession": SESSION
            });
            for (auth, attack) in &attacks {
                let authenticated = *auth == Some(valid.as_str());
                let (method, uri, body) = match attack {
                    Attack::ForgedLeave { session } => {
                        let mut body = steady.clone();
                        body["leave"] = json!(true);
                        body["owned"] = json!([]);
                        body["revoking"] = json!(shards);
                        if *session {
                            body["memberSession"] = json!(WRONG_SESSION);
                        } else {
                            body.as_object_mut().expect("object").remove("memberSession");
                        }
                        ("POST", HEARTBEAT.to_string(), Some(body))
                    }
                    Attack::ForgedSteady => {
                        let mut body = steady.clone();
                        body["memberSession"] = json!(WRONG_SESSION);
                        ("POST", HEARTBEAT.to_string(), Some(body))
                    }
                    Attack::ImpostorJoin => ("POST", HEARTBEAT.to_string(), Some(join("a", WRONG_SESSION))),
                    Attack::Evidence { ahead, shards } => {
                        if authenticated {
                            // An authenticated client's report is evidence by design: not an attack.
                            continue;
                        }
                        let version = a["metadataVersion"].as_u64().expect("version") + ahead;
                        ("GET", format!("{ROUTING}?knownVersion={version}&knownShardCount={shards}"), None)
                    }
                };
                let answer = send(&api, method, &uri, *auth, body.as_ref()).await;
                prop_assert!(answer.status.is_client_error(), "{attack:?} with {auth:?}: {}", answer.status);
                let after = (api.snapshot().await, api.store.liveness(&group()).await.expect("liveness"));
                prop_assert!(after == before, "{attack:?} with {auth:?} changed the store");
            }
            let next = send(&api, "POST", HEARTBEAT, Some(&valid), Some(&steady)).await;
            prop_assert_eq!(next.status, StatusCode::OK, "{:?}", next.body);
            let status = next.json()["status"].as_str().map(str::to_owned);
            prop_assert_eq!(status.as_deref(), Some("OK"));
            Ok(())
        })
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}
