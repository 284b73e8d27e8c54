//! [`ReadOrder`]: which of this process's reads may testify that the store lost writes.
//!
//! Owns: per group, the highest revision this process has observed and *when* (in read-issue
//! order) it observed it; a process-wide sequence that numbers every read as it is issued; and the
//! same ordering for the store's server identity.
//! Never: treats a read that was issued *before* a higher revision was observed as evidence. Two
//! requests of one process run concurrently: A's read is issued, B writes revision r+1 and records
//! it, then A's read — which Redis answered before B's write — returns r. That is concurrency, not
//! loss (issue: "concurrent requests are mistaken for lost writes"). Only a read issued after the
//! higher revision was observed must see at least that revision from a store that lost nothing,
//! because Redis executes one command at a time and the observation happened before the issue.
//! Invariant: a mark never goes down except when a regression is reported (the store really went
//! back: from then on, the lower revision is the truth to compare with).
//!
//! A mark also remembers *which* write it saw at its revision (a digest of the record's `writeId`).
//! A silent rollback followed by new writes can bring the record back to the very revision marked,
//! with another history behind it: the same number, another write. A read issued after the mark
//! that returns the marked revision under another `writeId` is evidence too (two writes were
//! stored at one revision, so one of them was lost). Records without a `writeId` are judged by
//! revision alone.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::core::model::GroupId;

/// The position of one read in this process's issue order. Taken *before* the store call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct ReadTicket(u64);

/// The highest revision observed for one group and the sequence number at that moment: reads with
/// a ticket at or above `observed_at` were issued after the observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mark {
    revision: u64,
    observed_at: u64,
    /// The incarnation of the record the revision belongs to ([`GroupMetadata::incarnation`]
    /// (crate::core::model::GroupMetadata::incarnation); `None`: not known).
    incarnation: Option<u64>,
    /// [`write_digest`] of the `writeId` of the write that produced `revision` (0: not known).
    write: u64,
}

/// What a read or a write observed of a record: its revision, its incarnation and the
/// [`write_digest`] of its `writeId` (0: the record has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Observed {
    pub(super) revision: u64,
    pub(super) incarnation: Option<u64>,
    pub(super) write: u64,
}

/// A 64-bit digest of a record's `writeId`, kept in a mark instead of the string (a read on the
/// heartbeat path allocates nothing for it); 0 for a record without one. Process-local: std's
/// `DefaultHasher::new()` has fixed keys, so the digest is the same for the same id all run long.
pub(super) fn write_digest(write_id: &str) -> u64 {
    if write_id.is_empty() {
        return 0;
    }
    let mut hasher = DefaultHasher::new();
    write_id.hash(&mut hasher);
    hasher.finish().max(1)
}

impl Mark {
    /// Whether a record of `incarnation` belongs to a later incarnation of the name than this
    /// mark: created after this mark's was deleted (through another instance), so its revisions
    /// count from 1 again and a lower one is no evidence.
    fn superseded_by(&self, incarnation: Option<u64>) -> bool {
        matches!((self.incarnation, incarnation), (Some(mine), Some(theirs)) if theirs > mine)
    }
}

/// Read-issue ordering for one coordinator process (see the module docs).
#[derive(Debug, Default)]
pub(super) struct ReadOrder {
    next_read: u64,
    marks: BTreeMap<GroupId, Mark>,
    /// The ticket of the read that last set the known server identity.
    identity_ticket: Option<ReadTicket>,
}

/// A read's verdict on the revision it returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RevisionVerdict {
    /// Nothing to report (equal, higher, or a concurrent read that started before a higher mark).
    Consistent,
    /// The read started after `seen` was observed and still returned less: lost writes.
    Regressed { seen: u64 },
}

impl ReadOrder {
    /// Numbers a read about to be issued.
    pub(super) fn begin_read(&mut self) -> ReadTicket {
        let ticket = ReadTicket(self.next_read);
        self.next_read += 1;
        ticket
    }

    /// Judges the revision a read returned. `ignore_order` is the planted bug that compares with
    /// the process-wide mark whatever the read's issue time (the behaviour this module replaced).
    /// A revision of a later incarnation than the mark's (the group was deleted and created again
    /// through other instances) starts a new mark: it is no evidence however low.
    /// A read of the marked revision under another `writeId` (the record was replaced by another
    /// history that reached the same number) is a regression too, reported with `seen` equal to
    /// the revision read.
    pub(super) fn observe_read(
        &mut self,
        group: &GroupId,
        ticket: ReadTicket,
        read: Observed,
        ignore_order: bool,
    ) -> RevisionVerdict {
        let now = self.next_read;
        let fresh =
            Mark { revision: read.revision, observed_at: now, incarnation: read.incarnation, write: read.write };
        let Some(mark) = self.marks.get_mut(group) else {
            self.marks.insert(group.clone(), fresh);
            return RevisionVerdict::Consistent;
        };
        if read.revision > mark.revision || mark.superseded_by(read.incarnation) {
            *mark = fresh;
            return RevisionVerdict::Consistent;
        }
        let issued_after_mark = ticket.0 >= mark.observed_at || ignore_order;
        let replaced = read.revision == mark.revision && read.write != mark.write && read.write != 0 && mark.write != 0;
        if (read.revision < mark.revision || replaced) && issued_after_mark {
            let seen = mark.revision;
            *mark = fresh;
            return RevisionVerdict::Regressed { seen };
        }
        if read.revision == mark.revision && mark.write == 0 {
            // The write behind the mark was not known (a record without a `writeId`): learn it.
            mark.write = read.write;
        }
        RevisionVerdict::Consistent
    }

    /// Records the revision this process just wrote. Never lowers the mark within an incarnation:
    /// a write below it means the store went back, which the next read issued from now on will
    /// report. A write of a later incarnation (a create) starts a new mark.
    pub(super) fn observe_write(&mut self, group: &GroupId, written: Observed) {
        let now = self.next_read;
        let fresh = Mark {
            revision: written.revision,
            observed_at: now,
            incarnation: written.incarnation,
            write: written.write,
        };
        let mark = self.marks.entry(group.clone()).or_insert(fresh);
        if written.revision > mark.revision || mark.superseded_by(written.incarnation) {
            *mark = fresh;
        }
    }

    /// Forgets a group (deleted here, or gone from the index).
    pub(super) fn forget(&mut self, group: &GroupId) {
        self.marks.remove(group);
    }

    /// Keeps only the groups `keep` accepts (bounded memory: groups that left the index).
    pub(super) fn retain(&mut self, keep: impl Fn(&GroupId) -> bool) {
        self.marks.retain(|group, _| keep(group));
    }

    /// The groups with a mark.
    pub(super) fn groups(&self) -> impl Iterator<Item = &GroupId> {
        self.marks.keys()
    }

    /// Whether `group` has a mark.
    pub(super) fn holds(&self, group: &GroupId) -> bool {
        self.marks.contains_key(group)
    }

    /// How many groups have a mark.
    pub(super) fn len(&self) -> usize {
        self.marks.len()
    }

    /// True when an identity read issued at `ticket` is newer than the one that set the known
    /// identity; an older read answered late must not flip the identity back (a false change).
    /// Records `ticket` as the newest when it is.
    pub(super) fn identity_read_is_newest(&mut self, ticket: ReadTicket) -> bool {
        if self.identity_ticket.is_some_and(|newest| ticket < newest) {
            return false;
        }
        self.identity_ticket = Some(ticket);
        true
    }

    #[cfg(test)]
    fn mark(&self, group: &GroupId) -> Option<u64> {
        self.marks.get(group).map(|m| m.revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group() -> GroupId {
        GroupId::new("orders", "billing")
    }

    /// A record at `revision` without a `writeId`.
    fn at(revision: u64, incarnation: Option<u64>) -> Observed {
        Observed { revision, incarnation, write: 0 }
    }

    fn written_by(revision: u64, write_id: &str) -> Observed {
        Observed { revision, incarnation: Some(100), write: write_digest(write_id) }
    }

    /// Hostile review (stop 36): a silent rollback, then new writes that reach the revision this
    /// process last saw. The number alone cannot tell; the `writeId` can.
    #[test]
    fn the_marked_revision_under_another_write_is_evidence() {
        let mut order = ReadOrder::default();
        let g = group();
        order.observe_write(&g, written_by(3, "ca-1"));
        let same = order.begin_read();
        assert_eq!(order.observe_read(&g, same, written_by(3, "ca-1"), false), RevisionVerdict::Consistent);
        let later = order.begin_read();
        assert_eq!(order.observe_read(&g, later, written_by(3, "cc-7"), false), RevisionVerdict::Regressed { seen: 3 });
        // The replacing history is the truth from then on.
        let again = order.begin_read();
        assert_eq!(order.observe_read(&g, again, written_by(3, "cc-7"), false), RevisionVerdict::Consistent);
        // A read issued before the mark was observed is no evidence, as for a lower revision.
        let early = order.begin_read();
        order.observe_write(&g, written_by(4, "ca-2"));
        assert_eq!(order.observe_read(&g, early, written_by(4, "cb-9"), false), RevisionVerdict::Consistent);
    }

    #[test]
    fn records_without_a_write_id_are_judged_by_revision_alone() {
        let mut order = ReadOrder::default();
        let g = group();
        order.observe_write(&g, at(3, None));
        let read = order.begin_read();
        assert_eq!(order.observe_read(&g, read, written_by(3, "cc-7"), false), RevisionVerdict::Consistent);
        // Learnt from that read: another write at 3 is evidence now.
        let later = order.begin_read();
        assert_eq!(order.observe_read(&g, later, written_by(3, "cb-1"), false), RevisionVerdict::Regressed { seen: 3 });
        let unknown = order.begin_read();
        assert_eq!(order.observe_read(&g, unknown, at(3, None), false), RevisionVerdict::Consistent);
        assert_eq!(write_digest(""), 0);
        assert_ne!(write_digest("a"), write_digest("b"));
    }

    #[test]
    fn a_read_issued_before_a_concurrent_write_is_not_evidence() {
        let mut order = ReadOrder::default();
        let g = group();
        let first = order.begin_read();
        assert_eq!(order.observe_read(&g, first, at(5, None), false), RevisionVerdict::Consistent);
        let slow = order.begin_read();
        order.observe_write(&g, at(6, None));
        assert_eq!(order.observe_read(&g, slow, at(5, None), false), RevisionVerdict::Consistent);
        assert_eq!(order.mark(&g), Some(6), "a concurrent lower read never lowers the mark");
    }

    #[test]
    fn a_read_issued_after_the_mark_that_returns_less_is_evidence() {
        let mut order = ReadOrder::default();
        let g = group();
        order.observe_write(&g, at(9, None));
        let later = order.begin_read();
        assert_eq!(order.observe_read(&g, later, at(7, None), false), RevisionVerdict::Regressed { seen: 9 });
        // From then on the lower revision is the truth: the same value again is no new evidence.
        let again = order.begin_read();
        assert_eq!(order.observe_read(&g, again, at(7, None), false), RevisionVerdict::Consistent);
    }

    #[test]
    fn the_planted_process_wide_mark_reports_the_concurrent_read() {
        let mut order = ReadOrder::default();
        let g = group();
        let slow = order.begin_read();
        order.observe_write(&g, at(6, None));
        assert_eq!(order.observe_read(&g, slow, at(5, None), true), RevisionVerdict::Regressed { seen: 6 });
    }

    #[test]
    fn a_higher_read_raises_the_mark_and_orders_later_reads_after_it() {
        let mut order = ReadOrder::default();
        let g = group();
        let a = order.begin_read();
        let b = order.begin_read();
        assert_eq!(order.observe_read(&g, b, at(4, None), false), RevisionVerdict::Consistent);
        // `a` was issued before `b` answered 4: its 3 is concurrency.
        assert_eq!(order.observe_read(&g, a, at(3, None), false), RevisionVerdict::Consistent);
        let c = order.begin_read();
        assert_eq!(order.observe_read(&g, c, at(3, None), false), RevisionVerdict::Regressed { seen: 4 });
    }

    #[test]
    fn an_identity_read_answered_late_does_not_replace_a_newer_one() {
        let mut order = ReadOrder::default();
        let old = order.begin_read();
        let new = order.begin_read();
        assert!(order.identity_read_is_newest(new));
        assert!(!order.identity_read_is_newest(old));
        let newer = order.begin_read();
        assert!(order.identity_read_is_newest(newer));
    }

    #[test]
    fn a_later_incarnation_starts_a_new_mark_and_an_earlier_one_is_judged_as_before() {
        let mut order = ReadOrder::default();
        let g = group();
        order.observe_write(&g, at(9, Some(100)));
        let read = order.begin_read();
        // Deleted and created again elsewhere: revision 2 of incarnation 200 is no regression.
        assert_eq!(order.observe_read(&g, read, at(2, Some(200)), false), RevisionVerdict::Consistent);
        assert_eq!(order.mark(&g), Some(2));
        // A create written here starts over too.
        order.observe_write(&g, at(1, Some(300)));
        assert_eq!(order.mark(&g), Some(1));
        // The store went back to an earlier incarnation's record: judged by revision as before.
        order.observe_write(&g, at(5, Some(300)));
        let later = order.begin_read();
        assert_eq!(order.observe_read(&g, later, at(4, Some(200)), false), RevisionVerdict::Regressed { seen: 5 });
        // A record that does not name its incarnation (an older release's) is judged as before.
        order.observe_write(&g, at(8, Some(300)));
        let last = order.begin_read();
        assert_eq!(order.observe_read(&g, last, at(3, None), false), RevisionVerdict::Regressed { seen: 8 });
    }

    #[test]
    fn forgotten_and_unretained_groups_start_over() {
        let mut order = ReadOrder::default();
        let (g, h) = (group(), GroupId::new("orders", "audit"));
        order.observe_write(&g, at(9, None));
        order.observe_write(&h, at(9, None));
        order.forget(&g);
        order.retain(|x| *x != h);
        let read = order.begin_read();
        assert_eq!(order.observe_read(&g, read, at(1, None), false), RevisionVerdict::Consistent);
        assert_eq!(order.observe_read(&h, read, at(1, None), false), RevisionVerdict::Consistent);
    }
}
