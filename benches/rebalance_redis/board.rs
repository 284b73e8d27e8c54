//! [`Board`]: the consumers' own view of the rebalance, built from the events the consumer
//! library emits (an [`EventSink`]), and the all-OK check against the coordinator's record.
//!
//! Owns: per member, the last status it *applied* (status, assigned, pending, revoke, and the
//! shards it reads afterwards) and since when that view has been unchanged; counts of statuses
//! applied and of failed heartbeats. Never: decides anything for the consumers, or reads a rule of
//! the coordinator (the all-OK check compares two records, it does not recompute an assignment).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use rsc::client::events::{ClientEvent, EventSink};
use rsc::client::TransportError;
use rsc::core::model::{MemberId, ShardId, ShardOwner};
use rsc::core::protocol::HeartbeatStatus;
use rsc::service::GroupDescription;

/// A member's last applied status and the consumer's shards right after it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Applied {
    status: HeartbeatStatus,
    assigned: Vec<ShardId>,
    pending: Vec<ShardId>,
    revoke: Vec<ShardId>,
    reading: Vec<ShardId>,
}

#[derive(Debug)]
struct Entry {
    applied: Applied,
    /// Client clock ms of the first application of this exact view.
    since_ms: u64,
}

/// Counters since the last [`Board::take_counts`].
#[derive(Clone, Debug, Default)]
pub struct BoardCounts {
    pub statuses: BTreeMap<HeartbeatStatus, u64>,
    pub failures: u64,
    /// Failed heartbeats by kind: `timeout`, `unreachable`, or the error code.
    pub failure_kinds: BTreeMap<String, u64>,
    /// Every heartbeat sent and status applied, in client clock ms (for `REB_TIMELINE`).
    pub events: Vec<(u64, Seen)>,
}

/// What the timeline shows of one client event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    Sent,
    Applied(HeartbeatStatus),
}

impl BoardCounts {
    pub fn status(&self, status: HeartbeatStatus) -> u64 {
        self.statuses.get(&status).copied().unwrap_or(0)
    }
}

#[derive(Debug, Default)]
struct State {
    members: BTreeMap<MemberId, Entry>,
    counts: BoardCounts,
}

/// The event sink every consumer of one rig shares.
#[derive(Debug, Default)]
pub struct Board {
    state: Mutex<State>,
}

/// Every expected member applied `OK` with nothing pending or revoking, reads exactly what it was
/// assigned, and the assignments cover every shard once.
#[derive(Clone, Debug)]
pub struct Settled {
    /// When the last member reached its final view (client clock ms).
    pub at_ms: u64,
    /// When each member reached its final view.
    pub since_ms: Vec<u64>,
    pub assigned: BTreeMap<MemberId, BTreeSet<ShardId>>,
}

impl Board {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn take_counts(&self) -> BoardCounts {
        std::mem::take(&mut self.lock().counts)
    }

    /// `Some` once the consumers' own views say the rebalance is over.
    pub fn settled(&self, expected: &BTreeSet<MemberId>, shard_count: u32) -> Option<Settled> {
        let state = self.lock();
        let mut at_ms = 0;
        let mut since_ms = Vec::with_capacity(expected.len());
        let mut assigned = BTreeMap::new();
        let mut covered = 0usize;
        for member in expected {
            let entry = state.members.get(member)?;
            let a = &entry.applied;
            let done = a.status == HeartbeatStatus::Ok && a.pending.is_empty() && a.revoke.is_empty();
            if !done || a.reading != a.assigned {
                return None;
            }
            at_ms = at_ms.max(entry.since_ms);
            since_ms.push(entry.since_ms);
            covered += a.assigned.len();
            assigned.insert(member.clone(), a.assigned.iter().copied().collect::<BTreeSet<_>>());
        }
        let distinct: BTreeSet<ShardId> = assigned.values().flatten().copied().collect();
        let all = covered == distinct.len() && distinct.len() == shard_count as usize;
        all.then_some(Settled { at_ms, since_ms, assigned })
    }

    /// One line on what is missing, for a deadline message.
    pub fn explain(&self, expected: &BTreeSet<MemberId>) -> String {
        let state = self.lock();
        let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
        for member in expected {
            let key = match state.members.get(member) {
                None => "no status yet".to_string(),
                Some(e) => format!(
                    "{:?}{}{}",
                    e.applied.status,
                    if e.applied.pending.is_empty() { "" } else { " +pending" },
                    if e.applied.revoke.is_empty() { "" } else { " +revoke" }
                ),
            };
            *by_status.entry(key).or_default() += 1;
        }
        format!("members by last applied status: {by_status:?}; heartbeat failures {}", state.counts.failures)
    }
}

impl EventSink for Board {
    fn emit(&self, event: ClientEvent) {
        match event {
            ClientEvent::StatusApplied { at_ms, member, status, assigned, pending, revoke, reading, .. } => {
                let applied = Applied { status, assigned, pending, revoke, reading };
                let mut state = self.lock();
                *state.counts.statuses.entry(status).or_default() += 1;
                state.counts.events.push((at_ms, Seen::Applied(status)));
                match state.members.get_mut(&member) {
                    Some(entry) if entry.applied == applied => {}
                    Some(entry) => *entry = Entry { applied, since_ms: at_ms },
                    None => {
                        state.members.insert(member, Entry { applied, since_ms: at_ms });
                    }
                }
            }
            ClientEvent::HeartbeatSent { at_ms, .. } => {
                self.lock().counts.events.push((at_ms, Seen::Sent));
            }
            ClientEvent::HeartbeatFailed { error, .. } => {
                let mut state = self.lock();
                state.counts.failures += 1;
                let kind = match &error {
                    TransportError::Timeout => "timeout".to_string(),
                    TransportError::Unreachable(_) => "unreachable".to_string(),
                    TransportError::Api(api) => format!("{:?}", api.code),
                };
                *state.counts.failure_kinds.entry(kind).or_default() += 1;
            }
            ClientEvent::Left { member, .. } => {
                self.lock().members.remove(&member);
            }
            _ => {}
        }
    }
}

/// Whether the coordinator's record agrees with the consumers: exactly the expected members, no
/// correction round, and every shard `Owned` by its target, who is the member that applied it.
pub fn record_agrees(description: &GroupDescription, settled: &Settled) -> bool {
    let g = &description.metadata;
    let members: BTreeSet<&MemberId> = g.members.keys().collect();
    let expected: BTreeSet<&MemberId> = settled.assigned.keys().collect();
    if members != expected || g.correction.is_some() || g.current.len() != g.shard_count as usize {
        return false;
    }
    g.current.iter().all(|(shard, owner)| match owner {
        ShardOwner::Owned { member, .. } => {
            g.target.get(shard) == Some(member) && settled.assigned.get(member).is_some_and(|s| s.contains(shard))
        }
        _ => false,
    })
}
