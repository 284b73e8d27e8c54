//! `MemoryStore`: an in-memory Redis with fault knobs, implementing [`MetadataStore`] and
//! [`StreamStore`] with the semantics a real Redis gives under the layout of [`crate::store::keys`].
//! It serves the simulation (madsim) and unit tests; `tests/store_contract.rs` holds it and
//! `RedisStore` to the same contract.
//!
//! Owns: the fake server's state (keys, streams, identity), its faults (`faults.rs`) and the ground
//! truth for checkers (`history.rs`). Never: blocks (`block_ms` is ignored), reads std clocks, holds
//! its lock across an `await`, draws randomness from anything but the seeded RNG. Invariant: every
//! client call is one atomic step under one lock, taken at the simulated instant the request
//! reaches the server; so the history is a linearisation of what clients saw.
//!
//! # Handles and connections
//! A [`MemoryStore`] is a cheap handle on shared state. Each handle models one connection that
//! remembers the server generation it was opened in; a failover, restart or flush starts a new
//! generation, and a handle from an older one fails its next call (that call only) with
//! `Unavailable("connection reset by peer …")`, then is reconnected. `Clone` copies the handle's
//! generation (a clone of a stale handle fails once too); [`MemoryStore::connect`] opens a fresh
//! connection at the current generation.
//!
//! # One call
//! 1. Admission: during an outage, [`OutageMode::Errors`] fails at once with
//!    `Unavailable("connection refused (store outage)")`; [`OutageMode::Timeouts`] sleeps `after_ms`,
//!    then fails with `Unavailable("timeout")`. Otherwise the call's latency is drawn.
//! 2. Half the latency passes (request on the wire).
//! 3. At the server, atomically: an outage that began meanwhile fails the call
//!    (`Unavailable("connection lost (store outage)")`); a stale connection fails it once; a
//!    rejected command fails it with `Unsupported`; else the operation runs.
//! 4. The other half of the latency passes (response on the wire).
//!
//! # Commands each method needs (for [`MemoryStore::set_unsupported`])
//! The same commands `RedisStore` sends, directly or from its Lua scripts; a method fails with
//! `Unsupported` naming the first of its list the server rejects.
//! | method | commands |
//! |---|---|
//! | `load` | `HMGET` |
//! | `touch_and_load` | `EVALSHA`, `HINCRBY`, `HMGET` |
//! | `touch_and_check` | `HINCRBY`, `HMGET` (a changed record: `HMGET` again) |
//! | `liveness` | `HGETALL` |
//! | `write` | `EVALSHA`, `EXISTS`, `HGET`, `HSET`, `HDEL` (a create then `SADD`s, best effort) |
//! | `delete` | `EVALSHA`, `HGET`, `DEL` (then `SREM`, best effort) |
//! | `acquire_mutex` / `release_mutex` | `SET` / `EVALSHA`, `GET`, `DEL` |
//! | `index_add` / `index_members` / `rebuild_index` | `SADD` / `SMEMBERS` / `SCAN`, `SADD` |
//! | `exchange_heard` | `SET` per blob, `GET` per sender |
//! | `identity` | `INFO` |
//! | `probe` | every name in [`REQUIRED_COMMANDS`], in that order |
//! | `xadd` / `ensure_group` / `xack` | `XADD` / `XGROUP` / `XACK` |
//! | `xreadgroup` / `claim_all_pending` | `XREADGROUP` / `XAUTOCLAIM` |
//!
//! # Error mapping (`RedisStore` must map the same way)
//! - Missing key or group in XREADGROUP / XAUTOCLAIM (`-NOGROUP`): `StoreError::Protocol` whose
//!   message starts with `NOGROUP` (checked for every stream before anything is delivered).
//! - XACK on a missing key or group: `Ok(0)` (Redis replies 0). `ensure_group` on an existing group
//!   (`-BUSYGROUP`): `Ok(())`.
//! - Unknown / disabled / ACL-denied command: `StoreError::Unsupported { command, detail }` with the
//!   upper-case command name.
//! - XADD with no fields: `Protocol("ERR wrong number of arguments for 'xadd' command")`;
//!   `acquire_mutex` with `ttl_ms == 0`: `Protocol("ERR invalid expire time in 'set' command")`.
//! - Connection refused / reset / timeout / LOADING / READONLY: `StoreError::Unavailable`.
//!
//! # Semantics worth knowing
//! - `write`: the write condition is checked first — the whole stamp (revision and writeId, see
//!   [`CasStamp`](crate::store::CasStamp)), never the revision alone — and fails as
//!   `RevisionConflict { current }`; then each liveness guard in request order (`LivenessChanged`
//!   for the first that differs, absent = 0); only then are the six fields written and
//!   `liveness_remove` fields deleted. An empty `write_id` is refused with `Protocol` before the
//!   call (RedisStore sends nothing). `delete` has the same stamp condition.
//! - A create (`write` with `expected: None`) also adds the group to the index; `delete`
//!   removes the metadata key, the liveness key and then the index entry, not the mutex. The
//!   index update is a separate journaled write (RedisStore sends it as its own command).
//! - `touch_and_load` does not increment when the metadata key is absent (the script checks
//!   first); `touch_and_check` finding it absent deletes the group's liveness hash (RedisStore
//!   pipelines HINCRBY first, then deletes the hash if the metadata key is absent).
//! - Mutex TTLs run on the store clock (`tokio::time::Instant`, simulated under madsim); a mutex is
//!   alive while `now_ms <= set_at_ms + ttl_ms`, as Redis keeps a key until `now > expire_at`.
//! - `index_members` and `rebuild_index` return groups sorted by [`GroupId`].
//! - Streams: ids are `<store ms>-<seq>`, strictly increasing; XREADGROUP `COUNT 0` means no limit;
//!   reading own pending entries bumps their delivery time; a pending entry trimmed by MAXLEN is
//!   returned by `ReadFrom::OwnPending` with empty `fields` and dropped by `claim_all_pending`.
//! - Shard streams are never rolled back (see [`MemoryStore::rollback`]).

mod faults;
mod fences;
mod history;
mod keyspace;
mod streams;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::Notify;
use tokio::time::{Duration, Instant};

use crate::core::model::{Fence, GroupId, MemberId};
use crate::core::PlantedBugs;
use crate::store::{
    keys, CasStamp, Doorbell, EntryId, FenceCheck, FenceRaise, FencedRead, GroupStart, MetadataStore, ProbeReport,
    ReadFrom, RecordStamp, ServerIdentity, StoreError, StoredRecord, StreamEntry, StreamStore, TouchCheck, TouchResult,
    WriteOutcome, WriteRequest,
};

pub use faults::{OutageMode, RollbackMode, CORRUPT_AGGREGATE};
pub use history::{
    AckRecord, AddRecord, HistoryEvent, HistoryKind, HistoryLimits, IdentityCause, ReadRecord, ReadSource,
};
pub use keyspace::JOURNAL_LEN_MAX;

use faults::Faults;
use history::History;
use keyspace::{Journal, Keyspace};
use streams::Streams;

/// What `probe` reports as the server version.
pub const SERVER_VERSION: &str = "7.2.0-memory";

/// Every command the layout needs, in the order `probe` checks them (shared with `RedisStore`).
pub use super::REQUIRED_COMMANDS;

/// A handle (one connection) on an in-memory Redis. See the module docs.
pub struct MemoryStore {
    shared: Arc<Mutex<Inner>>,
    /// The server generation this handle's connection was opened in.
    connected_generation: AtomicU64,
}

/// Compact on purpose: the state and history can be large.
impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("MemoryStore")
            .field("identity", &inner.identity)
            .field("generation", &inner.generation)
            .field("connected_generation", &self.connected_generation.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl Clone for MemoryStore {
    fn clone(&self) -> Self {
        let generation = self.connected_generation.load(Ordering::SeqCst);
        Self { shared: Arc::clone(&self.shared), connected_generation: AtomicU64::new(generation) }
    }
}

/// The fake server.
#[derive(Debug)]
struct Inner {
    created_at: Instant,
    rng: SmallRng,
    identity: ServerIdentity,
    /// Bumped by every failover, restart and flush; connections from older ones are broken.
    generation: u64,
    faults: Faults,
    keys: Keyspace,
    journal: Journal,
    streams: Streams,
    history: History,
    /// Planted bugs in the fake's scripts (simulation only).
    planted: PlantedBugs,
    /// Wakes the doorbell waits ([`StreamStore::wait_for_entries`]) at every XADD.
    appended: Arc<Notify>,
}

impl Inner {
    /// Store-clock milliseconds since the store was created.
    fn now_ms(&self) -> u64 {
        u64::try_from(self.created_at.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn record(&mut self, kind: HistoryKind, metadata_after: Vec<(GroupId, Option<StoredRecord>)>) {
        let at_ms = self.now_ms();
        self.history.push_event(at_ms, kind, metadata_after);
    }

    /// Every required command the server accepts, or `Unsupported` for the first it rejects.
    fn probe(&self) -> Result<ProbeReport, StoreError> {
        self.faults.check_supported(REQUIRED_COMMANDS)?;
        Ok(ProbeReport { server_version: SERVER_VERSION.to_string(), identity: self.identity.clone() })
    }

    /// Logs one delivery call: one record per stream, with what it delivered or why it failed.
    fn log_reads(&mut self, call: &ReadCall<'_>, outcome: &Result<Vec<(String, Vec<EntryId>)>, StoreError>) {
        let at_ms = self.now_ms();
        for (stream, from) in call.streams {
            let (ids, error) = match outcome {
                Ok(delivered) => {
                    let ids = delivered.iter().find(|(s, _)| s == stream).map(|(_, ids)| ids.clone());
                    (ids.unwrap_or_default(), None)
                }
                Err(e) => (Vec::new(), Some(e.clone())),
            };
            self.history.push_read(ReadRecord {
                issued_at_ms: call.issued_at_ms,
                at_ms,
                group: call.group.to_string(),
                consumer: call.consumer.to_string(),
                stream: stream.clone(),
                from: *from,
                ids,
                error,
                fence: call.fence,
                history_len: self.history.events_total(),
            });
        }
    }

    /// Logs one executed XACK.
    fn log_ack(&mut self, stream: &str, group: &str, acked: Vec<EntryId>, fence: Option<Fence>) {
        let at_ms = self.now_ms();
        let history_len = self.history.events_total();
        let ack =
            AckRecord { at_ms, stream: stream.to_string(), group: group.to_string(), ids: acked, fence, history_len };
        self.history.push_ack(ack);
    }
}

/// How a call gets past step 1 (see the module docs).
enum Admission {
    Refused,
    TimesOut { after_ms: u64 },
    Proceeds { latency_ms: u64 },
}

/// The granularity of a waiting doorbell: after an XADD it re-checks the streams at the next
/// multiple of this since the call ([`StreamStore::wait_for_entries`]).
const DOORBELL_STEP_MS: u64 = 5;

async fn sleep_ms(ms: u64) {
    if ms > 0 {
        crate::time::sleep(Duration::from_millis(ms)).await;
    }
}

impl MemoryStore {
    /// A new, empty, fault-free server; `seed` drives its identities, latency jitter and write
    /// drops. Must be called inside the runtime (the store clock starts now). Keeps its whole
    /// history for the checkers ([`HistoryLimits::UNBOUNDED`]).
    pub fn new(seed: u64) -> Self {
        Self::with_history_limits(seed, HistoryLimits::UNBOUNDED)
    }

    /// [`MemoryStore::new`] for a process serving real clients (`coordinator serve` without
    /// Redis): no checker reads its history, so it keeps only the newest records
    /// ([`HistoryLimits::SERVING`]), and nothing rolls it back, so it keeps no rollback journal
    /// ([`MemoryStore::rollback`] then undoes nothing). Its memory stays flat however many writes
    /// it serves.
    pub fn new_serving(seed: u64) -> Self {
        Self::build(seed, HistoryLimits::SERVING, 0)
    }

    /// [`MemoryStore::new`] keeping at most `limits` history records (the oldest are dropped).
    pub fn with_history_limits(seed: u64, limits: HistoryLimits) -> Self {
        Self::build(seed, limits, JOURNAL_LEN_MAX)
    }

    fn build(seed: u64, limits: HistoryLimits, journal_len_max: usize) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let identity = faults::random_identity(&mut rng);
        let inner = Inner {
            created_at: Instant::now(),
            rng,
            identity,
            generation: 0,
            faults: Faults::default(),
            keys: Keyspace::default(),
            journal: Journal::with_len_max(journal_len_max),
            streams: Streams::default(),
            history: History::new(limits),
            planted: PlantedBugs::NONE,
            appended: Arc::default(),
        };
        Self { shared: Arc::new(Mutex::new(inner)), connected_generation: AtomicU64::new(0) }
    }

    /// A new connection to the same server, opened now (not broken by earlier failovers).
    pub fn connect(&self) -> Self {
        let generation = self.lock().generation;
        Self { shared: Arc::clone(&self.shared), connected_generation: AtomicU64::new(generation) }
    }

    /// The lock is never held across an `await`; a panic while holding it (a bug) does not make
    /// the store unusable for the checkers that run afterwards.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits one round trip under the outage and latency knobs: its latency, or the failure a
    /// client would see (refused at once, or after the timeout).
    async fn admitted(&self) -> Result<u64, StoreError> {
        match self.admit() {
            Admission::Refused => Err(StoreError::Unavailable("connection refused (store outage)".into())),
            Admission::TimesOut { after_ms } => {
                sleep_ms(after_ms).await;
                Err(StoreError::Unavailable("timeout".into()))
            }
            Admission::Proceeds { latency_ms } => Ok(latency_ms),
        }
    }

    /// Runs one call; the outer error is a failure before the server ran `op` (outage, broken
    /// connection, rejected command), the inner one is `op`'s own.
    async fn call_raw<T>(
        &self,
        commands: &[&str],
        op: impl FnOnce(&mut Inner) -> Result<T, StoreError>,
    ) -> Result<Result<T, StoreError>, StoreError> {
        let latency_ms = self.admitted().await?;
        let request_ms = latency_ms / 2;
        sleep_ms(request_ms).await;
        let result = self.execute(commands, op);
        sleep_ms(latency_ms - request_ms).await;
        result
    }

    /// One round trip carrying two pipelined commands: each executes atomically, and the task
    /// yields between them so whatever else is ready at that instant (another client's command)
    /// may run in between, as it may on Redis.
    async fn call_pipeline<A, B>(
        &self,
        first: (&[&str], impl FnOnce(&mut Inner) -> A),
        second: (&[&str], impl FnOnce(&mut Inner) -> B),
    ) -> Result<(A, B), StoreError> {
        let latency_ms = self.admitted().await?;
        let request_ms = latency_ms / 2;
        sleep_ms(request_ms).await;
        // A connection-level failure (outage, reset) fails the whole pipeline: nothing after it runs.
        let a = self.execute(first.0, |inner| Ok(first.1(inner)))??;
        tokio::task::yield_now().await;
        let b = self.execute(second.0, |inner| Ok(second.1(inner)))??;
        sleep_ms(latency_ms - request_ms).await;
        Ok((a, b))
    }

    async fn call<T>(
        &self,
        commands: &[&str],
        op: impl FnOnce(&mut Inner) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.call_raw(commands, op).await?
    }

    /// Runs a delivery call and logs it in the read log, whether it delivered, found nothing or
    /// failed. `op` returns its result and the ids it delivered per stream.
    async fn logged_read<T>(
        &self,
        call: &ReadCall<'_>,
        command: &str,
        op: impl FnOnce(&mut Inner, u64) -> Result<(T, Vec<(String, Vec<EntryId>)>), StoreError>,
    ) -> Result<T, StoreError> {
        let result = self
            .call_raw(&[command], |inner| {
                let now_ms = inner.now_ms();
                let outcome = op(inner, now_ms);
                let logged = outcome.as_ref().map(|(_, delivered)| delivered.clone()).map_err(Clone::clone);
                inner.log_reads(call, &logged);
                outcome.map(|(value, _)| value)
            })
            .await;
        if let Err(e) = &result {
            self.lock().log_reads(call, &Err(e.clone()));
        }
        result?
    }

    fn admit(&self) -> Admission {
        let mut inner = self.lock();
        match inner.faults.outage() {
            Some(OutageMode::Errors) => Admission::Refused,
            Some(OutageMode::Timeouts { after_ms }) => Admission::TimesOut { after_ms },
            None => {
                let inner = &mut *inner;
                Admission::Proceeds { latency_ms: inner.faults.draw_latency_ms(&mut inner.rng) }
            }
        }
    }

    fn execute<T>(
        &self,
        commands: &[&str],
        op: impl FnOnce(&mut Inner) -> Result<T, StoreError>,
    ) -> Result<Result<T, StoreError>, StoreError> {
        let mut inner = self.lock();
        if inner.faults.outage().is_some() {
            return Err(StoreError::Unavailable("connection lost (store outage)".into()));
        }
        let connected = self.connected_generation.swap(inner.generation, Ordering::SeqCst);
        if connected != inner.generation {
            return Err(StoreError::Unavailable("connection reset by peer (server failover or restart)".into()));
        }
        inner.faults.check_supported(commands)?;
        Ok(op(&mut inner))
    }

    /// Whether any of `streams` holds an entry after its id in `after` (a doorbell's check).
    fn has_newer(&self, streams: &[(String, Option<EntryId>)], after: &[EntryId]) -> bool {
        let inner = self.lock();
        streams.iter().zip(after).any(|((s, _), id)| inner.streams.has_newer(s, *id))
    }

    /// Switches planted bugs of the fake's scripts on (the simulation's negative tests only).
    pub fn set_planted(&self, planted: PlantedBugs) {
        self.lock().planted = planted;
    }

    /// Fenced operations refused as `FENCED` so far, by operation.
    pub fn fence_refusals(&self) -> BTreeMap<&'static str, u64> {
        self.lock().history.fence_refusals.clone()
    }

    /// Peek without faults: the fence a key holds.
    pub fn peek_fence(&self, key: &str) -> Option<Fence> {
        self.lock().read_fence(key)
    }

    /// Store-clock milliseconds since the store was created (the time base of every record).
    pub fn now_ms(&self) -> u64 {
        self.lock().now_ms()
    }

    /// The aggregate JSON of the latest state of `group`'s metadata key that had `revision` and was
    /// stored at or before `at_ms` (`None`: no such state). A checker uses it to prove that a
    /// response derived from revision r was recorded before it was sent.
    pub fn record_at(&self, group: &GroupId, revision: u64, at_ms: u64) -> Option<String> {
        self.lock().history.record_at(group, revision, at_ms)
    }

    /// Every metadata change, raw edit, dropped write, rollback and identity change so far.
    pub fn history(&self) -> Vec<HistoryEvent> {
        self.lock().history.events()
    }

    /// Every XREADGROUP and XAUTOCLAIM call so far, one record per stream of a call.
    pub fn read_log(&self) -> Vec<ReadRecord> {
        self.lock().history.reads()
    }

    /// Every acknowledged XADD so far.
    pub fn add_log(&self) -> Vec<AddRecord> {
        self.lock().history.adds()
    }

    /// Every executed XACK so far.
    pub fn ack_log(&self) -> Vec<AckRecord> {
        self.lock().history.acks()
    }

    /// How many records the history keeps now: (metadata events, reads, adds, acks).
    pub fn history_lens(&self) -> (usize, usize, usize, usize) {
        self.lock().history.lens()
    }

    /// Moves out what [`MemoryStore::history`], [`MemoryStore::read_log`] and
    /// [`MemoryStore::ack_log`] return, leaving them empty: the end of a simulated run hands them
    /// to the checkers without copying every record (the copies cost about 2% of a run's wall
    /// time). `record_at` finds nothing afterwards.
    pub fn take_history_and_logs(&self) -> (Vec<HistoryEvent>, Vec<ReadRecord>, Vec<AckRecord>) {
        self.lock().history.take()
    }

    /// Empties the read, add and ack logs (the metadata history is kept: `record_at` needs it).
    pub fn clear_logs(&self) {
        self.lock().history.clear_logs();
    }

    /// Peek without faults: the stored metadata record.
    pub fn peek_record(&self, group: &GroupId) -> Option<StoredRecord> {
        self.lock().load(group)
    }

    /// Peek without faults: the server's current identity.
    pub fn peek_identity(&self) -> ServerIdentity {
        self.lock().identity.clone()
    }

    /// Peek without faults: the ids in a stream, in order.
    pub fn peek_stream_ids(&self, stream: &str) -> Vec<EntryId> {
        self.lock().streams.entry_ids(stream)
    }

    /// Peek without faults: a consumer group's pending entries (id, consumer, delivery count).
    pub fn peek_pending(&self, stream: &str, group: &str) -> Vec<(EntryId, String, u64)> {
        self.lock().streams.pending(stream, group)
    }
}

/// What a delivery call asked for, for the read log.
struct ReadCall<'a> {
    issued_at_ms: u64,
    group: &'a str,
    consumer: &'a str,
    streams: &'a [(String, ReadSource)],
    fence: Option<Fence>,
}

impl MetadataStore for MemoryStore {
    async fn load(&self, group: &GroupId) -> Result<Option<StoredRecord>, StoreError> {
        self.call(&["HMGET"], |inner| Ok(inner.load(group))).await
    }

    async fn touch_and_load_by(&self, group: &GroupId, member: &str, step: u64) -> Result<TouchResult, StoreError> {
        self.call(&["EVALSHA", "HMGET", "HINCRBY", "HGET"], |inner| inner.touch_and_load(group, member, step)).await
    }

    async fn touch_and_check_by(
        &self,
        group: &GroupId,
        member: &str,
        known: &RecordStamp,
        step: u64,
    ) -> Result<TouchCheck, StoreError> {
        // As RedisStore runs it: one round trip carrying a pipeline of two commands, each atomic,
        // that other clients' commands may interleave (never one step under one lock: the fake
        // is never stronger than Redis); a changed stamp then costs a second round trip (the full
        // read) and an absent key the forget-liveness script.
        let (liveness, stamp) = self
            .call_pipeline(
                (&["HINCRBY"], |inner: &mut Inner| inner.touch_liveness(group, member, step)),
                (&["HMGET"], |inner: &mut Inner| inner.stamp_matches(group, known)),
            )
            .await?;
        // A refused HINCRBY fails the pipeline's reply (its HMGET still ran, as at Redis).
        let liveness = liveness?;
        match stamp {
            None => {
                self.call(&["EVALSHA", "EXISTS", "DEL"], |inner| {
                    inner.forget_liveness_if_absent(group);
                    Ok(())
                })
                .await?;
                Ok(TouchCheck::Changed(TouchResult { liveness: 0, record: None }))
            }
            Some(true) => Ok(TouchCheck::Unchanged { liveness }),
            Some(false) => {
                let record = self.call(&["HMGET"], |inner| Ok(inner.load(group))).await?;
                Ok(TouchCheck::Changed(TouchResult { liveness, record }))
            }
        }
    }

    async fn liveness(&self, group: &GroupId) -> Result<BTreeMap<MemberId, u64>, StoreError> {
        self.call(&["HGETALL"], |inner| Ok(inner.liveness(group))).await
    }

    async fn write(&self, group: &GroupId, request: WriteRequest) -> Result<WriteOutcome, StoreError> {
        // Refused before anything is sent, as RedisStore does: no latency, no outage applies. That
        // includes an expected revision with no successor (RedisStore computes the new revision
        // before it sends the script), so the keyspace's `expected + 1` never overflows.
        request.check()?;
        if let Some(expected) = &request.expected {
            if expected.revision.checked_add(1).is_none() {
                return Err(StoreError::Protocol(format!("revision {} cannot be incremented", expected.revision)));
            }
        }
        self.call(&["EVALSHA", "EXISTS", "HGET", "HSET", "HDEL"], |inner| Ok(inner.write(group, request))).await
    }

    async fn delete(&self, group: &GroupId, expected: &CasStamp) -> Result<WriteOutcome, StoreError> {
        self.call(&["EVALSHA", "HGET", "DEL"], |inner| Ok(inner.delete(group, expected))).await
    }

    async fn acquire_mutex(&self, group: &GroupId, token: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        self.call(&["SET"], |inner| inner.acquire_mutex(group, token, ttl_ms)).await
    }

    async fn release_mutex(&self, group: &GroupId, token: &str) -> Result<bool, StoreError> {
        self.call(&["EVALSHA", "GET", "DEL"], |inner| Ok(inner.release_mutex(group, token))).await
    }

    async fn index_add(&self, group: &GroupId) -> Result<(), StoreError> {
        self.call(&["SADD"], |inner| {
            inner.index_add(group);
            Ok(())
        })
        .await
    }

    async fn index_members(&self) -> Result<Vec<GroupId>, StoreError> {
        self.call(&["SMEMBERS"], |inner| Ok(inner.index_members())).await
    }

    async fn rebuild_index(&self) -> Result<Vec<GroupId>, StoreError> {
        self.call(&["SCAN", "SADD"], |inner| Ok(inner.rebuild_index())).await
    }

    async fn tick_roster(&self, instance: &str) -> Result<BTreeMap<String, u64>, StoreError> {
        // As RedisStore runs it: a pipeline of two atomic commands others may interleave.
        let ((), roster) = self
            .call_pipeline(
                (&["HINCRBY"], |inner: &mut Inner| inner.keys.count_ticker_pass(instance)),
                (&["HGETALL"], |inner: &mut Inner| inner.keys.tick_roster()),
            )
            .await?;
        Ok(roster)
    }

    async fn forget_tickers(&self, instances: &[String]) -> Result<(), StoreError> {
        if instances.is_empty() {
            return Ok(());
        }
        self.call(&["HDEL"], |inner| {
            inner.keys.forget_tickers(instances);
            Ok(())
        })
        .await
    }

    async fn exchange_heard(
        &self,
        sender: &str,
        outgoing: &[(String, String)],
        ttl_ms: u64,
        senders: &[String],
    ) -> Result<Vec<Option<String>>, StoreError> {
        if ttl_ms == 0 && !outgoing.is_empty() {
            return Err(StoreError::Protocol("ERR invalid expire time in 'set' command".into()));
        }
        // One round trip; each SET and GET its own atomic step, other clients' commands between.
        let latency_ms = self.admitted().await?;
        let request_ms = latency_ms / 2;
        sleep_ms(request_ms).await;
        for (owner, blob) in outgoing {
            let key = keys::heard_relay_key(owner, sender);
            self.execute(&["SET"], |inner| {
                let now_ms = inner.now_ms();
                inner.keys.put_relay(key, blob.clone(), now_ms, ttl_ms);
                Ok(())
            })??;
            tokio::task::yield_now().await;
        }
        let mut read = Vec::with_capacity(senders.len());
        for from in senders {
            let key = keys::heard_relay_key(sender, from);
            read.push(self.execute(&["GET"], |inner| {
                let now_ms = inner.now_ms();
                Ok(inner.keys.get_relay(&key, now_ms))
            })??);
            tokio::task::yield_now().await;
        }
        sleep_ms(latency_ms - request_ms).await;
        Ok(read)
    }

    async fn identity(&self) -> Result<ServerIdentity, StoreError> {
        self.call(&["INFO"], |inner| Ok(inner.identity.clone())).await
    }

    async fn probe(&self) -> Result<ProbeReport, StoreError> {
        self.call(&[], |inner| inner.probe()).await
    }

    async fn raise_fences(&self, raises: &[FenceRaise]) -> Result<Vec<Fence>, StoreError> {
        // One round trip carrying one script call per key: each call is atomic, and other
        // clients' commands may run between them (a pipeline, never one step).
        let latency_ms = self.admitted().await?;
        let request_ms = latency_ms / 2;
        sleep_ms(request_ms).await;
        let mut fences = Vec::with_capacity(raises.len());
        for (i, raise) in raises.iter().enumerate() {
            if i > 0 {
                tokio::task::yield_now().await;
            }
            fences.push(self.execute(&["EVALSHA", "HINCRBY", "HSET"], |inner| {
                Ok(inner.raise_fence(&raise.key, raise.nonce, raise.floor))
            })??);
        }
        sleep_ms(latency_ms - request_ms).await;
        Ok(fences)
    }

    async fn read_fences(&self, keys: &[String]) -> Result<Vec<Option<Fence>>, StoreError> {
        self.call(&["HMGET"], |inner| Ok(keys.iter().map(|key| inner.read_fence(key)).collect())).await
    }
}

impl StreamStore for MemoryStore {
    async fn xadd(
        &self,
        stream: &str,
        fields: Vec<(String, Vec<u8>)>,
        maxlen: Option<u64>,
    ) -> Result<EntryId, StoreError> {
        self.call(&["XADD"], |inner| {
            let at_ms = inner.now_ms();
            let id = inner.streams.xadd(at_ms, stream, fields, maxlen)?;
            inner.appended.notify_waiters();
            inner.history.push_add(AddRecord { at_ms, stream: stream.to_string(), id });
            Ok(id)
        })
        .await
    }

    async fn create_group(&self, stream: &str, group: &str, start: GroupStart) -> Result<(), StoreError> {
        self.call(&["XGROUP"], |inner| {
            inner.streams.create_group(stream, group, start);
            Ok(())
        })
        .await
    }

    async fn xreadgroup(
        &self,
        group: &str,
        consumer: &str,
        streams: &[(String, ReadFrom)],
        count: usize,
        _block_ms: Option<u64>,
    ) -> Result<Vec<(String, Vec<StreamEntry>)>, StoreError> {
        let sources: Vec<(String, ReadSource)> = streams.iter().map(|(s, from)| (s.clone(), (*from).into())).collect();
        let call = ReadCall { issued_at_ms: self.now_ms(), group, consumer, streams: &sources, fence: None };
        let read = self
            .logged_read(&call, "XREADGROUP", |inner, now_ms| {
                let read = inner.streams.xreadgroup(now_ms, group, consumer, streams, count)?;
                let delivered = read.iter().map(|(s, _, entries)| (s.clone(), ids(entries))).collect();
                Ok((read, delivered))
            })
            .await?;
        Ok(read.into_iter().filter(|(_, _, entries)| !entries.is_empty()).map(|(s, _, entries)| (s, entries)).collect())
    }

    async fn xack(&self, stream: &str, group: &str, ids: &[EntryId]) -> Result<u64, StoreError> {
        self.call(&["XACK"], |inner| {
            let acked = inner.streams.xack(stream, group, ids);
            let count = acked.len() as u64;
            inner.log_ack(stream, group, acked, None);
            Ok(count)
        })
        .await
    }

    async fn fenced_xreadgroup(
        &self,
        fence: &FenceCheck,
        group: &str,
        consumer: &str,
        stream: &str,
        from: ReadFrom,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let sources = [(stream.to_string(), ReadSource::from(from))];
        let call =
            ReadCall { issued_at_ms: self.now_ms(), group, consumer, streams: &sources, fence: Some(fence.fence) };
        let streams = [(stream.to_string(), from)];
        self.fenced_read(fence, &call, "XREADGROUP", |inner, now_ms| {
            let read = inner.streams.xreadgroup(now_ms, group, consumer, &streams, count)?;
            Ok(read.into_iter().flat_map(|(_, _, entries)| entries).collect())
        })
        .await
    }

    /// One round trip for every read, each read its own atomic step, the task yielding between
    /// them so another client's command may run in between. Never stronger than `RedisStore`,
    /// which reads through its gates as a pipeline of plain `XREADGROUP`s (one atomic step each)
    /// and the rest in one script call, possibly a round trip later. A connection-level failure
    /// fails the call from that read on; the reads before it were served (their reply is lost).
    async fn fenced_xreadgroup_many(
        &self,
        group: &str,
        consumer: &str,
        reads: &[FencedRead],
    ) -> Result<Vec<Result<Vec<StreamEntry>, StoreError>>, StoreError> {
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        let issued_at_ms = self.now_ms();
        let sources: Vec<[(String, ReadSource); 1]> =
            reads.iter().map(|read| [(read.stream.clone(), ReadSource::from(read.from))]).collect();
        let calls: Vec<ReadCall<'_>> = reads
            .iter()
            .zip(&sources)
            .map(|(read, streams)| ReadCall { issued_at_ms, group, consumer, streams, fence: Some(read.fence.fence) })
            .collect();
        let fail_from = |from: usize, e: &StoreError| {
            let mut inner = self.lock();
            for call in &calls[from..] {
                inner.log_reads(call, &Err(e.clone()));
            }
        };
        let latency_ms = match self.admitted().await {
            Ok(latency_ms) => latency_ms,
            Err(e) => {
                fail_from(0, &e);
                return Err(e);
            }
        };
        let request_ms = latency_ms / 2;
        sleep_ms(request_ms).await;
        let mut outcomes = Vec::with_capacity(reads.len());
        for (i, (read, call)) in reads.iter().zip(&calls).enumerate() {
            if i > 0 {
                tokio::task::yield_now().await;
            }
            let executed = self.execute(&["EVALSHA", "HMGET", "HSET", "XREADGROUP"], |inner| {
                let now_ms = inner.now_ms();
                let streams = [(read.stream.clone(), read.from)];
                let outcome = inner.check_fence(&read.fence, "XREADGROUP").and_then(|()| {
                    let delivered = inner.streams.xreadgroup(now_ms, group, consumer, &streams, read.count)?;
                    Ok(delivered.into_iter().flat_map(|(_, _, entries)| entries).collect::<Vec<_>>())
                });
                let logged =
                    outcome.as_ref().map(|entries| vec![(read.stream.clone(), ids(entries))]).map_err(Clone::clone);
                inner.log_reads(call, &logged);
                outcome
            });
            match executed {
                Ok(outcome) => outcomes.push(outcome),
                Err(e) => {
                    fail_from(i, &e);
                    return Err(e);
                }
            }
        }
        sleep_ms(latency_ms - request_ms).await;
        Ok(outcomes)
    }

    async fn fenced_xack(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        ids: &[EntryId],
    ) -> Result<u64, StoreError> {
        self.call(&["EVALSHA", "HMGET", "HSET", "XACK"], |inner| {
            inner.check_ack_fence(fence)?;
            let acked = inner.streams.xack(stream, group, ids);
            let count = acked.len() as u64;
            inner.log_ack(stream, group, acked, Some(fence.fence));
            Ok(count)
        })
        .await
    }

    async fn fenced_claim_all_pending(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let sources = [(stream.to_string(), ReadSource::Claim { min_idle_ms })];
        let call =
            ReadCall { issued_at_ms: self.now_ms(), group, consumer, streams: &sources, fence: Some(fence.fence) };
        self.fenced_read(fence, &call, "XAUTOCLAIM", |inner, now_ms| {
            inner.streams.claim_all_pending(now_ms, stream, group, consumer, min_idle_ms)
        })
        .await
    }

    /// One admitted call (latency and faults as any command) resolves the ids and checks; then,
    /// until `block_ms` passed, it checks again at the first [`DOORBELL_STEP_MS`] boundary (tokio
    /// time, from the call) after each XADD and at the deadline, without holding the store (other
    /// calls proceed meanwhile). Deterministic under madsim.
    async fn wait_for_entries(
        &self,
        group: &str,
        streams: &[(String, Option<EntryId>)],
        block_ms: u64,
    ) -> Result<Doorbell, StoreError> {
        let (after, mut rang) = self
            .call(&["XINFO", "XREAD"], |inner| {
                let after: Vec<EntryId> = streams
                    .iter()
                    .map(|(s, id)| id.unwrap_or_else(|| inner.streams.last_delivered(s, group)))
                    .collect();
                let rang = streams.iter().zip(&after).any(|((s, _), id)| inner.streams.has_newer(s, *id));
                Ok((after, rang))
            })
            .await?;
        // Checked at the same instants as a wait that re-checked every step (each step after the
        // call, and the deadline), but woken only by an XADD, the one way an entry newer than
        // `after` appears: an idle wait costs one timer, not one per step.
        let start = Instant::now();
        let deadline = start + Duration::from_millis(block_ms);
        let step = Duration::from_millis(DOORBELL_STEP_MS);
        let appended = Arc::clone(&self.lock().appended);
        while !rang && Instant::now() < deadline {
            let notified = appended.notified();
            tokio::pin!(notified);
            // Registered before the check, so an XADD right after it is not missed.
            notified.as_mut().enable();
            rang = self.has_newer(streams, &after);
            if rang || crate::time::timeout(deadline.saturating_duration_since(Instant::now()), notified).await.is_err()
            {
                break;
            }
            // Woken by an XADD: look at the next step boundary, where a stepping wait saw it.
            let steps = Instant::now().duration_since(start).as_nanos().div_ceil(step.as_nanos());
            let boundary = start + step * u32::try_from(steps).unwrap_or(u32::MAX);
            crate::time::sleep_until(boundary.min(deadline)).await;
        }
        if !rang {
            // The deadline's own check.
            rang = self.has_newer(streams, &after);
        }
        Ok(Doorbell { rang, after })
    }

    async fn claim_all_pending(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let sources = [(stream.to_string(), ReadSource::Claim { min_idle_ms })];
        let call = ReadCall { issued_at_ms: self.now_ms(), group, consumer, streams: &sources, fence: None };
        self.logged_read(&call, "XAUTOCLAIM", |inner, now_ms| {
            let claimed = inner.streams.claim_all_pending(now_ms, stream, group, consumer, min_idle_ms)?;
            let delivered = vec![(stream.to_string(), ids(&claimed))];
            Ok((claimed, delivered))
        })
        .await
    }
}

impl MemoryStore {
    /// The fenced scripts' XREADGROUP / XAUTOCLAIM: the fence check and the read in one step.
    async fn fenced_read(
        &self,
        fence: &FenceCheck,
        call: &ReadCall<'_>,
        command: &'static str,
        read: impl FnOnce(&mut Inner, u64) -> Result<Vec<StreamEntry>, StoreError>,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let stream = call.streams.first().map(|(s, _)| s.clone()).unwrap_or_default();
        let result = self
            .call_raw(&["EVALSHA", "HMGET", "HSET", command], |inner| {
                let now_ms = inner.now_ms();
                let outcome = inner.check_fence(fence, command).and_then(|()| read(inner, now_ms));
                let logged = outcome.as_ref().map(|entries| vec![(stream.clone(), ids(entries))]).map_err(Clone::clone);
                inner.log_reads(call, &logged);
                outcome
            })
            .await;
        if let Err(e) = &result {
            self.lock().log_reads(call, &Err(e.clone()));
        }
        result?
    }
}

fn ids(entries: &[StreamEntry]) -> Vec<EntryId> {
    entries.iter().map(|e| e.id).collect()
}
