//! Ground truth of one simulated run, recorded at the boundaries where it happens: the Redis node
//! (what the server executed, and when the client issued it), the client transports (what was
//! sent to a coordinator and when, what came back and when), the simulated application (when it
//! processed an entry), the process table and the fault injector.
//!
//! Owns: the record types the checkers read, and the event trace (one line per event, simulated
//! timestamps) whose hash is the determinism check. Never records anything from a protocol
//! participant's own view of the protocol (a consumer's idea of its lease, a coordinator's idea
//! of ownership): checkers recompute those from these records.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rsc::client::TransportError;
use rsc::core::protocol::{
    AdminRequest, AdminResponse, HeartbeatRequest, HeartbeatResponse, RoutingReport, RoutingResponse,
};
use rsc::store::EntryId;

use crate::plan::NodeRef;

/// Simulated microseconds since the run started.
pub type Us = u64;

/// One incarnation of a node: a restart makes a new process with the same node name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessId {
    pub node: NodeRef,
    pub incarnation: u32,
}

impl std::fmt::Display for ProcessId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.node, self.incarnation)
    }
}

/// Which delivery call read the entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadKind {
    /// XREADGROUP `>`.
    New,
    /// XREADGROUP `0`: the consumer's own pending entries.
    OwnPending,
    /// XAUTOCLAIM: pending entries taken over from other consumers.
    Claim,
}

/// One stream of one delivery call that the Redis node executed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadEvent {
    pub process: ProcessId,
    /// The Redis node that executed it: [`NodeRef::REDIS`], or an old primary during a split
    /// brain (whose writes are discarded when it goes).
    pub server: NodeRef,
    /// The XREADGROUP consumer name (the member id).
    pub consumer: String,
    pub stream: String,
    pub kind: ReadKind,
    /// When the consumer issued the call (its lease check happens at this instant).
    pub issued_at_us: Us,
    /// When the server executed it.
    pub served_at_us: Us,
    /// Delivered entry ids (possibly none: an empty read still counts as reading the shard).
    pub ids: Vec<EntryId>,
}

/// An XADD the server executed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddEvent {
    pub process: ProcessId,
    /// The Redis node that executed it (see [`ReadEvent::server`]).
    pub server: NodeRef,
    pub stream: String,
    pub issued_at_us: Us,
    pub served_at_us: Us,
    pub id: EntryId,
    /// When the producer received the success (`None`: it never learned the entry was added).
    pub acknowledged_at_us: Option<Us>,
}

/// An XACK the server executed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckEvent {
    pub process: ProcessId,
    /// The Redis node that executed it (see [`ReadEvent::server`]).
    pub server: NodeRef,
    pub stream: String,
    pub served_at_us: Us,
    pub ids: Vec<EntryId>,
}

/// A call to a coordinator, as the client's transport saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct CoordinatorCall<Req, Resp> {
    pub process: ProcessId,
    pub request: Req,
    pub sent_at_us: Us,
    /// When the transport got the coordinator's answer (`None`: never, e.g. the process died).
    pub received_at_us: Option<Us>,
    /// The answer the transport got from the network (`None` until then).
    pub answer: Option<Result<Resp, TransportError>>,
    /// True when a `response-loss` fault hid a successful answer from the client, which saw a
    /// timeout instead.
    pub hidden: bool,
}

impl<Req, Resp> CoordinatorCall<Req, Resp> {
    /// The successful response the client actually saw.
    pub fn seen_ok(&self) -> Option<(&Resp, Us)> {
        match (&self.answer, self.received_at_us) {
            (Some(Ok(resp)), Some(at)) if !self.hidden => Some((resp, at)),
            _ => None,
        }
    }

    /// The error the client actually saw (`None`: success or no answer).
    pub fn seen_error(&self) -> Option<(&TransportError, Us)> {
        match (&self.answer, self.received_at_us) {
            (Some(Err(e)), Some(at)) => Some((e, at)),
            _ => None,
        }
    }
}

pub type HeartbeatCall = CoordinatorCall<HeartbeatRequest, HeartbeatResponse>;
/// A routing refresh; the request is what the producer reported (`knownVersion`,
/// `knownShardCount`; 0: none).
pub type RoutingCall = CoordinatorCall<RoutingReport, RoutingResponse>;

/// An operator admin call.
#[derive(Clone, Debug, PartialEq)]
pub struct AdminCall {
    pub request: AdminRequest,
    pub sent_at_us: Us,
    /// When the operator got an answer or gave up (timeout).
    pub received_at_us: Option<Us>,
    pub answer: Option<Result<AdminResponse, TransportError>>,
    /// When a coordinator worked on it, as recorded by the coordinator node's server: one
    /// `(from, to)` per delivered attempt; `to == None` if the coordinator died while handling it.
    pub handled: Vec<(Us, Option<Us>)>,
}

/// The simulated application processing one delivered entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Processing {
    pub process: ProcessId,
    pub stream: String,
    pub id: EntryId,
    pub start_us: Us,
    /// When processing finished or was cancelled (`None`: the process died first).
    pub end_us: Option<Us>,
    /// The work ran to its end (not cancelled because the shard was lost, and the process did
    /// not die first): only such a processing counts as the entry processed.
    pub completed: bool,
}

/// The life of one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifecycle {
    pub process: ProcessId,
    pub started_at_us: Us,
    /// Killed, or ended by itself (a consumer that left).
    pub stopped_at_us: Option<Us>,
    /// Pauses: (from, to); `to == None` while still paused.
    pub paused: Vec<(Us, Option<Us>)>,
}

/// A fault-injector step the checkers need to know about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Writes were lost without an identity change (the silent-rollback damage window starts).
    SilentRollback { at_us: Us },
    /// Metadata writes were acknowledged but dropped during `[from_us, to_us]` (each one is a
    /// silent loss of the newest write).
    WriteDrop { from_us: Us, to_us: Us },
    /// The metadata key was deleted (or removed for a repair) by a fault or the operator's repair.
    KeyDeleted { at_us: Us },
    /// From `at_us` on, `node`'s clocks run at `rate_ppm` parts per million of true time (a
    /// `clock-drift` fault began or ended). Leases are the clients' own: measured on this clock.
    ClockRate { node: NodeRef, at_us: Us, rate_ppm: u64 },
}

/// One line of the event trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceLine {
    pub at_us: Us,
    pub who: String,
    pub text: String,
}

/// Everything recorded in one run.
#[derive(Debug, Default)]
pub struct Records {
    pub reads: Vec<ReadEvent>,
    pub adds: Vec<AddEvent>,
    pub acks: Vec<AckEvent>,
    pub heartbeats: Vec<HeartbeatCall>,
    pub routings: Vec<RoutingCall>,
    pub admins: Vec<AdminCall>,
    pub processing: Vec<Processing>,
    pub lifecycles: Vec<Lifecycle>,
    pub marks: Vec<Mark>,
    pub trace: Vec<TraceLine>,
    /// Heartbeats a `stale-delivery` fault delivered late (duplicated or deferred).
    pub stale_deliveries: usize,
    /// Doorbell waits (`XREAD BLOCK` on shard streams) the server ran: a consumer attending an
    /// idle shard. Never a read of the group (no tenure); the liveness checker counts them.
    pub watches: Vec<WatchEvent>,
}

/// One stream of a doorbell wait the server ran.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchEvent {
    pub process: ProcessId,
    /// The Redis node that ran it (see [`ReadEvent::server`]).
    pub server: NodeRef,
    pub stream: String,
    pub issued_at_us: Us,
    /// When the server ran it.
    pub served_at_us: Us,
    /// The id it waited after (`None`: the group's last-delivered id, looked up by the store).
    pub after: Option<rsc::store::EntryId>,
}

/// The shared recorder of one run (cheap to clone; every node holds one).
#[derive(Clone)]
pub struct Recorder {
    records: Arc<Mutex<Records>>,
    origin: tokio::time::Instant,
    next_id: Arc<AtomicU64>,
    /// Write store calls and heartbeats to the trace too (a replay wants them; a batch run of
    /// thousands of seeds only needs the hash of the coarser trace).
    pub verbose: bool,
}

impl Recorder {
    /// A recorder whose time origin is now (call it first thing in the run).
    pub fn new(verbose: bool) -> Self {
        Self {
            records: Arc::default(),
            origin: tokio::time::Instant::now(),
            next_id: Arc::new(AtomicU64::new(1)),
            verbose,
        }
    }

    /// Simulated microseconds since the run started.
    pub fn now_us(&self) -> Us {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// A run-unique id (store calls, reply tags).
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The records; a panic elsewhere must not hide them from the checkers.
    pub fn lock(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends a trace line stamped now.
    pub fn trace(&self, who: impl std::fmt::Display, text: impl Into<String>) {
        let line = TraceLine { at_us: self.now_us(), who: who.to_string(), text: text.into() };
        self.lock().trace.push(line);
    }

    /// Appends a trace line only in verbose mode (the closure is not run otherwise).
    pub fn trace_verbose(&self, who: impl std::fmt::Display, text: impl FnOnce() -> String) {
        if self.verbose {
            self.trace(who, text());
        }
    }

    /// Takes the records out at the end of the run.
    pub fn take(&self) -> Records {
        std::mem::take(&mut *self.lock())
    }
}

/// Formats a simulated time as seconds with microseconds: `  12.345678`.
pub fn fmt_us(at_us: Us) -> String {
    format!("{:>4}.{:06}", at_us / 1_000_000, at_us % 1_000_000)
}

/// The trace as text, one event per line.
pub fn render_trace(lines: &[TraceLine]) -> String {
    let mut out = String::with_capacity(lines.len() * 64);
    for line in lines {
        let _ = writeln!(out, "{} {:<16} {}", fmt_us(line.at_us), line.who, line.text);
    }
    out
}

/// FNV-1a over the rendered trace: equal hashes for two runs of one seed prove determinism.
pub fn trace_hash(lines: &[TraceLine]) -> u64 {
    let mut hash = Fnv1a(0xcbf2_9ce4_8422_2325);
    for line in lines {
        // The bytes of `{at_us}|{who}|{text}\n`, fed as written (no string per line).
        let _ = write!(hash, "{}|", line.at_us);
        let _ = hash.write_str(&line.who);
        let _ = hash.write_str("|");
        let _ = hash.write_str(&line.text);
        let _ = hash.write_str("\n");
    }
    hash.0
}

/// An FNV-1a hash fed through `fmt::Write`.
struct Fnv1a(u64);

impl std::fmt::Write for Fnv1a {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        for byte in text.bytes() {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        Ok(())
    }
}
