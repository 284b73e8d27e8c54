//! Client events: what the consumer and producer libraries did, with the time they did it
//! (`at_ms` on the [`super::clock::Clock`]). They make traces readable and feed metrics.
//!
//! Events are *reports*, never inputs: nothing in the libraries reads them back, and the
//! simulation's safety checkers are built from ground truth (the stream store's read log, the
//! transport's send/receive times), not from these. An [`EventSink`] must not block or call back
//! into the client that emitted the event.

use std::sync::Mutex;

use crate::core::model::{MemberId, ShardId};
use crate::core::protocol::{HeartbeatStatus, RevokeReport};
use crate::metrics::{Counter, Metrics};
use crate::store::EntryId;

use super::clock::Clock;
use super::transport::TransportError;

/// Why a consumer stopped reading a shard (or abandoned an entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StopReason {
    /// The coordinator revoked it (in `revoke`, or no longer in `assigned`): drain, then REVOKED.
    Revoked,
    /// `SYNC_METADATA` did not keep it (not in the corrected `assigned`).
    SyncDropped,
    /// The assignment lease ended without a successful heartbeat (fail closed).
    LeaseExpired,
    /// `UNKNOWN_MEMBER` / `FENCED_MEMBER_EPOCH`: everything stops at once, rejoin.
    Fenced,
    /// `GROUP_NOT_FOUND` / `METADATA_MISSING` / `METADATA_INCOMPATIBLE`: fail closed.
    GroupUnavailable,
    /// Redis refused a stream operation on the shard as `FENCED` (DESIGN §10): a newer grant's
    /// fence is in force. The shard stops at once (lost); its in-flight entries are abandoned.
    FencedAtStore,
    /// The application closed the consumer.
    Closing,
    /// Entries only: the application abandoned the entry explicitly.
    Application,
    /// Entries only: a read of new entries (`>`) returned this entry's id while it was in flight.
    /// Redis hands out an id at most once per group unless its delivery position went back (a
    /// failover) or another entry took the id (a split brain's two primaries can each add one): the
    /// entry in flight may not be the one Redis now holds under the id, whose ack would then be
    /// an ack of an entry nobody processed. So this one is given up (its ack is refused) and the
    /// pending sweep delivers whatever Redis holds under the id. An ack of it already sent when
    /// the read returns is not covered: if it runs at Redis after the read, it acks the entry the
    /// read handed out, which is then lost (a split brain's old primary loses writes anyway).
    Reexposed,
    /// Entries only: the entry stayed in flight (handed out, neither acked nor abandoned) for
    /// `ConsumerConfig::max_in_flight_ms` while its shard was being read; the next poll delivers
    /// it again.
    InFlightTimeout,
    /// Entries only: the entry, or another of its shard's, stayed in flight for
    /// `ConsumerConfig::max_in_flight_ms` while the shard was draining (revoked, or closing): the
    /// drain ends without them (the application hears `on_lost` for the shard) and the shard's
    /// next owner delivers them.
    DrainTimeout,
}

impl StopReason {
    /// The reasons a shard stops for (the others are entries' only).
    pub const FOR_SHARDS: [StopReason; 7] = [
        StopReason::Revoked,
        StopReason::SyncDropped,
        StopReason::LeaseExpired,
        StopReason::Fenced,
        StopReason::GroupUnavailable,
        StopReason::FencedAtStore,
        StopReason::Closing,
    ];
    /// Every reason, the entries' own included.
    pub const ALL: [StopReason; 11] = [
        StopReason::Revoked,
        StopReason::SyncDropped,
        StopReason::LeaseExpired,
        StopReason::Fenced,
        StopReason::GroupUnavailable,
        StopReason::FencedAtStore,
        StopReason::Closing,
        StopReason::Application,
        StopReason::Reexposed,
        StopReason::InFlightTimeout,
        StopReason::DrainTimeout,
    ];
}

/// One thing a client did. Non-exhaustive: new kinds of events are added in minor releases, so a
/// sink's `match` needs a wildcard arm.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// A heartbeat left the consumer (its send time starts any lease its response grants).
    HeartbeatSent {
        at_ms: u64,
        member: MemberId,
        member_epoch: u64,
        metadata_version: u64,
        owned: Vec<ShardId>,
        revoking: Vec<RevokeReport>,
        leave: bool,
    },
    /// A heartbeat got a successful response.
    HeartbeatAnswered {
        at_ms: u64,
        member: MemberId,
        sent_at_ms: u64,
        status: HeartbeatStatus,
        member_epoch: u64,
        metadata_version: u64,
        assignment_epoch: u64,
        store_revision: u64,
    },
    /// A heartbeat failed (protocol error, unreachable, timeout).
    HeartbeatFailed { at_ms: u64, member: MemberId, sent_at_ms: u64, error: TransportError },
    /// A successful response was applied; the consumer's local view afterwards.
    StatusApplied {
        at_ms: u64,
        member: MemberId,
        status: HeartbeatStatus,
        assigned: Vec<ShardId>,
        pending: Vec<ShardId>,
        revoke: Vec<ShardId>,
        reading: Vec<ShardId>,
        revoking: Vec<ShardId>,
    },
    /// The assignment lease now ends at `lease_end_ms` (send time + assignment lease).
    LeaseExtended { at_ms: u64, member: MemberId, lease_end_ms: u64 },
    /// The consumer may now read `shard` (after group setup and takeover of pending entries).
    ShardStarted { at_ms: u64, member: MemberId, shard: ShardId },
    /// The consumer stopped reading `shard`; it issues no further reads on it.
    ShardStopped { at_ms: u64, member: MemberId, shard: ShardId, reason: StopReason },
    /// The shard's REVOKED report was answered; the consumer forgot the shard.
    ShardReleased { at_ms: u64, member: MemberId, shard: ShardId },
    /// An entry was handed to the application.
    EntryDelivered { at_ms: u64, member: MemberId, shard: ShardId, entry: EntryId },
    /// The application acknowledged an entry (XACK succeeded).
    EntryAcked { at_ms: u64, member: MemberId, shard: ShardId, entry: EntryId },
    /// An in-flight entry was given up; it stays pending in Redis for the next owner to claim.
    EntryAbandoned { at_ms: u64, member: MemberId, shard: ShardId, entry: EntryId, reason: StopReason },
    /// The clean-leave heartbeat was answered: the member is gone.
    Left { at_ms: u64, member: MemberId },
    /// The consumer gave up its assignment lease before it ran out (fenced, unknown to the
    /// coordinator, or its group unavailable): it reads nothing until a new lease.
    LeaseEnded { at_ms: u64, member: MemberId },
    /// The producer was dropped: its routing cache gauges go.
    ProducerClosed { at_ms: u64, producer: String },
    /// The consumer stopped without a clean leave (a close that gave up, or the consumer was
    /// dropped): nothing of it runs any more; the coordinator expires the member after its TTL.
    Closed { at_ms: u64, member: MemberId },
    /// A publish was written (XADD succeeded).
    PublishOk {
        at_ms: u64,
        producer: String,
        shard: ShardId,
        entry: EntryId,
        routing_version: u64,
        cache_expires_ms: u64,
    },
    /// A publish failed; nothing was written (or the XADD outcome is unknown on a store error).
    PublishFailed {
        at_ms: u64,
        producer: String,
        error: String,
        routing_version: Option<u64>,
        cache_expires_ms: Option<u64>,
    },
    /// A routing refresh succeeded; `replaced` when the view changed to a newer version.
    RoutingRefreshed {
        at_ms: u64,
        producer: String,
        metadata_version: u64,
        shard_count: u32,
        cache_expires_ms: u64,
        replaced: bool,
    },
    /// A routing refresh failed; the cache (if any) is kept until `cache_expires_ms`.
    RoutingRefreshFailed { at_ms: u64, producer: String, error: TransportError, cache_expires_ms: Option<u64> },
}

impl ClientEvent {
    /// When the event happened, in [`super::clock::Clock`] milliseconds.
    pub fn at_ms(&self) -> u64 {
        match self {
            ClientEvent::HeartbeatSent { at_ms, .. }
            | ClientEvent::HeartbeatAnswered { at_ms, .. }
            | ClientEvent::HeartbeatFailed { at_ms, .. }
            | ClientEvent::StatusApplied { at_ms, .. }
            | ClientEvent::LeaseExtended { at_ms, .. }
            | ClientEvent::ShardStarted { at_ms, .. }
            | ClientEvent::ShardStopped { at_ms, .. }
            | ClientEvent::ShardReleased { at_ms, .. }
            | ClientEvent::EntryDelivered { at_ms, .. }
            | ClientEvent::EntryAcked { at_ms, .. }
            | ClientEvent::EntryAbandoned { at_ms, .. }
            | ClientEvent::Left { at_ms, .. }
            | ClientEvent::LeaseEnded { at_ms, .. }
            | ClientEvent::Closed { at_ms, .. }
            | ClientEvent::ProducerClosed { at_ms, .. }
            | ClientEvent::PublishOk { at_ms, .. }
            | ClientEvent::PublishFailed { at_ms, .. }
            | ClientEvent::RoutingRefreshed { at_ms, .. }
            | ClientEvent::RoutingRefreshFailed { at_ms, .. } => *at_ms,
        }
    }
}

/// Where client events go. Must be cheap and must not block.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: ClientEvent);

    /// Whether this sink wants the per-entry events, [`ClientEvent::EntryDelivered`] and
    /// [`ClientEvent::EntryAcked`]: one of each per message, each a member id copied and an event
    /// built, so a consumer whose sink ignores them does not make them (asked once, when the
    /// consumer joins). Every other event is always emitted. Default: true.
    fn wants_entry_events(&self) -> bool {
        true
    }
}

impl<T: EventSink + ?Sized> EventSink for std::sync::Arc<T> {
    fn emit(&self, event: ClientEvent) {
        (**self).emit(event);
    }

    fn wants_entry_events(&self) -> bool {
        (**self).wants_entry_events()
    }
}

/// Drops every event.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopSink;

impl EventSink for NoopSink {
    fn emit(&self, _event: ClientEvent) {}

    fn wants_entry_events(&self) -> bool {
        false
    }
}

/// Keeps every event in memory (tests and small simulations).
#[derive(Debug, Default)]
pub struct VecSink {
    events: Mutex<Vec<ClientEvent>>,
}

impl VecSink {
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of every event so far, in emission order.
    pub fn events(&self) -> Vec<ClientEvent> {
        self.lock().clone()
    }

    /// Removes and returns every event so far.
    pub fn take(&self) -> Vec<ClientEvent> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<ClientEvent>> {
        // A poisoned lock only means a panicking emitter; the vector is still usable.
        self.events.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl EventSink for VecSink {
    fn emit(&self, event: ClientEvent) {
        self.lock().push(event);
    }
}

/// Turns client events into the seed's client-side signals (heartbeat outcomes by status, lease
/// remaining, routing cache age and refresh failures, publish outcomes).
#[derive(Debug)]
pub struct MetricsSink {
    metrics: std::sync::Arc<Metrics>,
    /// The clock the events' `*_ms` times are on (the one passed to the clients' `ClientEnv`).
    clock: Clock,
}

const SHARD_STOPS: Counter =
    Counter { name: "rsc_client_shard_stops_total", help: "Shards a consumer stopped reading, by reason." };
const ENTRIES_ABANDONED: Counter =
    Counter { name: "rsc_client_entries_abandoned_total", help: "In-flight entries given up, by reason." };
const PUBLISHES: Counter = Counter { name: "rsc_client_publishes_total", help: "Publishes by outcome." };
const ROUTING_REFRESH_FAILURES: Counter =
    Counter { name: "rsc_client_routing_refresh_failures_total", help: "Failed producer routing refreshes." };

const ROUTING_CACHE_REMAINING: &str = "rsc_client_routing_cache_remaining_seconds";
const ROUTING_CACHE_REMAINING_HELP: &str =
    "Seconds until the producer's routing cache lease ends (0: publishes fail closed).";

impl MetricsSink {
    /// `clock` must be the clock of the clients whose events this sink receives. Registers the
    /// counters of bounded label values at 0, so that an alert on `increase(...) > 0` sees their
    /// first event (a series that first appeared at 1 reads as no increase).
    pub fn new(metrics: std::sync::Arc<Metrics>, clock: Clock) -> Self {
        for reason in StopReason::FOR_SHARDS {
            metrics.declare(&SHARD_STOPS, vec![("reason", format!("{reason:?}"))]);
        }
        for reason in StopReason::ALL {
            metrics.declare(&ENTRIES_ABANDONED, vec![("reason", format!("{reason:?}"))]);
        }
        for outcome in ["ok", "failed"] {
            metrics.declare(&PUBLISHES, vec![("outcome", outcome.into())]);
        }
        metrics.declare(&ROUTING_REFRESH_FAILURES, vec![]);
        Self { metrics, clock }
    }

    fn instant(&self, ms: u64) -> tokio::time::Instant {
        self.clock.instant_at(ms)
    }
}

impl EventSink for MetricsSink {
    fn emit(&self, event: ClientEvent) {
        let m = &self.metrics;
        match event {
            ClientEvent::HeartbeatAnswered { status, .. } => m.inc(
                "rsc_client_heartbeats_total",
                "Consumer heartbeats by outcome.",
                vec![("outcome", format!("{status:?}"))],
            ),
            ClientEvent::HeartbeatFailed { error, .. } => {
                let outcome = error.code().map_or_else(|| "transport".to_string(), |code| format!("{code:?}"));
                m.inc("rsc_client_heartbeats_total", "Consumer heartbeats by outcome.", vec![("outcome", outcome)]);
            }
            ClientEvent::LeaseExtended { member, lease_end_ms, .. } => m.set_until(
                "rsc_client_assignment_lease_remaining_seconds",
                "Seconds until the consumer's assignment lease ends (0: ended, reads have stopped).",
                vec![("member", member)],
                self.instant(lease_end_ms),
            ),
            // The gauge kept counting down the old lease after a fence (up to a lease, 8 s by
            // default, of "still reading"), and stayed at 0 for ever after a close that gave up.
            ClientEvent::LeaseEnded { at_ms, member } => m.set_until(
                "rsc_client_assignment_lease_remaining_seconds",
                "Seconds until the consumer's assignment lease ends (0: ended, reads have stopped).",
                vec![("member", member)],
                self.instant(at_ms),
            ),
            ClientEvent::Left { member, .. } | ClientEvent::Closed { member, .. } => {
                m.forget("rsc_client_assignment_lease_remaining_seconds", "member", &member);
            }
            ClientEvent::ShardStopped { reason, .. } => m.count(&SHARD_STOPS, vec![("reason", format!("{reason:?}"))]),
            ClientEvent::EntryAbandoned { reason, .. } => {
                m.count(&ENTRIES_ABANDONED, vec![("reason", format!("{reason:?}"))])
            }
            ClientEvent::PublishOk { .. } => m.count(&PUBLISHES, vec![("outcome", "ok".into())]),
            ClientEvent::PublishFailed { .. } => m.count(&PUBLISHES, vec![("outcome", "failed".into())]),
            ClientEvent::RoutingRefreshed { at_ms, producer, cache_expires_ms, .. } => {
                m.set_since(
                    "rsc_client_routing_cache_age_seconds",
                    "Seconds since the producer's routing view was last confirmed by a successful refresh.",
                    vec![("producer", producer.clone())],
                    self.instant(at_ms),
                );
                m.set_until(
                    ROUTING_CACHE_REMAINING,
                    ROUTING_CACHE_REMAINING_HELP,
                    vec![("producer", producer)],
                    self.instant(cache_expires_ms),
                );
            }
            ClientEvent::RoutingRefreshFailed { at_ms, producer, cache_expires_ms, .. } => {
                m.count(&ROUTING_REFRESH_FAILURES, vec![]);
                // A producer that never got routing (started during an outage) had no series, so
                // the "remaining == 0" alert never fired for the producer that could not publish.
                m.set_until(
                    ROUTING_CACHE_REMAINING,
                    ROUTING_CACHE_REMAINING_HELP,
                    vec![("producer", producer)],
                    self.instant(cache_expires_ms.unwrap_or(at_ms)),
                );
            }
            ClientEvent::ProducerClosed { producer, .. } => {
                // Left behind, `remaining` read 0 for ever: a permanent "fails closed" alert.
                m.forget("rsc_client_routing_cache_age_seconds", "producer", &producer);
                m.forget(ROUTING_CACHE_REMAINING, "producer", &producer);
            }
            _ => {}
        }
    }

    /// No metric counts single entries.
    fn wants_entry_events(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// The sinks that drop or only count events do not ask for one event per entry; a sink that
    /// keeps events does, and an `Arc` answers for what it holds.
    #[test]
    fn only_sinks_that_keep_events_ask_for_per_entry_events() {
        let metrics = MetricsSink::new(Arc::new(Metrics::new()), Clock::new());
        assert!(!NoopSink.wants_entry_events() && !metrics.wants_entry_events());
        assert!(VecSink::new().wants_entry_events());
        let shared: Arc<dyn EventSink> = Arc::new(NoopSink);
        assert!(!Arc::new(shared).wants_entry_events());
    }

    /// The counters of bounded label values exist at 0 from the start: an alert on
    /// `increase(rsc_client_shard_stops_total{reason="LeaseExpired"}[5m]) > 0` missed a process's
    /// first lease expiry when its series first appeared at 1.
    #[test]
    fn metrics_sink_exports_its_counters_at_zero_before_their_first_event() {
        let metrics = Arc::new(Metrics::new());
        let sink = MetricsSink::new(Arc::clone(&metrics), Clock::new());
        let rendered = metrics.render();
        for line in [
            "rsc_client_shard_stops_total{reason=\"LeaseExpired\"} 0",
            "rsc_client_shard_stops_total{reason=\"FencedAtStore\"} 0",
            "rsc_client_entries_abandoned_total{reason=\"Reexposed\"} 0",
            "rsc_client_publishes_total{outcome=\"failed\"} 0",
            "rsc_client_routing_refresh_failures_total 0",
        ] {
            assert!(rendered.lines().any(|l| l == line), "{line} missing from:\n{rendered}");
        }
        sink.emit(ClientEvent::ShardStopped {
            at_ms: 0,
            member: "a".into(),
            shard: 1,
            reason: StopReason::LeaseExpired,
        });
        let stops = metrics.value("rsc_client_shard_stops_total", &vec![("reason", "LeaseExpired".to_string())]);
        assert_eq!(stops, 1.0);
        // Every reason is listed: a new variant must be added to `ALL` (this match stops compiling).
        for reason in StopReason::ALL {
            match reason {
                StopReason::Revoked
                | StopReason::SyncDropped
                | StopReason::LeaseExpired
                | StopReason::Fenced
                | StopReason::GroupUnavailable
                | StopReason::FencedAtStore
                | StopReason::Closing
                | StopReason::Application
                | StopReason::Reexposed
                | StopReason::InFlightTimeout
                | StopReason::DrainTimeout => {}
            }
        }
        let distinct: std::collections::BTreeSet<_> = StopReason::ALL.into_iter().collect();
        assert_eq!(distinct.len(), StopReason::ALL.len());
        assert!(StopReason::FOR_SHARDS.iter().all(|r| distinct.contains(r)));
    }

    #[tokio::test]
    async fn metrics_sink_exports_lease_remaining_and_routing_cache_age_as_seconds() {
        let metrics = Arc::new(Metrics::new());
        let clock = Clock::new();
        let sink = MetricsSink::new(Arc::clone(&metrics), clock.clone());
        let now_ms = clock.now_ms();
        let member = |m: &str| vec![("member", m.to_string())];

        sink.emit(ClientEvent::LeaseExtended { at_ms: now_ms, member: "a".into(), lease_end_ms: now_ms + 30_000 });
        let left = metrics.value("rsc_client_assignment_lease_remaining_seconds", &member("a"));
        assert!(left > 29.0 && left <= 30.0, "{left}");
        // A lease that already ended reads 0, not a negative number or a stale end time.
        sink.emit(ClientEvent::LeaseExtended { at_ms: now_ms, member: "b".into(), lease_end_ms: 0 });
        assert_eq!(metrics.value("rsc_client_assignment_lease_remaining_seconds", &member("b")), 0.0);
        sink.emit(ClientEvent::Left { at_ms: now_ms, member: "a".into() });
        assert!(!metrics.render().contains("member=\"a\""), "a left: its series is gone");
        // Fenced with time left on the lease: 0 at once, not the old lease counting down.
        sink.emit(ClientEvent::LeaseExtended { at_ms: now_ms, member: "c".into(), lease_end_ms: now_ms + 30_000 });
        sink.emit(ClientEvent::LeaseEnded { at_ms: now_ms, member: "c".into() });
        assert_eq!(metrics.value("rsc_client_assignment_lease_remaining_seconds", &member("c")), 0.0);
        // Stopped without a leave: its series goes (it read 0 for ever, and the alert fired).
        sink.emit(ClientEvent::Closed { at_ms: now_ms, member: "c".into() });
        assert!(!metrics.render().contains("member=\"c\""), "c closed: its series is gone");

        crate::time::sleep(Duration::from_millis(20)).await;
        sink.emit(ClientEvent::RoutingRefreshed {
            at_ms: now_ms,
            producer: "p".into(),
            metadata_version: 3,
            shard_count: 4,
            cache_expires_ms: now_ms + 10_000,
            replaced: true,
        });
        let producer = vec![("producer", "p".to_string())];
        let age = metrics.value("rsc_client_routing_cache_age_seconds", &producer);
        assert!((0.02..1.0).contains(&age), "age counts from the refresh: {age}");
        let remaining = metrics.value("rsc_client_routing_cache_remaining_seconds", &producer);
        assert!(remaining > 8.0 && remaining <= 10.0, "{remaining}");
        // A producer whose first refresh failed has the series, at 0 (it cannot publish).
        let failed = |producer: &str, cache_expires_ms| ClientEvent::RoutingRefreshFailed {
            at_ms: now_ms,
            producer: producer.into(),
            error: crate::client::TransportError::Unreachable("down".into()),
            cache_expires_ms,
        };
        sink.emit(failed("q", None));
        let q = vec![("producer", "q".to_string())];
        assert!(metrics.render().contains("rsc_client_routing_cache_remaining_seconds{producer=\"q\"} 0"));
        assert_eq!(metrics.value("rsc_client_routing_cache_remaining_seconds", &q), 0.0);
        // A failed refresh with a valid cache leaves the lease where it was.
        sink.emit(failed("p", Some(now_ms + 10_000)));
        let remaining = metrics.value("rsc_client_routing_cache_remaining_seconds", &producer);
        assert!(remaining > 8.0 && remaining <= 10.0, "{remaining}");
        // A dropped producer's series go (they read 0 for ever).
        sink.emit(ClientEvent::ProducerClosed { at_ms: now_ms, producer: "p".into() });
        assert!(!metrics.render().contains("producer=\"p\""), "{}", metrics.render());
    }
}
