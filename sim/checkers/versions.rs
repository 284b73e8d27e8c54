//! Invariant 4, second half, **no version reuse after lost writes** (ABA): `DESIGN.md`, "Lost
//! writes": "a later version bump must go *past* the highest version any client reported (never
//! reuse a lost version number)".
//!
//! Judged from the clients' transport records and the store's history, never from the
//! coordinator's own bookkeeping (`maxClientVersionSeen`): a client *reported* version R when it
//! sent a heartbeat with `metadataVersion` R or a routing refresh with `knownVersion` R and got an
//! answer (so a coordinator processed it). Every later write that bumps `metadataVersion` to a
//! number at or below R is a reuse — unless the store lost writes (a rollback that undid
//! something, an acknowledged write it dropped, a deleted key) between the report's send and the
//! bump: the record of the report may have been lost with them, and a version a coordinator no
//! longer knows was reported cannot be protected (the client reports it again at its next request).
//! The end of a split brain is such a loss (the old primary's writes are discarded). A report is
//! also held only against a record that could have checked it (DESIGN §8): one with no key, or
//! whose key verifies the proof the report carried. A client of a history whose key died with it
//! (a recreate no process knew the lost key of) cannot prove its version to anyone, and neither
//! can a forger; such a reuse is counted (`unprovable`), not failed. Bumps are
//! judged in the primary's history only (an old primary's timeline is discarded whole), and a
//! report whose answer an old primary's side may have given ([`OldPrimaryAnswer`]) is not held
//! against the primary, which never saw it.
use std::fmt;

use rsc::core::model::GroupMetadata;
use rsc::core::proof::{Fact, ViewProof};
use rsc::store::memory::HistoryKind;

use crate::records::ProcessId;

use super::recorded::OldPrimaryAnswer;
use super::Facts;
use crate::records::Us;

/// A violation of invariant 4 (no version reuse).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Invariant 4: a write bumped `metadataVersion` to a number a client had already reported.
    VersionNotPastReported { revision: u64, version: u64, reported: u64, who: ProcessId, at_us: Us },
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
            Violation::VersionNotPastReported { revision, version, reported, who, .. } => write!(
                f,
                "revision {revision} bumped metadataVersion to {version}, but {who} had reported {reported} \
                 and the store lost nothing since"
            ),
        }
    }
}

/// One version a client reported: (sent, answered, reported version, who, the proof it carried).
type Report = (Us, Us, u64, ProcessId, Option<ViewProof>);

/// Versions clients reported in requests a coordinator answered.
fn reports(facts: &Facts<'_>) -> Vec<Report> {
    let heartbeats = facts.records.heartbeats.iter().filter_map(|call| {
        let answered = call.received_at_us.filter(|_| matches!(call.answer, Some(Ok(_))))?;
        let proof = call.request.metadata_version_proof;
        Some((call.sent_at_us, answered, call.request.metadata_version, call.process, proof))
    });
    let routings = facts.records.routings.iter().filter_map(|call| {
        let answered = call.received_at_us.filter(|_| matches!(call.answer, Some(Ok(_))))?;
        Some((call.sent_at_us, answered, call.request.known_version, call.process, call.request.known_version_proof))
    });
    heartbeats.chain(routings).filter(|(_, _, version, _, _)| *version > 0).collect()
}

/// Store-clock instants (µs) at which the store lost writes of the group.
fn losses(facts: &Facts<'_>) -> Vec<Us> {
    facts
        .history
        .iter()
        .filter(|e| match &e.kind {
            HistoryKind::RolledBack { undone, .. } => *undone > 0,
            HistoryKind::WriteDropped { group, .. } | HistoryKind::KeyDeleted { group } => group == facts.group,
            _ => false,
        })
        .map(|e| e.at_ms * 1_000)
        // Not a split brain's switch: the old primary's writes it discards were reports answered
        // on its side, which `judge` leaves out whole; the switch loses none of the primary's, so
        // it excuses no report the primary processed (an outside review: it did, for every
        // report, which hid version reuse after a split brain).
        .collect()
}

/// Checks every version bump in the store's history against the versions clients reported.
/// `answers` are the answers derived from an old primary's states: their reports were processed
/// on the old primary's side of a split brain, which the primary never saw (the old primary's
/// timeline is discarded whole, reports included).
#[cfg(test)]
pub fn check(facts: &Facts<'_>, answers: &[OldPrimaryAnswer]) -> Vec<Violation> {
    judge(facts, answers).0
}

/// [`check`], and the count of bumps that reused a version only unprovable reports named.
pub fn judge(facts: &Facts<'_>, answers: &[OldPrimaryAnswer]) -> (Vec<Violation>, usize) {
    let on_old_side: std::collections::BTreeSet<(ProcessId, Us)> =
        answers.iter().map(|a| (a.process, a.received_at_us)).collect();
    let mut reports = reports(facts);
    reports.retain(|(_, answered, _, who, _)| !on_old_side.contains(&(*who, *answered)));
    let losses = losses(facts);
    let mut violations = Vec::new();
    let mut unprovable = 0;
    let mut stored: Option<GroupMetadata> = None;
    for event in facts.history {
        let Some((_, after)) = event.metadata_after.iter().rev().find(|(g, _)| g == facts.group) else { continue };
        let next: Option<GroupMetadata> = after.as_ref().and_then(|r| serde_json::from_str(&r.aggregate).ok());
        if let (HistoryKind::Written { revision, .. }, Some(before), Some(written)) = (&event.kind, &stored, &next) {
            // The write happened somewhere in its store millisecond.
            let bump_us = event.at_ms * 1_000 + 999;
            let bumped = written.metadata_version != before.metadata_version;
            let reused = reports.iter().filter(|(sent, answered, version, _, _)| {
                *answered <= event.at_ms * 1_000
                    && written.metadata_version <= *version
                    && !losses.iter().any(|lost| (*sent..=bump_us).contains(lost))
            });
            let provable = |(_, _, version, _, proof): &&Report| match written.view_key {
                None => true,
                Some(key) => {
                    proof.is_some_and(|proof| key.verifies(facts.group, Fact::MetadataVersion, *version, &proof))
                }
            };
            let (provable, unprovable_only): (Vec<&Report>, Vec<&Report>) = reused.partition(provable);
            if bumped && provable.is_empty() && !unprovable_only.is_empty() {
                unprovable += 1;
            }
            let reused = provable.into_iter();
            if let Some((_, _, reported, who, _)) =
                reused.max_by_key(|(_, _, version, _, _)| *version).filter(|_| bumped)
            {
                violations.push(Violation::VersionNotPastReported {
                    revision: *revision,
                    version: written.metadata_version,
                    reported: *reported,
                    who: *who,
                    at_us: event.at_ms * 1_000,
                });
            }
        }
        stored = next;
    }
    (violations, unprovable)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn a_bump_must_go_past_every_version_a_client_reported_unless_the_store_lost_writes_since() {
        let mut w = World::new();
        let p = w.producer(1);
        let mut g = w.group_with_member("consumer-1", &[0]);
        g.metadata_version = 12;
        w.store(1_000, &g, 1);
        // The producer reports 13 at 2 s (a version the store lost before the run's history).
        w.routing_reporting(p, 13, 2_000_000, 2_100_000);
        let mut next = g.clone();
        next.metadata_version = 14;
        w.store(3_000, &next, 2);
        assert_eq!(check(&w.facts(), &[]), vec![]);
        let mut reused = next.clone();
        reused.metadata_version = 13;
        w.store(4_000, &reused, 3);
        let violations = check(&w.facts(), &[]);
        assert!(
            matches!(
                &violations[..],
                [Violation::VersionNotPastReported { revision: 3, version: 13, reported: 13, .. }]
            ),
            "{violations:?}"
        );
    }

    #[test]
    fn a_report_the_store_may_have_lost_since_protects_nothing() {
        let mut w = World::new();
        let p = w.producer(1);
        let mut g = w.group_with_member("consumer-1", &[0]);
        g.metadata_version = 12;
        w.store(1_000, &g, 1);
        w.routing_reporting(p, 13, 2_000_000, 2_100_000);
        w.history.push(rsc::store::memory::HistoryEvent {
            at_ms: 2_500,
            kind: HistoryKind::WriteDropped { group: w.group.clone(), revision: 2 },
            metadata_after: vec![],
        });
        let mut reused = g.clone();
        reused.metadata_version = 13;
        w.store(4_000, &reused, 2);
        assert_eq!(check(&w.facts(), &[]), vec![]);
    }

    /// A split brain's switch loses none of the primary's writes: a report the primary's side
    /// answered still protects its version across it (it excused every report before).
    #[test]
    fn a_split_brain_switch_excuses_no_report_the_primary_answered() {
        let mut w = World::new();
        let p = w.producer(1);
        let mut g = w.group_with_member("consumer-1", &[0]);
        g.metadata_version = 12;
        w.store(1_000, &g, 1);
        w.split_brain(1, 1_500_000, 3_000_000);
        w.routing_reporting(p, 13, 2_000_000, 2_100_000);
        let mut reused = g.clone();
        reused.metadata_version = 13;
        w.store(4_000, &reused, 2);
        assert_eq!(check(&w.facts(), &[]).len(), 1, "answered on the primary's side: a violation");
    }

    /// A keyed record can check a report only by its proof: a version reused that only reports
    /// it cannot verify named is measured (a history whose key nobody knew), one it could verify
    /// is a violation.
    #[test]
    fn a_reuse_only_unprovable_reports_named_is_measured_not_failed() {
        let key = rsc::core::proof::ViewKey::from_bytes([3; 32]);
        let run = |proof: Option<ViewProof>| {
            let mut w = World::new();
            let p = w.producer(1);
            let mut g = w.group_with_member("consumer-1", &[0]);
            g.view_key = Some(key);
            g.metadata_version = 12;
            w.store(1_000, &g, 1);
            w.routing_reporting(p, 13, 2_000_000, 2_100_000);
            w.records.routings.last_mut().expect("a call").request.known_version_proof = proof;
            let mut reused = g.clone();
            reused.metadata_version = 13;
            w.store(4_000, &reused, 2);
            let (violations, unprovable) = judge(&w.facts(), &[]);
            (violations.len(), unprovable)
        };
        let group = World::new().group;
        assert_eq!(run(Some(key.prove(&group, Fact::MetadataVersion, 13))), (1, 0), "provable: a violation");
        let other = rsc::core::proof::ViewKey::from_bytes([4; 32]);
        assert_eq!(run(Some(other.prove(&group, Fact::MetadataVersion, 13))), (0, 1), "another key's proof");
        assert_eq!(run(None), (0, 1), "no proof");
    }
}
