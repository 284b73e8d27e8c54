//! Planted bugs: deliberate mistakes the simulation switches on to prove its checkers can fail
//! (FoundationDB-style negative tests). Every field defaults to off; nothing outside the
//! simulation and tests ever sets one (no flag, environment variable or HTTP route reaches it).

use serde::{Deserialize, Serialize};

/// One deliberate mistake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlantedBug {
    /// Core: grant a shard to its new target while the previous owner is still revoking.
    AssignBeforeRelease,
    /// Service: answer from the decided state before (and regardless of) the store write.
    RespondBeforeWrite,
    /// Consumer: resume reading a revoking shard when heartbeats fail.
    ResumeRevokingOnHeartbeatFailure,
    /// Consumer: count the lease from the response's receive time instead of the send time.
    LeaseFromReceiveTime,
    /// Producer: publish with an expired routing cache.
    PublishOnExpiredCache,
    /// Service: rebuild missing metadata from a heartbeat instead of failing closed.
    RebuildMissingMetadata,
    /// Core: bump metadataVersion without going past versions clients reported (ABA).
    ReuseLostVersion,
    /// Core: end a correction round without waiting one assignment lease.
    SkipCorrectionLeaseWait,
    /// Service: judge a read's revision against the highest one this process ever observed,
    /// whatever the read's issue time, so a read that raced a concurrent write looks like loss.
    ProcessWideRevisionMark,
    /// Core: release a draining shard on any REVOKED report from its drainer, whatever revoke the
    /// report answers (a late or duplicated report then releases a later revoke).
    AcceptStaleRevoked,
    /// Consumer: start the shards an answer lists as pending (their previous owner has not
    /// released them yet), under any status.
    StartPendingShards,
    /// Consumer: a shard's setup never claims entries pending to other consumers and never
    /// re-reads its own pending entries, so an entry whose read reply was lost stays pending.
    SkipPendingRecovery,
    /// Core: ignore a producer's report of publishing with more shards than recorded, so the
    /// shards of a lost `add-shards` stay unread.
    SkipAddShardsHealing,
    /// Core: accept a leave heartbeat without the member's session secret (a forged leave then
    /// releases a live member's shards while it still reads them).
    AcceptForgedLeave,
    /// Consumer: measure the lease on the clock that stops while the machine is suspended
    /// (CLOCK_MONOTONIC, tokio's `Instant`), so a resumed consumer reads on a lease that ended.
    LeaseOnStoppingClock,
    /// Producer: jump-hash a key over one bucket more than the cached view's shard count (an
    /// off-by-one: the count taken for the highest shard id), so some keys go to a shard the view
    /// does not have.
    RouteOverOneShardTooMany,
    /// Consumer: on `FENCED_MEMBER_EPOCH`, keep reading the shards it holds until its lease ends
    /// ("the lease is still ours") while it rejoins, instead of stopping them at once.
    ReadOnAfterFence,
    /// Consumer driver: the heartbeat task returns after a run of consecutive failed heartbeats
    /// (a retry budget meant for one request applied to the whole task), so a long coordinator
    /// outage leaves a running consumer that never heartbeats again.
    HeartbeatTaskGivesUp,
    /// Consumer: treat `UNKNOWN_MEMBER` as terminal and give up (the application then exits)
    /// instead of rejoining with epoch 0, so every member expired in an outage is gone for good.
    GiveUpOnUnknownMember,
    /// Consumer: create a shard's consumer group at `$` (only new entries) instead of `0`, so
    /// entries published before the first consumer set the shard up are never delivered.
    CreateGroupAtLatest,
    /// Consumer: a heartbeat that failed in transit (timeout, connection refused, 5xx) extends
    /// the lease from its send time as if answered ("the coordinator is only unreachable"), so
    /// a consumer cut off from every coordinator reads on while its shards are granted again.
    ExtendLeaseOnFailedHeartbeat,
    /// Service: garbage-collect a group whose last member the tick expired, deleting its
    /// metadata (an empty group looks abandoned; it is the operator's, with its config).
    DeleteGroupOfLastExpiredMember,
    /// Store (the fenced XACK script): acknowledge without checking the fence, so a consumer whose
    /// shard moved can still ack entries the new owner is processing.
    NoFenceCheckInAck,
    /// Service: record and answer a grant with the fence the shard's key will have next (its
    /// counter plus one), without raising it first; the key is raised only when the new owner
    /// first uses it, so until then the previous owner's reads and acks still pass.
    FenceAfterAnswer,
    /// Core: credit a client's report of a version or shard count above the recorded one without
    /// checking its proof, so a forged report starts a correction round or grows the group.
    CreditUnprovenReports,
    /// Store (the fence check every fenced script runs): accept a fence whose counter equals the
    /// key's, whatever its nonce, so a grant that a rollback lost (its counter given again, with
    /// another nonce, to the next owner) still reads, acks and claims.
    CompareFenceCountersOnly,
}

impl PlantedBug {
    pub const ALL: [PlantedBug; 26] = [
        PlantedBug::AssignBeforeRelease,
        PlantedBug::RespondBeforeWrite,
        PlantedBug::ResumeRevokingOnHeartbeatFailure,
        PlantedBug::LeaseFromReceiveTime,
        PlantedBug::PublishOnExpiredCache,
        PlantedBug::RebuildMissingMetadata,
        PlantedBug::ReuseLostVersion,
        PlantedBug::SkipCorrectionLeaseWait,
        PlantedBug::ProcessWideRevisionMark,
        PlantedBug::AcceptStaleRevoked,
        PlantedBug::StartPendingShards,
        PlantedBug::SkipPendingRecovery,
        PlantedBug::SkipAddShardsHealing,
        PlantedBug::AcceptForgedLeave,
        PlantedBug::LeaseOnStoppingClock,
        PlantedBug::RouteOverOneShardTooMany,
        PlantedBug::ReadOnAfterFence,
        PlantedBug::HeartbeatTaskGivesUp,
        PlantedBug::GiveUpOnUnknownMember,
        PlantedBug::CreateGroupAtLatest,
        PlantedBug::ExtendLeaseOnFailedHeartbeat,
        PlantedBug::DeleteGroupOfLastExpiredMember,
        PlantedBug::NoFenceCheckInAck,
        PlantedBug::FenceAfterAnswer,
        PlantedBug::CreditUnprovenReports,
        PlantedBug::CompareFenceCountersOnly,
    ];
}

/// The set of planted bugs in force (a bit set; `Default` is none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PlantedBugs(u32);

impl PlantedBugs {
    pub const NONE: PlantedBugs = PlantedBugs(0);

    pub fn only(bug: PlantedBug) -> Self {
        PlantedBugs(1 << bug as u32)
    }

    /// This set plus `bug`.
    pub fn with(self, bug: PlantedBug) -> Self {
        PlantedBugs(self.0 | 1 << bug as u32)
    }

    pub fn has(self, bug: PlantedBug) -> bool {
        self.0 & (1 << bug as u32) != 0
    }
}
