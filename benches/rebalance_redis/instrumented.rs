//! [`Instrumented`]: a `MetadataStore` that passes every call on unchanged and records, for the
//! bench, what the coordinator asked of Redis.
//!
//! Owns: per store method, the calls, the time they took and the aggregate bytes they moved; how
//! long the group mutex was held; and the correction rounds the written aggregates started (a
//! write whose aggregate has a `correction` after one without). It sees every write because the
//! bench's coordinator is the only writer, so the rounds it counts are the ones recorded in Redis.
//! Never: changes an argument or a result, or parses an aggregate (a reverse substring search
//! finds the `correction` field, which is near the end of the JSON).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rsc::core::model::{Fence, GroupId, MemberId};
use rsc::store::{
    CasStamp, FenceRaise, MetadataStore, ProbeReport, RecordStamp, ServerIdentity, StoreError, StoredRecord,
    TouchCheck, TouchResult, WriteOutcome, WriteRequest,
};

/// A mutex held this long without a release was abandoned by its critical section.
const ABANDONED_AFTER: Duration = Duration::from_millis(1_000);

/// One store method's totals.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallStats {
    pub calls: u64,
    pub busy: Duration,
    /// Aggregate bytes sent (writes) or received (full reads).
    pub bytes: u64,
}

/// What the coordinator did to Redis since the last [`StoreTrace::take`].
#[derive(Clone, Debug, Default)]
pub struct TraceCounts {
    pub calls: BTreeMap<&'static str, CallStats>,
    /// Steady heartbeats answered from the decoded cache, and ones that had to fetch the record.
    pub touch_unchanged: u64,
    pub touch_changed: u64,
    pub write_conflicts: u64,
    pub mutex_busy: u64,
    pub mutex_held: Duration,
    /// Mutexes acquired and never released: the critical section was dropped in between (its
    /// caller gave up), so the mutex stays taken until its TTL ends.
    pub mutex_abandoned: u64,
    /// Written aggregates that start a correction round (none before, one now).
    pub correction_rounds: u64,
    /// When each critical section held the group mutex (for `REB_TIMELINE`), and when each write
    /// that landed finished.
    pub held: Vec<(Instant, Instant)>,
    pub written_at: Vec<Instant>,
    /// When each attempt found the mutex taken.
    pub busy_at: Vec<Instant>,
    /// Critical sections with a load and a write between acquire and release, and the time they
    /// spent in each phase, summed.
    pub sections: u64,
    pub section_phases: SectionPhases,
}

/// A critical section's phases: acquire -> load -> (CPU: cache check, observe, decide, validate,
/// encode) -> write -> (cache put, observe) -> release.
#[derive(Clone, Copy, Debug, Default)]
pub struct SectionPhases {
    pub before_load: Duration,
    pub load: Duration,
    pub compute: Duration,
    pub write: Duration,
    pub after_write: Duration,
    pub release: Duration,
}

impl SectionPhases {
    fn add(&mut self, other: &SectionPhases) {
        self.before_load += other.before_load;
        self.load += other.load;
        self.compute += other.compute;
        self.write += other.write;
        self.after_write += other.after_write;
        self.release += other.release;
    }
}

/// Instants seen inside the critical section in progress (they run one at a time per process:
/// the coordinator's local monitor serializes them).
#[derive(Clone, Copy, Debug)]
struct OpenSection {
    acquired: Instant,
    load: Option<(Instant, Instant)>,
    write: Option<(Instant, Instant)>,
}

impl TraceCounts {
    pub fn get(&self, method: &str) -> CallStats {
        self.calls.get(method).copied().unwrap_or_default()
    }

    /// Adds `other` into `self` (totals over several runs).
    pub fn absorb(&mut self, other: &TraceCounts) {
        for (method, stats) in &other.calls {
            let mine = self.calls.entry(method).or_default();
            mine.calls += stats.calls;
            mine.busy += stats.busy;
            mine.bytes += stats.bytes;
        }
        self.touch_unchanged += other.touch_unchanged;
        self.touch_changed += other.touch_changed;
        self.write_conflicts += other.write_conflicts;
        self.mutex_busy += other.mutex_busy;
        self.mutex_held += other.mutex_held;
        self.mutex_abandoned += other.mutex_abandoned;
        self.sections += other.sections;
        self.section_phases.add(&other.section_phases);
        self.correction_rounds += other.correction_rounds;
    }
}

#[derive(Default)]
struct TraceState {
    counts: TraceCounts,
    /// Whether the last aggregate written carries a correction round (survives `take`).
    last_written_correction: bool,
    /// Mutex tokens held, and since when.
    held_since: BTreeMap<String, Instant>,
    open: Option<OpenSection>,
}

/// Shared by the wrapper and the bench.
#[derive(Default)]
pub struct StoreTrace {
    state: Mutex<TraceState>,
}

impl StoreTrace {
    /// The counts so far; starts counting from zero. A mutex held for longer than
    /// [`ABANDONED_AFTER`] without a release counts as abandoned (no critical section takes that
    /// long unless its future was dropped).
    pub fn take(&self) -> TraceCounts {
        let mut state = self.lock();
        let now = Instant::now();
        let before = state.held_since.len();
        state.held_since.retain(|_, since| now.duration_since(*since) < ABANDONED_AFTER);
        let abandoned = (before - state.held_since.len()) as u64;
        state.counts.mutex_abandoned += abandoned;
        std::mem::take(&mut state.counts)
    }

    fn lock(&self) -> MutexGuard<'_, TraceState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, method: &'static str, started: Instant, bytes: usize) {
        let mut state = self.lock();
        let stats = state.counts.calls.entry(method).or_default();
        stats.calls += 1;
        stats.busy += started.elapsed();
        stats.bytes += bytes as u64;
    }
}

/// True when the aggregate JSON records a correction round (`"correction":` not followed by null).
fn has_correction(aggregate: &str) -> bool {
    const FIELD: &str = "\"correction\":";
    aggregate.rfind(FIELD).is_some_and(|at| !aggregate[at + FIELD.len()..].starts_with("null"))
}

fn record_bytes(record: Option<&StoredRecord>) -> usize {
    record.map_or(0, |r| r.aggregate.len())
}

/// The wrapper. Cheap to clone.
#[derive(Clone)]
pub struct Instrumented<S> {
    inner: S,
    trace: Arc<StoreTrace>,
}

impl<S> Instrumented<S> {
    pub fn new(inner: S) -> Self {
        Self { inner, trace: Arc::default() }
    }

    pub fn trace(&self) -> Arc<StoreTrace> {
        Arc::clone(&self.trace)
    }
}

impl<S: MetadataStore> MetadataStore for Instrumented<S> {
    async fn load(&self, group: &GroupId) -> Result<Option<StoredRecord>, StoreError> {
        let started = Instant::now();
        let result = self.inner.load(group).await;
        let bytes = result.as_ref().map_or(0, |r| record_bytes(r.as_ref()));
        self.trace.record("load", started, bytes);
        // The first load after the acquire is the section's (a tick's load may rarely interleave).
        if let Some(open) = self.trace.lock().open.as_mut().filter(|o| o.load.is_none()) {
            open.load = Some((started, Instant::now()));
        }
        result
    }

    async fn touch_and_load_by(&self, group: &GroupId, member: &str, step: u64) -> Result<TouchResult, StoreError> {
        let started = Instant::now();
        let result = self.inner.touch_and_load_by(group, member, step).await;
        let bytes = result.as_ref().map_or(0, |t| record_bytes(t.record.as_ref()));
        self.trace.record("touch_and_load", started, bytes);
        result
    }

    async fn touch_and_check_by(
        &self,
        group: &GroupId,
        member: &str,
        known: &RecordStamp,
        step: u64,
    ) -> Result<TouchCheck, StoreError> {
        let started = Instant::now();
        let result = self.inner.touch_and_check_by(group, member, known, step).await;
        let bytes = match &result {
            Ok(TouchCheck::Changed(t)) => record_bytes(t.record.as_ref()),
            _ => 0,
        };
        self.trace.record("touch_and_check", started, bytes);
        let mut state = self.trace.lock();
        match &result {
            Ok(TouchCheck::Unchanged { .. }) => state.counts.touch_unchanged += 1,
            Ok(TouchCheck::Changed(_)) => state.counts.touch_changed += 1,
            Err(_) => {}
        }
        result
    }

    async fn liveness(&self, group: &GroupId) -> Result<BTreeMap<MemberId, u64>, StoreError> {
        let started = Instant::now();
        let result = self.inner.liveness(group).await;
        self.trace.record("liveness", started, 0);
        result
    }

    async fn write(&self, group: &GroupId, request: WriteRequest) -> Result<WriteOutcome, StoreError> {
        let bytes = request.aggregate.len();
        let correction = has_correction(&request.aggregate);
        let started = Instant::now();
        let result = self.inner.write(group, request).await;
        self.trace.record("write", started, bytes);
        let mut state = self.trace.lock();
        if let Some(open) = state.open.as_mut() {
            open.write = Some((started, Instant::now()));
        }
        match &result {
            Ok(WriteOutcome::Written { .. }) => {
                state.counts.written_at.push(Instant::now());
                if correction && !state.last_written_correction {
                    state.counts.correction_rounds += 1;
                }
                state.last_written_correction = correction;
            }
            Ok(_) => state.counts.write_conflicts += 1,
            Err(_) => {}
        }
        result
    }

    async fn delete(&self, group: &GroupId, expected: &CasStamp) -> Result<WriteOutcome, StoreError> {
        self.inner.delete(group, expected).await
    }

    async fn acquire_mutex(&self, group: &GroupId, token: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let started = Instant::now();
        let result = self.inner.acquire_mutex(group, token, ttl_ms).await;
        self.trace.record("acquire_mutex", started, 0);
        let mut state = self.trace.lock();
        match result {
            Ok(true) => {
                let now = Instant::now();
                state.held_since.insert(token.to_string(), now);
                state.open = Some(OpenSection { acquired: now, load: None, write: None });
            }
            Ok(false) => {
                state.counts.mutex_busy += 1;
                state.counts.busy_at.push(Instant::now());
            }
            Err(_) => {}
        }
        result
    }

    async fn release_mutex(&self, group: &GroupId, token: &str) -> Result<bool, StoreError> {
        let started = Instant::now();
        let result = self.inner.release_mutex(group, token).await;
        self.trace.record("release_mutex", started, 0);
        let mut state = self.trace.lock();
        if let Some(OpenSection { acquired, load: Some((l0, l1)), write: Some((w0, w1)) }) = state.open.take() {
            state.counts.sections += 1;
            state.counts.section_phases.add(&SectionPhases {
                before_load: l0.saturating_duration_since(acquired),
                load: l1.saturating_duration_since(l0),
                compute: w0.saturating_duration_since(l1),
                write: w1.saturating_duration_since(w0),
                after_write: started.saturating_duration_since(w1),
                release: started.elapsed(),
            });
        }
        if let Some(since) = state.held_since.remove(token) {
            state.counts.mutex_held += since.elapsed();
            state.counts.held.push((since, Instant::now()));
        }
        result
    }

    async fn index_add(&self, group: &GroupId) -> Result<(), StoreError> {
        self.inner.index_add(group).await
    }

    async fn index_members(&self) -> Result<Vec<GroupId>, StoreError> {
        self.inner.index_members().await
    }

    async fn tick_roster(&self, instance: &str) -> Result<BTreeMap<String, u64>, StoreError> {
        self.inner.tick_roster(instance).await
    }

    async fn exchange_heard(
        &self,
        sender: &str,
        outgoing: &[(String, String)],
        ttl_ms: u64,
        senders: &[String],
    ) -> Result<Vec<Option<String>>, StoreError> {
        self.inner.exchange_heard(sender, outgoing, ttl_ms, senders).await
    }

    async fn forget_tickers(&self, instances: &[String]) -> Result<(), StoreError> {
        self.inner.forget_tickers(instances).await
    }

    async fn rebuild_index(&self) -> Result<Vec<GroupId>, StoreError> {
        self.inner.rebuild_index().await
    }

    async fn identity(&self) -> Result<ServerIdentity, StoreError> {
        self.inner.identity().await
    }

    async fn probe(&self) -> Result<ProbeReport, StoreError> {
        self.inner.probe().await
    }

    async fn raise_fences(&self, raises: &[FenceRaise]) -> Result<Vec<Fence>, StoreError> {
        let started = Instant::now();
        let result = self.inner.raise_fences(raises).await;
        self.trace.record("raise_fences", started, 0);
        result
    }

    async fn read_fences(&self, keys: &[String]) -> Result<Vec<Option<Fence>>, StoreError> {
        self.inner.read_fences(keys).await
    }
}
