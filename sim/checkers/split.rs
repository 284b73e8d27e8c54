//! Invariant 1, **no split ownership**: at every simulated instant at most one consumer reads
//! (issues XREADGROUP / XAUTOCLAIM on) a given shard.
//!
//! Reads are instants; "reading a shard" is an interval, so the checker defines a **tenure**:
//! the reads of one consumer *process* on one shard, ordered by the instant the consumer issued
//! them (the Redis node records it; it is the instant of the consumer's lease check), grouped
//! into maximal runs such that
//! - two consecutive reads are at most the *cadence bound* apart — the longest a consumer that
//!   keeps a shard can go between two reads of it: `2 * (poll_interval + processing_max) +
//!   4 * latency_max + store_timeout` of the drawn plan; and
//! - between two consecutive reads the process was not told to stop the shard (a heartbeat answer
//!   it received that does not list the shard in `assigned`, or a fence / unknown-member error).
//!
//! A tenure spans from its first to its last read (closed interval; a single read is a tenure of
//! length zero). Two tenures of *different* processes on one shard that intersect are a split.
//! The second rule means a legitimate hand-over A -> B -> A never merges A's two tenures (A must
//! have been told to stop in between); the first keeps a process that stopped reading on its own
//! (lease end) from being treated as still reading.
//!
//! Silent rollbacks: an overlap that starts within one assignment lease of a silent rollback
//! (writes lost with no identity change, or acknowledged writes the store dropped) is damage no
//! protocol can fully prevent; it is measured (longest overlap) and is a violation only when it is
//! longer than one assignment lease.
//!
//! Split brain (`redis-split-brain`): an old primary that keeps accepting writes after a failover
//! lets coordinators on each side grant one shard twice; without `min-replicas-to-write` no
//! protocol prevents that. An overlap is attributed to a split brain only when one of its two
//! tenures *involves the old primary* — one of its reads was served by the old primary, or its
//! process was answered from a state only the old primary recorded ([`OldPrimaryAnswer`], judged
//! by the recorded-responses oracle) before the tenure ended — and the overlap starts after the
//! failover and no later than the old primary's switch plus one assignment lease (and the
//! clock-rate margin: [`super::SplitBrain::damage_until_us`]). Such overlaps are measured (count
//! and longest). Every other overlap is a violation (`split-ownership`), and so is an attributed
//! one that lasts past that instant (by then every grant the old primary answered has expired),
//! and one whose later tenure read under a grant from the primary's side sent after the first
//! correction round the primary recorded after the switch (that round withholds every `OK` for a
//! full lease, longer than any old-primary grant can run).

use std::collections::BTreeMap;
use std::fmt;

use rsc::core::model::ShardId;

use rsc::core::protocol::HeartbeatStatus;

use super::grants::{Grants, Said};
use super::recorded::OldPrimaryAnswer;
use super::Facts;
use crate::plan::NodeRef;
use crate::records::{fmt_us, ProcessId, Us};

/// A run of reads of one process on one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenure {
    pub process: ProcessId,
    pub from_us: Us,
    pub to_us: Us,
    pub reads: usize,
    /// An old primary that served one of its reads (split brain), if any.
    pub old_primary: Option<NodeRef>,
}

impl fmt::Display for Tenure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} [{}s..{}s, {} reads]",
            self.process,
            fmt_us(self.from_us).trim(),
            fmt_us(self.to_us).trim(),
            self.reads
        )
    }
}

/// A violation of invariant 1 (no split ownership).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Invariant 1: two processes' read tenures on one shard intersect.
    SplitOwnership { shard: ShardId, earlier: Tenure, later: Tenure, overlap_us: Us },
    /// Invariant 1 under a silent rollback: the overlap is attributed to lost writes, but it lasted
    /// longer than one assignment lease (the bound the design promises for this damage).
    SilentRollbackSplitTooLong { shard: ShardId, earlier: Tenure, later: Tenure, overlap_us: Us, lease_us: Us },
}

impl super::Violation for Violation {
    fn kind(&self) -> &'static str {
        match self {
            Violation::SplitOwnership { .. } => "split-ownership",
            Violation::SilentRollbackSplitTooLong { .. } => "silent-rollback-split-too-long",
        }
    }

    fn at_us(&self) -> Us {
        match self {
            Violation::SplitOwnership { later, .. } | Violation::SilentRollbackSplitTooLong { later, .. } => {
                later.from_us
            }
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::SplitOwnership { shard, earlier, later, overlap_us } => {
                write!(f, "shard {shard}: {earlier} and {later} overlap for {overlap_us} us")
            }
            Violation::SilentRollbackSplitTooLong { shard, earlier, later, overlap_us, lease_us } => write!(
                f,
                "shard {shard}: {earlier} and {later} overlap for {overlap_us} us after a silent rollback \
                 (bound: one assignment lease = {lease_us} us)"
            ),
        }
    }
}

/// The cadence bound of the tenure definition (µs).
pub fn cadence_bound_us(facts: &Facts<'_>) -> Us {
    let w = &facts.plan.workload;
    let t = &facts.plan.tuning;
    (2 * (w.poll_interval_ms + w.processing_max_ms) + 4 * t.latency_max_ms + t.store_timeout_ms) * 1_000
}

/// Every tenure on every shard, per shard in order of start.
pub fn tenures(facts: &Facts<'_>, grants: &Grants) -> BTreeMap<ShardId, Vec<Tenure>> {
    let gap_us = cadence_bound_us(facts);
    let mut by_key: BTreeMap<(ShardId, ProcessId), Vec<(Us, NodeRef)>> = BTreeMap::new();
    for read in &facts.records.reads {
        if let Some(shard) = facts.shard_of(&read.stream) {
            by_key.entry((shard, read.process)).or_default().push((read.issued_at_us, read.server));
        }
    }
    let old = |server: NodeRef| (server != NodeRef::REDIS).then_some(server);
    let mut out: BTreeMap<ShardId, Vec<Tenure>> = BTreeMap::new();
    for ((shard, process), mut times) in by_key {
        times.sort_unstable();
        let mut current: Option<Tenure> = None;
        for (at, server) in times {
            current = match current.take() {
                Some(mut t) if at - t.to_us <= gap_us && !grants.withdrawn_between(process, shard, t.to_us, at) => {
                    t.to_us = at;
                    t.reads += 1;
                    t.old_primary = t.old_primary.or(old(server));
                    Some(t)
                }
                previous => {
                    out.entry(shard).or_default().extend(previous);
                    Some(Tenure { process, from_us: at, to_us: at, reads: 1, old_primary: old(server) })
                }
            };
        }
        out.entry(shard).or_default().extend(current);
    }
    for list in out.values_mut() {
        list.sort_by_key(|t| (t.from_us, t.process));
    }
    out
}

/// Overlaps attributed to a split brain (see the module docs), measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SplitBrainSplits {
    /// Pairs of overlapping tenures (once per shard and pair of processes).
    pub count: usize,
    /// The longest of them (µs).
    pub longest_us: Option<Us>,
}

/// The old primaries `tenure` involves: one that served one of its reads, and each whose side
/// answered its process (an [`OldPrimaryAnswer`] it saw) before the tenure ended.
fn involved_old_primaries<'a>(
    tenure: &'a Tenure,
    answers: &'a [OldPrimaryAnswer],
) -> impl Iterator<Item = NodeRef> + 'a {
    let answered = answers
        .iter()
        .filter(|a| a.seen && a.process == tenure.process && a.received_at_us <= tenure.to_us)
        .map(|a| a.server);
    tenure.old_primary.into_iter().chain(answered)
}

/// The split brain an overlap of `earlier` and `later` (starting at `later.from_us`) is
/// attributed to: one whose old primary either tenure involves, that began at or before the
/// overlap, and whose damage window was still open when it began.
fn attributed<'f>(
    facts: &'f Facts<'_>,
    (grants, corrections): (&Grants, &[Us]),
    answers: &[OldPrimaryAnswer],
    (shard, earlier, later): (ShardId, &Tenure, &Tenure),
) -> Option<&'f super::SplitBrain> {
    let lease_us = facts.assignment_lease_us();
    let involved: std::collections::BTreeSet<NodeRef> =
        [earlier, later].into_iter().flat_map(|t| involved_old_primaries(t, answers)).collect();
    involved
        .into_iter()
        .filter_map(|server| facts.split_brain_of(server))
        .filter(|split| split.fork_us <= later.from_us && later.from_us <= split.damage_until_us(lease_us))
        .find(|split| granted_before_correction(grants, corrections, answers, split, shard, later))
}

/// Whether the grant `later` read under could still overlap the old primary's grants: it came
/// from the old primary's side, or its heartbeat was sent before the first correction round the
/// primary recorded after the switch. Once such a round started, the primary withholds every `OK`
/// for a full lease, by which time every grant the old primary answered has expired; a grant sent
/// after that start which overlaps one is the protocol's failure, not the split brain's.
fn granted_before_correction(
    grants: &Grants,
    corrections: &[Us],
    answers: &[OldPrimaryAnswer],
    split: &super::SplitBrain,
    shard: ShardId,
    later: &Tenure,
) -> bool {
    let Some(&corrected_us) = corrections.iter().find(|at| **at >= split.switch_us) else {
        return true;
    };
    let granted = grants.of(later.process).iter().rev().find(|t| {
        t.received_at_us <= later.from_us
            && matches!(&t.what, Said::Granted { status: HeartbeatStatus::Ok, assigned, .. } if assigned.contains(&shard))
    });
    granted.is_none_or(|t| {
        t.sent_at_us < corrected_us
            || answers
                .iter()
                .any(|a| a.server == split.server && a.process == later.process && a.received_at_us == t.received_at_us)
    })
}

/// Checks invariant 1; also returns the longest overlap attributed to a silent rollback and the
/// overlaps attributed to split brains. `answers` are the heartbeat answers derived from states
/// only an old primary recorded.
pub fn check(facts: &Facts<'_>, answers: &[OldPrimaryAnswer]) -> (Vec<Violation>, Option<Us>, SplitBrainSplits) {
    let grants = Grants::from_records(facts.records);
    let corrections = if facts.split_brains.is_empty() { Vec::new() } else { facts.correction_round_starts_us() };
    let lease_us = facts.assignment_lease_us();
    let mut violations = Vec::new();
    let mut silent_max: Option<Us> = None;
    let mut split_brain = SplitBrainSplits::default();
    let mut split_brain_pairs = std::collections::BTreeSet::new();
    for (shard, list) in tenures(facts, &grants) {
        for (i, earlier) in list.iter().enumerate() {
            // Report each pair of processes once per shard: the first overlap found.
            for later in list[i + 1..].iter().take_while(|l| l.from_us <= earlier.to_us) {
                if later.process == earlier.process {
                    continue;
                }
                let overlap_us = later.to_us.min(earlier.to_us) - later.from_us;
                let start = later.from_us;
                if let Some(split) = attributed(facts, (&grants, &corrections), answers, (shard, earlier, later)) {
                    let end = later.to_us.min(earlier.to_us);
                    if end <= split.damage_until_us(lease_us) {
                        let pair = (earlier.process.min(later.process), earlier.process.max(later.process));
                        if split_brain_pairs.insert((shard, pair)) {
                            split_brain.count += 1;
                        }
                        split_brain.longest_us = Some(split_brain.longest_us.map_or(overlap_us, |m| m.max(overlap_us)));
                        continue;
                    }
                }
                let silent = facts.near_silent_loss(start);
                let (earlier, later) = (earlier.clone(), later.clone());
                if !silent {
                    violations.push(Violation::SplitOwnership { shard, earlier, later, overlap_us });
                } else {
                    silent_max = Some(silent_max.map_or(overlap_us, |m| m.max(overlap_us)));
                    if overlap_us > lease_us {
                        violations.push(Violation::SilentRollbackSplitTooLong {
                            shard,
                            earlier,
                            later,
                            overlap_us,
                            lease_us,
                        });
                    }
                }
            }
        }
    }
    dedup_pairs(&mut violations);
    (violations, silent_max, split_brain)
}

/// Keeps the first violation per (shard, pair of processes).
fn dedup_pairs(violations: &mut Vec<Violation>) {
    let mut seen = std::collections::BTreeSet::new();
    violations.retain(|v| {
        let (Violation::SplitOwnership { shard, earlier, later, .. }
        | Violation::SilentRollbackSplitTooLong { shard, earlier, later, .. }) = v;
        let pair = (earlier.process.min(later.process), earlier.process.max(later.process));
        seen.insert((*shard, pair))
    });
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn a_clean_hand_over_is_not_a_split() {
        let mut w = World::new();
        let (a, b) = (w.consumer(1), w.consumer(2));
        w.grant(a, 0, &[0], 8_000);
        w.reads(a, 0, 100_000..=2_000_000, 50_000);
        w.grant(b, 2_100_000, &[0], 8_000);
        w.withdraw(a, 2_050_000);
        w.reads(b, 0, 2_200_000..=4_000_000, 50_000);
        let (violations, _, _) = check(&w.facts(), &[]);
        assert_eq!(violations, vec![]);
    }

    #[test]
    fn two_readers_at_once_are_a_split() {
        let mut w = World::new();
        let (a, b) = (w.consumer(1), w.consumer(2));
        w.grant(a, 0, &[0], 8_000);
        w.grant(b, 0, &[0], 8_000);
        w.reads(a, 0, 100_000..=2_000_000, 50_000);
        w.reads(b, 0, 1_000_000..=3_000_000, 50_000);
        let (violations, _, _) = check(&w.facts(), &[]);
        assert_eq!(violations.len(), 1, "{violations:?}");
        let Violation::SplitOwnership { shard, earlier, later, overlap_us } = &violations[0] else { panic!() };
        assert_eq!((*shard, earlier.process, later.process, *overlap_us), (0, a, b, 1_000_000));
    }

    #[test]
    fn a_to_b_to_a_with_a_revoke_in_between_is_clean_but_without_one_it_is_a_split() {
        for told_to_stop in [true, false] {
            let mut w = World::new();
            let (a, b) = (w.consumer(1), w.consumer(2));
            w.grant(a, 0, &[0], 8_000);
            w.reads(a, 0, 100_000..=1_000_000, 50_000);
            if told_to_stop {
                w.withdraw(a, 1_010_000);
            }
            // B reads once, briefly, inside the cadence bound of A's reads.
            w.grant(b, 1_020_000, &[0], 8_000);
            w.reads(b, 0, 1_030_000..=1_030_000, 1);
            w.reads(a, 0, 1_040_000..=1_500_000, 50_000);
            let (violations, _, _) = check(&w.facts(), &[]);
            assert_eq!(violations.is_empty(), told_to_stop, "told_to_stop={told_to_stop}: {violations:?}");
        }
    }

    #[test]
    fn a_split_right_after_a_silent_rollback_is_measured_not_failed_unless_too_long() {
        for (b_reads_until, expect_violation) in [(3_000_000, false), (12_000_000, true)] {
            let mut w = World::new();
            let (a, b) = (w.consumer(1), w.consumer(2));
            w.grant(a, 0, &[0], 8_000);
            w.reads(a, 0, 100_000..=b_reads_until + 500_000, 50_000);
            w.silent_rollback(900_000);
            w.grant(b, 950_000, &[0], 8_000);
            w.reads(b, 0, 1_000_000..=b_reads_until, 50_000);
            let (violations, silent, _) = check(&w.facts(), &[]);
            assert_eq!(!violations.is_empty(), expect_violation, "{violations:?}");
            assert_eq!(silent, Some(b_reads_until - 1_000_000));
        }
    }

    /// An overlap that started before the silent loss ran on grants the store still held: a
    /// violation however short, not a measured loss (the excuse window used to open a lease early).
    #[test]
    fn a_split_that_started_before_a_silent_rollback_is_a_violation() {
        let mut w = World::new();
        let (a, b) = (w.consumer(1), w.consumer(2));
        w.grant(a, 0, &[0], 8_000);
        w.reads(a, 0, 100_000..=3_500_000, 50_000);
        w.grant(b, 950_000, &[0], 8_000);
        w.reads(b, 0, 1_000_000..=3_000_000, 50_000);
        w.silent_rollback(2_000_000);
        let (violations, silent, _) = check(&w.facts(), &[]);
        assert!(!violations.is_empty(), "{violations:?}");
        assert_eq!(silent, None);
    }

    /// Lease 8 s in the fixture: the damage window ends at the switch + 8 s + 2%.
    #[test]
    fn a_split_through_an_old_primary_is_measured_within_its_window_and_a_violation_beyond() {
        for (b_reads_until, involves_old_primary, expect_violation) in
            [(9_000_000, true, false), (9_000_000, false, true), (14_000_000, true, true)]
        {
            let mut w = World::new();
            let (a, b) = (w.consumer(1), w.consumer(2));
            let old = w.split_brain(1, 900_000, 4_000_000);
            w.grant(a, 0, &[0], 8_000);
            w.grant(b, 950_000, &[0], 8_000);
            w.reads(a, 0, 100_000..=b_reads_until + 500_000, 50_000);
            let server = if involves_old_primary { old } else { NodeRef::REDIS };
            for at in (1_000_000..=b_reads_until).step_by(50_000) {
                w.read_ids_on(server, b, 0, at, &[]);
            }
            let (violations, _, measured) = check(&w.facts(), &[]);
            assert_eq!(!violations.is_empty(), expect_violation, "{violations:?}");
            assert_eq!(measured.count, usize::from(!expect_violation), "{measured:?}");
        }
    }

    /// A consumer of the old primary (alive 0.9 s..4 s) reads on past the switch; the primary
    /// records a correction round at 4.5 s. A grant sent before that round may overlap the old
    /// primary's grants (measured); one sent after it is the protocol's failure (the round
    /// withholds every `OK` for a full lease): a violation.
    #[test]
    fn a_grant_sent_after_the_primary_corrected_past_the_switch_is_not_excused() {
        for (granted_at_us, expect_violation) in [(4_200_000, false), (5_000_000, true)] {
            let mut w = World::new();
            let (a, b) = (w.consumer(1), w.consumer(2));
            let old = w.split_brain(1, 900_000, 4_000_000);
            w.grant(a, 0, &[0], 8_000);
            for at in (100_000..=3_950_000).step_by(50_000) {
                w.read_ids_on(old, a, 0, at, &[]);
            }
            w.reads(a, 0, 4_000_000..=8_000_000, 50_000);
            let mut g = w.group_with_member("consumer-1", &[0]);
            g.correction = Some(rsc::core::model::CorrectionRound {
                reason: rsc::core::model::LossEvidence::StoreIdentityChanged,
                wait: 1,
                synced_members: Default::default(),
                unverified_lineage: false,
                proven_version: 0,
            });
            w.store(4_500, &g, 5);
            w.grant(b, granted_at_us, &[0], 8_000);
            w.reads(b, 0, granted_at_us + 100_000..=7_000_000, 50_000);
            let (violations, _, measured) = check(&w.facts(), &[]);
            assert_eq!(!violations.is_empty(), expect_violation, "{violations:?}");
            assert_eq!(measured.count, usize::from(!expect_violation), "{measured:?}");
        }
    }
}
