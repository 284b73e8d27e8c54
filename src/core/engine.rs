//! The pure decision core: `(recorded state, input, observations) -> Decision`.
//!
//! No I/O, no clock, no randomness: time enters only as [`Observations`] measured by the caller on
//! its own monotonic clock. A [`Decision`] names the next state to record (if any), the store
//! conditions of that write, and the response — which the caller may send only after the write
//! succeeded, because it is derived from the state being written (seed: "Redis-recorded state
//! machine"). Every rule is in [`Transition`]; this module validates inputs, applies the rules in
//! order and derives responses.

use super::index::{GroupIndex, MemberShards};
use super::input::{check_heartbeat_request, check_routing_report, InputError};
use super::model::ShardOwner;
use super::model::{
    CounterExhausted, GroupMetadata, LossEvidence, MemberState, ReshardReason, ShardId, CLIENT_VERSION_AHEAD_MAX,
    MEMBERS_MAX, ORPHAN_LIVENESS_MAX,
};
use super::observe::Observations;
use super::planted::{PlantedBug, PlantedBugs};
use super::proof::{credited, Fact, ViewKey, ViewProof};
use super::protocol::MemberSession;
use super::protocol::{
    ApiError, ErrorCode, HeartbeatRequest, HeartbeatResponse, HeartbeatStatus, RoutingReport, RoutingResponse,
};
use super::transition::{is_quiescent, refence_applies, report_releases, Transition, Written};

/// What one input decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision<R> {
    /// The state to record, its liveness guards and removals. `next == None`: nothing to write.
    pub write: Written,
    /// The response, valid only once `write` (if any) is recorded.
    pub outcome: Result<R, ApiError>,
}

impl<R> Decision<R> {
    fn reject(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { write: Written::default(), outcome: Err(ApiError::new(code, message)) }
    }

    /// A counter had no next value: nothing is written and the answer is `INTERNAL`.
    pub(crate) fn refuse(exhausted: CounterExhausted) -> Self {
        Self::reject(ErrorCode::Internal, exhausted.to_string())
    }
}

/// The inputs every decision needs besides the state.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    /// Revision of the loaded state; a write records `stored_revision + 1`.
    pub stored_revision: u64,
    pub observations: &'a Observations,
    /// Deliberate mistakes (simulation only); `PlantedBugs::NONE` everywhere else.
    pub planted: PlantedBugs,
    /// Fresh randomness drawn by the caller for this decision (the core draws none itself): ids
    /// that must never repeat, even after a metadata rollback restores counters, derive from it
    /// ([`crate::core::model::RevokeId`]), and so do a create's first wait id and incarnation
    /// bits. Two processes must not draw the same sequence: the service seeds its RNG from the OS
    /// (`CoordinatorOptions::rng_seed`).
    pub nonce: u64,
    /// A fresh view-proof key, drawn by the caller from the OS when the group has none (a create,
    /// or the first write of a group an older release created); `None` otherwise. A written state
    /// without a key takes it ([`crate::core::proof`]).
    pub fresh_view_key: Option<ViewKey>,
    /// This process's wall clock, in seconds since the Unix epoch (0: unknown, or not read: the
    /// caller reads it only for a decision on an absent record). Read only for the first
    /// `metadataVersion` of a created group, which no safety argument relies on
    /// ([`first_metadata_version`](super::first_metadata_version)).
    pub wall_clock_secs: u64,
}

impl Context<'_> {
    /// The revision the store will give `write` (the stored one when nothing is written).
    fn revision_after(&self, write: &Written) -> Result<u64, CounterExhausted> {
        let revision = self.stored_revision;
        match write.next {
            Some(_) => revision.checked_add(1).ok_or(CounterExhausted::StoreRevision(revision)),
            None => Ok(revision),
        }
    }

    /// Finishes `tx`: what to write and the revision it will be recorded at, or the refusal.
    pub(crate) fn finish(&self, tx: Transition<'_>) -> Result<(Written, u64), CounterExhausted> {
        let write = tx.finish()?;
        let revision = self.revision_after(&write)?;
        Ok((write, revision))
    }
}

/// Decides a consumer heartbeat (join, steady, revoke reports, leave).
pub fn decide_heartbeat(g: &GroupMetadata, req: &HeartbeatRequest, ctx: Context<'_>) -> Decision<HeartbeatResponse> {
    decide_heartbeat_indexed(g, None, req, ctx)
}

/// [`decide_heartbeat`], with `index` built from `g` itself ([`GroupIndex::build`]): the same
/// decision, but a steady heartbeat that needs no write is answered from its member's entry
/// instead of walking every shard of the group.
pub fn decide_heartbeat_indexed(
    g: &GroupMetadata,
    index: Option<&GroupIndex>,
    req: &HeartbeatRequest,
    ctx: Context<'_>,
) -> Decision<HeartbeatResponse> {
    if let Err(refused) = check_heartbeat(g, req) {
        return Decision::reject(ErrorCode::BadRequest, refused.to_string());
    }
    if let Err(refused) = check_session(g, req, ctx.planted) {
        return Decision { write: Written::default(), outcome: Err(refused) };
    }
    if let Some(departed) = repeats_a_departed_join(g, req) {
        let id = &req.member_id;
        let refused = ApiError::new(
            ErrorCode::UnknownMember,
            format!(
                "member {id} left the group at epoch {departed}; this join is a late copy of the one that created that incarnation and is ignored (a process that saw the incarnation rejoins naming the version it holds)"
            ),
        );
        return Decision { write: Written::default(), outcome: Err(refused) };
    }
    if let Some(outcome) = quiescent_view(g, index, req, ctx) {
        return Decision { write: Written::default(), outcome };
    }
    let mut tx = Transition::new(g, ctx);
    if version_credited(g, req.metadata_version, req.metadata_version_proof.as_ref(), ctx.planted) {
        tx.record_client_version(
            req.metadata_version,
            version_proven(g, req.metadata_version, req.metadata_version_proof.as_ref()),
        );
    } else if version_learned(g, req.metadata_version) {
        tx.learn_client_version(req.metadata_version);
    }
    let ahead = req.metadata_version > g.metadata_version;
    let step = if req.member_epoch == 0 {
        if !repeats_a_join(g, req) {
            tx.join(&req.member_id, req.member_session.as_ref().map(MemberSession::digest), !ahead);
        }
        Ok(Step::Member)
    } else if ahead {
        sync_ahead(&mut tx, g, req)
    } else {
        steady(&mut tx, g, req)
    };
    let (write, revision) = match ctx.finish(tx) {
        Ok(finished) => finished,
        Err(exhausted) => return Decision::refuse(exhausted),
    };
    let state = write.next.as_ref().unwrap_or(g);
    let outcome = step.map(|step| match step {
        Step::Left => left_response(state, &req.member_id, revision),
        Step::Member => {
            let status = if ahead { HeartbeatStatus::SyncMetadata } else { status_for(state, &req.member_id) };
            member_view(state, &req.member_id, status, revision)
        }
    });
    Decision { write, outcome }
}

enum Step {
    Member,
    Left,
}

/// The read-only answer to a steady heartbeat that reports nothing new on a group where no rule
/// is due; `None` when the full decision is needed. Allocation-free until the response.
fn quiescent_view(
    g: &GroupMetadata,
    index: Option<&GroupIndex>,
    req: &HeartbeatRequest,
    ctx: Context<'_>,
) -> Option<Result<HeartbeatResponse, ApiError>> {
    if req.member_epoch == 0 || req.leave || req.metadata_version > g.metadata_version {
        return None;
    }
    let member = g.members.get(&req.member_id).filter(|m| m.state == MemberState::Active)?;
    let epoch_ok = (member.incarnation_epoch..=member.member_epoch).contains(&req.member_epoch);
    if !epoch_ok || !owns_all(g, &req.member_id, &req.owned) {
        return None;
    }
    let stale_ok = ctx.planted.has(PlantedBug::AcceptStaleRevoked);
    let acks_due =
        req.revoking.iter().any(|r| report_releases(g.current.get(&r.shard), &req.member_id, r, false, stale_ok));
    let refence_due = req.fenced.iter().any(|r| refence_applies(g.current.get(&r.shard), &req.member_id, r));
    let sync_mark_due = g.correction.as_ref().is_some_and(|round| {
        req.metadata_version == g.metadata_version && !round.synced_members.contains(&req.member_id)
    });
    if acks_due || refence_due || sync_mark_due {
        return None;
    }
    // An index built from another state is ignored (a caller's mistake must not change answers).
    let index = index.filter(|index| index.describes(g));
    let quiescent = match index {
        Some(index) => index.quiescent(g, ctx.observations, ctx.planted),
        None => is_quiescent(g, ctx.observations, ctx.planted),
    };
    // Checked in debug builds, except on states so large that the check's walk would hide what
    // the index saves (`tests/core_scale.rs` compares the two answers there).
    debug_assert!(
        index.is_none() || g.shard_count > 4_096 || quiescent == is_quiescent(g, ctx.observations, ctx.planted),
        "an index answers for the state it was built from as the scan does"
    );
    if !quiescent {
        return None;
    }
    let shards = match index {
        Some(index) => index.member(&req.member_id),
        None => MemberShards::scan(g, &req.member_id),
    };
    debug_assert!(
        index.is_none() || g.shard_count > 4_096 || shards == MemberShards::scan(g, &req.member_id),
        "an index answers for the state it was built from as the scan does"
    );
    let status = status_of(g, &req.member_id, &shards);
    Some(Ok(view_of(g, &req.member_id, status, ctx.stored_revision, shards)))
}

/// True when every shard in `owned` is recorded as owned or draining by `member`.
fn owns_all(g: &GroupMetadata, member: &str, owned: &[ShardId]) -> bool {
    owned.iter().all(|shard| {
        matches!(
            g.current.get(shard),
            Some(ShardOwner::Owned { member: m, .. } | ShardOwner::Revoking { member: m, .. }) if m == member
        )
    })
}

/// A known member reported a version above the stored one: apply only REVOKED reports that name
/// the revoke recorded now, and answer SYNC_METADATA. A report is true whatever history the client
/// saw only because it names one revoke instruction, whose id is random and never reused: the
/// client drained *that* revoke, which is still the recorded one. (Before revoke ids, this path
/// assumed any REVOKED report was true — a stale report then released a later revoke.)
fn sync_ahead(tx: &mut Transition<'_>, g: &GroupMetadata, req: &HeartbeatRequest) -> Result<Step, ApiError> {
    let member = known_member(g, &req.member_id)?;
    if req.member_epoch >= member.incarnation_epoch {
        accept_acks(tx, req);
    }
    Ok(Step::Member)
}

/// The normal path: epoch and ownership checks, REVOKED acks, sync mark, leave.
fn steady(tx: &mut Transition<'_>, g: &GroupMetadata, req: &HeartbeatRequest) -> Result<Step, ApiError> {
    let member = known_member(g, &req.member_id)?;
    if req.member_epoch < member.incarnation_epoch || req.member_epoch > member.member_epoch {
        return Err(ApiError::new(
            ErrorCode::FencedMemberEpoch,
            format!(
                "member epoch {} is not in {}..={}",
                req.member_epoch, member.incarnation_epoch, member.member_epoch
            ),
        ));
    }
    if let Some(shard) = req.owned.iter().find(|s| !owns_all(g, &req.member_id, &[**s])) {
        return Err(ApiError::new(
            ErrorCode::FencedMemberEpoch,
            format!("member reports shard {shard} that is not recorded as its own"),
        ));
    }
    accept_acks(tx, req);
    for report in &req.fenced {
        tx.refence(&req.member_id, report);
    }
    if req.metadata_version == g.metadata_version {
        tx.synced(&req.member_id);
    }
    if req.leave {
        tx.leave(&req.member_id);
        return Ok(Step::Left);
    }
    Ok(Step::Member)
}

fn accept_acks(tx: &mut Transition<'_>, req: &HeartbeatRequest) {
    for report in &req.revoking {
        tx.accept_revoked(&req.member_id, report, req.leave);
    }
}

/// Whether `req` may act for the member incarnation it names (DESIGN §9): a member recorded with
/// a session digest accepts only heartbeats carrying that secret. A join with another (or no)
/// secret is another process claiming a live member's id: `MEMBER_ID_IN_USE` until that
/// incarnation leaves or expires; any other heartbeat is `SESSION_MISMATCH`. Members recorded
/// without a digest (older records and clients) and unknown members pass; the rest of the
/// decision judges them. Pure: the service calls it before the liveness touch as well, so a
/// refused request leaves no trace.
pub fn check_session(g: &GroupMetadata, req: &HeartbeatRequest, planted: PlantedBugs) -> Result<(), ApiError> {
    let Some(digest) = g.members.get(&req.member_id).and_then(|m| m.session.as_ref()) else { return Ok(()) };
    if digest.admits(req.member_session.as_ref()) || (req.leave && planted.has(PlantedBug::AcceptForgedLeave)) {
        return Ok(());
    }
    let id = &req.member_id;
    Err(if req.member_epoch == 0 {
        ApiError::new(
            ErrorCode::MemberIdInUse,
            format!("member id {id} belongs to a live incarnation of another process; retry once it leaves or expires"),
        )
    } else {
        ApiError::new(ErrorCode::SessionMismatch, format!("the heartbeat does not carry the session of member {id}"))
    })
}

/// True when a join is a repeat of the join that created the member's current incarnation: the
/// same process (its session admits it) and a sender that never saw this incarnation (its
/// `metadataVersion` is below the incarnation's epoch, which is the version the incarnation was
/// created at). That is a retry after a lost join answer, or a late duplicate delivered by a
/// retrying proxy: it is answered with the current incarnation's view and records nothing, where
/// re-incarnating would fence the member's own shards. A process that saw the incarnation and
/// joins again (after FENCED, UNKNOWN_MEMBER or SESSION_MISMATCH) gets a new one, as before.
fn repeats_a_join(g: &GroupMetadata, req: &HeartbeatRequest) -> bool {
    g.members.get(&req.member_id).is_some_and(|member| {
        member.state == MemberState::Active
            && member.session.as_ref().is_some_and(|digest| digest.admits(req.member_session.as_ref()))
            && req.metadata_version < member.incarnation_epoch
    })
}

/// The epoch of the departed incarnation a join repeats, if it does: no member of that id is
/// recorded, and a recorded departure ([`GroupMetadata::departed`]) has its session and an epoch
/// above the join's `metadataVersion`. The sender never saw that incarnation, which has left, so
/// this is a copy of the join that created it, delivered late (a retrying proxy, a duplicated
/// request): recorded, it would be a member nobody runs, holding target shards until its TTL and
/// stalling the rebalance the leave started. A process that did see the incarnation names a
/// version at or past its epoch and joins as usual.
fn repeats_a_departed_join(g: &GroupMetadata, req: &HeartbeatRequest) -> Option<u64> {
    if req.member_epoch != 0 || req.leave || g.members.contains_key(&req.member_id) {
        return None;
    }
    g.departed
        .iter()
        .find(|d| {
            d.member == req.member_id
                && d.session.admits(req.member_session.as_ref())
                && req.metadata_version < d.incarnation_epoch
        })
        .map(|d| d.incarnation_epoch)
}

fn known_member<'g>(g: &'g GroupMetadata, id: &str) -> Result<&'g super::model::Member, ApiError> {
    let member = g
        .members
        .get(id)
        .ok_or_else(|| ApiError::new(ErrorCode::UnknownMember, format!("member {id} is not recorded; rejoin")))?;
    if member.state == MemberState::Fenced {
        return Err(ApiError::new(ErrorCode::FencedMemberEpoch, "member was fenced; rejoin with epoch 0"));
    }
    Ok(member)
}

/// Why a heartbeat is refused before anything is decided (`BAD_REQUEST`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum HeartbeatRefused {
    /// The request fails a check that needs no state (numbers, member id, shard lists).
    #[error(transparent)]
    Input(#[from] InputError),
    /// The body names another group than the one loaded.
    #[error("heartbeat group does not match")]
    GroupMismatch,
    /// A new member would pass [`MEMBERS_MAX`].
    #[error("group already has {MEMBERS_MAX} members")]
    GroupFull,
}

/// Structural checks on a heartbeat; ownership is checked against recorded state later.
fn check_heartbeat(g: &GroupMetadata, req: &HeartbeatRequest) -> Result<(), HeartbeatRefused> {
    if req.group != g.group {
        return Err(HeartbeatRefused::GroupMismatch);
    }
    check_heartbeat_request(req)?;
    let id = &req.member_id;
    if req.member_epoch == 0 && !g.members.contains_key(id) && g.members.len() >= MEMBERS_MAX {
        return Err(HeartbeatRefused::GroupFull);
    }
    Ok(())
}

/// The status a recorded state gives a member (seed: OK only when nothing blocks it).
pub fn status_for(g: &GroupMetadata, member: &str) -> HeartbeatStatus {
    status_of(g, member, &MemberShards::scan(g, member))
}

/// [`status_for`], given the member's shards in `g`.
fn status_of(g: &GroupMetadata, member: &str, shards: &MemberShards) -> HeartbeatStatus {
    match &g.correction {
        Some(round) if !round.synced_members.contains(member) => HeartbeatStatus::SyncMetadata,
        Some(_) => HeartbeatStatus::RevokePending,
        None if !shards.revoke.is_empty() || !shards.pending.is_empty() => HeartbeatStatus::RevokePending,
        None => HeartbeatStatus::Ok,
    }
}

/// The member's view of a recorded state. Repeatable: the same state gives the same view.
pub fn member_view(g: &GroupMetadata, member: &str, status: HeartbeatStatus, revision: u64) -> HeartbeatResponse {
    view_of(g, member, status, revision, MemberShards::scan(g, member))
}

/// [`member_view`], given the member's shards in `g`.
fn view_of(
    g: &GroupMetadata,
    member: &str,
    status: HeartbeatStatus,
    revision: u64,
    shards: MemberShards,
) -> HeartbeatResponse {
    let epoch = g.members.get(member).map_or(0, |m| m.member_epoch);
    let MemberShards { assigned, revoke, drains, pending, fences } = shards;
    HeartbeatResponse {
        status,
        member_id: member.to_string(),
        member_epoch: epoch,
        metadata_version: g.metadata_version,
        assignment_epoch: g.assignment_epoch,
        shard_count: g.shard_count,
        assigned,
        pending,
        revoke,
        drains,
        assignment_lease_ms: g.config.assignment_lease_ms,
        heartbeat_interval_ms: g.config.heartbeat_interval_ms,
        store_revision: revision,
        fences,
        metadata_version_proof: g.view_key.map(|key| key.prove(&g.group, Fact::MetadataVersion, g.metadata_version)),
    }
}

fn left_response(g: &GroupMetadata, member: &str, revision: u64) -> HeartbeatResponse {
    HeartbeatResponse {
        assigned: Vec::new(),
        pending: Vec::new(),
        revoke: Vec::new(),
        drains: Vec::new(),
        member_epoch: 0,
        ..member_view(g, member, HeartbeatStatus::Ok, revision)
    }
}

/// How long a coordinator may leave `g` unticked after observing `obs` (quinn-proto's
/// `poll_timeout` pattern: the core says when it next needs attention).
///
/// `None`: a time-driven rule may come due at any moment — a recorded wait (a revoking or fenced
/// shard, a correction round, a lease transition), a reconciliation step, or an expiry already
/// due — so the group is ticked every pass. Otherwise the group is *idle*: no member is joining,
/// leaving, draining or expiring and no round runs, so nothing can change without a request
/// (which the answering coordinator ticks at once) except a member's expiry, and the deferral
/// ends no later than the earliest member's expiry as observed (`unchanged_ms`), and no later
/// than a quarter of the member TTL after this process last learnt anything of a member: from a
/// read, a quarter TTL from now (the caller just read); from the member's own heartbeat through
/// this process (`heard`), a quarter TTL after that heartbeat. A silence is so noticed at most a
/// quarter TTL late. Until then a heard member needs no read: a heartbeat here restarts its
/// window (the caller may renew the deferral from its windows without reading only while every
/// member's is heard within a quarter TTL). Without members, `u64::MAX`: the caller's own audit
/// period bounds it.
pub fn tick_deferral_ms(g: &GroupMetadata, obs: &Observations, planted: PlantedBugs) -> Option<u64> {
    let waiting = g.correction.is_some()
        || g.lease_transition.is_some()
        || g.current.values().any(|o| !matches!(o, ShardOwner::Owned { .. }));
    if waiting || !is_quiescent(g, obs, planted) {
        return None;
    }
    let ttl = g.effective_member_lease_ttl_ms();
    let quarter = ttl / 4;
    let mut earliest = u64::MAX;
    for member in g.members.keys() {
        let cap = match obs.liveness.get(member) {
            Some(seen) => {
                let left = ttl.checked_sub(seen.unchanged_ms).filter(|left| *left > 0)?;
                match quarter.checked_sub(seen.unchanged_ms).filter(|fresh| seen.heard && *fresh > 0) {
                    Some(fresh) => left.min(fresh),
                    None => left.min(quarter),
                }
            }
            None => quarter,
        };
        earliest = earliest.min(cap);
    }
    Some(earliest)
}

/// Whether a coordinator whose deferral of `g` ran out may compute it again from `obs` without
/// reading ([`tick_deferral_ms`]): only what heartbeats through it told within a quarter member
/// TTL stands in for a read. A member known from a read, or heard too long ago (its heartbeats
/// may have moved to another coordinator), needs one.
pub fn deferral_renewable_without_read(g: &GroupMetadata, obs: &Observations) -> bool {
    let quarter = g.effective_member_lease_ttl_ms() / 4;
    g.members.keys().all(|m| obs.liveness.get(m).is_some_and(|seen| seen.heard && seen.unchanged_ms < quarter))
}

/// Decides a periodic tick: member expiry, rebalance-timeout fencing, and every time-driven rule.
pub fn decide_tick(g: &GroupMetadata, ctx: Context<'_>) -> Decision<()> {
    let mut tx = Transition::new(g, ctx);
    let ttl = g.effective_member_lease_ttl_ms();
    let expired: Vec<(&str, u64)> = ctx
        .observations
        .liveness
        .iter()
        .filter(|(member, seen)| g.members.contains_key(*member) && seen.unchanged_ms >= ttl)
        .map(|(member, seen)| (member.as_str(), seen.value))
        .collect();
    tx.expire_all(&expired);
    let timed_out: std::collections::BTreeSet<String> = tx
        .next
        .current
        .values()
        .filter_map(|o| match o {
            ShardOwner::Revoking { member, wait, .. }
                if ctx.observations.waited_ms(*wait) >= g.config.rebalance_timeout_ms =>
            {
                Some(member.clone())
            }
            _ => None,
        })
        .collect();
    tx.fence_all(&timed_out.into_iter().collect::<Vec<_>>());
    // A member that has not adopted the round's version a rebalance timeout after the round began
    // holds every shard in the round: fenced, as above. Never before three heartbeat intervals:
    // a member learns of the round only at its next heartbeat, and syncs at the one after.
    let sync_timeout_ms = g.config.rebalance_timeout_ms.max(g.config.heartbeat_interval_ms.saturating_mul(3));
    let unsynced: Vec<super::model::MemberId> = match tx.next.correction.as_ref() {
        Some(round) if ctx.observations.waited_ms(round.wait) >= sync_timeout_ms => {
            tx.next.active_members().filter(|m| !round.synced_members.contains(*m)).cloned().collect()
        }
        _ => Vec::new(),
    };
    tx.fence_all(&unsynced);
    if ctx.observations.orphan_liveness.len() > ORPHAN_LIVENESS_MAX {
        tx.remove_orphan_liveness(&ctx.observations.orphan_liveness);
    }
    finished(tx)
}

/// The decision of a transition whose only outcome is its write.
fn finished(tx: Transition<'_>) -> Decision<()> {
    match tx.finish() {
        Ok(write) => Decision { write, outcome: Ok(()) },
        Err(exhausted) => Decision::refuse(exhausted),
    }
}

/// Records evidence of lost writes seen by the coordinator itself (identity change, revision
/// regression): starts a correction round if none is active.
pub fn decide_evidence(g: &GroupMetadata, evidence: LossEvidence, ctx: Context<'_>) -> Decision<()> {
    let mut tx = Transition::new(g, ctx);
    tx.start_round(evidence);
    finished(tx)
}

/// The producer routing view of a recorded state (read-only).
pub fn routing_view(g: &GroupMetadata, revision: u64) -> RoutingResponse {
    RoutingResponse {
        group: g.group.clone(),
        metadata_version: g.metadata_version,
        shard_count: g.shard_count,
        stream_keys: (0..g.shard_count).map(|s| g.group.stream_key(s)).collect(),
        routing_cache_ttl_ms: g.config.routing_cache_ttl_ms,
        routing_refresh_interval_ms: g.config.routing_refresh_interval_ms,
        store_revision: revision,
        lost_version: None,
        accepts_known_shard_count: true,
        metadata_version_proof: g.view_key.map(|key| key.prove(&g.group, Fact::MetadataVersion, g.metadata_version)),
        shard_count_proof: g.view_key.map(|key| key.prove(&g.group, Fact::ShardCount, u64::from(g.shard_count))),
    }
}

/// Decides a producer's routing refresh that reported the metadataVersion it has cached and the
/// highest shard count it published with ([`RoutingReport`]).
///
/// - A version above the stored one is evidence of lost writes, exactly like a consumer's report:
///   it is recorded (a correction round; later versions skip past it) and the answer tells the
///   producer its view is lost (`lostVersion`).
/// - A shard count above the recorded one is evidence of a lost `add-shards` whose new shards
///   hold acknowledged entries: unless the group turned healing off, the shards are added again
///   (shards are only ever added, so this cannot break exclusive ownership), recorded with reason
///   `recovered-lost-add-shards`, at a version above every version any client reported.
/// - Anything else is the read-only view. Numbers above their bounds are `BAD_REQUEST`.
pub fn decide_routing(g: &GroupMetadata, report: RoutingReport, ctx: Context<'_>) -> Decision<RoutingResponse> {
    if let Err(refused) = check_routing_report(&report) {
        return Decision::reject(ErrorCode::BadRequest, refused.to_string());
    }
    let mut tx = Transition::new(g, ctx);
    if version_credited(g, report.known_version, report.known_version_proof.as_ref(), ctx.planted) {
        tx.record_client_version(
            report.known_version,
            version_proven(g, report.known_version, report.known_version_proof.as_ref()),
        );
    } else if version_learned(g, report.known_version) {
        tx.learn_client_version(report.known_version);
    }
    if heals_lost_add_shards(g, &report, ctx.planted) && !ctx.planted.has(PlantedBug::SkipAddShardsHealing) {
        tx.add_shards(report.known_shard_count, ReshardReason::RecoveredLostAddShards);
    }
    let (write, revision) = match ctx.finish(tx) {
        Ok(finished) => finished,
        Err(exhausted) => return Decision::refuse(exhausted),
    };
    let state = write.next.as_ref().unwrap_or(g);
    let mut view = routing_view(state, revision);
    view.lost_version = (report.known_version > state.metadata_version).then_some(report.known_version);
    Decision { write, outcome: Ok(view) }
}

/// Whether a routing report is evidence of a lost `add-shards` this group heals: a count above
/// the recorded one, proven issued by this deployment (DESIGN §8). A keyless record heals no
/// count: nothing in it can check one, and shards added are never removed ([`credited`]).
pub fn heals_lost_add_shards(g: &GroupMetadata, report: &RoutingReport, planted: PlantedBugs) -> bool {
    g.config.heal_lost_add_shards
        && report.known_shard_count > g.shard_count
        && (planted.has(PlantedBug::CreditUnprovenReports)
            || credited(
                g.view_key.as_ref(),
                &g.group,
                Fact::ShardCount,
                u64::from(report.known_shard_count),
                report.known_shard_count_proof.as_ref(),
            ))
}

/// Whether a client's reported `metadataVersion` may be credited as evidence of lost writes when
/// it is above the stored one: proven issued by this deployment (DESIGN §4). An unproven version
/// ahead is still answered as ahead (the client adopts the recorded view), but starts no round.
pub fn version_credited(g: &GroupMetadata, version: u64, proof: Option<&ViewProof>, planted: PlantedBugs) -> bool {
    version <= g.metadata_version
        || planted.has(PlantedBug::CreditUnprovenReports)
        || credited(g.view_key.as_ref(), &g.group, Fact::MetadataVersion, version, proof)
}

/// Whether a reported `metadataVersion` is proven by the record's key (not merely credited by a
/// keyless record, which credits any version): a number this group's own history issued, credited
/// up to [`PROVEN_VERSION_AHEAD_MAX`](super::model::PROVEN_VERSION_AHEAD_MAX) ahead.
pub fn version_proven(g: &GroupMetadata, version: u64, proof: Option<&ViewProof>) -> bool {
    g.view_key
        .as_ref()
        .is_some_and(|key| proof.is_some_and(|p| key.verifies(&g.group, Fact::MetadataVersion, version, p)))
}

/// Whether an uncredited version ahead is still learned (DESIGN §8): during the round of a
/// recreate that knew no key of the lost record, so that no version the lost history issued is
/// issued again ([`CorrectionRound::unverified_lineage`](super::model::CorrectionRound)). It
/// restarts nothing, and a version already learned (or past the learning bound, which
/// `Transition::learn_client_version` applies) writes nothing and takes no critical section.
pub fn version_learned(g: &GroupMetadata, version: u64) -> bool {
    let learnable = version.min(g.metadata_version.saturating_add(CLIENT_VERSION_AHEAD_MAX));
    learnable > g.max_client_version_seen.max(g.metadata_version)
        && g.correction.as_ref().is_some_and(|round| round.unverified_lineage)
}

pub use super::admin::decide_admin;

#[cfg(test)]
mod tests;
