//! Key → shard routing: the one function every producer, in any language, must compute the same
//! way, so a key always lands on the same shard stream for a given shard count.
//!
//! The rule (stable; changing it would re-route every key):
//! 1. `h = FNV-1a 64` of the key's bytes (offset basis `0xcbf29ce484222325`, prime
//!    `0x100000001b3`, XOR each byte then multiply, wrapping), i.e. Go's `hash/fnv.New64a`.
//! 2. `shard = jump(h, shard_count)`, Lamping & Veach's *jump consistent hash*
//!    ("A Fast, Minimal Memory, Consistent Hash Algorithm", 2014): growing the shard count from N to
//!    N+1 moves only about 1/(N+1) of the keys, and only onto the new shard.
//!
//! Both steps use integer arithmetic except the jump's one IEEE-754 double division, which every
//! mainstream language computes identically. The test vectors below pin the result.
//!
//! This module never allocates, never reads a clock and never draws randomness.

use crate::core::model::ShardId;

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET_BASIS, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME))
}

/// Jump consistent hash of `key` into `0..buckets`. Returns 0 when `buckets` is 0 (callers never
/// route with zero shards; the coordinator validates `shardCount >= 1`).
pub fn jump_consistent_hash(mut key: u64, buckets: u32) -> u32 {
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        // The paper's `(b + 1) * (double(1 << 31) / double((key >> 33) + 1))`, truncated.
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    // `b` is in 0..buckets (fits u32) or -1 when buckets == 0.
    u32::try_from(b).unwrap_or(0)
}

/// The shard a message key routes to when the group has `shard_count` shards.
pub fn shard_for_key(key: &[u8], shard_count: u32) -> ShardId {
    jump_consistent_hash(fnv1a_64(key), shard_count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_64_matches_the_reference_vectors() {
        // From the FNV reference test suite (isthe.com/chongo/tech/comp/fnv).
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn jump_hash_matches_the_published_vectors() {
        // The vectors used by the Go, Java and C++ ports of the paper's algorithm.
        assert_eq!(jump_consistent_hash(1, 1), 0);
        assert_eq!(jump_consistent_hash(42, 57), 43);
        assert_eq!(jump_consistent_hash(0xDEAD_10CC, 1), 0);
        assert_eq!(jump_consistent_hash(0xDEAD_10CC, 666), 361);
        assert_eq!(jump_consistent_hash(256, 1024), 520);
        assert_eq!(jump_consistent_hash(7, 0), 0);
    }

    #[test]
    fn shard_for_key_is_pinned() {
        // Cross-language vector: Go `jump.HashString("中国", 10, fnv.New64a())` == 5.
        assert_eq!(shard_for_key("中国".as_bytes(), 10), 5);
        // Pinned outputs (reproduced independently by a 10-line Python port of the two steps).
        let pinned: [(&str, u32, u32); 6] = [
            ("", 16, 13),
            ("order-1", 1, 0),
            ("order-1", 8, 6),
            ("user:42", 8, 1),
            ("user:42", 1000, 295),
            ("a", 2, 1),
        ];
        for (key, shards, expected) in pinned {
            assert_eq!(shard_for_key(key.as_bytes(), shards), expected, "{key:?} over {shards}");
            assert!(expected < shards);
        }
    }

    #[test]
    fn growing_n_to_n_plus_1_moves_about_one_over_n_plus_1_of_keys_and_only_to_the_new_shard() {
        const KEYS: u32 = 20_000;
        for n in [1u32, 3, 7, 16, 63] {
            let mut moved = 0u32;
            for i in 0..KEYS {
                let key = format!("key-{i}");
                let before = shard_for_key(key.as_bytes(), n);
                let after = shard_for_key(key.as_bytes(), n + 1);
                if before != after {
                    assert_eq!(after, n, "a moved key must land on the new shard");
                    moved += 1;
                }
            }
            let expected = f64::from(KEYS) / f64::from(n + 1);
            let ratio = f64::from(moved) / expected;
            assert!((0.9..1.1).contains(&ratio), "n={n}: moved {moved}, expected about {expected}");
        }
    }

    #[test]
    fn keys_spread_evenly_over_shards() {
        const SHARDS: u32 = 10;
        let mut counts = [0u32; SHARDS as usize];
        for i in 0..50_000 {
            counts[shard_for_key(format!("k{i}").as_bytes(), SHARDS) as usize] += 1;
        }
        for count in counts {
            assert!((4_500..5_500).contains(&count), "uneven spread: {counts:?}");
        }
    }
}
