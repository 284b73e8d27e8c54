//! End to end through Redis Sentinel: the real `coordinator` binary finds its Redis master through
//! a sentinel (`--redis-url redis://mymaster` plus the `redis_sentinels` / `redis_sentinel_master`
//! file keys; the flags and environment variables are unit tested in `src/bin/coordinator`), the
//! primary is killed, Sentinel promotes the replica, and heartbeats keep being answered: 503
//! `STORE_UNAVAILABLE` during the switch only, then 200 from the new master, whose new identity the
//! coordinator logs as evidence of lost writes.
//!
//! Run: `cargo test --test e2e_sentinel` (needs `redis-server` >= 6.2, which also runs the sentinel
//! with `--sentinel`). Real tokio; not built under `--cfg madsim`.

#![cfg(not(madsim))]

mod e2e_support;
#[allow(unused_imports)] // The harness re-exports what other test binaries use.
mod support;

use std::time::{Duration, Instant};

use e2e_support::process::{http, CoordinatorProcess, HttpAnswer};
use e2e_support::{fast_config, group, heartbeat_json};
use rsc::core::model::GroupId;
use rsc::http::routes::{group_path, RouteId};
use support::sentinel::{SentinelConfig, SentinelServer};
use support::RedisServer;

/// Bound on the failover as the coordinator's clients see it.
const FAILOVER_MAX: Duration = Duration::from_secs(30);

/// One heartbeat of `member` with the versions of its last answer (`None`: join).
async fn heartbeat(coordinator: &CoordinatorProcess, group: &GroupId, last: Option<&serde_json::Value>) -> HttpAnswer {
    let body = heartbeat_json(group, "alpha", last);
    let path = group_path(RouteId::Heartbeat, group);
    let json = ("Content-Type", "application/json");
    http(coordinator.addr(), "POST", &path, &[json], body).await.expect("heartbeat exchange")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_keeps_answering_heartbeats_across_a_sentinel_failover() {
    let mut primary = RedisServer::start();
    let replica = primary.start_replica();
    let sentinel = SentinelServer::start(&primary, SentinelConfig::default());
    sentinel.wait_replicas(1);
    let config = format!("redis_sentinels = [{:?}]\nredis_sentinel_master = \"mymaster\"\n", sentinel.address());
    let coordinator = CoordinatorProcess::start_with_config("redis://mymaster", "e2e-sentinel", &config).await;

    let group = group("sentinel");
    coordinator.create_group(&group, 2, &fast_config()).await;
    let joined = heartbeat(&coordinator, &group, None).await;
    assert_eq!(joined.status, 200, "{}", String::from_utf8_lossy(&joined.body));
    let mut last = joined.json();
    assert!(last["memberEpoch"].as_u64().is_some_and(|e| e > 0), "joined: {last}");
    let answer = heartbeat(&coordinator, &group, Some(&last)).await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    last = answer.json();

    // Wait until the replica holds the recorded metadata, so the failover loses nothing and the
    // test is about following it (replication is asynchronous).
    let key = rsc::store::keys::metadata_key(&group);
    let deadline = Instant::now() + Duration::from_secs(10);
    while replica.try_cmd(&["HGET", &key, "revision"]).ok() != primary.try_cmd(&["HGET", &key, "revision"]).ok() {
        assert!(Instant::now() < deadline, "the replica never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    primary.kill();
    let killed = Instant::now();
    let mut unavailable = 0u32;
    let recovered_after = loop {
        assert!(killed.elapsed() < FAILOVER_MAX, "no 200 within {FAILOVER_MAX:?}:\n{}", sentinel.log_tail());
        let sent = Instant::now();
        let answer = heartbeat(&coordinator, &group, Some(&last)).await;
        assert!(sent.elapsed() < Duration::from_secs(5), "a heartbeat took {:?}", sent.elapsed());
        if answer.status == 200 {
            last = answer.json();
            break killed.elapsed();
        }
        let error = answer.error();
        assert_eq!(answer.status, 503, "only STORE_UNAVAILABLE is allowed during the switch: {error:?}");
        assert_eq!(serde_json::to_value(error.code).expect("code"), "STORE_UNAVAILABLE", "{error:?}");
        unavailable += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("{unavailable} STORE_UNAVAILABLE answers, first 200 {recovered_after:?} after the kill: {last}");
    assert_eq!(sentinel.master_port(), Some(replica.port()), "Sentinel promoted the replica");

    // Heartbeats go on being answered from the new master: each one answered 200 from here on
    // bumps alpha's liveness counter there (the counter as of the kill may have been replicated
    // already, so only its growth since the promotion shows heartbeats reaching the new master).
    let liveness_key = rsc::store::keys::liveness_key(&group);
    let counter = || -> u64 {
        let value = replica.cmd(&["HGET", &liveness_key, "alpha"]);
        redis::from_redis_value(value.clone()).unwrap_or_else(|e| panic!("alpha's liveness counter {value:?}: {e}"))
    };
    let promoted = counter();
    const AFTER: u64 = 5;
    for _ in 0..AFTER {
        let answer = heartbeat(&coordinator, &group, Some(&last)).await;
        assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
        last = answer.json();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = counter();
    assert!(
        now >= promoted + AFTER,
        "heartbeats reach the new master: liveness counter {promoted} then {now} after {AFTER} heartbeats answered 200"
    );
    let log = coordinator.log();
    assert!(log.contains("store identity changed"), "the coordinator saw the new master's identity:\n{log}");
}
