//! One timed run of the data path, whatever does the publishing and consuming: the message
//! format, the [`Board`] every task of a run reports to, the producer and consumer task loops,
//! and the [`Sample`] a run produces.
//!
//! Owns the workload's rules: `messages` messages of a fixed `PAYLOAD_BYTES` payload carrying
//! the publish time and the message's index; producers publish in a closed loop (one publish in
//! flight per task, no pause); consumers read, ack, and stop once every message was acked. Never
//! counts a message as consumed before its ack returned, and never counts one twice (a second ack
//! of the same index is a duplicate, reported apart).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::counted::{TripCounters, Trips};
use crate::support::cpu::process_cpu;
use crate::support::RedisServer;

/// Bytes of the `payload` field: publish time (8), index (8), filler.
pub const PAYLOAD_BYTES: usize = 100;

/// What publishes: one message per call, one round trip when all is well.
pub trait Publisher: Send + Sync + 'static {
    fn publish(&self, key: Vec<u8>, payload: Vec<u8>) -> impl Future<Output = Result<(), String>> + Send;
}

/// What consumes: waits up to `wait` for up to `max` entries, acks them, and reports each acked
/// payload to `board` when its ack returned. Returns how many it acked. A subscriber whose acks
/// ride on its next read ([`HoldAcks`]) acks a batch in the call after the one that read it.
pub trait Subscriber: Send + Sync + 'static {
    fn consume(&self, board: &Board, max: usize, wait: Duration) -> impl Future<Output = Result<usize, String>> + Send;
}

/// Which batches the `*-piggy` / `*-overlap` rows hold, to ack them together with the next read
/// instead of before it (`DP_HOLD`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldAcks {
    /// Only a full batch (`max` entries or more: a backlog, more is waiting); a smaller one is
    /// acked at once, so a caught-up consumer keeps its batches (`DP_HOLD=full`, the default).
    FullBatches,
    /// Every batch that delivered something (`DP_HOLD=every`).
    Every,
}

impl HoldAcks {
    /// Whether a read that delivered `read` entries of at most `max` asked for is held.
    pub fn holds(self, read: usize, max: usize) -> bool {
        match self {
            HoldAcks::FullBatches => read >= max,
            HoldAcks::Every => read > 0,
        }
    }
}

/// The shape of one run.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub messages: usize,
    pub producers: usize,
    pub consumers: usize,
    pub shards: u32,
    /// Most entries one read asks for (`COUNT`, the library's `poll(max)`).
    pub batch: usize,
    /// Longest wait of one read while messages are still expected.
    pub wait_ms: u64,
    /// Idle waits per consumer after the timed run, and how long each waits.
    pub idle_waits: usize,
    pub idle_wait_ms: u64,
    /// A run still missing acks after this long ends as failed.
    pub deadline: Duration,
    /// What the rows whose acks ride on the next read hold.
    pub hold: HoldAcks,
}

/// Shared by every task of one run.
pub struct Board {
    epoch: Instant,
    messages: usize,
    next: AtomicUsize,
    acked: AtomicUsize,
    seen: Vec<AtomicBool>,
    duplicates: AtomicUsize,
    /// Acks of payloads this run never published (a leftover of an earlier run, or garbage).
    strays: AtomicUsize,
    last_ack_us: AtomicU64,
    e2e_us: std::sync::Mutex<Vec<u32>>,
}

impl Board {
    pub fn new(messages: usize) -> Self {
        Board {
            epoch: Instant::now(),
            messages,
            next: AtomicUsize::new(0),
            acked: AtomicUsize::new(0),
            seen: (0..messages).map(|_| AtomicBool::new(false)).collect(),
            duplicates: AtomicUsize::new(0),
            strays: AtomicUsize::new(0),
            last_ack_us: AtomicU64::new(0),
            e2e_us: std::sync::Mutex::new(Vec::with_capacity(messages)),
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    pub fn done(&self) -> bool {
        self.acked.load(Ordering::Relaxed) >= self.messages
    }

    /// The next message to publish (key, payload stamped with the time now), or none when all went.
    fn take(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        if index >= self.messages {
            return None;
        }
        let mut payload = Vec::with_capacity(PAYLOAD_BYTES);
        payload.extend_from_slice(&self.now_us().to_le_bytes());
        payload.extend_from_slice(&(index as u64).to_le_bytes());
        payload.resize(PAYLOAD_BYTES, b'x');
        Some((index.to_string().into_bytes(), payload))
    }

    /// Records the ack of one message, by the `payload` field it carried.
    pub fn acked(&self, payload: &[u8]) {
        let now_us = self.now_us();
        let word = |at: usize| payload.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
        let (Some(sent_us), Some(index)) = (word(0), word(8)) else {
            self.strays.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let Some(seen) = usize::try_from(index).ok().and_then(|i| self.seen.get(i)) else {
            self.strays.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if seen.swap(true, Ordering::Relaxed) {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let e2e = u32::try_from(now_us.saturating_sub(sent_us)).unwrap_or(u32::MAX);
        self.e2e_us.lock().unwrap_or_else(|p| p.into_inner()).push(e2e);
        self.last_ack_us.fetch_max(now_us, Ordering::Relaxed);
        self.acked.fetch_add(1, Ordering::Relaxed);
    }
}

/// The `payload` field of an entry's fields.
pub fn payload_of(fields: &[(String, Vec<u8>)]) -> &[u8] {
    fields.iter().find(|(name, _)| name == "payload").map_or(&[], |(_, value)| value.as_slice())
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub publish_per_s: f64,
    /// Messages acked per second, from the first publish to the last ack.
    pub consume_per_s: f64,
    pub publish_p50_us: u32,
    pub publish_p99_us: u32,
    pub e2e_p50_us: u32,
    pub e2e_p99_us: u32,
    /// Messages acked per second when consuming a backlog of `messages` published beforehand
    /// (from the consumers' start to the last ack).
    pub drain_per_s: f64,
    /// CPU time redis-server used per message (`INFO cpu`, user + system) while publishing and
    /// consuming, and while draining the backlog; this process's own (`/proc/self/stat`, 10 ms
    /// ticks) while publishing and consuming: which side is the bottleneck.
    pub redis_cpu_us_per_msg: f64,
    pub drain_redis_cpu_us_per_msg: f64,
    pub client_cpu_us_per_msg: f64,
    /// Client round trips during the timed run (heartbeats and routing excluded: not data path).
    pub trips: Trips,
    /// Redis commands executed during the timed run (`INFO commandstats` deltas, which include
    /// the coordinator's and the commands Lua scripts ran).
    pub commands: BTreeMap<String, u64>,
    /// Client round trips of the idle waits, and how many idle waits there were.
    pub idle_trips: Trips,
    pub idle_waits: usize,
    /// Reads (one `consume` call) that acked at least one message.
    pub busy_reads: usize,
    pub messages: usize,
    /// Second deliveries of a message, during the run, the drain, or the idle waits after them.
    pub duplicates: usize,
    /// Messages of the run and the drain never acked.
    pub missing: usize,
    pub errors: usize,
    pub first_error: Option<String>,
}

struct TaskResult {
    latencies_us: Vec<u32>,
    last_us: u64,
    /// Consumer tasks: reads that acked at least one message.
    busy_reads: usize,
    errors: usize,
    first_error: Option<String>,
}

fn percentile(sorted: &[u32], q: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let at = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at]
}

/// redis-server's CPU time so far in microseconds (`INFO cpu`: used_cpu_sys + used_cpu_user).
pub fn redis_cpu_us(server: &RedisServer) -> f64 {
    let text: String = redis::from_redis_value(server.cmd(&["INFO", "cpu"])).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            matches!(name, "used_cpu_sys" | "used_cpu_user").then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum::<f64>()
        * 1e6
}

/// This process's CPU time so far in microseconds ([`process_cpu`]).
pub fn own_cpu_us() -> f64 {
    process_cpu().as_micros() as f64
}

/// `INFO commandstats` as command -> calls.
pub fn commandstats(server: &RedisServer) -> BTreeMap<String, u64> {
    let text: String = redis::from_redis_value(server.cmd(&["INFO", "commandstats"])).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?.parse().ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

fn commands_since(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, calls)| (name.clone(), calls - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, calls)| *calls > 0)
        .collect()
}

/// One timed run: `publishers` publish `workload.messages` messages while `subscribers` consume
/// them; then the same number is published first and drained; then each subscriber waits idle
/// `workload.idle_waits` times. Round trips and commands are those of the first phase. `trips` are the counters
/// the publishers and subscribers add to.
pub async fn run<P: Publisher, S: Subscriber>(
    server: &RedisServer,
    workload: &Workload,
    publishers: &[Arc<P>],
    subscribers: &[Arc<S>],
    trips: &TripCounters,
) -> Sample {
    let board = Arc::new(Board::new(workload.messages));
    let commands_before = commandstats(server);
    let (redis_cpu_before, own_cpu_before) = (redis_cpu_us(server), own_cpu_us());
    let trips_before = trips.snapshot();
    let started = board.now_us();
    let consumers: Vec<_> =
        subscribers.iter().map(|s| tokio::spawn(consume_loop(Arc::clone(s), Arc::clone(&board), *workload))).collect();
    let producers: Vec<_> =
        publishers.iter().map(|p| tokio::spawn(publish_loop(Arc::clone(p), Arc::clone(&board)))).collect();
    let produced = join_all(producers).await;
    let consumed = join_all(consumers).await;
    let trips_busy = trips.snapshot().since(&trips_before);
    let commands = commands_since(&commands_before, &commandstats(server));
    let (redis_cpu_busy, own_cpu_busy) = (redis_cpu_us(server) - redis_cpu_before, own_cpu_us() - own_cpu_before);

    // Drain: the same number of messages published first, with no consumer running, then
    // consumed from the backlog: the consumers' own throughput, every read a busy one.
    let backlog = Arc::new(Board::new(workload.messages));
    let filled =
        join_all(publishers.iter().map(|p| tokio::spawn(publish_loop(Arc::clone(p), Arc::clone(&backlog)))).collect())
            .await;
    let drain_started_us = backlog.now_us();
    let drain_cpu_before = redis_cpu_us(server);
    let drained = join_all(
        subscribers
            .iter()
            .map(|s| tokio::spawn(consume_loop(Arc::clone(s), Arc::clone(&backlog), *workload)))
            .collect(),
    )
    .await;
    let drain_redis_cpu = redis_cpu_us(server) - drain_cpu_before;
    let drain_acked = backlog.acked.load(Ordering::Relaxed);
    let drain_us = backlog.last_ack_us.load(Ordering::Relaxed).saturating_sub(drain_started_us).max(1);

    // Idle waits: nothing is published; every subscriber waits `idle_waits` times in parallel.
    let idle_before = trips.snapshot();
    let empty = Arc::new(Board::new(0));
    let idle: Vec<_> = subscribers
        .iter()
        .map(|s| {
            let (s, empty, workload) = (Arc::clone(s), Arc::clone(&empty), *workload);
            tokio::spawn(async move {
                for _ in 0..workload.idle_waits {
                    let _ = s.consume(&empty, workload.batch, Duration::from_millis(workload.idle_wait_ms)).await;
                }
            })
        })
        .collect();
    for task in idle {
        let _ = task.await;
    }
    let idle_trips = trips.snapshot().since(&idle_before);

    let mut publish_us: Vec<u32> = produced.iter().flat_map(|r| r.latencies_us.iter().copied()).collect();
    publish_us.sort_unstable();
    let mut e2e_us = std::mem::take(&mut *board.e2e_us.lock().unwrap_or_else(|p| p.into_inner()));
    e2e_us.sort_unstable();
    let last_publish_us = produced.iter().map(|r| r.last_us).max().unwrap_or(started);
    let last_ack_us = board.last_ack_us.load(Ordering::Relaxed);
    let acked = board.acked.load(Ordering::Relaxed);
    let per_s = |count: usize, end_us: u64| count as f64 / ((end_us.saturating_sub(started)).max(1) as f64 / 1e6);
    let all = produced.iter().chain(consumed.iter()).chain(filled.iter()).chain(drained.iter());
    let errors = all.clone().map(|r| r.errors).sum::<usize>()
        + board.strays.load(Ordering::Relaxed)
        + backlog.strays.load(Ordering::Relaxed);
    // Anything delivered while idle was published (and delivered) during the run: a redelivery.
    let idle_deliveries = empty.strays.load(Ordering::Relaxed) + empty.duplicates.load(Ordering::Relaxed);
    Sample {
        publish_per_s: per_s(publish_us.len(), last_publish_us),
        consume_per_s: per_s(acked, last_ack_us),
        publish_p50_us: percentile(&publish_us, 0.50),
        publish_p99_us: percentile(&publish_us, 0.99),
        e2e_p50_us: percentile(&e2e_us, 0.50),
        e2e_p99_us: percentile(&e2e_us, 0.99),
        redis_cpu_us_per_msg: redis_cpu_busy / workload.messages.max(1) as f64,
        drain_redis_cpu_us_per_msg: drain_redis_cpu / drain_acked.max(1) as f64,
        client_cpu_us_per_msg: own_cpu_busy / workload.messages.max(1) as f64,
        trips: trips_busy,
        commands,
        idle_trips,
        idle_waits: workload.idle_waits * subscribers.len(),
        busy_reads: consumed.iter().map(|r| r.busy_reads).sum(),
        messages: workload.messages,
        drain_per_s: drain_acked as f64 / (drain_us as f64 / 1e6),
        duplicates: board.duplicates.load(Ordering::Relaxed)
            + backlog.duplicates.load(Ordering::Relaxed)
            + idle_deliveries,
        missing: 2 * workload.messages - acked - drain_acked,
        errors,
        first_error: all.filter_map(|r| r.first_error.clone()).next(),
    }
}

async fn join_all(tasks: Vec<tokio::task::JoinHandle<TaskResult>>) -> Vec<TaskResult> {
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(task.await.unwrap_or_else(|e| TaskResult {
            latencies_us: Vec::new(),
            last_us: 0,
            busy_reads: 0,
            errors: 1,
            first_error: Some(format!("task failed: {e}")),
        }));
    }
    out
}

/// Publishes until the board has no message left, one publish in flight, no pause.
async fn publish_loop<P: Publisher>(publisher: Arc<P>, board: Arc<Board>) -> TaskResult {
    let mut out = TaskResult { latencies_us: Vec::new(), last_us: 0, busy_reads: 0, errors: 0, first_error: None };
    while let Some((key, payload)) = board.take() {
        let sent = Instant::now();
        let result = publisher.publish(key, payload).await;
        out.latencies_us.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
        out.last_us = board.now_us();
        if let Err(error) = result {
            out.errors += 1;
            out.first_error.get_or_insert(error);
        }
    }
    out
}

/// Consumes until every message of the board was acked or the deadline passed.
async fn consume_loop<S: Subscriber>(subscriber: Arc<S>, board: Arc<Board>, workload: Workload) -> TaskResult {
    let mut out = TaskResult { latencies_us: Vec::new(), last_us: 0, busy_reads: 0, errors: 0, first_error: None };
    let deadline = Instant::now() + workload.deadline;
    while !board.done() && Instant::now() < deadline {
        match subscriber.consume(&board, workload.batch, Duration::from_millis(workload.wait_ms)).await {
            Ok(0) => {}
            Ok(_) => out.busy_reads += 1,
            Err(error) => {
                out.errors += 1;
                out.first_error.get_or_insert(error);
            }
        }
    }
    out
}
