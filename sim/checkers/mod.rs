//! The invariant checkers of `DESIGN.md`, one file per property, each with a typed `Violation`
//! enum whose docs name the property. They run after a seed finished, over [`Facts`]: the run's
//! ground truth (the Redis node's execution log, the client transports' send/receive records, the
//! application's processing records, the process table, and the store's metadata history). None
//! of them reads a protocol participant's own view (a consumer's lease, a coordinator's ownership
//! table): leases and permissions are recomputed from what was actually sent and received.
//!
//! | file | invariant |
//! |---|---|
//! | [`split`] | 1. no split ownership (overlapping read tenures) |
//! | [`consumer_lease`] | 2. consumer fail-closed (no read outside the lease it holds) |
//! | [`producer_lease`] | 3. producer fail-closed (no XADD on an expired routing view) |
//! | [`recorded`] | 4. recorded responses (every response was in the store before it arrived) |
//! | [`versions`] | 4. no version reuse: a bump goes past every client-reported version (ABA) |
//! | [`resurrection`] | 5. no resurrection of a deleted metadata key |
//! | [`liveness`] | 6. liveness after the faults heal |
//! | [`messages`] | 7. every acknowledged XADD delivered; no entry processed twice at once |
//! | [`evidence`] | every correction round has a ground-truth cause (no false loss evidence) |
//! | [`fences`] | fencing at the resource: what ran at Redis presented the latest recorded grant's fence |

pub mod consumer_lease;
pub mod evidence;
pub mod fences;
mod grants;
pub mod liveness;
pub mod messages;
pub mod producer_lease;
pub mod recorded;
pub mod resurrection;
pub mod split;
pub mod versions;

use std::collections::BTreeMap;
use std::fmt;

use rsc::core::model::{GroupId, GroupMetadata, ShardId};
use rsc::store::memory::{AckRecord, HistoryEvent, ReadRecord};

use crate::plan::{NodeRef, Plan};
use crate::records::{fmt_us, Mark, ProcessId, Records, Us};

/// Everything the checkers read.
pub struct Facts<'a> {
    pub plan: &'a Plan,
    pub group: &'a GroupId,
    pub records: &'a Records,
    /// The store's metadata history (`MemoryStore::history`), on the store clock (ms since the
    /// store was created, which is the instant the run started).
    pub history: &'a [HistoryEvent],
    /// Simulated time the run ended.
    pub end_us: Us,
    /// The store's own execution logs of delivery calls and XACKs (with the fence each presented).
    pub store_reads: &'a [ReadRecord],
    pub store_acks: &'a [AckRecord],
    /// Fenced operations the store refused as `FENCED`.
    pub fence_refusals: u64,
    /// Every `redis-split-brain` of the run, with its old primary's own logs.
    pub split_brains: &'a [SplitBrain],
}

/// One split brain as the checkers see it (`DESIGN.md` §7): an old primary, forked from the
/// primary at the failover, that served some processes until `switch_us` and whose writes were then
/// discarded. What it executed is ground truth (records tagged with `server`, and its own store
/// logs here); its metadata history is a timeline that ended at the switch.
pub struct SplitBrain {
    pub server: NodeRef,
    pub fork_us: Us,
    /// When the old primary went and its clients were switched (the run's end if never).
    pub switch_us: Us,
    /// The primary's and the old primary's histories share their first `fork_len` events.
    pub fork_len: usize,
    /// The old primary's metadata history, the shared prefix included.
    pub history: Vec<HistoryEvent>,
    /// The old primary's own delivery and XACK logs (only what it executed).
    pub store_reads: Vec<ReadRecord>,
    pub store_acks: Vec<AckRecord>,
    pub fence_refusals: u64,
}

impl SplitBrain {
    /// Until when the old primary's grants may still be in force: its switch plus one assignment
    /// lease and the clock-rate margin (a grant it answered lasts at most that long, and after
    /// the switch every coordinator sees the primary's new identity and holds a correction round).
    pub fn damage_until_us(&self, lease_us: Us) -> Us {
        let margin = rsc::core::model::CLOCK_RATE_MARGIN_PERCENT;
        self.switch_us + lease_us + lease_us * margin / 100
    }
}

impl Facts<'_> {
    /// The shard of a stream key `<streamPrefix>:<shard>` of this group.
    pub fn shard_of(&self, stream: &str) -> Option<ShardId> {
        stream.strip_prefix(&self.group.stream_prefix)?.strip_prefix(':')?.parse().ok()
    }

    /// When `process` stopped (killed or ended), if it did.
    pub fn stopped_at(&self, process: ProcessId) -> Option<Us> {
        self.records.lifecycles.iter().find(|l| l.process == process).and_then(|l| l.stopped_at_us)
    }

    /// How much of `[from, to]` no process of `processes` was paused (each pause extended by
    /// `grace_us` after it ended), in µs.
    pub fn unpaused_us(&self, processes: &[ProcessId], (from, to): (Us, Us), grace_us: Us) -> Us {
        let mut covered: Vec<(Us, Us)> = self
            .records
            .lifecycles
            .iter()
            .filter(|l| processes.contains(&l.process))
            .flat_map(|l| &l.paused)
            .map(|(start, end)| ((*start).max(from), end.map_or(to, |e| e.saturating_add(grace_us)).min(to)))
            .filter(|(start, end)| start < end)
            .collect();
        covered.sort_unstable();
        let (mut unpaused, mut cursor) = (0, from);
        for (start, end) in covered {
            if start > cursor {
                unpaused += start - cursor;
            }
            cursor = cursor.max(end);
        }
        unpaused + to.saturating_sub(cursor)
    }

    /// The true instant at which `node`'s clock has advanced `span_us` since the true instant
    /// `from_us`: `from_us + span_us` unless a `clock-drift` fault changed the node's clock rate
    /// (the clients measure leases on their own clock; the group's clock-rate margin covers the
    /// difference, and the split-ownership checker judges true time).
    pub fn clock_deadline_us(&self, node: NodeRef, from_us: Us, span_us: Us) -> Us {
        let nominal = rsc::client::clock::RATE_NOMINAL_PPM;
        let changes = self.records.marks.iter().filter_map(|m| match m {
            Mark::ClockRate { node: n, at_us, rate_ppm } if *n == node => Some((*at_us, (*rate_ppm).max(1))),
            _ => None,
        });
        let (mut at, mut rate, mut left) = (from_us, nominal, u128::from(span_us));
        for (change_us, next_rate) in changes {
            if change_us > at {
                let advanced = u128::from(change_us - at) * u128::from(rate) / u128::from(nominal);
                if advanced >= left {
                    break;
                }
                left -= advanced;
                at = change_us;
            }
            rate = next_rate;
        }
        let rest = (left * u128::from(nominal)).div_ceil(u128::from(rate));
        at.saturating_add(u64::try_from(rest).unwrap_or(u64::MAX))
    }

    /// The split brain whose old primary is `server` (`None`: the primary).
    pub fn split_brain_of(&self, server: NodeRef) -> Option<&SplitBrain> {
        self.split_brains.iter().find(|s| s.server == server)
    }

    /// When the primary's history records a correction round starting (a write whose recorded
    /// round is new: absent before, or a new lease wait), in µs, in order. Ground truth from the
    /// history, as `evidence` reads it.
    pub fn correction_round_starts_us(&self) -> Vec<Us> {
        let mut starts = Vec::new();
        let mut round_wait = None;
        for event in self.history {
            let Some((_, after)) = event.metadata_after.iter().rev().find(|(g, _)| g == self.group) else { continue };
            let state: Option<GroupMetadata> = after.as_ref().and_then(|r| serde_json::from_str(&r.aggregate).ok());
            let wait = state.as_ref().and_then(|g| g.correction.as_ref().map(|round| round.wait));
            if matches!(event.kind, rsc::store::memory::HistoryKind::Written { .. })
                && wait.is_some()
                && wait != round_wait
            {
                starts.push(event.at_ms * 1_000);
            }
            round_wait = wait;
        }
        starts
    }

    /// The plan's assignment lease in µs (the longest any grant may run).
    pub fn assignment_lease_us(&self) -> Us {
        self.plan.group.assignment_lease_ms * 1_000
    }

    /// The last recorded state of the group (`None`: absent or unparsable).
    pub fn final_state(&self) -> Option<GroupMetadata> {
        let record = self
            .history
            .iter()
            .rev()
            .find_map(|e| e.metadata_after.iter().rev().find(|(g, _)| g == self.group).map(|(_, r)| r.clone()))??;
        serde_json::from_str(&record.aggregate).ok()
    }

    /// Whether `at_us` (an overlap's start) lies in a silent loss of writes (a silent rollback,
    /// or a window in which acknowledged writes were dropped) or within one assignment lease
    /// after it: grants made in the lost history may still run then, which no protocol can
    /// prevent. Not before the loss: an overlap that started earlier ran on grants from a history
    /// the store still held, which the protocol must keep exclusive (an outside review found the
    /// window opened a lease early).
    pub fn near_silent_loss(&self, at_us: Us) -> bool {
        let lease_us = self.assignment_lease_us();
        self.records.marks.iter().any(|m| {
            let (from, to) = match m {
                Mark::SilentRollback { at_us } => (*at_us, *at_us),
                Mark::WriteDrop { from_us, to_us } => (*from_us, *to_us),
                Mark::KeyDeleted { .. } | Mark::ClockRate { .. } => return false,
            };
            from <= at_us && at_us <= to + lease_us
        })
    }
}

/// Every violation kind the checkers can report (what `expect` / `also` name). `cargo sim planted`
/// reports which of them no planted run produced: a kind no bug has ever tripped is a checker
/// nobody has seen fail. Kept in sync by `every_kind_is_listed` (tests) as kinds are added.
pub const KINDS: &[&str] = &[
    "split-ownership",
    "silent-rollback-split-too-long",
    "read-after-lease",
    "read-after-revoke",
    "read-after-fence",
    "started-without-ok",
    "read-without-grant",
    "publish-on-expired-routing",
    "publish-outside-routing",
    "response-not-recorded",
    "response-inconsistent",
    "metadata-version-reused",
    "metadata-resurrected",
    "group-unavailable-after-heal",
    "no-live-consumer",
    "shard-not-read-after-heal",
    "no-heartbeat-after-heal",
    "stuck-after-heal",
    "acknowledged-not-delivered",
    "delivered-never-processed",
    "acknowledged-stranded",
    "concurrent-processing",
    "false-loss-evidence",
    "unasked-shard-count",
    "stale-fence-succeeded",
    "unfenced-operation",
];

/// One violated invariant, as the runner reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The invariant's checker (`split`, `consumer-lease`, ...).
    pub checker: &'static str,
    /// The violation kind (`split-ownership`, `read-after-lease`, ...): what `expect` lists.
    pub kind: &'static str,
    /// When it happened (simulated µs).
    pub at_us: Us,
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {} @{}s: {}", self.checker, self.kind, fmt_us(self.at_us).trim(), self.detail)
    }
}

/// What every checker's `Violation` provides.
pub trait Violation: fmt::Display {
    /// The violation kind name (kebab-case).
    fn kind(&self) -> &'static str;
    /// When it happened.
    fn at_us(&self) -> Us;
}

fn findings<V: Violation>(checker: &'static str, violations: Vec<V>) -> impl Iterator<Item = Finding> {
    violations.into_iter().map(move |v| Finding { checker, kind: v.kind(), at_us: v.at_us(), detail: v.to_string() })
}

/// Damage that no protocol can prevent, measured instead of failed (reported separately).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Measurements {
    /// Longest split-ownership overlap attributed to a silent rollback (µs).
    pub silent_rollback_split_us: Option<Us>,
    /// Overlapping processing of one entry where one side was paused past its lease (a paused
    /// process cannot act on its lease end until it runs again).
    pub paused_processing_overlaps: usize,
    /// Acknowledged entries not yet delivered at the end, in stream tails (consumer backlog).
    pub backlog_entries: usize,
    /// Acknowledged entries never delivered whose shard lay beyond the recorded shard count after
    /// they were acknowledged (a lost `add-shards`); each is in an `acknowledged-stranded`
    /// violation too.
    pub stranded_entries: usize,
    /// Stranded entries whose lost count no process could prove (`messages`): measured, not
    /// failed.
    pub stranded_unprovable_entries: usize,
    /// Version bumps that reused a number only reports no record could check had named
    /// (`versions`): measured, not failed.
    pub unprovable_version_reuses: usize,
    /// Overlapping processing of one entry that started within a lease of a silent loss.
    pub silent_loss_processing_overlaps: usize,
    /// Responses derived from writes the store acknowledged but dropped (`redis-write-drop`).
    pub responses_from_dropped_writes: usize,
    /// Routing answers that told a producer its cached version was lost (`lostVersion`).
    pub lost_version_answers: usize,
    /// Acknowledged entries delivered at Redis near the end that no consumer processed (older
    /// ones are `delivered-never-processed` violations; see `messages`).
    pub delivered_never_processed: usize,
    /// Correction rounds started, by the ground-truth cause that preceded them (`evidence`).
    pub correction_rounds_by_cause: BTreeMap<&'static str, usize>,
    /// What the fences did (`fences`): stale operations refused, and stale successes whose grant
    /// the store later lost (measured).
    pub fences: fences::FenceCounts,
    /// What split brains did that no protocol prevents without `min-replicas-to-write`.
    pub split_brain: SplitBrainCounts,
}

/// The damage split brains did (`redis-split-brain`, `DESIGN.md` §7), measured. Splits and
/// processing overlaps (and operations on the other side's fence, in `FenceCounts`) are also
/// bounded in time by their checkers: past the old primary's switch plus one lease they would be
/// violations.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SplitBrainCounts {
    /// Split-ownership overlaps attributed to a split brain (`split`).
    pub splits: split::SplitBrainSplits,
    /// Processing overlaps of one entry attributed to a split brain (`messages`).
    pub processing_overlaps: usize,
    /// XADDs an old primary acknowledged, lost with it (`messages`).
    pub lost_publishes: usize,
    /// Responses only an old primary's states explain (`recorded`).
    pub responses_from_old_primary: usize,
}

impl SplitBrainCounts {
    /// Adds another seed's counts (the longest split is the maximum).
    pub fn add(&mut self, other: &SplitBrainCounts) {
        self.splits.count += other.splits.count;
        self.splits.longest_us = self.splits.longest_us.max(other.splits.longest_us);
        self.processing_overlaps += other.processing_overlaps;
        self.lost_publishes += other.lost_publishes;
        self.responses_from_old_primary += other.responses_from_old_primary;
    }

    pub fn is_empty(&self) -> bool {
        *self == SplitBrainCounts::default()
    }
}

/// The result of checking one run.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    pub findings: Vec<Finding>,
    pub measurements: Measurements,
}

/// Runs every checker.
pub fn check_all(facts: &Facts<'_>) -> Verdict {
    let mut measurements = Measurements::default();
    let (recorded, recorded_counts) = recorded::check(facts);
    measurements.responses_from_dropped_writes = recorded_counts.from_dropped_writes;
    let answers = &recorded_counts.old_primary_answers;
    let (split, silent, split_brain_splits) = split::check(facts, answers);
    measurements.silent_rollback_split_us = silent;
    let (messages, counts) = messages::check(facts, answers);
    let (versions, unprovable_version_reuses) = versions::judge(facts, answers);
    measurements.unprovable_version_reuses = unprovable_version_reuses;
    measurements.split_brain = SplitBrainCounts {
        splits: split_brain_splits,
        processing_overlaps: counts.split_brain_overlaps,
        lost_publishes: counts.split_brain_lost_publishes,
        responses_from_old_primary: recorded_counts.from_old_primary,
    };
    measurements.paused_processing_overlaps = counts.paused_overlaps;
    measurements.backlog_entries = counts.backlog;
    measurements.stranded_entries = counts.stranded;
    measurements.stranded_unprovable_entries = counts.stranded_unprovable;
    measurements.delivered_never_processed = counts.delivered_never_processed;
    measurements.silent_loss_processing_overlaps = counts.silent_loss_overlaps;
    measurements.lost_version_answers = facts
        .records
        .routings
        .iter()
        .filter(|call| matches!(&call.answer, Some(Ok(resp)) if resp.lost_version.is_some()))
        .count();
    let (evidence, rounds) = evidence::check(facts);
    measurements.correction_rounds_by_cause = rounds;
    let (fenced, fence_counts) = fences::check(facts);
    measurements.fences = fence_counts;
    let mut all: Vec<Finding> = findings("split", split)
        .chain(findings("consumer-lease", consumer_lease::check(facts)))
        .chain(findings("producer-lease", producer_lease::check(facts)))
        .chain(findings("recorded", recorded))
        .chain(findings("versions", versions))
        .chain(findings("resurrection", resurrection::check(facts)))
        .chain(findings("liveness", liveness::check(facts)))
        .chain(findings("messages", messages))
        .chain(findings("evidence", evidence))
        .chain(findings("fences", fenced))
        .collect();
    all.sort_by(|a, b| (a.at_us, a.checker, &a.detail).cmp(&(b.at_us, b.checker, &b.detail)));
    Verdict { findings: all, measurements }
}

/// Counts findings by kind (for the summary table).
pub fn count_by_kind(findings: &[Finding]) -> BTreeMap<&'static str, usize> {
    let mut counts = BTreeMap::new();
    for f in findings {
        *counts.entry(f.kind).or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
pub(crate) mod fixtures;

#[cfg(test)]
mod kinds_tests {
    /// Every string a checker's `Violation::kind` returns is in [`super::KINDS`], and vice versa.
    #[test]
    fn every_kind_is_listed() {
        let sources = [
            include_str!("split.rs"),
            include_str!("consumer_lease.rs"),
            include_str!("producer_lease.rs"),
            include_str!("recorded.rs"),
            include_str!("versions.rs"),
            include_str!("resurrection.rs"),
            include_str!("liveness.rs"),
            include_str!("messages.rs"),
            include_str!("evidence.rs"),
            include_str!("fences.rs"),
        ];
        let mut found = std::collections::BTreeSet::new();
        for source in sources {
            let start = source.find("fn kind(&self)").expect("every checker has a kind fn");
            let body = &source[start..];
            let body = &body[..body[1..].find("\n    fn ").map_or(body.len(), |end| end + 1)];
            for literal in body.split('"').skip(1).step_by(2) {
                found.insert(literal);
            }
        }
        let listed: std::collections::BTreeSet<&str> = super::KINDS.iter().copied().collect();
        assert_eq!(found, listed);
    }
}
