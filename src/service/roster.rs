//! Sharing the tick work between coordinator instances: each indexed group has one *owner*, the
//! instance that ticks it while it is quiet; any instance still ticks a group it wrote (until it
//! finds the group idle) or has evidence of lost writes to record for.
//!
//! Owns: this process's reading of the tick roster ([`keys::TICK_ROSTER_KEY`]: every instance
//! counts its ticker passes there) — which instances are live (their counter changed within
//! `silence_ms` on this process's monotonic clock, the same counter-window rule as member
//! liveness, so no clocks are compared across processes) — and the owner of a group among them
//! by rendezvous hashing (SHA-256 of instance and group: stable across processes, releases and
//! platforms). Never: is trusted for safety. Ticks are safe when instances disagree (every write
//! is a conditioned critical section): two owners tick a group twice, and no owner leaves it
//! unticked only until the instances' live sets agree again, within `silence_ms` plus a roster
//! read period (`ticker_refresh_ms`, at most a quarter `silence_ms`) plus a pass.
//!
//! Bounds: an instance that dies stops counting; within `silence_ms` plus a read period every
//! other instance drops it, and the groups it owned are ticked by their new owners at that pass. Until the first
//! roster read succeeds (or when sharing is off) this process owns every group, as before
//! sharing existed; so does a process whose roster read failed at this pass (it keeps the last
//! live set it read, and counts itself live).
//!
//! [`keys::TICK_ROSTER_KEY`]: crate::store::keys::TICK_ROSTER_KEY

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use sha2::{Digest, Sha256};

use crate::core::model::GroupId;

/// What one instance's counter looked like when this process last saw it change.
#[derive(Clone, Copy, Debug)]
struct Seen {
    counter: u64,
    changed_at: Instant,
}

/// This process's view of the tick roster.
#[derive(Debug, Default)]
pub(super) struct Roster {
    seen: BTreeMap<String, Seen>,
    /// The live instances at the last read, sorted, this process included; empty until a read.
    live: Vec<String>,
}

impl Roster {
    /// Records a roster read made at `now` by instance `me`. Live: `me`, and every instance whose
    /// counter changed within `silence`. Returns the instances silent for longer than `forget`
    /// (to remove from the roster) and whether the live set changed.
    pub(super) fn observe(
        &mut self,
        me: &str,
        roster: &BTreeMap<String, u64>,
        now: Instant,
        silence: Duration,
        forget: Duration,
    ) -> (Vec<String>, bool) {
        let mut seen = BTreeMap::new();
        for (instance, &counter) in roster {
            let entry = match self.seen.get(instance) {
                Some(previous) if previous.counter == counter => *previous,
                _ => Seen { counter, changed_at: now },
            };
            seen.insert(instance.clone(), entry);
        }
        self.seen = seen;
        let quiet = |s: &Seen| now.saturating_duration_since(s.changed_at);
        let mut live: Vec<String> = self
            .seen
            .iter()
            .filter(|(instance, s)| instance.as_str() == me || quiet(s) <= silence)
            .map(|(instance, _)| instance.clone())
            .collect();
        if !live.iter().any(|instance| instance == me) {
            live.push(me.to_string());
            live.sort();
        }
        let forgotten: Vec<String> = self
            .seen
            .iter()
            .filter(|(instance, s)| instance.as_str() != me && quiet(s) > forget)
            .map(|(instance, _)| instance.clone())
            .collect();
        let changed = live != self.live;
        self.live = live;
        (forgotten, changed)
    }

    /// The live instances at the last read (empty before the first).
    pub(super) fn live(&self) -> &[String] {
        &self.live
    }

    /// Whether `me` owns `group`: the live instance with the highest rendezvous score (ties, which
    /// need a SHA-256 collision on 64 bits, go to the smaller id). True before the first read.
    pub(super) fn owns(&self, me: &str, group: &GroupId) -> bool {
        owner(&self.live, group).is_none_or(|owner| owner == me)
    }

    /// The live instance that owns `group` (`None` before the first read).
    pub(super) fn owner(&self, group: &GroupId) -> Option<&str> {
        owner(&self.live, group)
    }
}

/// The owner of `group` among `instances` (`None` when there are none).
fn owner<'a>(instances: &'a [String], group: &GroupId) -> Option<&'a str> {
    instances
        .iter()
        .map(|instance| (score(instance, group), instance))
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(a.1)))
        .map(|(_, i)| i.as_str())
}

/// The rendezvous score of `instance` for `group`: the first 8 bytes of SHA-256 over both,
/// length-prefixed so no two pairs share an input.
fn score(instance: &str, group: &GroupId) -> u64 {
    let mut hash = Sha256::new();
    for part in [instance, group.stream_prefix.as_str(), group.consumer_group.as_str()] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roster(entries: &[(&str, u64)]) -> BTreeMap<String, u64> {
        entries.iter().map(|(i, c)| (i.to_string(), *c)).collect()
    }

    const SILENCE: Duration = Duration::from_secs(3);
    const FORGET: Duration = Duration::from_secs(600);

    #[test]
    fn each_group_has_exactly_one_owner_among_agreeing_instances_and_they_spread() {
        let instances = ["a", "b", "c"];
        let mut views: Vec<Roster> = instances.iter().map(|_| Roster::default()).collect();
        let now = Instant::now();
        let read = roster(&[("a", 1), ("b", 1), ("c", 1)]);
        for (view, me) in views.iter_mut().zip(instances) {
            view.observe(me, &read, now, SILENCE, FORGET);
        }
        let mut owned = BTreeMap::<&str, usize>::new();
        for g in 0..300 {
            let group = GroupId::new("orders", format!("g{g}"));
            let owners: Vec<&str> =
                instances.iter().zip(&views).filter(|(me, view)| view.owns(me, &group)).map(|(me, _)| *me).collect();
            assert_eq!(owners.len(), 1, "{group}: {owners:?}");
            *owned.entry(owners[0]).or_default() += 1;
        }
        // 300 groups over 3 instances: each gets a fair share (binomial, far from the bounds).
        assert!(owned.values().all(|n| (60..=140).contains(n)), "{owned:?}");
    }

    #[test]
    fn a_silent_instance_is_dropped_after_the_silence_and_its_groups_move() {
        let mut view = Roster::default();
        let t0 = Instant::now();
        view.observe("a", &roster(&[("a", 1), ("b", 7)]), t0, SILENCE, FORGET);
        assert_eq!(view.live(), ["a", "b"]);
        let moved: Vec<GroupId> =
            (0..50).map(|g| GroupId::new("orders", format!("g{g}"))).filter(|g| !view.owns("a", g)).collect();
        assert!(!moved.is_empty(), "b owns some groups");
        // b stops counting: still live within the silence, dropped after it.
        let (forgotten, changed) = view.observe("a", &roster(&[("a", 2), ("b", 7)]), t0 + SILENCE, SILENCE, FORGET);
        assert!(forgotten.is_empty() && !changed);
        assert_eq!(view.live(), ["a", "b"]);
        let (_, changed) =
            view.observe("a", &roster(&[("a", 3), ("b", 7)]), t0 + SILENCE + Duration::from_millis(1), SILENCE, FORGET);
        assert!(changed);
        assert_eq!(view.live(), ["a"]);
        assert!(moved.iter().all(|g| view.owns("a", g)), "a took over every group b owned");
        // b counts again: live again at once.
        view.observe("a", &roster(&[("a", 4), ("b", 8)]), t0 + SILENCE * 2, SILENCE, FORGET);
        assert_eq!(view.live(), ["a", "b"]);
        // Long silent: forgotten (removed from the roster by the caller); never this process.
        let (forgotten, _) = view.observe("a", &roster(&[("a", 4), ("b", 8)]), t0 + FORGET * 2, SILENCE, FORGET);
        assert_eq!(forgotten, ["b"]);
    }

    #[test]
    fn before_any_read_or_with_only_itself_an_instance_owns_everything() {
        let group = GroupId::new("orders", "billing");
        assert!(Roster::default().owns("a", &group));
        let mut view = Roster::default();
        // Its own entry missing from the read (HDEL by another instance): it still counts itself.
        view.observe("a", &roster(&[]), Instant::now(), SILENCE, FORGET);
        assert_eq!(view.live(), ["a"]);
        assert!(view.owns("a", &group));
    }

    #[test]
    fn scores_are_stable_values() {
        // Pinned: owners must agree across processes, releases and platforms.
        let group = GroupId::new("orders", "billing");
        assert_eq!(score("a", &group), score("a", &group));
        assert_ne!(score("a", &group), score("b", &group));
        assert_ne!(score("ab", &GroupId::new("c", "d")), score("a", &GroupId::new("bc", "d")));
    }
}
