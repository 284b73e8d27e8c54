//! Helpers of the end-to-end tests (`tests/e2e.rs`): the real `coordinator` binary as a child
//! process, a raw HTTP/1 client for probing it, the ground-truth read log of the stream store, the
//! application loops that drive real consumers and a producer, and an HTTP tap that records every
//! answer a coordinator sends.
//!
//! Owns only test-side machinery; it never reaches into the library's internals (everything goes
//! through the binary's HTTP API, the public client libraries and real Redis). Every process it
//! starts is killed when its handle drops, and every wait is bounded by a deadline, so a failing
//! test cleans up and ends instead of hanging.
//!
//! The safety checks are computed from ground truth, never from the protocol's own view: which
//! consumer issued which XREADGROUP / XAUTOCLAIM on which shard stream and when (recorded by a
//! [`ground_truth::RecordingStore`] wrapped around the real `RedisStore`), which entries the
//! application received and acknowledged, and what the coordinators answered on the wire.

#![allow(dead_code)] // Each story uses a different part of the harness.

pub mod certs;
pub mod checks;
pub mod faults;
pub mod fleet;
pub mod ground_truth;
pub mod http_tap;
pub mod old_release;
pub mod process;
pub mod spread;

use std::time::Duration;

use tokio::time::Instant;

use rsc::core::model::{GroupConfig, GroupId};

/// Leases short enough that a crash, an expiry and a correction round take seconds: assignment
/// lease 1.5 s, member TTL 2 s, heartbeat every 200 ms.
pub fn fast_config() -> GroupConfig {
    GroupConfig {
        member_lease_ttl_ms: 2_000,
        assignment_lease_ms: 1_500,
        heartbeat_interval_ms: 200,
        rebalance_timeout_ms: 5_000,
        routing_cache_ttl_ms: 3_000,
        routing_refresh_interval_ms: 1_000,
        ..GroupConfig::default()
    }
}

/// A group with a name unique to the test (each test also has its own Redis).
pub fn group(test: &str) -> GroupId {
    GroupId::new(format!("e2e-{test}"), "workers")
}

/// The JSON body of `member`'s join heartbeat (epoch 0) to `group`, as a client sends it.
pub fn join_json(group: &GroupId, member: &str) -> String {
    serde_json::json!({
        "group": {"streamPrefix": group.stream_prefix, "consumerGroup": group.consumer_group},
        "memberId": member, "memberEpoch": 0, "metadataVersion": 0, "assignmentEpoch": 0
    })
    .to_string()
}

/// A heartbeat body of `member` as its `last` answer left it (epochs, version, owned shards), or
/// a join when there is none.
pub fn heartbeat_json(group: &GroupId, member: &str, last: Option<&serde_json::Value>) -> Vec<u8> {
    let mut body: serde_json::Value = serde_json::from_str(&join_json(group, member)).expect("join JSON");
    if let Some(last) = last {
        for field in ["memberEpoch", "metadataVersion", "assignmentEpoch"] {
            body[field] = last[field].clone();
        }
        body["owned"] = last["assigned"].clone();
    }
    body.to_string().into_bytes()
}

/// Polls `cond` every 20 ms until it returns true; panics naming `what` after `timeout`.
pub async fn wait_until(what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    wait_until_explained(what, timeout, cond, String::new).await;
}

/// [`wait_until`], adding `explain()` (the state that would make a timeout understandable) to
/// the panic message.
pub async fn wait_until_explained(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for: {what}\n{}", explain());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sum of every sample of `name` (all label sets) in a Prometheus text exposition; 0 if absent.
pub fn metric_total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
