//! How [`ConsumerCore`] applies heartbeat results: one function per outcome, each a direct
//! transcription of the rules in the module docs of [`super`].

use std::collections::{BTreeMap, BTreeSet};

use crate::core::model::{Fence, GroupConfig, ShardId};
use crate::core::planted::PlantedBug;
use crate::core::protocol::{ErrorCode, HeartbeatResponse, HeartbeatStatus};

use super::{ClientEvent, ConsumerCore, Outstanding, Phase, Shard, ShardState, StopReason, TransportError};

impl ConsumerCore {
    /// A successful response: adopt epochs and versions, extend the lease from the *send* time,
    /// release answered REVOKED shards, stop what is no longer ours, and (only under `OK`) start
    /// what is newly assigned.
    pub(super) fn apply_response(&mut self, now_ms: u64, sent: &Outstanding, r: HeartbeatResponse) {
        self.emit(ClientEvent::HeartbeatAnswered {
            at_ms: now_ms,
            member: self.config.member_id.clone(),
            sent_at_ms: sent.sent_ms,
            status: r.status,
            member_epoch: r.member_epoch,
            metadata_version: r.metadata_version,
            assignment_epoch: r.assignment_epoch,
            store_revision: r.store_revision,
        });
        // A processed leave is answered with the member's departure (status OK). SYNC_METADATA
        // means the store lost the version the leave named and the coordinator answered that
        // instead (a version above the stored one gets SYNC_METADATA, whatever the request): the
        // member is still recorded. Adopt the view below and leave again from it (still
        // closing, so the next heartbeat is the leave), or the record would keep the member, and
        // the shards targeted to it, until its TTL.
        if sent.leave && r.status != HeartbeatStatus::SyncMetadata {
            self.finish_leave(now_ms);
            return;
        }
        // Every successful status is a recorded view and is adopted as the truth (under
        // SYNC_METADATA that means going *back* to the store's version).
        self.member_epoch = r.member_epoch;
        self.metadata_version = r.metadata_version;
        self.metadata_version_proof = r.metadata_version_proof;
        self.assignment_epoch = r.assignment_epoch;
        // An answer's lease and interval are bounded as a valid group config bounds them
        // (`GroupConfig::validate`: at most 24 h, the interval below the lease): a coordinator's
        // bug or lie must not give a lease that outlives any partition, nor put the next heartbeat
        // a lease or more after the answer (a consumer whose lease ended sits idle until its next
        // heartbeat: for ever at u64::MAX). Without a lease to bound it (0 or 1 ms), the interval
        // is at most the consumer's own configured one. An interval of 0 keeps the current one,
        // bounded the same way.
        let lease_ms = r.assignment_lease_ms.min(GroupConfig::MS_MAX);
        let interval_max = if lease_ms > 1 { lease_ms - 1 } else { self.config.heartbeat_interval_ms.max(1) };
        let interval_ms =
            if r.heartbeat_interval_ms > 0 { r.heartbeat_interval_ms } else { self.heartbeat_interval_ms };
        self.heartbeat_interval_ms = interval_ms.min(interval_max);
        let lease_from_ms =
            if self.config.planted.has(PlantedBug::LeaseFromReceiveTime) { now_ms } else { sent.sent_ms };
        let lease_end_ms = lease_from_ms.saturating_add(lease_ms);
        self.last_lease_ms = lease_ms;
        self.lease_end_ms = Some(lease_end_ms);
        let member = self.config.member_id.clone();
        self.emit(ClientEvent::LeaseExtended { at_ms: now_ms, member, lease_end_ms });

        let revoke: BTreeSet<ShardId> = r.revoke.iter().copied().collect();
        // A shard both assigned and revoked (no coordinator answers that) is revoked: the
        // instruction that stops reading wins.
        let assigned: BTreeSet<ShardId> = r.assigned.iter().copied().filter(|s| !revoke.contains(s)).collect();
        let fences: BTreeMap<ShardId, Fence> = r.fences.iter().map(|f| (f.shard, f.fence)).collect();
        // An answer ends a run of refusals by an older coordinator: a field refused once goes
        // again as if never refused, and the session goes again (the next heartbeat may reach a
        // newer coordinator). The proof and the `fenced` reports come back only with an answer
        // whose coordinator gives them (a proof, fences).
        self.fenced_refused = false;
        self.proof_refused = false;
        self.session_refused = false;
        self.session_refused_once = false;
        if !fences.is_empty() {
            self.reports_fenced = true;
        }
        // A shard refused at Redis stays stopped while answers give it the refused fence.
        self.fenced.retain(|shard, fence| fences.get(shard) == Some(fence));
        for (shard, s) in self.shards.iter_mut() {
            if assigned.contains(shard) || revoke.contains(shard) {
                s.fence = fences.get(shard).copied();
            }
        }
        self.release_answered(now_ms, sent, &revoke);
        for shard in &revoke {
            self.revoke_one(now_ms, *shard, StopReason::Revoked);
        }
        // The REVOKED report names the revoke it answers; a shard revoked again (after a cancelled
        // revoke) carries the newer instruction's id from now on.
        for drain in &r.drains {
            if let Some(s) = self.shards.get_mut(&drain.shard).filter(|s| s.state == ShardState::Revoking) {
                s.revoke_id = Some(drain.revoke_id);
            }
        }
        let dropped =
            if r.status == HeartbeatStatus::SyncMetadata { StopReason::SyncDropped } else { StopReason::Revoked };
        let unassigned: Vec<ShardId> = self
            .shards_in(|s| matches!(s.state, ShardState::Reading { .. }))
            .into_iter()
            .filter(|shard| !assigned.contains(shard))
            .collect();
        for shard in unassigned {
            self.revoke_one(now_ms, shard, dropped);
        }
        // OK is the only status that starts shards, and never on an already-ended lease.
        let start_pending = self.config.planted.has(PlantedBug::StartPendingShards);
        let pending =
            r.pending.iter().filter(|_| start_pending && self.phase == Phase::Active && now_ms < lease_end_ms);
        let pending: Vec<ShardId> = pending.copied().collect();
        for shard in pending {
            if !matches!(self.shards.get(&shard), Some(Shard { state: ShardState::Reading { .. }, .. })) {
                self.start(now_ms, shard, None);
            }
        }
        if r.status == HeartbeatStatus::Ok && self.phase == Phase::Active && now_ms < lease_end_ms {
            for shard in &assigned {
                let reading = matches!(self.shards.get(shard), Some(Shard { state: ShardState::Reading { .. }, .. }));
                if !reading && !self.fenced.contains_key(shard) {
                    self.start(now_ms, *shard, fences.get(shard).copied());
                }
            }
        }
        // Prompt after SYNC_METADATA (report the corrected version) and when a drained shard has
        // not been reported REVOKED yet (its new owner is waiting for that report).
        let unreported_drain =
            self.shards.iter().any(|(shard, s)| self.is_drained(*shard, s) && !sent.reported_revoked.contains(shard));
        let prompt = r.status == HeartbeatStatus::SyncMetadata || unreported_drain;
        let delay_ms = if prompt { self.config.prompt_ms } else { self.heartbeat_interval_ms };
        // The interval runs from the answer, but never past the point that leaves two round trips
        // as long as this one before the lease ends: with an interval close to the lease and slow
        // answers (8 s lease, 7 s interval, 600 ms answers), the interval alone put every next
        // answer after the lease's end, stopping every shard once a cycle.
        let renew_by_ms = lease_end_ms.saturating_sub(now_ms.saturating_sub(sent.sent_ms).saturating_mul(2));
        let next_ms = now_ms.saturating_add(delay_ms);
        self.next_heartbeat_ms = if lease_ms > 1 { next_ms.min(renew_by_ms.max(now_ms)) } else { next_ms };
        self.emit(ClientEvent::StatusApplied {
            at_ms: now_ms,
            member: self.config.member_id.clone(),
            status: r.status,
            assigned: r.assigned,
            pending: r.pending,
            revoke: r.revoke,
            reading: self.shards_in(|s| matches!(s.state, ShardState::Reading { .. })),
            revoking: self.revoking_shards(),
        });
    }

    /// A failed heartbeat. Fenced/unknown: stop everything, rejoin. Group unavailable: stop
    /// everything, retry slowly. Anything else: keep the lease as it is (never extend it, never
    /// resume a revoking shard) and retry.
    pub(super) fn apply_failure(&mut self, now_ms: u64, sent: &Outstanding, error: TransportError) {
        let code = error.code();
        // serde's and the HTTP edge's wording for a field an older coordinator does not know.
        let refuses_sessions =
            matches!(&error, TransportError::Api(e) if e.message.contains("unknown field `memberSession`"));
        let refuses_fenced = matches!(&error, TransportError::Api(e) if e.message.contains("unknown field `fenced`"));
        let refuses_proof =
            matches!(&error, TransportError::Api(e) if e.message.contains("unknown field `metadataVersionProof`"));
        let member = self.config.member_id.clone();
        self.emit(ClientEvent::HeartbeatFailed { at_ms: now_ms, member, sent_at_ms: sent.sent_ms, error });
        if matches!(code, Some(ErrorCode::SessionMismatch | ErrorCode::MemberIdInUse)) {
            // Only a coordinator that reads sessions answers these: a heartbeat without the
            // session (after an older coordinator refused the field) cannot pass one that recorded
            // it, so the rejoin carries it again.
            self.session_refused = false;
            self.session_refused_once = false;
        }
        match code {
            Some(ErrorCode::UnknownMember)
                if self.config.planted.has(PlantedBug::GiveUpOnUnknownMember) && self.phase == Phase::Active =>
            {
                self.finish_leave(now_ms);
            }
            Some(ErrorCode::FencedMemberEpoch)
                if self.config.planted.has(PlantedBug::ReadOnAfterFence)
                    && self.phase == Phase::Active
                    && self.lease_end_ms.is_some_and(|end| now_ms < end) =>
            {
                // Rejoins, but leaves its shards reading on the lease it still holds.
                self.member_epoch = 0;
                self.next_heartbeat_ms = now_ms.saturating_add(self.config.prompt_ms);
            }
            // `SESSION_MISMATCH`: the member id now belongs to another process's incarnation.
            Some(ErrorCode::UnknownMember | ErrorCode::FencedMemberEpoch | ErrorCode::SessionMismatch) => {
                self.stop_all(now_ms, StopReason::Fenced, true);
                self.shards.clear();
                self.end_lease(now_ms);
                self.member_epoch = 0;
                if self.phase == Phase::Closing {
                    // The coordinator no longer knows this incarnation: nothing is left to leave.
                    self.finish_leave(now_ms);
                    return;
                }
                self.next_heartbeat_ms = now_ms.saturating_add(self.config.prompt_ms);
            }
            Some(ErrorCode::GroupNotFound | ErrorCode::MetadataMissing | ErrorCode::MetadataIncompatible) => {
                self.stop_all(now_ms, StopReason::GroupUnavailable, true);
                self.end_lease(now_ms);
                self.next_heartbeat_ms = now_ms.saturating_add(self.config.slow_retry_ms);
            }
            Some(ErrorCode::BadRequest) if refuses_fenced && self.reports_fenced => {
                // An older coordinator: it records no fences, so it has none to raise again. The
                // prompt retry reports once more (another coordinator may answer it); refused
                // twice in a row, the reports stop until an answer carries fences again.
                if std::mem::replace(&mut self.fenced_refused, true) {
                    self.reports_fenced = false;
                    self.fenced_refused = false;
                }
                self.next_heartbeat_ms = now_ms.saturating_add(self.config.prompt_ms);
            }
            Some(ErrorCode::BadRequest) if refuses_proof && self.metadata_version_proof.is_some() => {
                // An older coordinator behind the same address: it checks no proof. As for
                // `fenced`, the prompt retry sends it once more (another coordinator may answer
                // it); refused twice in a row, none is sent until an answer gives one again (an
                // older coordinator's answers give none).
                if std::mem::replace(&mut self.proof_refused, true) {
                    self.metadata_version_proof = None;
                    self.proof_refused = false;
                }
                self.next_heartbeat_ms = now_ms.saturating_add(self.config.prompt_ms);
            }
            Some(ErrorCode::BadRequest) if refuses_sessions && !self.session_refused => {
                // An older coordinator: it checks no session, so sending none loses nothing there.
                // As for `fenced`, the prompt retry sends it once more (another coordinator may
                // answer it, and one that recorded the session's digest refuses a heartbeat
                // without it); refused twice in a row, it is left out until the next answer.
                if std::mem::replace(&mut self.session_refused_once, true) {
                    self.session_refused = true;
                    self.session_refused_once = false;
                }
                self.next_heartbeat_ms = now_ms.saturating_add(self.config.prompt_ms);
            }
            Some(ErrorCode::BadRequest) => {
                // A bug on one side; retrying fast would not help.
                self.next_heartbeat_ms = now_ms.saturating_add(self.config.slow_retry_ms);
            }
            _ => {
                if self.config.planted.has(PlantedBug::ResumeRevokingOnHeartbeatFailure) && self.phase == Phase::Active
                {
                    for shard in self.revoking_shards() {
                        let fence = self.fence_of(shard);
                        self.start(now_ms, shard, fence);
                    }
                }
                if self.config.planted.has(PlantedBug::ExtendLeaseOnFailedHeartbeat) && self.phase == Phase::Active {
                    if let Some(end) = self.lease_end_ms.filter(|end| now_ms < *end) {
                        let lease_ms = self.last_lease_ms;
                        self.lease_end_ms = Some(end.max(sent.sent_ms.saturating_add(lease_ms)));
                    }
                }
                self.next_heartbeat_ms = now_ms.saturating_add(self.config.retry_ms);
            }
        }
    }

    /// Forgets drained shards whose REVOKED report the answered heartbeat carried, unless the
    /// coordinator still lists them in `revoke` (then they are reported again).
    fn release_answered(&mut self, now_ms: u64, sent: &Outstanding, revoke: &BTreeSet<ShardId>) {
        for shard in &sent.reported_revoked {
            let drained = self.shards.get(shard).is_some_and(|s| self.is_drained(*shard, s));
            if drained && !revoke.contains(shard) {
                self.shards.remove(shard);
                let member = self.config.member_id.clone();
                self.emit(ClientEvent::ShardReleased { at_ms: now_ms, member, shard: *shard });
            }
        }
    }

    /// Moves `shard` to revoking. A shard the consumer does not hold is recorded as drained, so it
    /// is reported REVOKED at once (the coordinator's view of it is released sooner).
    fn revoke_one(&mut self, now_ms: u64, shard: ShardId, reason: StopReason) {
        match self.shards.get_mut(&shard) {
            Some(s) if matches!(s.state, ShardState::Reading { .. }) => {
                s.state = ShardState::Revoking;
                let member = self.config.member_id.clone();
                self.emit(ClientEvent::ShardStopped { at_ms: now_ms, member, shard, reason });
            }
            Some(_) => {}
            None => {
                let generation = self.allocate_generation();
                self.shards.insert(
                    shard,
                    Shard {
                        generation,
                        state: ShardState::Revoking,
                        setup_at_ms: 0,
                        revoke_id: None,
                        fence: None,
                        acked_before_pending_read: BTreeSet::new(),
                        pending_round: 0,
                    },
                );
            }
        }
    }

    /// Lets `shard` be read (again): setup and the own-pending re-read run first. In-flight
    /// entries of a shard that was revoking and is assigned back stay in flight.
    pub(super) fn start(&mut self, now_ms: u64, shard: ShardId, fence: Option<Fence>) {
        let generation = self.allocate_generation();
        let state = ShardState::Reading { setup_done: false, pending_done: false };
        let fresh = Shard {
            generation,
            state: state.clone(),
            setup_at_ms: now_ms,
            revoke_id: None,
            fence,
            acked_before_pending_read: BTreeSet::new(),
            pending_round: 0,
        };
        let entry = self.shards.entry(shard).or_insert(fresh);
        entry.generation = generation;
        entry.state = state;
        entry.setup_at_ms = now_ms;
        entry.revoke_id = None;
        entry.fence = fence;
        let member = self.config.member_id.clone();
        self.emit(ClientEvent::ShardStarted { at_ms: now_ms, member, shard });
    }

    /// Stops reading every shard; with `abandon`, also gives up every in-flight entry.
    pub(super) fn stop_all(&mut self, now_ms: u64, reason: StopReason, abandon: bool) {
        let member = self.config.member_id.clone();
        let mut events = Vec::new();
        for (shard, s) in self.shards.iter_mut() {
            if matches!(s.state, ShardState::Reading { .. }) {
                s.state = ShardState::Revoking;
                events.push(ClientEvent::ShardStopped { at_ms: now_ms, member: member.clone(), shard: *shard, reason });
            }
            if abandon {
                for entry in self.in_flight.take(*shard) {
                    events.push(ClientEvent::EntryAbandoned {
                        at_ms: now_ms,
                        member: member.clone(),
                        shard: *shard,
                        entry,
                        reason,
                    });
                }
            }
        }
        self.events.extend(events);
    }

    /// Gives up the lease before it runs out; tells the sink when there was one.
    pub(super) fn end_lease(&mut self, now_ms: u64) {
        if self.lease_end_ms.take().is_some_and(|end| now_ms < end) {
            let member = self.config.member_id.clone();
            self.emit(ClientEvent::LeaseEnded { at_ms: now_ms, member });
        }
    }

    /// The member is gone (leave answered, or fenced while closing).
    pub(super) fn finish_leave(&mut self, now_ms: u64) {
        self.stop_all(now_ms, StopReason::Closing, true);
        self.shards.clear();
        self.lease_end_ms = None;
        self.member_epoch = 0;
        self.phase = Phase::Left;
        let member = self.config.member_id.clone();
        self.emit(ClientEvent::Left { at_ms: now_ms, member });
    }

    fn allocate_generation(&mut self) -> u64 {
        let generation = self.next_generation;
        self.next_generation += 1;
        generation
    }
}
