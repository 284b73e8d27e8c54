//! The heard relay: coordinator instances tell a group's tick owner which of its members they
//! heard, so the owner defers the group's ticks without reading it (DESIGN §12).
//!
//! Owns: per tick owner, the heartbeats this process served for groups another instance ticks
//! (member, incarnation, the counter its touch answered, and the record stamp the touch
//! confirmed); every `heard_relay_ms` one round trip stores that as one blob per owner
//! (`SET … PX`, [`crate::store::keys::heard_relay_key`]) and reads the blobs the others left for
//! this process (`GET`). A blob applied here restarts the liveness windows of members whose counter
//! it shows above what this process knew ([`LocalView::note_relayed`](crate::core::LocalView::note_relayed)),
//! confirms a deferred group's record when the stamps agree, and ends the deferral when they differ
//! (the record moved on: read it).
//! Never: decides anything. An expiry is decided from a read of the liveness counters, as always;
//! a relay can only postpone the next read, and windows restarted by it start when the blob was
//! read here, after the heartbeat it reports, so a relayed member can only expire later.
//! Invariant: a sender's blobs apply in the order it wrote them (a per-process nonce and a
//! sequence number): a blob read twice, or an older one a failover brought back, is ignored.
//! Lateness: a sender relays only what it heard since its previous exchange, and a blob lives
//! `2 × heard_relay_ms`, so a relayed window starts at most about three relay periods after the
//! heartbeat it reports: that much later than a heartbeat through the owner would have started it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tokio::time::{Duration, Instant};

use crate::core::model::{GroupId, GroupMetadata, MemberId};
use crate::store::{MetadataStore, RecordStamp};

use super::coordinator::Coordinator;

/// The blob format's version; a reader ignores a blob of another one.
const BLOB_VERSION: u32 = 1;

/// Per owner, per group: what is to be relayed.
type Outgoing = BTreeMap<String, BTreeMap<GroupId, HeardGroup>>;

/// What one process relays and has applied.
#[derive(Debug, Default)]
pub(super) struct Relay {
    /// Per tick owner, the groups this process heard heartbeats of since its last exchange.
    outgoing: Outgoing,
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

    /// Groups waiting in the outgoing blobs (bounded by the groups heard within one relay period).
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
    /// a write through this process, which relays only the new stamp).
    fn note(&mut self, owner: &str, g: &GroupMetadata, stamp: &RecordStamp, member: Option<(&str, u64)>) {
        let heard = self.outgoing.entry(owner.to_string()).or_default();
        let entry = heard.entry(g.group.clone()).or_insert_with(|| HeardGroup {
            group: g.group.clone(),
            stamp: stamp.clone(),
            members: BTreeMap::new(),
            written: false,
        });
        entry.written |= member.is_none();
        if stamp.revision >= entry.stamp.revision {
            // The latest record seen here (a heartbeat answered from a read that began before a
            // write may be noted after it). Member entries of an older record still describe
            // heartbeats the owner may use.
            entry.stamp = stamp.clone();
        }
        let Some((member, liveness)) = member else { return };
        let Some(record) = g.members.get(member) else { return };
        let heard = HeardMember { incarnation: record.incarnation_epoch, liveness };
        entry.members.insert(member.to_string(), heard);
    }

    /// Whether a write through this process to `group` waits to be relayed to its owner: until
    /// it is, this process keeps ticking the group (the owner may have deferred it on the record
    /// the write replaced).
    pub(super) fn holds_write(&self, group: &GroupId) -> bool {
        self.outgoing.values().any(|groups| groups.get(group).is_some_and(|g| g.written))
    }

    /// The outgoing blobs for the owners in `live`, one each. What this process heard for other
    /// owners is dropped (the next owner of those groups reads them: it ticks a group it just
    /// took over); the map it was taken from is kept aside until the store took the blobs.
    fn take_outgoing(&mut self, live: &[String]) -> (Vec<(String, String)>, Outgoing) {
        let mut outgoing = std::mem::take(&mut self.outgoing);
        outgoing.retain(|owner, _| live.contains(owner));
        let mut blobs = Vec::with_capacity(outgoing.len());
        for (owner, groups) in &outgoing {
            self.seq += 1;
            let groups = groups.values().cloned().collect();
            let blob = HeardBlob { v: BLOB_VERSION, nonce: self.nonce, seq: self.seq, groups };
            match serde_json::to_string(&blob) {
                Ok(text) => blobs.push((owner.clone(), text)),
                Err(error) => tracing::warn!(%error, "heard relay: blob not encoded"),
            }
        }
        (blobs, outgoing)
    }

    /// Puts back what an exchange the store failed carried, under what was heard since (newer
    /// entries win; an older member entry the owner would ignore anyway).
    fn restore(&mut self, unsent: Outgoing) {
        for (owner, groups) in unsent {
            let heard = self.outgoing.entry(owner).or_default();
            for (group, old) in groups {
                match heard.get_mut(&group) {
                    Some(new) => {
                        new.written |= old.written;
                        for (member, m) in old.members {
                            new.members.entry(member).or_insert(m);
                        }
                    }
                    None => {
                        heard.insert(group, old);
                    }
                }
            }
        }
    }

    /// Decodes a blob `sender` left; `None` when it does not parse, is of another version, or is
    /// not newer than the last one applied from that sender.
    fn accept(&mut self, sender: &str, text: &str) -> Option<HeardBlob> {
        let blob: HeardBlob = serde_json::from_str(text).ok().filter(|b: &HeardBlob| b.v == BLOB_VERSION)?;
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
    /// A write through this process made the stamp (not relayed: the sender's bookkeeping).
    #[serde(skip)]
    written: bool,
}

/// One member's latest heartbeat heard.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeardMember {
    incarnation: u64,
    liveness: u64,
}

impl<S: MetadataStore> Coordinator<S> {
    /// Whether this process relays heartbeats and applies relays (tick sharing and the deferral
    /// renewal on, and a relay period set).
    fn relays(&self) -> bool {
        let options = &self.inner.options;
        options.ticker_silence_ms > 0 && options.heard_relay_ms > 0 && options.renew_deferrals_from_heartbeats
    }

    /// Notes a heartbeat this process served (its touch answered `liveness` and found the record
    /// at `stamp`) for relaying, when another live instance ticks the group.
    pub(super) fn relay_heartbeat(&self, g: &GroupMetadata, stamp: &RecordStamp, member: &str, liveness: u64) {
        if liveness > 0 {
            self.relay(g, stamp, Some((member, liveness)));
        }
    }

    /// Notes a write through this process for relaying, when another live instance ticks the
    /// group: its owner may have deferred the group on the record this write replaced (a member
    /// joined here, say), and the new stamp makes it read the group at its next exchange. This
    /// process ticks the group itself meanwhile (it is dirty here), until it finds it idle.
    pub(super) fn relay_write(&self, g: &GroupMetadata, stamp: &RecordStamp) {
        self.relay(g, stamp, None);
    }

    fn relay(&self, g: &GroupMetadata, stamp: &RecordStamp, member: Option<(&str, u64)>) {
        if !self.relays() {
            return;
        }
        let me = &self.inner.options.instance_id;
        let mut local = self.local();
        let Some(owner) = local.roster.owner(&g.group).filter(|owner| owner != me).map(str::to_string) else {
            return;
        };
        local.relay.note(&owner, g, stamp, member);
    }

    /// The relay exchange of this pass, when due: stores what this process heard for each other
    /// live instance and applies what they left for it. A failed exchange drops what it carried
    /// (the owners read instead).
    pub(super) async fn exchange_relays(&self) {
        if !self.relays() {
            return;
        }
        let period = Duration::from_millis(self.inner.options.heard_relay_ms);
        let now = Instant::now();
        let me = self.inner.options.instance_id.clone();
        let (outgoing, senders) = {
            let mut local = self.local();
            if local.relay.next_at.is_some_and(|at| now < at) {
                return;
            }
            // On a fixed schedule (not a period after this pass, which would drift by up to a
            // pass each time), and never more than a period behind it.
            let next = local.relay.next_at.map_or(now, |at| at + period);
            local.relay.next_at = Some(if next <= now { now + period } else { next });
            let live: Vec<String> = local.roster.live().to_vec();
            local.relay.forget_senders(&live);
            let outgoing = local.relay.take_outgoing(&live);
            let senders: Vec<String> = live.into_iter().filter(|i| *i != me).collect();
            (outgoing, senders)
        };
        let (outgoing, taken) = outgoing;
        if outgoing.is_empty() && senders.is_empty() {
            return;
        }
        let ttl_ms = self.inner.options.heard_relay_ms.saturating_mul(2);
        let blobs = match self.inner.store.exchange_heard(&me, &outgoing, ttl_ms, &senders).await {
            Ok(blobs) => blobs,
            Err(e) => {
                self.local().relay.restore(taken);
                self.store_error(e);
                return;
            }
        };
        let relayed: usize = outgoing.len();
        if relayed > 0 {
            self.inner.metrics.inc_by(
                "rsc_heard_relay_blobs_sent_total",
                "Blobs of heard heartbeats this instance left for the tick owners of the groups (one per owner and exchange).",
                vec![],
                relayed as f64,
            );
        }
        for (sender, blob) in senders.iter().zip(blobs) {
            if let Some(text) = blob {
                self.apply_relay(sender, &text);
            }
        }
    }

    /// Applies one blob `sender` left for this process (see the module doc).
    fn apply_relay(&self, sender: &str, text: &str) {
        let Some(blob) = self.local().relay.accept(sender, text) else { return };
        let now_ms = self.now_ms();
        let now = Instant::now();
        let mut restarted = 0u64;
        for heard in blob.groups {
            let mut local = self.local();
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
        self.inner.metrics.inc_by(
            "rsc_heard_relay_windows_restarted_total",
            "Member liveness windows restarted by heartbeats other instances relayed (news above the counter known here).",
            vec![],
            restarted as f64,
        );
    }
}
