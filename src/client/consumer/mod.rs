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

mod batch;
pub mod core;
mod doorbell;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::core::model::ShardId;
use crate::core::planted::PlantedBug;
use crate::store::{keys, EntryId, FenceCheck, GroupStart, ReadFrom, StoreError, StreamStore};

pub use self::core::{AckError, ConsumerConfig, ConsumerCore, Delivery, Phase, ReadPlan, ReadStep};
use super::clock::Clock;
use super::events::{ClientEvent, EventSink, StopReason};
use super::transport::{CoordinatorTransport, TransportError};
use super::ClientEnv;

/// Told when shards start or stop being readable. Called from the consumer's tasks, outside its
/// lock: it may call back into the consumer, but should return quickly.
pub trait RebalanceListener: Send + Sync {
    /// The consumer may now read `shards`.
    fn on_assigned(&self, shards: &[ShardId]);
    /// The consumer stopped reading `shards` (revoked, dropped by a sync, or closing): finish and
    /// ack in-flight work quickly; the shards are released once nothing is in flight.
    fn on_revoked(&self, shards: &[ShardId]);
    /// The consumer lost `shards` at once (lease ended, fenced, group unavailable): in-flight
    /// entries were abandoned and can no longer be acked.
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
}

struct Shared<T, S> {
    core: Mutex<ConsumerCore>,
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
}

/// A consumer group member. Dropping it without `close` stops its heartbeats at once (the
/// coordinator expires it after the member lease TTL).
pub struct Consumer<T: CoordinatorTransport, S: StreamStore> {
    shared: Arc<Shared<T, S>>,
    heartbeats: Mutex<Option<JoinHandle<()>>>,
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
        let shared = Arc::new(Shared {
            core: Mutex::new(ConsumerCore::new(config)),
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
        });
        let heartbeats = tokio::spawn(heartbeat_loop(Arc::clone(&shared)));
        Self { shared, heartbeats: Mutex::new(Some(heartbeats)) }
    }

    pub fn member_id(&self) -> String {
        self.shared.lock().config().member_id.clone()
    }

    /// The consumer's current state.
    pub fn status(&self) -> ConsumerStatus {
        let now_ms = self.shared.clock.now_ms();
        let core = self.shared.lock();
        ConsumerStatus {
            phase: core.phase(),
            member_epoch: core.member_epoch(),
            metadata_version: core.metadata_version(),
            lease_end_ms: core.lease_end_ms(),
            readable: core.readable_shards(now_ms),
            revoking: core.revoking_shards(),
        }
    }

    /// Reads up to `max` entries from the shards this consumer may read right now, without
    /// waiting. A newly started shard is first set up (consumer group ensured, the previous
    /// owner's pending entries claimed), then this consumer's own pending entries are redelivered,
    /// then new entries are read.
    ///
    /// Cancel-safe: if the future is dropped before it returns, entries it had already read are
    /// abandoned (they stay pending at Redis and are redelivered), never left in flight where no
    /// one could settle them — which would keep their shard from ever being reported REVOKED.
    pub async fn poll(&self, max: usize) -> Result<Vec<Delivery>, PollError> {
        let now_ms = self.shared.clock.now_ms();
        let plans = self.shared.with_core(|core| core.read_plans(now_ms));
        if plans.is_empty() || max == 0 {
            return Ok(Vec::new());
        }
        let start = self.shared.cursor.fetch_add(1, Ordering::Relaxed) % plans.len();
        // Deliveries are in flight in the core from the moment a read returns; until they are
        // handed to the caller they are abandoned if this future is dropped (cancel safety).
        let mut out = Handed::new(&self.shared, Vec::new());
        let mut failure = None;
        for plan in plans.iter().cycle().skip(start).take(plans.len()) {
            if out.deliveries.len() >= max {
                break;
            }
            match self.read_shard(*plan, max - out.deliveries.len()).await {
                Ok(delivered) => out.deliveries.extend(delivered),
                Err(error) => failure = Some(error),
            }
        }
        match failure {
            Some(error) if out.deliveries.is_empty() => Err(PollError::Store(error)),
            _ => Ok(out.into_vec()),
        }
    }

    /// Up to three store calls on one shard: setup, own-pending, new; stops at the first read that
    /// delivers something. The lease is re-checked right before every call.
    async fn read_shard(&self, first: ReadPlan, max: usize) -> Result<Vec<Delivery>, StoreError> {
        let (group, member) = {
            let core = self.shared.lock();
            (core.config().group.clone(), core.config().member_id.clone())
        };
        let stream = group.stream_key(first.shard);
        for _ in 0..3 {
            let now_ms = self.shared.clock.now_ms();
            // The permission check and the call count are one step under the core's lock, so no
            // heartbeat can report the shard REVOKED between them.
            let plan = self.shared.with_core(|core| {
                let plan = core.plan_for(now_ms, first.shard, first.generation);
                if plan.is_some() {
                    core.call_started(first.shard);
                }
                plan
            });
            let Some(plan) = plan else {
                return Ok(Vec::new());
            };
            // Held until the call's result is registered (dropped on error or cancellation too).
            let _call = CallGuard { shared: &self.shared, shard: plan.shard };
            let fence = plan.fence.map(|fence| FenceCheck { key: keys::fence_key(&group, plan.shard), fence });
            match plan.step {
                ReadStep::Setup => {
                    let planted = self.shared.lock().config().planted;
                    if planted.has(PlantedBug::CreateGroupAtLatest) {
                        self.shared.store.create_group(&stream, &group.consumer_group, GroupStart::Latest).await?;
                    } else {
                        self.shared.store.ensure_group(&stream, &group.consumer_group).await?;
                    }
                    // Re-checked: the claim moves entries, so it is as sensitive as a read.
                    let now_ms = self.shared.clock.now_ms();
                    if self.shared.with_core(|core| core.plan_for(now_ms, plan.shard, plan.generation)).is_none() {
                        return Ok(Vec::new());
                    }
                    if !planted.has(PlantedBug::SkipPendingRecovery) {
                        let claim = match &fence {
                            Some(check) => {
                                let claimed = self.shared.store.fenced_claim_all_pending(
                                    check,
                                    &stream,
                                    &group.consumer_group,
                                    &member,
                                    0,
                                );
                                claimed.await.map(drop)
                            }
                            None => {
                                let claimed =
                                    self.shared.store.claim_all_pending(&stream, &group.consumer_group, &member, 0);
                                claimed.await.map(drop)
                            }
                        };
                        if let Err(error) = claim {
                            return self.refused(plan, error);
                        }
                    }
                    self.shared.with_core(|core| core.setup_done(plan.shard, plan.generation));
                }
                ReadStep::Read(from) => {
                    let count = if from == ReadFrom::OwnPending { plan.in_flight + max } else { max };
                    let read = match &fence {
                        Some(check) => {
                            let (group, member) = (&group.consumer_group, &member);
                            self.shared.store.fenced_xreadgroup(check, group, member, &stream, from, count).await
                        }
                        None => {
                            let streams = [(stream.clone(), from)];
                            let read =
                                self.shared.store.xreadgroup(&group.consumer_group, &member, &streams, count, None);
                            read.await.map(|replies| {
                                replies.into_iter().filter(|(s, _)| *s == stream).flat_map(|(_, e)| e).collect()
                            })
                        }
                    };
                    let entries = match read {
                        Ok(entries) => entries,
                        Err(error) => return self.refused(plan, error),
                    };
                    if from == ReadFrom::New {
                        // XREADGROUP `>` moved the group's last-delivered id to its last entry.
                        if let Some(last) = entries.last() {
                            self.shared.saw_new(plan.shard, plan.generation, last.id);
                        }
                    }
                    let now_ms = self.shared.clock.now_ms();
                    let delivered = self.shared.with_core(|core| core.handle_read(now_ms, plan, count, entries));
                    if !delivered.is_empty() || from == ReadFrom::New {
                        return Ok(self.ack_trimmed(Handed::new(&self.shared, delivered)).await);
                    }
                }
            }
        }
        Ok(Vec::new())
    }

    /// A read or claim on `plan`'s shard failed: a `FENCED` refusal loses the shard at once (see
    /// [`ConsumerCore::fenced_at_store`]) and reads nothing; any other error is the caller's.
    fn refused(&self, plan: ReadPlan, error: StoreError) -> Result<Vec<Delivery>, StoreError> {
        match (error, plan.fence) {
            (StoreError::Fenced { .. }, Some(fence)) => {
                let now_ms = self.shared.clock.now_ms();
                self.shared.with_core(|core| core.fenced_at_store(now_ms, plan.shard, fence));
                Ok(Vec::new())
            }
            (error, _) => Err(error),
        }
    }

    /// Pending entries trimmed from the stream (MAXLEN) come back from an own-pending read with no
    /// fields (XADD never writes an entry without one): there is nothing to process, so they are
    /// acked here instead of being handed to the application. A failed ack leaves them in flight
    /// and delivered, so the application sees and settles them.
    async fn ack_trimmed(&self, mut delivered: Handed<'_, T, S>) -> Vec<Delivery> {
        let mut i = 0;
        while i < delivered.deliveries.len() {
            let trimmed = delivered.deliveries[i].entry.fields.is_empty();
            if trimmed && self.ack(&delivered.deliveries[i].clone()).await.is_ok() {
                delivered.deliveries.remove(i);
            } else {
                i += 1;
            }
        }
        delivered.into_vec()
    }

    /// Acknowledges an entry (XACK). Refused once the lease ended or the entry was abandoned.
    pub async fn ack(&self, delivery: &Delivery) -> Result<(), AckError> {
        let now_ms = self.shared.clock.now_ms();
        self.shared.with_core(|core| core.check_ack(now_ms, delivery))?;
        let (group, fence) = {
            let core = self.shared.lock();
            (core.config().group.clone(), core.fence_of(delivery.shard))
        };
        let ids = [delivery.entry.id];
        let acked = match fence {
            Some(fence) => {
                let check = FenceCheck { key: keys::fence_key(&group, delivery.shard), fence };
                self.shared.store.fenced_xack(&check, &delivery.stream, &group.consumer_group, &ids).await
            }
            None => self.shared.store.xack(&delivery.stream, &group.consumer_group, &ids).await,
        };
        match acked {
            Ok(_) => {}
            Err(StoreError::Fenced { .. }) => {
                let now_ms = self.shared.clock.now_ms();
                if let Some(fence) = fence {
                    self.shared.with_core(|core| core.fenced_at_store(now_ms, delivery.shard, fence));
                }
                return Err(AckError::Fenced { shard: delivery.shard, entry: delivery.entry.id });
            }
            Err(e) => return Err(AckError::Store(e.to_string())),
        }
        let now_ms = self.shared.clock.now_ms();
        if self.shared.with_core(|core| core.acked(now_ms, delivery)) {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Gives up an in-flight entry without acking it (it stays pending in Redis).
    pub fn abandon(&self, delivery: &Delivery) -> Result<(), AckError> {
        let now_ms = self.shared.clock.now_ms();
        if self.shared.with_core(|core| core.abandon(now_ms, delivery))? {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Clean leave: stop reading, let the application ack or abandon in-flight entries (from
    /// another task, while this waits), report every shard REVOKED, then send the leave
    /// heartbeat. Gives up after `close_timeout_ms`. A second call returns at once.
    pub async fn close(&self) -> Result<(), CloseError> {
        let now_ms = self.shared.clock.now_ms();
        let timeout_ms = self.shared.with_core(|core| {
            core.close(now_ms);
            core.config().close_timeout_ms
        });
        self.shared.wake.notify_one();
        let Some(mut task) = self.take_heartbeats() else { return Ok(()) };
        let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
        tokio::select! {
            biased;
            _ = &mut task => Ok(()),
            _ = tokio::time::sleep_until(deadline) => {
                task.abort();
                let now_ms = self.shared.clock.now_ms();
                self.shared.with_core(|core| core.abort(now_ms));
                Err(CloseError::TimedOut(timeout_ms))
            }
        }
    }
}

impl<T: CoordinatorTransport, S: StreamStore> Consumer<T, S> {
    fn take_heartbeats(&self) -> Option<JoinHandle<()>> {
        self.heartbeats.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl<T: CoordinatorTransport, S: StreamStore> Drop for Consumer<T, S> {
    fn drop(&mut self) {
        if let Some(task) = self.take_heartbeats() {
            task.abort();
        }
    }
}

/// Deliveries read from the store (in flight in the core) and not yet handed to the application.
/// Dropped before [`Handed::into_vec`] (the poll future was cancelled), it abandons each of them.
struct Handed<'a, T, S> {
    shared: &'a Shared<T, S>,
    deliveries: Vec<Delivery>,
}

impl<'a, T, S> Handed<'a, T, S> {
    fn new(shared: &'a Shared<T, S>, deliveries: Vec<Delivery>) -> Self {
        Self { shared, deliveries }
    }

    /// Hands the deliveries over: from now on they are the application's to settle.
    fn into_vec(mut self) -> Vec<Delivery> {
        std::mem::take(&mut self.deliveries)
    }
}

impl<T, S> Drop for Handed<'_, T, S> {
    fn drop(&mut self) {
        if self.deliveries.is_empty() {
            return;
        }
        let now_ms = self.shared.clock.now_ms();
        let mut drained = false;
        for delivery in &self.deliveries {
            // Not in flight any more (the shard was lost meanwhile): nothing to give up.
            drained |= self.shared.with_core(|core| core.abandon(now_ms, delivery)).unwrap_or(false);
        }
        if drained {
            self.shared.wake.notify_one();
        }
    }
}

/// Counts one store call on a shard as outstanding until dropped, so a shard is never reported
/// REVOKED while a call on it may still reach Redis (see `ConsumerCore::call_started`).
struct CallGuard<'a, T, S> {
    shared: &'a Shared<T, S>,
    shard: ShardId,
}

impl<T, S> Drop for CallGuard<'_, T, S> {
    fn drop(&mut self) {
        let now_ms = self.shared.clock.now_ms();
        if self.shared.with_core(|core| core.call_finished(now_ms, self.shard)) {
            self.shared.wake.notify_one();
        }
    }
}

impl<T, S> Shared<T, S> {
    fn lock(&self) -> MutexGuard<'_, ConsumerCore> {
        // A poisoned lock means a panic elsewhere mid-update; the core's state is still coherent
        // (every method leaves it valid), and failing closed is the lease's job.
        self.core.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the core, then publishes the events it emitted: to the sink under the lock (so
    /// the sink sees them in order), to the listener after the lock is released.
    fn lock_last_seen(&self) -> MutexGuard<'_, BTreeMap<ShardId, (u64, EntryId)>> {
        // Poisoned: a panic mid-insert; the map is only a hint (a wrong id costs one wake-up).
        self.last_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn with_core<R>(&self, f: impl FnOnce(&mut ConsumerCore) -> R) -> R {
        let (result, events) = {
            let mut core = self.lock();
            let result = f(&mut core);
            let events = core.drain_events();
            for event in &events {
                self.sink.emit(event.clone());
            }
            (result, events)
        };
        self.notify_listener(&events);
        result
    }

    fn notify_listener(&self, events: &[ClientEvent]) {
        let mut assigned = Vec::new();
        let mut revoked = Vec::new();
        let mut lost = Vec::new();
        if events.iter().any(|e| matches!(e, ClientEvent::ShardStarted { .. } | ClientEvent::ShardStopped { .. })) {
            self.reads_changed.notify_waiters();
        }
        for event in events {
            match event {
                ClientEvent::ShardStarted { shard, .. } => assigned.push(*shard),
                ClientEvent::ShardStopped { shard, reason, .. } => match reason {
                    StopReason::Revoked | StopReason::SyncDropped | StopReason::Closing => revoked.push(*shard),
                    _ => lost.push(*shard),
                },
                _ => {}
            }
        }
        // Stops first: a shard stopped and restarted by one response ends up assigned.
        if !lost.is_empty() {
            self.listener.on_lost(&lost);
        }
        if !revoked.is_empty() {
            self.listener.on_revoked(&revoked);
        }
        if !assigned.is_empty() {
            self.listener.on_assigned(&assigned);
        }
    }
}

/// The background heartbeat task; ends when the member has left.
/// How many failed heartbeats in a row the planted `HeartbeatTaskGivesUp` tolerates.
const PLANTED_HEARTBEAT_FAILURES_MAX: u32 = 10;

async fn heartbeat_loop<T: CoordinatorTransport, S: StreamStore>(shared: Arc<Shared<T, S>>) {
    let gives_up = shared.lock().config().planted.has(PlantedBug::HeartbeatTaskGivesUp);
    let mut failures_in_a_row: u32 = 0;
    loop {
        let now_ms = shared.clock.now_ms();
        let (request, deadline_ms, phase, timeout_ms) = shared.with_core(|core| {
            let request = core.poll_heartbeat(now_ms);
            (request, core.next_deadline_ms(), core.phase(), core.config().heartbeat_timeout_ms)
        });
        if phase == Phase::Left {
            return;
        }
        if let Some(request) = request {
            let result = exchange(&shared, request, timeout_ms).await;
            failures_in_a_row = if result.is_err() { failures_in_a_row.saturating_add(1) } else { 0 };
            let now_ms = shared.clock.now_ms();
            shared.with_core(|core| core.handle_heartbeat(now_ms, result));
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
            _ = tokio::time::sleep_until(give_up) => return Err(TransportError::Timeout),
            _ = shared.clock.sleep_until_ms(lease_end_ms.unwrap_or(u64::MAX)), if lease_end_ms.is_some() => {
                let now_ms = shared.clock.now_ms();
                shared.with_core(|core| core.handle_timeout(now_ms));
            }
        }
    }
}
