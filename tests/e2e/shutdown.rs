//! Graceful shutdown as the README documents it, seen by clients that open NEW connections after
//! SIGTERM (a load balancer or a Kubernetes Service still sending traffic until its endpoints
//! drop the instance): for `--shutdown-accept-ms` the listener keeps accepting, `/healthz` is
//! 200, `/readyz` 503, routing is served, and every mutation (a join, a steady heartbeat, an admin
//! change) gets 503 `COORDINATOR_TERMINATING` and writes nothing; then the listener closes and
//! the process exits 0 within a bound.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::e2e_support::process::{http, CoordinatorProcess, HttpAnswer, Listener, ADMIN_TOKEN};
use crate::e2e_support::{fast_config, group, heartbeat_json, join_json};
use crate::support::RedisServer;
use rsc::core::protocol::ErrorCode;
use rsc::http::routes::{group_path, RouteId};

/// The accept window of this test: long enough for several rounds of probes after SIGTERM.
const ACCEPT_MS: u64 = 3_000;
/// The harness's `--shutdown-timeout-ms`.
const SHUTDOWN_TIMEOUT_MS: u64 = 5_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigterm_new_connections_get_the_documented_answers_until_the_accept_window_ends() {
    let redis = RedisServer::start();
    let listener = Listener { args: vec!["--shutdown-accept-ms".into(), ACCEPT_MS.to_string()], tls: None };
    let mut coordinator = CoordinatorProcess::start_with_listener(&redis.url(), "e2e-shutdown", "", listener).await;
    let addr = coordinator.addr();
    let group = group("shutdown");
    coordinator.create_group(&group, 4, &fast_config()).await;
    let heartbeat_path = group_path(RouteId::Heartbeat, &group);
    let json = [("Content-Type", "application/json")];
    let joined = http(addr, "POST", &heartbeat_path, &json, join_json(&group, "alpha").into_bytes()).await;
    let joined = joined.expect("join answered");
    assert_eq!(joined.status, 200, "{}", String::from_utf8_lossy(&joined.body));
    let before = coordinator.describe(&group).await;

    let sigterm_at = Instant::now();
    coordinator.sigterm();
    let mut readyz = 0;
    // The signal is handled asynchronously: wait (bounded) until a new connection sees it.
    while readyz != 503 {
        assert!(sigterm_at.elapsed() < Duration::from_secs(2), "/readyz never turned 503 after SIGTERM");
        readyz = http(addr, "GET", "/readyz", &[], Vec::new()).await.expect("/readyz answered").status;
    }

    // Rounds of probes, each request on a fresh connection, until shortly before the window ends.
    let routing_path = group_path(RouteId::Routing, &group);
    let add_shards_path = group_path(RouteId::AddShards, &group);
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let admin = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
    let steady = heartbeat_json(&group, "alpha", Some(&joined.json()));
    let add_shards = serde_json::json!({"expectedRevision": before["storeRevision"], "newShardCount": 8}).to_string();
    let probe = |method: &'static str, path: String, headers: Vec<(&'static str, String)>, body: Vec<u8>| async move {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let answer = http(addr, method, &path, &headers, body).await;
        answer.unwrap_or_else(|e| panic!("{method} {path} on a new connection after SIGTERM: {e}"))
    };
    let owned = |pairs: &[(&'static str, &str)]| pairs.iter().map(|(n, v)| (*n, v.to_string())).collect::<Vec<_>>();
    let mut rounds = 0;
    let mut last_round_ms = 0;
    while sigterm_at.elapsed() < Duration::from_millis(ACCEPT_MS - 600) {
        let healthz = probe("GET", "/healthz".into(), vec![], vec![]).await;
        assert_eq!((healthz.status, healthz.json()["terminating"].as_bool()), (200, Some(true)));
        let readyz = probe("GET", "/readyz".into(), vec![], vec![]).await;
        assert_eq!((readyz.status, readyz.error().code), (503, ErrorCode::CoordinatorTerminating));
        let routing = probe("GET", routing_path.clone(), vec![], vec![]).await;
        assert_eq!(routing.status, 200, "routing is still served: {}", String::from_utf8_lossy(&routing.body));
        assert_eq!(routing.json()["shardCount"].as_u64(), Some(4), "{}", String::from_utf8_lossy(&routing.body));
        let join = join_json(&group, "beta").into_bytes();
        assert_terminating(&probe("POST", heartbeat_path.clone(), owned(&json), join).await, "a join");
        let steady_answer = probe("POST", heartbeat_path.clone(), owned(&json), steady.clone()).await;
        assert_terminating(&steady_answer, "a steady heartbeat");
        let add = probe("POST", add_shards_path.clone(), owned(&admin), add_shards.clone().into_bytes()).await;
        assert_terminating(&add, "add-shards");
        rounds += 1;
        last_round_ms = sigterm_at.elapsed().as_millis();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        rounds >= 3 && last_round_ms >= u128::from(ACCEPT_MS - 1_000),
        "{rounds} rounds, last at {last_round_ms} ms"
    );

    let bound = Duration::from_millis(ACCEPT_MS + SHUTDOWN_TIMEOUT_MS + 2_000);
    let status = coordinator.wait_exit(bound).await;
    let exited_ms = sigterm_at.elapsed().as_millis();
    let status = status.unwrap_or_else(|| panic!("no exit within {bound:?} of SIGTERM:\n{}", coordinator.log()));
    assert_eq!(status.code(), Some(0), "graceful shutdown exits 0:\n{}", coordinator.log());
    assert!(exited_ms >= u128::from(ACCEPT_MS), "exited {exited_ms} ms after SIGTERM, inside the accept window");
    let log = coordinator.log();
    assert!(log.contains("accepting new connections for 3000 ms") && log.contains("accept window over"), "{log}");
    let after = http(addr, "GET", "/healthz", &[], Vec::new()).await;
    assert!(after.is_err(), "nothing listens after the exit: {after:?}");

    // Nothing the refused mutations carried was written: the record is the one before SIGTERM.
    let successor = CoordinatorProcess::start(&redis.url(), "e2e-shutdown-successor").await;
    let now = successor.describe(&group).await;
    assert_eq!(now["storeRevision"], before["storeRevision"], "{now}");
    assert_eq!(now["metadata"]["shardCount"].as_u64(), Some(4));
    let members: Vec<&String> = now["metadata"]["members"].as_object().expect("members").keys().collect();
    assert_eq!(members, ["alpha"], "beta's join was refused");
    eprintln!("shutdown: {rounds} rounds of new-connection probes after SIGTERM, last at {last_round_ms} ms; exit at {exited_ms} ms");
}

fn assert_terminating(answer: &HttpAnswer, what: &str) {
    let body: Value = answer.json();
    assert_eq!(
        (answer.status, answer.error().code),
        (503, ErrorCode::CoordinatorTerminating),
        "{what} after SIGTERM: {body}"
    );
}
