//! Invariant 5, **no resurrection**: once the group's metadata key is gone (deleted by a fault, an
//! operator, or an admin delete), nothing but an explicit admin `CreateGroup` recreates it — in
//! particular the coordinator never rebuilds it from heartbeats.
//!
//! From the store's metadata history: every applied write that finds the key absent (a create) must
//! happen while a coordinator was handling an admin `CreateGroup` (the coordinator node's server
//! records when it started and finished working on each admin request; a coordinator that died
//! mid-request counts as handling it to the end of the run). A create with no such request in
//! progress is a resurrection. Rollbacks that bring a deleted key back are the store's doing, not a
//! write, and are not judged here.

use std::fmt;

use rsc::core::protocol::AdminRequest;
use rsc::store::memory::HistoryKind;

use super::Facts;
use crate::records::{fmt_us, Us};

/// A violation of invariant 5 (no resurrection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Invariant 5: the metadata key was recreated by a write no admin `CreateGroup` explains.
    Resurrected { at_us: Us, revision: u64 },
}

impl super::Violation for Violation {
    fn kind(&self) -> &'static str {
        "metadata-resurrected"
    }

    fn at_us(&self) -> Us {
        match self {
            Violation::Resurrected { at_us, .. } => *at_us,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Resurrected { at_us, revision } => write!(
                f,
                "the deleted metadata key was recreated at {}s (revision {revision}) without an admin CreateGroup",
                fmt_us(*at_us).trim()
            ),
        }
    }
}

/// Checks invariant 5.
pub fn check(facts: &Facts<'_>) -> Vec<Violation> {
    // When a coordinator was working on an admin create of this group, in µs.
    let creates: Vec<(Us, Us)> = facts
        .records
        .admins
        .iter()
        .filter(|c| matches!(c.request, AdminRequest::CreateGroup { .. }) && c.request.group() == facts.group)
        .flat_map(|c| c.handled.iter().map(|(from, to)| (*from, to.unwrap_or(Us::MAX))))
        .collect();
    let mut present = false;
    let mut violations = Vec::new();
    for event in facts.history {
        let Some((_, after)) = event.metadata_after.iter().rev().find(|(g, _)| g == facts.group) else { continue };
        let creates_key = !present && after.is_some();
        if creates_key {
            if let HistoryKind::Written { revision, .. } = event.kind {
                // Store ms -> µs: the write happened somewhere in that millisecond.
                let (write_from_us, write_to_us) = (event.at_ms * 1_000, event.at_ms * 1_000 + 999);
                let explained = creates.iter().any(|(from, to)| *from <= write_to_us && *to >= write_from_us);
                if !explained {
                    violations.push(Violation::Resurrected { at_us: write_from_us, revision });
                }
            }
        }
        present = after.is_some();
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn a_create_explained_by_an_admin_call_is_clean_and_a_rebuild_is_not() {
        let mut w = World::new();
        w.admin_create(900_000, Some(1_200_000));
        let g = w.group_with_member("consumer-1", &[0]);
        w.store(1_000, &g, 1);
        w.delete_key(5_000);
        assert_eq!(check(&w.facts()), vec![]);
        // The coordinator rebuilds the group from a heartbeat at 6 s.
        w.store(6_000, &g, 1);
        assert_eq!(check(&w.facts()), vec![Violation::Resurrected { at_us: 6_000_000, revision: 1 }]);
        // A later operator recreate is fine.
        w.delete_key(7_000);
        w.admin_create(8_000_000, None);
        w.store(8_010, &g, 1);
        assert_eq!(check(&w.facts()).len(), 1);
    }
}
