//! The producer library: [`Producer::publish`] routes a key to a shard with the jump hash over the
//! cached shard count and XADDs to `<streamPrefix>:<shard>`, under the routing cache's lease
//! ([`RoutingCache`], the pure rules).
//!
//! How it runs: `Producer::new` spawns one background task (`tokio::spawn`, madsim's under the
//! simulation) that refreshes routing every `routingRefreshIntervalMs` (counted from the last
//! refresh's send time) and retries failures every `refresh_retry_ms`. A publish that finds no
//! valid cache refreshes inline once, then fails closed. The lease is checked immediately before
//! the XADD, with no `.await` in between. Time comes only from [`Clock`], which counts time the
//! machine spent suspended: a view whose lease ended during a suspension is never published on.

pub mod routing;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::core::model::{GroupId, SHARD_COUNT_MAX};
use crate::core::planted::PlantedBugs;
use crate::core::protocol::{ErrorCode, RoutingReport, RoutingResponse};
use crate::store::{EntryId, StoreError, StreamStore};

pub use self::routing::{RefreshOutcome, Route, RouteError, RoutingCache};
use super::clock::Clock;
use super::events::{ClientEvent, EventSink};
use super::transport::{CoordinatorTransport, TransportError};
use super::ClientEnv;

/// Producer settings. Durations in milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerConfig {
    pub group: GroupId,
    /// Names this producer in events.
    pub producer_id: String,
    /// `XADD ... MAXLEN ~ n` when set. Trimming deletes the oldest entries whether or not a
    /// consumer has read or acked them: an entry trimmed before it was read is never delivered
    /// (its publish succeeded), and one trimmed while pending comes back from the own-pending
    /// re-read without its fields and is acked there without reaching the application (seen
    /// only as an `EntryAcked` event, by a sink that asks for entry events). At-least-once holds only for entries the streams still hold; size
    /// `n` for the longest backlog the consumers may fall behind by, or trim after acking instead.
    pub maxlen: Option<u64>,
    /// A routing request without an answer this long counts as failed.
    pub refresh_timeout_ms: u64,
    /// Pause between refresh attempts that did not produce a fresh view.
    pub refresh_retry_ms: u64,
    /// Deliberate mistakes for the simulation's negative tests; `NONE` everywhere else.
    pub planted: PlantedBugs,
}

impl ProducerConfig {
    pub fn new(group: GroupId, producer_id: impl Into<String>) -> Self {
        Self {
            group,
            producer_id: producer_id.into(),
            maxlen: None,
            refresh_timeout_ms: 2_000,
            refresh_retry_ms: 500,
            planted: PlantedBugs::NONE,
        }
    }
}

/// Why a publish wrote nothing (or, for `Store`, may not have).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// No routing view was ever fetched (the last refresh error is attached).
    #[error("no routing view: {0}")]
    NoRouting(String),
    /// The routing cache's lease ended and no refresh succeeded (fail closed).
    #[error("routing cache expired at {expired_at_ms} ms (version {metadata_version}); refresh failed")]
    CacheExpired { expired_at_ms: u64, metadata_version: u64 },
    /// The XADD failed; whether it was applied is unknown for timeouts.
    #[error("XADD failed: {0}")]
    Store(StoreError),
}

struct Shared<T, S> {
    config: ProducerConfig,
    cache: Mutex<RoutingCache>,
    transport: T,
    store: S,
    clock: Clock,
    sink: Arc<dyn EventSink>,
    /// Send time of the last refresh attempt (gates retries).
    last_attempt_ms: Mutex<Option<u64>>,
    /// When the last refresh ended and how, if it failed: a publish finding no valid route
    /// refreshes inline only `refresh_retry_ms` after a failed one.
    last_failure: Mutex<Option<(u64, TransportError)>>,
    /// Refreshes that ended (any kind): a publish that waited for `refreshing` while one ended
    /// takes that one's outcome instead of sending another.
    refreshes_ended: std::sync::atomic::AtomicU64,
    /// Held across every refresh (background, inline, [`Producer::refresh`]): publishes that find
    /// no valid route share the refresh in flight instead of each sending its own.
    refreshing: tokio::sync::Mutex<()>,
    /// True once the producer was dropped. Held while a refresh's event is emitted and while the
    /// drop emits `ProducerClosed`: a refresh ending on another thread as the producer is dropped
    /// would otherwise recreate the routing series after their removal (reading 0 for ever).
    closed: Mutex<bool>,
}

/// A producer for one group's shard streams. Dropping it stops its refresh task.
pub struct Producer<T: CoordinatorTransport, S: StreamStore> {
    shared: Arc<Shared<T, S>>,
    refresher: Option<JoinHandle<()>>,
}

impl<T: CoordinatorTransport, S: StreamStore> Producer<T, S> {
    /// A producer with default options (fresh clock, no events). Spawns the refresh task, whose
    /// first refresh goes out at once.
    pub fn new(config: ProducerConfig, transport: T, store: S) -> Self {
        Self::new_with(config, transport, store, ClientEnv::default())
    }

    pub fn new_with(config: ProducerConfig, transport: T, store: S, env: ClientEnv) -> Self {
        let shared = Arc::new(Shared {
            cache: Mutex::new(RoutingCache::new(config.planted)),
            config,
            transport,
            store,
            clock: env.clock,
            sink: env.events,
            last_attempt_ms: Mutex::new(None),
            last_failure: Mutex::new(None),
            refreshes_ended: std::sync::atomic::AtomicU64::new(0),
            refreshing: tokio::sync::Mutex::new(()),
            closed: Mutex::new(false),
        });
        let refresher = tokio::spawn(refresh_loop(Arc::clone(&shared)));
        Self { shared, refresher: Some(refresher) }
    }

    /// The cached routing view, valid or not.
    pub fn routing(&self) -> Option<RoutingResponse> {
        self.shared.cache().routing().cloned()
    }

    /// Refreshes routing now (also done in the background).
    pub async fn refresh(&self) -> Result<RefreshOutcome, TransportError> {
        self.shared.refresh().await
    }

    /// Publishes `payload` under `key` (fields `key` and `payload`).
    pub async fn publish(&self, key: &[u8], payload: Vec<u8>) -> Result<EntryId, PublishError> {
        self.publish_fields(key, vec![("key".into(), key.to_vec()), ("payload".into(), payload)]).await
    }

    /// Publishes arbitrary fields; `key` only chooses the shard.
    pub async fn publish_fields(&self, key: &[u8], fields: Vec<(String, Vec<u8>)>) -> Result<EntryId, PublishError> {
        let shared = &self.shared;
        let route = shared.route_or_refresh(key).await?;
        // No `.await` between the lease check in `route` and this call.
        match shared.store.xadd(&route.stream, fields, shared.config.maxlen).await {
            Ok(entry) => {
                shared.sink.emit(ClientEvent::PublishOk {
                    at_ms: shared.clock.now_ms(),
                    producer: shared.config.producer_id.clone(),
                    shard: route.shard,
                    entry,
                    routing_version: route.metadata_version,
                    cache_expires_ms: route.cache_expires_ms,
                });
                Ok(entry)
            }
            Err(error) => Err(shared.fail(PublishError::Store(error))),
        }
    }
}

impl<T: CoordinatorTransport, S: StreamStore> Drop for Producer<T, S> {
    fn drop(&mut self) {
        if let Some(task) = self.refresher.take() {
            task.abort();
        }
        let mut closed = self.shared.closed.lock().unwrap_or_else(|p| p.into_inner());
        *closed = true;
        let (at_ms, producer) = (self.shared.clock.now_ms(), self.shared.config.producer_id.clone());
        self.shared.sink.emit(ClientEvent::ProducerClosed { at_ms, producer });
    }
}

/// Why a routing answer cannot be this producer's routing, if it cannot: it names another group,
/// a shard count no group has, or stream keys other than the group's (the coordinator derives
/// them as `GroupId::stream_key`). Applied, such an answer would send every publish to streams no
/// consumer of the group reads (or all to one shard), so it counts as a failed refresh: the cache
/// keeps its lease, and publishing fails closed once it ends.
fn routing_problem(group: &GroupId, routing: &RoutingResponse) -> Option<String> {
    if routing.group != *group {
        return Some(format!("it routes group {:?}, not {group:?}", routing.group));
    }
    if routing.shard_count == 0 || routing.shard_count > SHARD_COUNT_MAX {
        return Some(format!("shard count {} is not in 1..={SHARD_COUNT_MAX}", routing.shard_count));
    }
    let keys = &routing.stream_keys;
    let derived = |(shard, key): (usize, &String)| u32::try_from(shard).is_ok_and(|s| *key == group.stream_key(s));
    if !keys.is_empty() && (keys.len() != routing.shard_count as usize || !keys.iter().enumerate().all(derived)) {
        return Some("its stream keys are not the group's".into());
    }
    None
}

fn route_error(error: RouteError, refresh: Option<TransportError>) -> PublishError {
    match error {
        RouteError::NoRouting => {
            PublishError::NoRouting(refresh.map_or_else(|| "no refresh answered".to_string(), |e| e.to_string()))
        }
        RouteError::Expired { expired_at_ms, metadata_version } => {
            PublishError::CacheExpired { expired_at_ms, metadata_version }
        }
    }
}

impl<T: CoordinatorTransport, S: StreamStore> Shared<T, S> {
    /// Emits a refresh's event, unless the producer was dropped (see `closed`).
    fn emit_unless_closed(&self, event: ClientEvent) {
        let closed = self.closed.lock().unwrap_or_else(|p| p.into_inner());
        if !*closed {
            self.sink.emit(event);
        }
    }

    fn cache(&self) -> MutexGuard<'_, RoutingCache> {
        // A poisoned lock means a panic mid-update; every cache method leaves it coherent.
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The clock is read once the cache's lock is held, as the consumer's checks do: a wait for
    /// the lock never makes the lease check judge an older time.
    fn route(&self, key: &[u8]) -> Result<Route, RouteError> {
        let mut cache = self.cache();
        cache.route(self.clock.now_ms(), key)
    }

    fn fail(&self, error: PublishError) -> PublishError {
        let (routing_version, cache_expires_ms) = {
            let cache = self.cache();
            (cache.routing().map(|r| r.metadata_version), cache.expires_ms())
        };
        self.sink.emit(ClientEvent::PublishFailed {
            at_ms: self.clock.now_ms(),
            producer: self.config.producer_id.clone(),
            error: error.to_string(),
            routing_version,
            cache_expires_ms,
        });
        error
    }

    /// The route of `key`; without a valid cache, after a refresh, else the failure (fail
    /// closed). A publish that waited while another refresh ended (background, or another
    /// publish's) takes its outcome instead of sending one more; after a failed refresh, the next
    /// goes out `refresh_retry_ms` after it, this publish waiting for it. Before, every publish
    /// sent its own routing request, so an application retrying at once drove one request per
    /// round trip at a coordinator that was down or answered errors.
    async fn route_or_refresh(&self, key: &[u8]) -> Result<Route, PublishError> {
        if let Ok(route) = self.route(key) {
            return Ok(route);
        }
        let ended = self.refreshes_ended.load(std::sync::atomic::Ordering::SeqCst);
        let _turn = self.refreshing.lock().await;
        let refresh_error = match self.route(key) {
            Ok(route) => return Ok(route),
            Err(_) if self.refreshes_ended.load(std::sync::atomic::Ordering::SeqCst) != ended => {
                self.last_failure_error()
            }
            Err(_) => {
                if let Some(until_ms) = self.retry_pause_until_ms() {
                    self.clock.sleep_until_ms(until_ms).await;
                }
                self.cache().mark_stale();
                self.refresh_held().await.err()
            }
        };
        self.route(key).map_err(|error| self.fail(route_error(error, refresh_error)))
    }

    /// When the retry pause after the last refresh ends, if that refresh failed less than
    /// `refresh_retry_ms` ago.
    fn retry_pause_until_ms(&self) -> Option<u64> {
        let last = self.last_failure.lock().unwrap_or_else(|p| p.into_inner());
        let until_ms = last.as_ref()?.0.saturating_add(self.config.refresh_retry_ms);
        (self.clock.now_ms() < until_ms).then_some(until_ms)
    }

    /// The error of the last refresh, if it failed.
    fn last_failure_error(&self) -> Option<TransportError> {
        self.last_failure.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|(_, error)| error.clone())
    }

    /// One routing request, once no other refresh is in flight.
    async fn refresh(&self) -> Result<RefreshOutcome, TransportError> {
        let _turn = self.refreshing.lock().await;
        self.refresh_held().await
    }

    /// The background task's refresh: one routing request, unless another refresh ended while
    /// this waited for `refreshing` (a publish's, or [`Producer::refresh`]) or made it not due:
    /// the two never send two back to back, and a publish queued behind both waits for one.
    async fn refresh_if_due(&self) {
        let ended = self.refreshes_ended.load(std::sync::atomic::Ordering::SeqCst);
        let _turn = self.refreshing.lock().await;
        let another_ended = self.refreshes_ended.load(std::sync::atomic::Ordering::SeqCst) != ended;
        if !another_ended && self.clock.now_ms() >= self.next_refresh_ms() {
            let _ = self.refresh_held().await;
        }
    }

    /// One routing request, `refreshing` held; the lease of its answer counts from `sent_ms`.
    async fn refresh_held(&self) -> Result<RefreshOutcome, TransportError> {
        let result = self.refresh_inner().await;
        let failure = result.as_ref().err().map(|error| (self.clock.now_ms(), error.clone()));
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = failure;
        self.refreshes_ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        result
    }

    async fn refresh_inner(&self) -> Result<RefreshOutcome, TransportError> {
        let sent_ms = self.clock.now_ms();
        *self.last_attempt_ms.lock().unwrap_or_else(|p| p.into_inner()) = Some(sent_ms);
        let mut report = self.cache().report();
        let give_up = tokio::time::Instant::now() + Duration::from_millis(self.config.refresh_timeout_ms);
        let mut result = self.routing_until(report, give_up).await;
        // An older coordinator behind the same address refuses parameters it does not know: the
        // cache decides what to ask instead (`RoutingCache::refused`, at most
        // `ROUTING_REQUESTS_MAX` requests in all).
        for _ in 1..routing::ROUTING_REQUESTS_MAX {
            let retry = match &result {
                Err(TransportError::Api(e)) if e.code == ErrorCode::BadRequest => {
                    self.cache().refused(&report, &e.message)
                }
                _ => None,
            };
            let Some(retry) = retry else { break };
            report = retry;
            result = self.routing_until(report, give_up).await;
        }
        if matches!(&result, Err(TransportError::Api(e)) if e.code == ErrorCode::GroupNotFound) {
            self.cache().forget_published();
        }
        let result = result.and_then(|routing| match routing_problem(&self.config.group, &routing) {
            Some(problem) => Err(TransportError::Unreachable(format!("invalid routing answer: {problem}"))),
            None => Ok(routing),
        });
        let now_ms = self.clock.now_ms();
        let producer = self.config.producer_id.clone();
        match result {
            Ok(routing) => {
                let (metadata_version, shard_count) = (routing.metadata_version, routing.shard_count);
                let (outcome, cache_expires_ms) = {
                    let mut cache = self.cache();
                    let outcome = cache.apply_refresh(sent_ms, now_ms, routing);
                    (outcome, cache.expires_ms().unwrap_or(0))
                };
                self.emit_unless_closed(ClientEvent::RoutingRefreshed {
                    at_ms: now_ms,
                    producer,
                    metadata_version,
                    shard_count,
                    cache_expires_ms,
                    replaced: outcome == RefreshOutcome::Replaced,
                });
                Ok(outcome)
            }
            Err(error) => {
                let cache_expires_ms = self.cache().expires_ms();
                self.emit_unless_closed(ClientEvent::RoutingRefreshFailed {
                    at_ms: now_ms,
                    producer,
                    error: error.clone(),
                    cache_expires_ms,
                });
                Err(error)
            }
        }
    }

    async fn routing_until(
        &self,
        report: RoutingReport,
        give_up: tokio::time::Instant,
    ) -> Result<RoutingResponse, TransportError> {
        tokio::select! {
            biased;
            result = self.transport.routing(&self.config.group, report) => result,
            _ = crate::time::sleep_until(give_up) => Err(TransportError::Timeout),
        }
    }

    /// When the background task should refresh next: when the cache says so, but never sooner
    /// than `refresh_retry_ms` after the previous attempt.
    fn next_refresh_ms(&self) -> u64 {
        let due_ms = self.cache().refresh_due_ms().unwrap_or(0);
        let last = *self.last_attempt_ms.lock().unwrap_or_else(|p| p.into_inner());
        let retry_ms = last.map_or(0, |at| at.saturating_add(self.config.refresh_retry_ms));
        due_ms.max(retry_ms)
    }
}

async fn refresh_loop<T: CoordinatorTransport, S: StreamStore>(shared: Arc<Shared<T, S>>) {
    loop {
        let next_ms = shared.next_refresh_ms();
        if shared.clock.now_ms() >= next_ms {
            // Failures are recorded as events; the next attempt follows the retry pause.
            shared.refresh_if_due().await;
            continue;
        }
        shared.clock.sleep_until_ms(next_ms).await;
    }
}
