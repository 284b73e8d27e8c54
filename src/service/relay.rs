//! The heard relay: coordinator instances tell a group's tick owner which of its members they
//! heard, so the owner defers the group's ticks without reading it (DESIGN §12).
//!
//! Owns: per tick owner, the heartbeats this process served for groups another instance ticks
//! (member, incarnation, the counter its touch answered, and the record stamp the touch
//! confirmed) and the stamps of its writes to such groups, each until two exchanges stored it;
//! every `heard_relay_ms` one round trip stores what it keeps as one blob per owner (`SET … PX`,
//! [`crate::store::keys::heard_relay_key`]) and reads the blobs the others left for this process
//! (`GET`). Every entry is in two stored blobs, so one blob overwritten before its owner read it
//! loses nothing. A blob applied here restarts the liveness windows of members
//! whose counter it shows above what this process knew
//! ([`LocalView::note_relayed`](crate::core::LocalView::note_relayed)), confirms a deferred
//! group's record when the stamps agree, and ends the deferral when they differ.
//! Never: applies a blob written under another store identity than the one this process holds,
//! or relays a heartbeat whose touch began under another identity than the one it is noted
//! under. Counters repeat values after a failover that lost increments; news from before the
//! failover, applied after this process reset its windows, would date an old value at the blob's
//! arrival, and the same value reached again by a later heartbeat would read as unchanged since
//! then (an expiry up to a heartbeat interval early). So the outgoing entries go when this
//! process sees the identity change, and blobs name the identity they were written under.
//! Nothing is decided from a relay: an expiry needs a read, and a relayed window starts after
//! the heartbeat it reports, so within one identity a relay can only make an expiry later.
//! Lateness: an entry is in the next two blobs stored and a blob lives two periods, so a relayed
//! window starts at most about four periods after the heartbeat while exchanges succeed (plus a
//! pass: exchanges run at pass boundaries).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::time::{Duration, Instant};

use crate::core::model::{GroupId, GroupMetadata, MemberId};
use crate::store::{MetadataStore, RecordStamp, ServerIdentity};

use super::coordinator::Coordinator;
use super::counters::{HEARD_RELAY_BLOBS_SENT, HEARD_RELAY_FAILURES, HEARD_RELAY_WINDOWS_RESTARTED};

/// The blob format's version; a reader ignores a blob of another one.
const BLOB_VERSION: u32 = 1;

/// Per owner, per group: what is to be relayed.
type Outgoing = BTreeMap<String, BTreeMap<GroupId, HeardGroup>>;

/// What one process relays and has applied.
#[derive(Debug, Default)]
pub(super) struct Relay {
    /// Per tick owner, the groups this process heard heartbeats of (or wrote) that two stored
    /// blobs did not carry yet.
    outgoing: Outgoing,
    /// Counts notes: an entry's `noted` is the count when it was last noted.
    notes: u64,
    /// Drawn once per process: a restarted instance's sequence starts again under a new nonce.
    nonce: u64,
    seq: u64,
    /// Per sender, the nonce and sequence number of the last blob applied.
    applied: BTreeMap<String, (u64, u64)>,
    /// When the next exchange is due (`None`: at the next pass).
    next_at: Option<Instant>,
}

impl Relay {
    pub(super) fn new(nonce: u64) -> Self {
        Self { nonce, ..Self::default() }
    }

    /// Groups in the outgoing blobs (bounded by the groups heard or written since the last two
    /// exchanges that succeeded, and by the groups: one entry per group and member).
    pub(super) fn pending(&self) -> usize {
        self.outgoing.values().map(BTreeMap::len).sum()
    }

    /// Drops what this process was to relay of groups `keep` rejects (deleted groups).
    pub(super) fn retain(&mut self, keep: impl Fn(&GroupId) -> bool) {
        for groups in self.outgoing.values_mut() {
            groups.retain(|group, _| keep(group));
        }
        self.outgoing.retain(|_, groups| !groups.is_empty());
    }

    /// Records a heartbeat this process served for a group `owner` ticks (`member`: `None` for
    /// a write through this process, which relays only the new stamp), at `now`.
    fn note(&mut self, owner: &str, g: &GroupMetadata, stamp: &RecordStamp, member: Option<(&str, u64)>) {
        self.notes += 1;
        let noted = self.notes;
        let heard = self.outgoing.entry(owner.to_string()).or_default();
        let entry = heard.entry(g.group.clone()).or_insert_with(|| HeardGroup {
            group: g.group.clone(),
            stamp: stamp.clone(),
            members: BTreeMap::new(),
            noted: Noted { at: noted, stored: 0 },
            written: None,
        });
        if stamp.revision >= entry.stamp.revision && *stamp != entry.stamp {
            // The latest record seen here (a heartbeat answered from a read that began before a
            // write may be noted after it). Member entries of an older record still describe
            // heartbeats the owner may use.
            entry.stamp = stamp.clone();
            entry.noted = Noted { at: noted, stored: 0 };
        }
        let Some((member, liveness)) = member else {
            entry.written = Some(Noted { at: noted, stored: 0 });
            return;
        };
        let Some(record) = g.members.get(member) else { return };
        let noted = Noted { at: noted, stored: 0 };
        let heard = HeardMember { incarnation: record.incarnation_epoch, liveness, noted };
        entry.members.insert(member.to_string(), heard);
    }

    /// Whether a write through this process to `group` is still being relayed to its owner:
    /// until two stored blobs carried it, this process keeps ticking the group (the owner may
    /// have deferred it on the record the write replaced).
    pub(super) fn holds_write(&self, group: &GroupId) -> bool {
        self.outgoing.values().any(|groups| groups.get(group).is_some_and(|g| g.written.is_some()))
    }

    /// Forgets everything to relay (the store identity changed: it was heard under the old one).
    pub(super) fn clear_outgoing(&mut self) {
        self.outgoing.clear();
    }

    /// The outgoing blobs for the owners in `live`, one each, written under `identity`, and the
    /// note count they carry up to (for [`stored`](Self::stored)). What this process heard for
    /// owners no longer live is dropped (the next owner of those groups reads them: it ticks a
    /// group it just took over).
    fn blobs(&mut self, live: &[String], identity: &str) -> (Vec<(String, String)>, u64) {
        self.outgoing.retain(|owner, _| live.contains(owner));
        let mut blobs = Vec::with_capacity(self.outgoing.len());
        for (owner, groups) in &self.outgoing {
            self.seq += 1;
            let groups = groups.values().cloned().collect();
            let blob =
                HeardBlob { v: BLOB_VERSION, nonce: self.nonce, seq: self.seq, identity: identity.to_string(), groups };
            match serde_json::to_string(&blob) {
                Ok(text) => blobs.push((owner.clone(), text)),
                Err(error) => tracing::warn!(%error, "heard relay: blob not encoded"),
            }
        }
        (blobs, self.notes)
    }

    /// The store took blobs carrying every note up to `upto`: entries two stored blobs carried
    /// leave (a write's entry with them: its owner has had two periods' chances to read it).
    fn stored(&mut self, upto: u64) {
        let done = |noted: &mut Noted| {
            if noted.at <= upto {
                noted.stored = noted.stored.saturating_add(1);
            }
            noted.stored >= 2
        };
        for groups in self.outgoing.values_mut() {
            for entry in groups.values_mut() {
                entry.members.retain(|_, m| !done(&mut m.noted));
                done(&mut entry.noted);
                if entry.written.as_mut().is_some_and(done) {
                    entry.written = None;
                }
            }
            groups.retain(|_, g| !g.members.is_empty() || g.noted.stored < 2 || g.written.is_some());
        }
        self.outgoing.retain(|_, groups| !groups.is_empty());
    }

    /// Decodes a blob `sender` left; `None` when it does not parse, is of another version, or is
    /// not newer than the last one applied from that sender.
    fn accept(&mut self, sender: &str, text: &str, identity: &str) -> Option<HeardBlob> {
        let blob: HeardBlob = serde_json::from_str(text).ok().filter(|b: &HeardBlob| b.v == BLOB_VERSION)?;
        if blob.identity != identity {
            return None;
        }
        let newer = match self.applied.get(sender) {
            Some((nonce, seq)) => *nonce != blob.nonce || *seq < blob.seq,
            None => true,
        };
        if !newer {
            return None;
        }
        self.applied.insert(sender.to_string(), (blob.nonce, blob.seq));
        Some(blob)
    }

    /// Forgets the senders not in `live` (their next blob, if any, applies as a first one).
    fn forget_senders(&mut self, live: &[String]) {
        self.applied.retain(|sender, _| live.iter().any(|l| l == sender));
    }
}

/// One sender's blob for one owner.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeardBlob {
    v: u32,
    nonce: u64,
    seq: u64,
    /// [`identity_label`] of the store identity the sender held when it wrote the blob.
    identity: String,
    groups: Vec<HeardGroup>,
}

/// The heartbeats heard for one group.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeardGroup {
    group: GroupId,
    /// The record stamp the latest of these heartbeats found at Redis.
    stamp: RecordStamp,
    members: BTreeMap<MemberId, HeardMember>,
    /// When the stamp was last noted, and how many stored blobs carried it since (the sender's
    /// bookkeeping, not relayed).
    #[serde(skip)]
    noted: Noted,
    /// When a write through the sender was noted, until two stored blobs carried it (the
    /// sender's bookkeeping).
    #[serde(skip)]
    written: Option<Noted>,
}

/// When an entry was noted (the note count) and how many stored blobs carried it since.
#[derive(Clone, Copy, Debug, Default)]
struct Noted {
    at: u64,
    stored: u8,
}

/// One member's latest heartbeat heard.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeardMember {
    incarnation: u64,
    liveness: u64,
    /// The sender's bookkeeping, not relayed.
    #[serde(skip)]
    noted: Noted,
}

/// A short label of a store identity (its run and replication ids, which on a Cluster name every
/// primary): blobs written under one apply only under the same.
pub(super) fn identity_label(identity: &ServerIdentity) -> String {
    let mut hash = Sha256::new();
    for part in [identity.run_id.as_str(), identity.replication_id.as_str()] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    base16ct::lower::encode_string(&hash.finalize()[..8])
}

impl<S: MetadataStore> Coordinator<S> {
    /// Whether this process relays heartbeats and applies relays (tick sharing and the deferral
    /// renewal on, and a relay period set).
    fn relays(&self) -> bool {
        let options = &self.inner.options;
        options.ticker_silence_ms > 0 && options.heard_relay_ms > 0 && options.renew_deferrals_from_heartbeats
    }

    /// Notes a heartbeat this process served (its touch answered `liveness` and found the record
    /// at `stamp`) for relaying, when another live instance ticks the group. `generation`: the
    /// store identity generation when the heartbeat's touch began; a heartbeat that straddled an
    /// identity change is not relayed (its touch may have run on the old primary).
    pub(super) fn relay_heartbeat(
        &self,
        g: &GroupMetadata,
        stamp: &RecordStamp,
        member: &str,
        liveness: u64,
        generation: u64,
    ) {
        if liveness > 0 {
            self.relay(g, stamp, Some((member, liveness)), Some(generation));
        }
    }

    /// Notes a write through this process for relaying, when another live instance ticks the
    /// group: its owner may have deferred the group on the record this write replaced (a member
    /// joined here, say), and the new stamp makes it read the group at its next exchange. This
    /// process ticks the group itself meanwhile (it is dirty here), until the write was relayed
    /// for two periods.
    pub(super) fn relay_write(&self, g: &GroupMetadata, stamp: &RecordStamp) {
        self.relay(g, stamp, None, None);
    }

    fn relay(&self, g: &GroupMetadata, stamp: &RecordStamp, member: Option<(&str, u64)>, generation: Option<u64>) {
        if !self.relays() {
            return;
        }
        let me = &self.inner.options.instance_id;
        let mut local = self.local();
        if generation.is_some_and(|generation| generation != local.identity_generation()) {
            return;
        }
        let Some(owner) = local.roster.owner(&g.group).filter(|owner| owner != me).map(str::to_string) else {
            return;
        };
        local.relay.note(&owner, g, stamp, member);
    }

    /// The relay exchange of this pass, when due: stores what this process heard for each other
    /// live instance and applies what they left for it. Nothing is relayed or applied before this
    /// process knows the store identity. A failed exchange loses nothing to relay (entries stay
    /// two periods); the blobs it would have read are read at the next one, if still there.
    pub(super) async fn exchange_relays(&self) {
        if !self.relays() {
            return;
        }
        let period = Duration::from_millis(self.inner.options.heard_relay_ms);
        let now = Instant::now();
        let me = self.inner.options.instance_id.clone();
        let (outgoing, senders, identity) = {
            let mut local = self.local();
            if local.relay.next_at.is_some_and(|at| now < at) {
                return;
            }
            let Some(identity) = local.identity_label() else { return };
            // On a fixed schedule (not a period after this pass, which would drift by up to a
            // pass each time), and never more than a period behind it.
            let next = local.relay.next_at.map_or(now, |at| at + period);
            local.relay.next_at = Some(if next <= now { now + period } else { next });
            let live: Vec<String> = local.roster.live().to_vec();
            local.relay.forget_senders(&live);
            let outgoing = local.relay.blobs(&live, &identity);
            let senders: Vec<String> = live.into_iter().filter(|i| *i != me).collect();
            (outgoing, senders, identity)
        };
        let (outgoing, upto) = outgoing;
        if outgoing.is_empty() && senders.is_empty() {
            return;
        }
        let ttl_ms = self.inner.options.heard_relay_ms.saturating_mul(2);
        let blobs = match self.inner.store.exchange_heard(&me, &outgoing, ttl_ms, &senders).await {
            Ok(blobs) => blobs,
            Err(e) => {
                self.inner.metrics.count(&HEARD_RELAY_FAILURES, vec![]);
                self.store_error(e);
                return;
            }
        };
        self.local().relay.stored(upto);
        if !outgoing.is_empty() {
            self.inner.metrics.count_by(&HEARD_RELAY_BLOBS_SENT, vec![], outgoing.len() as f64);
        }
        for (sender, blob) in senders.iter().zip(blobs) {
            if let Some(text) = blob {
                self.apply_relay(sender, &text, &identity);
            }
        }
    }

    /// Applies one blob `sender` left for this process (see the module doc).
    fn apply_relay(&self, sender: &str, text: &str, identity: &str) {
        let Some(blob) = self.local().relay.accept(sender, text, identity) else { return };
        let now_ms = self.now_ms();
        let now = Instant::now();
        let mut restarted = 0u64;
        for heard in blob.groups {
            let mut local = self.local();
            if local.identity_label().as_deref() != Some(identity) {
                // The identity changed during the exchange: what remains was heard under the old.
                return;
            }
            let deferred_on = local.deferred.get(&heard.group).map(|d| d.confirmed_stamp.as_ref());
            if deferred_on.is_some_and(|stamp| stamp != Some(&heard.stamp)) {
                // The sender found another record than the one this process deferred the group
                // on (a member joined there, say): tick it next pass.
                local.deferred.remove(&heard.group);
                continue;
            }
            let Some(cached) = self.inner.cache.get(&heard.group).filter(|c| c.stamp == heard.stamp) else { continue };
            for (member, m) in &heard.members {
                if local.view.note_relayed(now_ms, &cached.metadata, member, m.incarnation, m.liveness) {
                    restarted += 1;
                }
            }
            if let Some(d) = local.deferred.get_mut(&heard.group) {
                if d.confirmed_stamp.as_ref() == Some(&heard.stamp) {
                    d.confirmed = now;
                }
            }
        }
        self.inner.metrics.count_by(&HEARD_RELAY_WINDOWS_RESTARTED, vec![], restarted as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::{GroupConfig, Member, MemberState};

    fn group_with_member() -> GroupMetadata {
        let mut g = GroupMetadata::new(GroupId::new("s", "g"), 4, GroupConfig::default());
        let member = Member {
            member_epoch: 1,
            incarnation_epoch: 1,
            state: MemberState::Active,
            joined_at_version: 1,
            session: None,
        };
        g.members.insert("a".into(), member);
        g
    }

    fn stamp(revision: u64) -> RecordStamp {
        RecordStamp { revision, write_id: format!("w{revision}"), schema_version: 1, layout_version: 1 }
    }

    fn decoded(blob: &str) -> HeardBlob {
        serde_json::from_str(blob).expect("a blob decodes")
    }

    #[test]
    fn an_entry_is_in_two_stored_blobs_and_a_write_is_held_until_then() {
        let g = group_with_member();
        let live = vec!["owner".to_string(), "me".to_string()];
        let mut relay = Relay::new(7);
        relay.note("owner", &g, &stamp(3), None);
        relay.note("owner", &g, &stamp(3), Some(("a", 5)));
        assert!(relay.holds_write(&g.group));
        // An exchange that failed stores nothing: the entries stay whole.
        let (blobs, _) = relay.blobs(&live, "id");
        assert_eq!(blobs.len(), 1);
        let (blobs, upto) = relay.blobs(&live, "id");
        let blob = decoded(&blobs[0].1);
        assert_eq!((blob.nonce, blob.identity.as_str(), blob.groups[0].members["a"].liveness), (7, "id", 5));
        relay.stored(upto);
        assert!(relay.holds_write(&g.group), "stored once");
        // A heartbeat noted after this blob was taken is carried by the next two, whatever the
        // older entries do.
        let (_, upto) = relay.blobs(&live, "id");
        relay.note("owner", &g, &stamp(3), Some(("a", 6)));
        relay.stored(upto);
        assert!(!relay.holds_write(&g.group), "stored twice: the owner had its chances");
        let (blobs, upto) = relay.blobs(&live, "id");
        assert_eq!(decoded(&blobs[0].1).groups[0].members["a"].liveness, 6);
        relay.stored(upto);
        let (_, upto) = relay.blobs(&live, "id");
        relay.stored(upto);
        assert_eq!(relay.pending(), 0, "everything was stored twice");
        assert!(relay.blobs(&live, "id").0.is_empty());
    }

    #[test]
    fn blobs_apply_once_in_order_and_only_under_the_same_identity() {
        let g = group_with_member();
        let live = vec!["owner".to_string()];
        let mut sender = Relay::new(1);
        sender.note("owner", &g, &stamp(3), Some(("a", 5)));
        let first = sender.blobs(&live, "id").0.remove(0).1;
        let second = sender.blobs(&live, "id").0.remove(0).1;
        let mut owner = Relay::new(2);
        assert!(owner.accept("sender", &first, "other-id").is_none(), "another identity");
        assert!(owner.accept("sender", &second, "id").is_some());
        assert!(owner.accept("sender", &second, "id").is_none(), "read twice");
        assert!(owner.accept("sender", &first, "id").is_none(), "older");
        assert!(owner.accept("sender", "not json", "id").is_none());
        // A restarted sender (another nonce) starts a new sequence.
        let mut restarted = Relay::new(3);
        restarted.note("owner", &g, &stamp(3), Some(("a", 7)));
        let third = restarted.blobs(&live, "id").0.remove(0).1;
        assert!(owner.accept("sender", &third, "id").is_some());
    }

    #[test]
    fn an_identity_change_drops_everything_heard_and_owners_not_live_get_nothing() {
        let g = group_with_member();
        let mut relay = Relay::new(1);
        relay.note("owner", &g, &stamp(3), Some(("a", 5)));
        relay.note("gone", &g, &stamp(3), Some(("a", 5)));
        let (blobs, _) = relay.blobs(&["owner".to_string()], "id");
        assert_eq!(blobs.iter().map(|(o, _)| o.as_str()).collect::<Vec<_>>(), vec!["owner"]);
        relay.clear_outgoing();
        assert!(relay.blobs(&["owner".to_string()], "id").0.is_empty());
    }
}
