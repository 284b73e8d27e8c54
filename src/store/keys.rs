//! Redis key names (seed: "Redis Metadata Volatility and Corruption"). Every per-group key shares
//! the hash tag `{streamPrefix:consumerGroup}` so multi-key scripts are Redis Cluster safe.

use crate::core::model::{GroupId, ShardId};

/// The rebuildable group index (a set of hash-tag bodies `streamPrefix:consumerGroup`).
pub const INDEX_KEY: &str = "redis-stream:coord:groups";
/// The tick roster: a hash coordinator instance id -> ticker pass counter (`service::roster`).
pub const TICK_ROSTER_KEY: &str = "redis-stream:coord:tickers";
/// Prefix of the heard-relay keys ([`heard_relay_key`]).
pub const HEARD_RELAY_PREFIX: &str = "redis-stream:coord:heard:";
/// SCAN pattern matching every metadata key.
pub const METADATA_SCAN_PATTERN: &str = "redis-stream:coord:{*}:metadata";

pub const FIELD_AGGREGATE: &str = "aggregate";
pub const FIELD_REVISION: &str = "revision";
pub const FIELD_SCHEMA_VERSION: &str = "schemaVersion";
pub const FIELD_LAYOUT_VERSION: &str = "layoutVersion";
pub const FIELD_UPDATED_AT: &str = "updatedAt";
/// Not one of the seed's five recommended fields: a random id per write, so a decoded aggregate
/// can be cached without trusting revisions never to repeat (see `StoredRecord::write_id`).
pub const FIELD_WRITE_ID: &str = "writeId";

/// `redis-stream:coord:{p:g}:metadata` — the group's metadata hash. Never has a TTL.
pub fn metadata_key(group: &GroupId) -> String {
    format!("redis-stream:coord:{}:metadata", group.hash_tag())
}

/// `redis-stream:coord:{p:g}:mutex` — the critical-section mutex (`SET NX PX`).
pub fn mutex_key(group: &GroupId) -> String {
    format!("redis-stream:coord:{}:mutex", group.hash_tag())
}

/// `redis-stream:coord:{p:g}:liveness` — hash member id -> heartbeat counter.
pub fn liveness_key(group: &GroupId) -> String {
    format!("redis-stream:coord:{}:liveness", group.hash_tag())
}

/// `redis-stream:coord:{<streamPrefix>:<shard>}:fence:<consumerGroup>` — the fence of one shard
/// for one consumer group (a hash: `counter`, `nonce`). Its hash tag is the shard's stream key,
/// which contains no braces (stream prefixes may not), so the key hashes to the stream's own Redis
/// Cluster slot and one script can check the fence and touch the stream. Never has a TTL.
pub fn fence_key(group: &GroupId, shard: ShardId) -> String {
    format!("redis-stream:coord:{{{}}}:fence:{}", group.stream_key(shard), group.consumer_group)
}

/// `redis-stream:coord:heard:<len>:<owner>:<sender>` — what instance `sender` heard for the groups
/// whose ticks `owner` holds (a string with a PX deadline, `service::relay`). The owner's length
/// prefix keeps every (owner, sender) pair distinct whatever colons the ids contain.
pub fn heard_relay_key(owner: &str, sender: &str) -> String {
    format!("{HEARD_RELAY_PREFIX}{}:{owner}:{sender}", owner.len())
}

/// The fence hash's fields.
pub const FENCE_FIELD_COUNTER: &str = "counter";
pub const FENCE_FIELD_NONCE: &str = "nonce";

/// The index entry of a group: the hash-tag body `streamPrefix:consumerGroup`.
pub fn index_entry(group: &GroupId) -> String {
    format!("{}:{}", group.stream_prefix, group.consumer_group)
}

/// Parses an index entry or the tag body of a metadata key. The group is everything after the
/// last ':' (groups may not contain ':'; prefixes may).
pub fn parse_index_entry(entry: &str) -> Option<GroupId> {
    let (prefix, group) = entry.rsplit_once(':')?;
    let id = GroupId::new(prefix, group);
    id.validate().ok().map(|_| id)
}

/// Parses a metadata key back to its group.
pub fn parse_metadata_key(key: &str) -> Option<GroupId> {
    let body = key.strip_prefix("redis-stream:coord:{")?.strip_suffix("}:metadata")?;
    parse_index_entry(body)
}

/// Number of Redis Cluster hash slots.
pub const CLUSTER_SLOTS: u16 = 16_384;

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (the text between the
/// first `{` and the first `}` after it, when not empty), else of the whole key, modulo 16384 —
/// the rule every cluster node applies.
pub fn cluster_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            rest.iter().position(|b| *b == b'}').filter(|close| *close > 0).map(|close| &rest[..close])
        })
        .unwrap_or(bytes);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % CLUSTER_SLOTS
}

/// The hash slot of every key of `group`'s metadata (metadata, liveness, mutex: one hash tag).
pub fn group_slot(group: &GroupId) -> u16 {
    cluster_slot(&metadata_key(group))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_coordinator_key_lies_in_the_namespace_new_stream_prefixes_may_not_enter() {
        let group = GroupId::new("orders:v1", "billing");
        let namespace = format!("{}:", crate::core::input::COORDINATOR_KEY_NAMESPACE);
        let keys = [
            INDEX_KEY.to_string(),
            TICK_ROSTER_KEY.to_string(),
            HEARD_RELAY_PREFIX.to_string(),
            METADATA_SCAN_PATTERN.to_string(),
            metadata_key(&group),
            mutex_key(&group),
            liveness_key(&group),
            fence_key(&group, 7),
            heard_relay_key("a", "b"),
        ];
        for key in keys {
            assert!(key.starts_with(&namespace), "{key}");
        }
    }

    #[test]
    fn keys_share_the_hash_tag_and_round_trip() {
        let group = GroupId::new("orders:v1", "billing");
        assert_eq!(metadata_key(&group), "redis-stream:coord:{orders:v1:billing}:metadata");
        assert_eq!(mutex_key(&group), "redis-stream:coord:{orders:v1:billing}:mutex");
        assert_eq!(parse_metadata_key(&metadata_key(&group)), Some(group.clone()));
        assert_eq!(parse_index_entry(&index_entry(&group)), Some(group.clone()));
        assert_eq!(parse_metadata_key("redis-stream:coord:{nogroup}:metadata"), None);
        assert_eq!(parse_metadata_key("other:{a:b}:metadata"), None);
        assert_eq!(fence_key(&group, 7), "redis-stream:coord:{orders:v1:7}:fence:billing");
        // Not a metadata key: a SCAN for metadata keys never mistakes a fence for a group.
        assert_eq!(parse_metadata_key(&fence_key(&group, 7)), None);
    }

    #[test]
    fn cluster_slots_are_the_ones_redis_computes() {
        // Each value is what `CLUSTER KEYSLOT` answered on redis-server 7.
        for (key, slot) in [
            ("somekey", 11058),
            ("foo{hash_tag}", 2515),
            ("123456789", 12739),
            ("a{}b", 13694),
            ("{}x", 10595),
            ("x{a}{b}", 15495),
            ("redis-stream:coord:{orders:billing}:metadata", 16124),
        ] {
            assert_eq!(cluster_slot(key), slot, "{key}");
        }
        let group = GroupId::new("orders", "billing");
        assert_eq!(group_slot(&group), 16124);
        assert_eq!(cluster_slot(&liveness_key(&group)), group_slot(&group));
    }
}
