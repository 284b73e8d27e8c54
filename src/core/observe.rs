//! Observation windows: how a coordinator process measures elapsed time without trusting anyone
//! else's clock (DESIGN.md, "Time").
//!
//! A [`LocalView`] belongs to one coordinator process and is never stored. For each group it
//! remembers, on that process's monotonic clock, when it first saw each liveness counter value and
//! each recorded wait, keyed by its [`WaitId`] and [tag](GroupMetadata::wait_tags) (a rollback
//! reissues ids, never tags). A member is expired only when its counter stayed unchanged for
//! `memberLeaseTtl` of *this* clock; a wait is over only when *this* process observed it for the
//! required time. Any evidence of lost writes resets the group's windows, so waits restart.
//!
//! Pure: the caller passes `now_ms`; nothing here reads a clock.

use std::collections::{BTreeMap, BTreeSet};

use super::model::{GroupId, GroupMetadata, MemberId, WaitId};

/// What the deciding process has observed, handed to the pure decision core.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observations {
    /// Per member: the liveness counter as last read, and for how long (ms, this process's clock)
    /// it has been unchanged.
    pub liveness: BTreeMap<MemberId, LivenessObservation>,
    /// Per recorded wait: how long (ms) this process has observed it.
    pub waits: BTreeMap<WaitId, u64>,
    /// The longest assignment lease this process has seen recorded for the group, kept across
    /// evidence of lost writes: a lease *increase* the store then lost may still govern grants
    /// clients hold, so lease waits last at least this long (0: none seen).
    pub longest_lease_seen_ms: u64,
    /// The longest assignment lease any coordinator of this deployment grants (its
    /// `max_assignment_lease_ms`, the same on every instance; 0: no ceiling). A correction round
    /// waits at least this long: a lease increase the store lost may have been seen by no live
    /// process, and the ceiling is the only bound on it that does not depend on having seen it.
    pub lease_ceiling_ms: u64,
    /// Liveness fields the read found for ids the record does not list as members (only from a
    /// read: empty for a heartbeat). A heartbeat touches its member's field before it is decided,
    /// so refused joins and heartbeats of unknown members leave such fields behind; a tick removes
    /// them once there are more than [`ORPHAN_LIVENESS_MAX`](super::model::ORPHAN_LIVENESS_MAX).
    pub orphan_liveness: BTreeSet<MemberId>,
}

/// One member's liveness observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LivenessObservation {
    pub value: u64,
    pub unchanged_ms: u64,
    /// The window was last restarted by the member's own heartbeat through this process
    /// ([`LocalView::note_heartbeat`]), not by a read that found a new value: the window then
    /// starts no earlier than the heartbeat itself, so this process needs no liveness read to
    /// know the member was alive then.
    pub heard: bool,
}

impl Observations {
    /// How long this process has observed `wait`; 0 if never.
    pub fn waited_ms(&self, wait: WaitId) -> u64 {
        self.waits.get(&wait).copied().unwrap_or(0)
    }
}

/// One member's liveness window: which incarnation it belongs to, the counter value, and since
/// when (this process's clock) that value has been seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LivenessWindow {
    incarnation_epoch: u64,
    value: u64,
    since_ms: u64,
    heard: bool,
}

#[derive(Clone, Debug, Default)]
struct GroupWindows {
    /// The incarnation of the records these windows were observed on
    /// ([`GroupMetadata::incarnation`]; `None`: not known).
    incarnation: Option<u64>,
    liveness: BTreeMap<MemberId, LivenessWindow>,
    /// Per recorded wait, keyed by its id and [tag](GroupMetadata::wait_tags): when this process
    /// first observed it. A rollback reissues ids, never tags.
    waits: BTreeMap<(WaitId, u64), u64>,
}

impl GroupWindows {
    /// The windows for a record of `metadata`'s incarnation: a record of another incarnation than
    /// the one observed (the name was deleted and created again, possibly through another instance)
    /// starts every window anew, so nothing observed of one incarnation counts for another.
    fn for_incarnation(&mut self, metadata: &GroupMetadata) -> &mut Self {
        match (self.incarnation, metadata.incarnation) {
            (Some(seen), Some(read)) if seen != read => *self = Self { incarnation: Some(read), ..Self::default() },
            (None, Some(read)) => self.incarnation = Some(read),
            _ => {}
        }
        self
    }
}

/// Per-process observation state for every group it serves.
#[derive(Clone, Debug, Default)]
pub struct LocalView {
    groups: BTreeMap<GroupId, GroupWindows>,
    /// Per group, the longest effective assignment lease seen recorded. Not cleared by
    /// [`reset`](Self::reset) or [`reset_all`](Self::reset_all): it must outlive a rollback.
    longest_lease_ms: BTreeMap<GroupId, u64>,
    /// Reported in every [`Observations::lease_ceiling_ms`].
    lease_ceiling_ms: u64,
}

impl LocalView {
    /// A view whose observations carry `lease_ceiling_ms` ([`Observations::lease_ceiling_ms`]).
    pub fn with_lease_ceiling(lease_ceiling_ms: u64) -> Self {
        Self { lease_ceiling_ms, ..Self::default() }
    }

    /// Records what was just read (`now_ms` on this process's monotonic clock) and returns the
    /// observations for the decision. `liveness` is `None` when the caller did not read it (a
    /// heartbeat); liveness windows are then reported as last seen.
    pub fn observe(
        &mut self,
        now_ms: u64,
        metadata: &GroupMetadata,
        liveness: Option<&BTreeMap<MemberId, u64>>,
    ) -> Observations {
        let longest_lease_seen_ms = self.note_lease(metadata);
        let windows = self.groups.entry(metadata.group.clone()).or_default().for_incarnation(metadata);
        // Windows are per incarnation: a member removed and rejoined gets a fresh liveness counter,
        // which may repeat a value seen for its previous incarnation (ABA). Keying by the
        // incarnation epoch (a never-reused version) makes the new incarnation start a new window.
        let mut next = BTreeMap::new();
        for (member, record) in &metadata.members {
            let previous = windows.liveness.get(member).filter(|w| w.incarnation_epoch == record.incarnation_epoch);
            let window = match (liveness.map(|l| l.get(member).copied().unwrap_or(0)), previous) {
                (Some(value), Some(w)) if w.value == value => *w,
                (Some(value), _) => LivenessWindow {
                    incarnation_epoch: record.incarnation_epoch,
                    value,
                    since_ms: now_ms,
                    heard: false,
                },
                (None, Some(w)) => *w,
                (None, None) => continue,
            };
            next.insert(member.clone(), window);
        }
        windows.liveness = next;
        let orphan_liveness = liveness
            .map(|read| read.keys().filter(|field| !metadata.members.contains_key(*field)).cloned().collect())
            .unwrap_or_default();
        let mut waits = BTreeMap::new();
        for key in recorded_waits(metadata) {
            let since = windows.waits.get(&key).copied().unwrap_or(now_ms);
            waits.insert(key, since);
        }
        windows.waits = waits;
        Observations {
            liveness: windows
                .liveness
                .iter()
                .map(|(m, w)| {
                    let unchanged_ms = now_ms.saturating_sub(w.since_ms);
                    (m.clone(), LivenessObservation { value: w.value, unchanged_ms, heard: w.heard })
                })
                .collect(),
            waits: windows.waits.iter().map(|(&(w, _), &since)| (w, now_ms.saturating_sub(since))).collect(),
            longest_lease_seen_ms,
            lease_ceiling_ms: self.lease_ceiling_ms,
            orphan_liveness,
        }
    }

    /// Records `metadata`'s effective lease and returns the longest seen for its group.
    fn note_lease(&mut self, metadata: &GroupMetadata) -> u64 {
        let lease = metadata.effective_assignment_lease_ms();
        let longest = self.longest_lease_ms.entry(metadata.group.clone()).or_insert(lease);
        *longest = (*longest).max(lease);
        *longest
    }

    /// Every group this view holds anything for (windows or the longest lease seen).
    pub fn groups(&self) -> BTreeSet<GroupId> {
        self.groups.keys().chain(self.longest_lease_ms.keys()).cloned().collect()
    }

    /// Whether this view holds anything for `group`.
    pub fn holds(&self, group: &GroupId) -> bool {
        self.groups.contains_key(group) || self.longest_lease_ms.contains_key(group)
    }

    /// Forgets everything about a group that was deleted.
    pub fn forget(&mut self, group: &GroupId) {
        self.groups.remove(group);
        self.longest_lease_ms.remove(group);
    }

    /// Records that `member` of `metadata` heartbeated through this process just now and that its
    /// liveness counter then read `value` (the touch's answer): its window restarts now, whatever
    /// it held. Restarting can only postpone an expiry, never advance one (the counter moved at
    /// Redis before this process got the answer), and a touch is proof of life even when the
    /// counter repeats a value (a failover that lost increments), so an equal value restarts the
    /// window too. A member `metadata` does not list, or a 0 (nothing was written: the record
    /// was absent), records nothing.
    pub fn note_heartbeat(&mut self, now_ms: u64, metadata: &GroupMetadata, member: &str, value: u64) {
        let Some(record) = metadata.members.get(member) else { return };
        if value == 0 {
            return;
        }
        let windows = self.groups.entry(metadata.group.clone()).or_default().for_incarnation(metadata);
        let window =
            LivenessWindow { incarnation_epoch: record.incarnation_epoch, value, since_ms: now_ms, heard: true };
        windows.liveness.insert(member.to_string(), window);
    }

    /// Records that another coordinator process relayed a heartbeat of `member` (incarnation
    /// `incarnation_epoch`) that left its liveness counter at `value`, and that this process
    /// received the relay just now. The window restarts now, as for a heartbeat through this
    /// process ([`note_heartbeat`](Self::note_heartbeat)), but only on news: the incarnation is
    /// the one `metadata` records and `value` is above the counter this process already knows.
    /// A relayed value at or below it may be older than what this process saw itself (relays
    /// arrive late, and a blob may be read twice), and restarting on it would keep a member
    /// alive on old news. Returns whether the window restarted.
    pub fn note_relayed(
        &mut self,
        now_ms: u64,
        metadata: &GroupMetadata,
        member: &str,
        incarnation_epoch: u64,
        value: u64,
    ) -> bool {
        let Some(record) = metadata.members.get(member) else { return false };
        if value == 0 || record.incarnation_epoch != incarnation_epoch {
            return false;
        }
        let windows = self.groups.entry(metadata.group.clone()).or_default().for_incarnation(metadata);
        let known = windows.liveness.get(member).filter(|w| w.incarnation_epoch == incarnation_epoch);
        if known.is_some_and(|w| value <= w.value) {
            return false;
        }
        let window = LivenessWindow { incarnation_epoch, value, since_ms: now_ms, heard: true };
        windows.liveness.insert(member.to_string(), window);
        true
    }

    /// A heartbeat's observations: records every wait `metadata` records that this process had not
    /// seen (it starts now) and reports how long each has been observed. Liveness is left out, as
    /// heartbeat decisions never read it (expiry is a tick rule: [`crate::core::decide_tick`]),
    /// and nothing is pruned (the next [`observe`](Self::observe) does that). Allocates nothing
    /// on a group with no recorded wait, which is the steady state.
    pub fn observe_waits(&mut self, now_ms: u64, metadata: &GroupMetadata) -> Observations {
        self.observe_listed_waits(now_ms, metadata, metadata.recorded_waits())
    }

    /// [`observe_waits`](Self::observe_waits), given the waits `metadata` records (as
    /// [`GroupIndex::waits`](super::index::GroupIndex::waits) lists them without walking its
    /// shards).
    pub fn observe_listed_waits(
        &mut self,
        now_ms: u64,
        metadata: &GroupMetadata,
        recorded: impl Iterator<Item = WaitId>,
    ) -> Observations {
        let longest_lease_seen_ms = self.note_lease(metadata);
        let windows = match self.groups.get_mut(&metadata.group) {
            Some(windows) => windows,
            None => self.groups.entry(metadata.group.clone()).or_default(),
        }
        .for_incarnation(metadata);
        let mut waits = BTreeMap::new();
        for key in recorded.map(|wait| (wait, metadata.wait_tag(wait))) {
            let since = *windows.waits.entry(key).or_insert(now_ms);
            waits.insert(key.0, now_ms.saturating_sub(since));
        }
        Observations {
            liveness: BTreeMap::new(),
            waits,
            longest_lease_seen_ms,
            lease_ceiling_ms: self.lease_ceiling_ms,
            orphan_liveness: BTreeSet::new(),
        }
    }

    /// Forgets every window of `group`: evidence of lost writes restarts all waits.
    pub fn reset(&mut self, group: &GroupId) {
        self.groups.remove(group);
    }

    /// Forgets every window of every group (server identity changed, process restarted).
    pub fn reset_all(&mut self) {
        self.groups.clear();
    }
}

/// Every wait the metadata records, by id and tag (how this process keys its timings).
fn recorded_waits(metadata: &GroupMetadata) -> impl Iterator<Item = (WaitId, u64)> + '_ {
    metadata.recorded_waits().map(|wait| (wait, metadata.wait_tag(wait)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::{GroupConfig, Member, MemberState, ShardOwner};

    fn group_with_member() -> GroupMetadata {
        let mut g = GroupMetadata::new(GroupId::new("s", "g"), 4, GroupConfig::default());
        g.members.insert(
            "a".into(),
            Member {
                member_epoch: 1,
                incarnation_epoch: 1,
                state: MemberState::Active,
                joined_at_version: 1,
                session: None,
            },
        );
        g
    }

    #[test]
    fn liveness_window_restarts_on_change_and_on_reset() {
        let g = group_with_member();
        let mut view = LocalView::default();
        let live = |v: u64| BTreeMap::from([("a".to_string(), v)]);
        assert_eq!(view.observe(100, &g, Some(&live(5))).liveness["a"].unchanged_ms, 0);
        assert_eq!(view.observe(400, &g, Some(&live(5))).liveness["a"].unchanged_ms, 300);
        assert_eq!(view.observe(500, &g, None).liveness["a"].unchanged_ms, 400);
        assert_eq!(view.observe(600, &g, Some(&live(6))).liveness["a"].unchanged_ms, 0);
        view.reset(&g.group);
        assert_eq!(view.observe(900, &g, Some(&live(6))).liveness["a"].unchanged_ms, 0);
    }

    #[test]
    fn a_heartbeat_restarts_its_members_window_as_heard_and_a_read_of_a_new_value_does_not() {
        let g = group_with_member();
        let mut view = LocalView::default();
        let live = |v: u64| BTreeMap::from([("a".to_string(), v)]);
        view.observe(0, &g, Some(&live(5)));
        let seen = view.observe(300, &g, None).liveness["a"];
        assert_eq!((seen.unchanged_ms, seen.heard), (300, false));
        // The touch answered 6: heard now.
        view.note_heartbeat(350, &g, "a", 6);
        let seen = view.observe(400, &g, None).liveness["a"];
        assert_eq!((seen.value, seen.unchanged_ms, seen.heard), (6, 50, true));
        // A read of the same value keeps the heard window; a new value (a heartbeat through
        // another process) restarts it as read.
        let seen = view.observe(500, &g, Some(&live(6))).liveness["a"];
        assert_eq!((seen.unchanged_ms, seen.heard), (150, true));
        let seen = view.observe(600, &g, Some(&live(7))).liveness["a"];
        assert_eq!((seen.unchanged_ms, seen.heard), (0, false));
        // A repeated value (increments lost with a failover) still restarts: a touch is proof of
        // life. An unknown member or a 0 (nothing written) records nothing.
        view.note_heartbeat(700, &g, "a", 7);
        assert_eq!(view.observe(700, &g, None).liveness["a"].unchanged_ms, 0);
        view.note_heartbeat(800, &g, "a", 0);
        view.note_heartbeat(800, &g, "zed", 3);
        let seen = view.observe(900, &g, None).liveness;
        assert_eq!((seen["a"].unchanged_ms, seen.len()), (200, 1));
    }

    #[test]
    fn a_relayed_heartbeat_restarts_a_window_only_on_news_of_the_recorded_incarnation() {
        let g = group_with_member();
        let incarnation = g.members["a"].incarnation_epoch;
        let mut view = LocalView::default();
        let live = |v: u64| BTreeMap::from([("a".to_string(), v)]);
        view.observe(0, &g, Some(&live(5)));
        // Old news (the value this process read, or below: a blob read twice, or late) and
        // another incarnation's counter change nothing.
        assert!(!view.note_relayed(100, &g, "a", incarnation, 5));
        assert!(!view.note_relayed(100, &g, "a", incarnation, 4));
        assert!(!view.note_relayed(100, &g, "a", incarnation + 1, 9));
        assert!(!view.note_relayed(100, &g, "zed", incarnation, 9));
        assert!(!view.note_relayed(100, &g, "a", incarnation, 0));
        let seen = view.observe(200, &g, None).liveness["a"];
        assert_eq!((seen.value, seen.unchanged_ms, seen.heard), (5, 200, false));
        // A higher counter is a heartbeat after what this process knew: heard, from now.
        assert!(view.note_relayed(300, &g, "a", incarnation, 6));
        let seen = view.observe(400, &g, None).liveness["a"];
        assert_eq!((seen.value, seen.unchanged_ms, seen.heard), (6, 100, true));
        // The same blob read again restarts nothing.
        assert!(!view.note_relayed(900, &g, "a", incarnation, 6));
        assert_eq!(view.observe(1_000, &g, None).liveness["a"].unchanged_ms, 700);
    }

    #[test]
    fn a_new_incarnation_starts_a_new_window_even_when_its_counter_repeats_a_value() {
        let mut g = group_with_member();
        let mut view = LocalView::default();
        let live = BTreeMap::from([("a".to_string(), 1)]);
        view.observe(0, &g, Some(&live));
        // "a" expired (its counter deleted) and rejoined: the counter is 1 again.
        g.members.get_mut("a").expect("member").incarnation_epoch = 9;
        g.members.get_mut("a").expect("member").member_epoch = 9;
        let obs = view.observe(10_000, &g, Some(&live));
        assert_eq!(obs.liveness["a"].unchanged_ms, 0, "not judged silent for the old incarnation's time");
    }

    #[test]
    fn waits_are_measured_from_first_observation() {
        let mut g = group_with_member();
        let wait = g.allocate_wait(1).expect("a fresh group has wait ids left");
        g.current.insert(0, ShardOwner::Fenced { member: "a".into(), wait, fence: None });
        let mut view = LocalView::default();
        assert_eq!(view.observe(1_000, &g, None).waited_ms(wait), 0);
        assert_eq!(view.observe(3_500, &g, None).waited_ms(wait), 2_500);
        g.current.clear();
        assert_eq!(view.observe(4_000, &g, None).waited_ms(wait), 0, "forgotten once no longer recorded");
    }

    /// Hostile review (stop 34): a process that never saw a delete and a create through another
    /// instance credited the old incarnation's observed wait to the new one's wait of the same id.
    #[test]
    fn nothing_observed_of_one_incarnation_counts_for_another() {
        let mut old = group_with_member();
        old.incarnation = Some(100);
        let wait = old.allocate_wait(1).expect("a wait id");
        old.current.insert(0, ShardOwner::Fenced { member: "a".into(), wait, fence: None });
        let mut view = LocalView::default();
        view.observe_waits(1_000, &old);
        assert_eq!(view.observe_waits(5_000, &old).waited_ms(wait), 4_000);
        // The same wait id, member and counter in a record of a later incarnation.
        let mut new = old.clone();
        new.incarnation = Some(200);
        assert_eq!(view.observe_waits(6_000, &new).waited_ms(wait), 0, "heartbeat path");
        let mut reread = LocalView::default();
        reread.observe(1_000, &old, Some(&BTreeMap::from([("a".to_string(), 7)])));
        let seen = reread.observe(5_000, &new, Some(&BTreeMap::from([("a".to_string(), 7)])));
        assert_eq!((seen.waited_ms(wait), seen.liveness["a"].unchanged_ms), (0, 0), "read path");
        // A record without an incarnation (an older release's rewrite) keeps the windows.
        let mut keyless = new.clone();
        keyless.incarnation = None;
        assert_eq!(view.observe_waits(7_000, &keyless).waited_ms(wait), 1_000);
    }

    /// Hostile review (stop 36): a silent rollback rewinds `nextWaitId`, and the history that
    /// replaces the lost one allocates the same id again. A process that observed the lost wait
    /// (even through one heartbeat) and never read the records in between credited that time to
    /// the new wait. The decision's fresh randomness tags each wait, and timings are per tag.
    #[test]
    fn a_wait_id_reissued_after_a_rollback_is_a_new_wait() {
        let base = group_with_member();
        let mut lost = base.clone();
        let wait = lost.allocate_wait(0x1111).expect("a wait id");
        lost.current.insert(0, ShardOwner::Fenced { member: "a".into(), wait, fence: None });
        let mut view = LocalView::default();
        view.observe_waits(1_000, &lost);
        assert_eq!(view.observe_waits(5_000, &lost).waited_ms(wait), 4_000);
        // The rollback went back to `base`; another decision allocates the same id.
        let mut replacing = base.clone();
        let again = replacing.allocate_wait(0x2222).expect("a wait id");
        replacing.current.insert(0, ShardOwner::Fenced { member: "a".into(), wait: again, fence: None });
        assert_eq!(again, wait, "the counter was rewound");
        assert_ne!(replacing.wait_tag(again), lost.wait_tag(wait));
        assert_eq!(view.observe_waits(6_000, &replacing).waited_ms(again), 0, "heartbeat path");
        assert_eq!(view.observe_waits(6_500, &replacing).waited_ms(again), 500);
        let mut reread = LocalView::default();
        reread.observe(1_000, &lost, None);
        assert_eq!(reread.observe(5_000, &replacing, None).waited_ms(again), 0, "read path");
        // An older release's write drops the tags: the wait restarts, it is never credited more.
        let mut untagged = replacing.clone();
        untagged.wait_tags.clear();
        assert_eq!(view.observe_waits(7_000, &untagged).waited_ms(again), 0);
    }

    #[test]
    fn tags_of_waits_no_longer_recorded_are_pruned() {
        let mut g = group_with_member();
        let kept = g.allocate_wait(5).expect("a wait id");
        let dropped = g.allocate_wait(5).expect("a wait id");
        g.current.insert(0, ShardOwner::Fenced { member: "a".into(), wait: kept, fence: None });
        assert_ne!(g.wait_tag(kept), g.wait_tag(dropped), "one decision's waits get distinct tags");
        g.prune_wait_tags();
        assert_eq!(g.wait_tags.keys().copied().collect::<Vec<_>>(), vec![kept]);
    }
}
