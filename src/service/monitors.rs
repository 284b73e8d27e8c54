//! Per-group local monitors: the in-process async mutex every critical section of one group takes
//! first, so one coordinator process never races itself for the group's Redis mutex.
//!
//! Owns: the map group -> monitor. An entry exists only while some critical section holds or
//! waits for it: the last [`MonitorEntry`] to leave removes it, so the map stays bounded by the
//! sections in flight, whatever groups came and went.
//! Never: removes a monitor someone still holds or waits for (two sections of one group would then
//! run side by side on two different mutexes).
//! Invariant: every `Arc` clone of a monitor besides the map's own is owned by a live
//! [`MonitorEntry`], and clones are made only under the map's lock; so a strong count of 1, read
//! under that lock, proves no one else holds or waits for it and no one can start to.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::core::model::GroupId;

type Monitor = Arc<tokio::sync::Mutex<()>>;

/// The monitors of one coordinator process.
#[derive(Debug, Default)]
pub(super) struct GroupMonitors {
    monitors: Mutex<BTreeMap<GroupId, Monitor>>,
}

/// A claim on one group's monitor: taken before waiting for the lock, so a caller that gives up
/// while waiting (its future dropped) still removes the entry it leaves idle.
pub(super) struct MonitorEntry<'a> {
    owner: &'a GroupMonitors,
    group: GroupId,
    monitor: Option<Monitor>,
}

impl GroupMonitors {
    fn lock_map(&self) -> MutexGuard<'_, BTreeMap<GroupId, Monitor>> {
        // A poisoned lock only means a panic elsewhere; the map of Arcs is still consistent.
        self.monitors.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Claims `group`'s monitor (creating it if no one holds it); lock it with
    /// [`MonitorEntry::lock`]. `None` when `max` sections of the group already hold or wait for
    /// it: one group's burst must not take every request slot of the process while its sections
    /// run one at a time (a concurrency review: a 1,000-member restart, or one client that never
    /// times out, starved every other group's heartbeats until their leases ended).
    pub(super) fn enter(&self, group: &GroupId, max: usize) -> Option<MonitorEntry<'_>> {
        let mut map = self.lock_map();
        // Every clone besides the map's own belongs to a live entry (module invariant). Checked
        // before a monitor is made, so a refusal leaves no entry behind.
        let held = map.get(group).map_or(0, |monitor| Arc::strong_count(monitor) - 1);
        if held >= max {
            return None;
        }
        let monitor = Arc::clone(map.entry(group.clone()).or_default());
        Some(MonitorEntry { owner: self, group: group.clone(), monitor: Some(monitor) })
    }

    /// How many groups have a monitor now (tests and `debug_sizes`).
    pub(super) fn len(&self) -> usize {
        self.lock_map().len()
    }
}

impl MonitorEntry<'_> {
    /// Waits for the group's monitor; the section runs while the guard lives. Drop the guard
    /// before the entry (declare the entry first).
    pub(super) async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        match &self.monitor {
            Some(monitor) => monitor.lock().await,
            // safe: `monitor` is `Some` from `enter` until `drop`, which cannot run while `self`
            // is borrowed here.
            None => unreachable!("a monitor entry is only emptied when it is dropped"),
        }
    }
}

impl Drop for MonitorEntry<'_> {
    fn drop(&mut self) {
        let mut map = self.owner.lock_map();
        // Our clone goes first, under the lock: then a count of 1 is the map's own reference.
        drop(self.monitor.take());
        if map.get(&self.group).is_some_and(|monitor| Arc::strong_count(monitor) == 1) {
            map.remove(&self.group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str) -> GroupId {
        GroupId::new("orders", name)
    }

    #[tokio::test]
    async fn at_most_max_sections_of_a_group_hold_or_wait_and_a_refusal_leaves_nothing() {
        let monitors = GroupMonitors::default();
        let first = monitors.enter(&group("a"), 2).expect("1 of 2");
        let held = first.lock().await;
        let second = monitors.enter(&group("a"), 2).expect("2 of 2 (waiting)");
        assert!(monitors.enter(&group("a"), 2).is_none(), "a third is refused");
        assert!(monitors.enter(&group("b"), 2).is_some(), "another group is not");
        drop(held);
        drop(first);
        assert!(monitors.enter(&group("a"), 2).is_some(), "a place came free");
        drop(second);
        assert_eq!(monitors.len(), 0, "refusals left no monitor behind");
        assert!(monitors.enter(&group("c"), 0).is_none(), "a cap of 0 refuses every section");
        assert_eq!(monitors.len(), 0, "and leaves no monitor behind");
    }

    #[tokio::test]
    async fn the_last_section_to_leave_removes_the_monitor() {
        let monitors = GroupMonitors::default();
        {
            let entry = monitors.enter(&group("a"), usize::MAX).expect("under the cap");
            let _guard = entry.lock().await;
            assert_eq!(monitors.len(), 1);
        }
        assert_eq!(monitors.len(), 0);
    }

    #[tokio::test]
    async fn a_monitor_someone_waits_for_is_kept_and_still_excludes() {
        let monitors = GroupMonitors::default();
        let first = monitors.enter(&group("a"), usize::MAX).expect("under the cap");
        let held = first.lock().await;
        let second = monitors.enter(&group("a"), usize::MAX).expect("under the cap");
        drop(held);
        drop(first);
        assert_eq!(monitors.len(), 1, "the waiting entry keeps the monitor");
        let second_guard = second.lock().await;
        // A third section must wait for the second: it got the same monitor, not a fresh one.
        let third = monitors.enter(&group("a"), usize::MAX).expect("under the cap");
        assert!(third.monitor.as_ref().is_some_and(|m| m.try_lock().is_err()));
        drop(second_guard);
        drop(second);
        drop(third);
        assert_eq!(monitors.len(), 0);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_removes_the_idle_monitor() {
        let monitors = GroupMonitors::default();
        let first = monitors.enter(&group("a"), usize::MAX).expect("under the cap");
        let held = first.lock().await;
        let waiting = async {
            let entry = monitors.enter(&group("a"), usize::MAX).expect("under the cap");
            let _guard = entry.lock().await;
        };
        // The waiter is polled once (it blocks on the held monitor), then dropped: it gave up.
        let gave_up = crate::time::timeout(std::time::Duration::from_millis(10), waiting).await;
        assert!(gave_up.is_err());
        drop(held);
        drop(first);
        assert_eq!(monitors.len(), 0);
    }
}
