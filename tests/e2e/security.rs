//! Issue #9 on the real binary: the review's data-plane attacks, now refused with no effect.
//!
//! The coordinator runs with a client token. The attacker is the strongest the review assumed:
//! it holds a valid client token (an authenticated but malicious or buggy client), learned the
//! victim's member id, epoch and shards (from `describe`), and sends requests exactly as a client
//! would — only without the victim's session secret, which never leaves the victim's process.
//!
//! - a forged leave reporting every victim shard REVOKED: 403 `SESSION_MISMATCH`, nothing recorded,
//!   no two readers of a shard in the ground-truth ledger (that liveness is untouched too is
//!   checked by `tests/service.rs`, where no live member heartbeats meanwhile);
//! - a second process joining with the victim's id: 409 `MEMBER_ID_IN_USE` while the victim lives
//!   (the two no longer fence each other); once the victim leaves, the id is free;
//! - forged loss evidence (`routing?knownVersion=stored+1`) without a token or with one scoped to
//!   another group: 401 / 403, no correction round;
//! - a heartbeat without a token: 401;
//! - forged loss evidence *with* the token (a shard count of 65,536, a version ahead with a
//!   made-up proof, a heartbeat of a member nobody joined naming a version ahead): no effect,
//!   since none carries a proof the coordinator gave (DESIGN §8).

use std::time::Duration;

use crate::e2e_support::checks::shares_all;
use crate::e2e_support::fleet::{AppSettings, ConsumerApp, Fleet};
use crate::e2e_support::ground_truth::assert_no_split;
use crate::e2e_support::process::{http, CoordinatorProcess};
use crate::e2e_support::{fast_config, group, metric_total, wait_until};
use crate::support::RedisServer;
use rsc::http::routes::{group_path, RouteId};

const TOKEN: &str = "client-token-for-the-security-test";
const OTHER_SCOPE_TOKEN: &str = "token-of-another-group-0123456789";

/// A real `redis-server`, the real binary with `config`, a 4-shard group and two consumers
/// (holding [`TOKEN`]) that share its shards.
struct Setup {
    redis: RedisServer,
    coordinator: CoordinatorProcess,
    group: rsc::core::model::GroupId,
    fleet: Fleet,
    alpha: ConsumerApp,
    bravo: ConsumerApp,
}

impl Setup {
    async fn start(name: &str, config: &str) -> Self {
        let redis = RedisServer::start();
        let coordinator = CoordinatorProcess::start_with_config(&redis.url(), &format!("e2e-{name}"), config).await;
        let group = group(name);
        coordinator.create_group(&group, 4, &fast_config()).await;
        let mut fleet = Fleet::new(group.clone(), vec![coordinator.addr()], redis.url());
        fleet.client_token = Some(TOKEN.into());
        let alpha = fleet.consumer("alpha", AppSettings::default()).await;
        let bravo = fleet.consumer("bravo", AppSettings::default()).await;
        wait_until("two consumers share 4 shards", Duration::from_secs(15), || shares_all(&[&alpha, &bravo], 4)).await;
        Self { redis, coordinator, group, fleet, alpha, bravo }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_leaves_impersonating_joins_and_unauthenticated_evidence_are_refused_with_no_effect() {
    let config = format!("client_tokens = [\"{TOKEN}\", \"payments:*={OTHER_SCOPE_TOKEN}\"]\n");
    let Setup { redis, coordinator, group, fleet, alpha, bravo } = Setup::start("security", &config).await;
    let producer = fleet.producer("producer").await;
    for i in 0..200 {
        assert!(producer.publish(i).await, "publish {i}");
    }

    let heartbeat = group_path(RouteId::Heartbeat, &group);
    let routing = group_path(RouteId::Routing, &group);
    let bearer = format!("Bearer {TOKEN}");
    let json = ("Content-Type", "application/json");
    let auth = ("Authorization", bearer.as_str());
    let metadata_key = rsc::store::keys::metadata_key(&group);
    let described = coordinator.describe(&group).await;
    let alpha_record = &described["metadata"]["members"]["alpha"];
    let epoch = alpha_record["memberEpoch"].as_u64().expect("alpha's epoch");
    let shards: Vec<u64> = described["metadata"]["current"]
        .as_object()
        .expect("current")
        .iter()
        .filter(|(_, owner)| owner["member"] == "alpha")
        .map(|(shard, _)| shard.parse().expect("shard id"))
        .collect();
    assert!(!shards.is_empty(), "alpha owns shards");
    let version = described["metadata"]["metadataVersion"].as_u64().expect("version");
    let forged_leave = serde_json::json!({
        "group": {"streamPrefix": group.stream_prefix, "consumerGroup": group.consumer_group},
        "memberId": "alpha", "memberEpoch": epoch, "metadataVersion": version, "assignmentEpoch": 0,
        "owned": [], "leave": true,
        "revoking": shards.iter().map(|s| serde_json::json!({"shard": s, "inFlight": 0, "revoked": true})).collect::<Vec<_>>(),
        "memberSession": "0123456789abcdef0123456789abcdef",
    });
    let mut without_session = forged_leave.clone();
    without_session.as_object_mut().expect("object").remove("memberSession");
    let impostor_join = serde_json::json!({
        "group": {"streamPrefix": group.stream_prefix, "consumerGroup": group.consumer_group},
        "memberId": "alpha", "memberEpoch": 0, "metadataVersion": 0, "assignmentEpoch": 0,
        "memberSession": "fedcba9876543210fedcba9876543210",
    });

    // Every answer of the real binary below is checked against docs/openapi.json as well.
    let doc: serde_json::Value =
        serde_json::from_str(include_str!("../../docs/openapi.json")).expect("docs/openapi.json is JSON");
    let documented = |template: &str, method: &str, answer: &crate::e2e_support::process::HttpAnswer| {
        let status = answer.status.to_string();
        let schema = &doc["paths"][template][method]["responses"][&status]["content"]["application/json"]["schema"];
        assert!(!schema.is_null(), "{method} {template} {status} is undocumented");
        let errors = crate::schema::validate(&doc, schema, &answer.json(), "$");
        assert!(errors.is_empty(), "{method} {template} {status}: {errors:?}");
    };
    let heartbeat_template = "/v1/groups/{streamPrefix}/{consumerGroup}/heartbeat";
    let routing_template = "/v1/groups/{streamPrefix}/{consumerGroup}/routing";
    for _ in 0..3 {
        let before_metadata = redis.cmd(&["HGETALL", &metadata_key]);
        for body in [&forged_leave, &without_session] {
            let answer = http(coordinator.addr(), "POST", &heartbeat, &[json, auth], body.to_string().into_bytes())
                .await
                .expect("answer");
            assert_eq!(answer.status, 403, "{}", String::from_utf8_lossy(&answer.body));
            assert_eq!(answer.error().code, rsc::core::protocol::ErrorCode::SessionMismatch);
            documented(heartbeat_template, "post", &answer);
        }
        let answer =
            http(coordinator.addr(), "POST", &heartbeat, &[json, auth], impostor_join.to_string().into_bytes())
                .await
                .expect("answer");
        assert_eq!(answer.status, 409, "{}", String::from_utf8_lossy(&answer.body));
        assert_eq!(answer.error().code, rsc::core::protocol::ErrorCode::MemberIdInUse);
        documented(heartbeat_template, "post", &answer);
        // Forged evidence: no token, a token of another scope, then no token on a heartbeat.
        let lost = format!("{routing}?knownVersion={}", version + 5);
        let answer = http(coordinator.addr(), "GET", &lost, &[], Vec::new()).await.expect("answer");
        assert_eq!(answer.status, 401);
        documented(routing_template, "get", &answer);
        let other = format!("Bearer {OTHER_SCOPE_TOKEN}");
        let answer =
            http(coordinator.addr(), "GET", &lost, &[("Authorization", &other)], Vec::new()).await.expect("answer");
        assert_eq!(answer.status, 403);
        let answer = http(coordinator.addr(), "POST", &heartbeat, &[json], without_session.to_string().into_bytes())
            .await
            .expect("answer");
        assert_eq!(answer.status, 401);
        // Forged evidence *with* the token (the black-box review's findings): a shard count, a
        // version with a made-up proof, and a heartbeat of a member nobody joined naming a
        // version ahead. None carries a proof the coordinator gave, so none changes anything.
        for forged in [
            format!("{routing}?knownShardCount=65536"),
            format!("{routing}?knownVersion={}&knownVersionProof={}", version + 5, "0".repeat(32)),
        ] {
            let answer = http(coordinator.addr(), "GET", &forged, &[auth], Vec::new()).await.expect("answer");
            assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
            assert_eq!(answer.json()["shardCount"], 4, "{forged}");
            documented(routing_template, "get", &answer);
        }
        let malformed = format!("{routing}?knownVersion={}&knownVersionProof=xyz", version + 5);
        let answer = http(coordinator.addr(), "GET", &malformed, &[auth], Vec::new()).await.expect("answer");
        assert_eq!(answer.status, 400, "a malformed proof is a typed error");
        documented(routing_template, "get", &answer);
        let ghost = serde_json::json!({
            "group": {"streamPrefix": group.stream_prefix, "consumerGroup": group.consumer_group},
            "memberId": "ghost", "memberEpoch": epoch, "metadataVersion": version + 5, "assignmentEpoch": 0,
            "memberSession": "00112233445566778899aabbccddeeff",
        });
        let answer = http(coordinator.addr(), "POST", &heartbeat, &[json, auth], ghost.to_string().into_bytes())
            .await
            .expect("answer");
        assert_eq!(answer.error().code, rsc::core::protocol::ErrorCode::UnknownMember);
        documented(heartbeat_template, "post", &answer);
        assert_eq!(redis.cmd(&["HGETALL", &metadata_key]), before_metadata, "no attack recorded anything");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Alpha kept its member record and its shards, and nobody else read them meanwhile.
    let described = coordinator.describe(&group).await;
    assert_eq!(described["metadata"]["members"]["alpha"]["memberEpoch"].as_u64(), Some(epoch), "same incarnation");
    assert!(described["metadata"]["correction"].is_null(), "no correction round from forged evidence");
    assert!(shares_all(&[&alpha, &bravo], 4), "both still read their shards");
    let metrics = coordinator.metrics().await;
    assert!(metric_total(&metrics, "rsc_member_session_refused_total") >= 9.0, "{metrics}");
    assert!(metric_total(&metrics, "rsc_unproven_client_reports_total") >= 9.0, "{metrics}");
    assert_no_split(&fleet.reads);

    // Once alpha leaves, its id is free for another process.
    alpha.close(Duration::from_secs(10)).await;
    wait_until("bravo owns every shard", Duration::from_secs(15), || shares_all(&[&bravo], 4)).await;
    let answer = http(coordinator.addr(), "POST", &heartbeat, &[json, auth], impostor_join.to_string().into_bytes())
        .await
        .expect("answer");
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    documented(heartbeat_template, "post", &answer);
    let routed = http(coordinator.addr(), "GET", &routing, &[auth], Vec::new()).await.expect("answer");
    documented(routing_template, "get", &routed);
    assert_no_split(&fleet.reads);
    coordinator.assert_no_error_logged();
    drop((bravo, producer));
}

/// Heartbeats of member ids nobody joined, with a valid token, are answered UNKNOWN_MEMBER; each
/// touched a liveness field first, and those fields stayed for good (every tick reads the hash
/// whole). On the real binary and Redis: past `ORPHAN_LIVENESS_MAX` of them, a tick removes them
/// all, so a flood of three times the bound leaves at most the bound; the members' own fields
/// stay, and the consumers keep their shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeats_of_made_up_member_ids_leave_a_bounded_number_of_liveness_fields() {
    let config = format!("client_tokens = [\"{TOKEN}\"]\n");
    let Setup { redis, coordinator, group, fleet, alpha, bravo } = Setup::start("orphans", &config).await;

    let heartbeat = group_path(RouteId::Heartbeat, &group);
    let bearer = format!("Bearer {TOKEN}");
    let headers = [("Content-Type", "application/json"), ("Authorization", bearer.as_str())];
    let liveness_key = rsc::store::keys::liveness_key(&group);
    let fields = || -> i64 { redis::from_redis_value(redis.cmd(&["HLEN", &liveness_key])).expect("HLEN") };
    let flood = 3 * rsc::core::model::ORPHAN_LIVENESS_MAX;
    for i in 0..flood {
        let ghost = serde_json::json!({
            "group": {"streamPrefix": group.stream_prefix, "consumerGroup": group.consumer_group},
            "memberId": format!("ghost-{i}"), "memberEpoch": 7, "metadataVersion": 1, "assignmentEpoch": 0,
            "memberSession": "00112233445566778899aabbccddeeff",
        });
        let answer = http(coordinator.addr(), "POST", &heartbeat, &headers, ghost.to_string().into_bytes())
            .await
            .expect("answer");
        assert_eq!(answer.error().code, rsc::core::protocol::ErrorCode::UnknownMember);
    }
    // Ticks removed them as they passed the bound: at most the bound's worth is left, not one
    // field per forged id.
    let bound = 2 + rsc::core::model::ORPHAN_LIVENESS_MAX as i64;
    wait_until("the orphaned fields are within the bound", Duration::from_secs(10), || fields() <= bound).await;
    let left: Vec<String> = redis::from_redis_value(redis.cmd(&["HKEYS", &liveness_key])).expect("HKEYS");
    assert!(left.iter().any(|f| f == "alpha") && left.iter().any(|f| f == "bravo"), "the members' fields stay");
    assert!(left.iter().all(|f| f == "alpha" || f == "bravo" || f.starts_with("ghost-")), "{left:?}");
    assert!(shares_all(&[&alpha, &bravo], 4), "both still read their shards");
    assert_no_split(&fleet.reads);
    coordinator.assert_no_error_logged();
}
