//! Fences at the resource (DESIGN §10): the value that lets one grant of a shard, and only that
//! grant, read, ack and claim the shard's stream at Redis.
//!
//! A [`Fence`] is made by Redis, not by the core: when the coordinator grants a shard it first
//! raises the shard's fence key (an increment of a per-shard counter, or the coordinator's wall
//! clock in ms for a key that holds none, stored with a random nonce the coordinator drew), then records the value in the grant, then answers. The core only says which
//! grants still need one ([`unfenced_grants`]), takes the raised values back in
//! ([`attach_fences`]), and derives what a member is told ([`fences_for`]). It never invents a
//! value, so no decision can hand two grants the same fence: counters restored by a rollback come
//! back with another nonce.
//!
//! The stream operations accept exactly the recorded value, or a value whose counter is strictly
//! newer (which then replaces it: a fence write lost in a failover heals on first use by the newer
//! owner). Everything older, and the same counter with another nonce, is refused as `FENCED`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::model::{GroupMetadata, ShardId, ShardOwner};

/// The fence of one grant: the per-shard counter Redis returned and the nonce stored with it.
/// Written as `<counter>.<nonce, 16 hex digits>` (a string, so JavaScript clients keep all 64 bits
/// of the nonce). Ordered by counter first: a larger counter is a newer grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence {
    pub counter: u64,
    pub nonce: u64,
}

impl Fence {
    /// The largest counter a presented fence may install (2^53 − 1, which a JSON number holds
    /// exactly in any client). Redis raises a fence key with `HINCRBY`, which fails above
    /// `i64::MAX`: a made-up counter near it, installed, would keep every later grant of the shard
    /// from raising its fence, for ever. From this bound, ~9.2·10^18 raises remain. A presented
    /// fence above it never replaces a key's value (refused as stale); one the key holds exactly
    /// (raises go on past the bound) is accepted as any other. No coordinator hands out a counter
    /// that no raise returned (a counter grows by one per grant of the shard, from the wall clock
    /// in ms at the key's first raise: about 2^41 today, far below this bound).
    pub const COUNTER_MAX: u64 = (1 << 53) - 1;

    /// The nonce as stored in the fence key (16 lowercase hex digits).
    pub fn nonce_hex(&self) -> String {
        format!("{:016x}", self.nonce)
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:016x}", self.counter, self.nonce)
    }
}

/// A string that is not `<counter>.<16 hex digits>`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a fence value (want <counter>.<16 hex digits>): {0:?}")]
pub struct BadFence(pub String);

impl FromStr for Fence {
    type Err = BadFence;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadFence(s.chars().take(64).collect());
        let (counter, nonce) = s.split_once('.').ok_or_else(bad)?;
        let digits = |v: &str, hex: bool| {
            !v.is_empty() && v.bytes().all(|b| if hex { b.is_ascii_hexdigit() } else { b.is_ascii_digit() })
        };
        if !digits(counter, false) || counter.len() > 20 || nonce.len() != 16 || !digits(nonce, true) {
            return Err(bad());
        }
        Ok(Fence {
            counter: counter.parse().map_err(|_| bad())?,
            nonce: u64::from_str_radix(nonce, 16).map_err(|_| bad())?,
        })
    }
}

impl Serialize for Fence {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Fence {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// One shard's fence, as a heartbeat answer carries it (`HeartbeatResponse::fences`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardFence {
    pub shard: ShardId,
    pub fence: Fence,
}

/// Shards whose grant must be fenced before the state is recorded: with fencing on, every `Owned`
/// entry without a fence (a new grant, a grant written by a binary that predates fences, or one a
/// refence cleared). `Revoking` entries are left as they are: their member was granted them
/// unfenced and is only draining.
pub fn unfenced_grants(g: &GroupMetadata) -> Vec<ShardId> {
    if !g.config.fencing {
        return Vec::new();
    }
    g.shards_where(|o| matches!(o, ShardOwner::Owned { fence: None, .. }))
}

/// Records raised fences in the grants they were raised for (only `Owned` entries still without
/// one; anything else in `raised` is ignored).
pub fn attach_fences(g: &mut GroupMetadata, raised: &BTreeMap<ShardId, Fence>) {
    for (shard, value) in raised {
        if let Some(ShardOwner::Owned { fence: fence @ None, .. }) = g.current.get_mut(shard) {
            *fence = Some(*value);
        }
    }
}

/// The fences `member` holds: its owned and revoking shards that have one, in shard order.
pub fn fences_for(g: &GroupMetadata, member: &str) -> Vec<ShardFence> {
    g.current
        .iter()
        .filter_map(|(shard, owner)| match owner {
            ShardOwner::Owned { member: m, fence: Some(fence), .. }
            | ShardOwner::Revoking { member: m, fence: Some(fence), .. }
                if m == member =>
            {
                Some(ShardFence { shard: *shard, fence: *fence })
            }
            _ => None,
        })
        .collect()
}

/// An answer derived from a recorded state that names fences: after the coordinator attached the
/// fences it raised to the state it is about to record, the answer is derived again from that
/// state, so it carries exactly the values recorded. Answers that carry no fences keep the default.
pub trait CarriesFences {
    fn refresh_fences(&mut self, _state: &GroupMetadata) {}
}

impl CarriesFences for super::protocol::HeartbeatResponse {
    fn refresh_fences(&mut self, state: &GroupMetadata) {
        self.fences = fences_for(state, &self.member_id);
    }
}

impl CarriesFences for super::protocol::RoutingResponse {}
impl CarriesFences for super::protocol::AdminResponse {}
impl CarriesFences for () {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_round_trips_through_its_text() {
        let fence = Fence { counter: 42, nonce: 0xdead_beef_0000_0001 };
        assert_eq!(fence.to_string(), "42.deadbeef00000001");
        assert_eq!("42.deadbeef00000001".parse::<Fence>(), Ok(fence));
        let json = serde_json::to_string(&fence).unwrap();
        assert_eq!(json, "\"42.deadbeef00000001\"");
        assert_eq!(serde_json::from_str::<Fence>(&json).unwrap(), fence);
    }

    #[test]
    fn malformed_fences_are_refused() {
        for text in
            ["", "42", ".0000000000000001", "42.1", "-1.0000000000000001", "4 2.0000000000000001", "1.000000000000000g"]
        {
            assert!(text.parse::<Fence>().is_err(), "{text:?} parsed");
        }
        assert!("99999999999999999999999.0000000000000001".parse::<Fence>().is_err());
    }

    #[test]
    fn a_newer_counter_orders_after_any_nonce() {
        let old = Fence { counter: 5, nonce: u64::MAX };
        let new = Fence { counter: 6, nonce: 0 };
        assert!(new > old);
    }
}
