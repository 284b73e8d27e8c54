//! Ground truth of who read which shard when: [`RecordingStore`] wraps the real stream store of
//! each consumer and records every call that takes entries from a shard stream (XREADGROUP, and
//! XAUTOCLAIM, which moves the previous owner's pending entries), with its start and end on the
//! test process's monotonic clock. It also records when each consumer stopped reading a shard
//! (its `ShardStopped` events, noted by the fleet's event sink as they are emitted) and when a
//! consumer of a member id was started. [`split_violations`] then checks the safety property the
//! whole coordinator exists for, in two ways:
//!
//! - no two consumers ever had a read call open on the same shard at overlapping times;
//! - no interleaving: a member that read a shard, then saw another member read it, may read it
//!   again only if it stopped the shard in between (and was granted it again). Reads are short
//!   round trips between poll sleeps, so two owners of one shard mostly read it alternately
//!   (A, B, A) without their calls ever overlapping; this catches that.
//!
//! A call whose future is dropped before it completes (the consumer was killed mid-read) is still
//! recorded, ending at the drop: the command may have reached Redis, even after that (a limit of
//! a client-side record: only a server-side one, such as `MONITOR`, would see when it ran).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rsc::store::{
    Doorbell, EntryId, FenceCheck, FencedAck, FencedRead, GroupStart, ReadFrom, StoreError, StreamEntry, StreamStore,
};

/// One read-like call on one shard stream.
#[derive(Clone, Debug)]
pub struct ReadCall {
    /// The Redis consumer name (the member id).
    pub member: String,
    pub stream: String,
    /// `XREADGROUP` or `XAUTOCLAIM`.
    pub command: &'static str,
    pub start: Instant,
    pub end: Instant,
    /// Entries the call returned (0 for a call dropped before it returned).
    pub entries: usize,
    /// The future was dropped before the call returned.
    pub cancelled: bool,
}

/// A member stopped reading a shard stream (`stream: Some`), or a consumer of the member id was
/// started (`None`: a new incarnation, which holds nothing of the previous one's).
#[derive(Clone, Debug)]
pub struct Stop {
    pub member: String,
    pub stream: Option<String>,
    pub at: Instant,
}

/// Every recorded call of every consumer of a test. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub struct ReadLog {
    origin: Instant,
    calls: Arc<Mutex<Vec<ReadCall>>>,
    stops: Arc<Mutex<Vec<Stop>>>,
}

impl ReadLog {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            calls: Arc::new(Mutex::new(Vec::new())),
            stops: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn calls(&self) -> Vec<ReadCall> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn stops(&self) -> Vec<Stop> {
        self.stops.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn push(&self, call: ReadCall) {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push(call);
    }

    /// `member` stopped reading `stream` now (its consumer emitted `ShardStopped`).
    pub fn note_stop(&self, member: &str, stream: String) {
        let stop = Stop { member: member.to_string(), stream: Some(stream), at: Instant::now() };
        self.stops.lock().unwrap_or_else(|p| p.into_inner()).push(stop);
    }

    /// A consumer of `member` is being started now: whatever an earlier one of that id read
    /// (a crashed one emits no `ShardStopped`), this one reads only what it is granted.
    pub fn note_incarnation(&self, member: &str) {
        let stop = Stop { member: member.to_string(), stream: None, at: Instant::now() };
        self.stops.lock().unwrap_or_else(|p| p.into_inner()).push(stop);
    }

    /// Milliseconds from the log's origin to `at` (for messages).
    pub fn ms(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.origin).as_secs_f64() * 1000.0
    }

    /// Per stream, the members that read it and in which order they took over, e.g.
    /// `p:0: a(0.1-3.2 s, 812 entries) -> c(5.4-9.9 s, 301 entries)`.
    pub fn tenures(&self) -> BTreeMap<String, Vec<Tenure>> {
        let mut calls = self.calls();
        calls.sort_by_key(|c| c.start);
        let mut out: BTreeMap<String, Vec<Tenure>> = BTreeMap::new();
        for call in calls {
            let list = out.entry(call.stream.clone()).or_default();
            match list.last_mut() {
                Some(last) if last.member == call.member => {
                    last.last_end = last.last_end.max(call.end);
                    last.entries += call.entries;
                    last.calls += 1;
                }
                _ => list.push(Tenure {
                    member: call.member.clone(),
                    first_start: call.start,
                    last_end: call.end,
                    entries: call.entries,
                    calls: 1,
                }),
            }
        }
        out
    }

    /// The tenures as one line per stream, for the test output.
    pub fn describe_tenures(&self) -> String {
        let mut text = String::new();
        for (stream, tenures) in self.tenures() {
            let parts: Vec<String> = tenures
                .iter()
                .map(|t| {
                    format!(
                        "{}({:.2}-{:.2} s, {} calls, {} entries)",
                        t.member,
                        self.ms(t.first_start) / 1000.0,
                        self.ms(t.last_end) / 1000.0,
                        t.calls,
                        t.entries
                    )
                })
                .collect();
            text.push_str(&format!("  {stream}: {}\n", parts.join(" -> ")));
        }
        text
    }
}

impl Default for ReadLog {
    fn default() -> Self {
        Self::new()
    }
}

/// A run of consecutive calls on one stream by one member.
#[derive(Clone, Debug)]
pub struct Tenure {
    pub member: String,
    pub first_start: Instant,
    pub last_end: Instant,
    pub entries: usize,
    pub calls: usize,
}

/// How long before a member's read its stop of the shard may be recorded and still end the
/// grant that read belongs to (see `split_violations`).
const STOP_SLACK: Duration = Duration::from_millis(50);

/// Every split on the log, as messages; empty when no shard was ever read by two consumers at
/// once. Two kinds:
///
/// - two calls by different members on the same stream whose intervals overlap;
/// - an interleaving: a member's call on a stream that starts after another member's call there
///   started, which itself started after the first member's previous call there, with no stop of
///   that stream by the first member (and no new incarnation of it) between its two calls: it
///   read on as if it still held the shard after another member had taken it.
pub fn split_violations(log: &ReadLog) -> Vec<String> {
    let mut by_stream: BTreeMap<String, Vec<ReadCall>> = BTreeMap::new();
    for call in log.calls() {
        by_stream.entry(call.stream.clone()).or_default().push(call);
    }
    let stops = log.stops();
    // A stop up to `STOP_SLACK` before the member's previous call still counts: a read planned
    // under the grant (the core's lock held) and recorded as it starts, after the lock is let go,
    // can start just after the heartbeat task recorded the shard's stop. Such a read belongs to
    // the grant that ended; without the slack, the member's next grant of the shard read as a
    // split. A member that goes on reading after its stop is still caught from its next read on.
    let stopped_between = |member: &str, stream: &str, from: Instant, to: Instant| {
        stops.iter().any(|stop| {
            stop.member == member
                && stop.stream.as_deref().is_none_or(|s| s == stream)
                && from < stop.at + STOP_SLACK
                && stop.at < to
        })
    };
    let mut violations = Vec::new();
    for (stream, mut calls) in by_stream {
        calls.sort_by_key(|c| c.start);
        // For each member, the call that ends last among those started so far.
        let mut latest: BTreeMap<String, ReadCall> = BTreeMap::new();
        // For each member, its last call started so far.
        let mut previous: BTreeMap<String, ReadCall> = BTreeMap::new();
        for call in calls {
            for (member, other) in &latest {
                if *member != call.member && other.end > call.start {
                    violations.push(format!(
                        "{stream}: {} {} [{:.1}..{:.1} ms] overlaps {} {} [{:.1}..{:.1} ms]",
                        other.member,
                        other.command,
                        log.ms(other.start),
                        log.ms(other.end),
                        call.member,
                        call.command,
                        log.ms(call.start),
                        log.ms(call.end),
                    ));
                }
            }
            if let Some(mine) = previous.get(&call.member) {
                // The latest call of another member started since this member's previous call.
                let between = previous
                    .values()
                    .filter(|other| other.member != call.member && other.start > mine.start)
                    .max_by_key(|other| other.start);
                if let Some(other) = between {
                    if !stopped_between(&call.member, &stream, mine.start, call.start) {
                        violations.push(format!(
                            "{stream}: {} read [{:.1}..{:.1} ms] after {} read [{:.1}..{:.1} ms], and had read \
                             [{:.1}..{:.1} ms] before it without stopping the shard since",
                            call.member,
                            log.ms(call.start),
                            log.ms(call.end),
                            other.member,
                            log.ms(other.start),
                            log.ms(other.end),
                            log.ms(mine.start),
                            log.ms(mine.end),
                        ));
                    }
                }
            }
            let keep = latest.get(&call.member).is_some_and(|c| c.end >= call.end);
            if !keep {
                latest.insert(call.member.clone(), call.clone());
            }
            previous.insert(call.member.clone(), call);
        }
    }
    violations
}

/// Records the call when dropped: on completion with its result, or at cancellation.
struct CallGuard<'a> {
    log: &'a ReadLog,
    member: String,
    stream: String,
    command: &'static str,
    start: Instant,
    entries: Option<usize>,
    /// Redis refused the call as `FENCED`: it read nothing, so it is no tenure.
    refused: bool,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if self.refused {
            return;
        }
        self.log.push(ReadCall {
            member: std::mem::take(&mut self.member),
            stream: std::mem::take(&mut self.stream),
            command: self.command,
            start: self.start,
            end: Instant::now(),
            entries: self.entries.unwrap_or(0),
            cancelled: self.entries.is_none(),
        });
    }
}

/// A [`StreamStore`] that forwards to `inner` and records read-like calls in a [`ReadLog`].
#[derive(Clone)]
pub struct RecordingStore<S> {
    inner: S,
    log: ReadLog,
}

impl<S> RecordingStore<S> {
    pub fn new(inner: S, log: ReadLog) -> Self {
        Self { inner, log }
    }
}

impl<S: StreamStore> StreamStore for RecordingStore<S> {
    async fn xadd(
        &self,
        stream: &str,
        fields: Vec<(String, Vec<u8>)>,
        maxlen: Option<u64>,
    ) -> Result<EntryId, StoreError> {
        self.inner.xadd(stream, fields, maxlen).await
    }

    async fn create_group(&self, stream: &str, group: &str, start: GroupStart) -> Result<(), StoreError> {
        self.inner.create_group(stream, group, start).await
    }

    async fn xreadgroup(
        &self,
        group: &str,
        consumer: &str,
        streams: &[(String, ReadFrom)],
        count: usize,
        block_ms: Option<u64>,
    ) -> Result<Vec<(String, Vec<StreamEntry>)>, StoreError> {
        // A multi-stream read (the consumer reads new entries of its unfenced shards in one call)
        // is one call per stream, each spanning the whole call, like a fenced batch.
        let start = Instant::now();
        let mut guards: Vec<CallGuard<'_>> = streams
            .iter()
            .map(|(stream, _)| CallGuard {
                log: &self.log,
                member: consumer.to_string(),
                stream: stream.clone(),
                command: "XREADGROUP",
                start,
                entries: None,
                refused: false,
            })
            .collect();
        let result = self.inner.xreadgroup(group, consumer, streams, count, block_ms).await;
        for guard in &mut guards {
            let replies = result.as_ref().map(Vec::as_slice).unwrap_or_default();
            let got = replies.iter().filter(|(stream, _)| *stream == guard.stream).map(|(_, e)| e.len()).sum();
            guard.entries = Some(got);
        }
        result
    }

    async fn wait_for_entries(
        &self,
        group: &str,
        streams: &[(String, Option<EntryId>)],
        block_ms: u64,
    ) -> Result<Doorbell, StoreError> {
        self.inner.wait_for_entries(group, streams, block_ms).await
    }

    async fn xack(&self, stream: &str, group: &str, ids: &[EntryId]) -> Result<u64, StoreError> {
        self.inner.xack(stream, group, ids).await
    }

    async fn claim_all_pending(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let mut guard = CallGuard {
            log: &self.log,
            member: consumer.to_string(),
            stream: stream.to_string(),
            command: "XAUTOCLAIM",
            start: Instant::now(),
            entries: None,
            refused: false,
        };
        let result = self.inner.claim_all_pending(stream, group, consumer, min_idle_ms).await;
        guard.entries = Some(result.as_ref().map_or(0, Vec::len));
        result
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
        let mut guard = CallGuard {
            log: &self.log,
            member: consumer.to_string(),
            stream: stream.to_string(),
            command: "XREADGROUP",
            start: Instant::now(),
            entries: None,
            refused: false,
        };
        let result = self.inner.fenced_xreadgroup(fence, group, consumer, stream, from, count).await;
        guard.entries = Some(result.as_ref().map_or(0, Vec::len));
        guard.refused = matches!(result, Err(StoreError::Fenced { .. }));
        result
    }

    /// Forwarded as one call (the batched script on Redis); each shard's read is recorded as its
    /// own call spanning the whole batch.
    async fn fenced_xreadgroup_many(
        &self,
        group: &str,
        consumer: &str,
        reads: &[FencedRead],
    ) -> Result<Vec<Result<Vec<StreamEntry>, StoreError>>, StoreError> {
        let start = Instant::now();
        let mut guards: Vec<CallGuard<'_>> = reads
            .iter()
            .map(|read| CallGuard {
                log: &self.log,
                member: consumer.to_string(),
                stream: read.stream.clone(),
                command: "XREADGROUP",
                start,
                entries: None,
                refused: false,
            })
            .collect();
        let result = self.inner.fenced_xreadgroup_many(group, consumer, reads).await;
        if let Ok(results) = &result {
            for (guard, read) in guards.iter_mut().zip(results) {
                guard.entries = Some(read.as_ref().map_or(0, Vec::len));
                guard.refused = matches!(read, Err(StoreError::Fenced { .. }));
            }
        }
        result
    }

    async fn fenced_xack_many(
        &self,
        group: &str,
        acks: &[FencedAck],
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        self.inner.fenced_xack_many(group, acks).await
    }

    async fn fenced_xack(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        ids: &[EntryId],
    ) -> Result<u64, StoreError> {
        self.inner.fenced_xack(fence, stream, group, ids).await
    }

    async fn fenced_claim_all_pending(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let mut guard = CallGuard {
            log: &self.log,
            member: consumer.to_string(),
            stream: stream.to_string(),
            command: "XAUTOCLAIM",
            start: Instant::now(),
            entries: None,
            refused: false,
        };
        let result = self.inner.fenced_claim_all_pending(fence, stream, group, consumer, min_idle_ms).await;
        guard.entries = Some(result.as_ref().map_or(0, Vec::len));
        guard.refused = matches!(result, Err(StoreError::Fenced { .. }));
        result
    }
}

/// Asserts no split, printing the tenures either way (they make a failure readable).
pub fn assert_no_split(log: &ReadLog) {
    let violations = split_violations(log);
    let shown: Vec<&String> = violations.iter().take(20).collect();
    assert!(
        violations.is_empty(),
        "{} splits (a shard read by two consumers at once or in turn):\n{shown:#?}\ntenures:\n{}",
        violations.len(),
        log.describe_tenures()
    );
    eprintln!("read tenures (no overlap, no interleaving):\n{}", log.describe_tenures());
}

/// A self-check of the checker: it must flag an overlap and an interleaving, and accept a clean
/// handover, and a member reading a shard again after a stop or as a new incarnation.
pub fn self_check() {
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let call = |member: &str, start: u64, end: u64| ReadCall {
        member: member.into(),
        stream: "s:0".into(),
        command: "XREADGROUP",
        start: ms(start),
        end: ms(end),
        entries: 1,
        cancelled: false,
    };
    let stop = |log: &ReadLog, member: &str, stream: Option<&str>, at: u64| {
        log.stops.lock().unwrap().push(Stop { member: member.into(), stream: stream.map(str::to_string), at: ms(at) });
    };
    let log = ReadLog::new();
    log.push(call("a", 0, 10));
    log.push(call("a", 20, 30));
    stop(&log, "a", Some("s:0"), 31);
    log.push(call("b", 40, 50));
    assert!(split_violations(&log).is_empty(), "a clean handover is not a split");
    log.push(call("a", 5, 100)); // A long call by `a` still open while `b` reads.
    assert_eq!(split_violations(&log).len(), 1, "an overlap is a split");

    // Short calls, never overlapping: a, b, a again without a stop of `a` in between.
    let interleaved = ReadLog::new();
    interleaved.push(call("a", 200, 201));
    interleaved.push(call("b", 210, 211));
    interleaved.push(call("a", 220, 221));
    let found = split_violations(&interleaved);
    assert_eq!(found.len(), 1, "an interleaving is a split: {found:?}");
    // A stop of another stream, or by another member, explains nothing.
    stop(&interleaved, "a", Some("s:1"), 215);
    stop(&interleaved, "b", Some("s:0"), 215);
    assert_eq!(split_violations(&interleaved).len(), 1, "only a's stop of s:0 explains a's return");
    // A stop well before a's first read explains nothing either.
    stop(&interleaved, "a", Some("s:0"), 100);
    assert_eq!(split_violations(&interleaved).len(), 1, "a stop must fall between a's two reads");
    // a stopped s:0 in between (revoked, then granted it back): a handover and back.
    stop(&interleaved, "a", Some("s:0"), 205);
    assert!(split_violations(&interleaved).is_empty(), "a, b, a with a's stop between is no split");
    // A stop recorded just before a's read (planned under the grant, started after the stop was
    // recorded) ends that grant too.
    let raced = ReadLog::new();
    stop(&raced, "a", Some("s:0"), 199);
    raced.push(call("a", 200, 201));
    raced.push(call("b", 210, 211));
    raced.push(call("a", 220, 221));
    assert!(split_violations(&raced).is_empty(), "a stop recorded as a's read started is no split");
    // ... but a member reading on after its stop is caught once its previous read is more than
    // the slack after that stop.
    raced.push(call("b", 300, 301));
    raced.push(call("a", 310, 311));
    raced.push(call("b", 320, 321));
    raced.push(call("a", 330, 331));
    // (b never stopped either: each of its returns is one too.)
    let found = split_violations(&raced);
    let of_a = found.iter().filter(|v| v.starts_with("s:0: a read")).count();
    assert_eq!(of_a, 1, "a's reads at 220 and 310 are in its last grant's slack, at 330 a split: {found:?}");

    // A new incarnation of `a` (a restart after a crash) holds nothing of the old one's.
    let restarted = ReadLog::new();
    restarted.push(call("a", 0, 1));
    restarted.push(call("b", 10, 11));
    restarted.push(call("a", 20, 21));
    stop(&restarted, "a", None, 12);
    assert!(split_violations(&restarted).is_empty(), "a new incarnation is no split");
    // ... but b reading again after a without stopping is one.
    restarted.push(call("b", 30, 31));
    assert_eq!(split_violations(&restarted).len(), 1, "b, a, b without b's stop is a split");
}
