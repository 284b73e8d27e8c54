//! Story 6: metadata edited behind the coordinator's back on a real Redis (the seed's "Redis
//! Metadata Volatility and Corruption"): every shape of damage fails closed with
//! `METADATA_INCOMPATIBLE`, is counted in `rsc_metadata_schema_errors_total`, is never overwritten,
//! and the group serves again once an operator repairs the hash.

use std::time::{Duration, Instant};

use crate::e2e_support::process::{http, CoordinatorProcess, HttpAnswer, LONG_LEASES_SERVE_CONFIG};
use crate::e2e_support::{group, heartbeat_json, metric_total};
use crate::support::RedisServer;
use rsc::core::model::{GroupConfig, GroupId};
use rsc::core::protocol::ErrorCode;
use rsc::http::routes::{group_path, RouteId};
use rsc::store::keys;

async fn heartbeat(c: &CoordinatorProcess, group: &GroupId, body: Vec<u8>) -> HttpAnswer {
    let path = group_path(RouteId::Heartbeat, group);
    http(c.addr(), "POST", &path, &[("Content-Type", "application/json")], body).await.expect("an answer")
}

/// Heartbeats until one fails closed with `METADATA_INCOMPATIBLE` (bounded: the cached path sees an
/// aggregate edited in place at the next tick, 250 ms by default).
async fn fails_closed_within(c: &CoordinatorProcess, group: &GroupId, body: &[u8], bound: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let answer = heartbeat(c, group, body.to_vec()).await;
        if answer.status != 200 {
            assert_eq!(answer.error().code, ErrorCode::MetadataIncompatible, "{answer:?}");
            return started.elapsed();
        }
        assert!(started.elapsed() < bound, "still answering 200 after {bound:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Long leases, and an idle-group audit of 2 s instead of 120 s: the bound on how late an
/// aggregate edited in place is seen.
fn corruption_config() -> String {
    format!("{LONG_LEASES_SERVE_CONFIG}idle_group_audit_ms = 2000\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_edited_metadata_fails_closed_is_never_overwritten_and_recovers_after_repair() {
    let redis = RedisServer::start();
    let coordinator = CoordinatorProcess::start_with_config(&redis.url(), "e2e-corruption", &corruption_config()).await;
    let group = group("corruption");
    coordinator.create_group(&group, 2, &GroupConfig::default()).await;
    let meta = keys::metadata_key(&group);
    let joined = heartbeat(&coordinator, &group, heartbeat_json(&group, "alpha", None)).await;
    assert_eq!(joined.status, 200, "{joined:?}");
    let steady = heartbeat_json(&group, "alpha", Some(&joined.json()));
    assert_eq!(heartbeat(&coordinator, &group, steady.clone()).await.status, 200);
    let hash = || redis.cmd(&["HGETALL", &meta]);
    let schema_errors = || async { metric_total(&coordinator.metrics().await, "rsc_metadata_schema_errors_total") };

    // Each damage, then its repair: (field, bad value, how soon a steady heartbeat must see it).
    let damages = [
        ("revision", "not-a-number", Duration::from_millis(50)),
        ("schemaVersion", "99", Duration::from_millis(50)),
        ("layoutVersion", "7", Duration::from_millis(50)),
        // Stamp intact: the decoded-aggregate cache may answer until the next full read: the
        // audit of this idle group (its member heartbeats through this instance, which renews its
        // deferral without reads), `idle_group_audit_ms` (2 s here) away at most.
        ("aggregate", "{\"this is\": \"not a GroupMetadata\"}", Duration::from_secs(4)),
    ];
    for (field, bad, bound) in damages {
        let good: String = redis::from_redis_value(redis.cmd(&["HGET", &meta, field])).expect("field");
        let errors_before = schema_errors().await;
        redis.cmd(&["HSET", &meta, field, bad]);
        let damaged = hash();
        let took = fails_closed_within(&coordinator, &group, &steady, bound).await;
        // A join needs a write: it reads the hash in full and fails closed at once.
        let join = heartbeat(&coordinator, &group, heartbeat_json(&group, "beta", None)).await;
        assert_eq!(join.error().code, ErrorCode::MetadataIncompatible, "{field}: {join:?}");
        assert!(schema_errors().await > errors_before, "{field}: counted");
        // Ticks keep running (expiry, fencing): none of them may write over the damage.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(hash(), damaged, "{field}: never overwritten");
        let ready = coordinator.get("/readyz").await;
        assert_eq!(ready.status, 200, "one damaged group does not make the coordinator unready");

        redis.cmd(&["HSET", &meta, field, &good]);
        let repaired = heartbeat(&coordinator, &group, steady.clone()).await;
        assert_eq!(repaired.status, 200, "{field} repaired: {repaired:?}");
        eprintln!("{field}={bad}: failed closed after {took:?}, recovered after repair");
    }

    // The metadata key replaced by another Redis type: METADATA_INCOMPATIBLE (fail closed, not a
    // retryable 503), never overwritten. Then the key deleted: METADATA_MISSING everywhere,
    // admin mutations included (the index still names the group).
    redis.cmd(&["DEL", &meta]);
    redis.cmd(&["SET", &meta, "a string, not a hash"]);
    fails_closed_within(&coordinator, &group, &steady, Duration::from_secs(2)).await;
    let join = heartbeat(&coordinator, &group, heartbeat_json(&group, "beta", None)).await;
    assert_eq!(join.error().code, ErrorCode::MetadataIncompatible, "{join:?}");
    let (prefix, name) = (group.stream_prefix.as_str(), group.consumer_group.as_str());
    let add = ["add-shards", "--prefix", prefix, "--group", name, "--expected-revision", "1", "--shards", "4"];
    let (status, _, stderr) = coordinator.admin(&add).await;
    assert!(!status.success() && stderr.contains("METADATA_INCOMPATIBLE"), "{stderr}");
    assert_eq!(redis.cmd(&["TYPE", &meta]), redis::Value::SimpleString("string".into()), "never overwritten");
    redis.cmd(&["DEL", &meta]);
    let answer = heartbeat(&coordinator, &group, steady.clone()).await;
    assert_eq!(answer.error().code, ErrorCode::MetadataMissing, "{answer:?}");
    let (status, _, stderr) = coordinator.admin(&add).await;
    assert!(!status.success() && stderr.contains("METADATA_MISSING"), "add-shards: {stderr}");
    let set = ["set-config", "--prefix", prefix, "--group", name, "--expected-revision", "1", "--config-json", "{}"];
    let (status, _, stderr) = coordinator.admin(&set).await;
    assert!(!status.success() && stderr.contains("METADATA_MISSING"), "set-config: {stderr}");
}
