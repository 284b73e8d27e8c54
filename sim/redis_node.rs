//! The Redis node: a [`MemoryStore`] served as its own simulated node, and [`RemoteStore`], the
//! client handle coordinators, consumers and producers use to reach it over the simulated network
//! (so partitions, clogs, packet loss and kills between any process and Redis are real).
//!
//! Protocol: one datagram per request and per reply on a madsim [`Endpoint`] (the pattern madsim's
//! own simulated services use). A request carries a run-unique call id, the caller's process and
//! the instant the caller issued it; the reply goes back tagged with the call id. A lost request
//! or reply, a dead server, or a slow one shows up as `StoreError::Unavailable("timeout")` after the
//! client's timeout — the server may have executed the command (the "applied, response lost" case).
//!
//! Each calling process gets its own server-side connection (a [`MemoryStore::connect`] handle),
//! so a failover breaks each connection once, as in Redis. The node records what it executed
//! (reads, adds, acks) into the run's [`Recorder`]: the ground truth the checkers read.
//!
//! Split brain: a `redis-split-brain` fault starts a second node serving a fork of the store
//! (the old primary, same identity as before the failover) and routes some processes to it
//! through [`StoreRoutes`]; everything it executed is recorded the same way, tagged with its node.
//!
//! Never: calls the `redis` crate, serializes anything (payloads move in memory under madsim).

use std::any::Any;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim::net::Endpoint;
use rsc::core::model::{Fence, GroupId, MemberId};
use rsc::store::memory::MemoryStore;
use rsc::store::{
    CasStamp, Doorbell, EntryId, FenceCheck, FenceRaise, FencedRead, GroupStart, MetadataStore, ProbeReport, ReadFrom,
    RecordStamp, ServerIdentity, StoreError, StoredRecord, StreamEntry, StreamStore, TouchCheck, TouchResult,
    WriteOutcome, WriteRequest,
};

use rand::rngs::SmallRng;
use rand::Rng;

use crate::plan::NodeRef;
use crate::records::{AckEvent, AddEvent, ProcessId, ReadEvent, ReadKind, Recorder, Us, WatchEvent};
use crate::transport::TransportKnob;

/// The port the Redis node listens on.
pub const REDIS_PORT: u16 = 6379;
/// The datagram tag of requests (replies are tagged with their call id, which is smaller).
const REQUEST_TAG: u64 = u64::MAX - 0x0052_4544_4953;

/// One Redis command with its arguments.
#[derive(Clone, Debug)]
pub enum Command {
    Load(GroupId),
    TouchAndLoad(GroupId, MemberId, u64),
    TouchAndCheck(GroupId, MemberId, RecordStamp, u64),
    Liveness(GroupId),
    Write(GroupId, WriteRequest),
    Delete(GroupId, CasStamp),
    AcquireMutex(GroupId, String, u64),
    ReleaseMutex(GroupId, String),
    IndexAdd(GroupId),
    IndexMembers,
    TickRoster(String),
    ForgetTickers(Vec<String>),
    ExchangeHeard {
        sender: String,
        outgoing: Vec<(String, String)>,
        ttl_ms: u64,
        senders: Vec<String>,
    },
    RebuildIndex,
    Identity,
    Probe,
    XAdd {
        stream: String,
        fields: Vec<(String, Vec<u8>)>,
        maxlen: Option<u64>,
    },
    EnsureGroup {
        stream: String,
        group: String,
        start: GroupStart,
    },
    XReadGroup {
        group: String,
        consumer: String,
        streams: Vec<(String, ReadFrom)>,
        count: usize,
        fence: Option<FenceCheck>,
    },
    /// Fenced reads of several shards in one call ([`StreamStore::fenced_xreadgroup_many`]): one
    /// request and one reply, as `RedisStore` needs one round trip (its gated pipeline); each read
    /// checked, executed and recorded on its own step, other commands interleaving.
    FencedReads {
        group: String,
        consumer: String,
        reads: Vec<FencedRead>,
    },
    /// The doorbell ([`StreamStore::wait_for_entries`]): served by the node's store, which sleeps
    /// until an XADD or the deadline and re-checks the streams at the next step boundary.
    WaitForEntries {
        group: String,
        streams: Vec<(String, Option<EntryId>)>,
        block_ms: u64,
    },
    XAck {
        stream: String,
        group: String,
        ids: Vec<EntryId>,
        fence: Option<FenceCheck>,
    },
    Claim {
        stream: String,
        group: String,
        consumer: String,
        min_idle_ms: u64,
        fence: Option<FenceCheck>,
    },
    RaiseFences(Vec<FenceRaise>),
    ReadFences(Vec<String>),
}

impl Command {
    /// A short description for the trace.
    fn describe(&self) -> String {
        match self {
            Command::Load(_) => "LOAD".into(),
            Command::TouchAndLoad(_, m, _) => format!("TOUCH+LOAD {m}"),
            Command::TouchAndCheck(_, m, known, _) => format!("TOUCH+CHECK {m} r{} {}", known.revision, known.write_id),
            Command::Liveness(_) => "LIVENESS".into(),
            Command::Write(_, w) => match &w.expected {
                Some(expected) => format!("WRITE expect={expected}"),
                None => "WRITE create".into(),
            },
            Command::Delete(_, expected) => format!("DELETE expect={expected}"),
            Command::AcquireMutex(_, t, _) => format!("MUTEX+ {t}"),
            Command::ReleaseMutex(_, t) => format!("MUTEX- {t}"),
            Command::IndexAdd(_) => "SADD index".into(),
            Command::IndexMembers => "SMEMBERS index".into(),
            Command::TickRoster(i) => format!("ROSTER {i}"),
            Command::ForgetTickers(i) => format!("ROSTER- {}", i.join(",")),
            Command::ExchangeHeard { sender, outgoing, senders, .. } => {
                format!("HEARD {sender} out={} in={}", outgoing.len(), senders.len())
            }
            Command::RebuildIndex => "SCAN index".into(),
            Command::Identity => "INFO".into(),
            Command::Probe => "PROBE".into(),
            Command::XAdd { stream, .. } => format!("XADD {stream}"),
            Command::EnsureGroup { stream, .. } => format!("XGROUP CREATE {stream}"),
            Command::XReadGroup { consumer, streams, fence, .. } => {
                let s: Vec<String> = streams.iter().map(|(s, f)| format!("{s}{}", from_mark(*f))).collect();
                format!("XREADGROUP {consumer} {}{}", s.join(","), fenced(fence))
            }
            Command::FencedReads { consumer, reads, .. } => {
                let s: Vec<String> = reads
                    .iter()
                    .map(|r| format!("{}{} fence={}", r.stream, from_mark(r.from), r.fence.fence))
                    .collect();
                format!("XREADGROUP {consumer} {}", s.join(","))
            }
            Command::WaitForEntries { streams, block_ms, .. } => {
                let s: Vec<String> = streams.iter().map(|(s, id)| format!("{s}@{id:?}")).collect();
                format!("XREAD BLOCK {block_ms} {}", s.join(","))
            }
            Command::XAck { stream, ids, fence, .. } => format!("XACK {stream} {}{}", ids.len(), fenced(fence)),
            Command::Claim { stream, consumer, fence, .. } => {
                format!("XAUTOCLAIM {stream} -> {consumer}{}", fenced(fence))
            }
            Command::RaiseFences(raises) => format!("RAISE {} fences", raises.len()),
            Command::ReadFences(keys) => format!("READ {} fences", keys.len()),
        }
    }
}

fn fenced(fence: &Option<FenceCheck>) -> String {
    fence.as_ref().map_or_else(String::new, |f| format!(" fence={}", f.fence))
}

fn from_mark(from: ReadFrom) -> &'static str {
    match from {
        ReadFrom::New => ">",
        ReadFrom::OwnPending => "@0",
    }
}

/// A request datagram.
struct Envelope {
    call_id: u64,
    client: ProcessId,
    issued_at_us: Us,
    command: Command,
}

/// A reply datagram: `Result<T, StoreError>` for the command's `T`.
type Reply = Box<dyn Any + Send + Sync>;

/// Serves `store` on this node until the node dies. Run it as the Redis node's init task; `server`
/// names the node in what it records.
pub async fn serve(store: MemoryStore, recorder: Recorder, server: NodeRef) {
    let endpoint = match Endpoint::bind(("0.0.0.0", REDIS_PORT)).await {
        Ok(endpoint) => Arc::new(endpoint),
        Err(e) => panic!("redis node cannot bind port {REDIS_PORT}: {e}"),
    };
    // One server-side connection per calling process, opened at its first command.
    let connections: Arc<Mutex<BTreeMap<ProcessId, Arc<MemoryStore>>>> = Arc::default();
    loop {
        let Ok((payload, from)) = endpoint.recv_from_raw(REQUEST_TAG).await else { return };
        let Ok(envelope) = payload.downcast::<Envelope>() else { continue };
        let connection = {
            let mut connections = connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            Arc::clone(connections.entry(envelope.client).or_insert_with(|| Arc::new(store.connect())))
        };
        let endpoint = Arc::clone(&endpoint);
        let recorder = recorder.clone();
        // The command's future is boxed so the spawned one stays small: a spawn copies its future
        // twice, and `execute`'s is ~1.9 KB, at every request (~2% of a seed's time in memmove).
        tokio::spawn(async move {
            let call_id = envelope.call_id;
            let reply = Box::pin(execute(&connection, *envelope, &recorder, server)).await;
            // A reply to a client that died or is cut off is simply lost.
            let _ = endpoint.send_to_raw(from, call_id, reply).await;
        });
    }
}

/// Runs one command on the connection and records what the server did.
async fn execute(store: &MemoryStore, envelope: Envelope, recorder: &Recorder, server: NodeRef) -> Reply {
    let Envelope { call_id, client, issued_at_us, command } = envelope;
    recorder.trace_verbose(server, || format!("#{call_id} {client} {}", command.describe()));
    match command {
        Command::Load(g) => Box::new(store.load(&g).await),
        Command::TouchAndLoad(g, m, step) => Box::new(store.touch_and_load_by(&g, &m, step).await),
        Command::TouchAndCheck(g, m, known, step) => Box::new(store.touch_and_check_by(&g, &m, &known, step).await),
        Command::Liveness(g) => Box::new(store.liveness(&g).await),
        Command::Write(g, w) => Box::new(store.write(&g, w).await),
        Command::Delete(g, expected) => Box::new(store.delete(&g, &expected).await),
        Command::AcquireMutex(g, t, ttl) => Box::new(store.acquire_mutex(&g, &t, ttl).await),
        Command::ReleaseMutex(g, t) => Box::new(store.release_mutex(&g, &t).await),
        Command::IndexAdd(g) => Box::new(store.index_add(&g).await),
        Command::IndexMembers => Box::new(store.index_members().await),
        Command::TickRoster(i) => Box::new(store.tick_roster(&i).await),
        Command::ForgetTickers(i) => Box::new(store.forget_tickers(&i).await),
        Command::ExchangeHeard { sender, outgoing, ttl_ms, senders } => {
            Box::new(store.exchange_heard(&sender, &outgoing, ttl_ms, &senders).await)
        }
        Command::RebuildIndex => Box::new(store.rebuild_index().await),
        Command::Identity => Box::new(store.identity().await),
        Command::Probe => Box::new(store.probe().await),
        Command::XAdd { stream, fields, maxlen } => {
            let result = store.xadd(&stream, fields, maxlen).await;
            if let Ok(id) = &result {
                let served_at_us = recorder.now_us();
                let (process, id, acknowledged_at_us) = (client, *id, None);
                let add = AddEvent { process, server, stream, issued_at_us, served_at_us, id, acknowledged_at_us };
                recorder.lock().adds.push(add);
            }
            Box::new(result)
        }
        Command::EnsureGroup { stream, group, start } => Box::new(store.create_group(&stream, &group, start).await),
        Command::RaiseFences(raises) => Box::new(store.raise_fences(&raises).await),
        Command::ReadFences(keys) => Box::new(store.read_fences(&keys).await),
        Command::XReadGroup { group, consumer, streams, count, fence } => {
            let result = match (&fence, streams.as_slice()) {
                (Some(check), [(stream, from)]) => store
                    .fenced_xreadgroup(check, &group, &consumer, stream, *from, count)
                    .await
                    .map(|entries| vec![(stream.clone(), entries)]),
                (Some(_), _) => Err(StoreError::Protocol("a fenced read names exactly one stream".into())),
                (None, _) => store.xreadgroup(&group, &consumer, &streams, count, None).await,
            };
            if let Ok(read) = &result {
                let served_at_us = recorder.now_us();
                let mut records = recorder.lock();
                for (stream, from) in &streams {
                    let ids = read.iter().find(|(s, _)| s == stream).map(|(_, e)| e.iter().map(|e| e.id).collect());
                    let kind = if *from == ReadFrom::New { ReadKind::New } else { ReadKind::OwnPending };
                    records.reads.push(ReadEvent {
                        process: client,
                        server,
                        consumer: consumer.clone(),
                        stream: stream.clone(),
                        kind,
                        issued_at_us,
                        served_at_us,
                        ids: ids.unwrap_or_default(),
                    });
                }
            }
            Box::new(result)
        }
        Command::FencedReads { group, consumer, reads } => {
            let result = store.fenced_xreadgroup_many(&group, &consumer, &reads).await;
            if let Ok(outcomes) = &result {
                let served_at_us = recorder.now_us();
                let mut records = recorder.lock();
                for (read, outcome) in reads.iter().zip(outcomes) {
                    let Ok(entries) = outcome else { continue };
                    records.reads.push(ReadEvent {
                        process: client,
                        server,
                        consumer: consumer.clone(),
                        stream: read.stream.clone(),
                        kind: if read.from == ReadFrom::New { ReadKind::New } else { ReadKind::OwnPending },
                        issued_at_us,
                        served_at_us,
                        ids: entries.iter().map(|e| e.id).collect(),
                    });
                }
            }
            Box::new(result)
        }
        Command::WaitForEntries { group, streams, block_ms } => {
            let result = store.wait_for_entries(&group, &streams, block_ms).await;
            if result.is_ok() {
                let served_at_us = recorder.now_us();
                let mut records = recorder.lock();
                for (stream, after) in &streams {
                    let (process, stream, after) = (client, stream.clone(), *after);
                    records.watches.push(WatchEvent { process, server, stream, issued_at_us, served_at_us, after });
                }
            }
            Box::new(result)
        }
        Command::XAck { stream, group, ids, fence } => {
            let result = match &fence {
                Some(check) => store.fenced_xack(check, &stream, &group, &ids).await,
                None => store.xack(&stream, &group, &ids).await,
            };
            if result.is_ok() {
                let ack = AckEvent { process: client, server, stream, served_at_us: recorder.now_us(), ids };
                recorder.lock().acks.push(ack);
            }
            Box::new(result)
        }
        Command::Claim { stream, group, consumer, min_idle_ms, fence } => {
            let result = match &fence {
                Some(check) => store.fenced_claim_all_pending(check, &stream, &group, &consumer, min_idle_ms).await,
                None => store.claim_all_pending(&stream, &group, &consumer, min_idle_ms).await,
            };
            if let Ok(entries) = &result {
                let read = ReadEvent {
                    process: client,
                    server,
                    consumer,
                    stream,
                    kind: ReadKind::Claim,
                    issued_at_us,
                    served_at_us: recorder.now_us(),
                    ids: entries.iter().map(|e| e.id).collect(),
                };
                recorder.lock().reads.push(read);
            }
            Box::new(result)
        }
    }
}

/// Which Redis node each process's commands go to: the primary, unless a split brain left the
/// process on an old primary (set and cleared by the fault injector). Clones share the table.
#[derive(Clone, Debug)]
pub struct StoreRoutes {
    primary: SocketAddr,
    old_primary: Arc<Mutex<BTreeMap<NodeRef, SocketAddr>>>,
}

impl StoreRoutes {
    pub fn new(primary: SocketAddr) -> Self {
        Self { primary, old_primary: Arc::default() }
    }

    /// Where `node`'s next command goes.
    fn server_for(&self, node: NodeRef) -> SocketAddr {
        let old = self.old_primary.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        old.get(&node).copied().unwrap_or(self.primary)
    }

    /// Sends `node`'s commands to an old primary at `server` from now on.
    pub fn to_old_primary(&self, node: NodeRef, server: SocketAddr) {
        self.old_primary.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(node, server);
    }

    /// Sends `node`'s commands to the primary again.
    pub fn to_primary(&self, node: NodeRef) {
        self.old_primary.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&node);
    }
}

/// A process's connection to the Redis node, implementing both store traits over the simulated
/// network. Clones share the endpoint.
#[derive(Clone)]
pub struct RemoteStore {
    endpoint: Arc<Endpoint>,
    routes: StoreRoutes,
    process: ProcessId,
    timeout: Duration,
    recorder: Recorder,
    /// The `store-delay` fault of this process: requests leave late (a congested path to Redis),
    /// while the caller's timeout runs from the call; a request that outlives it still executes.
    delay: Option<(TransportKnob, Arc<Mutex<SmallRng>>)>,
}

impl RemoteStore {
    /// Binds this process's endpoint (call on the process's node).
    pub async fn connect(routes: StoreRoutes, process: ProcessId, timeout_ms: u64, recorder: Recorder) -> Self {
        let endpoint = match Endpoint::bind("0.0.0.0:0").await {
            Ok(endpoint) => Arc::new(endpoint),
            Err(e) => panic!("{process}: cannot bind a client endpoint: {e}"),
        };
        Self { endpoint, routes, process, timeout: Duration::from_millis(timeout_ms), recorder, delay: None }
    }

    /// Lets the `store-delay` fault (set on `knob`) hold this connection's requests; `rng` draws
    /// each request's delay.
    pub fn with_delay(mut self, knob: TransportKnob, rng: SmallRng) -> Self {
        self.delay = Some((knob, Arc::new(Mutex::new(rng))));
        self
    }

    /// How long the next request waits before it leaves (0 unless `store-delay` is on).
    fn draw_delay_ms(&self) -> u64 {
        let Some((knob, rng)) = &self.delay else { return 0 };
        let max = knob.store_delay_max_ms();
        if max == 0 {
            return 0;
        }
        rng.lock().unwrap_or_else(std::sync::PoisonError::into_inner).gen_range(0..=max)
    }

    /// Sends one command and waits for its reply or the timeout.
    async fn call<T: Send + Sync + 'static>(&self, command: Command) -> Result<T, StoreError> {
        self.call_blocking(command, 0).await
    }

    /// [`RemoteStore::call`] for a command the server may hold up to `block_ms`: the timeout is
    /// extended by it, as `RedisStore` extends a blocking read's deadline.
    async fn call_blocking<T: Send + Sync + 'static>(&self, command: Command, block_ms: u64) -> Result<T, StoreError> {
        let call_id = self.recorder.next_id();
        let envelope = Envelope { call_id, client: self.process, issued_at_us: self.recorder.now_us(), command };
        let delay_ms = self.draw_delay_ms();
        let server = self.routes.server_for(self.process.node);
        let mut now = Some(envelope);
        if delay_ms > 0 {
            // The request leaves late on its own task: the caller may time out and move on first.
            let (endpoint, late) = (Arc::clone(&self.endpoint), now.take());
            tokio::spawn(async move {
                rsc::time::sleep(Duration::from_millis(delay_ms)).await;
                if let Some(envelope) = late {
                    let _ = endpoint.send_to_raw(server, REQUEST_TAG, Box::new(envelope)).await;
                }
            });
        }
        let exchange = async {
            if let Some(envelope) = now {
                self.endpoint
                    .send_to_raw(server, REQUEST_TAG, Box::new(envelope))
                    .await
                    .map_err(|e| StoreError::Unavailable(format!("send: {e}")))?;
            }
            let (reply, _) = self
                .endpoint
                .recv_from_raw(call_id)
                .await
                .map_err(|e| StoreError::Unavailable(format!("receive: {e}")))?;
            match reply.downcast::<Result<T, StoreError>>() {
                Ok(result) => *result,
                Err(_) => Err(StoreError::Protocol(format!("reply to call {call_id} has the wrong type"))),
            }
        };
        match rsc::time::timeout(self.timeout + Duration::from_millis(block_ms), exchange).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable("timeout".into())),
        }
    }
}

impl MetadataStore for RemoteStore {
    async fn load(&self, group: &GroupId) -> Result<Option<StoredRecord>, StoreError> {
        self.call(Command::Load(group.clone())).await
    }

    async fn touch_and_load_by(&self, group: &GroupId, member: &str, step: u64) -> Result<TouchResult, StoreError> {
        self.call(Command::TouchAndLoad(group.clone(), member.to_string(), step)).await
    }

    async fn touch_and_check_by(
        &self,
        group: &GroupId,
        member: &str,
        known: &RecordStamp,
        step: u64,
    ) -> Result<TouchCheck, StoreError> {
        self.call(Command::TouchAndCheck(group.clone(), member.to_string(), known.clone(), step)).await
    }

    async fn liveness(&self, group: &GroupId) -> Result<BTreeMap<MemberId, u64>, StoreError> {
        self.call(Command::Liveness(group.clone())).await
    }

    async fn write(&self, group: &GroupId, request: WriteRequest) -> Result<WriteOutcome, StoreError> {
        self.call(Command::Write(group.clone(), request)).await
    }

    async fn delete(&self, group: &GroupId, expected: &CasStamp) -> Result<WriteOutcome, StoreError> {
        self.call(Command::Delete(group.clone(), expected.clone())).await
    }

    async fn acquire_mutex(&self, group: &GroupId, token: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        self.call(Command::AcquireMutex(group.clone(), token.to_string(), ttl_ms)).await
    }

    async fn release_mutex(&self, group: &GroupId, token: &str) -> Result<bool, StoreError> {
        self.call(Command::ReleaseMutex(group.clone(), token.to_string())).await
    }

    async fn index_add(&self, group: &GroupId) -> Result<(), StoreError> {
        self.call(Command::IndexAdd(group.clone())).await
    }

    async fn index_members(&self) -> Result<Vec<GroupId>, StoreError> {
        self.call(Command::IndexMembers).await
    }

    async fn rebuild_index(&self) -> Result<Vec<GroupId>, StoreError> {
        self.call(Command::RebuildIndex).await
    }

    async fn tick_roster(&self, instance: &str) -> Result<BTreeMap<String, u64>, StoreError> {
        self.call(Command::TickRoster(instance.to_string())).await
    }

    async fn forget_tickers(&self, instances: &[String]) -> Result<(), StoreError> {
        self.call(Command::ForgetTickers(instances.to_vec())).await
    }

    async fn exchange_heard(
        &self,
        sender: &str,
        outgoing: &[(String, String)],
        ttl_ms: u64,
        senders: &[String],
    ) -> Result<Vec<Option<String>>, StoreError> {
        let command = Command::ExchangeHeard {
            sender: sender.to_string(),
            outgoing: outgoing.to_vec(),
            ttl_ms,
            senders: senders.to_vec(),
        };
        self.call(command).await
    }

    async fn identity(&self) -> Result<ServerIdentity, StoreError> {
        self.call(Command::Identity).await
    }

    async fn probe(&self) -> Result<ProbeReport, StoreError> {
        self.call(Command::Probe).await
    }

    async fn raise_fences(&self, raises: &[FenceRaise]) -> Result<Vec<Fence>, StoreError> {
        self.call(Command::RaiseFences(raises.to_vec())).await
    }

    async fn read_fences(&self, keys: &[String]) -> Result<Vec<Option<Fence>>, StoreError> {
        self.call(Command::ReadFences(keys.to_vec())).await
    }
}

impl StreamStore for RemoteStore {
    async fn xadd(
        &self,
        stream: &str,
        fields: Vec<(String, Vec<u8>)>,
        maxlen: Option<u64>,
    ) -> Result<EntryId, StoreError> {
        let result: Result<EntryId, StoreError> =
            self.call(Command::XAdd { stream: stream.to_string(), fields, maxlen }).await;
        if let Ok(id) = &result {
            // The producer now knows the entry was added: it is "acknowledged" from here on.
            let now = self.recorder.now_us();
            let mut records = self.recorder.lock();
            // Two primaries of a split brain can hand out one id: the add is this process's own.
            let own = |a: &&mut AddEvent| a.id == *id && a.stream == stream && a.process == self.process;
            if let Some(add) = records.adds.iter_mut().rev().find(own) {
                add.acknowledged_at_us = Some(now);
            }
        }
        result
    }

    async fn create_group(&self, stream: &str, group: &str, start: GroupStart) -> Result<(), StoreError> {
        self.call(Command::EnsureGroup { stream: stream.to_string(), group: group.to_string(), start }).await
    }

    async fn xreadgroup(
        &self,
        group: &str,
        consumer: &str,
        streams: &[(String, ReadFrom)],
        count: usize,
        _block_ms: Option<u64>,
    ) -> Result<Vec<(String, Vec<StreamEntry>)>, StoreError> {
        let command = Command::XReadGroup {
            group: group.to_string(),
            consumer: consumer.to_string(),
            streams: streams.to_vec(),
            count,
            fence: None,
        };
        self.call(command).await
    }

    async fn wait_for_entries(
        &self,
        group: &str,
        streams: &[(String, Option<EntryId>)],
        block_ms: u64,
    ) -> Result<Doorbell, StoreError> {
        let command = Command::WaitForEntries { group: group.to_string(), streams: streams.to_vec(), block_ms };
        self.call_blocking(command, block_ms).await
    }

    async fn xack(&self, stream: &str, group: &str, ids: &[EntryId]) -> Result<u64, StoreError> {
        let command =
            Command::XAck { stream: stream.to_string(), group: group.to_string(), ids: ids.to_vec(), fence: None };
        self.call(command).await
    }

    async fn claim_all_pending(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let command = Command::Claim {
            stream: stream.to_string(),
            group: group.to_string(),
            consumer: consumer.to_string(),
            min_idle_ms,
            fence: None,
        };
        self.call(command).await
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
        let command = Command::XReadGroup {
            group: group.to_string(),
            consumer: consumer.to_string(),
            streams: vec![(stream.to_string(), from)],
            count,
            fence: Some(fence.clone()),
        };
        let read: Vec<(String, Vec<StreamEntry>)> = self.call(command).await?;
        Ok(read.into_iter().flat_map(|(_, entries)| entries).collect())
    }

    async fn fenced_xreadgroup_many(
        &self,
        group: &str,
        consumer: &str,
        reads: &[FencedRead],
    ) -> Result<Vec<Result<Vec<StreamEntry>, StoreError>>, StoreError> {
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        let command =
            Command::FencedReads { group: group.to_string(), consumer: consumer.to_string(), reads: reads.to_vec() };
        self.call(command).await
    }

    async fn fenced_xack(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        ids: &[EntryId],
    ) -> Result<u64, StoreError> {
        let (stream, group, ids) = (stream.to_string(), group.to_string(), ids.to_vec());
        self.call(Command::XAck { stream, group, ids, fence: Some(fence.clone()) }).await
    }

    async fn fenced_claim_all_pending(
        &self,
        fence: &FenceCheck,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let command = Command::Claim {
            stream: stream.to_string(),
            group: group.to_string(),
            consumer: consumer.to_string(),
            min_idle_ms,
            fence: Some(fence.clone()),
        };
        self.call(command).await
    }
}
