//! Invariant 7, **messages**: every acknowledged XADD is delivered to some consumer at least once,
//! and no entry is being processed by two consumers at the same instant.
//!
//! - *Acknowledged* means the producer received the XADD's success (the Redis node's add log,
//!   completed by the producer's connection). *Delivered* means some executed XREADGROUP or
//!   XAUTOCLAIM returned the entry. Consumers read each stream in id order, so an acknowledged
//!   entry that was never delivered while a *later* entry of its stream was is lost (skipped). An
//!   undelivered tail of a stream is backlog the consumers had not reached when the run ended (a
//!   workload faster than its consumers): it is measured, not failed — whether the shard was still
//!   being read at the end is the liveness checker's question.
//! - *Stranded*: an acknowledged entry on a shard that, at some instant after it was acknowledged,
//!   lay at or beyond the group's recorded shard count (an `add-shards` the store lost, judged from
//!   the store's own history, never from the coordinator's answers). No consumer is assigned such a
//!   shard until the count is raised again, so the coordinator must heal it and consumers must
//!   then read it: a stranded entry undelivered at the end is a violation
//!   (`acknowledged-stranded`) unless its shard was healed *and* read again since (with the entry
//!   in its undelivered tail: consumers are back on the shard and behind, which is backlog). The
//!   plan's faults heal before the end, so there is time. Healing needs evidence a coordinator can
//!   check: a producer holding an answer with the larger count and its proof. When no process
//!   held one that a key the group recorded since could verify, and was still running when the
//!   count dropped (the producers that knew restarted, or the group was recreated under a new key
//!   nobody knew the lost one of), nothing could heal it: such entries are counted
//!   (`stranded_unprovable`), not failed — no protocol recovers a number nobody can prove.
//! - *Delivered* is not enough: an entry some read returned at Redis must also reach a consumer
//!   that processes it. A reply can be lost, or a read can run at Redis after its caller gave up;
//!   the entry then sits pending to that consumer name until an owner sweeps it up (consumers
//!   re-claim and re-read pending entries every `pending_sweep_interval_ms`, 30 s). An entry
//!   first delivered more than [`SWEEP_GRACE_US`] before the end and never processed is a
//!   violation; a later one is counted (`delivered_never_processed`), as the run may just have
//!   ended before its sweep.
//! - *Processing* is recorded by the simulated application: from the moment it starts working on
//!   a delivered entry until it finishes or abandons it (lease lost), or its process dies. Two
//!   processes' processing intervals of one entry must not intersect. A process that was paused
//!   cannot act on its lease end until it runs again (the classic GC-pause problem no lease
//!   protocol can solve without fencing at the data): an overlap during which, at every instant,
//!   one side was paused (or had resumed less than [`RESUME_GRACE_US`] before) is counted as a
//!   measurement, not a violation — any part of it outside paused time is a violation. Overlaps
//!   that start within one assignment lease of a silent loss of writes are counted too (see the
//!   split checker).
//! - *Split brain*: a split brain's old primary serves its own copy of the streams, and its writes
//!   are discarded when it goes. An XADD it acknowledged is lost: counted
//!   (`split_brain_lost_publishes`), never delivered (no protocol keeps it without
//!   `min-replicas-to-write`). Delivery and backlog are judged on the primary's reads and adds
//!   alone (an entry the old primary delivered is still pending or new at the primary, which must
//!   deliver it). The old primary assigns ids from the same clock and counter state as the
//!   primary, so one id can name two entries: an entry is identified by the node that delivered
//!   it to the processing process when the old primary added it itself. An overlap of processing
//!   attributed to a split brain (one side's entry was delivered by an old primary, or its process
//!   was answered from an old primary's state, and the overlap starts between the failover and
//!   the old primary's switch plus one lease) is counted (`split_brain_overlaps`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use rsc::core::proof::{Fact, ViewKey, ViewProof};
use rsc::store::EntryId;

use super::recorded::OldPrimaryAnswer;
use super::Facts;
use crate::plan::NodeRef;
use crate::records::{AddEvent, ProcessId, Processing, ReadEvent, Us};

/// A violation of invariant 7 (messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Invariant 7: acknowledged XADDs on a stream were never delivered although later entries of
    /// the stream were (`count` of them; the first is named).
    NotDelivered { stream: String, first_id: EntryId, count: usize, at_us: Us },
    /// Invariant 7: acknowledged entries of a stream delivered at Redis (first at `at_us`, more
    /// than [`SWEEP_GRACE_US`] before the end) that no consumer ever processed.
    DeliveredNeverProcessed { stream: String, first_id: EntryId, count: usize, at_us: Us },
    /// Invariant 7: acknowledged entries of a stream whose shard lay beyond the recorded shard
    /// count after they were acknowledged (a lost `add-shards`) were never delivered (`count` of
    /// them; the first is named, acknowledged at `at_us`).
    Stranded { stream: String, first_id: EntryId, count: usize, at_us: Us },
    /// Invariant 7: two processes processed one entry at the same time.
    ConcurrentProcessing { stream: String, id: EntryId, first: ProcessId, second: ProcessId, at_us: Us, overlap_us: Us },
}

impl super::Violation for Violation {
    fn kind(&self) -> &'static str {
        match self {
            Violation::NotDelivered { .. } => "acknowledged-not-delivered",
            Violation::DeliveredNeverProcessed { .. } => "delivered-never-processed",
            Violation::Stranded { .. } => "acknowledged-stranded",
            Violation::ConcurrentProcessing { .. } => "concurrent-processing",
        }
    }

    fn at_us(&self) -> Us {
        match self {
            Violation::NotDelivered { at_us, .. }
            | Violation::DeliveredNeverProcessed { at_us, .. }
            | Violation::Stranded { at_us, .. }
            | Violation::ConcurrentProcessing { at_us, .. } => *at_us,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::NotDelivered { stream, first_id, count, .. } => {
                write!(f, "{count} acknowledged entries of {stream} were skipped (never delivered, unlike later ones; first: {first_id})")
            }
            Violation::DeliveredNeverProcessed { stream, first_id, count, .. } => {
                write!(f, "{count} acknowledged entries of {stream} were delivered at Redis but never processed (first: {first_id})")
            }
            Violation::Stranded { stream, first_id, count, .. } => {
                write!(f, "{count} acknowledged entries of {stream} were never delivered; their shard lay beyond the recorded shard count after they were acknowledged (first: {first_id})")
            }
            Violation::ConcurrentProcessing { stream, id, first, second, overlap_us, .. } => {
                write!(f, "{stream} {id} processed by {first} and {second} at once for {overlap_us} us")
            }
        }
    }
}

/// What the message checker measured besides violations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MessageCounts {
    /// Processing overlaps attributed to pauses.
    pub paused_overlaps: usize,
    /// Processing overlaps that started within a lease of a silent loss of writes.
    pub silent_loss_overlaps: usize,
    /// Acknowledged entries in undelivered stream tails at the end (backlog).
    pub backlog: usize,
    /// Acknowledged, undelivered, stranded entries (each is also in a violation).
    pub stranded: usize,
    /// Stranded entries no process could prove the lost count of (measured, not failed).
    pub stranded_unprovable: usize,
    /// Acknowledged entries first delivered at Redis within [`SWEEP_GRACE_US`] of the end that no
    /// consumer processed (older ones are violations).
    pub delivered_never_processed: usize,
    /// Processing overlaps attributed to a split brain.
    pub split_brain_overlaps: usize,
    /// XADDs a split brain's old primary acknowledged (lost with it).
    pub split_brain_lost_publishes: usize,
}

/// Checks invariant 7. `answers` are the heartbeat answers derived from an old primary's states.
pub fn check(facts: &Facts<'_>, answers: &[OldPrimaryAnswer]) -> (Vec<Violation>, MessageCounts) {
    let (mut violations, backlog, (stranded, stranded_unprovable)) = not_delivered(facts);
    let overlaps = concurrent_processing(facts, answers);
    violations.extend(overlaps.violations);
    let (never_processed, delivered_never_processed) = delivered_never_processed(facts);
    violations.extend(never_processed);
    let split_brain_lost_publishes = facts
        .records
        .adds
        .iter()
        .filter(|add| add.server != NodeRef::REDIS && add.acknowledged_at_us.is_some())
        .count();
    let counts = MessageCounts {
        paused_overlaps: overlaps.paused,
        silent_loss_overlaps: overlaps.silent_loss,
        backlog,
        stranded,
        stranded_unprovable,
        delivered_never_processed,
        split_brain_overlaps: overlaps.split_brain,
        split_brain_lost_publishes,
    };
    (violations, counts)
}

/// The primary's reads (a split brain's old primary delivers from a copy that is discarded).
fn primary_reads<'f>(facts: &'f Facts<'_>) -> impl Iterator<Item = &'f ReadEvent> + Clone {
    facts.records.reads.iter().filter(|r| r.server == NodeRef::REDIS)
}

/// The XADDs the primary acknowledged (an old primary's are lost with it).
fn primary_adds<'f>(facts: &'f Facts<'_>) -> impl Iterator<Item = &'f AddEvent> {
    facts.records.adds.iter().filter(|add| add.server == NodeRef::REDIS && add.acknowledged_at_us.is_some())
}

/// How long before the end of a run a delivery must have happened to be judged: one consumer
/// pending sweep (30 s) plus time to process.
pub const SWEEP_GRACE_US: Us = 45_000_000;

/// Acknowledged entries delivered at Redis and never processed: violations for those first
/// delivered more than [`SWEEP_GRACE_US`] before the end (per stream), and the count of the rest.
/// An entry is the primary's entry: one a split brain's old primary added under the same id is
/// another entry (`Deliveries::of`).
fn delivered_never_processed(facts: &Facts<'_>) -> (Vec<Violation>, usize) {
    let shard_count = facts.final_state().map_or(u32::MAX, |g| g.shard_count);
    let mut first_served: BTreeMap<(&str, EntryId), Us> = BTreeMap::new();
    for read in primary_reads(facts) {
        for id in &read.ids {
            let at = first_served.entry((read.stream.as_str(), *id)).or_insert(read.served_at_us);
            *at = (*at).min(read.served_at_us);
        }
    }
    // Only processings of the primary's entry count: a split brain's old primary may have added
    // another entry under the same id, and processing that one is not processing this one. And
    // only completed ones: a processing cancelled because its shard was lost (or whose process
    // died) did not process the entry, whose next owner must (an outside review: a cancelled
    // processing used to count, so an entry the next owner never completed passed).
    let deliveries = Deliveries::new(facts);
    let processed: BTreeSet<(&str, EntryId)> = facts
        .records
        .processing
        .iter()
        .filter(|p| p.completed && deliveries.of(p).1 == NodeRef::REDIS)
        .map(|p| (p.stream.as_str(), p.id))
        .collect();
    let cutoff_us = facts.end_us.saturating_sub(SWEEP_GRACE_US);
    let mut late = 0;
    let mut judged: BTreeMap<&str, (EntryId, usize, Us)> = BTreeMap::new();
    for add in primary_adds(facts) {
        let key = (add.stream.as_str(), add.id);
        if facts.shard_of(&add.stream).is_some_and(|s| s >= shard_count) || processed.contains(&key) {
            continue;
        }
        let Some(&served_at_us) = first_served.get(&key) else { continue };
        if served_at_us >= cutoff_us {
            late += 1;
            continue;
        }
        let entry = judged.entry(key.0).or_insert((add.id, 0, served_at_us));
        entry.1 += 1;
    }
    let violations = judged
        .into_iter()
        .map(|(stream, (first_id, count, at_us))| Violation::DeliveredNeverProcessed {
            stream: stream.to_string(),
            first_id,
            count,
            at_us,
        })
        .collect();
    (violations, late)
}

fn not_delivered(facts: &Facts<'_>) -> (Vec<Violation>, usize, (usize, usize)) {
    let shard_counts = RecordedShardCounts::new(facts);
    let delivered: BTreeSet<(&str, EntryId)> =
        primary_reads(facts).flat_map(|r| r.ids.iter().map(move |id| (r.stream.as_str(), *id))).collect();
    let mut last_delivered: BTreeMap<&str, EntryId> = BTreeMap::new();
    for (stream, id) in &delivered {
        let last = last_delivered.entry(stream).or_insert(*id);
        *last = (*last).max(*id);
    }
    let mut missing: BTreeMap<&str, (EntryId, usize, Us)> = BTreeMap::new();
    let mut stranded: BTreeMap<&str, (EntryId, usize, Us)> = BTreeMap::new();
    let mut backlog = 0;
    let mut unprovable = 0;
    for add in primary_adds(facts) {
        let Some(acknowledged_at_us) = add.acknowledged_at_us else { continue };
        let stream = add.stream.as_str();
        if delivered.contains(&(stream, add.id)) {
            continue;
        }
        let shard = facts.shard_of(stream);
        let beyond = shard.is_some_and(|s| s >= shard_counts.lowest_since(acknowledged_at_us));
        // A healed shard that consumers read again after the heal, with this entry in its
        // undelivered tail, is backlog: the coordinator and the consumers did their part and the
        // workload is faster than the consumers (measured below). Never healed, or never read
        // since: stranded.
        let read_since_heal = shard.and_then(|s| shard_counts.healed_at(s)).is_some_and(|healed_us| {
            primary_reads(facts).any(|r| r.stream == stream && r.served_at_us >= healed_us && !r.ids.is_empty())
        });
        let behind_a_delivery = last_delivered.get(stream).is_some_and(|last| *last > add.id);
        let excused_as_backlog = read_since_heal && !behind_a_delivery;
        let provable = || shard.is_some_and(|s| shard_counts.provable(facts, s, acknowledged_at_us));
        if beyond && !excused_as_backlog && !provable() {
            unprovable += 1;
        } else if beyond && !excused_as_backlog {
            let entry = stranded.entry(stream).or_insert((add.id, 0, acknowledged_at_us));
            entry.1 += 1;
        } else if last_delivered.get(stream).is_some_and(|last| *last > add.id) {
            let entry = missing.entry(stream).or_insert((add.id, 0, acknowledged_at_us));
            entry.1 += 1;
        } else {
            backlog += 1;
        }
    }
    let stranded_count = stranded.values().map(|(_, count, _)| count).sum();
    let violations = missing
        .into_iter()
        .map(|(stream, (first_id, count, at_us))| Violation::NotDelivered {
            stream: stream.to_string(),
            first_id,
            count,
            at_us,
        })
        .chain(stranded.into_iter().map(|(stream, (first_id, count, at_us))| Violation::Stranded {
            stream: stream.to_string(),
            first_id,
            count,
            at_us,
        }))
        .collect();
    (violations, backlog, (stranded_count, unprovable))
}

/// The group's recorded shard count over time, from the store's history (ground truth). A key
/// absent or unreadable says nothing about the count (the liveness checker judges availability).
struct RecordedShardCounts {
    /// (µs, shard count from then on), in time order.
    changes: Vec<(Us, u32)>,
    /// (µs, the view key recorded then), one per record, in time order.
    keys: Vec<(Us, Option<ViewKey>)>,
    /// `lowest_from[i]`: the lowest count in `changes[i..]` (`u32::MAX` past the end).
    lowest_from: Vec<u32>,
}

impl RecordedShardCounts {
    fn new(facts: &Facts<'_>) -> Self {
        let mut changes = Vec::new();
        let mut keys = Vec::new();
        for event in facts.history {
            for (group, record) in &event.metadata_after {
                if group != facts.group {
                    continue;
                }
                let recorded = record
                    .as_ref()
                    .and_then(|r| serde_json::from_str::<rsc::core::model::GroupMetadata>(&r.aggregate).ok());
                if let Some(g) = recorded {
                    changes.push((event.at_ms * 1_000, g.shard_count));
                    keys.push((event.at_ms * 1_000, g.view_key));
                }
            }
        }
        let mut lowest_from = vec![u32::MAX; changes.len() + 1];
        for i in (0..changes.len()).rev() {
            lowest_from[i] = lowest_from[i + 1].min(changes[i].1);
        }
        Self { changes, keys, lowest_from }
    }

    /// When `shard` last began to lie beyond the recorded count for good (to the end), not before
    /// `at_us`; `None` when the count at the end covers it.
    fn beyond_for_good_from(&self, shard: u32, at_us: Us) -> Option<Us> {
        let (_, last) = self.changes.last()?;
        if *last > shard {
            return None;
        }
        let covered = self.changes.iter().rposition(|(_, count)| *count > shard);
        let from = covered.map_or(self.changes[0].0, |i| self.changes[i + 1].0);
        Some(from.max(at_us))
    }

    /// Whether a lost count covering `shard` (beyond the record after `acknowledged_us`) was
    /// provable to the group as it ended, once the count was lost for good (the last drop; a
    /// count healed by the end was proven): the last record's key (none: no count is
    /// provable) verifies a proof of a count above `shard` that either a coordinator was sent and
    /// answered after the loss, or a process was told and kept running for a routing refresh and
    /// a request timeout after the loss (time to report it). Judged from the calls as the
    /// transports saw them and the store's records, with the proof's own HMAC.
    fn provable(&self, facts: &Facts<'_>, shard: u32, acknowledged_us: Us) -> bool {
        let Some(beyond_us) = self.beyond_for_good_from(shard, acknowledged_us) else { return true };
        let Some((_, last_key)) = self.keys.last() else { return true };
        let verifies = |count: u32, proof: Option<&ViewProof>| {
            count > shard
                && match last_key {
                    // A record without a view key credits no shard count (DESIGN §8, "Keyless
                    // records heal no shard count"): only the operator's add-shards restores it.
                    None => false,
                    Some(key) => {
                        proof.is_some_and(|p| key.verifies(facts.group, Fact::ShardCount, u64::from(count), p))
                    }
                }
        };
        let chance_us =
            (facts.plan.group.routing_refresh_interval_ms + facts.plan.tuning.http_timeout_ms).saturating_mul(1_000);
        let running_at = |process, at_us: Us| {
            facts.records.lifecycles.iter().any(|l| l.process == process && l.stopped_at_us.is_none_or(|s| s > at_us))
        };
        facts.records.routings.iter().any(|call| {
            let told = call.seen_ok().is_some_and(|(answer, _)| {
                verifies(answer.shard_count, answer.shard_count_proof.as_ref())
                    && running_at(call.process, beyond_us.saturating_add(chance_us))
            });
            let reported = call.sent_at_us >= beyond_us
                && matches!(call.answer, Some(Ok(_)))
                && verifies(call.request.known_shard_count, call.request.known_shard_count_proof.as_ref());
            told || reported
        })
    }

    /// When the recorded count last rose above `shard` and stayed there to the end (`None`: it is
    /// at or below `shard` at the end, or was never recorded).
    fn healed_at(&self, shard: u32) -> Option<Us> {
        let (_, last) = self.changes.last()?;
        if *last <= shard {
            return None;
        }
        let below = self.changes.iter().rposition(|(_, count)| *count <= shard);
        Some(below.map_or(self.changes[0].0, |i| self.changes[i + 1].0))
    }

    /// The lowest recorded shard count from `at_us` (the count in force then) to the end. A shard
    /// at or above it lay beyond the recorded count at some instant after `at_us`.
    fn lowest_since(&self, at_us: Us) -> u32 {
        let first_later = self.changes.partition_point(|(t, _)| *t <= at_us);
        let in_force = first_later.checked_sub(1).map_or(u32::MAX, |i| self.changes[i].1);
        in_force.min(self.lowest_from[first_later])
    }
}

/// How long after a pause ends a process may still be finishing an entry before it notices its
/// lease ended (its timers fire at the resume instant; the cancellation then needs a scheduling
/// step or two). Overlaps outside paused time plus this grace are violations.
const RESUME_GRACE_US: Us = 1_000;

/// The processing overlaps: violations, and the ones measured by cause.
struct Overlaps {
    violations: Vec<Violation>,
    paused: usize,
    silent_loss: usize,
    split_brain: usize,
}

/// One entry delivered to one process: (process, stream, id).
type DeliveredTo<'f> = (ProcessId, &'f str, EntryId);

/// The Redis node whose read delivered each (process, entry) and when: the processing of an entry
/// was delivered by the latest such read served at or before it started.
struct Deliveries<'f> {
    by_entry: BTreeMap<DeliveredTo<'f>, Vec<(Us, NodeRef)>>,
    /// Entries an old primary added itself (its own timeline; the id may repeat at the primary).
    old_adds: BTreeSet<(NodeRef, &'f str, EntryId)>,
}

impl<'f> Deliveries<'f> {
    fn new(facts: &'f Facts<'_>) -> Self {
        let mut by_entry: BTreeMap<DeliveredTo<'f>, Vec<(Us, NodeRef)>> = BTreeMap::new();
        for read in &facts.records.reads {
            for id in &read.ids {
                by_entry
                    .entry((read.process, read.stream.as_str(), *id))
                    .or_default()
                    .push((read.served_at_us, read.server));
            }
        }
        for list in by_entry.values_mut() {
            list.sort_unstable();
        }
        let old_adds = facts
            .records
            .adds
            .iter()
            .filter(|add| add.server != NodeRef::REDIS)
            .map(|add| (add.server, add.stream.as_str(), add.id))
            .collect();
        Self { by_entry, old_adds }
    }

    /// The node that delivered `p`'s entry to its process, and the entry's identity: the old
    /// primary when that old primary added the entry itself, else the primary.
    fn of(&self, p: &Processing) -> (NodeRef, NodeRef) {
        let server = self
            .by_entry
            .get(&(p.process, p.stream.as_str(), p.id))
            .and_then(|list| list.iter().rev().find(|(served, _)| *served <= p.start_us))
            .map_or(NodeRef::REDIS, |(_, server)| *server);
        let lineage = if self.old_adds.contains(&(server, p.stream.as_str(), p.id)) { server } else { NodeRef::REDIS };
        (server, lineage)
    }
}

/// The split brain an overlap starting at `start_us` is attributed to: one whose old primary
/// delivered either side's entry or answered either side's process from its own state (before
/// the overlap), with the overlap between its failover and the end of its damage window.
fn split_brain_of_overlap(
    facts: &Facts<'_>,
    answers: &[OldPrimaryAnswer],
    sides: [(ProcessId, NodeRef); 2],
    start_us: Us,
) -> bool {
    let lease_us = facts.assignment_lease_us();
    let involved = sides.iter().flat_map(|&(process, server)| {
        let delivered = (server != NodeRef::REDIS).then_some(server);
        let answered = answers
            .iter()
            .filter(move |a| a.seen && a.process == process && a.received_at_us <= start_us)
            .map(|a| a.server);
        delivered.into_iter().chain(answered)
    });
    involved
        .filter_map(|server| facts.split_brain_of(server))
        .any(|split| split.fork_us <= start_us && start_us <= split.damage_until_us(lease_us))
}

fn concurrent_processing(facts: &Facts<'_>, answers: &[OldPrimaryAnswer]) -> Overlaps {
    // Per entry: (start, end, process, delivering node) of every processing of it.
    type Intervals = Vec<(Us, Us, ProcessId, NodeRef)>;
    let deliveries = Deliveries::new(facts);
    let mut by_entry: BTreeMap<(&str, EntryId, NodeRef), Intervals> = BTreeMap::new();
    for p in &facts.records.processing {
        let end = p.end_us.or_else(|| facts.stopped_at(p.process)).unwrap_or(facts.end_us);
        let (server, lineage) = deliveries.of(p);
        by_entry.entry((p.stream.as_str(), p.id, lineage)).or_default().push((p.start_us, end, p.process, server));
    }
    let mut violations = Vec::new();
    let (mut paused, mut silent_loss, mut split_brain) = (0, 0, 0);
    for ((stream, id, _), mut intervals) in by_entry {
        intervals.sort_unstable();
        for (i, &(_, end_a, a, server_a)) in intervals.iter().enumerate() {
            for &(start_b, end_b, b, server_b) in intervals[i + 1..].iter().take_while(|(s, ..)| *s < end_a) {
                if a == b {
                    continue;
                }
                let overlap = (start_b, end_a.min(end_b));
                if overlap.1 <= overlap.0 {
                    // A processing that ended as it started (cancelled before any work) shares no
                    // instant with the other.
                    continue;
                }
                if facts.unpaused_us(&[a, b], overlap, RESUME_GRACE_US) == 0 {
                    // Every instant of the overlap, one side was paused (or had just resumed and
                    // not yet run its lease check): no lease protocol can stop that; fencing can.
                    paused += 1;
                    continue;
                }
                if split_brain_of_overlap(facts, answers, [(a, server_a), (b, server_b)], start_b) {
                    split_brain += 1;
                    continue;
                }
                if facts.near_silent_loss(start_b) {
                    silent_loss += 1;
                    continue;
                }
                let overlap_us = end_a.min(end_b) - start_b;
                let stream = stream.to_string();
                violations.push(Violation::ConcurrentProcessing {
                    stream,
                    id,
                    first: a,
                    second: b,
                    at_us: start_b,
                    overlap_us,
                });
            }
        }
    }
    Overlaps { violations, paused, silent_loss, split_brain }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn a_skipped_acknowledged_entry_is_lost_and_an_unread_tail_is_backlog() {
        let mut w = World::new();
        let (p, a) = (w.producer(1), w.consumer(1));
        let e1 = w.add(p, 0, 1_000);
        let e2 = w.add(p, 0, 2_000);
        let e3 = w.add(p, 0, 3_000);
        w.add_unacknowledged(p, 0, 3_500);
        w.add(p, 0, 4_000);
        w.read_ids(a, 0, 5_000, &[e1, e3]);
        w.process_entry(a, 0, e1, 6_000, Some(7_000));
        w.process_entry(a, 0, e3, 6_000, Some(7_000));
        let (violations, counts) = check(&w.facts(), &[]);
        assert!(matches!(&violations[..], [Violation::NotDelivered { first_id, count: 1, .. }] if *first_id == e2));
        assert_eq!(counts.backlog, 1, "the entry after the last delivered one is backlog");
    }

    /// The producer `p` is told 4 shards, with the proof `key` gives of the count.
    fn told_four_shards(w: &mut World, p: ProcessId, key: ViewKey, at_us: Us) {
        w.routing(p, at_us, at_us + 1_000, 10_000, 4);
        let proof = key.prove(&w.group, Fact::ShardCount, 4);
        if let Some(Ok(answer)) = w.records.routings.last_mut().and_then(|call| call.answer.as_mut()) {
            answer.shard_count_proof = Some(proof);
        }
    }

    /// Shard 3 exists (4 shards), then a rollback takes the count back to 2 and, later, a heal
    /// raises it to 4 again. An undelivered entry on shard 3 is stranded whatever its place in the
    /// stream and whether or not the count was healed; one on shard 1 is backlog as usual.
    #[test]
    fn an_undelivered_entry_whose_shard_left_the_recorded_count_after_its_ack_is_stranded() {
        let mut w = World::new();
        let (p, a) = (w.producer(1), w.consumer(1));
        let mut g = w.group_with_member("consumer-1", &[0, 1]);
        let key = ViewKey::from_bytes([7; 32]);
        g.view_key = Some(key);
        g.shard_count = 4;
        w.store(1_000, &g, 1);
        told_four_shards(&mut w, p, key, 1_500_000);
        let on_lost_shard = w.add(p, 3, 2_000_000);
        w.add(p, 1, 2_000_000);
        g.shard_count = 2;
        w.store(3_000, &g, 1); // the add-shards is lost
        let (violations, counts) = check(&w.facts(), &[]);
        assert!(
            matches!(&violations[..], [Violation::Stranded { first_id, count: 1, .. }] if *first_id == on_lost_shard),
            "{violations:?}"
        );
        assert_eq!((counts.stranded, counts.backlog), (1, 1));

        g.shard_count = 4;
        w.store(4_000, &g, 2); // healed, but nobody read shard 3: still stranded
        assert_eq!(check(&w.facts(), &[]).1.stranded, 1);
        w.read_ids(a, 3, 5_000_000, &[on_lost_shard]);
        w.process_entry(a, 3, on_lost_shard, 5_000_000, Some(5_001_000));
        let (violations, counts) = check(&w.facts(), &[]);
        assert_eq!((violations, counts.stranded), (vec![], 0));
    }

    /// Nothing can heal a count nobody can prove: when the only producer that was told it stops
    /// before it could report it, or the group's record is recreated under a key that proves
    /// nothing of the lost one, the stranded entry is measured, not failed. A producer still
    /// running a refresh later could have reported it: a violation.
    #[test]
    fn a_stranded_entry_whose_lost_count_nobody_could_prove_is_measured_not_failed() {
        let key = ViewKey::from_bytes([7; 32]);
        let run = |stop_us: Option<Us>, key_after: ViewKey| {
            let mut w = World::new();
            let p = w.producer(1);
            let mut g = w.group_with_member("consumer-1", &[0, 1]);
            g.view_key = Some(key);
            g.shard_count = 4;
            w.store(1_000, &g, 1);
            told_four_shards(&mut w, p, key, 1_500_000);
            w.add(p, 3, 2_000_000);
            g.shard_count = 2;
            g.view_key = Some(key_after);
            w.store(3_000, &g, 1); // the add-shards is lost
            if let Some(at_us) = stop_us {
                w.kill(p, at_us);
            }
            let (violations, counts) = check(&w.facts(), &[]);
            (violations.len(), counts.stranded, counts.stranded_unprovable)
        };
        assert_eq!(run(None, key), (1, 1, 0), "provable: a violation");
        assert_eq!(run(Some(3_100_000), key), (0, 0, 1), "its only witness stopped at once");
        assert_eq!(run(None, ViewKey::from_bytes([8; 32])), (0, 0, 1), "recreated under another key");
        let plan = World::new().plan;
        let refresh_and_timeout_us = (plan.group.routing_refresh_interval_ms + plan.tuning.http_timeout_ms + 1) * 1_000;
        assert_eq!(run(Some(3_000_000 + refresh_and_timeout_us), key), (1, 1, 0), "it had time to report");
    }

    /// An entry acknowledged after the count went back up was never beyond it: backlog, not stranded.
    #[test]
    fn an_entry_acknowledged_after_the_heal_is_not_stranded() {
        let mut w = World::new();
        let p = w.producer(1);
        let mut g = w.group_with_member("consumer-1", &[0, 1]);
        g.shard_count = 2;
        w.store(1_000, &g, 1);
        g.shard_count = 4;
        w.store(2_000, &g, 2);
        w.add(p, 3, 3_000_000);
        let (violations, counts) = check(&w.facts(), &[]);
        assert_eq!((violations, counts.stranded, counts.backlog), (vec![], 0, 1));
    }

    #[test]
    fn an_entry_delivered_at_redis_but_never_processed_is_lost_unless_delivered_near_the_end() {
        let mut w = World::new();
        let (p, a) = (w.producer(1), w.consumer(1));
        let (e1, e2, e3) = (w.add(p, 0, 1_000), w.add(p, 0, 2_000), w.add(p, 0, 3_000));
        w.read_ids(a, 0, 5_000, &[e1, e2]); // e2's reply never reached the application
        w.process_entry(a, 0, e1, 6_000, Some(7_000));
        let near_end = w.facts().end_us - SWEEP_GRACE_US + 1;
        w.read_ids(a, 0, near_end, &[e3]);
        let (violations, counts) = check(&w.facts(), &[]);
        assert!(
            matches!(&violations[..], [Violation::DeliveredNeverProcessed { first_id, count: 1, .. }] if *first_id == e2),
            "{violations:?}"
        );
        assert_eq!(counts.delivered_never_processed, 1, "e3 may still be swept up: counted, not failed");
        // A later redelivery that is processed settles it.
        w.read_ids(a, 0, 20_000_000, &[e2]);
        w.process_entry(a, 0, e2, 20_000_000, Some(20_001_000));
        assert_eq!(check(&w.facts(), &[]).0, vec![]);
    }

    #[test]
    fn an_entry_whose_only_processing_was_cancelled_or_cut_by_a_death_was_never_processed() {
        let mut w = World::new();
        let (p, a, b) = (w.producer(1), w.consumer(1), w.consumer(2));
        let e1 = w.add(p, 0, 1_000);
        w.read_ids(a, 0, 5_000, &[e1]);
        w.cancel_entry(a, 0, e1, 6_000, 7_000); // a lost the shard mid-processing
        w.read_ids(b, 0, 9_000_000, &[e1]);
        w.process_entry(b, 0, e1, 9_000_000, None); // b died before finishing it
        let (violations, _) = check(&w.facts(), &[]);
        assert!(
            matches!(&violations[..], [Violation::DeliveredNeverProcessed { first_id, count: 1, .. }] if *first_id == e1),
            "{violations:?}"
        );
        // Its next owner completes it: processed.
        w.process_entry(b, 0, e1, 10_000_000, Some(10_001_000));
        assert_eq!(check(&w.facts(), &[]).0, vec![]);
    }

    #[test]
    fn overlapping_processing_by_two_processes_is_reported_unless_one_was_paused() {
        let mut w = World::new();
        let (a, b) = (w.consumer(1), w.consumer(2));
        let id = EntryId { ms: 1, seq: 0 };
        w.process_entry(a, 0, id, 1_000_000, Some(2_000_000));
        w.process_entry(b, 0, id, 2_000_000, Some(2_500_000)); // hand-over at the same instant: fine
        assert_eq!(check(&w.facts(), &[]).0, vec![]);
        w.process_entry(b, 0, id, 1_500_000, Some(1_600_000));
        let (violations, _) = check(&w.facts(), &[]);
        assert!(matches!(&violations[..], [Violation::ConcurrentProcessing { overlap_us: 100_000, .. }]));
        w.pause(a, 1_200_000, 1_900_000);
        let (violations, counts) = check(&w.facts(), &[]);
        assert_eq!((violations, counts.paused_overlaps), (vec![], 1));
    }

    #[test]
    fn a_processing_cancelled_as_it_started_overlaps_nothing() {
        let mut w = World::new();
        let (a, b) = (w.consumer(1), w.consumer(2));
        let id = EntryId { ms: 1, seq: 0 };
        w.process_entry(a, 0, id, 1_000_000, Some(2_000_000));
        // b starts inside a's processing and is cancelled at the same instant: no work, no overlap.
        w.process_entry(b, 0, id, 1_500_000, Some(1_500_000));
        assert_eq!(check(&w.facts(), &[]).0, vec![]);
        // One microsecond of work is an overlap.
        w.process_entry(b, 0, id, 1_600_000, Some(1_600_001));
        let (violations, _) = check(&w.facts(), &[]);
        assert!(matches!(&violations[..], [Violation::ConcurrentProcessing { overlap_us: 1, .. }]), "{violations:?}");
    }

    #[test]
    fn only_paused_time_excuses_an_overlap() {
        let mut w = World::new();
        let (a, b) = (w.consumer(1), w.consumer(2));
        let id = EntryId { ms: 1, seq: 0 };
        w.process_entry(a, 0, id, 1_000_000, Some(3_000_000));
        w.process_entry(b, 0, id, 1_500_000, Some(2_500_000));
        // a was paused for part of the overlap only: it kept processing 300 ms after it resumed.
        w.pause(a, 1_100_000, 2_200_000);
        let (violations, counts) = check(&w.facts(), &[]);
        assert!(matches!(&violations[..], [Violation::ConcurrentProcessing { .. }]), "{violations:?}");
        assert_eq!(counts.paused_overlaps, 0);
    }

    /// The old primary (alive 2 s..5 s) acknowledges an XADD whose id the primary also hands out
    /// to another entry: the old one is a lost publish, and the two entries are not one entry
    /// processed twice.
    #[test]
    fn an_old_primary_publish_is_lost_and_counted_and_its_id_names_another_entry() {
        let mut w = World::new();
        let (p, a, b) = (w.producer(1), w.consumer(1), w.consumer(2));
        let old = w.split_brain(1, 2_000_000, 5_000_000);
        let e1 = w.add(p, 0, 1_000_000);
        let e2 = w.add(p, 0, 3_000_000);
        w.add_on(old, p, 0, 3_000_000, e2);
        w.read_ids_on(old, a, 0, 3_100_000, &[e2]);
        w.process_entry(a, 0, e2, 3_200_000, Some(3_600_000));
        w.read_ids(b, 0, 3_300_000, &[e1, e2]);
        w.process_entry(b, 0, e1, 3_400_000, Some(3_500_000));
        w.process_entry(b, 0, e2, 3_400_000, Some(3_800_000));
        let (violations, counts) = check(&w.facts(), &[]);
        assert_eq!(violations, vec![]);
        assert_eq!((counts.split_brain_lost_publishes, counts.split_brain_overlaps), (1, 0));
    }

    /// An entry both primaries had (added before the fork) is processed by a consumer the old
    /// primary delivered it to and by one the primary delivered it to: measured while the old
    /// primary's damage window is open, a violation when neither delivery involves it.
    #[test]
    fn double_processing_through_an_old_primary_is_measured_and_without_it_a_violation() {
        for through_old_primary in [true, false] {
            let mut w = World::new();
            let (p, a, b) = (w.producer(1), w.consumer(1), w.consumer(2));
            let old = w.split_brain(1, 2_000_000, 5_000_000);
            let e1 = w.add(p, 0, 1_000_000);
            let server = if through_old_primary { old } else { NodeRef::REDIS };
            w.read_ids_on(server, a, 0, 3_100_000, &[e1]);
            w.process_entry(a, 0, e1, 3_200_000, Some(3_600_000));
            w.read_ids(b, 0, 3_300_000, &[e1]);
            w.process_entry(b, 0, e1, 3_400_000, Some(3_800_000));
            let (violations, counts) = check(&w.facts(), &[]);
            assert_eq!(violations.is_empty(), through_old_primary, "{violations:?}");
            assert_eq!(counts.split_brain_overlaps, usize::from(through_old_primary));
        }
    }
}
