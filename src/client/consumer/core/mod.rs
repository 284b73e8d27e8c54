//! [`ConsumerCore`]: the consumer's protocol state machine, with no I/O and no clock.
//!
//! Inputs are method calls carrying `now_ms` (milliseconds on the client [`super::super::clock::Clock`]):
//! heartbeat results, read results, acks, timers. Outputs are the heartbeat to send
//! ([`ConsumerCore::poll_heartbeat`]), the reads it may issue ([`ConsumerCore::read_plans`]), and
//! [`ClientEvent`]s ([`ConsumerCore::drain_events`]). The async driver ([`super::Consumer`]) only
//! moves data between this core, the transport and the stream store.
//!
//! Invariants it keeps (`DESIGN.md`, seed "Client Leases", "Rebalance Drain"):
//! - A shard is readable only in state `Reading` and only while `now_ms < lease_end_ms`, where the
//!   lease is counted from the *send* time of the heartbeat whose successful response listed the
//!   shard in `assigned`. At lease end every shard stops and in-flight entries are abandoned.
//! - Only `OK` starts shards. `REVOKE_PENDING` and `SYNC_METADATA` keep (a subset of) shards already
//!   being read and never start one; a heartbeat failure never resumes a revoking shard.
//! - A revoking shard issues no reads; it is reported REVOKED only once it has no in-flight entry.
//! - `UNKNOWN_MEMBER` / `FENCED_MEMBER_EPOCH` stop every shard at once and rejoin with epoch 0.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::fence::ShardFence;
use crate::core::model::{Fence, GroupId, MemberId, RevokeId, ShardId};
use crate::core::planted::PlantedBugs;
use crate::core::proof::ViewProof;
use crate::core::protocol::{HeartbeatRequest, HeartbeatResponse, MemberSession, RevokeReport};
use crate::store::{EntryId, ReadFrom, StreamEntry};

use super::super::events::{ClientEvent, StopReason};
use super::super::transport::TransportError;

/// Most draining shards one heartbeat reports (about 90 bytes of JSON each). With the fenced
/// reports' cap and every owned shard of the largest group (65,536), a heartbeat stays well under
/// the coordinator's default 1 MiB body limit.
pub const REVOKE_REPORTS_MAX: usize = 2_048;
/// Most fenced reports one heartbeat carries; the rest are sent with the next ones.
pub const FENCED_REPORTS_MAX: usize = 2_048;

/// Consumer settings. Durations in milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerConfig {
    pub group: GroupId,
    /// This consumer's id; also its Redis consumer name in `XREADGROUP GROUP <group> <member>`.
    pub member_id: MemberId,
    /// Heartbeat interval until the first response names the group's own.
    pub heartbeat_interval_ms: u64,
    /// Driver: a heartbeat without an answer this long counts as failed (`Timeout`).
    pub heartbeat_timeout_ms: u64,
    /// Retry delay after a transient failure (transport, `STORE_UNAVAILABLE`, terminating).
    pub retry_ms: u64,
    /// Delay of a "prompt" heartbeat (after `SYNC_METADATA`, a rejoin, or a drained shard).
    pub prompt_ms: u64,
    /// Retry delay while the group is unavailable (`GROUP_NOT_FOUND`, `METADATA_*`).
    pub slow_retry_ms: u64,
    /// Driver: how long `close()` waits for drain and leave before giving up.
    pub close_timeout_ms: u64,
    /// Driver: pause between empty reads in `poll_wait`.
    pub poll_idle_ms: u64,
    /// While a shard is owned, its setup (claim every entry pending to another consumer name)
    /// and the own-pending re-read run again this often (0: only when the shard starts). Without
    /// it, entries whose read reply never reached this consumer — a lost reply, or a read that
    /// timed out here but ran at Redis later — stay pending until the shard changes owner; so do
    /// the entries of a read whose result was dropped (it overlapped a restart, a sweep or a
    /// completed own-pending re-read). With 0, such entries are delivered only once the shard
    /// moves (at-least-once still holds, but a stable owner never sees them). A read that failed
    /// or whose `poll` was cancelled does not wait for the sweep: the next poll re-reads the
    /// shard's own pending entries (`reread_own_pending`); its reply is what gets lost, not them.
    pub pending_sweep_interval_ms: u64,
    /// This process's member session secret (drawn from the OS by [`ConsumerConfig::new`], and
    /// again by `Consumer::join` for every consumer it builds, so two consumers built from one
    /// config never share one): sent with every heartbeat, so only this process can act for the
    /// incarnations it joins, and it can rejoin its own member id at once (DESIGN §9). Never
    /// logged.
    pub member_session: MemberSession,
    /// Longest an entry may stay in flight (handed to the application, neither acked nor
    /// abandoned) before the consumer gives it up itself, like Kafka's `max.poll.interval.ms`
    /// or an SQS visibility timeout; 0: never. A given-up entry stays pending at Redis and an ack
    /// of it is refused (`NotInFlight`). On a shard still being read (`EntryAbandoned`, reason
    /// `InFlightTimeout`) the next poll here delivers it again (the shard re-reads its own
    /// pending entries). On a draining shard (revoked, or closing: reason `DrainTimeout`) the
    /// drain ends: the shard's other entries in flight are given up with it, the application
    /// hears `on_lost` for the shard (stop working on its entries), and once that call returned
    /// the shard is reported REVOKED (or left) and its next owner delivers them. Without it, a
    /// delivery the application dropped without an ack or an abandon (a `?` in a batch loop, a
    /// panicked task, an ack error logged and skipped) stayed in flight for ever: never delivered
    /// again, its shard never drained, so the next revoke of that shard got the whole member
    /// fenced after `rebalanceTimeoutMs`, and every `close` timed out without a leave (a client
    /// lifecycle review finding, F2).
    ///
    /// The price: an entry still being processed when it is given up is processed again, maybe
    /// at the same time: here, or by the next owner if the application goes on past `on_lost`.
    /// Default 25 s: below the group's default `rebalanceTimeoutMs` (30 s) less three heartbeat
    /// intervals, which bounds processing anyway (a drain that takes longer gets the member
    /// fenced, and every shard it held is lost; README), and below `close_timeout_ms`. With the
    /// defaults, a lost delivery holds up a revoke or a close for at most 25 s and never gets
    /// the member fenced. For longer processing, raise it together with `rebalanceTimeoutMs` and
    /// `close_timeout_ms`.
    pub max_in_flight_ms: u64,
    /// Deliberate mistakes for the simulation's negative tests; `NONE` everywhere else.
    pub planted: PlantedBugs,
}

impl ConsumerConfig {
    pub fn new(group: GroupId, member_id: impl Into<MemberId>) -> Self {
        Self {
            group,
            member_id: member_id.into(),
            heartbeat_interval_ms: 1_000,
            heartbeat_timeout_ms: 2_000,
            retry_ms: 500,
            prompt_ms: 10,
            slow_retry_ms: 5_000,
            close_timeout_ms: 30_000,
            poll_idle_ms: 50,
            pending_sweep_interval_ms: 30_000,
            max_in_flight_ms: 25_000,
            member_session: MemberSession::generate(),
            planted: PlantedBugs::NONE,
        }
    }
}

/// Lifecycle of the consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Joined or joining; reads whatever the coordinator grants.
    Active,
    /// `close()` was called: nothing is read, shards drain, then a leave heartbeat.
    Closing,
    /// Left (or gave up): no heartbeats, no reads.
    Left,
}

/// Local state of one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ShardState {
    /// May be read under the lease. `setup_done`: consumer group ensured and pending entries
    /// claimed; `pending_done`: this consumer's own pending entries were re-read once.
    Reading { setup_done: bool, pending_done: bool },
    /// Stopped; draining in-flight entries before REVOKED.
    Revoking,
}

#[derive(Clone, Debug)]
struct Shard {
    /// Bumped every time the shard starts, so results of reads issued under an earlier start are
    /// recognised and dropped.
    generation: u64,
    state: ShardState,
    /// When the current setup was planned (start or the last pending sweep).
    setup_at_ms: u64,
    /// Pending sweeps since the shard started. A read planned before the latest sweep is dropped
    /// when it returns: the sweep's own-pending re-read (which may have returned the same entries,
    /// since acked) replaced it, and `acked_before_pending_read` no longer holds what it would need.
    pending_round: u64,
    /// The revoke instruction this shard is draining for (`HeartbeatResponse::drains`), named in
    /// its REVOKED report; `None` when the consumer stopped it on its own (unassigned, fenced).
    revoke_id: Option<RevokeId>,
    /// The fence the latest answer gave this shard (`HeartbeatResponse::fences`): every stream
    /// operation on it presents this value. `None`: operations go unfenced.
    fence: Option<Fence>,
    /// Entries acked while this shard's own pending entries were still to be re-read: an
    /// own-pending read that ran at Redis before the XACK returns them, and they must not be
    /// delivered again. Emptied once the own-pending re-read is done.
    acked_before_pending_read: BTreeSet<EntryId>,
}

/// The heartbeat in flight (at most one).
#[derive(Clone, Debug)]
struct Outstanding {
    sent_ms: u64,
    /// Shards reported `revoked: true` in it.
    reported_revoked: BTreeSet<ShardId>,
    leave: bool,
}

/// The next store call a reading shard needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadStep {
    /// `ensure_group`, then `claim_all_pending(min_idle 0)` (take over the previous owner's entries).
    Setup,
    /// `XREADGROUP GROUP <group> <member>`: from `0` (this consumer's own pending entries, once
    /// after each start) or `>` (new entries).
    Read(ReadFrom),
}

/// Permission to issue one store call on a shard, valid only at the `now_ms` it was made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPlan {
    pub shard: ShardId,
    pub generation: u64,
    pub step: ReadStep,
    /// Entries in flight on the shard (an own-pending read asks for this many more, to skip them).
    pub in_flight: usize,
    /// The fence the call must present (`None`: unfenced).
    pub fence: Option<Fence>,
    /// The shard's pending sweep count when the plan was made (see `Shard::pending_round`).
    pub pending_round: u64,
}

/// An entry handed to the application. Settle every one: ack it with [`super::Consumer::ack`]
/// (or [`super::Consumer::ack_all`]), or give it up with [`super::Consumer::abandon`]. Until then
/// it is in flight: not delivered again, and its shard cannot be handed over (a revoke or a close
/// waits for it). A delivery dropped unsettled stays in flight until
/// [`ConsumerConfig::max_in_flight_ms`] (or [`super::Consumer::abandon_in_flight`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub shard: ShardId,
    /// The shard's stream key `<streamPrefix>:<shard>`.
    pub stream: String,
    pub entry: StreamEntry,
    /// The fence of the grant this entry was read under (DESIGN §10): a fencing token the
    /// application can store with its side effects and compare (a larger `counter` is a newer
    /// grant), like Kafka's leader epoch. `None` when the shard is read unfenced.
    pub fence: Option<Fence>,
}

/// Why an ack (or abandon) is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// The entry is not in flight here: abandoned (at lease end, fenced, by the application, or
    /// in flight longer than `ConsumerConfig::max_in_flight_ms`), already acked, or unknown.
    #[error("entry {entry} of shard {shard} is not in flight (abandoned, acked, or never delivered)")]
    NotInFlight { shard: ShardId, entry: EntryId },
    /// The assignment lease ended; acking now could race the shard's next owner.
    #[error("assignment lease ended; entry {entry} of shard {shard} was abandoned")]
    LeaseExpired { shard: ShardId, entry: EntryId },
    /// Redis refused the XACK as `FENCED`: a newer grant of the shard is in force. The shard was
    /// lost at once and the entry abandoned (its next owner redelivers it).
    #[error("shard {shard} is fenced at Redis (a newer grant owns it); entry {entry} was abandoned")]
    Fenced { shard: ShardId, entry: EntryId },
    /// The XACK itself failed; the entry stays in flight and may be acked again (or abandoned:
    /// left in flight, it is given up after `ConsumerConfig::max_in_flight_ms`).
    #[error("XACK failed: {0}")]
    Store(String),
}

/// The consumer's protocol state machine. See the module docs.
#[derive(Debug)]
pub struct ConsumerCore {
    config: ConsumerConfig,
    phase: Phase,
    member_epoch: u64,
    /// Highest version seen (or the version a `SYNC_METADATA` corrected it to).
    metadata_version: u64,
    /// The answer's proof of `metadata_version`, sent back with it: a version above the stored
    /// one is evidence of lost writes only with its proof (DESIGN §4). `None` from coordinators
    /// that give none (older ones refuse the field).
    metadata_version_proof: Option<ViewProof>,
    assignment_epoch: u64,
    heartbeat_interval_ms: u64,
    /// End of the assignment lease; `None`: no lease (nothing may be read).
    lease_end_ms: Option<u64>,
    /// The assignment lease the last successful answer granted (only the planted
    /// `ExtendLeaseOnFailedHeartbeat` reuses it).
    last_lease_ms: u64,
    shards: BTreeMap<ShardId, Shard>,
    /// The entries handed out and not settled yet, of shards in `shards` only.
    in_flight: InFlight,
    next_heartbeat_ms: u64,
    outstanding: Option<Outstanding>,
    next_generation: u64,
    /// Store calls (setup, claim, XREADGROUP) issued on a shard and not finished yet. A shard is
    /// drained only when it has none: a read still travelling to Redis could otherwise execute
    /// after the next owner started, and its entries would land behind the next owner's claim.
    /// "Finished" is the client's view: a call that timed out here, or whose poll was cancelled,
    /// counts as finished although Redis may still run it later. Unfenced, such a late read or
    /// claim leaves entries pending to this consumer until the next owner's pending sweep (a claim
    /// also redelivers the next owner's in-flight entries once); fenced, the new grant's raise
    /// makes Redis refuse it. No client can know when Redis will no longer run a command it sent.
    calls: BTreeMap<ShardId, u32>,
    /// Listener calls (`on_revoked`, `on_lost`) naming a shard that have not returned yet, by
    /// shard (the driver's [`ConsumerCore::listener_called`] and [`ConsumerCore::listener_returned`]).
    /// A shard is drained, and so reported REVOKED or left, only once they returned: the next
    /// owner must not start it while the application still flushes or commits for it in its
    /// callback. `close` ran `on_revoked` on the caller's task while the heartbeat task sent the
    /// leave beside it (a client lifecycle review finding, F3); on the coordinator's revokes the
    /// callback ran on the heartbeat task, before its next report, only by accident. Entries leave
    /// when their calls return, also for a shard the core forgot meanwhile.
    listener_calls: BTreeMap<ShardId, u32>,
    /// A coordinator refused the `memberSession` field twice in a row (a binary older than the
    /// previous release): heartbeats go without it until an answer comes, successful or one only a
    /// coordinator that reads sessions gives (`SESSION_MISMATCH`, `MEMBER_ID_IN_USE`). Kept for the
    /// consumer's life, as it was, one refusal behind a balancer left every later heartbeat
    /// without the secret: a coordinator that recorded its digest answered `SESSION_MISMATCH`, and
    /// every rejoin `MEMBER_ID_IN_USE`, until the incarnation expired. The cost: while only such
    /// a coordinator answers, each heartbeat interval starts with two refused requests.
    session_refused: bool,
    /// The last heartbeat's `memberSession` was refused once by a coordinator that does not know
    /// the field; the prompt retry sends it once more, for the reason `fenced_refused` gives
    /// (dropped at the first refusal, a round robin of an old and a new coordinator handed every
    /// heartbeat with the session to the old one and every one without it to the new one, which
    /// answered `SESSION_MISMATCH`).
    session_refused_once: bool,
    /// Shards Redis refused as `FENCED` while they held exactly the fence recorded for them: not
    /// started again while answers still give that fence, and reported (`fenced`) so the
    /// coordinator raises a new one (DESIGN §10).
    fenced: BTreeMap<ShardId, Fence>,
    /// Some answer carried fences (the coordinator knows `fenced` reports), and none refused them
    /// twice in a row.
    reports_fenced: bool,
    /// The last heartbeat's `fenced` reports were refused by a coordinator that does not know the
    /// field. Behind a balancer over old and new coordinators the prompt retry likely reaches
    /// another one, so the reports go once more before they are dropped: dropping them at once,
    /// and taking them up again at the next answer with fences, can hand every report to the old
    /// coordinator in turn (a round robin of two), and the fenced shard then waits forever.
    fenced_refused: bool,
    /// The last heartbeat's `metadataVersionProof` was refused by a coordinator that does not
    /// know the field; the prompt retry sends it once more, for the reason `fenced_refused` gives
    /// (a round robin of two otherwise handed every proof to the old coordinator, and a proven
    /// version ahead never started a correction round at the new one).
    proof_refused: bool,
    events: Vec<ClientEvent>,
    /// Whether `EntryDelivered` and `EntryAcked` are emitted (the sink wants them:
    /// [`super::super::EventSink::wants_entry_events`]).
    entry_events: bool,
}

impl ConsumerCore {
    /// A consumer that has not joined yet; its first heartbeat (due at once) joins with epoch 0.
    pub fn new(config: ConsumerConfig) -> Self {
        Self {
            heartbeat_interval_ms: config.heartbeat_interval_ms,
            config,
            phase: Phase::Active,
            member_epoch: 0,
            metadata_version: 0,
            metadata_version_proof: None,
            assignment_epoch: 0,
            lease_end_ms: None,
            last_lease_ms: 0,
            shards: BTreeMap::new(),
            in_flight: InFlight::default(),
            next_heartbeat_ms: 0,
            outstanding: None,
            next_generation: 1,
            calls: BTreeMap::new(),
            listener_calls: BTreeMap::new(),
            session_refused: false,
            session_refused_once: false,
            fenced: BTreeMap::new(),
            reports_fenced: false,
            fenced_refused: false,
            proof_refused: false,
            events: Vec::new(),
            entry_events: true,
        }
    }

    /// Whether to emit the per-entry events (`EntryDelivered`, `EntryAcked`); on by default.
    pub fn set_entry_events(&mut self, on: bool) {
        self.entry_events = on;
    }

    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn member_epoch(&self) -> u64 {
        self.member_epoch
    }

    pub fn metadata_version(&self) -> u64 {
        self.metadata_version
    }

    pub fn lease_end_ms(&self) -> Option<u64> {
        self.lease_end_ms
    }

    /// Shards that may be read at `now_ms` (state `Reading` and the lease holds).
    pub fn readable_shards(&self, now_ms: u64) -> Vec<ShardId> {
        if !self.lease_holds(now_ms) || self.phase != Phase::Active {
            return Vec::new();
        }
        self.shards_in(|s| matches!(s.state, ShardState::Reading { .. }))
    }

    /// Shards being drained.
    pub fn revoking_shards(&self) -> Vec<ShardId> {
        self.shards_in(|s| s.state == ShardState::Revoking)
    }

    /// Entries in flight on `shard`.
    pub fn in_flight(&self, shard: ShardId) -> usize {
        self.in_flight.count(shard)
    }

    /// Entries in flight per shard (shards with none are left out).
    pub fn in_flight_by_shard(&self) -> BTreeMap<ShardId, usize> {
        self.in_flight.counts()
    }

    /// How long the oldest entry in flight has been in flight at `now_ms`.
    pub fn oldest_in_flight_age_ms(&self, now_ms: u64) -> Option<u64> {
        self.in_flight.oldest_ms().map(|handed_ms| now_ms.saturating_sub(handed_ms))
    }

    /// Takes the events emitted so far.
    pub fn drain_events(&mut self) -> Vec<ClientEvent> {
        std::mem::take(&mut self.events)
    }

    /// Whether any event was emitted since the last drain.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Hands the events emitted so far to `f`, in order, keeping the buffer's capacity (the
    /// driver drains after every call, most of which emit one event per entry).
    pub fn drain_events_with(&mut self, f: impl FnMut(ClientEvent)) {
        self.events.drain(..).for_each(f);
    }

    /// The next time something is due: a heartbeat (when none is in flight), the lease end, or
    /// the end of the oldest in-flight entry's `max_in_flight_ms`.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        let heartbeat = (self.outstanding.is_none() && self.phase != Phase::Left).then_some(self.next_heartbeat_ms);
        [heartbeat, self.lease_end_ms, self.in_flight_deadline_ms()].into_iter().flatten().min()
    }

    /// Applies timers: at lease end every shard stops and every in-flight entry is abandoned; an
    /// entry in flight for `max_in_flight_ms` is given up.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        match self.lease_end_ms {
            Some(end) if now_ms >= end => {
                self.lease_end_ms = None;
                self.stop_all(now_ms, StopReason::LeaseExpired, true);
            }
            _ => {}
        }
        if self.in_flight_deadline_ms().is_some_and(|deadline_ms| now_ms >= deadline_ms) {
            let cutoff_ms = now_ms.saturating_sub(self.config.max_in_flight_ms);
            let mut expired = self.in_flight.take_handed_out_by(cutoff_ms);
            // A drain that timed out ends: the shard's other entries go with the first, since the
            // application, told `on_lost`, stops working on all of them (and hears it once).
            let draining: BTreeSet<ShardId> = expired
                .iter()
                .map(|(shard, _)| *shard)
                .filter(|shard| self.shards.get(shard).is_some_and(|s| s.state == ShardState::Revoking))
                .collect();
            for shard in draining {
                expired.extend(self.in_flight.take(shard).into_iter().map(|entry| (shard, entry)));
            }
            let reason = |draining| if draining { StopReason::DrainTimeout } else { StopReason::InFlightTimeout };
            self.gave_up(now_ms, expired, reason);
        }
    }

    /// When the oldest entry in flight reaches `max_in_flight_ms` (`None`: nothing in flight, or
    /// no limit).
    fn in_flight_deadline_ms(&self) -> Option<u64> {
        let max_ms = self.config.max_in_flight_ms;
        let oldest_ms = self.in_flight.oldest_ms().filter(|_| max_ms > 0)?;
        Some(oldest_ms.saturating_add(max_ms))
    }

    /// Gives up every entry in flight, or only `shard`'s, for the application
    /// ([`super::Consumer::abandon_in_flight`]): as [`ConsumerCore::abandon`] does one by one,
    /// except that the shards still being read re-read their own pending entries at the next
    /// poll, delivering these again. Returns how many were in flight.
    pub fn abandon_in_flight(&mut self, now_ms: u64, shard: Option<ShardId>) -> usize {
        self.handle_timeout(now_ms);
        let shards = match shard {
            Some(shard) => vec![shard],
            None => self.in_flight.shards(),
        };
        let mut entries = Vec::new();
        for shard in shards {
            entries.extend(self.in_flight.take(shard).into_iter().map(|entry| (shard, entry)));
        }
        let count = entries.len();
        self.gave_up(now_ms, entries, |_| StopReason::Application);
        count
    }

    /// `entries`, already out of `in_flight`, were given up, for `reason(draining)` (not one by
    /// one by the application): the sink hears each, a shard still being read re-reads its own
    /// pending entries at the next poll (so they are delivered again then, not at the next sweep),
    /// and a draining shard this drained is reported promptly.
    fn gave_up(&mut self, now_ms: u64, entries: Vec<(ShardId, EntryId)>, reason: impl Fn(bool) -> StopReason) {
        let mut shards = BTreeSet::new();
        for (shard, entry) in entries {
            let member = self.config.member_id.clone();
            let reason = reason(self.shards.get(&shard).is_some_and(|s| s.state == ShardState::Revoking));
            self.emit(ClientEvent::EntryAbandoned { at_ms: now_ms, member, shard, entry, reason });
            shards.insert(shard);
        }
        let mut drained = false;
        for shard in shards {
            self.reread_pending_of(shard);
            drained |= self.shards.get(&shard).is_some_and(|s| self.is_drained(shard, s));
        }
        if drained {
            self.next_heartbeat_ms = self.next_heartbeat_ms.min(now_ms.saturating_add(self.config.prompt_ms));
        }
    }

    /// The heartbeat to send now, if one is due and none is in flight. It names at most
    /// [`REVOKE_REPORTS_MAX`] draining shards (REVOKED ones first). The caller must send it at
    /// `now_ms` (its lease is counted from this instant) and report the result with
    /// [`ConsumerCore::handle_heartbeat`].
    pub fn poll_heartbeat(&mut self, now_ms: u64) -> Option<HeartbeatRequest> {
        self.handle_timeout(now_ms);
        if self.outstanding.is_some() || self.phase == Phase::Left || now_ms < self.next_heartbeat_ms {
            return None;
        }
        if self.phase == Phase::Closing && self.shards.is_empty() && self.member_epoch == 0 {
            // Never joined (or fenced while closing): there is nothing to leave.
            self.finish_leave(now_ms);
            return None;
        }
        // A closing consumer reports its drained shards REVOKED *in the leave heartbeat*: the
        // coordinator releases a shard it did not ask back only from a leaving member, so reporting
        // them earlier would leave them fenced for a lease after the leave. Except a shard it did
        // ask back (one with a revoke id): a REVOKED report releases that one at once, and holding
        // it made its next owner wait for the closing member's slowest other shard (up to the
        // close timeout; a review finding).
        let closing = self.phase == Phase::Closing;
        let all_drained = self.shards.iter().all(|(shard, s)| self.is_drained(*shard, s));
        let leave = closing && all_drained;
        let owned = self.shards_in(|s| matches!(s.state, ShardState::Reading { .. }));
        let mut revoking = Vec::new();
        let mut reported_revoked = BTreeSet::new();
        for (shard, s) in self.shards.iter().filter(|(_, s)| s.state == ShardState::Revoking) {
            let in_flight =
                u32::try_from(self.in_flight.count(*shard)).unwrap_or(u32::MAX).saturating_add(self.calls_on(*shard));
            let revoked = self.is_drained(*shard, s) && (!closing || leave || s.revoke_id.is_some());
            if revoked {
                reported_revoked.insert(*shard);
            }
            revoking.push(RevokeReport { shard: *shard, in_flight, revoked, revoke_id: s.revoke_id });
        }
        // One heartbeat stays under the coordinator's default body limit at any shard count: at
        // 65,536 shards a member asked to drain half of them used to send 2.8 MB of reports, was
        // refused 413 on every retry and expired (found by a black-box review). REVOKED reports
        // go first, since they release shards; the rest follow once those are released. A report
        // left out releases nothing (the coordinator only acts on what a report names), and a
        // leave that cannot name every drained shard leaves the rest to wait out their lease.
        if revoking.len() > REVOKE_REPORTS_MAX {
            revoking.sort_by_key(|r| !r.revoked);
            revoking.truncate(REVOKE_REPORTS_MAX);
            reported_revoked = revoking.iter().filter(|r| r.revoked).map(|r| r.shard).collect();
        }
        let req = HeartbeatRequest {
            group: self.config.group.clone(),
            member_id: self.config.member_id.clone(),
            member_epoch: self.member_epoch,
            metadata_version: self.metadata_version,
            assignment_epoch: self.assignment_epoch,
            owned: owned.clone(),
            revoking: revoking.clone(),
            leave,
            member_session: (!self.session_refused).then(|| self.config.member_session.clone()),
            fenced: self.fenced_reports(),
            metadata_version_proof: self.metadata_version_proof,
        };
        self.outstanding = Some(Outstanding { sent_ms: now_ms, reported_revoked, leave });
        self.emit(ClientEvent::HeartbeatSent {
            at_ms: now_ms,
            member: self.config.member_id.clone(),
            member_epoch: self.member_epoch,
            metadata_version: self.metadata_version,
            owned,
            revoking,
            leave,
        });
        Some(req)
    }

    /// Applies the result of the heartbeat in flight. Ignored when none is in flight.
    pub fn handle_heartbeat(&mut self, now_ms: u64, result: Result<HeartbeatResponse, TransportError>) {
        let Some(sent) = self.outstanding.take() else { return };
        // A lease that ended while the heartbeat was in flight ended: the response cannot revive
        // what already stopped (only `OK` starts shards again).
        self.handle_timeout(now_ms);
        match result {
            Ok(response) => self.apply_response(now_ms, &sent, response),
            Err(error) => self.apply_failure(now_ms, &sent, error),
        }
        self.handle_timeout(now_ms);
    }

    /// Starts a clean close: every shard stops and drains; once all are released a leave
    /// heartbeat follows.
    pub fn close(&mut self, now_ms: u64) {
        if self.phase != Phase::Active {
            return;
        }
        self.phase = Phase::Closing;
        self.stop_all(now_ms, StopReason::Closing, false);
        self.next_heartbeat_ms = self.next_heartbeat_ms.min(now_ms);
    }

    /// Gives up: abandons everything and stops heartbeating (a close that timed out).
    pub fn abort(&mut self, now_ms: u64) {
        if self.phase == Phase::Left {
            return;
        }
        self.stop_all(now_ms, StopReason::Closing, true);
        self.shards.clear();
        self.lease_end_ms = None;
        self.phase = Phase::Left;
        self.outstanding = None;
        let member = self.config.member_id.clone();
        self.emit(ClientEvent::Closed { at_ms: now_ms, member });
    }

    /// What may be read at `now_ms`: one plan per readable shard. Every plan must be issued at
    /// the same `now_ms` (no wait in between); the lease is checked here, at read time.
    pub fn read_plans(&mut self, now_ms: u64) -> Vec<ReadPlan> {
        if !self.may_read(now_ms) {
            return Vec::new();
        }
        let sweep_ms = self.config.pending_sweep_interval_ms;
        let in_flight = &self.in_flight;
        self.shards
            .iter_mut()
            .filter_map(|(shard, s)| Self::plan_of(*shard, s, now_ms, sweep_ms, in_flight.count(*shard)))
            .collect()
    }

    /// The plan for one shard at `now_ms`, if it is still readable (re-check before each call).
    /// Exactly what [`ConsumerCore::read_plans`] would plan for it (every shard's due sweep starts
    /// here too), without collecting the other shards' plans.
    pub fn plan_for(&mut self, now_ms: u64, shard: ShardId, generation: u64) -> Option<ReadPlan> {
        if !self.may_read(now_ms) {
            return None;
        }
        let sweep_ms = self.config.pending_sweep_interval_ms;
        let mut found = None;
        for (id, s) in self.shards.iter_mut() {
            let plan = Self::plan_of(*id, s, now_ms, sweep_ms, self.in_flight.count(*id));
            if *id == shard {
                found = plan.filter(|p| p.generation == generation);
            }
        }
        found
    }

    /// Applies timers; true when reads may be planned (the lease holds and the consumer is active).
    fn may_read(&mut self, now_ms: u64) -> bool {
        self.handle_timeout(now_ms);
        self.lease_holds(now_ms) && self.phase == Phase::Active
    }

    /// The next call on one shard (`None`: revoking), starting its pending sweep when one is due.
    /// `in_flight`: the shard's entries in flight.
    fn plan_of(shard: ShardId, s: &mut Shard, now_ms: u64, sweep_ms: u64, in_flight: usize) -> Option<ReadPlan> {
        let sweep_due = sweep_ms > 0 && now_ms >= s.setup_at_ms.saturating_add(sweep_ms);
        if sweep_due && s.state == (ShardState::Reading { setup_done: true, pending_done: true }) {
            s.state = ShardState::Reading { setup_done: false, pending_done: false };
            s.setup_at_ms = now_ms;
            s.pending_round += 1;
        }
        let step = match s.state {
            ShardState::Reading { setup_done: false, .. } => ReadStep::Setup,
            ShardState::Reading { setup_done: true, pending_done: false } => ReadStep::Read(ReadFrom::OwnPending),
            ShardState::Reading { setup_done: true, pending_done: true } => ReadStep::Read(ReadFrom::New),
            ShardState::Revoking => return None,
        };
        let (generation, fence, pending_round) = (s.generation, s.fence, s.pending_round);
        Some(ReadPlan { shard, generation, step, in_flight, fence, pending_round })
    }

    /// A read on `shard` (under start `generation`) ended without its result being taken: its
    /// poll was cancelled, or the call failed here though it may have run at Redis. Entries it
    /// made pending to this consumer never reached it, so the shard's own pending entries are
    /// re-read at the next poll instead of at the next pending sweep (entries in flight are not
    /// delivered twice; results of reads planned before are dropped, as after a sweep).
    pub fn reread_own_pending(&mut self, shard: ShardId, generation: u64) {
        if self.shards.get(&shard).is_some_and(|s| s.generation == generation) {
            self.reread_pending_of(shard);
        }
    }

    /// The next poll re-reads `shard`'s own pending entries, if it is being read and had done so
    /// already; reads planned before are dropped when they return.
    fn reread_pending_of(&mut self, shard: ShardId) {
        if self.config.planted.has(crate::core::planted::PlantedBug::SkipPendingRecovery) {
            return;
        }
        let Some(s) = self.shards.get_mut(&shard) else { return };
        if s.state == (ShardState::Reading { setup_done: true, pending_done: true }) {
            s.state = ShardState::Reading { setup_done: true, pending_done: false };
            s.pending_round += 1;
        }
    }

    /// Records a finished setup (group ensured, previous owner's entries claimed).
    pub fn setup_done(&mut self, shard: ShardId, generation: u64) {
        let skip_pending = self.config.planted.has(crate::core::planted::PlantedBug::SkipPendingRecovery);
        if let Some(Shard { generation: g, state: ShardState::Reading { setup_done, pending_done }, .. }) =
            self.shards.get_mut(&shard)
        {
            if *g == generation {
                *setup_done = true;
                *pending_done |= skip_pending;
            }
        }
    }

    /// Takes the entries a read returned. Entries are delivered only if the shard is still
    /// reading under the same start and the lease holds; otherwise they stay pending in Redis (the
    /// next owner claims them, or an own-pending read redelivers them).
    pub fn handle_read(
        &mut self,
        now_ms: u64,
        plan: ReadPlan,
        requested: usize,
        entries: Vec<StreamEntry>,
    ) -> Vec<Delivery> {
        self.handle_timeout(now_ms);
        let lease_holds = self.lease_holds(now_ms) && self.phase == Phase::Active;
        let stream = self.config.group.stream_key(plan.shard);
        let Some(shard) = self.shards.get_mut(&plan.shard) else { return Vec::new() };
        let ShardState::Reading { pending_done, .. } = &mut shard.state else { return Vec::new() };
        if shard.generation != plan.generation || !lease_holds {
            return Vec::new();
        }
        // Reads that overlapped a completed own-pending re-read or a sweep (polls running
        // concurrently, a `>` read in flight across a sweep) may return entries that re-read
        // delivered and that were acked since; nothing records those acks any more, so such a
        // result is dropped: its entries stay pending at Redis for the next sweep's re-read.
        let own_pending = plan.step == ReadStep::Read(ReadFrom::OwnPending);
        if plan.pending_round != shard.pending_round || (own_pending && *pending_done) {
            return Vec::new();
        }
        let returned = entries.len();
        // An id a read of new entries returns while it is in flight here was handed out twice
        // (`StopReason::Reexposed`): the entry in flight is given up, and the sweep delivers what
        // Redis holds under the id.
        let reexposed: Vec<EntryId> = if own_pending {
            Vec::new()
        } else {
            entries.iter().map(|e| e.id).filter(|id| self.in_flight.contains(plan.shard, *id)).collect()
        };
        let acked = &shard.acked_before_pending_read;
        let in_flight = &mut self.in_flight;
        let mut fresh: Vec<StreamEntry> =
            entries.into_iter().filter(|e| !in_flight.contains(plan.shard, e.id) && !acked.contains(&e.id)).collect();
        for id in &reexposed {
            in_flight.remove(plan.shard, *id);
        }
        // An own-pending read asks for the entries in flight plus the caller's `max` (those come
        // back too); more than `max` fresh ones (in flight ones acked meanwhile, or pending entries
        // below them) are left pending at Redis for the next own-pending read.
        let cap = if own_pending { requested.saturating_sub(plan.in_flight) } else { requested };
        let truncated = fresh.len() > cap;
        fresh.truncate(cap);
        if own_pending && !truncated && (fresh.is_empty() || returned < requested) {
            *pending_done = true;
            shard.acked_before_pending_read.clear();
        }
        let mut out = Vec::with_capacity(fresh.len());
        for entry in fresh {
            in_flight.insert(plan.shard, entry.id, now_ms);
            out.push(Delivery { shard: plan.shard, stream: stream.clone(), entry, fence: plan.fence });
        }
        for entry in reexposed {
            let member = self.config.member_id.clone();
            let reason = StopReason::Reexposed;
            self.events.push(ClientEvent::EntryAbandoned { at_ms: now_ms, member, shard: plan.shard, entry, reason });
        }
        if self.entry_events {
            for d in &out {
                let event = ClientEvent::EntryDelivered {
                    at_ms: now_ms,
                    member: self.config.member_id.clone(),
                    shard: d.shard,
                    entry: d.entry.id,
                };
                self.events.push(event);
            }
        }
        out
    }

    /// Checks that `delivery` may be acked at `now_ms` (in flight, lease holds).
    pub fn check_ack(&mut self, now_ms: u64, delivery: &Delivery) -> Result<(), AckError> {
        self.handle_timeout(now_ms);
        let (shard, entry) = (delivery.shard, delivery.entry.id);
        if !self.in_flight.contains(shard, entry) {
            return Err(AckError::NotInFlight { shard, entry });
        }
        if !self.lease_holds(now_ms) {
            return Err(AckError::LeaseExpired { shard, entry });
        }
        Ok(())
    }

    /// Records a successful XACK. Returns true when it drained a revoking shard (a prompt
    /// heartbeat was scheduled to report REVOKED).
    pub fn acked(&mut self, now_ms: u64, delivery: &Delivery) -> bool {
        if self.entry_events {
            let member = self.config.member_id.clone();
            let (shard, entry) = (delivery.shard, delivery.entry.id);
            self.emit(ClientEvent::EntryAcked { at_ms: now_ms, member, shard, entry });
        }
        if let Some(shard) = self.shards.get_mut(&delivery.shard) {
            if matches!(shard.state, ShardState::Reading { pending_done: false, .. }) {
                shard.acked_before_pending_read.insert(delivery.entry.id);
            }
        }
        self.remove_in_flight(now_ms, delivery)
    }

    /// The application gives up an entry: it stays pending in Redis (redelivered after a restart
    /// of the shard, or claimed by the next owner). Returns true when it drained a revoking shard.
    pub fn abandon(&mut self, now_ms: u64, delivery: &Delivery) -> Result<bool, AckError> {
        let (shard, entry) = (delivery.shard, delivery.entry.id);
        if !self.in_flight.contains(shard, entry) {
            return Err(AckError::NotInFlight { shard, entry });
        }
        let member = self.config.member_id.clone();
        self.emit(ClientEvent::EntryAbandoned { at_ms: now_ms, member, shard, entry, reason: StopReason::Application });
        Ok(self.remove_in_flight(now_ms, delivery))
    }

    /// The fence an operation on `shard` presents now (acks use the shard's current one).
    pub fn fence_of(&self, shard: ShardId) -> Option<Fence> {
        self.shards.get(&shard).and_then(|s| s.fence)
    }

    /// Redis refused an operation on `shard` that presented `fence` as `FENCED`. If that is still
    /// the shard's fence, the shard is lost at once: it stops, its in-flight entries are abandoned
    /// (the next owner claims them), and it is not started again until an answer gives it another
    /// fence; the next heartbeats report it so a coordinator still recording this fence for this
    /// member raises a new one. A refusal of an older fence (the answer already replaced it) changes
    /// nothing: the next call presents the new one.
    pub fn fenced_at_store(&mut self, now_ms: u64, shard: ShardId, fence: Fence) {
        if self.shards.get(&shard).and_then(|s| s.fence) != Some(fence) {
            return;
        }
        let Some(s) = self.shards.remove(&shard) else { return };
        let member = self.config.member_id.clone();
        if matches!(s.state, ShardState::Reading { .. }) {
            self.emit(ClientEvent::ShardStopped {
                at_ms: now_ms,
                member: member.clone(),
                shard,
                reason: StopReason::FencedAtStore,
            });
        }
        for entry in self.in_flight.take(shard) {
            let reason = StopReason::FencedAtStore;
            self.emit(ClientEvent::EntryAbandoned { at_ms: now_ms, member: member.clone(), shard, entry, reason });
        }
        self.fenced.insert(shard, fence);
        self.next_heartbeat_ms = self.next_heartbeat_ms.min(now_ms.saturating_add(self.config.prompt_ms));
    }

    /// The `fenced` reports of the next heartbeat (only to coordinators that read them).
    fn fenced_reports(&self) -> Vec<ShardFence> {
        if !self.reports_fenced {
            return Vec::new();
        }
        let reports = self.fenced.iter().take(FENCED_REPORTS_MAX);
        reports.map(|(shard, fence)| ShardFence { shard: *shard, fence: *fence }).collect()
    }

    /// A call on `shard` is about to be issued (the caller holds the permission of a [`ReadPlan`]).
    pub fn call_started(&mut self, shard: ShardId) {
        *self.calls.entry(shard).or_default() += 1;
    }

    /// A call on `shard` finished (answered, failed, or abandoned). Returns true when that drained
    /// a revoking shard (a prompt heartbeat is then due to report it).
    pub fn call_finished(&mut self, now_ms: u64, shard: ShardId) -> bool {
        if let Some(count) = self.calls.get_mut(&shard) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.calls.remove(&shard);
            }
        }
        let drained = self.shards.get(&shard).is_some_and(|s| self.is_drained(shard, s));
        if drained {
            self.next_heartbeat_ms = self.next_heartbeat_ms.min(now_ms.saturating_add(self.config.prompt_ms));
        }
        drained
    }

    fn calls_on(&self, shard: ShardId) -> u32 {
        self.calls.get(&shard).copied().unwrap_or(0)
    }

    /// Revoking, no delivered entry unsettled, no store call outstanding, and no listener call
    /// naming it under way.
    fn is_drained(&self, shard: ShardId, s: &Shard) -> bool {
        s.state == ShardState::Revoking
            && self.in_flight.count(shard) == 0
            && self.calls_on(shard) == 0
            && !self.listener_calls.contains_key(&shard)
    }

    /// The driver is about to tell the listener that `shards` stopped (`on_revoked`, `on_lost`):
    /// until [`ConsumerCore::listener_returned`] for the same shards, none of them is drained.
    /// Call it in the same critical section that took the events naming them, so no heartbeat
    /// reports them in between.
    pub fn listener_called(&mut self, shards: &[ShardId]) {
        for shard in shards {
            *self.listener_calls.entry(*shard).or_default() += 1;
        }
    }

    /// The listener call announced by [`ConsumerCore::listener_called`] for `shards` returned.
    /// Returns true when that drained a revoking shard (a prompt heartbeat is then due to report
    /// it, or to leave).
    pub fn listener_returned(&mut self, now_ms: u64, shards: &[ShardId]) -> bool {
        let mut drained = false;
        for shard in shards {
            if let Some(count) = self.listener_calls.get_mut(shard) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.listener_calls.remove(shard);
                }
            }
            drained |= self.shards.get(shard).is_some_and(|s| self.is_drained(*shard, s));
        }
        if drained {
            self.next_heartbeat_ms = self.next_heartbeat_ms.min(now_ms.saturating_add(self.config.prompt_ms));
        }
        drained
    }

    fn remove_in_flight(&mut self, now_ms: u64, delivery: &Delivery) -> bool {
        let removed = self.in_flight.remove(delivery.shard, delivery.entry.id);
        let drained = removed && self.shards.get(&delivery.shard).is_some_and(|s| self.is_drained(delivery.shard, s));
        if drained {
            self.next_heartbeat_ms = self.next_heartbeat_ms.min(now_ms.saturating_add(self.config.prompt_ms));
        }
        drained
    }

    fn lease_holds(&self, now_ms: u64) -> bool {
        self.lease_end_ms.is_some_and(|end| now_ms < end)
    }

    fn shards_in(&self, pred: impl Fn(&Shard) -> bool) -> Vec<ShardId> {
        self.shards.iter().filter(|(_, s)| pred(s)).map(|(id, _)| *id).collect()
    }

    fn emit(&mut self, event: ClientEvent) {
        self.events.push(event);
    }
}

mod apply;
mod in_flight;

use self::in_flight::InFlight;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
