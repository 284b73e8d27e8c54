//! The producer driver against the in-memory store and a scripted coordinator (real time under
//! tokio, simulated time under madsim).

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::client::events::VecSink;
use crate::client::hash::shard_for_key;
use crate::client::testing::{routing, FakeCoordinator};
use crate::core::proof::ViewProof;
use crate::core::protocol::{ApiError, HeartbeatRequest, HeartbeatResponse};
use crate::store::memory::MemoryStore;

const TTL_MS: u64 = 300;
const INTERVAL_MS: u64 = 50;

type TestProducer = Producer<Arc<FakeCoordinator>, MemoryStore>;

fn group() -> GroupId {
    GroupId::new("orders", "billing")
}

fn producer(coordinator: &Arc<FakeCoordinator>, store: &MemoryStore, sink: &Arc<VecSink>) -> TestProducer {
    let mut config = ProducerConfig::new(group(), "p1");
    config.refresh_retry_ms = 20;
    config.maxlen = Some(1_000);
    let env = ClientEnv::new(Clock::new(), Arc::clone(sink) as Arc<dyn EventSink>);
    Producer::new_with(config, Arc::clone(coordinator), store.connect(), env)
}

fn setup() -> (MemoryStore, Arc<FakeCoordinator>, Arc<VecSink>) {
    (MemoryStore::new(3), Arc::new(FakeCoordinator::new(&group(), 4, TTL_MS, INTERVAL_MS)), Arc::new(VecSink::new()))
}

#[tokio::test]
async fn publishes_to_the_jump_hash_shard_of_the_key() {
    let (store, coordinator, sink) = setup();
    let p = producer(&coordinator, &store, &sink);
    for key in ["a", "b", "order-1", "user:42"] {
        let id = p.publish(key.as_bytes(), b"x".to_vec()).await.expect("publish");
        let stream = group().stream_key(shard_for_key(key.as_bytes(), 4));
        assert!(store.peek_stream_ids(&stream).contains(&id), "{key} went to {stream}");
    }
    assert_eq!(store.add_log().len(), 4);
    let ok =
        sink.events().into_iter().filter(|e| matches!(e, ClientEvent::PublishOk { routing_version: 1, .. })).count();
    assert_eq!(ok, 4);
}

#[tokio::test]
async fn keeps_publishing_within_the_cache_lease_then_fails_closed() {
    let (store, coordinator, sink) = setup();
    let p = producer(&coordinator, &store, &sink);
    p.publish(b"k", b"1".to_vec()).await.expect("publish");
    coordinator.with(|s| s.up = false);
    let expires_ms = loop {
        // The newest lease once the last in-flight refresh has been answered.
        let expires = p.shared.cache().expires_ms().expect("cached");
        crate::time::sleep(Duration::from_millis(5)).await;
        if p.shared.cache().expires_ms() == Some(expires) {
            break expires;
        }
    };
    assert!(p.shared.clock.now_ms() < expires_ms);
    p.publish(b"k", b"2".to_vec()).await.expect("within the lease");
    let now = p.shared.clock.now_ms();
    crate::time::sleep(Duration::from_millis(expires_ms.saturating_sub(now) + 5)).await;
    let adds = store.add_log().len();
    let error = p.publish(b"k", b"3".to_vec()).await.expect_err("expired");
    assert!(matches!(error, PublishError::CacheExpired { metadata_version: 1, .. }), "{error:?}");
    assert_eq!(store.add_log().len(), adds, "nothing written after the lease");
    assert!(sink.events().iter().any(|e| matches!(e, ClientEvent::RoutingRefreshFailed { .. })));
    // Back up: the publish path refreshes immediately (after the retry pause of a failed
    // refresh) and succeeds.
    coordinator.with(|s| s.up = true);
    p.publish(b"k", b"4".to_vec()).await.expect("publish after recovery");
}

/// Publishes that find no valid route share one refresh, and after a failed one the next goes out
/// only `refresh_retry_ms` later: before, every publish sent its own routing request, so 16 tasks
/// publishing in a loop at a coordinator that was down sent one request per publish.
#[tokio::test]
async fn publishes_without_a_valid_route_share_one_refresh_per_retry_pause() {
    let (store, coordinator, sink) = setup();
    coordinator.with(|s| s.up = false);
    let p = Arc::new(producer(&coordinator, &store, &sink));
    let retry_ms = p.shared.config.refresh_retry_ms;
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let p = Arc::clone(&p);
            tokio::spawn(async move {
                let mut publishes = 0;
                while started.elapsed() < Duration::from_millis(10 * retry_ms) {
                    assert!(matches!(p.publish(b"k", b"x".to_vec()).await, Err(PublishError::NoRouting(_))));
                    publishes += 1;
                }
                publishes
            })
        })
        .collect();
    let mut publishes = 0;
    for task in tasks {
        publishes += task.await.expect("publisher");
    }
    let calls = coordinator.with(|s| s.routing_calls_down);
    let bound = (started.elapsed().as_millis() as u64 / retry_ms + 2) as usize;
    assert!(publishes >= 16, "{publishes} publishes");
    assert!(calls <= bound, "{calls} routing requests for {publishes} publishes (at most {bound})");
    assert!(store.add_log().is_empty());
    // Back up: the next publish waits out the pause, refreshes and succeeds.
    coordinator.with(|s| s.up = true);
    p.publish(b"k", b"x".to_vec()).await.expect("publish after recovery");
}

#[tokio::test]
async fn periodic_refresh_picks_up_added_shards() {
    let (store, coordinator, sink) = setup();
    let p = producer(&coordinator, &store, &sink);
    p.publish(b"k", b"1".to_vec()).await.expect("publish");
    coordinator.with(|s| s.routing = routing(&group(), 2, 16, TTL_MS, INTERVAL_MS));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while p.routing().map(|r| r.shard_count) != Some(16) {
        assert!(tokio::time::Instant::now() < deadline, "refresh never replaced the view");
        crate::time::sleep(Duration::from_millis(5)).await;
    }
    // Find a key whose shard moved to one of the new shards, and check where it is written.
    let key = (0..1_000).map(|i| format!("k{i}")).find(|k| shard_for_key(k.as_bytes(), 16) >= 4).expect("a moved key");
    let id = p.publish(key.as_bytes(), b"x".to_vec()).await.expect("publish");
    let stream = group().stream_key(shard_for_key(key.as_bytes(), 16));
    assert!(store.peek_stream_ids(&stream).contains(&id));
    assert!(sink
        .events()
        .iter()
        .any(|e| matches!(e, ClientEvent::RoutingRefreshed { metadata_version: 2, replaced: true, .. })));
}

#[tokio::test]
async fn never_fetched_routing_fails_with_no_routing() {
    let (store, coordinator, sink) = setup();
    coordinator.with(|s| s.up = false);
    let p = producer(&coordinator, &store, &sink);
    assert!(matches!(p.publish(b"k", b"x".to_vec()).await, Err(PublishError::NoRouting(_))));
    assert!(store.add_log().is_empty());
}

/// A routing answer for another group, with no shards, or with stream keys other than the group's
/// is a failed refresh: applied, it would send every publish to streams no consumer of the group
/// reads (review finding). Nothing is published until a valid answer arrives.
#[tokio::test]
async fn a_routing_answer_that_is_not_the_groups_is_refused() {
    let corruptions: [fn(&mut RoutingResponse); 4] = [
        |r| r.group = GroupId::new("orders", "shipping"),
        |r| r.shard_count = 0,
        |r| r.stream_keys[1] = "elsewhere:1".into(),
        |r| r.stream_keys.truncate(2),
    ];
    for corrupt in corruptions {
        let (store, coordinator, sink) = setup();
        coordinator.with(|s| corrupt(&mut s.routing));
        let p = producer(&coordinator, &store, &sink);
        let refused = p.publish(b"k", b"x".to_vec()).await;
        assert!(
            matches!(&refused, Err(PublishError::NoRouting(e)) if e.contains("invalid routing answer")),
            "{refused:?}"
        );
        assert!(store.add_log().is_empty());
        coordinator.with(|s| s.routing = routing(&group(), 1, 4, TTL_MS, INTERVAL_MS));
        p.publish(b"k", b"x".to_vec()).await.expect("a valid answer routes again");
    }
}

/// A lost AddShards: the producer cached v2 (16 shards), then the store lost it and the coordinator
/// serves v1 (4 shards). The producer reports v2 on its next refresh, is told it is lost, and
/// routes with 4 shards at once, long before its cache lease would have ended.
#[tokio::test]
async fn a_cached_version_the_coordinator_reports_lost_is_dropped_at_the_next_refresh() {
    let (store, coordinator, sink) = setup();
    let p = producer(&coordinator, &store, &sink);
    coordinator.with(|s| s.routing = routing(&group(), 2, 16, 60_000, INTERVAL_MS));
    p.publish(b"k", b"1".to_vec()).await.expect("publish on v2");
    assert_eq!(p.routing().map(|r| r.shard_count), Some(16));
    let lease_end_ms = p.shared.cache().expires_ms().expect("cached");
    coordinator.with(|s| s.routing = routing(&group(), 1, 4, 60_000, INTERVAL_MS));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while p.routing().map(|r| r.shard_count) != Some(4) {
        assert!(tokio::time::Instant::now() < deadline, "the lost view was kept");
        crate::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(p.shared.clock.now_ms() < lease_end_ms, "dropped while its lease still held");
    let known = coordinator.with(|s| s.known_versions.clone());
    assert_eq!(known.first(), Some(&0), "the first refresh had nothing cached");
    assert!(known.contains(&2), "refreshes report the cached version: {known:?}");
    let key = (0..1_000).map(|i| format!("k{i}")).find(|k| shard_for_key(k.as_bytes(), 16) >= 4).expect("a moved key");
    let id = p.publish(key.as_bytes(), b"x".to_vec()).await.expect("publish on v1");
    let stream = group().stream_key(shard_for_key(key.as_bytes(), 4));
    assert!(store.peek_stream_ids(&stream).contains(&id), "written to one of the 4 real shards");
}

/// The shard count a producer published with outlives the view it came from: after the lost view
/// (16 shards) is replaced by the store's (4 shards), every refresh still reports 16, so a
/// coordinator can re-add the shards that hold this producer's entries.
#[tokio::test]
async fn refreshes_report_the_highest_shard_count_published_with() {
    let (store, coordinator, sink) = setup();
    let p = producer(&coordinator, &store, &sink);
    p.refresh().await.expect("first view");
    assert_eq!(p.shared.cache().report().known_shard_count, 0, "nothing published yet");
    p.publish(b"k", b"1".to_vec()).await.expect("publish on 4 shards");
    assert_eq!(p.shared.cache().report().known_shard_count, 4);
    coordinator.with(|s| s.routing = routing(&group(), 2, 16, 60_000, INTERVAL_MS));
    p.refresh().await.expect("16 shards");
    p.publish(b"k", b"2".to_vec()).await.expect("publish on 16 shards");
    coordinator.with(|s| s.routing = routing(&group(), 1, 4, 60_000, INTERVAL_MS));
    p.refresh().await.expect("told v2 is lost");
    assert_eq!(p.routing().map(|r| r.shard_count), Some(4), "the lost view is dropped");
    p.refresh().await.expect("again");
    let counts = coordinator.with(|s| s.known_shard_counts.clone());
    assert_eq!(counts.last(), Some(&16), "still reported after the view changed: {counts:?}");
}

/// A coordinator that does not announce `acceptsKnownShardCount` (an older binary) is never sent
/// the parameter; one that announces it but refuses it (a downgrade behind the same address) is
/// asked again with it once, then without it, in the same refresh.
#[tokio::test]
async fn the_shard_count_goes_only_to_coordinators_that_read_it() {
    let (store, coordinator, sink) = setup();
    coordinator.with(|s| s.reads_shard_count = false);
    let p = producer(&coordinator, &store, &sink);
    p.refresh().await.expect("view from an old coordinator");
    p.publish(b"k", b"1".to_vec()).await.expect("publish");
    p.refresh().await.expect("refresh");
    assert!(coordinator.with(|s| s.known_shard_counts.iter().all(|c| *c == 0)), "never sent to an old coordinator");

    coordinator.with(|s| s.reads_shard_count = true);
    p.refresh().await.expect("a new coordinator announces it");
    p.refresh().await.expect("refresh");
    assert_eq!(coordinator.with(|s| s.known_shard_counts.last().copied()), Some(4));

    coordinator.with(|s| s.reads_shard_count = false);
    let calls = coordinator.with(|s| s.routing_calls);
    p.refresh().await.expect("the report refused twice is resent without the count");
    let counts = coordinator.with(|s| s.known_shard_counts[calls..].to_vec());
    assert_eq!(counts, vec![4, 4, 0], "sent once more before it is left out");
    p.refresh().await.expect("refresh");
    assert_eq!(coordinator.with(|s| s.known_shard_counts.last().copied()), Some(0));
}

#[tokio::test]
async fn a_routing_lease_that_ended_during_a_suspension_is_refused_before_the_next_xadd() {
    let (store, coordinator, sink) = setup();
    let faults = crate::client::clock::ClockFaults::new();
    let mut config = ProducerConfig::new(group(), "p1");
    config.refresh_retry_ms = 20;
    let env = ClientEnv::new(Clock::with_faults(faults.clone()), Arc::clone(&sink) as Arc<dyn EventSink>);
    let p = Producer::new_with(config, Arc::clone(&coordinator), store.connect(), env);
    p.publish(b"k", b"1".to_vec()).await.expect("publish");
    coordinator.with(|s| s.up = false);
    // Within the lease by tokio's (monotonic) clock, long past it by the suspend-aware one.
    faults.suspended_for(Duration::from_millis(10 * TTL_MS));
    let adds = store.add_log().len();
    let error = p.publish(b"k", b"2".to_vec()).await.expect_err("the view expired during the suspension");
    assert!(matches!(error, PublishError::CacheExpired { .. }), "{error:?}");
    assert_eq!(store.add_log().len(), adds, "no XADD after the routing lease ended");
}

/// A balancer that sends each routing request to the next of two coordinators in turn: an "old"
/// one (the previous release: reads `knownShardCount`, refuses the proofs with 400, gives none)
/// and a "new" one (gives proofs). Records the reports the new one was sent.
struct RoundRobin {
    state: std::sync::Mutex<RoundRobinState>,
}

struct RoundRobinState {
    next_is_old: bool,
    to_new: Vec<RoutingReport>,
}

impl RoundRobin {
    fn new(first_is_old: bool) -> Self {
        let state = RoundRobinState { next_is_old: first_is_old, to_new: Vec::new() };
        Self { state: std::sync::Mutex::new(state) }
    }

    fn to_new(&self) -> Vec<RoutingReport> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).to_new.clone()
    }
}

impl CoordinatorTransport for RoundRobin {
    async fn heartbeat(&self, _req: HeartbeatRequest) -> Result<HeartbeatResponse, TransportError> {
        Err(TransportError::Unreachable("no consumers here".into()))
    }

    async fn routing(&self, group: &GroupId, report: RoutingReport) -> Result<RoutingResponse, TransportError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let old = s.next_is_old;
        s.next_is_old = !old;
        // Long enough that the background task sends no periodic refresh during the test.
        let view = routing(group, 1, 4, 120_000, 60_000);
        if old {
            // The previous release's query parser names the first unknown parameter (the HTTP
            // client sends the version's proof before the count's).
            let unknown = match (report.known_version_proof, report.known_shard_count_proof) {
                (Some(_), _) => "knownVersionProof",
                (None, Some(_)) => "knownShardCountProof",
                (None, None) => return Ok(view),
            };
            let message = format!(
                "invalid query: Failed to deserialize query string: unknown field `{unknown}`, expected `knownVersion` or `knownShardCount`"
            );
            return Err(ApiError::new(ErrorCode::BadRequest, message).into());
        }
        s.to_new.push(report);
        let proof: ViewProof = "0123456789abcdef0123456789abcdef".parse().expect("a proof");
        Ok(RoutingResponse { metadata_version_proof: Some(proof), shard_count_proof: Some(proof), ..view })
    }
}

/// Compat review F4: behind a balancer that alternates per request between an old and a new
/// coordinator, a report refused by the old one (it does not know the proofs) was resent at once
/// without count and proofs, which reached the new one; the new one's answer turned both on
/// again, so every full report went to the old one and the proofs never reached the coordinator
/// that checks them. The retry now carries the same report once more, so it reaches the new one
/// within three refreshes, whichever coordinator the balancer starts with.
#[tokio::test]
async fn a_proven_report_reaches_the_new_coordinator_behind_a_round_robin_with_an_old_one() {
    for first_is_old in [true, false] {
        let (store, sink) = (MemoryStore::new(3), Arc::new(VecSink::new()));
        let balancer = Arc::new(RoundRobin::new(first_is_old));
        let mut config = ProducerConfig::new(group(), "p1");
        config.refresh_retry_ms = 20;
        let env = ClientEnv::new(Clock::new(), Arc::clone(&sink) as Arc<dyn EventSink>);
        let p = Producer::new_with(config, Arc::clone(&balancer), store.connect(), env);
        p.publish(b"k", b"1".to_vec()).await.expect("publish on 4 shards");
        let proven = |r: &RoutingReport| {
            r.known_shard_count == 4 && r.known_version_proof.is_some() && r.known_shard_count_proof.is_some()
        };
        for _ in 0..3 {
            p.refresh().await.expect("every refresh gets a view");
            // The count's proof is the one of the view a publish was routed with.
            p.publish(b"k", b"2".to_vec()).await.expect("publish");
        }
        let to_new = balancer.to_new();
        assert!(to_new.iter().any(proven), "first to the old one: {first_is_old}; the new one got {to_new:?}");
    }
}
