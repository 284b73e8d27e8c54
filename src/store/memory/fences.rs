//! Fence keys in the fake (DESIGN §10): the raise the coordinator runs before it records a grant,
//! and the check every fenced stream operation runs first, each one atomic step as the Lua scripts
//! of `RedisStore` are.
//!
//! Owns the check's rule, shared with the scripts: accept exactly the fence the key holds, or a
//! fence with a strictly larger counter (which replaces it: a raise lost in a rollback heals on
//! the newer grant's first use); refuse anything else as `StoreError::Fenced`. A raise and a
//! healing replacement are journaled writes, so a rollback can lose them like any other write.

use crate::core::model::Fence;
use crate::core::PlantedBug;
use crate::store::{FenceCheck, StoreError};

use super::keyspace::Change;
use super::Inner;

impl Inner {
    /// The raise script: `counter + 1`, or for a key that holds none `floor` (at least 1),
    /// stored with `nonce`.
    pub(super) fn raise_fence(&mut self, key: &str, nonce: u64, floor: u64) -> Fence {
        let counter = self.keys.fences.get(key).map_or(floor.max(1), |f| f.counter.saturating_add(1));
        let fence = Fence { counter, nonce };
        let mut change = Change::default();
        self.keys.put_fence(&mut change, key, fence);
        self.journal.push(change);
        fence
    }

    /// The fence a key holds (`None`: never raised, or lost).
    pub(super) fn read_fence(&self, key: &str) -> Option<Fence> {
        self.keys.fences.get(key).copied()
    }

    /// The check every fenced operation (`op`) runs before it touches the stream.
    pub(super) fn check_fence(&mut self, check: &FenceCheck, op: &'static str) -> Result<(), StoreError> {
        let current = self.keys.fences.get(&check.key);
        // A counter above `Fence::COUNTER_MAX` never replaces the key (it is refused as stale
        // unless it is exactly the key's value, which raises reach from there), as the scripts on
        // Redis refuse it (`store/redis/fences.rs`, `CHECK`).
        let beyond_install = check.fence.counter > Fence::COUNTER_MAX;
        let counters_only = self.planted.has(PlantedBug::CompareFenceCountersOnly);
        match current {
            Some(current) if *current == check.fence => Ok(()),
            Some(current) if counters_only && current.counter == check.fence.counter => Ok(()),
            _ if beyond_install || current.is_some_and(|c| c.counter >= check.fence.counter) => {
                let current = current.map_or_else(|| "0.".to_string(), |c| c.to_string());
                let refused = StoreError::Fenced { key: check.key.clone(), current };
                *self.history.fence_refusals.entry(op).or_default() += 1;
                Err(refused)
            }
            _ => {
                let mut change = Change::default();
                self.keys.put_fence(&mut change, &check.key, check.fence);
                self.journal.push(change);
                Ok(())
            }
        }
    }

    /// The fenced XACK script's check (skipped by the planted `NoFenceCheckInAck`).
    pub(super) fn check_ack_fence(&mut self, check: &FenceCheck) -> Result<(), StoreError> {
        if self.planted.has(PlantedBug::NoFenceCheckInAck) {
            return Ok(());
        }
        self.check_fence(check, "XACK")
    }
}
