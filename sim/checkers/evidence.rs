//! **Evidence has a cause** (`DESIGN.md`, decisions after the first review): a correction round
//! needs a ground-truth cause — the store lost a write (a rollback that undid something, an
//! acknowledged write it dropped, a deleted key), or its identity changed (failover, restart).
//! Concurrency alone is never evidence: two requests of one coordinator that overlap must not
//! look like lost writes.
//!
//! From the store's metadata history only: a *round start* is an applied write of this group whose
//! recorded correction round is new (absent before, or a new lease wait). It is legitimate when a
//! cause happened at or before it. The round's recorded reason is the code's claim and is not
//! consulted. The check is deliberately weak after the first real cause (evidence may surface much
//! later, e.g. when a long-paused client reports a lost version), and exact where it matters most:
//! a run whose store lost nothing and never changed identity must have no correction round at all.

use std::collections::BTreeMap;
use std::fmt;

use rsc::core::model::GroupMetadata;
use rsc::store::memory::HistoryKind;

use super::Facts;
use crate::records::{fmt_us, Us};

/// A violation of "evidence has a cause".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// A correction round started although the store had lost nothing and kept its identity.
    FalseLossEvidence { at_us: Us, revision: u64, claimed: String },
}

impl super::Violation for Violation {
    fn kind(&self) -> &'static str {
        "false-loss-evidence"
    }

    fn at_us(&self) -> Us {
        match self {
            Violation::FalseLossEvidence { at_us, .. } => *at_us,
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
        }
    }
}

/// The ground-truth cause a round is attributed to: the latest one before it.
fn cause_of(kind: &HistoryKind, facts: &Facts<'_>) -> Option<&'static str> {
    match kind {
        HistoryKind::RolledBack { undone, .. } if *undone > 0 => Some("rollback"),
        HistoryKind::WriteDropped { group, .. } if group == facts.group => Some("dropped-write"),
        HistoryKind::KeyDeleted { group } if group == facts.group => Some("key-deleted"),
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
                    let claimed =
                        state.and_then(|g| g.correction.map(|round| format!("{:?}", round.reason))).unwrap_or_default();
                    violations.push(Violation::FalseLossEvidence { at_us: event.at_ms * 1_000, revision, claimed });
                }
            }
        }
        round_wait = wait;
    }
    (violations, rounds_by_cause)
}
