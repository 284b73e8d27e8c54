//! The library rows: the project's producer and consumer libraries, unchanged, against a real
//! coordinator (`Coordinator<RedisStore>` in this process, its ticker running; clients reach it
//! through [`InProcess`], which moves requests and responses without serializing them — the data
//! path never touches the coordinator, only heartbeats and routing refreshes do).
//!
//! Owns one group per library row (its config decides fencing), the consumers that joined it and
//! the producers publishing to it, kept across rounds so each row settles once. Every client has
//! its own `RedisStore` (one multiplexed connection), wrapped in [`Counted`] so the row's round
//! trips are counted at the store boundary. Never calls the stream store itself: everything on
//! the data path goes through `Producer::publish`, `Consumer::poll_wait` and `Consumer::ack_all`
//! (and `Consumer::poll` beside a held batch's `ack_all` in the `lib-on-overlap` row).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::counted::{Counted, TripCounters};
use crate::workload::{payload_of, Board, HoldAcks, Publisher, Subscriber, Workload};
use rsc::client::consumer::{Delivery, NoopListener};
use rsc::client::{
    ClientEnv, ClientEvent, Clock, Consumer, ConsumerConfig, CoordinatorTransport, EventSink, Producer, ProducerConfig,
    TransportError,
};
use rsc::core::model::{GroupConfig, GroupId};
use rsc::core::protocol::{AdminRequest, HeartbeatRequest, HeartbeatResponse, RoutingReport, RoutingResponse};
use rsc::service::Coordinator;
use rsc::store::redis::{RedisStore, RedisStoreOptions};

/// How long a fresh group may take until every shard is read by exactly one consumer.
const SETTLE_DEADLINE: Duration = Duration::from_secs(20);

/// The clients' way to the in-process coordinator.
#[derive(Clone)]
pub struct InProcess(pub Coordinator<RedisStore>);

impl CoordinatorTransport for InProcess {
    fn heartbeat(
        &self,
        req: HeartbeatRequest,
    ) -> impl Future<Output = Result<HeartbeatResponse, TransportError>> + Send {
        let coordinator = self.0.clone();
        async move { coordinator.heartbeat(req).await.map_err(TransportError::Api) }
    }

    fn routing(
        &self,
        group: &GroupId,
        report: RoutingReport,
    ) -> impl Future<Output = Result<RoutingResponse, TransportError>> + Send {
        let (coordinator, group) = (self.0.clone(), group.clone());
        async move { coordinator.routing(&group, report).await.map_err(TransportError::Api) }
    }
}

/// Whether the group's consumers fence their reads, acks and claims (`GroupConfig::fencing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fencing {
    On,
    /// Fencing on, with every fenced read through the script (no gates: the path before them).
    OnScripted,
    /// Fencing on, with every fenced batch ack through the ack script
    /// (`RedisStoreOptions::watched_acks` off): the side by side of what watched acks save.
    OnScriptedAcks,
    Off,
}

/// The config of a library row's group: the default, with the row's fencing.
fn group_config(fencing: Fencing) -> GroupConfig {
    GroupConfig { fencing: fencing != Fencing::Off, ..GroupConfig::default() }
}

type Store = Counted<RedisStore>;

pub struct LibPublisher(Producer<InProcess, Store>);

impl Publisher for LibPublisher {
    async fn publish(&self, key: Vec<u8>, payload: Vec<u8>) -> Result<(), String> {
        self.0.publish(&key, payload).await.map(|_| ()).map_err(|e| e.to_string())
    }
}

pub struct LibSubscriber {
    consumer: Consumer<InProcess, Store>,
    /// `Some`: the batches it says have their `ack_all` run beside the next `poll` (see
    /// [`Subscriber::consume`]).
    overlap: Option<HoldAcks>,
    /// With `overlap`: the batch read last, not acked yet.
    held: Mutex<Vec<Delivery>>,
}

impl LibSubscriber {
    fn take_held(&self) -> Vec<Delivery> {
        std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn hold(&self, deliveries: Vec<Delivery>) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = deliveries;
    }
}

impl Subscriber for LibSubscriber {
    /// What an application does: `poll_wait`, process the batch, then ack it with one
    /// `Consumer::ack_all` (one fenced-ack script for the fenced shards, else one XACK per shard).
    /// With `overlap`, a batch it holds (by default a full one: a backlog, more is waiting) is
    /// acked by the next call, with `ack_all` and a `poll` sent at once (both on the client's
    /// connection, so they travel together: one round trip's wait instead of two); its messages
    /// count as consumed when that `ack_all` returned. Another batch is acked at once, as without
    /// `overlap`. Only the application's order changes: `ack_all` still returns after Redis acked.
    async fn consume(&self, board: &Board, max: usize, wait: Duration) -> Result<usize, String> {
        let held = self.take_held();
        let (deliveries, acked) = if held.is_empty() {
            (self.consumer.poll_wait(max, wait).await.map_err(|e| e.to_string())?, Vec::new())
        } else {
            let (acked, polled) = tokio::join!(self.consumer.ack_all(&held), self.consumer.poll(max));
            acked.map_err(|e| e.to_string())?;
            (polled.map_err(|e| e.to_string())?, held)
        };
        let acked_now = if self.overlap.is_some_and(|hold| hold.holds(deliveries.len(), max)) {
            self.hold(deliveries);
            Vec::new()
        } else {
            self.consumer.ack_all(&deliveries).await.map_err(|e| e.to_string())?;
            deliveries
        };
        for delivery in acked.iter().chain(&acked_now) {
            board.acked(payload_of(&delivery.entry.fields));
        }
        Ok(acked.len() + acked_now.len())
    }
}

/// Counts the events that disturb the data path (a shard stopping for any reason but a clean
/// close, a failed heartbeat or routing refresh, a failed publish): a run with any of them
/// measured a rebalance, not the steady data path. Per-entry events cost one match.
#[derive(Default)]
pub struct Disruptions {
    counts: Mutex<BTreeMap<String, u64>>,
    /// The first failed heartbeat's error, for a group that never settles.
    first_heartbeat_error: Mutex<Option<String>>,
    /// What `wants_entry_events` answers (see [`LibOptions::entry_events`]); the events are
    /// then matched and dropped like the others this sink does not count.
    entry_events: bool,
}

impl Disruptions {
    /// Failed heartbeats so far, and the first one's error.
    fn heartbeat_failures(&self) -> (u64, Option<String>) {
        let failed = self.snapshot().get("heartbeat failed").copied().unwrap_or(0);
        (failed, self.first_heartbeat_error.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Counts since `earlier`, as `name n, ...` (empty when nothing happened).
    pub fn since(&self, earlier: &BTreeMap<String, u64>) -> String {
        let now = self.snapshot();
        let parts: Vec<String> = now
            .iter()
            .map(|(name, n)| (name, n - earlier.get(name).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        parts.join(", ")
    }
}

impl EventSink for Disruptions {
    fn emit(&self, event: ClientEvent) {
        let name = match &event {
            ClientEvent::ShardStopped { reason, .. } => format!("shard stopped {reason:?}"),
            ClientEvent::HeartbeatFailed { error, .. } => {
                self.first_heartbeat_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(error.to_string());
                "heartbeat failed".into()
            }
            ClientEvent::RoutingRefreshFailed { .. } => "routing refresh failed".into(),
            ClientEvent::PublishFailed { .. } => "publish failed".into(),
            ClientEvent::EntryAbandoned { .. } => "entry abandoned".into(),
            _ => return,
        };
        *self.counts.lock().unwrap_or_else(|p| p.into_inner()).entry(name).or_insert(0) += 1;
    }

    fn wants_entry_events(&self) -> bool {
        self.entry_events
    }
}

/// How a library row's clients differ from the defaults.
#[derive(Clone, Copy, Debug, Default)]
pub struct LibOptions {
    /// The consumers' `poll_idle_ms` (`None`: the library's default).
    pub poll_idle_ms: Option<u64>,
    /// `Some`: a held batch's `ack_all` goes beside the next `poll` (see [`LibSubscriber`]).
    pub overlap: Option<HoldAcks>,
    /// The consumers' sink asks for the per-entry events (`EventSink::wants_entry_events`), as
    /// a sink that records or counts every entry would: the side by side of what skipping them
    /// saves (the library's own sinks, and this bench's by default, do not ask).
    pub entry_events: bool,
}

/// One library row's group and clients.
pub struct LibRig {
    pub trips: Arc<TripCounters>,
    pub disruptions: Arc<Disruptions>,
    pub publishers: Vec<Arc<LibPublisher>>,
    pub subscribers: Vec<Arc<LibSubscriber>>,
    /// Time from the first join to every shard read by exactly one consumer.
    pub settle: Duration,
}

impl LibRig {
    /// Creates `group`, joins the consumers, waits until the assignment settled, sets every shard
    /// up (one poll per consumer, before any message exists) and fetches the producers' routing.
    pub async fn start(
        url: &str,
        coordinator: &Coordinator<RedisStore>,
        group: GroupId,
        fencing: Fencing,
        workload: &Workload,
        options: LibOptions,
    ) -> Result<LibRig, String> {
        let LibOptions { poll_idle_ms, overlap, entry_events } = options;
        let config = group_config(fencing);
        let create = AdminRequest::CreateGroup { group: group.clone(), shard_count: workload.shards, config };
        coordinator.admin(create).await.map_err(|e| format!("create group: {e}"))?;
        let trips = Arc::new(TripCounters::default());
        let disruptions = Arc::new(Disruptions { entry_events, ..Disruptions::default() });
        let env = ClientEnv::new(Clock::new(), disruptions.clone());
        let link = InProcess(coordinator.clone());
        let started = Instant::now();
        let mut subscribers = Vec::with_capacity(workload.consumers);
        for i in 0..workload.consumers {
            let mut config = ConsumerConfig::new(group.clone(), format!("lib-consumer-{i}"));
            if let Some(ms) = poll_idle_ms {
                config.poll_idle_ms = ms;
            }
            let store = Counted::new(connect(url, fencing).await?, Arc::clone(&trips));
            let consumer = Consumer::join_with(config, link.clone(), store, env.clone(), Arc::new(NoopListener));
            subscribers.push(Arc::new(LibSubscriber { consumer, overlap, held: Mutex::new(Vec::new()) }));
        }
        settle(&subscribers, workload.shards, &disruptions).await?;
        let settle = started.elapsed();
        for subscriber in &subscribers {
            let early = subscriber.consumer.poll(workload.batch).await.map_err(|e| format!("setup poll: {e}"))?;
            if !early.is_empty() {
                return Err(format!("setup poll of a fresh group delivered {} entries", early.len()));
            }
        }
        let mut publishers = Vec::with_capacity(workload.producers);
        for i in 0..workload.producers {
            let store = Counted::new(connect(url, Fencing::On).await?, Arc::clone(&trips));
            let producer =
                Producer::new(ProducerConfig::new(group.clone(), format!("lib-producer-{i}")), link.clone(), store);
            producer.refresh().await.map_err(|e| format!("routing: {e}"))?;
            publishers.push(Arc::new(LibPublisher(producer)));
        }
        Ok(LibRig { trips, disruptions, publishers, subscribers, settle })
    }

    /// Clean leaves (drain, REVOKED, leave heartbeat).
    pub async fn close(self) {
        for subscriber in &self.subscribers {
            let _ = subscriber.consumer.close().await;
        }
    }
}

/// A store on `url`: the defaults (fenced reads of new entries through gates, watched batch
/// acks), but what `fencing` turns off.
async fn connect(url: &str, fencing: Fencing) -> Result<RedisStore, String> {
    let options = RedisStoreOptions {
        fenced_read_gates: fencing != Fencing::OnScripted,
        watched_acks: fencing != Fencing::OnScriptedAcks,
        ..RedisStoreOptions::default()
    };
    RedisStore::connect(url, options).await.map_err(|e| e.to_string())
}

/// Heartbeats that may fail while nothing is readable before the group is given up on.
const SETTLE_FAILURES_MAX: u64 = 10;

/// Waits until every shard is readable by exactly one consumer, none is revoking, and (with no
/// more consumers than shards) every consumer reads at least one. Gives up early when heartbeats
/// keep failing and no shard is readable (a coordinator that cannot grant, e.g. without fence
/// scripts).
async fn settle(subscribers: &[Arc<LibSubscriber>], shards: u32, disruptions: &Disruptions) -> Result<(), String> {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    loop {
        let statuses: Vec<_> = subscribers.iter().map(|s| s.consumer.status()).collect();
        let mut readers = vec![0usize; shards as usize];
        for status in &statuses {
            for shard in &status.readable {
                if let Some(n) = readers.get_mut(*shard as usize) {
                    *n += 1;
                }
            }
        }
        let everyone_reads = subscribers.len() > shards as usize || statuses.iter().all(|s| !s.readable.is_empty());
        let none_revoking = statuses.iter().all(|s| s.revoking.is_empty());
        if readers.iter().all(|n| *n == 1) && everyone_reads && none_revoking {
            return Ok(());
        }
        let (failed, first_error) = disruptions.heartbeat_failures();
        if failed >= SETTLE_FAILURES_MAX && readers.iter().all(|n| *n == 0) {
            return Err(format!(
                "{failed} heartbeats failed, no shard granted; first: {}",
                first_error.unwrap_or_default()
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!("assignment did not settle within {SETTLE_DEADLINE:?}: readers per shard {readers:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
