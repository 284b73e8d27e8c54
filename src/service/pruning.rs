//! Bounded memory: what one coordinator process forgets when a group leaves.
//!
//! Owns the rule for the process-local per-group state (observation windows and the longest lease
//! seen, revision marks, recorded-evidence generations, pending regressions, the decoded cache and
//! every `/metrics` series labelled with the group): it is forgotten when this process deletes the
//! group, and when the group is found absent — no metadata key *and* no index entry, the state an
//! admin delete through any instance leaves. The per-group monitors leave on their own
//! ([`super::monitors`]).
//! Never: forgets the state of a group whose index entry remains while its metadata key is gone
//! (`METADATA_MISSING`). That group is known to have existed and may be recreated, which starts a
//! correction round whose wait must last the longest lease this process saw recorded for it
//! (DESIGN §7, "A lease increase lost in a rollback"); its state stays, bounded by the index.
//! A group absent from both is indistinguishable, for every request, from a deleted one. Only its
//! name is kept, and when it vanished (`LocalState::vanished`, bounded in count and time), if
//! this process held it and did not delete it itself: a store that lost the record *and* the
//! index entry leaves the same state as a delete through another instance, and a create of the
//! name is then a recreate — a correction round, and the lost record's view key (kept in the
//! `vanished` entry), so the lost incarnation's proofs still verify (DESIGN §8). A delete through
//! another instance followed by a create of the same name pays that round too.
//! Invariant: after [`Coordinator::forget_group`], no per-group map of this process names the
//! group but `vanished`.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::model::{GroupId, GroupMetadata};
use crate::core::proof::ViewKey;
use crate::core::protocol::{ApiError, ErrorCode};
use crate::store::keys::parse_index_entry;
use crate::store::MetadataStore;
use tokio::time::{Duration, Instant};

use super::coordinator::Coordinator;

/// The counter that stays when a group is found absent rather than deleted: it is the operator's
/// signal that clients still use a group whose metadata is gone, and forgetting it at every tick
/// would reset it under their alerts.
const MISSING_TOTAL: &str = "rsc_metadata_missing_total";

/// Why a group is forgotten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Forget {
    /// This process deleted it (admin delete, or the planted delete of an emptied group).
    Deleted,
    /// Its metadata key and index entry are both gone (deleted through another instance).
    FoundAbsent,
}

/// How many entries the per-group structures of one coordinator process hold (tests, soak runs).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalSizes {
    /// Per-group monitors (only while a critical section holds or waits for one).
    pub monitors: usize,
    /// Decoded-cache entries.
    pub cache: usize,
    /// Groups with observation windows or a longest lease seen.
    pub view: usize,
    /// Groups with a revision mark.
    pub marks: usize,
    /// Groups whose last view key is remembered (`LocalState::view_keys`).
    pub view_keys: usize,
    /// Groups that recorded evidence in the current identity generation.
    pub evidence_recorded: usize,
    /// Groups with a regression still to record.
    pub regressed: usize,
    /// Indexed groups the last tick found without a metadata key.
    pub missing_at_tick: usize,
    /// Groups whose ticks are deferred, written since they were idle, or whose refused sessions
    /// were re-read (the ticker's and the session re-check's per-group state).
    pub tick_state: usize,
    /// `/metrics` series with a `group` label.
    pub group_series: usize,
}

impl LocalSizes {
    /// The sum over every structure.
    pub fn total(&self) -> usize {
        self.monitors
            + self.cache
            + self.view
            + self.marks
            + self.view_keys
            + self.evidence_recorded
            + self.regressed
            + self.missing_at_tick
            + self.tick_state
            + self.group_series
    }
}

impl<S: MetadataStore> Coordinator<S> {
    /// Forgets everything this process holds about `group` (see the module docs for when).
    pub(super) fn forget_group(&self, group: &GroupId, why: Forget) {
        self.inner.cache.forget(group);
        {
            let mut local = self.local();
            let view_key = local.view_keys.remove(group);
            if matches!(why, Forget::FoundAbsent) && local.view.holds(group) {
                remember_vanished(&mut local.vanished, group, Instant::now(), view_key);
            }
            local.view.forget(group);
            local.reads.forget(group);
            local.evidence_recorded.remove(group);
            local.regressed.remove(group);
            local.missing_at_tick.remove(group);
            local.deferred.remove(group);
            local.dirty.remove(group);
            local.session_rechecked.remove(group);
            local.gauges_exported.remove(group);
            local.relay.retain(|g| g != group);
            local.heard_unlisted.remove(group);
            local.incompatible_logged.remove(group);
        }
        let except: &[&str] = match why {
            Forget::Deleted => &[],
            Forget::FoundAbsent => &[MISSING_TOTAL],
        };
        self.inner.metrics.forget_labelled("group", &group.to_string(), except);
    }

    /// [`forget_group`](Self::forget_group) for a group reported `GROUP_NOT_FOUND`, when this
    /// process holds state for it: a look-up per map, so requests naming groups that never existed
    /// cost no walk over the metrics (series only the tick left behind go at the next sweep).
    pub(super) fn forget_if_held(&self, group: &GroupId) {
        let held = {
            let local = self.local();
            local.view.holds(group)
                || local.reads.holds(group)
                || local.evidence_recorded.contains_key(group)
                || local.regressed.contains_key(group)
                || local.missing_at_tick.contains(group)
                || local.view_keys.contains_key(group)
        };
        if held || self.inner.cache.get(group).is_some() {
            self.forget_group(group, Forget::FoundAbsent);
        }
    }

    /// Every group some per-group map of this process names, `/metrics` series included (a tick
    /// that read the group just before its delete may export its gauges after it was forgotten).
    fn locally_known_groups(&self) -> BTreeSet<GroupId> {
        let mut groups = {
            let local = self.local();
            let mut groups = local.view.groups();
            groups.extend(local.reads.groups().cloned());
            groups.extend(local.evidence_recorded.keys().cloned());
            groups.extend(local.regressed.keys().cloned());
            groups.extend(local.missing_at_tick.iter().cloned());
            groups.extend(local.view_keys.keys().cloned());
            groups
        };
        let labelled = self.inner.metrics.label_values("group", &[MISSING_TOTAL]);
        groups.extend(labelled.iter().filter_map(|label| parse_index_entry(label)));
        groups
    }

    /// A tick's sweep: a group this process holds state for that left the index (deleted through
    /// another instance) is forgotten once a read confirms its metadata key is gone too. A group
    /// whose key is still there (its index entry was lost) keeps its state; a failed read decides
    /// nothing until the next tick.
    pub(super) async fn forget_unindexed_absent_groups(&self, indexed: &BTreeSet<&GroupId>) {
        let stale: Vec<GroupId> =
            self.locally_known_groups().into_iter().filter(|group| !indexed.contains(group)).collect();
        for group in stale {
            match self.inner.store.load(&group).await {
                Ok(None) => self.forget_group(&group, Forget::FoundAbsent),
                Ok(Some(_)) => {}
                Err(e) => {
                    self.store_error(e);
                    return;
                }
            }
        }
    }

    /// A tick found `group` listed in the index but without a metadata key. An admin delete
    /// leaves exactly that state for a moment (the key goes first, then the index entry, in two
    /// commands), so only a second tick in a row that finds it so counts it as missing
    /// (`rsc_metadata_missing_total`, whose increase pages the operator); a delete meanwhile
    /// takes the group out of the index, and the next tick's sweep forgets it.
    pub(super) async fn missing_at_tick(&self, group: &GroupId) -> ApiError {
        let first = self.local().missing_at_tick.insert(group.clone());
        if !first {
            // Asks the index again: a group deleted since is forgotten (GROUP_NOT_FOUND).
            return self.missing(group, false).await;
        }
        self.inner.cache.forget(group);
        ApiError::new(ErrorCode::MetadataMissing, format!("metadata of group {group} is missing; failing closed"))
    }

    /// The sizes of this process's per-group structures.
    #[doc(hidden)]
    pub fn debug_sizes(&self) -> LocalSizes {
        let (view, marks, evidence_recorded, regressed, missing_at_tick, tick_state, view_keys) = {
            let local = self.local();
            let view = local.view.groups().len();
            let tick_state = local.deferred.len()
                + local.dirty.len()
                + local.session_rechecked.len()
                + local.gauges_exported.len()
                + local.relay.pending();
            let counts = (local.reads.len(), local.evidence_recorded.len(), local.regressed.len());
            (view, counts.0, counts.1, counts.2, local.missing_at_tick.len(), tick_state, local.view_keys.len())
        };
        LocalSizes {
            monitors: self.inner.monitors.len(),
            cache: self.inner.cache.len(),
            view,
            marks,
            view_keys,
            evidence_recorded,
            regressed,
            missing_at_tick,
            tick_state,
            group_series: self.inner.metrics.labelled_series("group"),
        }
    }
}

/// How long a process remembers a group it held that vanished (`LocalState::vanished`).
pub(super) const VANISHED_MEMORY: Duration = Duration::from_secs(3_600);
/// At most this many vanished groups are remembered (the oldest go first).
pub(super) const VANISHED_MAX: usize = 4_096;

/// A group this process held that vanished (`LocalState::vanished`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Vanished {
    /// When this process found it gone.
    pub(super) at: Instant,
    /// The view key of its last record this process saw, if any: a recreate keeps it.
    pub(super) view_key: Option<ViewKey>,
}

/// Records that `group` vanished at `now`, forgetting entries older than [`VANISHED_MEMORY`] and
/// the oldest beyond [`VANISHED_MAX`].
fn remember_vanished(
    vanished: &mut BTreeMap<GroupId, Vanished>,
    group: &GroupId,
    now: Instant,
    view_key: Option<ViewKey>,
) {
    vanished.retain(|_, v| now.saturating_duration_since(v.at) < VANISHED_MEMORY);
    vanished.insert(group.clone(), Vanished { at: now, view_key });
    while vanished.len() > VANISHED_MAX {
        let Some(oldest) = vanished.iter().min_by_key(|(_, v)| v.at).map(|(g, _)| g.clone()) else { break };
        vanished.remove(&oldest);
    }
}

impl<S: MetadataStore> Coordinator<S> {
    /// Whether this process held `group` and found it gone, without deleting it itself, within
    /// [`VANISHED_MEMORY`], or still holds it: a create of it is then a recreate (a create of a
    /// group whose record exists is refused whatever this says).
    pub(super) fn vanished_here(&self, group: &GroupId) -> bool {
        let local = self.local();
        local.vanished.get(group).is_some_and(|v| v.at.elapsed() < VANISHED_MEMORY)
            // Held, and not deleted here (a delete forgets it): if its record is gone, it vanished
            // before a tick's sweep noticed (the sweep reads the index only every refresh period).
            || local.view.holds(group)
    }

    /// The view key of `group`'s last record this process saw, while it holds the group or
    /// remembers it vanished: what a recreate keeps (DESIGN §8).
    pub(super) fn remembered_view_key(&self, group: &GroupId) -> Option<ViewKey> {
        let local = self.local();
        local
            .view_keys
            .get(group)
            .copied()
            .or_else(|| local.vanished.get(group).filter(|v| v.at.elapsed() < VANISHED_MEMORY).and_then(|v| v.view_key))
    }

    /// Remembers the view key of a record of `group` this process decoded or wrote. A record
    /// without one (an older release's rewrite) leaves the last key seen.
    pub(super) fn note_view_key(&self, group: &GroupId, metadata: &GroupMetadata) {
        if let Some(key) = metadata.view_key {
            let mut local = self.local();
            if local.view_keys.get(group) != Some(&key) {
                local.view_keys.insert(group.clone(), key);
            }
        }
    }
}
