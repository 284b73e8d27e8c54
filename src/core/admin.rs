//! Admin mutations: create a group, add shards, change config, delete. Every mutation but create
//! names the revision it was computed from; a mismatch is `REVISION_CONFLICT`, never an overwrite.
//! Stateless checks (revision bound, shard count range, config rules) come first, from
//! [`super::input::check_admin_request`], before the recorded state is even looked at.

use super::engine::{Context, Decision};
use super::input::check_admin_request;
use super::model::{GroupConfig, GroupMetadata, LeaseTransition, LossEvidence, ReshardReason, SHARD_COUNT_MAX};
use super::proof::ViewKey;
use super::protocol::{AdminRequest, AdminResponse, ApiError, ErrorCode};
use super::transition::{Transition, Written};

/// How a create of an absent record is made (ignored by every other mutation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Creation {
    /// Nothing says the group existed: a new group, with the caller's fresh view key.
    Plain,
    /// The group was known (index, or this process held it) but its metadata key is gone: the new
    /// record starts with a correction round, because consumers of the lost record may still hold
    /// leases. `lost_key` is the view key of the lost record when the caller remembers it (DESIGN
    /// §8): the record keeps it, so the proofs clients got from the lost history still verify and
    /// a made-up report still does not. Without it the record takes the caller's fresh key, and
    /// its round learns the lost history's versions without crediting them.
    Recreate { lost_key: Option<ViewKey> },
}

/// Decides an admin mutation against the loaded state (`None`: the key is absent); `creation`
/// says how a create of an absent record is made.
/// A `DeleteGroup` decision writes nothing: the caller deletes with the checked revision.
pub fn decide_admin(
    g: Option<&GroupMetadata>,
    req: &AdminRequest,
    creation: Creation,
    ctx: Context<'_>,
) -> Decision<AdminResponse> {
    let group = req.group().clone();
    if let Err(message) = group.validate() {
        return reject(ErrorCode::BadRequest, message);
    }
    if let Err(refused) = check_admin_request(req) {
        return reject(ErrorCode::BadRequest, refused.to_string());
    }
    let Some(g) = g else {
        return match req {
            AdminRequest::CreateGroup { shard_count, config, .. } => create(group, *shard_count, config, creation, ctx),
            _ => reject(ErrorCode::GroupNotFound, format!("group {group} does not exist")),
        };
    };
    let expected = match req {
        AdminRequest::CreateGroup { .. } => {
            return reject(ErrorCode::GroupExists, format!("group {group} already exists"));
        }
        AdminRequest::AddShards { expected_revision, .. }
        | AdminRequest::ChangeConfig { expected_revision, .. }
        | AdminRequest::DeleteGroup { expected_revision, .. } => *expected_revision,
    };
    if expected != ctx.stored_revision {
        return reject(
            ErrorCode::RevisionConflict,
            format!("expected revision {expected}, stored revision is {}", ctx.stored_revision),
        );
    }
    if let AdminRequest::ChangeConfig { config, .. } = req {
        if let Some(refused) = lease_above_ceiling(g, config, ctx.observations.lease_ceiling_ms) {
            return reject(ErrorCode::BadRequest, refused);
        }
    }
    let mut tx = Transition::new(g, ctx);
    let checked = match req {
        AdminRequest::AddShards { new_shard_count, .. } => add_shards(&mut tx, *new_shard_count),
        AdminRequest::ChangeConfig { config, .. } => {
            change_config(&mut tx, config);
            Ok(())
        }
        AdminRequest::DeleteGroup { .. } => {
            if let Some(holding) = still_held(g) {
                return reject(ErrorCode::GroupNotEmpty, format!("group {group} is not empty: {holding}"));
            }
            let response = AdminResponse { group, store_revision: 0, metadata_version: g.metadata_version };
            return Decision { write: Written::default(), outcome: Ok(response) };
        }
        AdminRequest::CreateGroup { .. } => unreachable!("handled above"),
    };
    if let Err(message) = checked {
        return reject(ErrorCode::BadRequest, message);
    }
    let (write, store_revision) = match ctx.finish(tx) {
        Ok(finished) => finished,
        Err(exhausted) => return Decision::refuse(exhausted),
    };
    let state = write.next.as_ref().unwrap_or(g);
    let response = AdminResponse { group, store_revision, metadata_version: state.metadata_version };
    Decision { write, outcome: Ok(response) }
}

/// Why a config change must be refused for its assignment lease, if it must: the lease may not
/// go above the deployment's ceiling (`ceiling_ms`, 0: none; correction rounds rely on no
/// coordinator granting a longer lease), but a change that keeps or shortens a recorded lease
/// already above it is let through. Such a lease was recorded before the ceiling was set (an
/// upgrade to a release that has one, or a ceiling lowered later); round waits cover it
/// ([`GroupMetadata::round_wait_ms`] takes the longer of the two), and refusing every change to
/// the group would also refuse the one that fixes it, such as turning fencing off or shortening
/// the lease itself.
pub fn lease_above_ceiling(g: &GroupMetadata, config: &GroupConfig, ceiling_ms: u64) -> Option<String> {
    let lease = config.assignment_lease_ms;
    if ceiling_ms == 0 || lease <= ceiling_ms || lease <= g.config.assignment_lease_ms {
        return None;
    }
    Some(format!(
        "assignmentLeaseMs {lease} exceeds this coordinator's maximum assignment lease ({ceiling_ms} ms, \
         --max-assignment-lease-ms); raise it on every instance first"
    ))
}

/// Why a delete must wait, if it must: a group is deleted only when nobody may still read any of
/// its shards. A create of the same name afterwards starts with nothing to wait for (a plain
/// create grants at once), so deleting a group whose members or leases live would let the new
/// group grant a shard its old owner still reads (with fencing off, a split). Like Kafka's
/// `GROUP_NOT_EMPTY`: members leave (or expire), their shards' leases run out at a tick, then the
/// delete goes through. The service asks again of the very record it deletes.
pub fn still_held(g: &GroupMetadata) -> Option<String> {
    if let Some(member) = g.members.keys().next() {
        return Some(format!("{} member(s), e.g. {member}; stop them or wait for them to expire", g.members.len()));
    }
    if let Some(shard) = g.current.keys().next() {
        return Some(format!(
            "{} shard(s), e.g. shard {shard}, still held or waiting for a lease to run out; retry after one assignment lease",
            g.current.len()
        ));
    }
    if g.correction.is_some() {
        return Some("a correction round is running; retry once it ends".to_string());
    }
    None
}

fn reject<R>(code: ErrorCode, message: impl Into<String>) -> Decision<R> {
    Decision { write: Written::default(), outcome: Err(ApiError::new(code, message)) }
}

/// Creates the record; the shard count and config were checked by `check_admin_request`.
fn create(
    group: super::model::GroupId,
    shard_count: u32,
    config: &super::model::GroupConfig,
    creation: Creation,
    ctx: Context<'_>,
) -> Decision<AdminResponse> {
    let view_key = ctx.fresh_view_key;
    if view_key.is_none() && !matches!(creation, Creation::Recreate { lost_key: Some(_) }) {
        // The caller could not draw a key (the OS refused randomness): a keyless group would
        // credit every client's report (DESIGN §8), so nothing is created; the operator retries.
        return reject(ErrorCode::Internal, "no randomness for the group's view-proof key; nothing was created");
    }
    let mut next = GroupMetadata::new(group.clone(), shard_count, config.clone());
    // Versions start past the clock, as TCP picks an initial sequence number: a create after a
    // loss that took the record, its index entry and every process's memory of them (a plain
    // create: nothing here can tell that from a group that never existed) must not issue the
    // lost history's version numbers again, and clients still hold them (swarm seed 5278).
    next.metadata_version = first_metadata_version(ctx.wall_clock_secs, ctx.nonce);
    next.incarnation = Some(next.metadata_version);
    // Wait ids start at a random point: every coordinator process times the waits it observes by
    // (group, wait id), and one that never saw the delete would otherwise credit an earlier
    // incarnation's wait 1 to this one's wait 1.
    next.next_wait_id = first_wait_id(ctx.nonce);
    next.view_key = match creation {
        Creation::Plain => view_key,
        // The lost record's key: proofs of the lost history verify, forged reports do not.
        Creation::Recreate { lost_key: Some(key) } => Some(key),
        // No key known: the proofs clients hold are under a key nothing here has. A fresh key,
        // and a round that learns the lost history's versions without crediting them
        // (`CorrectionRound::unverified_lineage`).
        Creation::Recreate { lost_key: None } => view_key,
    };
    if matches!(creation, Creation::Recreate { .. }) {
        let wait = match next.allocate_wait(ctx.nonce) {
            Ok(wait) => wait,
            Err(exhausted) => return Decision::refuse(exhausted),
        };
        next.correction = Some(super::model::CorrectionRound {
            reason: LossEvidence::MetadataLost,
            wait,
            synced_members: Default::default(),
            unverified_lineage: matches!(creation, Creation::Recreate { lost_key: None }),
            proven_version: 0,
        });
    }
    let response = AdminResponse { group, store_revision: 1, metadata_version: next.metadata_version };
    Decision { write: Written { next: Some(next), ..Written::default() }, outcome: Ok(response) }
}

fn add_shards(tx: &mut Transition<'_>, new_shard_count: u32) -> Result<(), String> {
    let from = tx.next.shard_count;
    if new_shard_count <= from || new_shard_count > SHARD_COUNT_MAX {
        let lowest = from.saturating_add(1);
        return Err(format!("newShardCount must be in {lowest}..={SHARD_COUNT_MAX} (shards are only added)"));
    }
    tx.add_shards(new_shard_count, ReshardReason::Operator);
    Ok(())
}

/// Replaces the config; its rules were checked by `check_admin_request`.
fn change_config(tx: &mut Transition<'_>, config: &super::model::GroupConfig) {
    let old = tx.next.config.clone();
    if config.assignment_lease_ms < old.assignment_lease_ms || config.member_lease_ttl_ms < old.member_lease_ttl_ms {
        // Grants made under the old values keep running: keep them in force for one old lease.
        let wait = tx.allocate_wait();
        tx.next.lease_transition = Some(LeaseTransition {
            assignment_lease_ms: tx.next.effective_assignment_lease_ms(),
            member_lease_ttl_ms: tx.next.effective_member_lease_ttl_ms(),
            wait,
        });
    }
    if config.assignor != old.assignor {
        tx.mark_retarget();
    }
    tx.next.config = config.clone();
    tx.mark_visible();
}

/// The first `metadataVersion` of a created group: the wall clock's seconds (capped at 2^36, the
/// year 4147) times 2^16, plus 16 bits of the decision's fresh randomness, plus one. So an
/// incarnation created `d` seconds after another starts above every version the earlier one
/// issued if that one issued fewer than 65,536 × (`d` − 1) (the random bits take up to one
/// second's worth) and the two clocks agreed; otherwise, and for two creates in one second, an
/// exact repeat of one of its numbers is about a one in 65,536 chance per number. A clock that
/// reads 0 (unset, or before 1970) leaves only the random bits (the caller logs it). At most
/// 2^52, so 2^52 versions remain below [`CLIENT_NUMBER_MAX`](super::model::CLIENT_NUMBER_MAX).
/// Nothing safe relies on it: it only keeps a lost history's numbers, which no proof can vouch
/// for, from being issued again.
pub fn first_metadata_version(wall_clock_secs: u64, nonce: u64) -> u64 {
    const SECS_MAX: u64 = (1 << 36) - 1;
    ((wall_clock_secs.min(SECS_MAX) << 16) | (nonce >> 48)) + 1
}

/// The first [`WaitId`](super::model::WaitId) of a created group: the low 48 bits of the decision's
/// fresh randomness (the bits [`first_metadata_version`] does not use), plus one.
///
/// A coordinator process measures each wait from when *it* first observed that (group, wait id)
/// ([`LocalView`](super::observe::LocalView)) and forgets a group only when it deletes it itself or
/// a later sweep finds it gone. Had every incarnation counted from 1, a process that did not see a
/// delete and a create through another instance would find the new incarnation's first wait already
/// observed for as long as it watched the old one's, and release a shard at once (a split with
/// fencing off). Two incarnations that record `n` waits each share an id with probability about
/// `2n / 2^48`. Within one incarnation ids still only go up; a rollback rewinds the counter and
/// reissues them, which is why processes time a wait by its id and its
/// [tag](super::model::GroupMetadata::wait_tags), drawn per allocation from fresh randomness
/// (DESIGN §4). Older binaries time by id alone, so the random start still matters to them.
/// At most 2^48, so 2^53 − 2^48 allocations remain below
/// [`CLIENT_NUMBER_MAX`](super::model::CLIENT_NUMBER_MAX).
pub fn first_wait_id(nonce: u64) -> super::model::WaitId {
    (nonce & ((1 << 48) - 1)) + 1
}
