//! The applications of the end-to-end tests: consumers and a producer built from the real client
//! libraries (`rsc::client`), talking HTTP to coordinator processes through `HttpTransport` and
//! to Redis through `RedisStore` (wrapped in the ground-truth recorder).
//!
//! A [`ConsumerApp`] runs the loop an application would: poll, "process" for `process_ms`, ack.
//! Every entry it receives and every ack it completes goes into the shared [`Ledger`] with the
//! time it happened. [`ConsumerApp::crash`] drops the consumer without `close` (the heartbeat task
//! is aborted, nothing is reported: a crash); [`ConsumerApp::close`] leaves cleanly.
//! [`ProducerApp`] publishes keyed messages and records what Redis acknowledged.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use rsc::client::consumer::{AckError, ConsumerStatus, NoopListener, Phase};
use rsc::client::events::{ClientEvent, EventSink, VecSink};
use rsc::client::{ClientEnv, Clock, Consumer, ConsumerConfig, Producer, ProducerConfig};
use rsc::core::model::{GroupId, ShardId};
use rsc::http::client::{HttpClientConfig, HttpTransport};
use rsc::store::redis::{RedisStore, RedisStoreOptions, RedisTlsOptions};
use rsc::store::EntryId;

use super::faults::SlowPath;
use super::ground_truth::{ReadLog, RecordingStore};

pub type E2eConsumer = Consumer<HttpTransport, RecordingStore<SlowPath<RedisStore>>>;
pub type E2eProducer = Producer<HttpTransport, RedisStore>;

/// What every client of one test shares: the clock, the event sink, the read log and the ledger.
#[derive(Clone)]
pub struct Fleet {
    pub group: GroupId,
    pub coordinators: Vec<SocketAddr>,
    pub redis_url: String,
    pub clock: Clock,
    pub events: Arc<VecSink>,
    pub reads: ReadLog,
    pub ledger: Ledger,
    /// The client token the fleet's clients send (coordinators started with client tokens).
    pub client_token: Option<String>,
    /// Idle connections the clients keep per coordinator address (0: one connection per request,
    /// so a [`super::spread::Spreader`] spreads every request).
    pub idle_per_address_max: usize,
    /// The TLS files the clients' stores use (a `rediss://` server or Cluster with a private CA).
    pub redis_tls: RedisTlsOptions,
    /// How long the clients wait for one coordinator address before trying the next (500 ms:
    /// short, so a test of a dead coordinator moves on quickly; the library's default is 2 s).
    pub request_timeout: Duration,
    /// How long a consumer waits for a heartbeat's answer, every address included (1 s; the
    /// library's default is 2 s).
    pub heartbeat_timeout_ms: u64,
}

impl Fleet {
    pub fn new(group: GroupId, coordinators: Vec<SocketAddr>, redis_url: String) -> Self {
        Self {
            group,
            coordinators,
            redis_url,
            clock: Clock::new(),
            events: Arc::new(VecSink::new()),
            reads: ReadLog::new(),
            ledger: Ledger::default(),
            client_token: None,
            idle_per_address_max: 2,
            redis_tls: RedisTlsOptions::default(),
            request_timeout: Duration::from_millis(500),
            heartbeat_timeout_ms: 1_000,
        }
    }

    /// A consumer's environment: its events go to the fleet's sink, its shard stops to the read
    /// log as well (the split check needs them).
    fn env(&self) -> ClientEnv {
        let sink = StopSink { inner: self.events.clone(), reads: self.reads.clone(), group: self.group.clone() };
        ClientEnv::new(self.clock.clone(), Arc::new(sink))
    }

    /// The clients' transport: every coordinator address, short per-attempt timeouts.
    pub fn transport(&self) -> HttpTransport {
        HttpTransport::new(HttpClientConfig {
            addrs: self.coordinators.clone(),
            request_timeout: self.request_timeout,
            idle_per_address_max: self.idle_per_address_max,
            client_token: self.client_token.clone(),
        })
    }

    pub async fn store(&self) -> RedisStore {
        let options = RedisStoreOptions { tls: self.redis_tls.clone(), ..RedisStoreOptions::default() };
        if let Some(nodes) = self.redis_url.strip_prefix(super::process::CLUSTER_TARGET_PREFIX) {
            let nodes: Vec<String> = nodes.split(',').map(str::to_string).collect();
            return RedisStore::connect_cluster(&nodes, options).await.expect("clients reach the Redis Cluster");
        }
        RedisStore::connect(&self.redis_url, options).await.expect("clients reach Redis")
    }

    /// Joins a consumer and starts its application loop.
    pub async fn consumer(&self, member: &str, settings: AppSettings) -> ConsumerApp {
        let store = SlowPath::none(self.store().await);
        self.consumer_on(member, settings, store).await
    }

    /// Joins a consumer whose path to Redis is `store` (e.g. a [`SlowPath`]).
    pub async fn consumer_on(&self, member: &str, settings: AppSettings, store: SlowPath<RedisStore>) -> ConsumerApp {
        let mut config = ConsumerConfig::new(self.group.clone(), member);
        config.heartbeat_interval_ms = 200;
        config.heartbeat_timeout_ms = self.heartbeat_timeout_ms;
        config.retry_ms = 100;
        config.slow_retry_ms = 500;
        config.close_timeout_ms = 5_000;
        config.poll_idle_ms = 10;
        let store = RecordingStore::new(store, self.reads.clone());
        self.reads.note_incarnation(member);
        let consumer =
            Arc::new(Consumer::join_with(config, self.transport(), store, self.env(), Arc::new(NoopListener)));
        ConsumerApp::start(member, consumer, self.ledger.clone(), settings)
    }

    pub async fn producer(&self, name: &str) -> ProducerApp {
        let sink = Arc::new(PublishSink { inner: self.events.clone(), last_ok: Mutex::new(None) });
        let env = ClientEnv::new(self.clock.clone(), sink.clone());
        let producer = Producer::new_with(
            ProducerConfig::new(self.group.clone(), name),
            self.transport(),
            self.store().await,
            env,
        );
        ProducerApp { producer, sink, ledger: self.ledger.clone() }
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<ClientEvent> {
        self.events.events()
    }

    /// Waits until `count` distinct entries were acked, explaining the fleet on a timeout.
    pub async fn wait_all_acked(&self, count: usize, timeout: Duration) {
        let ledger = self.ledger.clone();
        super::wait_until_explained(
            "every message acked",
            timeout,
            || ledger.acked_distinct() >= count,
            || self.explain(),
        )
        .await;
    }

    /// The highest `metadataVersion` any heartbeat answer gave the fleet's consumers (0: none).
    pub fn highest_version_seen(&self) -> u64 {
        self.events()
            .iter()
            .filter_map(|e| match e {
                ClientEvent::HeartbeatAnswered { metadata_version, .. } => Some(*metadata_version),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// What the fleet did, for a failure message: ledger counts, read tenures, the last events.
    pub fn explain(&self) -> String {
        let ledger = self.ledger.lock();
        let mut text = format!(
            "produced {} (failures {:?}), delivered {}, acked {} ({} distinct), ack failures {:?}, poll errors {:?}\n",
            ledger.produced.len(),
            ledger.publish_failures.iter().take(5).collect::<Vec<_>>(),
            ledger.delivered.len(),
            ledger.acked.len(),
            ledger.acked.iter().map(|a| a.entry).collect::<BTreeSet<_>>().len(),
            ledger.ack_failures.iter().take(5).collect::<Vec<_>>(),
            ledger.poll_errors.iter().take(5).collect::<Vec<_>>(),
        );
        drop(ledger);
        text.push_str(&format!("read tenures:\n{}", self.reads.describe_tenures()));
        let events = self.events();
        text.push_str("last events:\n");
        for event in &events[events.len().saturating_sub(40)..] {
            text.push_str(&format!("  {event:?}\n"));
        }
        text
    }
}

/// How a consumer application behaves.
#[derive(Clone, Copy, Debug)]
pub struct AppSettings {
    /// Entries per poll.
    pub batch: usize,
    /// "Processing" time between receiving a batch and acking it (entries are in flight then).
    pub process_ms: u64,
}

impl Default for AppSettings {
    fn default() -> Self {
        Self { batch: 100, process_ms: 0 }
    }
}

/// An entry's identity: stream entry ids are unique per stream only, so the shard is part of it.
pub type EntryKey = (ShardId, EntryId);

/// One entry the application received.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub entry: EntryId,
    pub shard: ShardId,
    pub member: String,
    pub at: Instant,
    pub payload: Vec<u8>,
}

/// One entry the application acked (XACK succeeded).
#[derive(Clone, Debug)]
pub struct Acked {
    pub entry: EntryKey,
    pub member: String,
    pub at: Instant,
}

/// One publish Redis acknowledged.
#[derive(Clone, Debug)]
pub struct Produced {
    pub entry: EntryId,
    pub shard: ShardId,
    pub payload: Vec<u8>,
}

#[derive(Debug, Default)]
pub struct LedgerInner {
    pub delivered: Vec<Delivered>,
    pub acked: Vec<Acked>,
    pub ack_failures: Vec<String>,
    pub poll_errors: Vec<String>,
    pub produced: Vec<Produced>,
    pub publish_failures: Vec<String>,
}

/// What the applications did, shared by every client of a test.
#[derive(Clone, Debug, Default)]
pub struct Ledger(Arc<Mutex<LedgerInner>>);

impl Ledger {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, LedgerInner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Distinct entries acked so far.
    pub fn acked_distinct(&self) -> usize {
        self.lock().acked.iter().map(|a| a.entry).collect::<BTreeSet<_>>().len()
    }
}

/// A consumer and the application loop driving it.
pub struct ConsumerApp {
    member: String,
    consumer: Option<Arc<E2eConsumer>>,
    task: Option<JoinHandle<()>>,
    control: Arc<Control>,
}

/// Flags shared by a [`ConsumerApp`] handle and its loop.
#[derive(Default)]
struct Control {
    closing: AtomicBool,
    /// Asked to stop before acking its next batch (then crashed with entries in hand).
    hold: AtomicBool,
    /// The loop is parked holding un-acked entries.
    holding: AtomicBool,
    /// Entries received and not yet acked by the application.
    in_flight: Mutex<BTreeSet<EntryKey>>,
}

impl ConsumerApp {
    fn start(member: &str, consumer: Arc<E2eConsumer>, ledger: Ledger, settings: AppSettings) -> Self {
        let control = Arc::new(Control::default());
        let task = tokio::spawn(app_loop(consumer.clone(), ledger, settings, control.clone()));
        Self { member: member.into(), consumer: Some(consumer), task: Some(task), control }
    }

    pub fn member(&self) -> &str {
        &self.member
    }

    pub fn status(&self) -> ConsumerStatus {
        self.consumer.as_ref().expect("the consumer is running").status()
    }

    /// Entries the application holds right now (received, not acked).
    pub fn in_flight(&self) -> BTreeSet<EntryKey> {
        self.control.in_flight.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Simulates a crash in the middle of processing: waits (at most `timeout`) until the loop has
    /// received a batch and stopped before acking it, then drops the consumer without `close`
    /// (its heartbeat task is aborted; nothing is reported). Returns the entries it held un-acked.
    pub async fn crash_holding_entries(mut self, timeout: Duration) -> BTreeSet<EntryKey> {
        self.control.hold.store(true, Ordering::SeqCst);
        let control = self.control.clone();
        super::wait_until("the consumer to hold a batch", timeout, || control.holding.load(Ordering::SeqCst)).await;
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        self.consumer = None;
        self.in_flight()
    }

    /// Clean leave: the loop finishes its batch, then `Consumer::close` drains, reports every
    /// shard REVOKED and sends the leave heartbeat. Bounded by `timeout`.
    pub async fn close(mut self, timeout: Duration) {
        self.control.closing.store(true, Ordering::SeqCst);
        if let Some(task) = self.task.take() {
            tokio::time::timeout(timeout, task)
                .await
                .unwrap_or_else(|_| panic!("{} did not close within {timeout:?}", self.member))
                .expect("consumer loop");
        }
        let consumer = self.consumer.take().expect("consumer");
        assert_eq!(consumer.status().phase, Phase::Left, "{} left the group", self.member);
    }
}

impl Drop for ConsumerApp {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn app_loop(consumer: Arc<E2eConsumer>, ledger: Ledger, settings: AppSettings, control: Arc<Control>) {
    let member = consumer.member_id();
    while !control.closing.load(Ordering::SeqCst) {
        let deliveries = match consumer.poll(settings.batch).await {
            Ok(deliveries) => deliveries,
            Err(error) => {
                ledger.lock().poll_errors.push(format!("{member}: {error}"));
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        if deliveries.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        {
            let now = Instant::now();
            let mut ledger = ledger.lock();
            let mut held = control.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            for d in &deliveries {
                let payload = d.entry.fields.iter().find(|(n, _)| n == "payload").map(|(_, v)| v.clone());
                ledger.delivered.push(Delivered {
                    entry: d.entry.id,
                    shard: d.shard,
                    member: member.clone(),
                    at: now,
                    payload: payload.unwrap_or_default(),
                });
                held.insert((d.shard, d.entry.id));
            }
        }
        if settings.process_ms > 0 {
            tokio::time::sleep(Duration::from_millis(settings.process_ms)).await;
        }
        if control.hold.load(Ordering::SeqCst) {
            // Crashes here (the handle aborts this task) with the whole batch un-acked.
            control.holding.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        for d in &deliveries {
            // A failed XACK (a store error) leaves the entry in flight: retried a few times, then
            // given up, so the shard can still be reported REVOKED and its next owner redelivers
            // the entry. Any other refusal means the library already gave it up (lease ended,
            // fenced) or it was never in flight.
            let mut attempt = 1;
            let acked = loop {
                match consumer.ack(d).await {
                    Err(AckError::Store(_)) if attempt < ACK_ATTEMPTS_MAX => {
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(error @ AckError::Store(_)) => {
                        let _ = consumer.abandon(d);
                        break Err(error);
                    }
                    other => break other,
                }
            };
            match acked {
                Ok(()) => {
                    let at = Instant::now();
                    let entry = (d.shard, d.entry.id);
                    ledger.lock().acked.push(Acked { entry, member: member.clone(), at });
                }
                Err(error) => ledger.lock().ack_failures.push(format!("{member}: {error}")),
            }
            control.in_flight.lock().unwrap_or_else(|p| p.into_inner()).remove(&(d.shard, d.entry.id));
        }
    }
    let _ = consumer.close().await;
}

/// How many times the application sends one XACK that failed with a store error.
const ACK_ATTEMPTS_MAX: u32 = 5;

/// A producer and the record of what it published.
pub struct ProducerApp {
    producer: E2eProducer,
    sink: Arc<PublishSink>,
    ledger: Ledger,
}

/// Forwards a producer's events to the fleet's sink and keeps the shard and entry of its last
/// successful publish: the shard the library actually routed to (recomputing it afterwards
/// could use a newer shard count).
struct PublishSink {
    inner: Arc<VecSink>,
    last_ok: Mutex<Option<(ShardId, EntryId)>>,
}

/// Forwards a consumer's events to the fleet's sink, and notes each `ShardStopped` in the read
/// log as it is emitted.
struct StopSink {
    inner: Arc<VecSink>,
    reads: ReadLog,
    group: GroupId,
}

impl EventSink for StopSink {
    fn emit(&self, event: ClientEvent) {
        if let ClientEvent::ShardStopped { member, shard, .. } = &event {
            self.reads.note_stop(member.as_str(), self.group.stream_key(*shard));
        }
        self.inner.emit(event);
    }

    fn wants_entry_events(&self) -> bool {
        self.inner.wants_entry_events()
    }
}

impl EventSink for PublishSink {
    fn emit(&self, event: ClientEvent) {
        if let ClientEvent::PublishOk { shard, entry, .. } = &event {
            *self.last_ok.lock().unwrap_or_else(|p| p.into_inner()) = Some((*shard, *entry));
        }
        self.inner.emit(event);
    }
}

impl ProducerApp {
    /// The producer's cached routing view, valid or not.
    pub fn routing(&self) -> Option<rsc::core::protocol::RoutingResponse> {
        self.producer.routing()
    }

    /// Publishes message `i` (key `key-<i>`, payload `msg-<i>`); records the outcome.
    pub async fn publish(&self, i: usize) -> bool {
        let key = format!("key-{i}");
        let payload = format!("msg-{i}").into_bytes();
        match self.producer.publish(key.as_bytes(), payload.clone()).await {
            Ok(entry) => {
                // Publishes of one producer app are sequential: the last PublishOk is this one.
                let last = *self.sink.last_ok.lock().unwrap_or_else(|p| p.into_inner());
                let (shard, routed) = last.expect("a successful publish emits PublishOk");
                assert_eq!(routed, entry, "the last PublishOk is this publish's");
                self.ledger.lock().produced.push(Produced { entry, shard, payload });
                true
            }
            Err(error) => {
                self.ledger.lock().publish_failures.push(format!("msg-{i}: {error}"));
                false
            }
        }
    }

    /// Publishes messages `range` at about `per_second`, in bursts every 50 ms.
    pub async fn publish_paced(&self, range: std::ops::Range<usize>, per_second: usize) {
        let burst = (per_second / 20).max(1);
        let started = tokio::time::Instant::now();
        for (n, i) in range.clone().enumerate() {
            self.publish(i).await;
            if (n + 1) % burst == 0 {
                let due = started + Duration::from_millis(((n + 1) / burst) as u64 * 50);
                tokio::time::sleep_until(due).await;
            }
        }
    }
}

/// Checks at-least-once delivery against what Redis acknowledged to the producer, and that acked
/// entries never came back. `may_redeliver` lists the entries a crash or a lost lease left
/// un-acked (their redelivery is expected). Returns a one-line summary.
pub fn check_delivery(ledger: &Ledger, may_redeliver: &BTreeSet<EntryKey>) -> String {
    let inner = ledger.lock();
    let produced: BTreeMap<EntryKey, &Produced> = inner.produced.iter().map(|p| ((p.shard, p.entry), p)).collect();
    assert_eq!(produced.len(), inner.produced.len(), "XADD never returns one id twice on a stream");
    let mut deliveries: BTreeMap<EntryKey, Vec<&Delivered>> = BTreeMap::new();
    for d in &inner.delivered {
        deliveries.entry((d.shard, d.entry)).or_default().push(d);
    }
    let mut first_ack: BTreeMap<EntryKey, &Acked> = BTreeMap::new();
    for a in &inner.acked {
        first_ack.entry(a.entry).and_modify(|f| *f = if a.at < f.at { a } else { f }).or_insert(a);
    }
    let mut missing = Vec::new();
    for (id, p) in &produced {
        match deliveries.get(id) {
            None => missing.push(*id),
            Some(ds) => {
                for d in ds {
                    assert_eq!(d.payload, p.payload, "entry {id:?} arrived with another payload");
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} produced entries never consumed, e.g. {:?}",
        missing.len(),
        &missing[..5.min(missing.len())]
    );
    let unacked: Vec<&EntryKey> = produced.keys().filter(|id| !first_ack.contains_key(id)).collect();
    assert!(
        unacked.is_empty(),
        "{} produced entries never acked, e.g. {:?}",
        unacked.len(),
        &unacked[..5.min(unacked.len())]
    );
    let strangers: Vec<&EntryKey> = deliveries.keys().filter(|id| !produced.contains_key(id)).collect();
    assert!(strangers.is_empty(), "entries delivered that nobody produced: {strangers:?}");
    // An acked entry never comes back: no delivery after its first successful ack.
    for (id, ack) in &first_ack {
        for d in &deliveries[id] {
            assert!(
                d.at <= ack.at,
                "entry {id:?} acked by {} was delivered again to {} afterwards",
                ack.member,
                d.member
            );
        }
    }
    let redelivered: BTreeSet<EntryKey> = deliveries.iter().filter(|(_, ds)| ds.len() > 1).map(|(id, _)| *id).collect();
    let unexpected: Vec<&EntryKey> = redelivered.difference(may_redeliver).collect();
    assert!(
        unexpected.is_empty(),
        "{} entries delivered more than once without a crash or lost lease to explain it, e.g. {:?}",
        unexpected.len(),
        &unexpected[..5.min(unexpected.len())]
    );
    let ack_counts = inner.acked.len();
    format!(
        "{} produced, {} delivered ({} redelivered, {} allowed), {} acks, {} ack failures",
        produced.len(),
        inner.delivered.len(),
        redelivered.len(),
        may_redeliver.len(),
        ack_counts,
        inner.ack_failures.len()
    )
}

/// Entries the client libraries abandoned (lease ended, fenced): they stay pending in Redis and
/// are redelivered to the shard's next owner.
pub fn abandoned_entries(events: &[ClientEvent]) -> BTreeSet<EntryKey> {
    events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::EntryAbandoned { shard, entry, .. } => Some((*shard, *entry)),
            _ => None,
        })
        .collect()
}
