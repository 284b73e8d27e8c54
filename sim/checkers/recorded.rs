//! Invariant 4, **recorded responses**: every decision a client receives was in the store when it
//! was sent — a response is never derived from unwritten state.
//!
//! Every successful coordinator response names the `store_revision` it was derived from. For each
//! response that reached a client's transport (including ones a response-loss fault then hid: the
//! coordinator did send them), the checker looks in the store's metadata history for the states of
//! the group's key that had that revision and were stored at or before the instant the response
//! arrived (the question `MemoryStore::record_at` answers; a revision can be stored more than once
//! after a rollback, so every such state is a candidate). The response must equal the view of one
//! of them, as [`spec`] derives it from the spec — written here, independently of the core's
//! own `member_view` / `status_for` / `routing_view`, so a wrong answer the core derives
//! consistently from stored state is still caught: a member's view (an `OK` or `REVOKE_PENDING`
//! status must be the state's own; `SYNC_METADATA` also when the request reported a version above
//! the state's), a routing view (whose `lostVersion`, if any, is above the state's version), or an
//! admin result naming the state's version.
//!
//! A write the store acknowledged but dropped (the `redis-write-drop` fault) leaves the
//! coordinator answering from a state that was never stored, through no fault of its own: such a
//! response (its revision was acknowledged-and-dropped before it arrived) is counted, not failed.
//!
//! A split brain's old primary keeps its own timeline after the failover: a coordinator it served
//! answers from the state current at the fork (which the primary lost) and from states only it
//! recorded afterwards, and those are recorded states too. A response that matches no state of the
//! primary but one the old primary held is counted, not failed. Every answer that arrived after the
//! fork and matches a state the old primary held is listed ([`OldPrimaryAnswer`]): the
//! split-ownership, message and version checkers attribute damage to the split brain through them.

use std::collections::BTreeMap;
use std::fmt;

use rsc::core::model::GroupMetadata;
use rsc::core::protocol::{HeartbeatRequest, HeartbeatResponse, HeartbeatStatus, RoutingResponse};
use rsc::store::memory::{HistoryEvent, HistoryKind};

use super::Facts;
use crate::plan::NodeRef;
use crate::records::{fmt_us, ProcessId, Us};
use spec::{spec_member_view, spec_routing_view, spec_status};

/// The spec's view of a recorded state (seed: "Heartbeat statuses", "Producer Routing"; DESIGN
/// brief: statuses, pending shards derived from the target), written from the spec for this
/// oracle. It shares the protocol's *types*, never its rules.
mod spec {
    use rsc::core::fence::ShardFence;
    use rsc::core::model::{GroupMetadata, ShardOwner};
    use rsc::core::proof::ViewProof;
    use rsc::core::protocol::{Drain, HeartbeatResponse, HeartbeatStatus, RoutingResponse};

    /// The status the state gives `member`: during a correction round, SYNC_METADATA until the
    /// member synced, then REVOKE_PENDING; otherwise REVOKE_PENDING while it has a shard to drain
    /// or a target shard it does not own yet; OK only when nothing blocks it.
    pub fn spec_status(g: &GroupMetadata, member: &str) -> HeartbeatStatus {
        if let Some(round) = &g.correction {
            return if round.synced_members.contains(member) {
                HeartbeatStatus::RevokePending
            } else {
                HeartbeatStatus::SyncMetadata
            };
        }
        let draining = g.current.values().any(|o| matches!(o, ShardOwner::Revoking { member: m, .. } if m == member));
        let waiting = g.target.iter().any(|(shard, t)| {
            t == member && !matches!(g.current.get(shard), Some(ShardOwner::Owned { member: m, .. }) if m == member)
        });
        if draining || waiting {
            HeartbeatStatus::RevokePending
        } else {
            HeartbeatStatus::Ok
        }
    }

    /// What the state says to `member` under `status`: the shards it owns, the ones it waits for,
    /// the ones it must drain (with each drain's revoke id), its epoch and the group's numbers.
    pub fn spec_member_view(
        g: &GroupMetadata,
        member: &str,
        status: HeartbeatStatus,
        revision: u64,
    ) -> HeartbeatResponse {
        let mut view = HeartbeatResponse {
            status,
            member_id: member.to_string(),
            member_epoch: g.members.get(member).map_or(0, |m| m.member_epoch),
            metadata_version: g.metadata_version,
            assignment_epoch: g.assignment_epoch,
            shard_count: g.shard_count,
            assigned: Vec::new(),
            pending: Vec::new(),
            revoke: Vec::new(),
            drains: Vec::new(),
            assignment_lease_ms: g.config.assignment_lease_ms,
            heartbeat_interval_ms: g.config.heartbeat_interval_ms,
            store_revision: revision,
            fences: Vec::new(),
            metadata_version_proof: spec_proof(g, "metadataVersion", g.metadata_version),
        };
        for shard in 0..g.shard_count {
            match g.current.get(&shard) {
                Some(ShardOwner::Owned { member: m, fence, .. }) if m == member => {
                    view.assigned.push(shard);
                    view.fences.extend(fence.map(|fence| ShardFence { shard, fence }));
                }
                Some(ShardOwner::Revoking { member: m, revoke_id, fence, .. }) if m == member => {
                    view.revoke.push(shard);
                    if let Some(revoke_id) = *revoke_id {
                        view.drains.push(Drain { shard, revoke_id });
                    }
                    view.fences.extend(fence.map(|fence| ShardFence { shard, fence }));
                }
                _ => {}
            }
            let owned = matches!(g.current.get(&shard), Some(ShardOwner::Owned { member: m, .. }) if m == member);
            if g.target.get(&shard).is_some_and(|t| t == member) && !owned {
                view.pending.push(shard);
            }
        }
        view
    }

    /// The producer's view: version, shard count, one stream key `<prefix>:<shard>` per shard.
    pub fn spec_routing_view(g: &GroupMetadata, revision: u64) -> RoutingResponse {
        RoutingResponse {
            group: g.group.clone(),
            metadata_version: g.metadata_version,
            shard_count: g.shard_count,
            stream_keys: (0..g.shard_count).map(|s| format!("{}:{s}", g.group.stream_prefix)).collect(),
            routing_cache_ttl_ms: g.config.routing_cache_ttl_ms,
            routing_refresh_interval_ms: g.config.routing_refresh_interval_ms,
            store_revision: revision,
            lost_version: None,
            // This coordinator reads `knownShardCount` (DESIGN §8).
            accepts_known_shard_count: true,
            metadata_version_proof: spec_proof(g, "metadataVersion", g.metadata_version),
            shard_count_proof: spec_proof(g, "shardCount", u64::from(g.shard_count)),
        }
    }

    /// DESIGN §8's proof of a number the state records: the first 16 bytes of HMAC-SHA256 under
    /// the group's recorded key over the length-prefixed domain `rsc-view-proof-v1`, stream
    /// prefix, group name and fact name, then the value as 8 big-endian bytes. None without a key.
    pub fn spec_proof(g: &GroupMetadata, fact: &str, value: u64) -> Option<ViewProof> {
        use hmac::{Hmac, Mac};
        let key_hex = serde_json::to_value(g.view_key?).ok()?.as_str()?.to_string();
        let key: Vec<u8> = (0..key_hex.len() / 2)
            .map(|i| u8::from_str_radix(&key_hex[2 * i..2 * i + 2], 16))
            .collect::<Result<_, _>>()
            .ok()?;
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(&key).ok()?;
        for field in ["rsc-view-proof-v1", &g.group.stream_prefix, &g.group.consumer_group, fact] {
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field.as_bytes());
        }
        mac.update(&value.to_be_bytes());
        let tag = mac.finalize().into_bytes();
        let hex: String = tag[..16].iter().map(|b| format!("{b:02x}")).collect();
        hex.parse().ok()
    }
}

/// A violation of invariant 4 (recorded responses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Invariant 4: no state with the response's revision was stored before the response arrived.
    NotRecorded { what: &'static str, who: String, revision: u64, at_us: Us },
    /// Invariant 4: states with that revision were stored, but the response matches none of them.
    Inconsistent { what: &'static str, who: String, revision: u64, at_us: Us, detail: String },
}

impl super::Violation for Violation {
    fn kind(&self) -> &'static str {
        match self {
            Violation::NotRecorded { .. } => "response-not-recorded",
            Violation::Inconsistent { .. } => "response-inconsistent",
        }
    }

    fn at_us(&self) -> Us {
        match self {
            Violation::NotRecorded { at_us, .. } | Violation::Inconsistent { at_us, .. } => *at_us,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::NotRecorded { what, who, revision, at_us } => write!(
                f,
                "{what} response to {who} names revision {revision}, which was not stored by {}s",
                fmt_us(*at_us).trim()
            ),
            Violation::Inconsistent { what, who, revision, detail, .. } => {
                write!(f, "{what} response to {who} does not match any stored state of revision {revision}: {detail}")
            }
        }
    }
}

/// Every stored state of the group by revision: (store ms it was stored, parsed aggregate).
struct States {
    by_revision: BTreeMap<u64, Vec<(u64, Option<GroupMetadata>)>>,
    /// (revision, store ms) of every acknowledged-but-dropped write of the group.
    dropped: Vec<(u64, u64)>,
}

/// A heartbeat or routing answer a coordinator on a split brain's old side may have given: it
/// arrived after the old primary's fork and matches a state the old primary held (the one current
/// at the fork, which the primary lost, or one recorded after). A view can match both sides; such
/// an answer is listed too (the attribution is generous, and bounded in time by the checkers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OldPrimaryAnswer {
    pub process: ProcessId,
    pub received_at_us: Us,
    /// The old primary that recorded the state.
    pub server: NodeRef,
    /// Whether the client saw it (a response-loss fault hides some): only a seen answer told it
    /// anything.
    pub seen: bool,
}

/// What the recorded-responses oracle counted besides violations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordedCounts {
    /// Responses derived from writes the store acknowledged but dropped.
    pub from_dropped_writes: usize,
    /// Responses (heartbeat, routing, admin) only an old primary's states explain.
    pub from_old_primary: usize,
    /// Heartbeat and routing answers an old primary's side may have given (see [`OldPrimaryAnswer`]).
    pub old_primary_answers: Vec<OldPrimaryAnswer>,
}

/// How one response was judged.
enum Judged {
    Clean,
    /// Derived from a write the store acknowledged and dropped.
    FromDroppedWrite,
    /// Derived from a state only an old primary recorded.
    FromOldPrimary,
    Violated(Violation),
}

/// The primary's states and, per old primary, the states it held while it lived: the one current
/// at its fork and every one recorded after; with the span (fork, end of its damage window) in
/// which a response may come from them.
struct Timelines {
    primary: States,
    old: Vec<(NodeRef, (Us, Us), States)>,
}

impl Timelines {
    fn from_facts(facts: &Facts<'_>) -> Self {
        let old = facts
            .split_brains
            .iter()
            .map(|split| {
                // The state current at the fork: the last event before it that recorded the group.
                let at_fork = split.history[..split.fork_len.min(split.history.len())]
                    .iter()
                    .rposition(|e| e.metadata_after.iter().any(|(g, _)| g == facts.group))
                    .unwrap_or(split.fork_len);
                let held = split.history.get(at_fork..).unwrap_or(&[]);
                // Until the window the other checkers close their split-brain excuses at: after
                // it, an answer from the old primary's state is no longer in flight from its side
                // (an outside review: the excuse had no end).
                let until_us = split.damage_until_us(facts.assignment_lease_us());
                (split.server, (split.fork_us, until_us), States::from_events(facts, held))
            })
            .collect();
        Self { primary: States::from_events(facts, facts.history), old }
    }

    /// Judges one response against the primary's states; also names an old primary whose side may
    /// have answered it (it arrived between that old primary's fork and the end of its damage
    /// window, and matches a state it held).
    /// A response only an old primary's states explain is counted, not failed.
    fn judge(
        &self,
        what: &'static str,
        who: String,
        revision: u64,
        at_us: Us,
        matches: impl Fn(&GroupMetadata) -> Result<(), String>,
    ) -> (Judged, Option<NodeRef>) {
        let old_side = self
            .old
            .iter()
            .find(|(_, (fork_us, until_us), states)| {
                (*fork_us..=*until_us).contains(&at_us)
                    && states.candidates(revision, at_us).iter().any(|g| matches(g).is_ok())
            })
            .map(|(server, ..)| *server);
        match (self.primary.judge(what, who, revision, at_us, &matches), old_side) {
            (Judged::Violated(_), Some(server)) => (Judged::FromOldPrimary, Some(server)),
            (judged, old_side) => (judged, old_side),
        }
    }
}

impl States {
    fn from_events(facts: &Facts<'_>, events: &[HistoryEvent]) -> Self {
        let mut by_revision: BTreeMap<u64, Vec<(u64, Option<GroupMetadata>)>> = BTreeMap::new();
        let mut dropped = Vec::new();
        for event in events {
            if let HistoryKind::WriteDropped { group, revision } = &event.kind {
                if group == facts.group {
                    dropped.push((*revision, event.at_ms));
                }
            }
            for (group, record) in &event.metadata_after {
                if let (true, Some(record)) = (group == facts.group, record) {
                    let parsed = serde_json::from_str(&record.aggregate).ok();
                    by_revision.entry(record.revision).or_default().push((event.at_ms, parsed));
                }
            }
        }
        Self { by_revision, dropped }
    }

    /// The states with `revision` stored at or before `at_us` (compared on the store's ms clock).
    fn candidates(&self, revision: u64, at_us: Us) -> Vec<&GroupMetadata> {
        let at_ms = at_us / 1_000;
        self.by_revision.get(&revision).map_or_else(Vec::new, |list| {
            list.iter().filter(|(stored_ms, _)| *stored_ms <= at_ms).filter_map(|(_, g)| g.as_ref()).collect()
        })
    }

    /// Judges one response: `matches` says whether it is the view of a state.
    fn judge(
        &self,
        what: &'static str,
        who: String,
        revision: u64,
        at_us: Us,
        matches: &impl Fn(&GroupMetadata) -> Result<(), String>,
    ) -> Judged {
        let candidates = self.candidates(revision, at_us);
        if candidates.iter().any(|g| matches(g).is_ok()) {
            return Judged::Clean;
        }
        if self.dropped.iter().any(|(r, at_ms)| *r == revision && *at_ms <= at_us / 1_000) {
            return Judged::FromDroppedWrite;
        }
        Judged::Violated(match candidates.last() {
            None => Violation::NotRecorded { what, who, revision, at_us },
            Some(latest) => {
                let detail = matches(latest).err().unwrap_or_default();
                Violation::Inconsistent { what, who, revision, at_us, detail }
            }
        })
    }
}

/// Whether `resp` is the view of `g` for the heartbeat `req`.
fn heartbeat_view(g: &GroupMetadata, req: &HeartbeatRequest, resp: &HeartbeatResponse) -> Result<(), String> {
    let member = &req.member_id;
    let view = spec_member_view(g, member, resp.status, resp.store_revision);
    // A leave is answered with the member's empty view (epoch 0) once it is gone.
    let expected = if req.leave && !g.members.contains_key(member) {
        HeartbeatResponse {
            assigned: vec![],
            pending: vec![],
            revoke: vec![],
            drains: vec![],
            fences: vec![],
            member_epoch: 0,
            ..view
        }
    } else {
        view
    };
    if &expected != resp {
        return Err(format!("expected {expected:?}, got {resp:?}"));
    }
    let recorded = spec_status(g, member);
    let status_ok = match resp.status {
        HeartbeatStatus::SyncMetadata => {
            recorded == HeartbeatStatus::SyncMetadata || req.metadata_version > g.metadata_version
        }
        _ if req.leave => true,
        status => status == recorded,
    };
    if status_ok {
        Ok(())
    } else {
        Err(format!("status {:?} but the recorded state gives {recorded:?}", resp.status))
    }
}

/// Checks invariant 4 for every heartbeat, routing and admin response; also returns what it
/// counted (responses from dropped writes and from old primaries).
pub fn check(facts: &Facts<'_>) -> (Vec<Violation>, RecordedCounts) {
    let states = Timelines::from_facts(facts);
    let mut violations = Vec::new();
    let mut counts = RecordedCounts::default();
    let mut tally = |(judged, old_side): (Judged, Option<NodeRef>), answer: Option<(ProcessId, Us, bool)>| {
        match judged {
            Judged::Clean => {}
            Judged::FromDroppedWrite => counts.from_dropped_writes += 1,
            Judged::FromOldPrimary => counts.from_old_primary += 1,
            Judged::Violated(v) => violations.push(v),
        }
        if let (Some(server), Some((process, received_at_us, seen))) = (old_side, answer) {
            counts.old_primary_answers.push(OldPrimaryAnswer { process, received_at_us, server, seen });
        }
    };
    for call in &facts.records.heartbeats {
        if let (Some(Ok(resp)), Some(at_us)) = (&call.answer, call.received_at_us) {
            let who = call.process.to_string();
            let judged =
                states.judge("heartbeat", who, resp.store_revision, at_us, |g| heartbeat_view(g, &call.request, resp));
            tally(judged, Some((call.process, at_us, call.seen_ok().is_some())));
        }
    }
    for call in &facts.records.routings {
        if let (Some(Ok(resp)), Some(at_us)) = (&call.answer, call.received_at_us) {
            let who = call.process.to_string();
            let judged = states.judge("routing", who, resp.store_revision, at_us, |g| {
                // `lostVersion` echoes the producer's report; it must name a version above the
                // state's (a version the store does not have).
                let lost_version = resp.lost_version.filter(|&v| v > g.metadata_version);
                let expected = RoutingResponse { lost_version, ..spec_routing_view(g, resp.store_revision) };
                if &expected == resp {
                    Ok(())
                } else {
                    Err(format!("expected {expected:?}, got {resp:?}"))
                }
            });
            tally(judged, Some((call.process, at_us, call.seen_ok().is_some())));
        }
    }
    for call in &facts.records.admins {
        // A delete answers revision 0: nothing stored to compare with.
        if let (Some(Ok(resp)), Some(at_us)) = (&call.answer, call.received_at_us) {
            if resp.store_revision > 0 {
                let judged = states.judge("admin", "operator".into(), resp.store_revision, at_us, |g| {
                    if g.metadata_version == resp.metadata_version {
                        Ok(())
                    } else {
                        Err(format!(
                            "metadata version {} but the state has {}",
                            resp.metadata_version, g.metadata_version
                        ))
                    }
                });
                tally(judged, None);
            }
        }
    }
    (violations, counts)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn a_response_from_a_stored_state_is_clean() {
        let mut w = World::new();
        let a = w.consumer(1);
        let g = w.store_group_with_member(1_000, "consumer-1", &[0, 1]);
        w.heartbeat_answer(a, 1_500_000, spec_member_view(&g, "consumer-1", HeartbeatStatus::Ok, 1));
        assert_eq!(check(&w.facts()).0, vec![]);
    }

    #[test]
    fn a_response_received_before_its_state_was_stored_is_not_recorded() {
        let mut w = World::new();
        let a = w.consumer(1);
        let g = w.store_group_with_member(2_000, "consumer-1", &[0]);
        w.heartbeat_answer(a, 1_500_000, spec_member_view(&g, "consumer-1", HeartbeatStatus::Ok, 1));
        assert!(matches!(check(&w.facts()).0[..], [Violation::NotRecorded { revision: 1, at_us: 1_500_000, .. }]));
    }

    #[test]
    fn a_response_that_differs_from_the_stored_state_is_inconsistent() {
        let mut w = World::new();
        let a = w.consumer(1);
        let g = w.store_group_with_member(1_000, "consumer-1", &[0]);
        let mut resp = spec_member_view(&g, "consumer-1", HeartbeatStatus::Ok, 1);
        resp.assigned.push(3);
        w.heartbeat_answer(a, 1_500_000, resp);
        assert!(matches!(check(&w.facts()).0[..], [Violation::Inconsistent { revision: 1, .. }]));
    }

    /// An answer only an old primary's state explains is counted while that old primary may still
    /// be answering (its damage window: the switch + a lease + 2%, lease 8 s here), a violation
    /// after (the excuse had no end).
    #[test]
    fn an_answer_from_an_old_primarys_state_is_excused_only_within_its_damage_window() {
        for (at_us, excused) in [(2_600_000, true), (3_000_000 + 8_160_000, true), (3_000_000 + 8_160_001, false)] {
            let mut w = World::new();
            let a = w.consumer(1);
            let g = w.store_group_with_member(1_000, "consumer-1", &[0]);
            w.split_brain(1, 1_500_000, 3_000_000);
            let mut on_old_side = g.clone();
            on_old_side.assignment_epoch += 1;
            w.store(2_000, &on_old_side, 2);
            let event = w.history.pop().expect("the old primary's write");
            w.split_brains[0].history.push(event);
            let mut on_primary = g.clone();
            on_primary.assignment_epoch += 2;
            w.store(2_500, &on_primary, 2);
            w.heartbeat_answer(a, at_us, spec_member_view(&on_old_side, "consumer-1", HeartbeatStatus::Ok, 2));
            let (violations, _) = check(&w.facts());
            assert_eq!(violations.is_empty(), excused, "answer at {at_us} us: {violations:?}");
        }
    }

    #[test]
    fn ok_is_only_recorded_when_the_state_itself_gives_ok() {
        let mut w = World::new();
        let a = w.consumer(1);
        let mut g = w.group_with_member("consumer-1", &[0]);
        g.target.insert(1, "consumer-1".into()); // pending shard: the state gives REVOKE_PENDING
        w.store(1_000, &g, 1);
        w.heartbeat_answer(a, 1_500_000, spec_member_view(&g, "consumer-1", HeartbeatStatus::Ok, 1));
        assert!(
            matches!(&check(&w.facts()).0[..], [Violation::Inconsistent { detail, .. }] if detail.contains("RevokePending"))
        );
    }

    #[test]
    fn a_response_from_an_acknowledged_but_dropped_write_is_counted_not_failed() {
        let mut w = World::new();
        let a = w.consumer(1);
        let g = w.store_group_with_member(1_000, "consumer-1", &[0]);
        let mut next = g.clone();
        next.metadata_version = 2;
        w.history.push(rsc::store::memory::HistoryEvent {
            at_ms: 1_200,
            kind: HistoryKind::WriteDropped { group: w.group.clone(), revision: 2 },
            metadata_after: vec![],
        });
        w.heartbeat_answer(a, 1_500_000, spec_member_view(&next, "consumer-1", HeartbeatStatus::Ok, 2));
        let (violations, counts) = check(&w.facts());
        assert_eq!((violations, counts.from_dropped_writes), (vec![], 1));
    }
}
