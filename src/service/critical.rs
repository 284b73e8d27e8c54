//! The critical section and the coordinator's small helpers: local monitor -> shutdown gate ->
//! Redis mutex -> load -> decide -> conditional write. The mutex is an optimisation that keeps
//! coordinators from wasting CAS attempts; the write condition is what keeps a stalled holder's
//! write out (it fails and is retried against fresh state). The condition is the loaded record's
//! whole stamp, revision and writeId: revisions repeat after a rollback, so a holder that loaded
//! revision r before a loss must not write over another write of r made after it.

use std::collections::BTreeMap;
use std::sync::{Arc, MutexGuard};

use rand::Rng;
use tokio::time::{Duration, Instant};

use super::codec::{decode, encode};
use super::coordinator::{Coordinator, LocalState};
use super::counters::{
    self, FENCES_RAISED, GROUP_BUSY_REFUSALS, LIVENESS_GUARD_CONFLICTS, MEMBERS_EXPIRED, MEMBERS_FENCED,
    METADATA_CAS_GIVE_UPS, METADATA_REVISION_CONFLICTS, METADATA_SCHEMA_ERRORS, REDIS_MUTEX_GIVE_UPS, SHARDS_FENCED,
};
use super::marks::{write_digest, Observed};
use crate::core::fence::{attach_fences, unfenced_grants, CarriesFences};
use crate::core::model::{
    Fence, GroupId, GroupMetadata, MemberId, MemberState, ShardId, ShardOwner, WaitId, LAYOUT_VERSION, SCHEMA_VERSION,
};
use crate::core::proof::ViewKey;
use crate::core::protocol::{ApiError, ErrorCode};
use crate::core::{Context, Decision, Observations, PlantedBug};
use crate::store::{keys, FenceRaise, MetadataStore, StoreError, StoredRecord, WriteOutcome, WriteRequest};

/// The `group` label of `rsc_metadata_missing_total` for a group this process holds nothing of
/// (only a client says it existed).
pub const UNSEEN_GROUP: &str = "(not seen by this instance)";

/// In the message of a `METADATA_MISSING` answer for such a group: the HTTP edge logs those at
/// ERROR at most once per period (`http::error`), since any client can ask for them.
pub const UNSEEN_MISSING: &str =
    "this instance holds nothing of it and the index does not list it: only a client says it existed";

impl<S: MetadataStore> Coordinator<S> {
    /// Runs one critical section: `decide(state, revision, observations)` against fresh state,
    /// writes its next state conditioned on the loaded record's stamp, and returns its outcome
    /// only once written.
    ///
    /// Every load a decision is made on is judged for loss evidence, as the read before the
    /// section was: when a load went back (a rollback landing between that read and this one), or
    /// the section's own recheck found the identity changed, the correction round is recorded in
    /// this section first, and the request is decided on the record the round wrote. Before, such
    /// a load was decided on unjudged, and a join queued across a silent rollback was answered `OK`
    /// for the shards of a member whose join was lost, beside that member's lease (a concurrency
    /// review).
    pub(super) async fn critical<R: CarriesFences>(
        &self,
        group: &GroupId,
        with_liveness: bool,
        decide: impl FnMut(Option<&GroupMetadata>, u64, &Observations) -> Decision<R>,
    ) -> Result<R, ApiError> {
        self.section(group, with_liveness, decide, true).await
    }

    /// [`Self::critical`] for the section that records loss evidence: its loads are not judged
    /// (the round it records is what a judged load would ask for).
    pub(super) async fn critical_recording_evidence<R: CarriesFences>(
        &self,
        group: &GroupId,
        decide: impl FnMut(Option<&GroupMetadata>, u64, &Observations) -> Decision<R>,
    ) -> Result<R, ApiError> {
        self.section(group, false, decide, false).await
    }

    async fn section<R: CarriesFences>(
        &self,
        group: &GroupId,
        with_liveness: bool,
        mut decide: impl FnMut(Option<&GroupMetadata>, u64, &Observations) -> Decision<R>,
        judged: bool,
    ) -> Result<R, ApiError> {
        let max = self.inner.options.group_sections_max;
        let Some(monitor) = self.inner.monitors.enter(group, max) else {
            self.inner.metrics.count(&GROUP_BUSY_REFUSALS, vec![]);
            return Err(ApiError::new(
                ErrorCode::StoreUnavailable,
                format!(
                    "group {group} is busy: {max} of its requests are already in or waiting for its critical section \
                     on this instance; retry"
                ),
            ));
        };
        let _monitor = monitor.lock().await;
        let _entered = self.inner.gate.enter()?;
        self.recheck_identity_if_suspect(group).await?;
        // Armed before the acquire: a SET NX whose answer never arrived may still hold the mutex.
        let held = HeldMutex { coordinator: Some(self.clone()), group: group.clone(), token: self.token() };
        self.acquire_mutex(group, &held.token).await?;
        let result = self.attempts(group, with_liveness, &mut decide, judged).await;
        held.release().await;
        result
    }

    /// Records `evidence`'s correction round in the critical section its caller holds
    /// ([`Self::attempts`], unjudged). A boxed `dyn` future: [`Self::attempts`] awaits it, and
    /// its own future type would otherwise contain itself.
    fn record_round_in_section<'a>(
        &'a self,
        group: &'a GroupId,
        evidence: crate::core::model::LossEvidence,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ApiError>> + Send + 'a>> {
        Box::pin(async move {
            let mut record_round = |g: Option<&GroupMetadata>, rev: u64, obs: &Observations| match g {
                Some(g) => crate::core::decide_evidence(g, evidence.clone(), self.context(Some(g), rev, obs)),
                None => Decision { write: Default::default(), outcome: Ok(()) },
            };
            self.attempts(group, false, &mut record_round, false).await
        })
    }

    async fn attempts<R: CarriesFences>(
        &self,
        group: &GroupId,
        with_liveness: bool,
        decide: &mut impl FnMut(Option<&GroupMetadata>, u64, &Observations) -> Decision<R>,
        judged: bool,
    ) -> Result<R, ApiError> {
        for _ in 0..self.inner.options.cas_attempts_max {
            let ticket = self.local().reads.begin_read();
            let record = self.inner.store.load(group).await.map_err(|e| self.group_store_error(group, e))?;
            let state = match &record {
                Some(r) => Some(self.decode_counted(group, r)?),
                None => None,
            };
            if let (true, Some(r), Some(g)) = (judged, &record, &state) {
                let read =
                    Observed { revision: r.revision, incarnation: g.incarnation, write: write_digest(&r.write_id) };
                if let Some(evidence) = self.pending_evidence(group, read, ticket) {
                    // Recorded in this section (the group's monitor and mutex are held), then the
                    // request is decided on the record the round wrote.
                    let generation = self.local().identity_generation();
                    self.record_round_in_section(group, evidence).await?;
                    let mut local = self.local();
                    local.evidence_recorded.insert(group.clone(), generation);
                    local.regressed.remove(group);
                    continue;
                }
            }
            let revision = record.as_ref().map_or(0, |r| r.revision);
            let obs = match &state {
                Some(g) => {
                    let liveness = if with_liveness {
                        Some(self.inner.store.liveness(group).await.map_err(|e| self.store_error(e))?)
                    } else {
                        None
                    };
                    self.observe(g, liveness.as_ref())
                }
                None => Observations::default(),
            };
            let mut decision = decide(state.as_deref(), revision, &obs);
            let Some(mut next) = decision.write.next.take() else {
                return decision.outcome;
            };
            // Fence first, then record the grant with its value, then answer (DESIGN §10).
            if self.fence_grants(&mut next).await? {
                if let Ok(answer) = decision.outcome.as_mut() {
                    answer.refresh_fences(&next);
                }
            }
            if let Err(violation) = next.validate() {
                tracing::error!(%group, %violation, "refusing to record an invalid state");
                return Err(ApiError::new(ErrorCode::Internal, "refused to record an invalid state"));
            }
            let request = WriteRequest {
                expected: record.as_ref().map(StoredRecord::cas_stamp),
                aggregate: encode(&next)?,
                schema_version: SCHEMA_VERSION,
                layout_version: LAYOUT_VERSION,
                updated_at_ms: wall_clock_ms(),
                write_id: self.write_id(),
                liveness_guards: decision.write.liveness_guards.clone(),
                liveness_remove: decision.write.liveness_remove.clone(),
            };
            let written_record = StoredRecord {
                aggregate: request.aggregate.clone(),
                revision: 0,
                schema_version: request.schema_version,
                layout_version: request.layout_version,
                updated_at_ms: request.updated_at_ms,
                write_id: request.write_id.clone(),
            };
            match self.inner.store.write(group, request).await.map_err(|e| self.group_store_error(group, e))? {
                WriteOutcome::Written { revision: written } => {
                    // Only ticks read liveness, and only ticks remove members without their leave.
                    self.count_removals(state.as_deref(), &next, with_liveness);
                    let observed = Observed {
                        revision: written,
                        incarnation: next.incarnation,
                        write: write_digest(&written_record.write_id),
                    };
                    self.local().reads.observe_write(group, observed);
                    self.undefer_tick(group);
                    // Waits this write recorded start now on this process's clock (the write
                    // happened after every response derived from the state it replaces).
                    self.observe(&next, None);
                    // If the store dropped the write after all, the next read's stamp differs and
                    // replaces this entry: the cache never answers for a write Redis lacks.
                    let written_record = StoredRecord { revision: written, ..written_record };
                    if let Some(stamp) = written_record.stamp() {
                        self.relay_write(&next, &stamp);
                    }
                    self.note_view_key(group, &next);
                    self.inner.cache.put(group, written_record, Arc::new(next));
                    self.inner.metrics.forget_members(
                        &["rsc_member_heartbeat_age_seconds", "rsc_member_revoking_shards"],
                        &group.to_string(),
                        &decision.write.liveness_remove,
                    );
                    return decision.outcome;
                }
                WriteOutcome::RevisionConflict { .. } => {
                    self.inner.metrics.count(&METADATA_REVISION_CONFLICTS, vec![("group", group.to_string())])
                }
                WriteOutcome::LivenessChanged { .. } => {
                    self.inner.metrics.count(&LIVENESS_GUARD_CONFLICTS, vec![("group", group.to_string())])
                }
            }
        }
        self.inner.metrics.count(&METADATA_CAS_GIVE_UPS, vec![("group", group.to_string())]);
        Err(ApiError::new(ErrorCode::StoreUnavailable, "group metadata kept changing; retry"))
    }

    /// Raises the fence of every grant in `next` that needs one ([`unfenced_grants`]) and records
    /// the values in it; true when it attached any. One pipelined round trip per 1,024 of them
    /// (each under its own deadline; a failure leaves the earlier ones raised, as below). If
    /// the write then fails, the raised fences guard shards whose new grant was never recorded:
    /// nobody may read them (a shard is granted only once its previous owner can no longer), and
    /// a recorded owner refused by such a raise reports it and gets a new fence (`fenced`).
    async fn fence_grants(&self, next: &mut GroupMetadata) -> Result<bool, ApiError> {
        let shards = unfenced_grants(next);
        if shards.is_empty() {
            return Ok(false);
        }
        let raises: Vec<FenceRaise> = {
            let mut local = self.local();
            let keys = shards.iter().map(|shard| keys::fence_key(&next.group, *shard));
            // The wall clock as the floor of a key that holds no counter (`FenceRaise::floor`):
            // a vanished key's next counter stays above every earlier grant's (DESIGN §10).
            let floor = wall_clock_ms().min(FENCE_FLOOR_MAX);
            keys.map(|key| FenceRaise { key, nonce: local.write_rng.gen(), floor }).collect()
        };
        let fences = if self.inner.options.planted.has(PlantedBug::FenceAfterAnswer) {
            // The planted mistake: predict the next value and record it without raising the key.
            let keys: Vec<String> = raises.iter().map(|r| r.key.clone()).collect();
            let current = self.inner.store.read_fences(&keys).await.map_err(|e| self.store_error(e))?;
            let predicted = current.iter().zip(&raises);
            predicted.map(|(c, r)| Fence { counter: c.map_or(0, |c| c.counter) + 1, nonce: r.nonce }).collect()
        } else {
            self.inner.store.raise_fences(&raises).await.map_err(|e| self.group_store_error(&next.group, e))?
        };
        if fences.len() != shards.len() {
            return Err(self.store_error(StoreError::Protocol("fence raise answered the wrong count".into())));
        }
        let raised: BTreeMap<ShardId, Fence> = shards.into_iter().zip(fences).collect();
        attach_fences(next, &raised);
        self.inner.metrics.count_by(&FENCES_RAISED, vec![("group", next.group.to_string())], raised.len() as f64);
        Ok(true)
    }

    async fn acquire_mutex(&self, group: &GroupId, token: &str) -> Result<(), ApiError> {
        let started = Instant::now();
        let options = &self.inner.options;
        for _ in 0..options.mutex_attempts_max {
            let acquired = self.inner.store.acquire_mutex(group, token, options.mutex_ttl_ms).await;
            if acquired.map_err(|e| self.store_error(e))? {
                self.inner.metrics.observe(
                    "rsc_redis_mutex_wait_seconds",
                    "Time to acquire the per-group Redis mutex.",
                    vec![],
                    started.elapsed().as_secs_f64(),
                );
                return Ok(());
            }
            let jitter = self.local().rng.gen_range(0..=options.mutex_retry_ms);
            crate::time::sleep(Duration::from_millis(options.mutex_retry_ms + jitter)).await;
        }
        self.inner.metrics.count(&REDIS_MUTEX_GIVE_UPS, vec![("group", group.to_string())]);
        Err(ApiError::new(ErrorCode::StoreUnavailable, "group mutex is busy; retry"))
    }

    /// The context of one decision on `g` (`None`: no record). A group without a view-proof key
    /// gets a fresh one drawn from the OS (in the simulation madsim's `getrandom`, so per seed),
    /// which the decision records with its first write ([`crate::core::proof`]).
    pub(super) fn context<'a>(
        &self,
        g: Option<&GroupMetadata>,
        stored_revision: u64,
        observations: &'a Observations,
    ) -> Context<'a> {
        let nonce = self.local().rng.gen();
        let fresh_view_key = g.is_none_or(|g| g.view_key.is_none()).then(draw_view_key).flatten();
        // Only a create reads it (`core::first_metadata_version`): not every decision's syscall.
        let wall_clock_secs = if g.is_none() { wall_clock_ms() / 1000 } else { 0 };
        if g.is_none() && wall_clock_secs == 0 {
            tracing::warn!(
                "the wall clock reads 1970 or earlier: a group created now starts its versions at a random point below 65,537, not past the clock"
            );
        }
        Context {
            stored_revision,
            observations,
            planted: self.inner.options.planted,
            nonce,
            fresh_view_key,
            wall_clock_secs,
        }
    }

    pub(super) fn local(&self) -> MutexGuard<'_, LocalState> {
        // A poisoned lock only means a panic elsewhere; the windows are still consistent maps.
        self.inner.local.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A fresh `writeId`: the instance id and 64 bits from this process's own RNG (seeded per
    /// process like the mutex tokens, but a separate sequence so neither disturbs the other). Two
    /// instances that share a seed still differ by instance id.
    fn write_id(&self) -> String {
        let id: u64 = self.local().write_rng.gen();
        format!("{}-{id:016x}", self.inner.options.instance_id)
    }

    fn token(&self) -> String {
        let nonce: u64 = self.local().rng.gen();
        format!("{}-{nonce:016x}", self.inner.options.instance_id)
    }

    /// This process's monotonic clock, in ms since it started.
    pub(super) fn now_ms(&self) -> u64 {
        self.inner.started.elapsed().as_millis() as u64
    }

    pub(super) fn observe(&self, g: &GroupMetadata, liveness: Option<&BTreeMap<MemberId, u64>>) -> Observations {
        let now = self.now_ms();
        self.local().view.observe(now, g, liveness)
    }

    /// The decoded metadata of `record` (from the cache when it is the cached write), counting
    /// records that cannot be read.
    /// A heartbeat's observations: waits only ([`crate::core::LocalView::observe_waits`]).
    pub(super) fn observe_waits(&self, g: &GroupMetadata) -> Observations {
        let now = self.now_ms();
        self.local().view.observe_waits(now, g)
    }

    /// [`observe_waits`](Self::observe_waits), given the waits `g` records (its index's list).
    pub(super) fn observe_listed_waits(&self, g: &GroupMetadata, waits: &[WaitId]) -> Observations {
        let now = self.now_ms();
        self.local().view.observe_listed_waits(now, g, waits.iter().copied())
    }

    pub(super) fn decode_counted(
        &self,
        group: &GroupId,
        record: &StoredRecord,
    ) -> Result<Arc<GroupMetadata>, ApiError> {
        {
            // A tick deferral stands on the record it was computed from: any read that finds
            // another one (a member joined through another instance, and a describe or routing
            // read here saw it first) ends it, so the next pass ticks the group.
            let mut local = self.local();
            let stale = local
                .deferred
                .get(group)
                .is_some_and(|d| d.confirmed_stamp.is_none() || d.confirmed_stamp != record.stamp());
            if stale {
                local.deferred.remove(group);
            }
        }
        let decoded = |record: &StoredRecord| decode(group, record).inspect(|g| self.note_view_key(group, g));
        self.inner.cache.decode(group, record, decoded).inspect_err(|e| {
            if self.incompatible_log_turn(group) {
                tracing::error!(%group, message = %e.message, "stored metadata is incompatible; failing closed (logged once per 10 s per group)");
            } else {
                tracing::debug!(%group, message = %e.message, "stored metadata is incompatible; failing closed");
            }
            self.count_schema_error(group);
        })
    }

    /// [`store_error`](Self::store_error) for a call on `group`'s metadata: a hash not in this
    /// layout (a missing or malformed field) fails closed as `METADATA_INCOMPATIBLE` and counts as
    /// a schema/layout error, like an unreadable aggregate.
    pub(super) fn group_store_error(&self, group: &GroupId, error: StoreError) -> ApiError {
        let StoreError::Layout(detail) = error else { return self.store_error(error) };
        self.inner.cache.forget(group);
        if self.incompatible_log_turn(group) {
            tracing::error!(%group, %detail, "stored metadata hash is not in this layout; failing closed (logged once per 10 s per group)");
        } else {
            tracing::debug!(%group, %detail, "stored metadata hash is not in this layout; failing closed");
        }
        self.count_schema_error(group);
        ApiError::new(
            ErrorCode::MetadataIncompatible,
            format!("group {group}: metadata hash not in this layout: {detail}"),
        )
    }

    /// Counts what a recorded write took from members without their leave: members fenced,
    /// members a tick expired, and the shards taken from a member that may still hold them.
    /// Otherwise these show only in gauges that last less than a lease or half a member TTL,
    /// shorter than many scrape intervals.
    fn count_removals(&self, before: Option<&GroupMetadata>, after: &GroupMetadata, by_tick: bool) {
        let Some(before) = before else { return };
        let labels = || vec![("group", after.group.to_string())];
        if by_tick {
            let expired = before.members.keys().filter(|m| !after.members.contains_key(*m)).count();
            if expired > 0 {
                self.inner.metrics.count_by(&MEMBERS_EXPIRED, labels(), expired as f64);
            }
        }
        let fenced = |g: &GroupMetadata, m: &MemberId| g.members.get(m).is_some_and(|m| m.state == MemberState::Fenced);
        let newly_fenced = after.members.keys().filter(|m| fenced(after, m) && !fenced(before, m)).count();
        if newly_fenced > 0 {
            self.inner.metrics.count_by(&MEMBERS_FENCED, labels(), newly_fenced as f64);
        }
        let was_fenced = |shard: &ShardId, member: &MemberId| {
            before
                .current
                .get(shard)
                .is_some_and(|owner| matches!(owner, ShardOwner::Fenced { .. }) && owner.member() == member)
        };
        let newly = after
            .current
            .iter()
            .filter(|(shard, owner)| matches!(owner, ShardOwner::Fenced { .. }) && !was_fenced(shard, owner.member()))
            .count();
        if newly > 0 {
            self.inner.metrics.count_by(&SHARDS_FENCED, labels(), newly as f64);
        }
    }

    /// Whether this failure to decode `group`'s metadata is logged at ERROR: the first of each
    /// [`INCOMPATIBLE_LOG_PERIOD`] per group (`rsc_metadata_schema_errors_total` counts them all).
    fn incompatible_log_turn(&self, group: &GroupId) -> bool {
        let now = Instant::now();
        let mut local = self.local();
        match local.incompatible_logged.get(group) {
            Some(at) if now.saturating_duration_since(*at) < INCOMPATIBLE_LOG_PERIOD => false,
            _ => {
                local.incompatible_logged.insert(group.clone(), now);
                true
            }
        }
    }

    fn count_schema_error(&self, group: &GroupId) {
        self.inner.metrics.count(&METADATA_SCHEMA_ERRORS, vec![("group", group.to_string())]);
    }

    /// Maps a store failure to the API error, counting compatibility failures.
    pub(super) fn store_error(&self, error: StoreError) -> ApiError {
        if matches!(error, StoreError::Unavailable(_)) {
            let mut local = self.local();
            local.identity_suspect = true;
            // A primary found unchanged before this failure is asked again, and a check issued
            // before it and answered after is not kept.
            local.primary_checks.clear();
            local.unavailable_errors += 1;
        }
        self.count_compat_failure(&error);
        tracing::debug!(%error, "store error");
        ApiError::new(ErrorCode::StoreUnavailable, error.to_string())
    }

    /// Counts a command the server rejects, including in best-effort steps whose failure answers
    /// nothing (a mutex release, an index add): an ACL changed at run time to deny `DEL` or
    /// `SADD` once showed only in DEBUG or WARN lines.
    pub(super) fn count_compat_failure(&self, error: &StoreError) {
        if let StoreError::Unsupported { command, .. } = error {
            self.inner.metrics.inc(
                "rsc_redis_command_compat_failures_total",
                "Redis commands rejected as unknown, disabled or denied.",
                vec![("command", command.clone())],
            );
        }
    }

    /// The error for an absent metadata key: `METADATA_MISSING` when the group is known to have
    /// existed (a client or the index knows it), else `GROUP_NOT_FOUND`. Never rebuilt.
    pub(super) async fn missing(&self, group: &GroupId, client_knows: bool) -> ApiError {
        self.inner.cache.forget(group);
        if self.inner.options.planted.has(PlantedBug::RebuildMissingMetadata) && client_knows {
            self.plant_rebuild(group).await;
        }
        let held = self.local().view.holds(group);
        // When a client says the group existed, the index only names the metric's series: the
        // ticker's paced read is asked, never Redis (any client can send such requests, and each
        // must not cost an index read). Otherwise it decides the answer, as before.
        let listed = if client_knows { self.index_lists_paced(group) } else { self.index_lists(group).await.ok() };
        let known = client_knows || listed.unwrap_or(true);
        if known {
            // A client's word that a group existed cannot be checked, so any client can name any
            // group here (a black-box review added 4,000 series to /metrics that way): the series
            // is labelled with the group only when this process holds something of it or the
            // index lists it (after a restart, a group whose key was lost is held by nobody yet),
            // the rest share one label, and their log line is rate-limited (`http::error`).
            let named = held || listed == Some(true);
            let label = if named { group.to_string() } else { UNSEEN_GROUP.to_string() };
            self.inner.metrics.inc(
                "rsc_metadata_missing_total",
                "Requests for a known group whose metadata key is gone (fail closed).",
                vec![("group", label)],
            );
            let message = if named {
                format!("metadata of group {group} is missing; failing closed")
            } else {
                format!("metadata of group {group} is missing ({UNSEEN_MISSING}); failing closed")
            };
            ApiError::new(ErrorCode::MetadataMissing, message)
        } else {
            self.forget_if_held(group);
            ApiError::new(ErrorCode::GroupNotFound, format!("group {group} does not exist"))
        }
    }

    /// Planted bug: recreates a vanished group from nothing, as a careless coordinator would.
    async fn plant_rebuild(&self, group: &GroupId) {
        let create = crate::core::protocol::AdminRequest::CreateGroup {
            group: group.clone(),
            shard_count: 8,
            config: Default::default(),
        };
        let _ = self
            .critical(group, false, |g, rev, obs| {
                crate::core::decide_admin(g, &create, crate::core::Creation::Plain, self.context(g, rev, obs))
            })
            .await;
    }

    pub(super) async fn index_knows(&self, group: &GroupId) -> Result<bool, ApiError> {
        let groups = self.inner.store.index_members().await.map_err(|e| self.store_error(e))?;
        Ok(groups.contains(group))
    }

    /// Per-group gauges from one tick's observations, and per-member ones when opted in
    /// ([`crate::metrics::Metrics::member_series`]: off by default, because `/metrics` is not
    /// authenticated and member ids must not leak through it).
    pub(super) fn export_group_gauges(&self, g: &GroupMetadata, obs: &Observations) {
        const MEMBER_SERIES: &[&str] = &["rsc_member_heartbeat_age_seconds", "rsc_member_revoking_shards"];
        let metrics = &self.inner.metrics;
        let first_export = self.local().gauges_exported.insert(g.group.clone());
        let group_labels = || vec![("group", g.group.to_string())];
        if first_export {
            for counter in counters::PER_GROUP {
                metrics.declare(counter, group_labels());
            }
        }
        let age_max_ms = obs.liveness.values().map(|seen| seen.unchanged_ms).max().unwrap_or(0);
        metrics.set(
            "rsc_group_member_heartbeat_age_max_seconds",
            "The longest any member of the group has gone without a heartbeat, as this coordinator saw it.",
            group_labels(),
            age_max_ms as f64 / 1000.0,
        );
        let revoking = g.shards_where(|owner| matches!(owner, ShardOwner::Revoking { .. })).len();
        metrics.set(
            "rsc_group_revoking_shards",
            "Shards members of the group were told to drain and have not released yet.",
            group_labels(),
            revoking as f64,
        );
        // A per-group gauge, exported whether or not per-member series are on: it is the signal of
        // the spec's "client-reported metadata version ahead" alert.
        let ahead = g.max_client_version_seen.saturating_sub(g.metadata_version);
        metrics.set(
            "rsc_client_reported_metadata_version_ahead",
            "Highest client-reported metadataVersion minus the stored one (>0: the store lost writes).",
            group_labels(),
            ahead as f64,
        );
        if !metrics.member_series() {
            return;
        }
        // Only the members observed now: a member that left through another instance would
        // otherwise keep its series here, frozen, for as long as this instance ticks the group.
        metrics.forget_named(MEMBER_SERIES, "group", &g.group.to_string());
        // Counted in one pass over the shards: one pass per member was members × shards steps per
        // tick (6.6e8 at 10,000 × 65,536; a scale review).
        let mut revoking_of: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
        for owner in g.current.values() {
            if let ShardOwner::Revoking { member, .. } = owner {
                *revoking_of.entry(member.as_str()).or_default() += 1;
            }
        }
        for (member, seen) in &obs.liveness {
            let labels = vec![("group", g.group.to_string()), ("member", member.clone())];
            metrics.set(
                "rsc_member_heartbeat_age_seconds",
                "How long this coordinator has seen the member's liveness record unchanged.",
                labels.clone(),
                seen.unchanged_ms as f64 / 1000.0,
            );
            metrics.set(
                "rsc_member_revoking_shards",
                "Shards the member was told to drain and has not released yet.",
                labels,
                revoking_of.get(member.as_str()).copied().unwrap_or(0) as f64,
            );
        }
    }
}

/// The gauges [`Coordinator::export_group_gauges`] exports per group (and member), which only the
/// instances that tick the group keep fresh.
pub(super) const TICK_GAUGES: &[&str] = &[
    "rsc_group_member_heartbeat_age_max_seconds",
    "rsc_group_revoking_shards",
    "rsc_member_heartbeat_age_seconds",
    "rsc_member_revoking_shards",
    "rsc_client_reported_metadata_version_ahead",
];

/// The group's Redis mutex while a critical section may hold it. Released when the section ends;
/// if the section's future is dropped first (the client gave up, hyper dropped the handler, a
/// timeout fired), the release runs in a task of its own, so the mutex is not left held until its
/// TTL, stalling every writer of the group. The release is compare-and-delete on this token, so it
/// is harmless when the acquire never succeeded.
struct HeldMutex<S: MetadataStore> {
    coordinator: Option<Coordinator<S>>,
    group: GroupId,
    token: String,
}

impl<S: MetadataStore> HeldMutex<S> {
    async fn release(mut self) {
        if let Some(coordinator) = &self.coordinator {
            release_mutex(coordinator, &self.group, &self.token).await;
        }
        // Released (or tried and failed: the TTL ends it); only a release cut off mid-way is
        // retried by `drop`.
        self.coordinator = None;
    }
}

impl<S: MetadataStore> Drop for HeldMutex<S> {
    fn drop(&mut self) {
        if let Some(coordinator) = self.coordinator.take() {
            let (group, token) = (self.group.clone(), std::mem::take(&mut self.token));
            tokio::spawn(async move { release_mutex(&coordinator, &group, &token).await });
        }
    }
}

async fn release_mutex<S: MetadataStore>(coordinator: &Coordinator<S>, group: &GroupId, token: &str) {
    if let Err(e) = coordinator.inner.store.release_mutex(group, token).await {
        // The mutex expires by its TTL; the stamp condition keeps correctness meanwhile.
        coordinator.count_compat_failure(&e);
        tracing::debug!(%group, error = %e, "mutex release failed");
    }
}

/// How often a group whose stored metadata cannot be decoded is logged at ERROR.
pub(super) const INCOMPATIBLE_LOG_PERIOD: Duration = Duration::from_secs(10);

/// The largest clock floor a raise is given: half of [`Fence::COUNTER_MAX`], so a clock set far
/// in the future (about the year 144,000) cannot push counters to where the check stops
/// accepting new values.
const FENCE_FLOOR_MAX: u64 = Fence::COUNTER_MAX / 2;

/// Wall-clock milliseconds for the display-only `updatedAt` field, the starting point of a
/// created group's versions (`core::admin::first_metadata_version`) and the floor of a fence key
/// that holds no counter (`FenceRaise::floor`). No safety decision rests on it alone: a fence
/// key that holds a counter counts up whatever the clock says, and the floor only keeps a
/// vanished key from restarting below earlier grants when clocks move forward. Under the
/// simulation madsim intercepts the system clock, so this stays deterministic.
fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// 32 bytes from the OS for a group's view-proof key. `None` if the OS refuses: a create is then
/// refused (`INTERNAL`), and a keyless group stays keyless (reported versions credited without a
/// proof, shard counts never: DESIGN §8) until a later write draws one.
fn draw_view_key() -> Option<ViewKey> {
    let mut bytes = [0u8; 32];
    match getrandom::fill(&mut bytes) {
        Ok(()) => Some(ViewKey::from_bytes(bytes)),
        Err(error) => {
            tracing::error!(%error, "no randomness for a view-proof key: a create is refused, a keyless group stays keyless");
            None
        }
    }
}
