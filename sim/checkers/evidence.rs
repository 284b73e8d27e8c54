//! **Evidence has a cause** (`DESIGN.md`, decisions after the first review): a correction round
//! needs a ground-truth cause — the store lost a write (a rollback that undid something, an
//! acknowledged write it dropped, a deleted key: a fault's or an operator's delete, which a
//! coordinator that still held the group cannot tell from a loss), or its identity changed
//! (failover, restart).
//! Concurrency alone is never evidence: two requests of one coordinator that overlap must not
//! look like lost writes.
//!
//! From the store's metadata history only: a *round start* is an applied write of this group whose
//! recorded correction round is new (absent before, or a new lease wait). It is legitimate when a
//! cause happened at or before it. The round's recorded reason is the code's claim and is not
//! consulted. The check is deliberately weak after the first real cause (evidence may surface much
//! later, e.g. when a long-paused client reports a lost version), and exact where it matters most:
//! a run whose store lost nothing and never changed identity must have no correction round at all.
//!
//! The same holds for shards: every shard count a write records must be one an operator asked for
//! (a create or an add-shards sent before the write, from the operator's records). A heal after a
//! lost add-shards restores a count an operator asked for; a client's made-up count does not.

use std::collections::BTreeMap;
use std::fmt;

use rsc::core::model::GroupMetadata;
use rsc::core::protocol::AdminRequest;
use rsc::store::memory::HistoryKind;

use super::Facts;
use crate::records::{fmt_us, Us};

/// A violation of "evidence has a cause".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// A correction round started although the store had lost nothing and kept its identity.
    FalseLossEvidence { at_us: Us, revision: u64, claimed: String },
    /// A write recorded a shard count no operator asked for (a create's count or an add-shards'
    /// new count, sent before the write): shards are added only by operators, or again after the
    /// store lost an operator's add-shards (DESIGN §8), never by a client's word alone.
    UnaskedShardCount { at_us: Us, revision: u64, shard_count: u32, asked: Vec<u32> },
}

impl super::Violation for Violation {
    fn kind(&self) -> &'static str {
        match self {
            Violation::FalseLossEvidence { .. } => "false-loss-evidence",
            Violation::UnaskedShardCount { .. } => "unasked-shard-count",
        }
    }

    fn at_us(&self) -> Us {
        match self {
            Violation::FalseLossEvidence { at_us, .. } | Violation::UnaskedShardCount { at_us, .. } => *at_us,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::FalseLossEvidence { at_us, revision, claimed } => write!(
                f,
                "a correction round started at {}s (revision {revision}, claimed {claimed}) with no lost write, \
                 dropped write, deleted key or identity change in the store before it",
                fmt_us(*at_us).trim()
            ),
            Violation::UnaskedShardCount { at_us, revision, shard_count, asked } => write!(
                f,
                "a write at {}s (revision {revision}) recorded {shard_count} shards, a count no operator asked for \
                 before it (asked: {asked:?})",
                fmt_us(*at_us).trim()
            ),
        }
    }
}

/// The ground-truth cause a round is attributed to: the latest one before it.
fn cause_of(kind: &HistoryKind, facts: &Facts<'_>) -> Option<&'static str> {
    match kind {
        HistoryKind::RolledBack { undone, .. } if *undone > 0 => Some("rollback"),
        HistoryKind::WriteDropped { group, .. } if group == facts.group => Some("dropped-write"),
        HistoryKind::KeyDeleted { group } if group == facts.group => Some("key-deleted"),
        // An operator's delete through one coordinator is, to another that still held the group
        // and finds it created again, indistinguishable from a lost record (DESIGN §12).
        HistoryKind::Deleted { group, .. } if group == facts.group => Some("admin-delete"),
        HistoryKind::IdentityChanged { .. } => Some("identity-change"),
        _ => None,
    }
}

/// Checks that every correction round has a cause; returns the violations and, per cause, how many
/// rounds started after it (for the summary).
pub fn check(facts: &Facts<'_>) -> (Vec<Violation>, BTreeMap<&'static str, usize>) {
    let mut violations = Vec::new();
    let mut rounds_by_cause = BTreeMap::new();
    let mut latest_cause: Option<&'static str> = None;
    let mut round_wait: Option<u64> = None;
    for event in facts.history {
        if let Some(cause) = cause_of(&event.kind, facts) {
            latest_cause = Some(cause);
        }
        let Some((_, after)) = event.metadata_after.iter().rev().find(|(g, _)| g == facts.group) else { continue };
        let state: Option<GroupMetadata> = after.as_ref().and_then(|r| serde_json::from_str(&r.aggregate).ok());
        let wait = state.as_ref().and_then(|g| g.correction.as_ref().map(|round| round.wait));
        let HistoryKind::Written { revision, .. } = event.kind else {
            // A rollback or fault restores whatever round the old state had; only writes start one.
            round_wait = wait;
            continue;
        };
        if wait.is_some() && wait != round_wait {
            match latest_cause {
                Some(cause) => *rounds_by_cause.entry(cause).or_insert(0) += 1,
                None => {
                    let claimed = state
                        .as_ref()
                        .and_then(|g| g.correction.as_ref().map(|round| format!("{:?}", round.reason)))
                        .unwrap_or_default();
                    violations.push(Violation::FalseLossEvidence { at_us: event.at_ms * 1_000, revision, claimed });
                }
            }
        }
        round_wait = wait;
        if let Some(g) = &state {
            let at_us = event.at_ms * 1_000;
            // The history counts whole milliseconds: a request sent within the write's own
            // millisecond was sent before it.
            let asked = asked_shard_counts(facts, at_us + 999);
            if !asked.contains(&g.shard_count) {
                let shard_count = g.shard_count;
                violations.push(Violation::UnaskedShardCount { at_us, revision, shard_count, asked });
            }
        }
    }
    (violations, rounds_by_cause)
}

/// The shard counts operators' requests sent at or before `at_us` named (create and add-shards),
/// in ascending order: ground truth from the operator's own records.
fn asked_shard_counts(facts: &Facts<'_>, at_us: Us) -> Vec<u32> {
    let counts: std::collections::BTreeSet<u32> = facts
        .records
        .admins
        .iter()
        .filter(|call| call.sent_at_us <= at_us)
        .filter_map(|call| match &call.request {
            AdminRequest::CreateGroup { group, shard_count, .. } if group == facts.group => Some(*shard_count),
            AdminRequest::AddShards { group, new_shard_count, .. } if group == facts.group => Some(*new_shard_count),
            _ => None,
        })
        .collect();
    counts.into_iter().collect()
}
