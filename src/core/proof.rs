//! Proofs that this deployment issued a view (DESIGN §8, "signed views").
//!
//! A client's report of a metadataVersion above the stored one, or of a shard count above the
//! recorded one, is evidence of lost writes only if the coordinator really issued that number:
//! otherwise any client on the group's data plane could start correction rounds or grow a group
//! at will (both found by a black-box review). Every answer therefore carries proofs of the
//! numbers it states — an HMAC-SHA256 of `(group, fact, value)` under a key kept in the group's
//! own record — and a report is credited only with a proof that verifies.
//!
//! The key lives in the record, not in a configuration or a separate key, because a rollback
//! restores an *older* record of the same group, which holds the same key: the proofs clients got
//! from the lost history still verify against it, which is exactly when they are needed. A
//! rollback to before the group existed leaves no record at all (`METADATA_MISSING`, fail closed),
//! and a recreated group draws a new key, so proofs of a deleted incarnation prove nothing to the
//! next one. Clients never see the key: it is not part of any answer (`describe` redacts it).

use std::fmt;
use std::str::FromStr;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::model::GroupId;

/// Bytes of a proof: 128 bits of HMAC-SHA256, as hex on the wire.
const PROOF_BYTES: usize = 16;
const KEY_BYTES: usize = 32;
/// Domain separation: a proof of this scheme is never valid for another use of the key.
const DOMAIN: &[u8] = b"rsc-view-proof-v1";

/// The number a proof is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fact {
    /// The group's `metadataVersion` was this value in a recorded state.
    MetadataVersion,
    /// The group's shard count was this value in a recorded state.
    ShardCount,
}

impl Fact {
    fn tag(self) -> &'static [u8] {
        match self {
            Fact::MetadataVersion => b"metadataVersion",
            Fact::ShardCount => b"shardCount",
        }
    }
}

/// A group's secret proof key: 32 bytes drawn from the OS when the group is created (or, for a
/// group an older release created, at its first write by this one). Stored as hex in the record;
/// its `Debug` never shows it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ViewKey([u8; KEY_BYTES]);

impl ViewKey {
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        Self(bytes)
    }

    /// The proof that `group`'s `fact` had `value` in a state this deployment recorded.
    pub fn prove(&self, group: &GroupId, fact: Fact, value: u64) -> ViewProof {
        let tag = self.mac(group, fact, value).finalize().into_bytes();
        let mut proof = [0u8; PROOF_BYTES];
        proof.copy_from_slice(&tag[..PROOF_BYTES]);
        ViewProof(proof)
    }

    /// Whether `proof` is this key's proof of `(group, fact, value)` (constant time).
    pub fn verifies(&self, group: &GroupId, fact: Fact, value: u64, proof: &ViewProof) -> bool {
        self.prove(group, fact, value).0.ct_eq(&proof.0).into()
    }

    fn mac(&self, group: &GroupId, fact: Fact, value: u64) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        // Length-prefixed fields: no two inputs share an encoding.
        for field in [DOMAIN, group.stream_prefix.as_bytes(), group.consumer_group.as_bytes(), fact.tag()] {
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field);
        }
        mac.update(&value.to_be_bytes());
        mac
    }
}

impl fmt::Debug for ViewKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ViewKey(<secret>)")
    }
}

impl Serialize for ViewKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&Hex(&self.0))
    }
}

impl<'de> Deserialize<'de> for ViewKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_hex::<KEY_BYTES>(&text).map(ViewKey).ok_or_else(|| serde::de::Error::custom("not a 64-digit hex key"))
    }
}

/// A proof that this deployment issued a number ([`ViewKey::prove`]): 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ViewProof([u8; PROOF_BYTES]);

impl fmt::Display for ViewProof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Hex(&self.0).fmt(f)
    }
}

impl fmt::Debug for ViewProof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ViewProof({self})")
    }
}

/// A string that is not 32 hex digits.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a view proof (want 32 hex digits): {0:?}")]
pub struct BadProof(pub String);

impl FromStr for ViewProof {
    type Err = BadProof;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_hex::<PROOF_BYTES>(s).map(ViewProof).ok_or_else(|| BadProof(s.chars().take(64).collect()))
    }
}

impl Serialize for ViewProof {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ViewProof {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Whether a client's report of `value` for `fact` is evidence this group may act on: proven by
/// the group's key; or, for a group that has no key yet (created by an older release and not
/// written since, or rewritten by one during a rolling update), a version, as before proofs.
///
/// A keyless group never credits a shard count (DESIGN §8, "Keyless records heal no shard
/// count"). The two facts differ in what a forged report leaves behind. A forged version starts
/// at most one correction round: the round's own write draws the key, the version credited is
/// capped ([`CLIENT_VERSION_AHEAD_MAX`](super::model::CLIENT_VERSION_AHEAD_MAX)), and the round
/// ends a lease later. A forged count adds shards for good (shards are never removed) and
/// re-routes almost every key: one request of 65,536 took a group from 4 shards to 65,536. Nothing
/// in a keyless record bounds a count: the count a lost `add-shards` set is not in the record the
/// rollback restored, so any cap relative to that record is a step that every keyless window
/// grants again (each write by an older coordinator drops the key), walking the count up to the
/// limit. A count a keyless record lost is restored by an operator's `add-shards`.
pub fn credited(key: Option<&ViewKey>, group: &GroupId, fact: Fact, value: u64, proof: Option<&ViewProof>) -> bool {
    match key {
        None => fact == Fact::MetadataVersion,
        Some(key) => proof.is_some_and(|proof| key.verifies(group, fact, value, proof)),
    }
}

struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(prefix: &str, name: &str) -> GroupId {
        GroupId { stream_prefix: prefix.into(), consumer_group: name.into() }
    }

    #[test]
    fn a_proof_verifies_only_its_own_group_fact_value_and_key() {
        let key = ViewKey::from_bytes([7; 32]);
        let g = group("orders", "billing");
        let proof = key.prove(&g, Fact::MetadataVersion, 42);
        assert!(key.verifies(&g, Fact::MetadataVersion, 42, &proof));
        assert!(!key.verifies(&g, Fact::MetadataVersion, 43, &proof), "another value");
        assert!(!key.verifies(&g, Fact::ShardCount, 42, &proof), "another fact");
        assert!(!key.verifies(&group("orders", "billing2"), Fact::MetadataVersion, 42, &proof), "another group");
        // `a:b` + `c` and `a` + `b:c` would concatenate alike without the length prefixes.
        let shifted = key.prove(&group("a:b", "c"), Fact::ShardCount, 1);
        assert!(!key.verifies(&group("a", "b:c"), Fact::ShardCount, 1, &shifted));
        assert!(!ViewKey::from_bytes([8; 32]).verifies(&g, Fact::MetadataVersion, 42, &proof), "another key");
    }

    #[test]
    fn proofs_and_keys_round_trip_as_hex_and_bad_text_is_refused() {
        let key = ViewKey::from_bytes([0xab; 32]);
        let text = serde_json::to_string(&key).unwrap();
        assert_eq!(text.len(), 66);
        assert_eq!(serde_json::from_str::<ViewKey>(&text).unwrap(), key);
        assert_eq!(format!("{key:?}"), "ViewKey(<secret>)");
        let proof = key.prove(&group("p", "g"), Fact::ShardCount, 9);
        assert_eq!(proof.to_string().parse::<ViewProof>().unwrap(), proof);
        for bad in ["", "zz", &"0".repeat(31), &"0".repeat(33), &"g".repeat(32)] {
            assert!(bad.parse::<ViewProof>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_keyless_group_credits_every_version_and_a_keyed_one_only_proven_ones() {
        let key = ViewKey::from_bytes([1; 32]);
        let g = group("p", "g");
        let proof = key.prove(&g, Fact::MetadataVersion, 5);
        assert!(credited(None, &g, Fact::MetadataVersion, 5, None));
        assert!(!credited(Some(&key), &g, Fact::MetadataVersion, 5, None));
        assert!(credited(Some(&key), &g, Fact::MetadataVersion, 5, Some(&proof)));
        assert!(!credited(Some(&key), &g, Fact::MetadataVersion, 6, Some(&proof)));
    }

    /// Numbers review, finding 1: a keyless group credited any shard count, so one routing
    /// request grew it to 65,536 shards for good. It credits none, proof or not (a proof under a
    /// key the record does not hold checks nothing); a keyed group still credits a proven count.
    #[test]
    fn a_keyless_group_credits_no_shard_count() {
        let key = ViewKey::from_bytes([2; 32]);
        let g = group("p", "g");
        for count in [5, 65_536] {
            let proof = key.prove(&g, Fact::ShardCount, count);
            assert!(!credited(None, &g, Fact::ShardCount, count, None), "{count} unproven");
            assert!(!credited(None, &g, Fact::ShardCount, count, Some(&proof)), "{count} under a key not recorded");
            assert!(credited(Some(&key), &g, Fact::ShardCount, count, Some(&proof)), "{count} proven");
        }
    }
}
