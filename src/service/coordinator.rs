//! [`Coordinator`]: the workflow around the pure core (seed: "Redis-recorded state machine").
//!
//! Every request is first checked against the input bounds ([`crate::core::input`]: numbers,
//! member ids, shard lists, admin counts and configs) without touching the store. Every mutation
//! then runs: local monitor -> shutdown gate -> Redis mutex -> load -> validate -> decide (pure)
//! -> write conditioned on the loaded record's whole stamp (revision and writeId) -> respond from
//! what was written. A heartbeat that changes nothing answers from one consistent read (the
//! liveness touch + load script) without the mutex.
//! The coordinator never answers with a decision that is not in the store, never rebuilds missing
//! metadata, and never overwrites metadata it cannot parse.
//!
//! Loss evidence it detects itself (server identity change, revision regression) starts a
//! correction round and resets this process's observation windows, so every wait restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::time::{Duration, Instant};

use super::cache::DecodedCache;
use super::counters::{
    self, CLIENT_METADATA_VERSION_AHEAD, GROUP_INDEX_FAILURES, LOST_ADD_SHARDS_HEALED, METADATA_VERSION_REGRESSIONS,
    STORE_IDENTITY_CHANGES, TICKS_DEFERRED_WITHOUT_READ, TICK_FAILURES,
};
use super::marks::{write_digest, Observed, ReadOrder, ReadTicket, RevisionVerdict};
use super::monitors::GroupMonitors;
use super::pruning::{Forget, Vanished};
use super::shutdown::ShutdownGate;
use crate::core::admin::still_held;
use crate::core::engine::{heals_lost_add_shards, routing_view, version_credited, version_learned};
use crate::core::input::{check_admin_request, check_heartbeat_request, check_routing_report, InputError};
use crate::core::model::{GroupId, GroupMetadata, LossEvidence, MemberId};
use crate::core::proof::ViewKey;
use crate::core::protocol::{
    AdminRequest, AdminResponse, ApiError, ErrorCode, HeartbeatRequest, HeartbeatResponse, RoutingReport,
    RoutingResponse,
};
use crate::core::{
    check_session, decide_admin, decide_evidence, decide_heartbeat, decide_heartbeat_indexed, decide_routing,
    decide_tick, deferral_renewable_without_read, tick_deferral_ms, Creation, Decision, LocalView, Observations,
    PlantedBug, PlantedBugs,
};
use crate::metrics::Metrics;
use crate::store::{
    keys, MetadataStore, ProbeReport, RecordStamp, ServerIdentity, StoreError, TouchCheck, WriteOutcome,
};

use super::critical::TICK_GAUGES;
use super::relay::Relay;
use super::roster::Roster;

/// Tunables of one coordinator process.
#[derive(Clone, Debug)]
pub struct CoordinatorOptions {
    /// Names this instance in mutex tokens and logs.
    pub instance_id: String,
    /// TTL of the Redis mutex; a crashed holder blocks others at most this long.
    pub mutex_ttl_ms: u64,
    /// Attempts to take a busy mutex before answering `STORE_UNAVAILABLE`.
    pub mutex_attempts_max: u32,
    pub mutex_retry_ms: u64,
    /// CAS attempts per critical section before answering `STORE_UNAVAILABLE`.
    pub cas_attempts_max: u32,
    /// Period of the event-loop tick (expiry, fencing, releases, correction progress).
    pub tick_interval_ms: u64,
    /// Longest time an idle group goes unticked ([`crate::core::tick_deferral_ms`]), so an edit or
    /// a deletion of its metadata by hand, or work another instance left behind when it died, is
    /// seen within it. An idle group with members is ticked sooner when one of them may be falling
    /// silent: every quarter member TTL unless its members heartbeat through this instance.
    /// 0: tick every group every pass.
    pub idle_group_audit_ms: u64,
    /// Whether heartbeats through this instance renew an idle group's tick deferral without a
    /// read (on in production; off only for the `idle_ticks` benchmark's before column).
    #[doc(hidden)]
    pub renew_deferrals_from_heartbeats: bool,
    /// Period of the heard relay (`service::relay`): instances tell a group's tick owner which of
    /// its members heartbeated through them, so an idle group whose heartbeats a load balancer
    /// spreads over the instances is not read every quarter member TTL. A relayed member's
    /// silence is noticed up to about four periods later than a heartbeat through the owner
    /// would let it be. 0: no relay (and the owner reads such groups).
    pub heard_relay_ms: u64,
    /// How long another instance's ticker may stay silent in the tick roster before this instance
    /// stops counting it live (`service::roster`): instances share the ticks of quiet groups, one
    /// owner each, and a dead instance's groups are taken over within this plus `ticker_refresh_ms`
    /// plus one pass. 0: no sharing (every instance ticks every group it does not defer).
    pub ticker_silence_ms: u64,
    /// Least time between two ticker reads of the group index, and of the tick roster (at most a
    /// quarter of `ticker_silence_ms` for the roster): a pass in between ticks the groups the last
    /// read listed. A group created or deleted through this instance is listed at the next pass,
    /// and so is one a write or heartbeat through this instance concerns that the last read did
    /// not list; any other created elsewhere reaches this instance's list within this period plus
    /// a pass; an instance that died is dropped within `ticker_silence_ms` plus this plus one
    /// pass. 0: read both every pass.
    pub ticker_refresh_ms: u64,
    /// Mixed with 64 bits this process draws from the OS when the coordinator is built (in the
    /// simulation madsim's `getrandom`, so still one run per seed) to seed its randomness: mutex
    /// tokens, retry jitter, `writeId`s, fence nonces, revoke ids, and a create's first wait id
    /// and incarnation bits. Several of those are safety-relevant (a wait id another process
    /// already watched would be released early), so they must not repeat across processes even
    /// when every process is given the same value here, as `Default` does.
    pub rng_seed: u64,
    /// The longest assignment lease this instance lets a group configure (like Kafka's
    /// `group.consumer.max.session.timeout.ms`); must be the same on every instance. Correction
    /// rounds wait at least this long (DESIGN §7): a lease increase lost with a failover may have
    /// been seen by no live coordinator, and this is what bounds the leases its grants run under.
    /// 0 disables the ceiling (rounds then wait the longest lease this process saw recorded).
    pub max_assignment_lease_ms: u64,
    /// Most requests of one group that may hold or wait for its critical section in this process
    /// (sections of a group run one at a time); more are refused `STORE_UNAVAILABLE` at once, and
    /// clients retry. `serve` sets a quarter of `concurrency_max` (256 of 1,024), so one group's
    /// burst leaves the other groups three quarters of the request slots. Queued beyond that, a
    /// section would wait longer than a client's deadline anyway (about 7 ms each).
    pub group_sections_max: usize,
    /// Deliberate mistakes for the simulation's negative tests; `NONE` in production.
    pub planted: PlantedBugs,
}

impl Default for CoordinatorOptions {
    fn default() -> Self {
        Self {
            instance_id: "coordinator".into(),
            mutex_ttl_ms: 2_000,
            mutex_attempts_max: 20,
            mutex_retry_ms: 10,
            cas_attempts_max: 8,
            tick_interval_ms: 250,
            idle_group_audit_ms: 120_000,
            renew_deferrals_from_heartbeats: true,
            heard_relay_ms: HEARD_RELAY_MS_DEFAULT,
            ticker_silence_ms: TICKER_SILENCE_MS_DEFAULT,
            ticker_refresh_ms: TICKER_REFRESH_MS_DEFAULT,
            rng_seed: 0,
            max_assignment_lease_ms: MAX_ASSIGNMENT_LEASE_MS_DEFAULT,
            group_sections_max: GROUP_SECTIONS_MAX_DEFAULT,
            planted: PlantedBugs::NONE,
        }
    }
}

/// Default [`CoordinatorOptions::heard_relay_ms`]: a relayed window then starts at most about
/// 2 s after the heartbeat, within the quarter TTL (2.5 s) a read every quarter TTL allows for
/// the default 10 s member TTL; 4(n-1) commands per second per instance of n. (At 1 s, relays
/// arrived too late to renew about one deferral in ten behind a round-robin balancer: `idle_ticks`
/// measured 175 commands/s for 1,000 such groups on 3 instances, against 84 at 500 ms.)
pub const HEARD_RELAY_MS_DEFAULT: u64 = 500;

/// Default [`CoordinatorOptions::ticker_silence_ms`]: twelve default tick periods, so a pass slowed
/// by a busy store does not make an instance look dead.
pub const TICKER_SILENCE_MS_DEFAULT: u64 = 3_000;

/// The ticker's last read of the group index.
#[derive(Debug)]
struct IndexRead {
    /// When the read was issued.
    at: Instant,
    /// The groups it listed, in the order the store gave them (the order of a pass).
    groups: Vec<GroupId>,
    listed: BTreeSet<GroupId>,
}

/// Default [`CoordinatorOptions::ticker_refresh_ms`]: an idle instance reads the index once a
/// second and the roster every 750 ms instead of both every 250 ms pass.
pub const TICKER_REFRESH_MS_DEFAULT: u64 = 1_000;

/// Least time between two re-reads of a group's record for heartbeats its cached state refuses
/// ([`Coordinator::recheck_refused_session`]).
const SESSION_RECHECK_MS: u64 = 1_000;

/// How long one Cluster primary's own-account check serves the other groups it holds while the
/// store identity is suspect ([`Coordinator::slot_confirmed`]).
const PRIMARY_CHECK_FRESH: Duration = Duration::from_millis(1_000);

/// What a check of one group's Cluster primary alone found ([`Coordinator::slot_confirmed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotCheck {
    /// The primary that alone held the slot still does, unchanged.
    Unchanged,
    /// That primary did not answer.
    Unreachable,
    /// No verdict: the whole identity read decides.
    Undecided,
}

/// Instances silent this long are removed from the tick roster (it would otherwise collect every
/// instance id a deployment ever ran).
const TICKER_FORGET_MS: u64 = 600_000;

/// What `describe` returns: the recorded metadata and its store bookkeeping.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupDescription {
    pub metadata: GroupMetadata,
    pub store_revision: u64,
    pub updated_at_ms: u64,
    pub liveness: BTreeMap<MemberId, u64>,
}

/// Process-local state: observation windows and loss-evidence bookkeeping. Never stored.
pub(super) struct LocalState {
    pub(super) view: LocalView,
    /// The store identity last seen; `None` until the first probe or identity check.
    identity: Option<ServerIdentity>,
    /// Bumped on every identity change: groups must record evidence once per generation.
    identity_generation: u64,
    /// The last identity generation that may have lost writes anywhere (a change on one server,
    /// or to or from one): evidence for every group.
    lost_everywhere: u64,
    /// On a Redis Cluster, per hash slot, the last identity generation that may have lost writes
    /// to it ([`ServerIdentity::may_have_lost`]): the failover of one primary is evidence for the
    /// groups whose metadata slot it served only. Empty until the first such change.
    lost_in_slot: Vec<u64>,
    /// Per group, the identity generation up to which it recorded evidence (or had none to
    /// record: its slot lost nothing); absent reads as 0.
    pub(super) evidence_recorded: BTreeMap<GroupId, u64>,
    /// Highest revision observed per group, ordered against when each read was issued: a lower one
    /// from a read issued *after* it is evidence of lost writes (concurrency is not).
    pub(super) reads: ReadOrder,
    pub(super) regressed: BTreeMap<GroupId, LossEvidence>,
    /// Indexed groups the last tick found without a metadata key (see
    /// [`missing_at_tick`](Coordinator::missing_at_tick)).
    pub(super) missing_at_tick: BTreeSet<GroupId>,
    /// Groups this process held that it later found gone (key and index entry) without deleting
    /// them itself, when, and their last view key: a store that lost a group's record *and* its
    /// index entry looks like a group that never existed, and an operator's create of the name is
    /// then a recreate, which keeps the key (DESIGN §8). At most `VANISHED_MAX` entries, each
    /// kept for `VANISHED_MEMORY` (`super::pruning`).
    pub(super) vanished: BTreeMap<GroupId, Vanished>,
    /// The view key of the last record of each held group this process decoded or wrote: a
    /// recreate after the record was lost keeps it, so the lost history's proofs still verify
    /// and nobody else's do (DESIGN §8). Survives identity changes (the key is evidence exactly
    /// when the store lost writes); forgotten with the group (`super::pruning`).
    pub(super) view_keys: BTreeMap<GroupId, ViewKey>,
    /// Set by any `Unavailable` store error (a failover or restart breaks connections): the next
    /// request re-checks the server identity before answering from what it reads.
    pub(super) identity_suspect: bool,
    /// While `identity_suspect`, the last own-account checks of single Cluster primaries
    /// ([`Coordinator::slot_confirmed`]), by node, with when they answered and whether the node
    /// was unchanged: requests of the groups one primary holds share one check per
    /// [`PRIMARY_CHECK_FRESH`] instead of each reading it. Emptied by any `Unavailable` error and
    /// any identity change.
    pub(super) primary_checks: BTreeMap<String, (Instant, bool)>,
    /// Bumped by every `Unavailable` error: a primary check issued before one is not kept.
    pub(super) unavailable_errors: u64,
    /// When a request's whole identity read last failed: while it is fresh
    /// ([`PRIMARY_CHECK_FRESH`]), a request its primary's check leaves undecided is refused at
    /// once instead of each one spending the store's deadline on a primary that does not answer
    /// (the ticker's pass still reads the whole identity every pass).
    pub(super) whole_read_failed: Option<Instant>,
    /// The groups of the last index read that answered: a ticker pass walks them when the index
    /// key cannot be read while a Cluster primary is down, so that the groups on the other
    /// primaries are still ticked.
    last_indexed: Vec<GroupId>,
    /// Idle groups the ticker skips until the instant (and only within the identity generation)
    /// it computed; cleared by any write to the group through this process.
    pub(super) deferred: BTreeMap<GroupId, Deferred>,
    /// Groups written through this process since it last found them idle: ticked here whoever
    /// owns them, so a wait this process started is not left to an owner that deferred the group.
    pub(super) dirty: BTreeSet<GroupId>,
    /// When a session refusal last re-read each group's record (rate limit of the re-read).
    pub(super) session_rechecked: BTreeMap<GroupId, Instant>,
    /// Groups whose tick gauges this process exported (dropped when it leaves a group to its owner).
    pub(super) gauges_exported: BTreeSet<GroupId>,
    /// The tick roster as this process read it (who owns which quiet group).
    pub(super) roster: Roster,
    /// The heard relay's outgoing heartbeats and applied blobs.
    pub(super) relay: Relay,
    /// The ticker's last read of the group index and when it was issued; dropped when this
    /// process changes the index or sees the store's identity change.
    index_read: Option<IndexRead>,
    /// Bumped whenever `index_read` is dropped, so a read issued before does not store its answer.
    index_generation: u64,
    /// Groups a recorded member's heartbeat through this process found recorded while the last
    /// index read did not list them (or there was none since a change), and until when that
    /// finding is fresh: the next index read that still does not list one adds it
    /// ([`Coordinator::indexed_groups`]). Emptied at every index read.
    pub(super) heard_unlisted: BTreeMap<GroupId, Instant>,
    /// Per group whose stored metadata this process cannot decode, when that was last logged at
    /// ERROR (once per 10 s, `critical::INCOMPATIBLE_LOG_PERIOD`; every request and tick of such a group meets
    /// it, and one ERROR line each flooded the log). Bounded by the groups that exist; pruned
    /// with the others.
    pub(super) incompatible_logged: BTreeMap<GroupId, Instant>,
    /// When the ticker last counted itself in the tick roster and read it.
    roster_read_at: Option<Instant>,
    pub(super) rng: SmallRng,
    /// Draws `writeId`s.
    pub(super) write_rng: SmallRng,
    /// Draws liveness steps ([`crate::store::LIVENESS_STEP_MAX`]); a sequence of its own so the
    /// other draws keep their order.
    pub(super) touch_rng: SmallRng,
}

impl LocalState {
    /// The next tick pass reads the group index instead of reusing the last read.
    fn index_changed(&mut self) {
        self.index_read = None;
        self.index_generation += 1;
    }

    /// A write or heartbeat through this process concerns `group`: if the last index read did
    /// not list it (created through another instance since), the next pass reads the index, so
    /// the group is ticked (and the write relayed) without waiting for the refresh period.
    fn note_listed(&mut self, group: &GroupId) {
        if self.index_read.as_ref().is_some_and(|read| !read.listed.contains(group)) {
            self.index_changed();
        }
    }

    /// A recorded member's heartbeat through this process found `group` recorded: as
    /// [`Local::note_listed`], and unless the last index read listed it, the next one that still
    /// does not adds it (see [`Coordinator::indexed_groups`]), if that comes within `fresh_for`.
    fn note_heard(&mut self, group: &GroupId, fresh_for: Duration) {
        match &self.index_read {
            Some(read) if read.listed.contains(group) => {}
            Some(_) => {
                self.heard_unlisted.insert(group.clone(), Instant::now() + fresh_for);
                self.index_changed();
            }
            // No index read since the last change: the next one judges it.
            None => {
                self.heard_unlisted.insert(group.clone(), Instant::now() + fresh_for);
            }
        }
    }

    /// The store identity generation (bumped at every identity change this process saw).
    pub(super) fn identity_generation(&self) -> u64 {
        self.identity_generation
    }

    /// [`identity_label`](super::relay::identity_label) of the identity this process holds
    /// (`None` before the first check).
    pub(super) fn identity_label(&self) -> Option<String> {
        self.identity.as_ref().map(super::relay::identity_label)
    }

    /// Whether `group` must still record evidence of an identity change: some change since the
    /// generation it recorded up to may have lost writes to its metadata slot (every change does
    /// on one server).
    fn identity_evidence_due(&self, group: &GroupId) -> bool {
        let recorded = self.evidence_recorded.get(group).copied().unwrap_or(0);
        if self.identity_generation <= recorded {
            return false;
        }
        if self.lost_everywhere > recorded {
            return true;
        }
        self.lost_in_slot.get(usize::from(keys::group_slot(group))).is_some_and(|lost| *lost > recorded)
    }
}

/// How long after `since_start_ms` (this process's age) `group`'s next audit comes: at the next
/// instant of its own phase of the audit period, which its hash slot sets, so in (0, `audit_ms`]
/// (0 only when there is no audit period). Groups deferred in one pass (every group, after a start
/// or an identity change) are then audited one slice at a time, about N × pass / `audit_ms` per
/// pass, not all in one pass that reads every group; a group read only at its audits is read
/// exactly once a period.
pub(super) fn audit_in_ms(group: &GroupId, audit_ms: u64, since_start_ms: u64) -> u64 {
    if audit_ms == 0 {
        return 0;
    }
    let slot = u64::from(keys::group_slot(group));
    let phase = audit_ms.saturating_mul(slot) / u64::from(keys::CLUSTER_SLOTS);
    let into = (since_start_ms % audit_ms + audit_ms - phase) % audit_ms;
    audit_ms - into
}

/// What a heartbeat's touch found ([`Coordinator::heartbeat_touch`]).
type Touched = (Arc<GroupMetadata>, u64, Option<RecordStamp>, u64, bool);

/// Until when the ticker may skip an idle group.
#[derive(Clone, Debug)]
pub(super) struct Deferred {
    until: Instant,
    identity_generation: u64,
    /// When the group's record is read again whatever this process saw meanwhile
    /// ([`CoordinatorOptions::idle_group_audit_ms`] after the read that deferred it).
    audit_at: Instant,
    /// When the store last confirmed the decoded record this process holds for the group (the
    /// tick's read, a heartbeat's stamp check through this process, or one another instance
    /// relayed).
    pub(super) confirmed: Instant,
    /// The stamp so confirmed. A renewal without a read needs the decoded copy to still carry it:
    /// a read that finished late may have put an older record in the cache since.
    pub(super) confirmed_stamp: Option<RecordStamp>,
}

pub(super) struct Inner<S> {
    pub(super) store: S,
    pub(super) options: CoordinatorOptions,
    pub(super) gate: Arc<ShutdownGate>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) started: Instant,
    pub(super) local: Mutex<LocalState>,
    pub(super) cache: DecodedCache,
    pub(super) monitors: GroupMonitors,
}

/// A coordinator process's handle; cheap to clone.
pub struct Coordinator<S> {
    pub(super) inner: Arc<Inner<S>>,
}

impl<S> Clone for Coordinator<S> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

/// Default of [`CoordinatorOptions::max_assignment_lease_ms`]: the default group's lease, so a
/// correction round of a default group waits what it would without a ceiling. A group that needs
/// a longer lease is refused loudly (`BAD_REQUEST` naming the setting) until the operator raises
/// the ceiling; a ceiling set too high would instead lengthen every lossy failover's round.
pub const MAX_ASSIGNMENT_LEASE_MS_DEFAULT: u64 = 8_000;
/// Default [`CoordinatorOptions::group_sections_max`]: a quarter of the listener's default
/// `concurrency_max` (1,024).
pub const GROUP_SECTIONS_MAX_DEFAULT: usize = 256;

const HEARTBEATS: &str = "rsc_heartbeats_total";
/// Separates the `writeId` RNG's seed from the token RNG's.
const WRITE_ID_SALT: u64 = 0x5772_6974_6549_6421;
/// Separates the liveness steps' sequence from the others.
const TOUCH_SALT: u64 = 0x546f_7563_6853_7465;
/// Separates the heard relay's nonce from both.
const RELAY_SALT: u64 = 0x4865_6172_6452_6c79;

/// [`CoordinatorOptions::rng_seed`] mixed with 64 bits from the OS. If the OS refuses (it does
/// not on any supported platform), `rng_seed` alone: creates are then refused anyway, for want
/// of a view-proof key (`service::critical`), and the error says what to fix.
fn process_seed(rng_seed: u64) -> u64 {
    let mut bytes = [0u8; 8];
    match getrandom::fill(&mut bytes) {
        Ok(()) => rng_seed ^ u64::from_le_bytes(bytes),
        Err(error) => {
            tracing::error!(%error, "no randomness from the OS: this process's revoke ids, wait ids and fence nonces repeat those of any other process given the same rng_seed");
            rng_seed
        }
    }
}

/// Nothing else showed a ticker that died or stalled (or cannot read the index): `/healthz` stayed
/// 200, members never expired and the group gauges froze at healthy-looking values.
const TICKER_PASS_AGE: &str = "rsc_ticker_last_pass_age_seconds";
const TICKER_PASS_AGE_HELP: &str =
    "Seconds since this instance's ticker last completed a pass over the indexed groups (since the start before the first).";
const TERMINATING_HELP: &str = "1 while the coordinator is terminating (refusing new mutations), else 0.";
const HEARTBEATS_HELP: &str = "Heartbeats answered, by status or error code.";

impl<S: MetadataStore> Coordinator<S> {
    pub fn new(store: S, options: CoordinatorOptions) -> Self {
        let seed = process_seed(options.rng_seed);
        let local = LocalState {
            view: LocalView::with_lease_ceiling(options.max_assignment_lease_ms),
            identity: None,
            identity_generation: 0,
            lost_everywhere: 0,
            lost_in_slot: Vec::new(),
            evidence_recorded: BTreeMap::new(),
            reads: ReadOrder::default(),
            regressed: BTreeMap::new(),
            missing_at_tick: BTreeSet::new(),
            vanished: BTreeMap::new(),
            view_keys: BTreeMap::new(),
            identity_suspect: false,
            primary_checks: BTreeMap::new(),
            unavailable_errors: 0,
            whole_read_failed: None,
            last_indexed: Vec::new(),
            deferred: BTreeMap::new(),
            dirty: BTreeSet::new(),
            session_rechecked: BTreeMap::new(),
            gauges_exported: BTreeSet::new(),
            roster: Roster::default(),
            relay: Relay::new(SmallRng::seed_from_u64(seed ^ RELAY_SALT).gen()),
            index_read: None,
            index_generation: 0,
            heard_unlisted: BTreeMap::new(),
            incompatible_logged: BTreeMap::new(),
            roster_read_at: None,
            rng: SmallRng::seed_from_u64(seed),
            write_rng: SmallRng::seed_from_u64(seed ^ WRITE_ID_SALT),
            touch_rng: SmallRng::seed_from_u64(seed ^ TOUCH_SALT),
        };
        let inner = Inner {
            store,
            options,
            gate: Arc::new(ShutdownGate::default()),
            metrics: Arc::new(Metrics::new()),
            started: Instant::now(),
            local: Mutex::new(local),
            cache: DecodedCache::default(),
            monitors: GroupMonitors::default(),
        };
        inner.metrics.set("rsc_coordinator_terminating", TERMINATING_HELP, vec![], 0.0);
        // From the start: a ticker that never completes a pass shows as an age that grows.
        inner.metrics.set_since(TICKER_PASS_AGE, TICKER_PASS_AGE_HELP, vec![], inner.started);
        for counter in counters::LABEL_LESS {
            inner.metrics.declare(counter, vec![]);
        }
        Self { inner: Arc::new(inner) }
    }

    pub fn store(&self) -> &S {
        &self.inner.store
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.inner.metrics)
    }

    pub fn options(&self) -> &CoordinatorOptions {
        &self.inner.options
    }

    /// Startup compatibility probe: fails fast, naming the unsupported version or command.
    pub async fn start(&self) -> Result<ProbeReport, ApiError> {
        match self.inner.store.probe().await {
            Ok(report) => {
                self.local().identity = Some(report.identity.clone());
                Ok(report)
            }
            Err(e) => Err(self.store_error(e)),
        }
    }

    /// Enters terminating mode: new mutations get 503, entered sections finish, ticks stop.
    pub fn begin_shutdown(&self) {
        self.inner.gate.begin();
        self.inner.metrics.set("rsc_coordinator_terminating", TERMINATING_HELP, vec![], 1.0);
        // This instance ticks nothing from now on: it leaves the tick roster (best effort), so
        // the others take its groups over at their next roster read, not `ticker_silence_ms`
        // later (every restart of a rolling update left its share of groups unticked ~4 s).
        if self.inner.options.ticker_silence_ms > 0 {
            let this = self.clone();
            tokio::spawn(async move {
                let me = this.inner.options.instance_id.clone();
                if let Err(e) = this.inner.store.forget_tickers(&[me]).await {
                    this.store_error(e);
                }
            });
        }
    }

    pub fn is_terminating(&self) -> bool {
        self.inner.gate.is_terminating()
    }

    /// Waits until every critical section entered before shutdown has finished.
    pub async fn drained(&self) {
        self.inner.gate.drained().await;
    }

    /// Answers a consumer heartbeat.
    pub async fn heartbeat(&self, req: HeartbeatRequest) -> Result<HeartbeatResponse, ApiError> {
        /// Counts a heartbeat whose future was dropped before it answered (its client went away:
        /// hyper drops the handler), as `CANCELLED`: such heartbeats were counted nowhere, so the
        /// failure-ratio alert went quiet during the slowdowns that cause them.
        struct Unanswered<'a>(Option<&'a Metrics>);
        impl Drop for Unanswered<'_> {
            fn drop(&mut self) {
                if let Some(metrics) = self.0 {
                    // Unwinding from a panic is not a client that went away.
                    let status = if std::thread::panicking() { "INTERNAL" } else { "CANCELLED" };
                    metrics.inc(HEARTBEATS, HEARTBEATS_HELP, vec![("status", status.into())]);
                }
            }
        }
        let mut unanswered = Unanswered(Some(&self.inner.metrics));
        let result = self.heartbeat_inner(&req).await;
        unanswered.0 = None;
        let label = match &result {
            Ok(r) => serde_json::to_value(r.status).ok().and_then(|v| v.as_str().map(str::to_owned)),
            Err(e) => serde_json::to_value(e.code).ok().and_then(|v| v.as_str().map(str::to_owned)),
        };
        self.inner.metrics.inc(HEARTBEATS, HEARTBEATS_HELP, vec![("status", label.unwrap_or_default())]);
        result
    }

    async fn heartbeat_inner(&self, req: &HeartbeatRequest) -> Result<HeartbeatResponse, ApiError> {
        self.inner.gate.check()?;
        req.group.validate().map_err(|m| ApiError::new(ErrorCode::BadRequest, m))?;
        // Before the liveness touch: a request refused for its shape leaves no trace in the store.
        check_heartbeat_request(req).map_err(bad_request)?;
        self.recheck_identity_if_suspect(&req.group).await?;
        let ticket = self.local().reads.begin_read();
        let (g, revision, write) = self.heartbeat_read(req).await?;
        let evidence_recorded = self.record_pending_evidence(&g, (revision, write), ticket).await?;
        if req.metadata_version > g.metadata_version {
            if version_credited(
                &g,
                req.metadata_version,
                req.metadata_version_proof.as_ref(),
                self.inner.options.planted,
            ) {
                self.count_version_ahead(&g.group);
            } else {
                self.count_unproven(&g, "metadataVersion");
            }
        }
        // Only a heartbeat that reports nothing new can be answered from the index: others never
        // reach it (a join, a leave, reports, a version ahead), and must not pay for building it.
        let may_be_steady = req.member_epoch != 0
            && !req.leave
            && req.revoking.is_empty()
            && req.fenced.is_empty()
            && req.metadata_version <= g.metadata_version;
        let index = if may_be_steady { self.inner.cache.index_of(&g) } else { None };
        let obs = match &index {
            Some(index) => self.observe_listed_waits(&g, index.waits()),
            None => self.observe_waits(&g),
        };
        let fast = decide_heartbeat_indexed(&g, index.as_deref(), req, self.context(Some(&g), revision, &obs));
        // After recording evidence, `g` is stale: only the critical path (which reloads) may answer.
        if fast.write.next.is_none() && !evidence_recorded {
            return fast.outcome;
        }
        if self.inner.options.planted.has(PlantedBug::RespondBeforeWrite) {
            let this = self.clone();
            let req = req.clone();
            tokio::spawn(async move {
                let _ = this
                    .critical(&req.group.clone(), false, |g, rev, obs| this.heartbeat_decision(g, &req, rev, obs))
                    .await;
            });
            return fast.outcome;
        }
        self.critical(&req.group, false, |g, rev, obs| self.heartbeat_decision(g, req, rev, obs)).await
    }

    /// The heartbeat's one read: liveness touch plus the group's metadata, from the decoded cache
    /// when Redis still holds the cached write (two commands, no aggregate transfer), else read
    /// and decoded in full.
    ///
    /// Before the touch, the member session is checked against the cached state (a cold cache
    /// reads the record first: one more round trip, once per group and process): a heartbeat
    /// refused for its session leaves no trace, so a forger cannot keep a dead member from
    /// expiring. The decision checks it again against the state it decides on.
    /// Returns the record, its revision and the [`write_digest`] of its `writeId`.
    async fn heartbeat_read(&self, req: &HeartbeatRequest) -> Result<(Arc<GroupMetadata>, u64, u64), ApiError> {
        let generation = self.local().identity_generation;
        let (g, revision, stamp, liveness, changed) = self.heartbeat_touch(req).await?;
        self.note_heartbeat(&g, stamp.as_ref(), &req.member_id, liveness, changed, generation);
        let write = stamp.as_ref().map_or(0, |stamp| write_digest(&stamp.write_id));
        if !g.members.contains_key(&req.member_id) {
            // The touch left a field for an id that is no member (a join yet to be decided, or
            // an unknown member's heartbeat): the next tick reads liveness, so a flood of made-up
            // ids is cleaned up (`core::model::ORPHAN_LIVENESS_MAX`) even in a deferred group.
            self.local().deferred.remove(&g.group);
        }
        Ok((g, revision, write))
    }

    /// [`heartbeat_read`](Self::heartbeat_read) without the bookkeeping; also returns the
    /// record's stamp (`None`: it has no `writeId`), the member's liveness counter as the touch
    /// left it, and whether the record differed from the decoded copy this process held (or it
    /// held none).
    async fn heartbeat_touch(&self, req: &HeartbeatRequest) -> Result<Touched, ApiError> {
        let store = &self.inner.store;
        let known = match self.inner.cache.get(&req.group) {
            Some(cached) => Arc::clone(&cached.metadata),
            None => {
                let record = store.load(&req.group).await.map_err(|e| self.group_store_error(&req.group, e))?;
                let Some(record) = record else {
                    let client_knows = req.member_epoch > 0 || req.metadata_version > 0;
                    return Err(self.missing(&req.group, client_knows).await);
                };
                self.decode_counted(&req.group, &record)?
            }
        };
        if let Err(refused) = check_session(&known, req, self.inner.options.planted) {
            self.recheck_refused_session(req, refused).await?;
        }
        let step = self.local().touch_rng.gen_range(1..=crate::store::LIVENESS_STEP_MAX);
        let touched = match self.inner.cache.get(&req.group) {
            Some(cached) => match store.touch_and_check_by(&req.group, &req.member_id, &cached.stamp, step).await {
                Ok(TouchCheck::Unchanged { liveness }) => {
                    let stamp = Some(cached.stamp.clone());
                    return Ok((Arc::clone(&cached.metadata), cached.stamp.revision, stamp, liveness, false));
                }
                Ok(TouchCheck::Changed(touched)) => touched,
                Err(e) => return Err(self.group_store_error(&req.group, e)),
            },
            None => store
                .touch_and_load_by(&req.group, &req.member_id, step)
                .await
                .map_err(|e| self.group_store_error(&req.group, e))?,
        };
        let Some(record) = touched.record else {
            let client_knows = req.member_epoch > 0 || req.metadata_version > 0;
            return Err(self.missing(&req.group, client_knows).await);
        };
        Ok((self.decode_counted(&req.group, &record)?, record.revision, record.stamp(), touched.liveness, true))
    }

    /// A session refused against the decoded cache: the cache may be stale (another instance
    /// wrote the group since, and this process may not tick it: the tick roster gives its quiet
    /// ticks to one owner), and a refusal never touches the store, so nothing else would refresh
    /// it while the refused process retries (a restarted consumer would be refused
    /// `MEMBER_ID_IN_USE` long after its old incarnation expired). So the record is read again
    /// — without a liveness touch — at most once per `SESSION_RECHECK_MS` per group (a forger's
    /// retries cost no more), and the session checked against it. Err: the refusal stands.
    async fn recheck_refused_session(&self, req: &HeartbeatRequest, refused: ApiError) -> Result<(), ApiError> {
        let now = Instant::now();
        let due = {
            let mut local = self.local();
            let due = local
                .session_rechecked
                .get(&req.group)
                .is_none_or(|at| now.saturating_duration_since(*at) >= Duration::from_millis(SESSION_RECHECK_MS));
            if due {
                local.session_rechecked.insert(req.group.clone(), now);
            }
            due
        };
        if !due {
            self.count_session_refused(&refused);
            return Err(refused);
        }
        let record = self.inner.store.load(&req.group).await.map_err(|e| self.group_store_error(&req.group, e))?;
        let Some(record) = record else {
            let client_knows = req.member_epoch > 0 || req.metadata_version > 0;
            return Err(self.missing(&req.group, client_knows).await);
        };
        let fresh = self.decode_counted(&req.group, &record)?;
        check_session(&fresh, req, self.inner.options.planted).inspect_err(|e| self.count_session_refused(e))
    }

    fn heartbeat_decision(
        &self,
        g: Option<&GroupMetadata>,
        req: &HeartbeatRequest,
        revision: u64,
        obs: &Observations,
    ) -> Decision<HeartbeatResponse> {
        match g {
            Some(g) => decide_heartbeat(g, req, self.context(Some(g), revision, obs)),
            None => Decision {
                write: Default::default(),
                outcome: Err(ApiError::new(ErrorCode::MetadataMissing, "group metadata vanished; failing closed")),
            },
        }
    }

    /// Producer routing view. The report names the metadataVersion the producer has cached and
    /// the highest shard count it published with (0: none). A version above the stored one is
    /// recorded as loss evidence and answered with `lostVersion`; a shard count above the recorded
    /// one re-adds the shards of a lost `add-shards` (unless the group turned that off); otherwise
    /// this is a read, served while terminating too (a report that must be recorded is refused
    /// there with `COORDINATOR_TERMINATING`). Numbers above their bounds are `BAD_REQUEST` before
    /// anything is read.
    pub async fn routing(&self, group: &GroupId, report: RoutingReport) -> Result<RoutingResponse, ApiError> {
        group.validate().map_err(|m| ApiError::new(ErrorCode::BadRequest, m))?;
        check_routing_report(&report).map_err(bad_request)?;
        self.recheck_identity_if_suspect(group).await?;
        let ticket = self.local().reads.begin_read();
        let record = self.inner.store.load(group).await.map_err(|e| self.group_store_error(group, e))?;
        let Some(record) = record else {
            return Err(self.missing(group, report.known_version > 0).await);
        };
        let g = self.decode_counted(group, &record)?;
        let mut view = routing_view(&g, record.revision);
        let planted = self.inner.options.planted;
        let ahead = report.known_version > g.metadata_version;
        let credited_ahead =
            ahead && version_credited(&g, report.known_version, report.known_version_proof.as_ref(), planted);
        let heals = heals_lost_add_shards(&g, &report, planted);
        if ahead && !credited_ahead {
            self.count_unproven(&g, "metadataVersion");
        }
        if report.known_shard_count > g.shard_count && g.config.heal_lost_add_shards && !heals {
            self.count_unproven(&g, "shardCount");
        }
        if !credited_ahead && !heals && !version_learned(&g, report.known_version) {
            // Nothing proven to act on: the recorded view. A version ahead is still named as lost
            // (the producer adopts this view at once), which only echoes the request.
            view.lost_version = ahead.then_some(report.known_version);
            return Ok(view);
        }
        if credited_ahead {
            self.count_version_ahead(group);
        }
        // Loss evidence this process holds is recorded first, as heartbeats do: the report is
        // then decided inside the correction round (see `record_evidence_before_mutation`).
        self.record_pending_evidence(&g, (record.revision, write_digest(&record.write_id)), ticket).await?;
        // The shard count the last attempt's decision healed from (attempts repeat on a conflict).
        let mut healed_from = None;
        let recorded = self
            .critical(group, false, |g, rev, obs| match g {
                Some(g) => {
                    let decision = decide_routing(g, report, self.context(Some(g), rev, obs));
                    healed_from = decision
                        .outcome
                        .as_ref()
                        .is_ok_and(|view| view.shard_count > g.shard_count)
                        .then_some(g.shard_count);
                    decision
                }
                None => Decision {
                    write: Default::default(),
                    outcome: Err(ApiError::new(ErrorCode::MetadataMissing, "group metadata vanished; failing closed")),
                },
            })
            .await;
        match recorded {
            Ok(view) => {
                if let Some(from) = healed_from {
                    self.count_healed(group, from, view.shard_count);
                }
                Ok(view)
            }
            // A terminating coordinator cannot record the report, so it answers
            // `COORDINATOR_TERMINATING` and the producer asks another instance, still holding its
            // version. It used to answer `lostVersion` unrecorded: the producer then dropped the
            // only evidence of the lost history, and later bumps issued its numbers again (swarm
            // seed 10710).
            Err(e) => Err(e),
        }
    }

    fn count_index_failure(&self, error: &StoreError) {
        self.count_compat_failure(error);
        self.inner.metrics.count(&GROUP_INDEX_FAILURES, vec![]);
    }

    /// Counts a recorded heal.
    fn count_healed(&self, group: &GroupId, from: u32, to: u32) {
        tracing::warn!(%group, from, to, "a producer published with more shards than recorded: re-adding the shards of a lost add-shards");
        self.inner.metrics.count(&LOST_ADD_SHARDS_HEALED, vec![("group", group.to_string())]);
    }

    fn count_session_refused(&self, error: &ApiError) {
        self.inner.metrics.inc(
            "rsc_member_session_refused_total",
            "Heartbeats refused before any effect because they lack the member's session (SESSION_MISMATCH) or claim a live member's id (MEMBER_ID_IN_USE).",
            vec![("code", serde_json::to_value(error.code).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default())],
        );
    }

    /// A report of a number above the recorded one without a proof that this deployment issued
    /// it (DESIGN §8): not evidence, so it changed nothing. An old client, or a forged report.
    fn count_unproven(&self, g: &GroupMetadata, fact: &'static str) {
        self.inner.metrics.inc(
            "rsc_unproven_client_reports_total",
            "Client reports of a metadataVersion or shard count above the recorded one that carried no valid proof (not evidence: nothing changed).",
            vec![("group", g.group.to_string()), ("fact", fact.to_string())],
        );
    }

    fn count_version_ahead(&self, group: &GroupId) {
        self.inner.metrics.count(&CLIENT_METADATA_VERSION_AHEAD, vec![("group", group.to_string())]);
    }

    /// The recorded metadata of a group, for operators.
    pub async fn describe(&self, group: &GroupId) -> Result<GroupDescription, ApiError> {
        group.validate().map_err(|m| ApiError::new(ErrorCode::BadRequest, m))?;
        let record = self.inner.store.load(group).await.map_err(|e| self.group_store_error(group, e))?;
        let Some(record) = record else {
            return Err(self.missing(group, false).await);
        };
        let metadata = self.decode_counted(group, &record)?;
        let liveness = self.inner.store.liveness(group).await.map_err(|e| self.store_error(e))?;
        let mut metadata = Arc::unwrap_or_clone(metadata);
        // The view-proof key is the group's secret: proofs are only as good as it stays unknown.
        metadata.view_key = None;
        Ok(GroupDescription {
            metadata,
            store_revision: record.revision,
            updated_at_ms: record.updated_at_ms,
            liveness,
        })
    }

    /// Refuses a created group whose assignment lease exceeds this instance's ceiling
    /// ([`CoordinatorOptions::max_assignment_lease_ms`]): correction rounds rely on no coordinator
    /// granting a longer lease. A config change is judged against the recorded lease, in the
    /// decision ([`crate::core::admin::lease_above_ceiling`]): keeping or shortening a lease
    /// recorded above the ceiling is allowed.
    fn check_lease_ceiling(&self, req: &AdminRequest) -> Result<(), ApiError> {
        let ceiling = self.inner.options.max_assignment_lease_ms;
        let config = match req {
            AdminRequest::CreateGroup { config, .. } => config,
            AdminRequest::ChangeConfig { .. } | AdminRequest::AddShards { .. } | AdminRequest::DeleteGroup { .. } => {
                return Ok(())
            }
        };
        if ceiling == 0 || config.assignment_lease_ms <= ceiling {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::BadRequest,
            format!(
                "assignmentLeaseMs {} exceeds this coordinator's maximum assignment lease ({ceiling} ms, \
                 --max-assignment-lease-ms); raise it on every instance first",
                config.assignment_lease_ms
            ),
        ))
    }

    /// Applies an admin mutation (create, add shards, change config, delete) with revision checks.
    pub async fn admin(&self, req: AdminRequest) -> Result<AdminResponse, ApiError> {
        let group = req.group().clone();
        group.validate().map_err(|m| ApiError::new(ErrorCode::BadRequest, m))?;
        // Before the mutex and the index read: a malformed mutation costs the store nothing.
        check_admin_request(&req).map_err(bad_request)?;
        self.check_lease_ceiling(&req)?;
        let create = matches!(req, AdminRequest::CreateGroup { .. });
        let creation = if create && (self.vanished_here(&group) || self.index_knows(&group).await?) {
            Creation::Recreate { lost_key: self.remembered_view_key(&group) }
        } else {
            Creation::Plain
        };
        if matches!(req, AdminRequest::DeleteGroup { .. }) && self.record_evidence_before_mutation(&group).await? {
            // A delete waits for the round like for any member (its section would record the
            // round itself, and then refuse the revision the operator named as a bare conflict).
            return Err(ApiError::new(
                ErrorCode::GroupNotEmpty,
                format!("group {group} may have lost writes; a correction round started, retry once it ends"),
            ));
        }
        if matches!(req, AdminRequest::AddShards { .. } | AdminRequest::ChangeConfig { .. })
            && self.record_evidence_before_mutation(&group).await?
        {
            // The round's write moved the revision the operator named: said so, rather than a
            // bare conflict that reads like another operator's change.
            return Err(ApiError::new(
                ErrorCode::RevisionConflict,
                format!(
                    "this coordinator holds evidence that the store lost writes of group {group}: a correction \
                     round was recorded first; describe the group and retry with its new revision"
                ),
            ));
        }
        let decided = self
            .critical(&group, false, |g, rev, obs| decide_admin(g, &req, creation, self.context(g, rev, obs)))
            .await;
        let response = match decided {
            // A mutation of a group whose metadata key is gone: METADATA_MISSING when the group is
            // known to have existed, as every other request answers, else GROUP_NOT_FOUND.
            Err(e) if e.code == ErrorCode::GroupNotFound => return Err(self.missing(&group, false).await),
            other => other?,
        };
        if create {
            self.local().vanished.remove(&group);
        }
        match &req {
            AdminRequest::CreateGroup { .. } => {
                // The index is rebuildable, never truth: a failure here is repaired by rebuild.
                if let Err(e) = self.inner.store.index_add(&group).await {
                    self.count_index_failure(&e);
                    tracing::warn!(%group, error = %e, "index add failed; run rebuild-index");
                }
            }
            AdminRequest::DeleteGroup { expected_revision, .. } => {
                let _entered = self.inner.gate.enter()?;
                // The operator names a revision, and revisions repeat after a rollback: delete the
                // write stored at that revision now, conditioned on its whole stamp, so a write
                // made after this read (even one of the same revision) is never deleted. The
                // record deleted is judged itself, not the one decided on: a lost write and a
                // join between the two reads can leave the same revision with a member in it.
                let ticket = self.local().reads.begin_read();
                let loaded = self.inner.store.load(&group).await.map_err(|e| self.group_store_error(&group, e))?;
                let deleted = match loaded {
                    Some(record) if record.revision == *expected_revision => {
                        let g = self.decode_counted(&group, &record)?;
                        // Loss evidence this process holds for the group and has not yet written
                        // (it is written at the group's next heartbeat or tick): it starts a
                        // correction round now, which the delete waits for like any other.
                        let read = (record.revision, write_digest(&record.write_id));
                        if self.record_pending_evidence(&g, read, ticket).await? {
                            return Err(ApiError::new(
                                ErrorCode::GroupNotEmpty,
                                format!("group {group} may have lost writes; a correction round started, retry once it ends"),
                            ));
                        }
                        if let Some(holding) = still_held(&g) {
                            return Err(ApiError::new(
                                ErrorCode::GroupNotEmpty,
                                format!("group {group} is not empty: {holding}"),
                            ));
                        }
                        self.inner.store.delete(&group, &record.cas_stamp()).await
                    }
                    other => Ok(WriteOutcome::RevisionConflict { current: other.map(|r| r.revision) }),
                };
                match deleted.map_err(|e| self.group_store_error(&group, e))? {
                    WriteOutcome::Written { .. } => self.forget_group(&group, Forget::Deleted),
                    WriteOutcome::RevisionConflict { current } => {
                        let rewritten = if current == Some(*expected_revision) { " (rewritten meanwhile)" } else { "" };
                        return Err(ApiError::new(
                            ErrorCode::RevisionConflict,
                            format!("expected revision {expected_revision}, stored {current:?}{rewritten}"),
                        ));
                    }
                    WriteOutcome::LivenessChanged { .. } => {
                        return Err(ApiError::new(ErrorCode::Internal, "delete does not use liveness guards"));
                    }
                }
            }
            _ => {}
        }
        if matches!(req, AdminRequest::CreateGroup { .. } | AdminRequest::DeleteGroup { .. }) {
            self.index_changed();
        }
        Ok(response)
    }

    /// Rebuilds the group index from a SCAN of metadata keys.
    pub async fn rebuild_index(&self) -> Result<Vec<GroupId>, ApiError> {
        self.inner.gate.check()?;
        let rebuilt = self.inner.store.rebuild_index().await.map_err(|e| self.store_error(e));
        self.index_changed();
        rebuilt
    }

    /// One event-loop pass over every indexed group. Does nothing once terminating.
    pub async fn tick_all(&self) {
        if self.is_terminating() {
            return;
        }
        if !self.check_identity().await {
            // The store did not answer: the index is read (not the last read reused), and a
            // failed read ends the pass, as before reads were paced.
            self.index_changed();
        }
        let (groups, fresh) = match self.indexed_groups().await {
            Ok(read) => read,
            Err(e) => {
                self.store_error(e);
                // On a Cluster the index key lives on one primary: while that one does not
                // answer, the groups of the last list that did are ticked all the same, those on
                // the other primaries as usual (each group's tick checks its own primary first).
                // On one server nothing else would answer either: the pass ends.
                let local = self.local();
                let cluster = local.identity.as_ref().is_some_and(|identity| !identity.primaries.is_empty());
                if !cluster || local.last_indexed.is_empty() {
                    return;
                }
                (local.last_indexed.clone(), false)
            }
        };
        if fresh {
            // Groups deleted through another instance leave the index: drop their decoded copies
            // so the cache stays bounded by the groups that exist (an unindexed live group only
            // pays one decode at its next heartbeat). Only against a list read for this pass: an
            // older one lacks groups created since, whose writes through this process must stay
            // noted (`dirty`, the relay).
            // A set: `Vec::contains` per retained entry was quadratic (0.6 s a pass at 10,000 groups).
            let indexed: BTreeSet<&GroupId> = groups.iter().collect();
            self.inner.cache.retain(|group| indexed.contains(group));
            self.local().reads.retain(|group| indexed.contains(group));
            self.local().deferred.retain(|group, _| indexed.contains(group));
            self.local().dirty.retain(|group| indexed.contains(group));
            self.local().session_rechecked.retain(|group, _| indexed.contains(group));
            self.local().gauges_exported.retain(|group| indexed.contains(group));
            self.local().relay.retain(|group| indexed.contains(group));
            self.local().incompatible_logged.retain(|group, _| indexed.contains(group));
            self.forget_unindexed_absent_groups(&indexed).await;
        }
        self.read_roster(false).await;
        self.exchange_relays().await;
        let mut not_mine = 0u64;
        for group in groups {
            if self.is_terminating() {
                return;
            }
            // A long pass still counts in the roster every quarter silence, so the other instances
            // do not count this one dead (and take its groups) while it works through the groups.
            self.read_roster(true).await;
            if !self.ticks_here(&group) {
                not_mine += 1;
                // Its gauges are the owner's to export: this instance's would only go stale. Its
                // deferral too: should the group come back to this instance, the first pass ticks
                // it (and exports its gauges) instead of waiting out a deferral set long ago.
                self.local().deferred.remove(&group);
                if self.local().gauges_exported.remove(&group) {
                    self.inner.metrics.forget_named(TICK_GAUGES, "group", &group.to_string());
                }
                continue;
            }
            if self.tick_deferred(&group) {
                continue;
            }
            if let Err(error) = self.tick_group(&group).await {
                self.inner.metrics.count(&TICK_FAILURES, vec![]);
                tracing::debug!(%group, ?error, "tick failed");
            }
        }
        self.inner.metrics.set(
            "rsc_ticker_groups_left_to_owner",
            "Indexed groups the last pass left to another instance (the owner in the tick roster).",
            vec![],
            not_mine as f64,
        );
        self.inner.metrics.set_since(TICKER_PASS_AGE, TICKER_PASS_AGE_HELP, vec![], Instant::now());
    }

    /// The groups the index lists, and whether they were read for this pass: read at most every
    /// `ticker_refresh_ms`, else the last read's.
    async fn indexed_groups(&self) -> Result<(Vec<GroupId>, bool), StoreError> {
        let refresh = Duration::from_millis(self.inner.options.ticker_refresh_ms);
        let generation = {
            let local = self.local();
            if let Some(read) = &local.index_read {
                if read.at.elapsed() < refresh {
                    return Ok((read.groups.clone(), false));
                }
            }
            local.index_generation
        };
        let at = Instant::now();
        let groups = self.inner.store.index_members().await?;
        let heal: Vec<GroupId> = {
            let mut local = self.local();
            local.last_indexed.clone_from(&groups);
            let listed: BTreeSet<GroupId> = groups.iter().cloned().collect();
            let heard = std::mem::take(&mut local.heard_unlisted);
            let heal = heard.into_iter().filter(|(g, fresh)| *fresh > at && !listed.contains(g)).map(|(g, _)| g);
            let heal = heal.collect();
            if local.index_generation == generation {
                local.index_read = Some(IndexRead { at, groups: groups.clone(), listed });
            }
            heal
        };
        self.heal_index(&heal).await;
        Ok((groups, true))
    }

    /// Adds to the index groups a member heartbeat through this process while the index did not
    /// list them: their create's index write failed (it is a separate command, and only logged
    /// when it fails), and the ticker walks only the index, so such a group was never ticked —
    /// a crashed member never expired and its shards never moved — until an operator ran
    /// `rebuild-index` (an admin review finding). Only a recorded member's heartbeat from the last
    /// half assignment lease counts, and each group's record is read again first: one deleted
    /// (through another instance) since is not added back, which would page `METADATA_MISSING`
    /// for it (a diff review). What is left is a delete landing between that read and the add, one
    /// round trip; its stale entry pages `METADATA_MISSING` until it is removed from the index by
    /// hand (`SREM`: `rebuild-index` only adds), as the entry of a delete whose `SREM` failed does.
    /// Nothing removes an entry on its own: an entry whose record is gone is also what a lost
    /// group looks like, and it is what makes the group's next create a recreate, which waits
    /// out the lost history's leases. The next pass reads the index again, so the group is ticked
    /// from then on.
    async fn heal_index(&self, groups: &[GroupId]) {
        for group in groups {
            match self.inner.store.load(group).await {
                Ok(Some(_)) => {}
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(%group, %error, "group missing from the group index: its record could not be read");
                    continue;
                }
            }
            match self.inner.store.index_add(group).await {
                Ok(()) => tracing::warn!(%group, "group recorded but missing from the group index: added"),
                Err(error) => {
                    self.count_index_failure(&error);
                    tracing::warn!(%group, %error, "group missing from the group index: adding it failed");
                }
            }
        }
        if !groups.is_empty() {
            self.index_changed();
        }
    }

    /// Whether the index lists `group`, judged from the ticker's paced index read when that is at
    /// most `ticker_refresh_ms` old (a running ticker keeps it so; else read now, and not kept:
    /// the ticker's own reads drive its clean-up of groups gone elsewhere, which requests must
    /// not starve): requests naming groups that have no record cost no index read of their own. Each such request used to read the whole index (`SMEMBERS`), unauthenticated
    /// on an open data plane (a review: a few hundred a second saturate Redis with 10,000
    /// groups). The index is never truth, and [`Coordinator::missing`] only chooses between two
    /// fail-closed answers with it; an admin create, which decides what it writes by it, reads it
    /// fresh ([`Coordinator::index_knows`]).
    /// Only "not listed" is taken from the paced read: "listed" is confirmed by a read of its own
    /// (rare: a listed group without a record), so a group deleted through another instance since
    /// is not answered `METADATA_MISSING`, which pages the operator.
    pub(super) async fn index_lists(&self, group: &GroupId) -> Result<bool, StoreError> {
        match self.index_lists_paced(group) {
            Some(false) => Ok(false),
            Some(true) | None => Ok(self.inner.store.index_members().await?.contains(group)),
        }
    }

    /// Whether the ticker's paced index read lists `group`, if that read is fresh (no read of its
    /// own: `None` when there is no fresh one).
    pub(super) fn index_lists_paced(&self, group: &GroupId) -> Option<bool> {
        let refresh = Duration::from_millis(self.inner.options.ticker_refresh_ms);
        self.local()
            .index_read
            .as_ref()
            .filter(|read| read.at.elapsed() < refresh)
            .map(|read| read.listed.contains(group))
    }

    /// This process changed the index (or the store may have lost entries of it): the next pass
    /// reads it.
    pub(super) fn index_changed(&self) {
        self.local().index_changed();
    }

    /// Counts this pass in the tick roster and reads who else ticks (sharing on), at most every
    /// `ticker_refresh_ms` and every quarter `ticker_silence_ms` (`mid_pass`, between two groups
    /// of a pass: every quarter silence). A failed read keeps the last live set: ownership never
    /// depends on a store that did not answer.
    async fn read_roster(&self, mid_pass: bool) {
        let silence_ms = self.inner.options.ticker_silence_ms;
        // A terminating instance left the roster (`begin_shutdown`); a pass still running must
        // not count it in again.
        if silence_ms == 0 || self.is_terminating() {
            return;
        }
        let period_ms =
            if mid_pass { silence_ms / 4 } else { self.inner.options.ticker_refresh_ms.min(silence_ms / 4) };
        let period = Duration::from_millis(period_ms);
        {
            let mut local = self.local();
            let now = Instant::now();
            if local.roster_read_at.is_some_and(|at| now.saturating_duration_since(at) < period) {
                return;
            }
            local.roster_read_at = Some(now);
        }
        let me = &self.inner.options.instance_id;
        let roster = match self.inner.store.tick_roster(me).await {
            Ok(roster) => roster,
            Err(e) => {
                self.store_error(e);
                return;
            }
        };
        let (forgotten, live) = {
            let mut local = self.local();
            let silence = Duration::from_millis(silence_ms);
            let forget = Duration::from_millis(TICKER_FORGET_MS.max(silence_ms));
            let before = local.roster.live().to_vec();
            let (forgotten, changed) = local.roster.observe(me, &roster, Instant::now(), silence, forget);
            if changed {
                tracing::info!(live = ?local.roster.live(), "tick roster changed");
                // An instance this process did not count live may have relayed writes meanwhile,
                // in blobs that expired unread: a group deferred on a record it since changed
                // would wait for the audit. When one enters, every deferral ends (each group is
                // read once).
                if local.roster.live().iter().any(|instance| !before.contains(instance)) {
                    local.deferred.clear();
                }
            }
            (forgotten, local.roster.live().len())
        };
        self.inner.metrics.set(
            "rsc_ticker_live_instances",
            "Coordinator instances this one counts live in the tick roster (they share the ticks of quiet groups).",
            vec![],
            live as f64,
        );
        if !forgotten.is_empty() {
            if let Err(e) = self.inner.store.forget_tickers(&forgotten).await {
                self.store_error(e);
            }
        }
    }

    /// Whether this process ticks `group` this pass (it is not deferred): it owns the group in
    /// the tick roster, or wrote it since it last found it idle, or has evidence of lost writes
    /// to record for it. Always, with sharing off.
    fn ticks_here(&self, group: &GroupId) -> bool {
        if self.inner.options.ticker_silence_ms == 0 {
            return true;
        }
        let local = self.local();
        let evidence_pending = local.regressed.contains_key(group) || local.identity_evidence_due(group);
        evidence_pending || local.dirty.contains(group) || local.roster.owns(&self.inner.options.instance_id, group)
    }

    /// Whether this process owns `group`'s ticks in the tick roster as it last read it (true with
    /// sharing off, or before the first read). For tests and operators' debugging.
    #[doc(hidden)]
    pub fn owns_tick(&self, group: &GroupId) -> bool {
        self.inner.options.ticker_silence_ms == 0 || self.local().roster.owns(&self.inner.options.instance_id, group)
    }

    /// Runs `tick_all` every `tick_interval_ms` until terminating.
    pub async fn run_ticker(&self) {
        let period = Duration::from_millis(self.inner.options.tick_interval_ms);
        while !self.is_terminating() {
            self.tick_all().await;
            crate::time::sleep(period).await;
        }
    }

    /// Whether the ticker skips `group` this pass: it was idle when last ticked, its deferral
    /// has not run out, no write through this process and no store identity change came since,
    /// and no evidence waits to be recorded.
    ///
    /// A deferral that ran out is first computed again from what this process saw since, without
    /// a read: heartbeats through this process restart their members' liveness windows
    /// ([`LocalView::note_heartbeat`](crate::core::LocalView::note_heartbeat)) and confirm the
    /// decoded record against the store, so a group whose members all heartbeat here stays
    /// deferred until one of them falls silent (or the audit is due) and its ticks cost no
    /// command. This needs the record confirmed and every member heard within a quarter member
    /// TTL: a member another instance added (this process's copy lacks it), or one whose
    /// heartbeats go elsewhere, is then read as often as before.
    fn tick_deferred(&self, group: &GroupId) -> bool {
        let now = Instant::now();
        let deferred = {
            let local = self.local();
            if local.regressed.contains_key(group) {
                return false;
            }
            match local.deferred.get(group) {
                Some(d) if d.identity_generation == local.identity_generation => d.clone(),
                _ => return false,
            }
        };
        if now < deferred.until {
            return true;
        }
        if now >= deferred.audit_at {
            return false;
        }
        let Some(cached) = self.inner.cache.get(group) else { return false };
        let g = &cached.metadata;
        let confirm_within = Duration::from_millis(g.effective_member_lease_ttl_ms() / 4);
        if now.saturating_duration_since(deferred.confirmed) > confirm_within
            || deferred.confirmed_stamp.as_ref() != Some(&cached.stamp)
        {
            return false;
        }
        let obs = self.observe(g, None);
        if !deferral_renewable_without_read(g, &obs) {
            return false;
        }
        let Some(ms) = tick_deferral_ms(g, &obs, self.inner.options.planted).filter(|ms| *ms > 0) else {
            return false;
        };
        // The gauges a read would have refreshed (heartbeat ages come from the same windows).
        self.export_group_gauges(g, &obs);
        let mut local = self.local();
        if local.identity_generation != deferred.identity_generation {
            return false;
        }
        let Some(d) = local.deferred.get_mut(group) else { return false };
        d.until = (now + Duration::from_millis(ms)).min(d.audit_at);
        self.inner.metrics.count(&TICKS_DEFERRED_WITHOUT_READ, vec![]);
        true
    }

    /// Records a heartbeat through this process: `member`'s liveness window restarts (its touch
    /// answered `liveness`), and the record `g` was confirmed by the store just now. A record that
    /// `changed` under this process's copy (another instance wrote it) ends the group's deferral:
    /// the deferral was computed from the old copy (a member added there would otherwise be
    /// watched only from the deferral's end).
    fn note_heartbeat(
        &self,
        g: &GroupMetadata,
        stamp: Option<&RecordStamp>,
        member: &str,
        liveness: u64,
        changed: bool,
        generation: u64,
    ) {
        // Only a recorded member's heartbeat: a join refused, a made-up member id or a leave does
        // not show the group in use (a group whose last member left may be deleted at once).
        let fresh_for = Duration::from_millis(g.config.assignment_lease_ms / 2);
        let in_use = g.members.contains_key(member);
        if !self.inner.options.renew_deferrals_from_heartbeats {
            if in_use {
                self.local().note_heard(&g.group, fresh_for);
            }
            return;
        }
        let now_ms = self.now_ms();
        {
            let mut local = self.local();
            local.view.note_heartbeat(now_ms, g, member, liveness);
            if in_use {
                local.note_heard(&g.group, fresh_for);
            } else {
                local.note_listed(&g.group);
            }
            match (changed, stamp) {
                (false, Some(stamp)) => {
                    if let Some(d) = local.deferred.get_mut(&g.group) {
                        d.confirmed = Instant::now();
                        d.confirmed_stamp = Some(stamp.clone());
                    }
                }
                // Changed, or a record without a `writeId` (nothing confirms it).
                _ => {
                    local.deferred.remove(&g.group);
                }
            }
        }
        if let Some(stamp) = stamp {
            self.relay_heartbeat(g, stamp, member, liveness, generation);
        }
    }

    /// Records how long the ticker may skip `group` (`None`: not at all), capped by the audit
    /// period ([`CoordinatorOptions::idle_group_audit_ms`]).
    fn defer_tick(&self, group: &GroupId, deferral_ms: Option<u64>, generation: u64, read: Option<RecordStamp>) {
        let audit_ms = self.inner.options.idle_group_audit_ms;
        let now = Instant::now();
        // Only a deferral needs the audit's phase (the group's hash slot: a key and a CRC).
        let audit_in_ms = deferral_ms.map_or(audit_ms, |_| {
            let since_start = now.saturating_duration_since(self.inner.started).as_millis();
            audit_in_ms(group, audit_ms, u64::try_from(since_start).unwrap_or(u64::MAX))
        });
        let mut local = self.local();
        if deferral_ms.is_some() && !local.relay.holds_write(group) {
            // Idle: from now on its owner ticks it (told of this process's last write to it).
            local.dirty.remove(group);
        }
        match deferral_ms.map(|ms| ms.min(audit_in_ms)).filter(|ms| *ms > 0) {
            Some(ms) => {
                let deferred = Deferred {
                    until: now + Duration::from_millis(ms),
                    identity_generation: generation,
                    audit_at: now + Duration::from_millis(audit_in_ms),
                    confirmed: now,
                    confirmed_stamp: read,
                };
                local.deferred.insert(group.clone(), deferred);
            }
            None => {
                local.deferred.remove(group);
            }
        }
    }

    /// A write through this process may have made `group` busy: tick it at the next pass.
    pub(super) fn undefer_tick(&self, group: &GroupId) {
        let mut local = self.local();
        local.deferred.remove(group);
        local.dirty.insert(group.clone());
        local.note_listed(group);
    }

    async fn tick_group(&self, group: &GroupId) -> Result<(), ApiError> {
        // The generation this tick judged evidence in: a change that lands meanwhile must void the
        // deferral it may end with.
        // While the identity is suspect, a group whose Cluster primary does not answer fails here
        // at once (one check per primary serves all its groups), rather than each spending the
        // store's deadline on its load: a pass then reaches the groups on the other primaries in
        // time (an isolation review: one hung primary delayed every group's expiries).
        self.recheck_identity_if_suspect(group).await?;
        let generation = self.local().identity_generation;
        let ticket = self.local().reads.begin_read();
        let record = self.inner.store.load(group).await.map_err(|e| self.group_store_error(group, e))?;
        let Some(record) = record else {
            return Err(self.missing_at_tick(group).await);
        };
        self.local().missing_at_tick.remove(group);
        let g = self.decode_counted(group, &record)?;
        if self.record_pending_evidence(&g, (record.revision, write_digest(&record.write_id)), ticket).await? {
            // The state moved on; the next tick starts from a fresh read.
            return Ok(());
        }
        // Liveness is read in a group without members too: it has nobody to expire, but
        // heartbeats of made-up member ids leave fields there that only a tick removes
        // (`ORPHAN_LIVENESS_MAX`); when it read only the record, a flood of them grew the hash
        // without bound. An idle group's ticks are deferred, so this costs little.
        let liveness = self.inner.store.liveness(group).await.map_err(|e| self.store_error(e))?;
        let obs = self.observe(&g, Some(&liveness));
        self.export_group_gauges(&g, &obs);
        let probe = decide_tick(&g, self.context(Some(&g), record.revision, &obs));
        if probe.write.next.is_none() {
            let deferral_ms = tick_deferral_ms(&g, &obs, self.inner.options.planted);
            self.defer_tick(group, deferral_ms, generation, record.stamp());
            return Ok(());
        }
        let empties = !g.members.is_empty() && probe.write.next.as_ref().is_some_and(|n| n.members.is_empty());
        self.critical(group, true, |g, rev, obs| match g {
            Some(g) => decide_tick(g, self.context(Some(g), rev, obs)),
            None => Decision { write: Default::default(), outcome: Ok(()) },
        })
        .await?;
        if empties && self.inner.options.planted.has(PlantedBug::DeleteGroupOfLastExpiredMember) {
            self.delete_empty_group(group).await?;
        }
        Ok(())
    }

    /// The planted `DeleteGroupOfLastExpiredMember`: deletes the group's metadata if it still has
    /// no member (conditioned on the stamp just read).
    async fn delete_empty_group(&self, group: &GroupId) -> Result<(), ApiError> {
        let loaded = self.inner.store.load(group).await.map_err(|e| self.group_store_error(group, e))?;
        let Some(record) = loaded else { return Ok(()) };
        let g = self.decode_counted(group, &record)?;
        if g.members.is_empty() {
            self.inner.store.delete(group, &record.cas_stamp()).await.map_err(|e| self.group_store_error(group, e))?;
            self.forget_group(group, Forget::Deleted);
        }
        Ok(())
    }

    /// Before a mutation that does not judge its own read (an admin add-shards or config change;
    /// routing reports judge the read they start with): reads the group and records the loss evidence
    /// this process holds for it, as heartbeats, ticks and deletes do, so the mutation is decided
    /// inside the correction round rather than before it. Without this, an instance that had seen
    /// a later revision than a silent rollback left could record an add-shards' grants with no
    /// round, and another instance answer them `OK` beside the lost history's owners until this
    /// one's next tick of the group. One more read per such mutation (they are rare).
    /// Returns whether it recorded a round (the group's revision then moved on).
    async fn record_evidence_before_mutation(&self, group: &GroupId) -> Result<bool, ApiError> {
        // An identity change this process suspects is evidence too: found now, not only inside
        // the mutation's critical section, after its decision.
        self.recheck_identity_if_suspect(group).await?;
        let ticket = self.local().reads.begin_read();
        let record = self.inner.store.load(group).await.map_err(|e| self.group_store_error(group, e))?;
        let Some(record) = record else { return Ok(false) };
        let g = self.decode_counted(group, &record)?;
        self.record_pending_evidence(&g, (record.revision, write_digest(&record.write_id)), ticket).await
    }

    /// Records a correction round for evidence this process found (identity change, regression).
    /// `(revision, write)`: the record's revision and the [`write_digest`] of its `writeId`.
    /// Returns true when it went through a critical section (the caller's state is then stale).
    async fn record_pending_evidence(
        &self,
        g: &GroupMetadata,
        (revision, write): (u64, u64),
        ticket: ReadTicket,
    ) -> Result<bool, ApiError> {
        let read = Observed { revision, incarnation: g.incarnation, write };
        let evidence = self.pending_evidence(&g.group, read, ticket);
        let Some(evidence) = evidence else { return Ok(false) };
        let generation = self.local().identity_generation;
        self.critical_recording_evidence(&g.group, |g, rev, obs| match g {
            Some(g) => decide_evidence(g, evidence.clone(), self.context(Some(g), rev, obs)),
            None => Decision { write: Default::default(), outcome: Ok(()) },
        })
        .await?;
        let mut local = self.local();
        local.evidence_recorded.insert(g.group.clone(), generation);
        local.regressed.remove(&g.group);
        Ok(true)
    }

    /// Judges the revision a read issued at `ticket` returned and returns evidence this group still
    /// has to record. Only a read issued after a higher revision (or the same revision under
    /// another `writeId`) was observed testifies to a regression ([`ReadOrder`]); identity changes
    /// are tracked per generation.
    pub(super) fn pending_evidence(&self, group: &GroupId, read: Observed, ticket: ReadTicket) -> Option<LossEvidence> {
        let ignore_order = self.inner.options.planted.has(PlantedBug::ProcessWideRevisionMark);
        let mut local = self.local();
        let revision = read.revision;
        if let RevisionVerdict::Regressed { seen } = local.reads.observe_read(group, ticket, read, ignore_order) {
            self.inner.metrics.count(&METADATA_VERSION_REGRESSIONS, vec![("group", group.to_string())]);
            local.view.reset(group);
            local.regressed.insert(group.clone(), LossEvidence::RevisionRegressed { seen, stored: revision });
        }
        if let Some(evidence) = local.regressed.get(group) {
            return Some(evidence.clone());
        }
        let generation = local.identity_generation;
        let recorded = local.evidence_recorded.get(group).copied().unwrap_or(0);
        if generation <= recorded {
            return None;
        }
        if local.identity_evidence_due(group) {
            return Some(LossEvidence::StoreIdentityChanged);
        }
        // No change since the last one recorded touched this group's slot.
        local.evidence_recorded.insert(group.clone(), generation);
        None
    }

    /// After a connection-level failure, confirms the server identity before answering for
    /// `group`. On a Redis Cluster the primary holding the group's slot is asked first, alone
    /// ([`Self::slot_confirmed`]): a primary that does not answer (crashed, frozen, cut off)
    /// fails only the groups it holds, as a whole identity read — which needs every primary —
    /// would fail every group's requests until its replica took over (an isolation review: a
    /// bystander group on another primary stopped with it).
    pub(super) async fn recheck_identity_if_suspect(&self, group: &GroupId) -> Result<(), ApiError> {
        if !self.local().identity_suspect {
            return Ok(());
        }
        match self.slot_confirmed(group).await {
            SlotCheck::Unchanged => return Ok(()),
            // Its own primary does not answer: neither would the request's reads. The whole read
            // runs at the ticker's next pass (which processes a failover it finds).
            SlotCheck::Unreachable => {
                return Err(ApiError::new(
                    ErrorCode::StoreUnavailable,
                    "store identity could not be confirmed: the primary holding this group's slot does not answer",
                ))
            }
            SlotCheck::Undecided => {}
        }
        let failed_lately = self.local().whole_read_failed.is_some_and(|at| at.elapsed() < PRIMARY_CHECK_FRESH);
        if failed_lately || !self.check_identity().await {
            if !failed_lately {
                self.local().whole_read_failed = Some(Instant::now());
            }
            return Err(ApiError::new(ErrorCode::StoreUnavailable, "store identity could not be confirmed"));
        }
        Ok(())
    }

    /// On a Redis Cluster, whether the primary that held `group`'s slot alone at the last identity
    /// read still does, unchanged, by its own account read now ([`ServerIdentity::slot_unchanged`]):
    /// nothing written to the group's keys can have been lost by a change of its primary,
    /// whatever other primaries did. One check per primary per [`PRIMARY_CHECK_FRESH`] serves
    /// every group it holds. `Undecided` on one server, without a recorded identity, for a slot
    /// the last read found migrating or disputed, and when the node answered changed (the whole
    /// read must then process the change).
    async fn slot_confirmed(&self, group: &GroupId) -> SlotCheck {
        let slot = keys::group_slot(group);
        let (seen, generation, failures) = {
            let local = self.local();
            match &local.identity {
                Some(seen) if !seen.primaries.is_empty() => {
                    (seen.clone(), local.identity_generation, local.unavailable_errors)
                }
                _ => return SlotCheck::Undecided,
            }
        };
        let Some(holder) = seen.sole_holder(slot) else { return SlotCheck::Undecided };
        let node = holder.node_key().to_string();
        if let Some((at, unchanged)) = self.local().primary_checks.get(&node) {
            if at.elapsed() < PRIMARY_CHECK_FRESH {
                return if *unchanged { SlotCheck::Unchanged } else { SlotCheck::Unreachable };
            }
        }
        let verdict = match self.inner.store.primary_account(holder).await {
            Ok(Some(now)) if seen.slot_unchanged(slot, &now) => SlotCheck::Unchanged,
            Err(StoreError::Unavailable(_)) => SlotCheck::Unreachable,
            // Changed (the whole read must process the change), not a Cluster, or an answer that
            // is no verdict (a denial, a protocol error).
            Ok(_) | Err(_) => return SlotCheck::Undecided,
        };
        let mut local = self.local();
        // Only while nothing changed meanwhile: an identity change or a new failure empties the
        // checks, and a check issued before must not be kept as fresh.
        if local.identity_suspect
            && local.identity_generation == generation
            && local.unavailable_errors == failures
            && local.identity.as_ref() == Some(&seen)
        {
            local.primary_checks.insert(node, (Instant::now(), verdict == SlotCheck::Unchanged));
        }
        verdict
    }

    /// Compares the store's identity with the last one seen; a change resets every window.
    /// Returns false when the identity could not be read.
    pub(super) async fn check_identity(&self) -> bool {
        let ticket = self.local().reads.begin_read();
        let identity = match self.inner.store.identity().await {
            Ok(identity) => identity,
            Err(e) => {
                self.store_error(e);
                return false;
            }
        };
        let mut local = self.local();
        if !local.reads.identity_read_is_newest(ticket) {
            // A newer identity read already answered: this late answer is no news.
            return true;
        }
        local.identity_suspect = false;
        local.primary_checks.clear();
        local.whole_read_failed = None;
        match local.identity.clone() {
            // On a Cluster, servers that changed without any slot that may have lost writes — a
            // node added (an idle master) or gone after giving its slots away unchanged, a
            // migration between unchanged primaries — are the slot map to judge the next change
            // by, not evidence: no warning, no count, nothing reset.
            Some(seen) if !seen.same_servers(&identity) && loses_nothing(&seen, &identity) => {
                tracing::info!(?seen, now = ?identity, "store servers changed; no slot may have lost writes");
                local.identity = Some(identity);
            }
            Some(seen) if !seen.same_servers(&identity) => {
                tracing::warn!(?seen, now = ?identity, "store identity changed: treating recent writes as lost");
                self.inner.metrics.count(&STORE_IDENTITY_CHANGES, vec![]);
                local.identity = Some(identity.clone());
                local.identity_generation += 1;
                local.index_changed();
                local.relay.clear_outgoing();
                let generation = local.identity_generation;
                // Windows and decoded copies of the groups whose writes may be lost restart; on one
                // server that is every group. Which groups record evidence is decided per group
                // from the change log (`identity_evidence_due`).
                if seen.primaries.is_empty() || identity.primaries.is_empty() {
                    local.lost_everywhere = generation;
                    local.view.reset_all();
                    self.inner.cache.clear();
                } else {
                    local.lost_in_slot.resize(usize::from(keys::CLUSTER_SLOTS), 0);
                    for slot in 0..keys::CLUSTER_SLOTS {
                        if seen.may_have_lost(&identity, slot) {
                            local.lost_in_slot[usize::from(slot)] = generation;
                        }
                    }
                    let lost = |group: &GroupId, lost_in_slot: &[u64]| {
                        lost_in_slot[usize::from(keys::group_slot(group))] == generation
                    };
                    for group in local.view.groups() {
                        if lost(&group, &local.lost_in_slot) {
                            local.view.reset(&group);
                        }
                    }
                    let lost_in_slot = local.lost_in_slot.clone();
                    self.inner.cache.retain(|group| !lost(group, &lost_in_slot));
                }
            }
            // Slots moved between the same primaries: the slot map to judge the next change by.
            Some(seen) if seen != identity => local.identity = Some(identity),
            Some(_) => {}
            None => local.identity = Some(identity),
        }
        true
    }
}

/// Whether a change of a Cluster's identity from `seen` to `now` may have lost no write in any
/// slot ([`ServerIdentity::may_have_lost`]); never on one server, where any change counts.
fn loses_nothing(seen: &ServerIdentity, now: &ServerIdentity) -> bool {
    !seen.primaries.is_empty()
        && !now.primaries.is_empty()
        && (0..keys::CLUSTER_SLOTS).all(|slot| !seen.may_have_lost(now, slot))
}

fn bad_request(refused: InputError) -> ApiError {
    ApiError::new(ErrorCode::BadRequest, refused.to_string())
}

#[cfg(test)]
mod tests {
    use super::audit_in_ms;
    use crate::core::model::GroupId;

    #[test]
    fn groups_deferred_in_one_pass_are_audited_a_slice_at_a_time_once_a_period() {
        let audit_ms = 120_000;
        let groups: Vec<GroupId> = (0..1_000).map(|i| GroupId::new(format!("orders-{i}"), "billing")).collect();
        // Every group deferred in the same pass, 5 s after the start.
        let waits: Vec<u64> = groups.iter().map(|g| audit_in_ms(g, audit_ms, 5_000)).collect();
        // Never later than one period, never at once.
        assert!(waits.iter().all(|w| (1..=audit_ms).contains(w)), "{waits:?}");
        // Spread over the period: each 12 s tenth holds some of the 1,000, none most of them.
        let mut tenths = [0_usize; 10];
        for w in &waits {
            tenths[usize::try_from((w - 1) / 12_000).unwrap()] += 1;
        }
        assert!(tenths.iter().all(|n| (50..=150).contains(n)), "{tenths:?}");
        // Read again at its audit (a pass a little late), a group's next audit is one period on.
        for (g, w) in groups.iter().zip(&waits) {
            let audited_at = 5_000 + w + 100;
            assert_eq!(audit_in_ms(g, audit_ms, audited_at), audit_ms - 100, "{g:?}");
        }
        // No audit period: nothing to wait for.
        assert_eq!(audit_in_ms(&groups[0], 0, 5_000), 0);
    }
}
