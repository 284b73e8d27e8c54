//! [`Transition`]: the mutable working copy of one decision. Every rule that changes recorded
//! state goes through it, so the bookkeeping (version bump, member epochs, target recomputation,
//! liveness guards) is done once, in [`Transition::finish`], the same way for every input.
//!
//! Every counter step (metadataVersion, assignmentEpoch, wait ids) is checked arithmetic. A step
//! with no next value is remembered as the transition's refusal ([`CounterExhausted`]) and
//! `finish` then returns it instead of a state: the decision writes nothing.

use std::collections::{BTreeMap, BTreeSet};

use super::assignor::assignor_for;
use super::engine::Context;
use super::fence::ShardFence;
use super::model::{
    clock_rate_margin_ms, next_client_number, CorrectionRound, CounterExhausted, Departure, GroupMetadata,
    LossEvidence, Member, MemberId, MemberState, ReshardReason, ReshardRecord, RevokeId, ShardId, ShardOwner, WaitId,
    CLIENT_VERSION_AHEAD_MAX, DEPARTURES_MAX, PROVEN_VERSION_AHEAD_MAX, REVOKE_ID_MAX,
};
use super::observe::Observations;
use super::planted::{PlantedBug, PlantedBugs};
use super::proof::ViewKey;
use super::protocol::{RevokeReport, SessionDigest};

/// The result of [`Transition::finish`]: what to write (if anything) and the store conditions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub next: Option<GroupMetadata>,
    pub liveness_guards: Vec<(MemberId, u64)>,
    pub liveness_remove: Vec<MemberId>,
}

pub(crate) struct Transition<'a> {
    before: &'a GroupMetadata,
    pub(crate) next: GroupMetadata,
    obs: &'a Observations,
    planted: PlantedBugs,
    /// The decision's fresh randomness ([`Context::nonce`]); revoke ids and wait tags derive from it.
    nonce: u64,
    /// A key for a state that has none ([`Context::fresh_view_key`]).
    fresh_view_key: Option<ViewKey>,
    /// `next` differs from `before`: there is something to write.
    dirty: bool,
    /// A client-visible change happened: bump metadataVersion in `finish`.
    visible_change: bool,
    /// Membership, shard count or assignor changed: recompute the target in `finish`.
    retarget: bool,
    joined: BTreeSet<MemberId>,
    granted: BTreeSet<MemberId>,
    guards: Vec<(MemberId, u64)>,
    remove: Vec<MemberId>,
    /// The first counter step that had no next value: `finish` refuses to produce a state.
    refused: Option<CounterExhausted>,
}

impl<'a> Transition<'a> {
    pub(crate) fn new(before: &'a GroupMetadata, ctx: Context<'a>) -> Self {
        Self {
            before,
            next: before.clone(),
            obs: ctx.observations,
            planted: ctx.planted,
            nonce: ctx.nonce,
            fresh_view_key: ctx.fresh_view_key,
            dirty: false,
            visible_change: false,
            retarget: false,
            joined: BTreeSet::new(),
            granted: BTreeSet::new(),
            guards: Vec::new(),
            remove: Vec::new(),
            refused: None,
        }
    }

    /// Refuses the whole decision (the first refusal wins): `finish` returns it, nothing is written.
    pub(crate) fn refuse(&mut self, exhausted: CounterExhausted) {
        self.refused.get_or_insert(exhausted);
    }

    /// A fresh wait id. When none is left the decision is refused, so the id returned then (the
    /// exhausted counter's value) is never recorded.
    pub(crate) fn allocate_wait(&mut self) -> WaitId {
        match self.next.allocate_wait(self.nonce) {
            Ok(wait) => wait,
            Err(exhausted) => {
                self.refuse(exhausted);
                self.next.next_wait_id
            }
        }
    }

    pub(crate) fn mark_visible(&mut self) {
        self.dirty = true;
        self.visible_change = true;
    }

    pub(crate) fn mark_retarget(&mut self) {
        self.retarget = true;
        self.mark_visible();
    }

    /// Raises the shard count to `to` (the caller checked `to` is above the current count and
    /// within `SHARD_COUNT_MAX`), recording why. The record names the version `finish` bumps to;
    /// when none is left the decision is refused the same way.
    pub(crate) fn add_shards(&mut self, to: u32, reason: ReshardReason) {
        let from = self.next.shard_count;
        debug_assert!(to > from, "shards are only added");
        self.next.shard_count = to;
        let metadata_version = match self.next.next_metadata_version() {
            Ok(version) => version,
            Err(exhausted) => {
                self.refuse(exhausted);
                return;
            }
        };
        self.next.resharding.push(ReshardRecord {
            from_shard_count: from,
            to_shard_count: to,
            metadata_version,
            reason,
        });
        self.mark_retarget();
    }

    /// Records a client-reported version (evidence when it is above the stored one).
    /// Versions at or below the stored one are normal (a client catching up) and record nothing.
    /// A report is credited at most [`CLIENT_VERSION_AHEAD_MAX`] above the stored version, so no
    /// report can use up the version space (the caller bounded it by `CLIENT_NUMBER_MAX`); one
    /// `proven` by the record's key (a number this group's history issued) at most
    /// [`PROVEN_VERSION_AHEAD_MAX`] above it.
    ///
    /// During an active round, a report is *new* evidence when it names a version never reported
    /// before, or when the round's lease wait is already over (the round would otherwise end
    /// without waiting for this client's lease): both restart the wait. A repeat of a report the
    /// round is still waiting out (a lost SYNC_METADATA) changes nothing, so the SYNC repeats.
    pub(crate) fn record_client_version(&mut self, reported: u64, proven: bool) {
        if reported <= self.before.metadata_version {
            return;
        }
        let cap = if proven { PROVEN_VERSION_AHEAD_MAX } else { CLIENT_VERSION_AHEAD_MAX };
        let credited = reported.min(self.before.metadata_version.saturating_add(cap));
        // In a round that learns unproven versions, `max_client_version_seen` holds those too: a
        // proven report at or below a learned one is still news (hostile review M1).
        let reported_before = match self.next.correction.as_ref() {
            Some(round) if round.unverified_lineage => round.proven_version,
            _ => self.next.max_client_version_seen,
        };
        let never_reported = credited > reported_before;
        if credited > self.next.max_client_version_seen {
            self.next.max_client_version_seen = credited;
            self.dirty = true;
        }
        let reason = LossEvidence::ClientVersionAhead { reported, stored: self.before.metadata_version };
        let wait_over = self.next.correction.as_ref().is_some_and(|round| {
            self.obs.waited_ms(round.wait)
                >= self.next.round_wait_ms(self.obs.longest_lease_seen_ms, self.obs.lease_ceiling_ms)
        });
        if self.next.correction.is_none() || never_reported || wait_over {
            self.start_round(reason);
        }
        if let Some(round) = self.next.correction.as_mut().filter(|round| round.unverified_lineage) {
            if credited > round.proven_version {
                round.proven_version = credited;
                self.dirty = true;
            }
        }
    }

    /// Starts a correction round, or restarts the active one's lease wait: new evidence of lost
    /// writes means some client may hold a lease granted in the lost history *now*, so no OK until
    /// a full lease after this evidence, and every member must sync again. Does not bump
    /// metadataVersion (seed).
    pub(crate) fn start_round(&mut self, reason: LossEvidence) {
        let wait = self.allocate_wait();
        // A restarted round is still the recreate's round: the lost lineage stays unverifiable.
        let (unverified_lineage, proven_version) =
            self.next.correction.as_ref().map_or((false, 0), |round| (round.unverified_lineage, round.proven_version));
        self.next.correction =
            Some(CorrectionRound { reason, wait, synced_members: BTreeSet::new(), unverified_lineage, proven_version });
        self.dirty = true;
    }

    /// Learns how far a lost history's versions went from a report no key here can check, during
    /// a round begun by a recreate that knew no key of the lost record
    /// ([`CorrectionRound::unverified_lineage`]): later bumps go past it, so no version is issued
    /// twice. The report restarts nothing, so a forger of such reports cannot stall the group:
    /// the round's wait began after the loss, and the lost history granted no lease after it
    /// (its later records, if any, descend from this one and carry its key). Bounded like a
    /// credited report.
    pub(crate) fn learn_client_version(&mut self, reported: u64) {
        let learned = reported.min(self.before.metadata_version.saturating_add(CLIENT_VERSION_AHEAD_MAX));
        if learned > self.next.max_client_version_seen {
            self.next.max_client_version_seen = learned;
            self.dirty = true;
        }
    }

    /// Adds (or re-adds, as a new incarnation) a member. A previous incarnation's shards are fenced:
    /// it may still be reading them until its lease surely ran out.
    /// `session` is the digest of the joining process's session secret (recorded on the member).
    /// `synced`: during a round, the join counts as synced (it named no version ahead).
    pub(crate) fn join(&mut self, member: &str, session: Option<SessionDigest>, synced: bool) {
        if self.next.members.contains_key(member) {
            self.fence_shards_of(member);
            if let Some(round) = self.next.correction.as_mut() {
                round.synced_members.remove(member);
            }
        }
        if let Some(round) = self.next.correction.as_mut().filter(|_| synced) {
            // A join during a round counts as synced unless it named a version ahead (answered
            // SYNC_METADATA, as the seed says): its answer is the recorded view, the new
            // incarnation holds no shard (the previous one's are fenced above), and leases of a
            // lost history are the round's lease wait's to outlast, not the sync's. Otherwise
            // joiners that never heartbeat again (a crash-looping consumer, or a forger joining a
            // fresh id every few seconds) would keep the round open for good (second review);
            // joiners naming a version ahead are fenced at the round's sync timeout if they never
            // sync (`decide_tick`), and rejoin synced.
            round.synced_members.insert(member.to_string());
        }
        self.next.departed.retain(|d| d.member != member);
        self.next.members.insert(
            member.to_string(),
            Member { member_epoch: 0, incarnation_epoch: 0, state: MemberState::Active, joined_at_version: 0, session },
        );
        self.joined.insert(member.to_string());
        self.mark_retarget();
    }

    /// Releases the reported shard when the report releases it ([`report_releases`]). Stale,
    /// duplicated or unnamed reports are ignored; returns whether the report was accepted.
    pub(crate) fn accept_revoked(&mut self, member: &str, report: &RevokeReport, leaving: bool) -> bool {
        let stale_ok = self.planted.has(PlantedBug::AcceptStaleRevoked);
        let releases = report_releases(self.next.current.get(&report.shard), member, report, leaving, stale_ok);
        if releases {
            self.next.current.remove(&report.shard);
            self.mark_visible();
        }
        releases
    }

    /// Removes a member that left: whatever it still holds is fenced for a lease.
    /// A `fenced` report: `member` presented exactly the recorded fence of a shard it owns and Redis
    /// refused it. Clears the recorded fence so the coordinator raises a new one for the same owner
    /// before recording (the stale value at Redis belongs to no recorded grant). Anything else —
    /// another fence, another owner, a draining or fenced shard — changes nothing.
    pub(crate) fn refence(&mut self, member: &str, report: &ShardFence) {
        if !refence_applies(self.next.current.get(&report.shard), member, report) {
            return;
        }
        if let Some(ShardOwner::Owned { fence, .. }) = self.next.current.get_mut(&report.shard) {
            *fence = None;
            self.dirty = true;
        }
    }

    pub(crate) fn leave(&mut self, member: &str) {
        self.fence_shards_of(member);
        self.note_departure(member);
        self.drop_member(member);
    }

    /// Removes the members whose liveness stayed unchanged for the member lease TTL (each with
    /// the counter value observed): their leases have surely ended, so their shards are free at
    /// once. Guarded on the observed counter values. One pass over the shards for all of them:
    /// one per member cost members × shards, seconds at a tick that expired a fleet of a large
    /// group (a scale review).
    pub(crate) fn expire_all(&mut self, expired: &[(&str, u64)]) {
        if expired.is_empty() {
            return;
        }
        let gone: BTreeSet<&str> = expired.iter().map(|(member, _)| *member).collect();
        self.next.current.retain(|_, owner| !gone.contains(owner.member().as_str()));
        for (member, observed_liveness) in expired {
            self.guards.push((member.to_string(), *observed_liveness));
            self.drop_member(member);
        }
    }

    /// Keeps the leaving incarnation of `member` (one with a session and an epoch) among the
    /// record's latest [`DEPARTURES_MAX`] departures, replacing an earlier one of the same id.
    /// Only a leave: its sender saw the incarnation (it named its epoch), so its own later joins
    /// name a version at or past the incarnation's epoch and are admitted. An expired member's
    /// process may never have seen its join answered; refusing its retries would lock it out.
    fn note_departure(&mut self, member: &str) {
        let Some(m) = self.next.members.get(member) else { return };
        let Some(session) = m.session.clone().filter(|_| m.incarnation_epoch > 0) else { return };
        let departure = Departure { member: member.to_string(), session, incarnation_epoch: m.incarnation_epoch };
        let departed = &mut self.next.departed;
        departed.retain(|d| d.member != member);
        departed.push(departure);
        let excess = departed.len().saturating_sub(DEPARTURES_MAX);
        departed.drain(..excess);
    }

    /// Fences the members that exceeded the rebalance timeout, in order, each as `fence_listed`
    /// does, with one pass over the shards for all of them (see [`Self::expire_all`]).
    pub(crate) fn fence_all(&mut self, members: &[String]) {
        if members.is_empty() {
            return;
        }
        let mut live: BTreeMap<MemberId, Vec<ShardId>> = BTreeMap::new();
        for (shard, owner) in &self.next.current {
            if let ShardOwner::Owned { member, .. } | ShardOwner::Revoking { member, .. } = owner {
                live.entry(member.clone()).or_default().push(*shard);
            }
        }
        for member in members {
            let shards = live.remove(member).unwrap_or_default();
            self.fence_listed(member, shards);
        }
    }

    /// Fences `member`, which exceeded the rebalance timeout, whose live (owned or revoking)
    /// shards are `live`.
    fn fence_listed(&mut self, member: &str, live: Vec<ShardId>) {
        self.fence_shards(member, live);
        if let Some(m) = self.next.members.get_mut(member) {
            m.state = MemberState::Fenced;
        }
        if let Some(round) = self.next.correction.as_mut() {
            round.synced_members.remove(member);
        }
        self.mark_retarget();
    }

    /// Removes liveness fields of ids the record does not list (a tick's read found them). Safe
    /// whoever touches them next: this write is conditional on the record the tick read, so a
    /// join recorded since makes it fail, and a member's liveness window starts only once a
    /// record lists it, from the value then read. The record is rewritten as it is (bookkeeping).
    pub(crate) fn remove_orphan_liveness(&mut self, orphans: &BTreeSet<MemberId>) {
        let orphans: Vec<MemberId> = orphans
            .iter()
            .filter(|id| !self.next.members.contains_key(*id) && !self.remove.contains(id))
            .cloned()
            .collect();
        if !orphans.is_empty() {
            self.remove.extend(orphans);
            self.dirty = true;
        }
    }

    /// Records that `member` heartbeated with the current version during the round.
    pub(crate) fn synced(&mut self, member: &str) {
        if let Some(round) = self.next.correction.as_mut() {
            if round.synced_members.insert(member.to_string()) {
                // Bookkeeping only: written, but no version bump.
                self.dirty = true;
            }
        }
    }

    fn drop_member(&mut self, member: &str) {
        self.next.members.remove(member);
        if let Some(round) = self.next.correction.as_mut() {
            round.synced_members.remove(member);
        }
        self.remove.push(member.to_string());
        self.mark_retarget();
    }

    fn fence_shards_of(&mut self, member: &str) {
        let live = self.live_shards_of(member);
        self.fence_shards(member, live);
    }

    /// The shards `member` owns or is revoking.
    fn live_shards_of(&self, member: &str) -> Vec<ShardId> {
        self.next.shards_where(
            |o| matches!(o, ShardOwner::Owned { member: m, .. } | ShardOwner::Revoking { member: m, .. } if m == member),
        )
    }

    /// Fences `live`, the shards `member` owns or is revoking, under one new wait.
    fn fence_shards(&mut self, member: &str, live: Vec<ShardId>) {
        if live.is_empty() {
            return;
        }
        let wait = self.allocate_wait();
        for shard in live {
            let fence = match self.next.current.get(&shard) {
                Some(ShardOwner::Owned { fence, .. } | ShardOwner::Revoking { fence, .. }) => *fence,
                Some(ShardOwner::Fenced { fence, .. }) => *fence,
                None => None,
            };
            self.next.current.insert(shard, ShardOwner::Fenced { member: member.to_string(), wait, fence });
        }
        self.mark_visible();
    }

    /// Applies the time-driven rules that need no input: fence waits, correction-round end,
    /// lease-transition end, then target recomputation and reconciliation. Returns what to write,
    /// or the refusal when a counter had no next value (then nothing may be written).
    pub(crate) fn finish(mut self) -> Result<Written, CounterExhausted> {
        self.end_waits();
        if self.retarget || self.target_is_stale() {
            self.recompute_target();
        }
        self.reconcile();
        if let Some(exhausted) = self.refused {
            return Err(exhausted);
        }
        if self.visible_change || !self.granted.is_empty() || !self.joined.is_empty() {
            let version = if self.planted.has(PlantedBug::ReuseLostVersion) {
                let past = self.next.metadata_version;
                let version = next_client_number(past).ok_or(CounterExhausted::MetadataVersion(past))?;
                self.next.metadata_version = version;
                version
            } else {
                self.next.bump_metadata_version()?
            };
            debug_assert!(version > self.before.metadata_version, "metadataVersion goes up at every bump");
            for id in &self.joined {
                if let Some(m) = self.next.members.get_mut(id) {
                    *m = Member {
                        member_epoch: version,
                        incarnation_epoch: version,
                        state: MemberState::Active,
                        joined_at_version: version,
                        session: m.session.take(),
                    };
                }
            }
            for id in &self.granted {
                if let Some(m) = self.next.members.get_mut(id) {
                    m.member_epoch = version;
                }
            }
        }
        debug_assert!(self.dirty || self.next == *self.before, "a change was not marked dirty");
        let changed = self.dirty;
        if changed {
            self.next.prune_wait_tags();
        }
        // A keyless group (an older release wrote it) takes a key at its first write, a round's
        // too: every record after it descends from it and carries the same key, so a rollback to
        // any of them still checks the proofs of the history it lost. Until then, a report is
        // credited (`proof::credited`): a forger starts at most the one round this write records.
        if changed && self.next.view_key.is_none() {
            self.next.view_key = self.fresh_view_key;
        }
        Ok(Written { next: changed.then_some(self.next), liveness_guards: self.guards, liveness_remove: self.remove })
    }

    fn end_waits(&mut self) {
        if round_over(&self.next, self.obs, self.planted) {
            self.next.correction = None;
            self.mark_visible();
        }
        if transition_over(&self.next, self.obs) {
            self.next.lease_transition = None;
            self.dirty = true;
        }
    }

    /// Membership changes always set `retarget`; this catches the remaining case cheaply: a target
    /// that does not cover every shard while members exist (or names shards when none do).
    fn target_is_stale(&self) -> bool {
        let has_active = self.next.active_members().next().is_some();
        has_active != (self.next.target.len() == self.next.shard_count as usize)
    }

    fn recompute_target(&mut self) {
        let members: Vec<MemberId> = self.next.active_members().cloned().collect();
        let target = if members.is_empty() {
            Default::default()
        } else {
            assignor_for(self.next.config.assignor).assign(
                self.next.shard_count,
                &members,
                &self.next.target,
                &self.next.current,
            )
        };
        if target != self.next.target {
            let epoch = self.next.assignment_epoch;
            match next_client_number(epoch) {
                Some(next) => self.next.assignment_epoch = next,
                None => self.refuse(CounterExhausted::AssignmentEpoch(epoch)),
            }
            self.next.target = target;
            self.mark_visible();
        }
    }

    /// Moves every shard one step towards its target: revoke from a non-target owner, cancel a
    /// revoke when the target returns, free a fenced shard once its wait is over, grant a free
    /// shard to its target. Never grants a shard someone else may still be reading.
    fn reconcile(&mut self) {
        let lease = self.next.lease_wait_ms(self.obs.longest_lease_seen_ms);
        let epoch = self.next.assignment_epoch;
        let mut steps = Vec::new();
        for_each_shard(&self.next, |shard, current, target| {
            let step = shard_step(current, target, self.obs, lease, self.planted, self.next.config.fencing);
            if step != ShardStep::Keep {
                steps.push((shard, step));
            }
            true
        });
        for (shard, step) in steps {
            self.dirty = true;
            let current = self.next.current.remove(&shard);
            match (step, current) {
                (ShardStep::Revoke, Some(ShardOwner::Owned { member, fence, .. })) => {
                    let wait = self.allocate_wait();
                    let revoke_id = Some(revoke_id(self.nonce, wait));
                    let revoking =
                        ShardOwner::Revoking { member, since_assignment_epoch: epoch, wait, revoke_id, fence };
                    self.next.current.insert(shard, revoking);
                    self.mark_visible();
                }
                (ShardStep::CancelRevoke, Some(ShardOwner::Revoking { member, since_assignment_epoch, fence, .. })) => {
                    self.next.current.insert(shard, ShardOwner::Owned { member, since_assignment_epoch, fence });
                    self.mark_visible();
                }
                (ShardStep::Release, _) => self.mark_visible(),
                (_, Some(owner)) => {
                    self.next.current.insert(shard, owner);
                }
                (_, None) => {}
            }
            if !self.next.current.contains_key(&shard) {
                if let Some(member) = self.next.target.get(&shard) {
                    let member = member.clone();
                    // No fence yet: the coordinator raises one at Redis before recording the grant.
                    let grant =
                        ShardOwner::Owned { member: member.clone(), since_assignment_epoch: epoch, fence: None };
                    self.next.current.insert(shard, grant);
                    self.granted.insert(member);
                }
            }
        }
    }
}

/// Whether a REVOKED report from `member` releases a shard recorded as `owner`:
/// - a shard `member` is draining, only when the report is REVOKED with nothing in flight and
///   names the recorded revoke (a report for an earlier revoke — delivered late, twice, or after
///   the revoke was cancelled and issued again — never releases a later one; a report naming no
///   revoke, from a client that predates revoke ids, releases nothing either);
/// - a shard `member` owns, only in its leave heartbeat (the leave is the instruction answered,
///   and it is checked against the member's current incarnation).
///
/// `stale_ok` is the planted bug that ignores the revoke id (the behaviour this rule replaced).
pub(crate) fn report_releases(
    owner: Option<&ShardOwner>,
    member: &str,
    report: &RevokeReport,
    leaving: bool,
    stale_ok: bool,
) -> bool {
    if !report.revoked || report.in_flight > 0 {
        return false;
    }
    match owner {
        Some(ShardOwner::Revoking { member: m, revoke_id, .. }) if m == member => {
            stale_ok || (revoke_id.is_some() && *revoke_id == report.revoke_id)
        }
        Some(ShardOwner::Owned { member: m, .. }) => leaving && m == member,
        _ => false,
    }
}

/// Whether a `fenced` report from `member` clears the recorded fence of a shard recorded as `owner`
/// (see [`Transition::refence`]): only the owner's own report of exactly the recorded value.
pub(crate) fn refence_applies(owner: Option<&ShardOwner>, member: &str, report: &ShardFence) -> bool {
    matches!(owner, Some(ShardOwner::Owned { member: m, fence: Some(f), .. }) if m == member && *f == report.fence)
}

/// The id of a revoke recorded with `wait` by a decision whose fresh randomness is `nonce`: a
/// SplitMix64 finalizer over both, masked to 53 bits. Distinct waits of one decision, and decisions
/// on different timelines (after a rollback reused `wait`), get different ids except with
/// probability about 2^-53 per pair: the nonce is fresh randomness, never a counter.
fn revoke_id(nonce: u64, wait: WaitId) -> RevokeId {
    let mut z = nonce ^ wait.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) & REVOKE_ID_MAX
}

/// Calls `f(shard, current owner, target)` for every shard in order, walking both maps in lockstep
/// (no per-shard lookups); stops early when `f` returns false and then returns false.
pub(crate) fn for_each_shard(
    g: &GroupMetadata,
    mut f: impl FnMut(ShardId, Option<&ShardOwner>, Option<&MemberId>) -> bool,
) -> bool {
    let mut current = g.current.iter().peekable();
    let mut target = g.target.iter().peekable();
    for shard in 0..g.shard_count {
        let owner = current.next_if(|(s, _)| **s == shard).map(|(_, o)| o);
        let member = target.next_if(|(s, _)| **s == shard).map(|(_, m)| m);
        if !f(shard, owner, member) {
            return false;
        }
    }
    true
}

/// What reconciliation does to one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ShardStep {
    Keep,
    /// Owned by a member that is no longer its target: start draining.
    Revoke,
    /// Draining member became the target again: keep it.
    CancelRevoke,
    /// Free the shard (a fenced owner's lease surely ran out); grant it if it has a target.
    Release,
    /// Free shard with a target: grant it.
    Grant,
    /// Owned by its target without a fence while fencing is on: record it again so the
    /// coordinator raises one first (a grant written by an older binary, or a refence).
    Fence,
}

fn shard_step(
    current: Option<&ShardOwner>,
    target: Option<&MemberId>,
    obs: &Observations,
    lease_ms: u64,
    planted: PlantedBugs,
    fencing: bool,
) -> ShardStep {
    match current {
        None if target.is_some() => ShardStep::Grant,
        None => ShardStep::Keep,
        Some(ShardOwner::Owned { member, .. }) if target != Some(member) => ShardStep::Revoke,
        Some(ShardOwner::Owned { fence: None, .. }) if fencing => ShardStep::Fence,
        Some(ShardOwner::Revoking { member, .. }) if target == Some(member) => ShardStep::CancelRevoke,
        Some(ShardOwner::Fenced { wait, .. }) if obs.waited_ms(*wait) >= lease_ms => ShardStep::Release,
        Some(ShardOwner::Revoking { .. }) if planted.has(PlantedBug::AssignBeforeRelease) => ShardStep::Release,
        Some(_) => ShardStep::Keep,
    }
}

/// True when no time-driven rule or reconciliation step is due: a decision that reports nothing
/// new would write nothing. Allocation-free, so steady heartbeats stay cheap.
pub(crate) fn is_quiescent(g: &GroupMetadata, obs: &Observations, planted: PlantedBugs) -> bool {
    if !quiescent_around_shards(g, obs, planted) {
        return false;
    }
    let lease = g.lease_wait_ms(obs.longest_lease_seen_ms);
    for_each_shard(g, |_, current, target| {
        shard_step(current, target, obs, lease, planted, g.config.fencing) == ShardStep::Keep
    })
}

/// The part of [`is_quiescent`] that is not about single shards: the target covers the shards
/// exactly when there are active members, and no correction round or lease transition is over.
pub(crate) fn quiescent_around_shards(g: &GroupMetadata, obs: &Observations, planted: PlantedBugs) -> bool {
    let has_active = g.active_members().next().is_some();
    has_active == (g.target.len() == g.shard_count as usize) && !round_over(g, obs, planted) && !transition_over(g, obs)
}

/// Whether a shard that is not `Fenced` needs no reconciliation step, whatever the observations
/// (only a `Fenced` shard's step depends on time) and with no planted bug (the caller checks the
/// one that changes a step: `AssignBeforeRelease` on `Revoking` shards).
pub(crate) fn shard_keeps_whatever_the_time(
    current: Option<&ShardOwner>,
    target: Option<&MemberId>,
    fencing: bool,
) -> bool {
    debug_assert!(!matches!(current, Some(ShardOwner::Fenced { .. })), "a fenced shard's step depends on time");
    shard_step(current, target, &Observations::default(), 0, PlantedBugs::NONE, fencing) == ShardStep::Keep
}

fn round_over(g: &GroupMetadata, obs: &Observations, planted: PlantedBugs) -> bool {
    g.correction.as_ref().is_some_and(|round| {
        let waited = obs.waited_ms(round.wait) >= g.round_wait_ms(obs.longest_lease_seen_ms, obs.lease_ceiling_ms)
            || planted.has(PlantedBug::SkipCorrectionLeaseWait);
        waited && g.active_members().all(|m| round.synced_members.contains(m))
    })
}

fn transition_over(g: &GroupMetadata, obs: &Observations) -> bool {
    g.lease_transition.as_ref().is_some_and(|t| {
        obs.waited_ms(t.wait) >= t.assignment_lease_ms.saturating_add(clock_rate_margin_ms(t.assignment_lease_ms))
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::core::model::{Fence, GroupConfig, GroupId, Member};

    /// One shard's recorded owner, by member index: free, owned, revoking or fenced.
    fn owner() -> impl Strategy<Value = Option<(u8, usize)>> {
        prop_oneof![Just(None), (0u8..3, 0usize..5).prop_map(Some)]
    }

    /// A group of five members (the last one not active) whose shards are owned, revoking or
    /// fenced at random, each revoking or fenced shard under its own wait.
    fn state(owners: &[Option<(u8, usize)>]) -> GroupMetadata {
        let mut g = GroupMetadata::new(GroupId::new("t", "g"), owners.len() as u32, GroupConfig::default());
        g.next_wait_id = 100;
        for i in 0..5 {
            let state = if i == 4 { MemberState::Fenced } else { MemberState::Active };
            let member = Member { member_epoch: 3, incarnation_epoch: 1, state, joined_at_version: 1, session: None };
            g.members.insert(format!("m{i}"), member);
        }
        for (shard, owner) in owners.iter().enumerate() {
            let Some((kind, i)) = owner else { continue };
            let member = format!("m{i}");
            let fence = Some(Fence { counter: 1, nonce: shard as u64 });
            let wait = g.next_wait_id;
            let owner = match kind {
                0 => ShardOwner::Owned { member, since_assignment_epoch: 1, fence },
                1 => ShardOwner::Revoking { member, since_assignment_epoch: 1, wait, revoke_id: None, fence },
                _ => ShardOwner::Fenced { member, wait, fence },
            };
            if *kind != 0 {
                g.next_wait_id += 1;
            }
            g.current.insert(shard as u32, owner);
        }
        g
    }

    proptest! {
        /// `fence_all` (one pass over the shards for all members) records what fencing the
        /// members one after another, each walking the shards, recorded: the same shards fenced
        /// under the same waits, in the same order, for any list (repeats and ids that are no
        /// member included).
        #[test]
        fn fencing_all_at_once_records_what_fencing_one_by_one_did(
            owners in proptest::collection::vec(owner(), 1..24),
            fenced in proptest::collection::vec(0usize..7, 0..6),
        ) {
            let g = state(&owners);
            let members: Vec<String> = fenced.iter().map(|i| format!("m{i}")).collect();
            let obs = Observations::default();
            let ctx = Context {
                stored_revision: 1,
                observations: &obs,
                planted: PlantedBugs::NONE,
                nonce: 9,
                fresh_view_key: None,
                wall_clock_secs: 0,
            };
            let mut at_once = Transition::new(&g, ctx);
            at_once.fence_all(&members);
            let mut one_by_one = Transition::new(&g, ctx);
            for member in &members {
                let live = one_by_one.live_shards_of(member);
                one_by_one.fence_listed(member, live);
            }
            prop_assert_eq!(&at_once.next, &one_by_one.next);
            prop_assert_eq!(at_once.finish(), one_by_one.finish());
        }
    }
}
