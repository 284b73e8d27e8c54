//! Small views of the system's state that the stories assert on: how the consumers share the
//! shards (their own status), what Redis holds (XPENDING, the stored revision and version), and
//! whether the recorded assignment settled (the coordinator's describe answer).

use std::collections::BTreeSet;

use rsc::core::model::GroupId;

use super::fleet::ConsumerApp;
use crate::support::RedisServer;

/// The consumers' readable shards are disjoint, cover `0..shards`, and each has at least one.
pub fn shares_all(apps: &[&ConsumerApp], shards: u32) -> bool {
    let mut seen = BTreeSet::new();
    for app in apps {
        let readable = app.status().readable;
        if readable.is_empty() || readable.iter().any(|s| !seen.insert(*s)) {
            return false;
        }
    }
    seen == (0..shards).collect()
}

/// `XPENDING <stream> <group>`'s count: entries delivered and never acked.
pub fn pending_count(redis: &RedisServer, group: &GroupId, shard: u32) -> i64 {
    let reply = redis.cmd(&["XPENDING", &group.stream_key(shard), &group.consumer_group]);
    match reply {
        redis::Value::Array(parts) => redis::from_redis_value(parts[0].clone()).expect("XPENDING count"),
        other => panic!("XPENDING: {other:?}"),
    }
}

/// `revision` and `metadataVersion` of the group as stored on `server` (panics if absent).
pub fn stored_versions(server: &RedisServer, group: &GroupId) -> (u64, u64) {
    try_stored_versions(server, group).unwrap_or_else(|| panic!("no metadata of {group} on port {}", server.port()))
}

/// `revision` and `metadataVersion` of the group as stored on `server`; `None` if absent.
pub fn try_stored_versions(server: &RedisServer, group: &GroupId) -> Option<(u64, u64)> {
    let key = rsc::store::keys::metadata_key(group);
    versions_in(server.cmd(&["HMGET", &key, "revision", "aggregate"]))
}

/// `revision` and `metadataVersion` from the reply to `HMGET <metadata key> revision aggregate`
/// (sent however the caller reaches the node, e.g. after `READONLY` on a cluster replica);
/// `None` if the key is absent.
pub fn versions_in(reply: redis::Value) -> Option<(u64, u64)> {
    let (revision, aggregate): (Option<String>, Option<String>) =
        redis::from_redis_value(reply).expect("metadata fields");
    let aggregate: serde_json::Value = serde_json::from_str(&aggregate?).expect("aggregate JSON");
    Some((revision?.parse().expect("revision"), aggregate["metadataVersion"].as_u64().expect("metadataVersion")))
}

/// True when the described group is settled: no correction round, exactly `members`, and every
/// shard owned by its target.
pub fn settled(described: &serde_json::Value, members: &[&str], shards: u32) -> bool {
    let metadata = &described["metadata"];
    let names: Vec<&str> =
        metadata["members"].as_object().map_or(Vec::new(), |m| m.keys().map(|k| k.as_str()).collect());
    let owned_by_target = (0..shards).all(|s| {
        let current = &metadata["current"][s.to_string()];
        current["kind"] == "owned" && current["member"] == metadata["target"][s.to_string()]
    });
    metadata["correction"].is_null() && names == members && owned_by_target
}
