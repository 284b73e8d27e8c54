//! Invariant 7, **messages**: every acknowledged XADD is delivered to some consumer at least once,
//! and no entry is being processed by two consumers at the same instant.
//!
//! - *Acknowledged* means the producer received the XADD's success (the Redis node's add log,
//!   completed by the producer's connection). *Delivered* means some executed XREADGROUP or
//!   XAUTOCLAIM returned the entry. Producers stop publishing `drain_ms` before the end, so every
//!   acknowledged entry has time to be delivered.
//! - *Processing* is recorded by the simulated application: from the moment it starts working on
//!   a delivered entry until it finishes or abandons it (lease lost), or its process dies. Two
//!   processes' processing intervals of one entry must not intersect. A process that was paused
//!   during its interval cannot act on its lease end until it runs again (the classic GC-pause
//!   problem no lease protocol can solve without fencing at the data); such overlaps are counted
//!   as a measurement, not a violation.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use rsc::store::EntryId;

use super::Facts;
use crate::records::{ProcessId, Us};

/// A violation of invariant 7 (messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Invariant 7: acknowledged XADDs on a stream were never delivered (`count` of them; the
    /// first is named).
    NotDelivered { stream: String, first_id: EntryId, count: usize, at_us: Us },
    /// Invariant 7: two processes processed one entry at the same time.
    ConcurrentProcessing { stream: String, id: EntryId, first: ProcessId, second: ProcessId, at_us: Us, overlap_us: Us },
}

impl super::Violation for Violation {
    fn kind(&self) -> &'static str {
        match self {
            Violation::NotDelivered { .. } => "acknowledged-not-delivered",
            Violation::ConcurrentProcessing { .. } => "concurrent-processing",
        }
    }

    fn at_us(&self) -> Us {
        match self {
            Violation::NotDelivered { at_us, .. } | Violation::ConcurrentProcessing { at_us, .. } => *at_us,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::NotDelivered { stream, first_id, count, .. } => {
                write!(f, "{count} acknowledged entries of {stream} were never delivered (first: {first_id})")
            }
            Violation::ConcurrentProcessing { stream, id, first, second, overlap_us, .. } => {
                write!(f, "{stream} {id} processed by {first} and {second} at once for {overlap_us} us")
            }
        }
    }
}

/// Checks invariant 7; also returns how many overlaps were attributed to pauses.
pub fn check(facts: &Facts<'_>) -> (Vec<Violation>, usize) {
    let mut violations = not_delivered(facts);
    let (concurrent, paused) = concurrent_processing(facts);
    violations.extend(concurrent);
    (violations, paused)
}

fn not_delivered(facts: &Facts<'_>) -> Vec<Violation> {
    let delivered: BTreeSet<(&str, EntryId)> =
        facts.records.reads.iter().flat_map(|r| r.ids.iter().map(move |id| (r.stream.as_str(), *id))).collect();
    let mut missing: BTreeMap<&str, (EntryId, usize, Us)> = BTreeMap::new();
    for add in &facts.records.adds {
        let Some(acknowledged_at_us) = add.acknowledged_at_us else { continue };
        if !delivered.contains(&(add.stream.as_str(), add.id)) {
            let entry = missing.entry(add.stream.as_str()).or_insert((add.id, 0, acknowledged_at_us));
            entry.1 += 1;
        }
    }
    missing
        .into_iter()
        .map(|(stream, (first_id, count, at_us))| Violation::NotDelivered {
            stream: stream.to_string(),
            first_id,
            count,
            at_us,
        })
        .collect()
}

fn concurrent_processing(facts: &Facts<'_>) -> (Vec<Violation>, usize) {
    let mut by_entry: BTreeMap<(&str, EntryId), Vec<(Us, Us, ProcessId)>> = BTreeMap::new();
    for p in &facts.records.processing {
        let end = p.end_us.or_else(|| facts.stopped_at(p.process)).unwrap_or(facts.end_us);
        by_entry.entry((p.stream.as_str(), p.id)).or_default().push((p.start_us, end, p.process));
    }
    let mut violations = Vec::new();
    let mut paused = 0;
    for ((stream, id), mut intervals) in by_entry {
        intervals.sort_unstable();
        for (i, &(start_a, end_a, a)) in intervals.iter().enumerate() {
            for &(start_b, end_b, b) in intervals[i + 1..].iter().take_while(|(s, ..)| *s < end_a) {
                if a == b {
                    continue;
                }
                if facts.paused_within(a, start_a, end_a) || facts.paused_within(b, start_b, end_b) {
                    paused += 1;
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
    (violations, paused)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn an_acknowledged_entry_must_be_delivered_and_an_unacknowledged_one_need_not() {
        let mut w = World::new();
        let (p, a) = (w.producer(1), w.consumer(1));
        let e1 = w.add(p, 0, 1_000);
        let e2 = w.add(p, 0, 2_000);
        w.add_unacknowledged(p, 0, 3_000);
        w.read_ids(a, 0, 5_000, &[e1]);
        let (violations, _) = check(&w.facts());
        assert!(matches!(&violations[..], [Violation::NotDelivered { first_id, count: 1, .. }] if *first_id == e2));
    }

    #[test]
    fn overlapping_processing_by_two_processes_is_reported_unless_one_was_paused() {
        let mut w = World::new();
        let (a, b) = (w.consumer(1), w.consumer(2));
        let id = EntryId { ms: 1, seq: 0 };
        w.process_entry(a, 0, id, 1_000_000, Some(2_000_000));
        w.process_entry(b, 0, id, 2_000_000, Some(2_500_000)); // hand-over at the same instant: fine
        assert_eq!(check(&w.facts()), (vec![], 0));
        w.process_entry(b, 0, id, 1_500_000, Some(1_600_000));
        let (violations, _) = check(&w.facts());
        assert!(matches!(&violations[..], [Violation::ConcurrentProcessing { overlap_us: 100_000, .. }]));
        w.pause(a, 1_200_000, 1_900_000);
        assert_eq!(check(&w.facts()), (vec![], 1));
    }
}
