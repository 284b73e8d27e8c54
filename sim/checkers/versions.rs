//! Invariant 4, second half, **no version reuse after lost writes** (ABA): `DESIGN.md`, "Lost
//! writes": "a later version bump must go *past* the highest version any client reported (never
//! reuse a lost version number)".
//!
//! From the store's metadata history: each applied write is computed from the state stored right
//! before it (the revision CAS guarantees it), so for every write that changes `metadataVersion`,
//! the new version must be above the highest client-reported version recorded in the state it was
//! computed from and in the state it writes (`maxClientVersionSeen`). A version a client saw but
//! never reported cannot be protected (a silent rollback loses it without trace); a version
//! recorded as reported can.

use std::fmt;

use rsc::core::model::GroupMetadata;
use rsc::store::memory::HistoryKind;

use super::Facts;
use crate::records::Us;

/// A violation of invariant 4 (no version reuse).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Invariant 4: a write bumped `metadataVersion` to a number a client had already reported.
    VersionNotPastReported { revision: u64, version: u64, reported: u64, at_us: Us },
}

impl super::Violation for Violation {
    fn kind(&self) -> &'static str {
        "metadata-version-reused"
    }

    fn at_us(&self) -> Us {
        match self {
            Violation::VersionNotPastReported { at_us, .. } => *at_us,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::VersionNotPastReported { revision, version, reported, .. } => write!(
                f,
                "revision {revision} bumped metadataVersion to {version}, but a client had reported {reported}"
            ),
        }
    }
}

/// Checks every version bump in the store's history.
pub fn check(facts: &Facts<'_>) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut stored: Option<GroupMetadata> = None;
    for event in facts.history {
        let Some((_, after)) = event.metadata_after.iter().rev().find(|(g, _)| g == facts.group) else { continue };
        let next: Option<GroupMetadata> = after.as_ref().and_then(|r| serde_json::from_str(&r.aggregate).ok());
        if let (HistoryKind::Written { revision, .. }, Some(before), Some(written)) = (&event.kind, &stored, &next) {
            let reported = before.max_client_version_seen.max(written.max_client_version_seen);
            if written.metadata_version != before.metadata_version && written.metadata_version <= reported {
                violations.push(Violation::VersionNotPastReported {
                    revision: *revision,
                    version: written.metadata_version,
                    reported,
                    at_us: event.at_ms * 1_000,
                });
            }
        }
        stored = next;
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn a_bump_must_go_past_every_reported_version() {
        let mut w = World::new();
        let mut g = w.group_with_member("consumer-1", &[0]);
        g.metadata_version = 12;
        g.max_client_version_seen = 13; // a client reported 13 (lost in a rollback)
        w.store(1_000, &g, 1);
        let mut next = g.clone();
        next.metadata_version = 14;
        w.store(2_000, &next, 2);
        assert_eq!(check(&w.facts()), vec![]);
        let mut reused = next.clone();
        reused.max_client_version_seen = 16;
        w.store(3_000, &reused, 3); // bookkeeping only: no bump, fine
        reused.metadata_version = 15;
        w.store(4_000, &reused, 4);
        assert_eq!(
            check(&w.facts()),
            vec![Violation::VersionNotPastReported { revision: 4, version: 15, reported: 16, at_us: 4_000_000 }]
        );
    }
}
