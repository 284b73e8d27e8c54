//! The consumer library: a Kafka-like API ([`Consumer::join`], [`Consumer::poll`] and
//! [`Consumer::poll_wait`] (`doorbell.rs`), [`Consumer::ack`] and [`Consumer::ack_all`]
//! (`batch.rs`), [`Consumer::close`], a [`RebalanceListener`]) over the pure [`core::ConsumerCore`].
//!
//! How it runs (the same in production and in the simulation): `join` spawns one background
//! heartbeat task with `tokio::spawn` (madsim's on the simulated node). The task sends a heartbeat
//! whenever the core says one is due, applies the result, and applies the lease-end timer even
//! while a heartbeat is in flight. The application calls `poll` / `ack` from its own task(s); they
//! share the core behind a mutex that is never held across an `.await`. Nothing here reads a clock
//! except through [`Clock`], and nothing draws randomness.
//!
//! Safety rules enforced here rather than in the core: the lease is checked immediately before
//! every store call that reads, claims or acks entries (XREADGROUP, XAUTOCLAIM, XACK; no `.await`
//! between the check and the call) and on every wake of the heartbeat task, always against the
//! [`Clock`], which counts time the machine spent suspended (tokio's timers do not: they only
//! wake the task); results of a call are handed back to the core, which drops them if the shard
//! stopped meanwhile.

mod app_calls;
mod batch;
pub mod core;
mod doorbell;
mod read;
pub use self::read::POLL_MAX;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::core::model::{GroupId, MemberId, ShardId};
use crate::core::planted::PlantedBug;
use crate::core::protocol::MemberSession;
use crate::store::{keys, EntryId, FenceCheck, StoreError, StreamStore};

use self::app_calls::AppCalls;
pub use self::core::{AckError, ConsumerConfig, ConsumerCore, Delivery, Phase, ReadPlan, ReadStep};
use super::clock::Clock;
use super::events::{ClientEvent, EventSink, StopReason};
use super::transport::{CoordinatorTransport, TransportError};
use super::ClientEnv;

/// Told when shards start or stop being readable. Called outside the consumer's lock, so a call
/// may call back into the consumer, from the task that saw the change: the heartbeat task (a
/// coordinator's answer), or an application task in `poll`, `ack` or `close` (a lease that ended
/// on the consumer's own clock, a refusal at Redis, a close). Two consequences, unlike Kafka's
/// consumer, whose callbacks all run inside `poll` on the application's thread:
/// - time spent in a call on the heartbeat task is time without heartbeats: a call longer than
///   the assignment lease (8 s by default) loses the lease and every shard (`on_lost`), and one
///   longer than the member lease TTL gets the member expired. Return quickly, and hand other
///   work to a task of your own; but a flush or commit that must finish before the shard's next
///   owner starts belongs inside `on_revoked` (the shards are released only once it returned):
///   keep it well under the lease;
/// - calls from two tasks are not serialised: an `on_lost` from a `poll` can run beside an
///   `on_revoked` or `on_assigned` from the heartbeat task. Make the listener safe to call
///   concurrently, and read [`Consumer::status`] for the current state rather than replaying
///   the calls' order.
pub trait RebalanceListener: Send + Sync {
    /// The consumer may now read `shards`.
    fn on_assigned(&self, shards: &[ShardId]);
    /// The consumer stopped reading `shards` (revoked, dropped by a sync, or closing): finish and
    /// ack in-flight work quickly; the shards are released once nothing is in flight and this
    /// call returned, on a revoke and on `close` alike, so what it flushes or commits for them is
    /// done before their next owner may start them (as Kafka's `onPartitionsRevoked`). A poll that
    /// was under way may still hand out entries of these shards read before the revoke: they are
    /// in flight like the others, so settle them too (ack or abandon), or the drain waits for
    /// them.
    fn on_revoked(&self, shards: &[ShardId]);
    /// The consumer lost `shards` at once (lease ended, fenced, group unavailable): in-flight
    /// entries were abandoned and can no longer be acked; stop working on them (the next owner
    /// redelivers them). Also called for a shard `on_revoked` already named, when it is lost while
    /// draining with entries in flight, or when its drain gives up entries in flight for
    /// `ConsumerConfig::max_in_flight_ms`; it is released only once this call returned. The
    /// default calls `on_revoked`.
    fn on_lost(&self, shards: &[ShardId]) {
        self.on_revoked(shards);
    }
}

/// A listener that does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopListener;

impl RebalanceListener for NoopListener {
    fn on_assigned(&self, _shards: &[ShardId]) {}
    fn on_revoked(&self, _shards: &[ShardId]) {}
}

/// Why a poll delivered nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PollError {
    /// Every store call of this poll failed (entries read before a failure are still delivered).
    #[error("stream store: {0}")]
    Store(StoreError),
}

/// Why `close` did not finish cleanly.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CloseError {
    /// Drain, REVOKED reports and the leave heartbeat did not finish within `close_timeout_ms`;
    /// everything was abandoned (the coordinator expires the member after its lease TTL).
    #[error("close timed out after {0} ms; in-flight entries were abandoned")]
    TimedOut(u64),
    /// The heartbeat task had ended abnormally (a panic, say in the application's transport):
    /// no leave was sent (the coordinator expires the member after its lease TTL).
    #[error("the heartbeat task ended abnormally ({0}); no leave was sent")]
    HeartbeatTask(String),
}

/// A snapshot of the consumer's state (diagnostics, tests, the simulation's trace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerStatus {
    pub phase: Phase,
    pub member_epoch: u64,
    pub metadata_version: u64,
    pub lease_end_ms: Option<u64>,
    pub readable: Vec<ShardId>,
    pub revoking: Vec<ShardId>,
    /// Entries handed out and not settled yet (neither acked nor abandoned), on every shard. A
    /// revoking shard is handed over, and `close` leaves, only once its own are settled.
    pub in_flight: usize,
    /// `in_flight` per shard (shards with none are left out).
    pub in_flight_by_shard: BTreeMap<ShardId, usize>,
    /// How long the oldest entry in flight has been (`None`: nothing in flight). One that keeps
    /// growing towards `max_in_flight_ms` is a delivery the application lost track of.
    pub oldest_in_flight_age_ms: Option<u64>,
}

struct Shared<T, S> {
    core: Mutex<ConsumerCore>,
    /// The config's group and member id (the config never changes): read without the core's lock.
    group: GroupId,
    member_id: MemberId,
    transport: T,
    store: S,
    clock: Clock,
    sink: Arc<dyn EventSink>,
    listener: Arc<dyn RebalanceListener>,
    /// Wakes the heartbeat task early (a drained shard, `close`).
    wake: Notify,
    /// Round-robin start of `poll`, so no shard starves the others.
    cursor: AtomicUsize,
    /// Wakes a `poll_wait` doorbell when a shard starts or stops (notify_waiters: only waits
    /// already registered are woken).
    reads_changed: Notify,
    /// Per shard, the start (generation) and the group's last-delivered id there, as the doorbell
    /// watches after it (see `doorbell.rs`). Entries of shards no longer read are pruned at each
    /// doorbell wait.
    last_seen: Mutex<BTreeMap<ShardId, (u64, EntryId)>>,
    /// The last `poll_wait` ended empty: the next one rings the doorbell before polling.
    idle: AtomicBool,
    /// The sink's and the listener's calls, ended when the consumer is dropped (`app_calls.rs`).
    app: AppCalls,
}

/// A consumer group member. Dropping it without `close` stops its heartbeats at once (the
/// coordinator expires it after the member lease TTL). The drop waits for a sink or listener call
/// under way on another thread (the heartbeat task's) to return; after it, the sink has heard
/// `Closed` (unless a close ended the consumer) and nothing more, and no listener call starts.
pub struct Consumer<T: CoordinatorTransport, S: StreamStore> {
    shared: Arc<Shared<T, S>>,
    /// The heartbeat task. `close` holds this lock while it waits for the task, and leaves the
    /// handle in place until the task ended or was aborted: a `close` that is cancelled (a
    /// `timeout` around it) leaves the task where `Drop` aborts it and a later `close` waits for
    /// it again. (It used to take the handle out first: a cancelled close detached the task,
    /// which then heartbeat as a closing member for ever once its in-flight entries could no
    /// longer be settled, holding its shards and its member id.)
    heartbeats: tokio::sync::Mutex<Option<JoinHandle<()>>>,
    /// How the close that ended the heartbeat task ended: what a later `close` returns.
    closed: Mutex<Option<Result<(), CloseError>>>,
}

impl<T: CoordinatorTransport, S: StreamStore> Consumer<T, S> {
    /// Joins with default options (fresh clock, no events, no listener). Must be called inside
    /// the runtime: it spawns the heartbeat task, whose first heartbeat (epoch 0) goes out at once.
    pub fn join(config: ConsumerConfig, transport: T, store: S) -> Self {
        Self::join_with(config, transport, store, ClientEnv::default(), Arc::new(NoopListener))
    }

    /// Joins with an explicit clock, event sink and rebalance listener.
    pub fn join_with(
        config: ConsumerConfig,
        transport: T,
        store: S,
        env: ClientEnv,
        listener: Arc<dyn RebalanceListener>,
    ) -> Self {
        // The planted bug measures the lease on the clock that stops while the machine is
        // suspended: a resumed consumer then keeps reading on a lease that ended long ago.
        let clock = if config.planted.has(PlantedBug::LeaseOnStoppingClock) { env.clock.stopping() } else { env.clock };
        let (group, member_id) = (config.group.clone(), config.member_id.clone());
        // Every consumer is a new incarnation with a session of its own, whatever config it was
        // built from: one built from a clone of a closed consumer's config presented that
        // consumer's session at version 0, which the coordinator refuses as a late copy of the
        // departed incarnation's join (UNKNOWN_MEMBER), and it rejoined and was refused every
        // `prompt_ms` for as long as the group remembered the departure (a review finding).
        let config = ConsumerConfig { member_session: MemberSession::generate(), ..config };
        let mut core = ConsumerCore::new(config);
        core.set_entry_events(env.events.wants_entry_events());
        let shared = Arc::new(Shared {
            group,
            member_id,
            core: Mutex::new(core),
            transport,
            store,
            clock,
            sink: env.events,
            listener,
            wake: Notify::new(),
            cursor: AtomicUsize::new(0),
            reads_changed: Notify::new(),
            last_seen: Mutex::new(BTreeMap::new()),
            idle: AtomicBool::new(false),
            app: AppCalls::default(),
        });
        let heartbeats = tokio::spawn(heartbeat_loop(Arc::clone(&shared)));
        Self { shared, heartbeats: tokio::sync::Mutex::new(Some(heartbeats)), closed: Mutex::new(None) }
    }

    pub fn member_id(&self) -> String {
        self.shared.member_id.clone()
    }

    /// The consumer's current state.
    pub fn status(&self) -> ConsumerStatus {
        let core = self.shared.lock();
        let now_ms = self.shared.clock.now_ms();
        let in_flight_by_shard = core.in_flight_by_shard();
        ConsumerStatus {
            phase: core.phase(),
            member_epoch: core.member_epoch(),
            metadata_version: core.metadata_version(),
            lease_end_ms: core.lease_end_ms(),
            readable: core.readable_shards(now_ms),
            revoking: core.revoking_shards(),
            in_flight: in_flight_by_shard.values().sum(),
            in_flight_by_shard,
            oldest_in_flight_age_ms: core.oldest_in_flight_age_ms(now_ms),
        }
    }

    /// Acknowledges an entry (XACK). Refused once the lease ended or the entry was abandoned.
    pub async fn ack(&self, delivery: &Delivery) -> Result<(), AckError> {
        // The check and the fence under one lock: a shard removed between them (fenced at the
        // store, or every shard dropped by the heartbeat task) would read as unfenced and send a
        // plain XACK that no fence checks (review finding). `ack_all` does the same.
        let fence = self
            .shared
            .with_core_now(|core, now_ms| core.check_ack(now_ms, delivery).map(|()| core.fence_of(delivery.shard)))?;
        let group = &self.shared.group;
        let ids = [delivery.entry.id];
        let acked = match fence {
            Some(fence) => {
                let check = FenceCheck { key: keys::fence_key(group, delivery.shard), fence };
                self.shared.store.fenced_xack(&check, &delivery.stream, &group.consumer_group, &ids).await
            }
            None => self.shared.store.xack(&delivery.stream, &group.consumer_group, &ids).await,
        };
        match acked {
            Ok(_) => {}
            Err(StoreError::Fenced { .. }) => {
                if let Some(fence) = fence {
                    self.shared.with_core_now(|core, now_ms| core.fenced_at_store(now_ms, delivery.shard, fence));
                }
                return Err(AckError::Fenced { shard: delivery.shard, entry: delivery.entry.id });
            }
            Err(e) => return Err(AckError::Store(e.to_string())),
        }
        if self.shared.with_core_now(|core, now_ms| core.acked(now_ms, delivery)) {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Gives up an in-flight entry without acking it (it stays pending in Redis).
    pub fn abandon(&self, delivery: &Delivery) -> Result<(), AckError> {
        if self.shared.with_core_now(|core, now_ms| core.abandon(now_ms, delivery))? {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Clean leave: stop reading, tell the listener (`on_revoked`, on this task; the leave waits
    /// for it to return), let the application ack or abandon in-flight entries (from another
    /// task, while this waits), report every shard REVOKED, then send the leave heartbeat. Gives
    /// up after `close_timeout_ms`. Cancel-safe: a cancelled close leaves the consumer closing,
    /// and a later call waits again (each with its own `close_timeout_ms`); a call made while
    /// another runs waits for it. Once the close ended, a call returns its outcome at once.
    pub async fn close(&self) -> Result<(), CloseError> {
        let timeout_ms = self.shared.with_core_now(|core, now_ms| {
            core.close(now_ms);
            core.config().close_timeout_ms
        });
        self.shared.wake.notify_one();
        let mut heartbeats = self.heartbeats.lock().await;
        let Some(task) = heartbeats.as_mut() else {
            return self.closed.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or(Ok(()));
        };
        let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
        let outcome = tokio::select! {
            biased;
            ended = &mut *task => ended.map_err(|e| {
                // The task ended abnormally, without the leave: what it held stops here, and the
                // sink hears `Closed` (its lease gauge read 0 for ever otherwise).
                self.shared.with_core_now(|core, now_ms| core.abort(now_ms));
                CloseError::HeartbeatTask(e.to_string())
            }),
            _ = crate::time::sleep_until(deadline) => {
                task.abort();
                self.shared.with_core_now(|core, now_ms| core.abort(now_ms));
                Err(CloseError::TimedOut(timeout_ms))
            }
        };
        *heartbeats = None;
        *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome.clone());
        outcome
    }
}

impl<T: CoordinatorTransport, S: StreamStore> Drop for Consumer<T, S> {
    fn drop(&mut self) {
        if let Some(task) = self.heartbeats.get_mut().take() {
            task.abort();
        }
        // Nothing of this consumer runs any more: no sink or listener call starts from here on,
        // the ones under way on other threads (the heartbeat task may be emitting on another
        // worker: `abort` stops it only at its next `.await`) end first, and then the sink hears
        // `Closed` as this member's last event, unless a clean close (`Left`) or a close that
        // gave up (`Closed`) already ended it. The core's lock is not taken: a sink that drops
        // the consumer runs under it. The listener is never called from a drop.
        if !self.shared.app.end() {
            let event =
                ClientEvent::Closed { at_ms: self.shared.clock.now_ms(), member: self.shared.member_id.clone() };
            guarded("event sink", || self.shared.sink.emit(event));
        }
    }
}

impl<T, S> Shared<T, S> {
    fn lock(&self) -> MutexGuard<'_, ConsumerCore> {
        // A poisoned lock means a panic elsewhere mid-update; the core's state is still coherent
        // (every method leaves it valid), and failing closed is the lease's job.
        self.core.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_last_seen(&self) -> MutexGuard<'_, BTreeMap<ShardId, (u64, EntryId)>> {
        // Poisoned: a panic mid-insert; the map is only a hint (a wrong id costs one wake-up).
        self.last_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the core, then publishes the events it emitted: to the sink under the lock (so
    /// the sink sees them in order), to the listener after the lock is released. Once the
    /// consumer was dropped, the events are dropped too (see `app_calls.rs`).
    fn with_core<R>(&self, f: impl FnOnce(&mut ConsumerCore) -> R) -> R {
        let (result, changes) = {
            let mut core = self.lock();
            let result = f(&mut core);
            // Moved into the sink, not cloned: the listener needs only the shard changes, noted
            // on the way (most events are per entry, and most batches start or stop nothing).
            let mut changes = ShardChanges::default();
            // Most steps emit nothing (a lease check, a call counted): no application call then.
            if core.has_events() {
                let call = self.app.enter();
                core.drain_events_with(|event| {
                    changes.note(&event);
                    // Checked per event: a sink may drop the consumer (on this thread) mid-batch.
                    if call.is_none() || self.app.dropped() {
                        return;
                    }
                    if matches!(event, ClientEvent::Left { .. } | ClientEvent::Closed { .. }) {
                        self.app.note_ended();
                    }
                    guarded("event sink", || self.sink.emit(event));
                });
                // The shards the listener is told stopped stay undrained until it returned (see
                // `ConsumerCore::listener_called`): held here, under the lock that took their events.
                if call.is_some() {
                    changes.held = changes.stopped();
                    core.listener_called(&changes.held);
                }
            }
            (result, changes)
        };
        self.notify_listener(changes);
        result
    }

    /// [`Shared::with_core`] with the clock read once the lock is held, for every call that judges
    /// a time (a lease, a permission, a timer): the time `f` sees is never older than the wait for
    /// the lock, so a sink that runs long under the lock, or another task's turn, cannot make a
    /// check judge a lease on a time read before them; and the times the core sees follow the
    /// order in which it is locked.
    fn with_core_now<R>(&self, f: impl FnOnce(&mut ConsumerCore, u64) -> R) -> R {
        self.with_core(|core| f(core, self.clock.now_ms()))
    }

    fn notify_listener(&self, changes: ShardChanges) {
        if changes.any {
            self.reads_changed.notify_waiters();
        }
        // Stops first: a shard stopped and restarted by one response ends up assigned.
        let revoked = changes.revoked_not_lost();
        let due = !changes.lost.is_empty() || !revoked.is_empty() || !changes.assigned.is_empty();
        if let Some(_call) = due.then(|| self.app.enter()).flatten() {
            if !changes.lost.is_empty() {
                self.listen("rebalance listener (on_lost)", || self.listener.on_lost(&changes.lost));
            }
            if !revoked.is_empty() {
                self.listen("rebalance listener (on_revoked)", || self.listener.on_revoked(&revoked));
            }
            if !changes.assigned.is_empty() {
                self.listen("rebalance listener (on_assigned)", || self.listener.on_assigned(&changes.assigned));
            }
        }
        // Only now may the stopped shards be reported REVOKED, or left: `close` runs these calls
        // on the application's task while the heartbeat task runs beside it.
        if !changes.held.is_empty() && self.with_core_now(|core, now_ms| core.listener_returned(now_ms, &changes.held))
        {
            self.wake.notify_one();
        }
    }

    /// One listener call, unless the consumer was dropped meanwhile (by the listener's previous
    /// call, on this thread).
    fn listen(&self, what: &str, call: impl FnOnce()) {
        if !self.app.dropped() {
            guarded(what, call);
        }
    }
}

/// Runs application code (the listener, the event sink) so that a panic in it is logged and goes
/// no further. The heartbeat task runs both: a panic there ended the task without a word, after
/// which the consumer never heartbeat again, `poll` returned nothing for ever, and `close`
/// returned `Ok` without the leave (a consumer API review finding). What the panicking call
/// missed is the application's to lose; the consumer's own state was already updated.
fn guarded(what: &str, call: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(what, panic = %message, "consumer: application code panicked; the consumer goes on");
    }
}

/// The shard starts and stops among the events of one [`Shared::with_core`] call: what the
/// [`RebalanceListener`] and the `poll_wait` doorbell are told, in event order.
#[derive(Default)]
struct ShardChanges {
    /// Some shard started or stopped.
    any: bool,
    assigned: Vec<ShardId>,
    revoked: Vec<ShardId>,
    lost: Vec<ShardId>,
    /// `lost` as a set: one `EntryAbandoned` event per entry is checked against it.
    lost_set: BTreeSet<ShardId>,
    /// The stopped shards held undrained in the core until the listener calls returned.
    held: Vec<ShardId>,
}

impl ShardChanges {
    /// The shards revoked and not also lost among these events: a shard both is lost (its entries
    /// can no longer be acked), and `on_revoked` after `on_lost` would say the opposite.
    fn revoked_not_lost(&self) -> Vec<ShardId> {
        self.revoked.iter().copied().filter(|shard| !self.lost_set.contains(shard)).collect()
    }

    /// Every shard `on_lost` or `on_revoked` names.
    fn stopped(&self) -> Vec<ShardId> {
        let mut stopped = self.lost.clone();
        stopped.extend(self.revoked_not_lost());
        stopped
    }

    fn note(&mut self, event: &ClientEvent) {
        match event {
            ClientEvent::ShardStarted { shard, .. } => self.assigned.push(*shard),
            ClientEvent::ShardStopped { shard, reason, .. } => match reason {
                StopReason::Revoked | StopReason::SyncDropped | StopReason::Closing => self.revoked.push(*shard),
                _ => {
                    if self.lost_set.insert(*shard) {
                        self.lost.push(*shard);
                    }
                }
            },
            // A shard already stopped (draining after a revoke) whose in-flight entries are
            // given up because it was lost (lease end, fenced, group gone): the application,
            // told only `on_revoked`, was still processing them beside the next owner (a consumer
            // API review finding). It hears `on_lost` for it once; so does a shard whose drain gave
            // up entries in flight for `max_in_flight_ms` (the application may still be working on
            // them, and their next owner starts once the call returned).
            ClientEvent::EntryAbandoned {
                shard,
                reason:
                    StopReason::LeaseExpired
                    | StopReason::Fenced
                    | StopReason::GroupUnavailable
                    | StopReason::FencedAtStore
                    | StopReason::DrainTimeout,
                ..
            } => {
                if !self.lost_set.insert(*shard) {
                    return;
                }
                self.lost.push(*shard);
            }
            _ => return,
        }
        self.any = true;
    }
}

/// The background heartbeat task; ends when the member has left.
/// How many failed heartbeats in a row the planted `HeartbeatTaskGivesUp` tolerates.
const PLANTED_HEARTBEAT_FAILURES_MAX: u32 = 10;

async fn heartbeat_loop<T: CoordinatorTransport, S: StreamStore>(shared: Arc<Shared<T, S>>) {
    let gives_up = shared.lock().config().planted.has(PlantedBug::HeartbeatTaskGivesUp);
    let mut failures_in_a_row: u32 = 0;
    loop {
        // Dropped: `abort` ends this task only at its next `.await`, and nothing of a dropped
        // consumer may go on (no heartbeat, no event).
        if shared.app.dropped() {
            return;
        }
        let (request, deadline_ms, phase, timeout_ms, now_ms) = shared.with_core_now(|core, now_ms| {
            let request = core.poll_heartbeat(now_ms);
            (request, core.next_deadline_ms(), core.phase(), core.config().heartbeat_timeout_ms, now_ms)
        });
        if phase == Phase::Left {
            return;
        }
        if let Some(request) = request {
            let result = exchange(&shared, request, timeout_ms).await;
            failures_in_a_row = if result.is_err() { failures_in_a_row.saturating_add(1) } else { 0 };
            shared.with_core_now(|core, now_ms| core.handle_heartbeat(now_ms, result));
            if gives_up && failures_in_a_row >= PLANTED_HEARTBEAT_FAILURES_MAX {
                return;
            }
            continue;
        }
        // Woken early or late (a suspension), the next turn re-reads the clock and re-checks the
        // lease (`poll_heartbeat` starts with `handle_timeout`).
        let deadline_ms = deadline_ms.unwrap_or(now_ms.saturating_add(60_000));
        tokio::select! {
            biased;
            _ = shared.wake.notified() => {}
            _ = shared.clock.sleep_until_ms(deadline_ms) => {}
        }
    }
}

/// Sends one heartbeat and waits for its result, applying the lease-end timer meanwhile (a
/// heartbeat stuck in the network must not keep shards readable past the lease).
async fn exchange<T: CoordinatorTransport, S: StreamStore>(
    shared: &Shared<T, S>,
    request: crate::core::protocol::HeartbeatRequest,
    timeout_ms: u64,
) -> Result<crate::core::protocol::HeartbeatResponse, TransportError> {
    let give_up = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
    let call = shared.transport.heartbeat(request);
    tokio::pin!(call);
    loop {
        let lease_end_ms = shared.lock().lease_end_ms();
        tokio::select! {
            biased;
            result = &mut call => return result,
            _ = crate::time::sleep_until(give_up) => return Err(TransportError::Timeout),
            _ = shared.clock.sleep_until_ms(lease_end_ms.unwrap_or(u64::MAX)), if lease_end_ms.is_some() => {
                shared.with_core_now(|core, now_ms| core.handle_timeout(now_ms));
            }
        }
    }
}
