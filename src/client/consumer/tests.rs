//! The consumer driver against the in-memory store and a scripted coordinator. Under plain tokio
//! these run in real time with short leases; under `--cfg madsim` in simulated time.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::client::events::VecSink;
use crate::client::testing::FakeCoordinator;
use crate::core::model::{Fence, GroupId};
use crate::store::memory::{MemoryStore, ReadSource};
use crate::store::{MetadataStore, ReadFrom};

const LEASE_MS: u64 = 400;
const INTERVAL_MS: u64 = 20;

type TestConsumer = Consumer<Arc<FakeCoordinator>, MemoryStore>;

fn group() -> GroupId {
    GroupId::new("orders", "billing")
}

fn config(member: &str) -> ConsumerConfig {
    let mut config = ConsumerConfig::new(group(), member);
    config.heartbeat_interval_ms = INTERVAL_MS;
    config.retry_ms = INTERVAL_MS;
    config.close_timeout_ms = 3_000;
    config
}

async fn publish(store: &MemoryStore, shard: ShardId, count: usize) {
    for i in 0..count {
        store
            .xadd(&group().stream_key(shard), vec![("n".into(), i.to_string().into_bytes())], None)
            .await
            .expect("xadd");
    }
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        crate::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls until `want` entries arrived (or panics after 5 s).
async fn poll_n(consumer: &TestConsumer, want: usize) -> Vec<Delivery> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while got.len() < want {
        assert!(tokio::time::Instant::now() < deadline, "got only {} of {want} entries", got.len());
        got.extend(consumer.poll(want - got.len()).await.expect("poll"));
        crate::time::sleep(Duration::from_millis(2)).await;
    }
    got
}

fn setup(assigned: &[(&str, Vec<ShardId>)]) -> (MemoryStore, Arc<FakeCoordinator>, Arc<VecSink>) {
    let store = MemoryStore::new(7);
    let coordinator = Arc::new(FakeCoordinator::new(&group(), 2, LEASE_MS, INTERVAL_MS));
    coordinator.with(|s| {
        for (member, shards) in assigned {
            s.assigned.insert((*member).to_string(), shards.clone());
        }
    });
    (store, coordinator, Arc::new(VecSink::new()))
}

fn join(
    member: &str,
    coordinator: &Arc<FakeCoordinator>,
    store: &MemoryStore,
    sink: &Arc<VecSink>,
    listener: Arc<dyn RebalanceListener>,
) -> TestConsumer {
    let env = ClientEnv::new(Clock::new(), Arc::clone(sink) as Arc<dyn EventSink>);
    Consumer::join_with(config(member), Arc::clone(coordinator), store.connect(), env, listener)
}

#[tokio::test]
async fn reads_only_assigned_shards_after_setup_and_acks() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    publish(&store, 0, 3).await;
    publish(&store, 1, 2).await;
    let consumer = join("m1", &coordinator, &store, &sink, Arc::new(NoopListener));
    wait_until("shard 0 readable", || consumer.status().readable == vec![0]).await;
    let got = poll_n(&consumer, 3).await;
    assert!(got.iter().all(|d| d.shard == 0 && d.stream == "orders:0"));
    for delivery in &got {
        consumer.ack(delivery).await.expect("ack under the lease");
    }
    assert_eq!(store.ack_log().iter().map(|a| a.ids.len()).sum::<usize>(), 3);
    let reads = store.read_log();
    assert!(reads.iter().all(|r| r.stream == "orders:0" && r.consumer == "m1" && r.group == "billing"));
    // Setup first: the claim, then own pending, then new entries.
    let kinds: Vec<_> = reads.iter().map(|r| r.from).collect();
    assert_eq!(kinds[0], crate::store::memory::ReadSource::Claim { min_idle_ms: 0 });
    assert_eq!(kinds[1], ReadFrom::OwnPending.into());
    assert_eq!(kinds[2], ReadFrom::New.into());
    // Every lease is counted from a heartbeat's send time.
    let events = sink.events();
    let sends: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::HeartbeatSent { at_ms, .. } => Some(*at_ms),
            _ => None,
        })
        .collect();
    for event in &events {
        if let ClientEvent::LeaseExtended { lease_end_ms, .. } = event {
            assert!(sends.contains(&(lease_end_ms - LEASE_MS)), "lease end {lease_end_ms} not from a send time");
        }
    }
}

/// A shard revoked while an entry of it is in flight (draining), then lost before the entry was
/// settled (the lease ended): `on_revoked` had told the application to finish the entry, and
/// nothing told it the entry could no longer be acked, so it kept processing it beside the next
/// owner, who claims it one lease later. It hears `on_lost` for that shard.
#[tokio::test]
async fn a_draining_shard_lost_with_an_entry_in_flight_is_reported_lost() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0, 1])]);
    publish(&store, 0, 1).await;
    let recorder = Arc::new(Recorder::default());
    let consumer = join("m1", &coordinator, &store, &sink, Arc::clone(&recorder) as Arc<dyn RebalanceListener>);
    wait_until("both readable", || consumer.status().readable == vec![0, 1]).await;
    let _held = poll_n(&consumer, 1).await;
    coordinator.with(|s| s.assigned.insert("m1".into(), vec![1]));
    wait_until("revoked", || recorder.calls().contains(&("revoked", vec![0]))).await;
    coordinator.with(|s| s.up = false);
    wait_until("lost", || recorder.calls().iter().any(|(kind, _)| *kind == "lost")).await;
    let lost: Vec<ShardId> =
        recorder.calls().into_iter().filter(|(kind, _)| *kind == "lost").flat_map(|(_, shards)| shards).collect();
    assert_eq!(lost, vec![0, 1], "the draining shard with an entry in flight is lost too, once");
}

#[tokio::test]
async fn fails_closed_at_lease_end_while_the_coordinator_is_unreachable_then_recovers() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    publish(&store, 0, 1).await;
    let consumer = join("m1", &coordinator, &store, &sink, Arc::new(NoopListener));
    wait_until("shard 0 readable", || consumer.status().readable == vec![0]).await;
    let delivery = poll_n(&consumer, 1).await.remove(0);
    coordinator.with(|s| s.up = false);
    let lease_end_ms = consumer.status().lease_end_ms.expect("a lease");
    wait_until("reads stop", || consumer.status().readable.is_empty()).await;
    assert!(consumer.shared.clock.now_ms() >= lease_end_ms, "not before the lease end");
    assert!(consumer.ack(&delivery).await.is_err(), "no ack after the lease");
    let reads_before = store.read_log().len();
    publish(&store, 0, 2).await;
    assert!(consumer.poll(10).await.expect("poll").is_empty());
    assert_eq!(store.read_log().len(), reads_before, "no store call after the lease ended");
    wait_until("heartbeats continue after the lease ended", || {
        sink.events().iter().any(|e| matches!(e, ClientEvent::HeartbeatFailed { at_ms, .. } if *at_ms >= lease_end_ms))
    })
    .await;
    // The coordinator comes back: a fresh grant, and the abandoned entry is redelivered.
    coordinator.with(|s| s.up = true);
    let got = poll_n(&consumer, 3).await;
    assert_eq!(got[0].entry.id, delivery.entry.id, "own pending entries come first");
}

#[tokio::test]
async fn a_new_owner_claims_what_the_previous_owner_never_acked() {
    let (store, coordinator, sink) = setup(&[("a", vec![0])]);
    publish(&store, 0, 2).await;
    let a = join("a", &coordinator, &store, &sink, Arc::new(NoopListener));
    wait_until("a reads", || a.status().readable == vec![0]).await;
    let unacked = poll_n(&a, 2).await;
    drop(a);
    coordinator.with(|s| {
        s.assigned.remove("a");
        s.assigned.insert("b".into(), vec![0]);
    });
    publish(&store, 0, 1).await;
    let b = join("b", &coordinator, &store, &sink, Arc::new(NoopListener));
    let got = poll_n(&b, 3).await;
    let ids: Vec<_> = got.iter().map(|d| d.entry.id).collect();
    assert_eq!(&ids[..2], &[unacked[0].entry.id, unacked[1].entry.id]);
    for delivery in &got {
        b.ack(delivery).await.expect("ack");
    }
    assert!(store.peek_pending("orders:0", "billing").is_empty());
}

#[tokio::test]
async fn close_waits_for_the_drain_then_leaves_with_every_shard_revoked() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0, 1])]);
    publish(&store, 0, 1).await;
    let consumer = Arc::new(join("m1", &coordinator, &store, &sink, Arc::new(NoopListener)));
    wait_until("both readable", || consumer.status().readable == vec![0, 1]).await;
    let delivery = poll_n(&consumer, 1).await.remove(0);
    let closing = tokio::spawn({
        let consumer = Arc::clone(&consumer);
        async move { consumer.close().await }
    });
    crate::time::sleep(Duration::from_millis(5 * INTERVAL_MS)).await;
    assert!(coordinator.with(|s| s.heartbeats.iter().all(|h| !h.leave)), "no leave while an entry is in flight");
    consumer.ack(&delivery).await.expect("ack while draining");
    closing.await.expect("close task").expect("clean close");
    let heartbeats = coordinator.with(|s| s.heartbeats.clone());
    let last = heartbeats.last().expect("heartbeats");
    assert!(last.leave && last.owned.is_empty());
    let revoked: Vec<ShardId> = last.revoking.iter().filter(|r| r.revoked).map(|r| r.shard).collect();
    assert_eq!(revoked, vec![0, 1], "the leave carries every shard's REVOKED report");
    assert!(
        heartbeats[..heartbeats.len() - 1].iter().all(|h| h.revoking.iter().all(|r| !r.revoked)),
        "no REVOKED before the leave while closing"
    );
    assert_eq!(consumer.status().phase, Phase::Left);
}

/// An application that puts a `timeout` around `close` while an entry is still in flight, then
/// drops the consumer: the close had taken the heartbeat task's handle out, so its cancellation
/// detached the task and `Drop` found nothing to abort. The task heartbeat as a closing member for
/// ever (nobody could settle the entry any more), holding the shard and the member id. A second
/// `close` returned `Ok` at once, before any leave.
#[tokio::test]
async fn a_cancelled_close_can_be_called_again_and_a_drop_after_it_stops_the_heartbeats() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0]), ("m2", vec![0])]);
    publish(&store, 0, 2).await;
    for member in ["m1", "m2"] {
        let consumer = join(member, &coordinator, &store, &sink, Arc::new(NoopListener));
        wait_until("shard 0 readable", || consumer.status().readable == vec![0]).await;
        let delivery = poll_n(&consumer, 1).await.remove(0);
        let cancelled = crate::time::timeout(Duration::from_millis(5 * INTERVAL_MS), consumer.close()).await;
        assert!(cancelled.is_err(), "the close waits for the entry in flight");
        let sent = |member: &str| coordinator.with(|s| s.heartbeats.iter().filter(|h| h.member_id == member).count());
        if member == "m1" {
            // Called again: it waits for the drain and the leave, as the first would have.
            consumer.ack(&delivery).await.expect("ack while closing");
            consumer.close().await.expect("clean close");
            let last = coordinator.with(|s| s.heartbeats.last().cloned()).expect("heartbeats");
            assert!(last.leave && last.member_id == "m1", "the second close returned after the leave");
            assert_eq!(consumer.close().await, Ok(()), "a close after the end returns its outcome");
        } else {
            drop(consumer);
            // The sink hears it (a metrics sink then drops the member's lease gauge, which read 0
            // for ever and kept a "lease about to end" alert firing); the clean close did not.
            let closed = |member: &str| {
                sink.events()
                    .iter()
                    .filter(|e| matches!(e, ClientEvent::Closed { member: m, .. } if m == member))
                    .count()
            };
            assert_eq!((closed("m1"), closed("m2")), (0, 1));
            crate::time::sleep(Duration::from_millis(2 * INTERVAL_MS)).await;
            let after_drop = sent(member);
            crate::time::sleep(Duration::from_millis(10 * INTERVAL_MS)).await;
            assert_eq!(sent(member), after_drop, "no heartbeat once the consumer is dropped");
        }
    }
}

/// Among one step's events, a shard revoked and then lost (its entries abandoned at a lease end)
/// is reported lost only, once however many entries were abandoned: `on_revoked` after `on_lost`
/// would tell the application to finish entries that can no longer be acked.
#[test]
fn a_shard_revoked_and_lost_in_one_step_is_reported_lost_once() {
    let member = "m1".to_string();
    let mut changes = ShardChanges::default();
    changes.note(&ClientEvent::ShardStopped {
        at_ms: 1,
        member: member.clone(),
        shard: 3,
        reason: StopReason::Revoked,
    });
    changes.note(&ClientEvent::ShardStopped {
        at_ms: 1,
        member: member.clone(),
        shard: 4,
        reason: StopReason::Revoked,
    });
    for seq in 0..3 {
        let entry = crate::store::EntryId { ms: 1, seq };
        let reason = StopReason::LeaseExpired;
        changes.note(&ClientEvent::EntryAbandoned { at_ms: 2, member: member.clone(), shard: 3, entry, reason });
    }
    assert_eq!(changes.lost, vec![3]);
    assert_eq!(changes.revoked_not_lost(), vec![4]);
}

/// A Kafka-style loop on `poll` with nothing readable yet, on a single-threaded runtime (tokio's
/// test default): `poll` returned without reaching an `.await`, so the loop never yielded and the
/// heartbeat task that would make the shard readable never ran.
#[cfg(not(madsim))]
#[tokio::test(flavor = "current_thread")]
async fn a_loop_on_poll_with_nothing_readable_lets_the_heartbeat_task_run() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    publish(&store, 0, 1).await;
    let consumer = join("m1", &coordinator, &store, &sink, Arc::new(NoopListener));
    let mut polls = 0;
    let delivered = loop {
        let delivered = consumer.poll(10).await.expect("poll");
        polls += 1;
        if !delivered.is_empty() || polls == 100_000 {
            break delivered;
        }
    };
    assert_eq!(delivered.len(), 1, "nothing delivered in {polls} polls: the heartbeat task never ran");
}

/// A transport that panics (the application's own transport implementation).
#[cfg(not(madsim))]
struct PanickingTransport;

#[cfg(not(madsim))]
impl CoordinatorTransport for PanickingTransport {
    async fn heartbeat(
        &self,
        _req: crate::core::protocol::HeartbeatRequest,
    ) -> Result<crate::core::protocol::HeartbeatResponse, crate::client::TransportError> {
        panic!("the application's transport panicked");
    }

    async fn routing(
        &self,
        _group: &GroupId,
        _report: crate::core::protocol::RoutingReport,
    ) -> Result<crate::core::protocol::RoutingResponse, crate::client::TransportError> {
        Err(crate::client::TransportError::Unreachable("no routing here".into()))
    }
}

/// A heartbeat task that ended by a panic sent no leave: `close` said `Ok` all the same.
#[cfg(not(madsim))]
#[tokio::test]
async fn close_reports_a_heartbeat_task_that_ended_abnormally() {
    let store = MemoryStore::new(7);
    let consumer = Consumer::join(config("m1"), PanickingTransport, store.connect());
    crate::time::sleep(Duration::from_millis(2 * INTERVAL_MS)).await;
    let closed = consumer.close().await;
    assert!(matches!(closed, Err(CloseError::HeartbeatTask(_))), "{closed:?}");
}

/// Member m1 reading shard 0, set up (claim and own-pending re-read done, one entry read and
/// acked), so every later read of it is one call.
async fn reading_shard_0() -> (MemoryStore, Arc<FakeCoordinator>, Arc<VecSink>, Arc<TestConsumer>) {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    let consumer = Arc::new(join("m1", &coordinator, &store, &sink, Arc::new(NoopListener)));
    wait_until("shard 0 readable", || consumer.status().readable == vec![0]).await;
    publish(&store, 0, 1).await;
    for delivery in poll_n(&consumer, 1).await {
        consumer.ack(&delivery).await.expect("ack");
    }
    (store, coordinator, sink, consumer)
}

/// `poll` is cancel-safe: an application that races it against a shutdown signal (`select!`,
/// `timeout`) drops it mid-read. Entries it had already read from one shard were in flight with no
/// one to settle them, so that shard never drained and `close` never sent the leave.
#[tokio::test]
async fn a_cancelled_poll_leaves_nothing_in_flight_and_close_still_leaves() {
    let (store, coordinator, sink, consumer) = reading_shard_0().await;
    publish(&store, 0, 2).await;
    coordinator.with(|s| {
        s.assigned.insert("m1".into(), vec![0, 1]);
    });
    wait_until("both readable", || consumer.status().readable == vec![0, 1]).await;
    store.set_latency_ms(60);
    // The shards are read concurrently: shard 0's read (one 60 ms call) delivers, while the new
    // shard 1 is still being set up (ensure group, claim, then read) when the poll is cancelled.
    let cancelled = crate::time::timeout(Duration::from_millis(90), consumer.poll(10)).await;
    assert!(cancelled.is_err(), "the poll was cancelled mid-read");
    store.set_latency_ms(0);
    let abandoned = sink.events().iter().filter(|e| matches!(e, ClientEvent::EntryAbandoned { .. })).count();
    assert_eq!(abandoned, 2, "the entries read before the cancel are given up, not left in flight");
    let closed = crate::time::timeout(Duration::from_secs(1), consumer.close()).await;
    closed.expect("close does not wait for entries nobody holds").expect("clean close");
    let last = coordinator.with(|s| s.heartbeats.last().cloned()).expect("heartbeats");
    assert!(last.leave);
}

/// A poll cancelled after its read ran at Redis but before the reply came back (a `timeout`
/// around `poll`): the entry the read made pending to this consumer never reached it. The next
/// poll re-reads the shard's own pending entries and delivers it, instead of the pending sweep
/// 30 s later (`ConsumerConfig::pending_sweep_interval_ms`).
#[tokio::test]
async fn the_entries_of_a_read_cancelled_in_flight_come_with_the_next_poll() {
    let (store, _coordinator, _sink, consumer) = reading_shard_0().await;
    publish(&store, 0, 1).await;
    // Half the latency before the store runs the read, half after: cancelled in between.
    store.set_latency_ms(100);
    let cancelled = crate::time::timeout(Duration::from_millis(75), consumer.poll(10)).await;
    assert!(cancelled.is_err(), "the poll was cancelled mid-read");
    store.set_latency_ms(0);
    let started = tokio::time::Instant::now();
    let again = poll_n(&consumer, 1).await;
    assert_eq!(again.len(), 1);
    assert!(started.elapsed() < Duration::from_secs(1), "redelivered by the next polls, not by the sweep");
}

#[tokio::test]
async fn a_poll_reads_its_shards_at_once_and_delivers_at_most_max() {
    for fenced in [false, true] {
        poll_reads_shards_at_once(fenced).await;
    }
}

/// The shards' reads of new entries are one store call: fenced, one `fenced_xreadgroup_many`
/// (which MemoryStore runs as one read per shard, at once); unfenced, one XREADGROUP naming both
/// streams, as the raw loops do (MemoryStore executes it in one step, so with latency jitter it
/// reads both streams at one instant, where two calls would not).
async fn poll_reads_shards_at_once(fenced: bool) {
    let (store, coordinator, sink) = setup(&[("m1", vec![0, 1])]);
    if fenced {
        coordinator.with(|s| {
            s.fences.insert(0, Fence { counter: 3, nonce: 0x30 });
            s.fences.insert(1, Fence { counter: 4, nonce: 0x40 });
        });
    }
    let consumer = join("m1", &coordinator, &store, &sink, Arc::new(NoopListener));
    wait_until("both readable", || consumer.status().readable == vec![0, 1]).await;
    publish(&store, 0, 1).await;
    publish(&store, 1, 1).await;
    for delivery in poll_n(&consumer, 2).await {
        consumer.ack(&delivery).await.expect("ack");
    }
    publish(&store, 0, 3).await;
    publish(&store, 1, 3).await;
    store.set_latency_ms(150);
    store.set_latency_jitter_ms(100);
    store.clear_logs();
    // Both shards in one 150 ms round, not one after the other (300 ms); `max` is split between
    // them. The margin is for a busy machine: these tests run in real time.
    let started = tokio::time::Instant::now();
    let polled = consumer.poll(4).await.expect("poll");
    let took = started.elapsed();
    store.set_latency_jitter_ms(0);
    let executed: Vec<(String, u64)> = store
        .read_log()
        .into_iter()
        .filter(|read| read.from == ReadSource::New && read.error.is_none())
        .map(|read| (read.stream, read.at_ms))
        .collect();
    assert_eq!(executed.len(), 2, "one read of each shard: {executed:?}");
    if !fenced {
        assert_eq!(executed[0].1, executed[1].1, "both shards read by one XREADGROUP: {executed:?}");
    }
    assert!(took < Duration::from_millis(270), "two shards read one after the other (fenced {fenced}): {took:?}");
    assert!(polled.iter().all(|d| d.fence.is_some() == fenced));
    let per_shard = |shard| polled.iter().filter(|d| d.shard == shard).count();
    assert_eq!((per_shard(0), per_shard(1)), (2, 2), "max 4 split over two shards");
    // Fewer entries wanted than shards readable: never more than `max` delivered.
    let one = consumer.poll(1).await.expect("poll");
    assert_eq!(one.len(), 1);
    store.set_latency_ms(0);
    consumer.ack_all(&polled).await.expect("ack");
    consumer.ack_all(&one).await.expect("ack");
}

/// A consumer reading shards 0 and 1 (one entry of each delivered and acked), after shard 1's
/// consumer group was destroyed and shard 0 got a second entry: its next multi-stream read is
/// refused (`NOGROUP`) as a whole.
async fn reading_two_shards_with_shard_1s_group_destroyed() -> (MemoryStore, Arc<FakeCoordinator>, TestConsumer) {
    let (store, coordinator, sink) = setup(&[("m1", vec![0, 1])]);
    let consumer = join("m1", &coordinator, &store, &sink, Arc::new(NoopListener));
    wait_until("both readable", || consumer.status().readable == vec![0, 1]).await;
    publish(&store, 0, 1).await;
    publish(&store, 1, 1).await;
    for delivery in poll_n(&consumer, 2).await {
        consumer.ack(&delivery).await.expect("ack");
    }
    assert!(store.destroy_consumer_group(&group().stream_key(1), &group().consumer_group));
    publish(&store, 0, 2).await;
    (store, coordinator, consumer)
}

/// One multi-stream XREADGROUP fails as a whole when one stream's group is gone (`NOGROUP`): the
/// shard at fault must not stop the others, so the consumer reads each shard alone then.
#[tokio::test]
async fn a_shard_whose_consumer_group_is_gone_does_not_stop_reads_of_the_others() {
    let (store, _coordinator, consumer) = reading_two_shards_with_shard_1s_group_destroyed().await;
    publish(&store, 1, 2).await;
    let polled = consumer.poll(10).await.expect("shard 0's entries are delivered despite shard 1");
    assert_eq!(polled.len(), 2, "{polled:?}");
    assert!(polled.iter().all(|d| d.shard == 0));
    consumer.ack_all(&polled).await.expect("ack");
}

/// The shard-by-shard reads after a refused multi-stream read are calls like any other: they go
/// only while the lease holds, re-checked right before them.
#[tokio::test]
async fn the_reads_after_a_refused_multi_stream_read_wait_for_nothing_once_the_lease_ended() {
    let (store, coordinator, consumer) = reading_two_shards_with_shard_1s_group_destroyed().await;
    // No more grants: the lease (400 ms) ends while the refused read (1 s round trip) is out.
    coordinator.with(|s| s.up = false);
    store.set_latency_ms(1_000);
    store.clear_logs();
    let polled = consumer.poll(10).await;
    store.set_latency_ms(0);
    let reads = store.read_log();
    assert!(!reads.is_empty() && reads.iter().all(|r| r.error.is_some()), "only the refused read went: {reads:?}");
    assert!(polled.map_or(true, |d| d.is_empty()));
}

/// The same, for a fence: a grant that a heartbeat answer fenced while the refused read was out
/// is not read again unfenced (hostile review L1); the next poll reads it through its fence.
#[tokio::test]
async fn the_reads_after_a_refused_multi_stream_read_skip_a_shard_fenced_meanwhile() {
    let (store, coordinator, consumer) = reading_two_shards_with_shard_1s_group_destroyed().await;
    // The refused read is out for 1 s; heartbeats (every 20 ms) bring the fence at 100 ms.
    store.set_latency_ms(1_000);
    store.clear_logs();
    let fence = crate::core::model::Fence { counter: 1, nonce: 7 };
    let fencing = {
        let coordinator = Arc::clone(&coordinator);
        tokio::spawn(async move {
            crate::time::sleep(Duration::from_millis(100)).await;
            coordinator.with(|s| s.fences.insert(0, fence));
        })
    };
    let _ = consumer.poll(10).await;
    fencing.await.expect("fenced");
    store.set_latency_ms(0);
    let reads = store.read_log();
    let unfenced_after: Vec<_> =
        reads.iter().filter(|r| r.stream == group().stream_key(0) && r.error.is_none() && r.fence.is_none()).collect();
    assert!(unfenced_after.is_empty(), "shard 0 was read unfenced after its grant was fenced: {reads:?}");
}

#[derive(Default)]
struct Recorder {
    calls: std::sync::Mutex<Vec<(&'static str, Vec<ShardId>)>>,
}

impl Recorder {
    fn calls(&self) -> Vec<(&'static str, Vec<ShardId>)> {
        self.calls.lock().expect("lock").clone()
    }
}

impl RebalanceListener for Recorder {
    fn on_assigned(&self, shards: &[ShardId]) {
        self.calls.lock().expect("lock").push(("assigned", shards.to_vec()));
    }
    fn on_revoked(&self, shards: &[ShardId]) {
        self.calls.lock().expect("lock").push(("revoked", shards.to_vec()));
    }
    fn on_lost(&self, shards: &[ShardId]) {
        self.calls.lock().expect("lock").push(("lost", shards.to_vec()));
    }
}

/// A listener that panics (the application's code: a `println!` to a closed pipe panics).
struct Panicking;

impl RebalanceListener for Panicking {
    fn on_assigned(&self, _shards: &[ShardId]) {
        panic!("the application's on_assigned panicked");
    }
    fn on_revoked(&self, _shards: &[ShardId]) {}
}

/// The listener runs on the heartbeat task: its panic ended the task without a word, after which
/// the consumer never heartbeat again (its lease ran out, `poll` returned nothing for ever) and
/// `close` returned `Ok` without sending the leave.
#[tokio::test]
async fn a_panicking_listener_does_not_stop_the_heartbeats() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    publish(&store, 0, 1).await;
    let consumer = join("m1", &coordinator, &store, &sink, Arc::new(Panicking));
    wait_until("shard 0 readable", || consumer.status().readable == vec![0]).await;
    let sent = coordinator.with(|s| s.heartbeats.len());
    crate::time::sleep(Duration::from_millis(LEASE_MS + 5 * INTERVAL_MS)).await;
    assert!(coordinator.with(|s| s.heartbeats.len()) > sent + 5, "heartbeats go on");
    let delivered = poll_n(&consumer, 1).await;
    consumer.ack(&delivered[0]).await.expect("ack under a lease still renewed");
    consumer.close().await.expect("close");
    assert!(coordinator.with(|s| s.heartbeats.last().is_some_and(|h| h.leave)), "the leave was sent");
}

#[tokio::test]
async fn the_rebalance_listener_hears_assigned_revoked_and_lost() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0, 1])]);
    let recorder = Arc::new(Recorder::default());
    let consumer = join("m1", &coordinator, &store, &sink, Arc::clone(&recorder) as Arc<dyn RebalanceListener>);
    wait_until("assigned", || !recorder.calls().is_empty()).await;
    coordinator.with(|s| s.assigned.insert("m1".into(), vec![1]));
    wait_until("revoked", || recorder.calls().len() >= 2).await;
    coordinator.with(|s| s.up = false);
    wait_until("lost", || recorder.calls().len() >= 3).await;
    assert_eq!(recorder.calls(), vec![("assigned", vec![0, 1]), ("revoked", vec![0]), ("lost", vec![1])]);
    drop(consumer);
}

#[tokio::test]
async fn pending_entries_trimmed_from_the_stream_are_not_delivered_again() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    publish(&store, 0, 2).await;
    let consumer = join("m1", &coordinator, &store, &sink, Arc::new(NoopListener));
    let abandoned = poll_n(&consumer, 2).await;
    // Lose the lease (abandoning both), trim them away, then get the shard back.
    coordinator.with(|s| s.up = false);
    wait_until("reads stop", || consumer.status().readable.is_empty()).await;
    store.xadd("orders:0", vec![("n".into(), b"new".to_vec())], Some(1)).await.expect("xadd with MAXLEN 1");
    coordinator.with(|s| s.up = true);
    let got = poll_n(&consumer, 1).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].entry.fields, vec![("n".to_string(), b"new".to_vec())]);
    assert!(abandoned.iter().all(|d| d.entry.id != got[0].entry.id));
    consumer.ack(&got[0]).await.expect("ack");
    assert!(store.peek_pending("orders:0", "billing").is_empty(), "trimmed entries left the pending list");
    assert!(consumer.poll(10).await.expect("poll").is_empty());
}

/// Joins `m1` on a clock with injectable suspensions, optionally with the planted stopping clock.
fn join_on(
    faults: &crate::client::clock::ClockFaults,
    planted: crate::core::planted::PlantedBugs,
    coordinator: &Arc<FakeCoordinator>,
    store: &MemoryStore,
    sink: &Arc<VecSink>,
) -> TestConsumer {
    let env = ClientEnv::new(Clock::with_faults(faults.clone()), Arc::clone(sink) as Arc<dyn EventSink>);
    let mut config = config("m1");
    config.planted = planted;
    Consumer::join_with(config, Arc::clone(coordinator), store.connect(), env, Arc::new(NoopListener))
}

/// Suspends the machine (as far as the clocks can tell) for ten leases while the coordinator is
/// unreachable, then returns how many store calls a poll and an ack made afterwards.
async fn store_calls_after_a_suspension(planted: crate::core::planted::PlantedBugs) -> (usize, Result<(), AckError>) {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    publish(&store, 0, 1).await;
    let faults = crate::client::clock::ClockFaults::new();
    let consumer = join_on(&faults, planted, &coordinator, &store, &sink);
    wait_until("shard 0 readable", || consumer.status().readable == vec![0]).await;
    let delivery = poll_n(&consumer, 1).await.remove(0);
    // No heartbeat can extend the lease from here on; the lease still runs (< 400 ms left).
    coordinator.with(|s| s.up = false);
    publish(&store, 0, 2).await;
    let (reads, acks) = (store.read_log().len(), store.ack_log().len());
    faults.suspended_for(Duration::from_millis(10 * LEASE_MS));
    let polled = consumer.poll(10).await.expect("poll");
    let acked = consumer.ack(&delivery).await;
    assert_eq!(polled.is_empty(), store.read_log().len() == reads);
    (store.read_log().len() - reads + store.ack_log().len() - acks, acked)
}

#[tokio::test]
async fn a_lease_that_ended_during_a_suspension_is_refused_before_the_next_read_and_ack() {
    let (calls, acked) = store_calls_after_a_suspension(crate::core::planted::PlantedBugs::NONE).await;
    assert_eq!(calls, 0, "no XREADGROUP, XAUTOCLAIM or XACK after the lease ended during the suspension");
    assert!(acked.is_err(), "the in-flight entry was abandoned at the lease end: {acked:?}");
}

/// The planted twin: measured on the clock that stops during the suspension, the lease seems to
/// run on, and the consumer reads and acks on a lease that ended long ago.
#[tokio::test]
async fn planted_lease_on_a_stopping_clock_reads_after_a_suspension() {
    let planted = crate::core::planted::PlantedBugs::only(PlantedBug::LeaseOnStoppingClock);
    let (calls, acked) = store_calls_after_a_suspension(planted).await;
    assert!(calls >= 2, "reads and the ack went to the store: {calls}");
    assert_eq!(acked, Ok(()));
}

#[tokio::test]
async fn ack_all_sends_one_xack_per_shard_and_settles_every_entry() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0, 1])]);
    publish(&store, 0, 3).await;
    publish(&store, 1, 2).await;
    let consumer = join("m1", &coordinator, &store, &sink, Arc::new(NoopListener));
    wait_until("both shards readable", || consumer.status().readable == vec![0, 1]).await;
    let mut got = poll_n(&consumer, 5).await;
    // A delivery listed twice is acked once.
    got.push(got[0].clone());
    consumer.ack_all(&got).await.expect("ack_all under the lease");
    let acks = store.ack_log();
    let per_stream: Vec<(&str, usize)> = acks.iter().map(|a| (a.stream.as_str(), a.ids.len())).collect();
    assert_eq!(acks.len(), 2, "one XACK per shard: {per_stream:?}");
    assert!(per_stream.contains(&("orders:0", 3)) && per_stream.contains(&("orders:1", 2)), "{per_stream:?}");
    let acked = sink.events().iter().filter(|e| matches!(e, ClientEvent::EntryAcked { .. })).count();
    assert_eq!(acked, 5, "each entry settled in the core once");
    assert!(matches!(consumer.ack_all(&got[..1]).await, Err(AckError::NotInFlight { .. })));
    assert_eq!(store.ack_log().len(), 2, "a refused batch sends nothing");
}

/// One delivery of a batch already acked (as after a batch whose XACK failed on one shard, acked
/// again as it was: the natural retry): the others are sent. The whole batch used to be refused
/// before anything was sent, so such a retry never acked the failed shard's entries, which stayed
/// in flight for ever and kept the shard from draining.
#[tokio::test]
async fn ack_all_sends_the_deliveries_that_pass_the_check_and_reports_the_first_that_does_not() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    publish(&store, 0, 3).await;
    let consumer = join("m1", &coordinator, &store, &sink, Arc::new(NoopListener));
    wait_until("shard 0 readable", || consumer.status().readable == vec![0]).await;
    let got = poll_n(&consumer, 3).await;
    consumer.ack(&got[1]).await.expect("single ack");
    let refused = consumer.ack_all(&got).await;
    assert_eq!(refused, Err(AckError::NotInFlight { shard: 0, entry: got[1].entry.id }));
    assert_eq!(store.ack_log().len(), 2, "the other two were sent together");
    assert_eq!(store.peek_pending("orders:0", "billing"), Vec::new());
}

#[tokio::test]
async fn ack_all_refused_as_fenced_loses_the_shard_and_keeps_the_other_shards_acks() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0, 1])]);
    let fence = crate::core::model::Fence { counter: 1, nonce: 11 };
    coordinator.with(|s| s.fences.insert(0, fence));
    publish(&store, 0, 2).await;
    publish(&store, 1, 2).await;
    let consumer = join("m1", &coordinator, &store, &sink, Arc::new(NoopListener));
    wait_until("both shards readable", || consumer.status().readable == vec![0, 1]).await;
    let got = poll_n(&consumer, 4).await;
    assert!(got.iter().filter(|d| d.shard == 0).all(|d| d.fence == Some(fence)));
    // A newer grant of shard 0 raises its fence at Redis.
    let key = crate::store::keys::fence_key(&group(), 0);
    store.raise_fences(&[crate::store::FenceRaise { key: key.clone(), nonce: 22, floor: 0 }]).await.expect("raise");
    let refused = consumer.ack_all(&got).await;
    assert!(matches!(refused, Err(AckError::Fenced { shard: 0, .. })), "{refused:?}");
    assert!(!consumer.status().readable.contains(&0), "shard 0 lost at once");
    let stopped = sink
        .events()
        .iter()
        .any(|e| matches!(e, ClientEvent::ShardStopped { shard: 0, reason: StopReason::FencedAtStore, .. }));
    assert!(stopped, "stopped as fenced at the store");
    // Shard 1's XACK went through; shard 0's entries stay pending for the next owner.
    assert_eq!(store.peek_pending("orders:1", "billing"), Vec::new());
    assert_eq!(store.peek_pending("orders:0", "billing").len(), 2);
    let shard0: Vec<Delivery> = got.iter().filter(|d| d.shard == 0).cloned().collect();
    assert!(matches!(consumer.ack_all(&shard0).await, Err(AckError::NotInFlight { shard: 0, .. })));
}

/// The error of a batch is the one that most needs acting on, not the lowest shard's: here shard 0
/// answers `NotInFlight` (one delivery acked already: nothing left in flight because of it) and
/// shard 1 is `FENCED` at Redis (the shard is lost). Reporting `NotInFlight` would tell an
/// application that retries until it sees a harmless error to stop, whatever else failed.
#[tokio::test]
async fn ack_all_reports_the_most_urgent_error_of_the_batch() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0, 1])]);
    let fence = crate::core::model::Fence { counter: 1, nonce: 11 };
    coordinator.with(|s| s.fences.insert(1, fence));
    publish(&store, 0, 2).await;
    publish(&store, 1, 1).await;
    let consumer = join("m1", &coordinator, &store, &sink, Arc::new(NoopListener));
    wait_until("both shards readable", || consumer.status().readable == vec![0, 1]).await;
    let got = poll_n(&consumer, 3).await;
    let acked = got.iter().find(|d| d.shard == 0).expect("a shard 0 delivery");
    consumer.ack(acked).await.expect("ack");
    let key = crate::store::keys::fence_key(&group(), 1);
    store.raise_fences(&[crate::store::FenceRaise { key, nonce: 22, floor: 0 }]).await.expect("raise");
    let refused = consumer.ack_all(&got).await;
    assert!(matches!(refused, Err(AckError::Fenced { shard: 1, .. })), "{refused:?}");
    assert_eq!(store.peek_pending("orders:0", "billing"), Vec::new(), "shard 0's other entry was acked");
}

#[tokio::test]
async fn poll_wait_sleeps_on_the_doorbell_and_wakes_when_an_entry_arrives() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    publish(&store, 0, 1).await;
    let consumer = join("m1", &coordinator, &store, &sink, Arc::new(NoopListener));
    wait_until("shard 0 readable", || consumer.status().readable == vec![0]).await;
    let first = poll_n(&consumer, 1).await;
    consumer.ack_all(&first).await.expect("ack");
    // Idle: one read of `>` and one doorbell wait, not a read every `poll_idle_ms`.
    let reads_before = store.read_log().len();
    let start = tokio::time::Instant::now();
    let idle = consumer.poll_wait(10, Duration::from_millis(300)).await.expect("poll_wait");
    assert!(idle.is_empty());
    assert!(start.elapsed() >= Duration::from_millis(300), "waited the whole time");
    assert_eq!(store.read_log().len() - reads_before, 1, "one read for a whole idle wait");
    // The next idle wait rings first and reads nothing at all.
    let idle = consumer.poll_wait(10, Duration::from_millis(100)).await.expect("poll_wait");
    assert!(idle.is_empty());
    assert_eq!(store.read_log().len() - reads_before, 1, "no read in a second idle wait");
    // An entry published during the wait wakes it well before its end.
    let publisher = {
        let store = store.connect();
        tokio::spawn(async move {
            crate::time::sleep(Duration::from_millis(100)).await;
            publish(&store, 0, 1).await;
        })
    };
    let start = tokio::time::Instant::now();
    let woken = consumer.poll_wait(10, Duration::from_secs(3)).await.expect("poll_wait");
    assert_eq!(woken.len(), 1);
    assert!(start.elapsed() < Duration::from_millis(1_000), "woken by the doorbell: {:?}", start.elapsed());
    publisher.await.expect("publisher");
}

/// The reads of one poll run concurrently and the poll returns when the slowest is done. An entry
/// one read took while the lease held must not be handed to the application if the lease ended
/// (here: a machine suspension) while another read of the same poll was still out: the shard was
/// stopped and its entries abandoned meanwhile, and its next owner may be processing them
/// (simulation `timed-out-reads` seed 10475: a claim held 5 s by a congested path handed out
/// entries read before a suspension, processed beside their new owner).
#[tokio::test]
async fn entries_read_before_the_lease_ended_are_not_handed_out_when_the_poll_returns_after_it() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    let faults = crate::client::clock::ClockFaults::new();
    let consumer = join_on(&faults, crate::core::planted::PlantedBugs::NONE, &coordinator, &store, &sink);
    wait_until("shard 0 readable", || consumer.status().readable == vec![0]).await;
    publish(&store, 0, 1).await;
    consumer.ack_all(&poll_n(&consumer, 1).await).await.expect("ack");
    // Shard 1 is granted: its first poll sets it up (three store calls in a row) while shard 0
    // is read with one call.
    coordinator.with(|s| s.assigned.insert("m1".into(), vec![0, 1]));
    wait_until("shard 1 readable", || consumer.status().readable == vec![0, 1]).await;
    publish(&store, 0, 3).await;
    let latency_ms = 200;
    store.set_latency_ms(latency_ms);
    let polling = {
        let consumer = Arc::new(consumer);
        let polling = tokio::spawn({
            let consumer = Arc::clone(&consumer);
            async move { consumer.poll(10).await }
        });
        // Shard 0's read is back (one latency); shard 1's setup is still out.
        crate::time::sleep(Duration::from_millis(latency_ms * 3 / 2)).await;
        coordinator.with(|s| s.up = false);
        faults.suspended_for(Duration::from_millis(10 * LEASE_MS));
        let polled = polling.await.expect("poll task");
        store.set_latency_ms(0);
        (consumer, polled)
    };
    let (consumer, polled) = polling;
    let polled = polled.expect("poll");
    assert!(polled.is_empty(), "entries handed out after the lease ended: {polled:?}");
    assert!(consumer.status().readable.is_empty(), "the lease ended: nothing is readable");
}

/// A permission check judges the lease on a time read once the core's lock is held: an ack that
/// read the clock, then waited for the lock while another holder kept it past the lease end (a
/// sink runs under it), sent its XACK to Redis after the lease (the time review's suspicion S2).
/// The heartbeat task is stopped so that only the ack can notice the lease end; real threads: the
/// test holds the lock while the ack waits for it on a worker.
#[cfg(not(madsim))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_that_waited_for_the_lock_judges_the_lease_on_the_time_after_the_wait() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    publish(&store, 0, 1).await;
    let consumer = Arc::new(join("m1", &coordinator, &store, &sink, Arc::new(NoopListener)));
    wait_until("shard 0 readable", || consumer.status().readable == vec![0]).await;
    let delivery = poll_n(&consumer, 1).await.remove(0);
    if let Some(heartbeats) = consumer.heartbeats.try_lock().expect("no close runs").as_ref() {
        heartbeats.abort();
    }
    let lease_end_ms = consumer.status().lease_end_ms.expect("a lease");
    let acked = {
        let held = consumer.shared.lock();
        let acking = Arc::clone(&consumer);
        // Starts while the lease holds (the clock is read at once), then waits for the lock.
        let ack = tokio::spawn(async move { acking.ack(&delivery).await });
        std::thread::sleep(Duration::from_millis(lease_end_ms.saturating_sub(consumer.shared.clock.now_ms()) + 100));
        drop(held);
        ack.await.expect("the ack task")
    };
    let refused = matches!(acked, Err(AckError::LeaseExpired { .. } | AckError::NotInFlight { .. }));
    assert!(refused, "refused after the lease: {acked:?}");
    assert!(store.ack_log().is_empty(), "no XACK reached Redis after the lease ended: {:?}", store.ack_log());
}

/// Two consumers built from one config (a reconnect loop that clones it) are two incarnations
/// with two sessions: the second presented the first's session at version 0, which the
/// coordinator refuses as a late copy of the departed incarnation's join, for good.
#[tokio::test]
async fn consumers_built_from_one_config_present_different_sessions() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    let config = config("m1");
    let sessions = |coordinator: &FakeCoordinator| -> Vec<_> {
        coordinator.with(|s| s.heartbeats.iter().filter_map(|h| h.member_session.clone()).collect())
    };
    let env = || ClientEnv::new(Clock::new(), Arc::clone(&sink) as Arc<dyn EventSink>);
    let first: TestConsumer =
        Consumer::join_with(config.clone(), Arc::clone(&coordinator), store.connect(), env(), Arc::new(NoopListener));
    wait_until("the first joined", || !sessions(&coordinator).is_empty()).await;
    first.close().await.expect("close");
    let first_session = sessions(&coordinator)[0].clone();
    assert_ne!(first_session, config.member_session, "not the config's either");
    let sent = sessions(&coordinator).len();
    let second: TestConsumer =
        Consumer::join_with(config, Arc::clone(&coordinator), store.connect(), env(), Arc::new(NoopListener));
    wait_until("the second joined", || sessions(&coordinator).len() > sent).await;
    let second_session = sessions(&coordinator)[sent].clone();
    assert_ne!(second_session, first_session);
    second.close().await.expect("close");
}

/// A sink that keeps every event and feeds a metrics sink, and that can be made to block in one
/// `LeaseExtended` until released (a slow sink, or the emitting thread preempted).
#[cfg(not(madsim))]
struct BlockingSink {
    events: VecSink,
    metrics: crate::client::events::MetricsSink,
    armed: std::sync::atomic::AtomicBool,
    entered: std::sync::atomic::AtomicBool,
    released: std::sync::atomic::AtomicBool,
}

#[cfg(not(madsim))]
impl EventSink for BlockingSink {
    fn emit(&self, event: ClientEvent) {
        use std::sync::atomic::Ordering::SeqCst;
        if matches!(event, ClientEvent::LeaseExtended { .. }) && self.armed.swap(false, SeqCst) {
            self.entered.store(true, SeqCst);
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !self.released.load(SeqCst) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.events.emit(event.clone());
        self.metrics.emit(event);
    }
}

/// The consumer is dropped while its heartbeat task, on another worker, is inside the sink (it
/// holds the core's lock there): the drop emitted `Closed` at once, and the heartbeat's
/// `LeaseExtended` reached the sink after it, recreating the member's lease series in a metrics
/// sink (it then read 0 for ever and kept a "lease ended" alert firing; review F6). `Closed` is
/// now the member's last event, and its series stays removed.
#[cfg(not(madsim))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_dropped_while_its_heartbeat_task_is_in_the_sink_hears_closed_last() {
    use std::sync::atomic::Ordering::SeqCst;
    let (store, coordinator, _) = setup(&[("m1", vec![0])]);
    let clock = Clock::new();
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let sink = Arc::new(BlockingSink {
        events: VecSink::new(),
        metrics: crate::client::events::MetricsSink::new(Arc::clone(&metrics), clock.clone()),
        armed: false.into(),
        entered: false.into(),
        released: false.into(),
    });
    let env = ClientEnv::new(clock, Arc::clone(&sink) as Arc<dyn EventSink>);
    let consumer: TestConsumer =
        Consumer::join_with(config("m1"), Arc::clone(&coordinator), store.connect(), env, Arc::new(NoopListener));
    wait_until("shard 0 readable", || consumer.status().readable == vec![0]).await;
    sink.armed.store(true, SeqCst);
    // From here on a worker is blocked in the sink, and tokio's timers may not fire until it
    // returns (the blocked worker may hold the time driver): the test waits on the thread.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !sink.entered.load(SeqCst) {
        assert!(std::time::Instant::now() < deadline, "the heartbeat task never emitted LeaseExtended");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (dropped, done) = std::sync::mpsc::channel();
    let dropping = std::thread::spawn(move || {
        drop(consumer);
        let _ = dropped.send(());
    });
    // Time for a drop that does not wait for the sink to emit `Closed` before the release.
    std::thread::sleep(Duration::from_millis(100));
    sink.released.store(true, SeqCst);
    // A drop that never hears the sink's call end (a lost signal) fails here instead of hanging.
    done.recv_timeout(Duration::from_secs(5)).expect("the drop returns once the sink's call ended");
    dropping.join().expect("the drop");
    crate::time::sleep(Duration::from_millis(5 * INTERVAL_MS)).await;
    let events = sink.events.events();
    let closed = events.iter().position(|e| matches!(e, ClientEvent::Closed { .. })).expect("Closed");
    assert_eq!(closed, events.len() - 1, "events after Closed: {:?}", &events[closed..]);
    let rendered = metrics.render();
    assert!(!rendered.contains("member=\"m1\""), "the lease series came back after Closed:\n{rendered}");
}

/// A listener whose `on_revoked` takes a while (a flush or a commit) and notes, as it returns,
/// whether the coordinator had already received the leave.
#[cfg(not(madsim))]
struct SlowOnRevoked {
    coordinator: Arc<FakeCoordinator>,
    leave_before_return: std::sync::Mutex<Vec<bool>>,
}

#[cfg(not(madsim))]
impl RebalanceListener for SlowOnRevoked {
    fn on_assigned(&self, _shards: &[ShardId]) {}
    fn on_revoked(&self, _shards: &[ShardId]) {
        std::thread::sleep(Duration::from_millis(5 * INTERVAL_MS));
        let left = self.coordinator.with(|s| s.heartbeats.iter().any(|h| h.leave));
        self.leave_before_return.lock().expect("lock").push(left);
    }
}

/// `close` ran `on_revoked` on the caller's task while the heartbeat task, on another worker, sent
/// the leave with the shard REVOKED: the next owner could start the shard while the application
/// still flushed it in `on_revoked` (review F3). The leave now waits for the callback, as the
/// coordinator's revokes do.
#[cfg(not(madsim))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_sends_the_leave_only_after_on_revoked_returned() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    let listener =
        Arc::new(SlowOnRevoked { coordinator: Arc::clone(&coordinator), leave_before_return: Default::default() });
    let consumer = join("m1", &coordinator, &store, &sink, Arc::clone(&listener) as Arc<dyn RebalanceListener>);
    wait_until("shard 0 readable", || consumer.status().readable == vec![0]).await;
    consumer.close().await.expect("clean close");
    assert_eq!(*listener.leave_before_return.lock().expect("lock"), vec![false], "the leave went during on_revoked");
    let last = coordinator.with(|s| s.heartbeats.last().cloned()).expect("heartbeats");
    assert!(last.leave && last.revoking.iter().all(|r| r.revoked), "{last:?}");
}

/// Publishes three entries to shard 0 (the only shard with entries), polls them, acks the first
/// and drops the others without an ack or an abandon (a `?` in a batch loop, a panicked task):
/// returns the consumer and the two leaked deliveries.
async fn leak_two_of_three(
    config: ConsumerConfig,
    coordinator: &Arc<FakeCoordinator>,
    store: &MemoryStore,
    sink: &Arc<VecSink>,
    listener: Arc<dyn RebalanceListener>,
) -> (TestConsumer, Vec<Delivery>) {
    publish(store, 0, 3).await;
    let env = ClientEnv::new(Clock::new(), Arc::clone(sink) as Arc<dyn EventSink>);
    let consumer = Consumer::join_with(config, Arc::clone(coordinator), store.connect(), env, listener);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "got only {} of 3 entries", got.len());
        got.extend(consumer.poll(3 - got.len()).await.expect("poll"));
        crate::time::sleep(Duration::from_millis(2)).await;
    }
    consumer.ack(&got[0]).await.expect("ack");
    let leaked = got.split_off(1);
    (consumer, leaked)
}

/// The ids of `deliveries`.
fn ids(deliveries: &[Delivery]) -> Vec<crate::store::EntryId> {
    deliveries.iter().map(|d| d.entry.id).collect()
}

/// Deliveries dropped unsettled stayed in flight for ever: the own-pending re-read and the
/// pending sweep skip entries in flight, so they were never delivered again while the consumer
/// kept the shard, and nothing showed them (review F2). They now show in the status, and once in
/// flight for `max_in_flight_ms` they are given up (`InFlightTimeout`) and delivered again.
#[tokio::test]
async fn deliveries_in_flight_for_max_in_flight_ms_are_given_up_and_delivered_again() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    let mut config = config("m1");
    config.max_in_flight_ms = LEASE_MS;
    let (consumer, leaked) = leak_two_of_three(config, &coordinator, &store, &sink, Arc::new(NoopListener)).await;
    let status = consumer.status();
    assert_eq!((status.in_flight, &status.in_flight_by_shard), (2, &BTreeMap::from([(0, 2)])));
    assert!(status.oldest_in_flight_age_ms.is_some_and(|age_ms| age_ms < LEASE_MS), "{status:?}");
    let again = poll_n(&consumer, 2).await;
    assert_eq!(ids(&again), ids(&leaked), "the leaked entries come again, and only they");
    let timed_out: Vec<_> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            ClientEvent::EntryAbandoned { entry, reason: StopReason::InFlightTimeout, .. } => Some(entry),
            _ => None,
        })
        .collect();
    assert_eq!(timed_out, ids(&leaked));
    consumer.ack_all(&again).await.expect("ack the new deliveries");
    assert_eq!(consumer.status().in_flight, 0);
    assert!(store.peek_pending("orders:0", "billing").is_empty());
}

/// A shard revoked while a dropped delivery of it is in flight: its drain waited for the entry
/// for ever, so the coordinator fenced the whole member after `rebalanceTimeoutMs` (review F2).
/// The entries are given up after `max_in_flight_ms`, the application hears `on_lost` (it may
/// still work on them), and the shard is reported REVOKED.
#[tokio::test]
async fn a_revoke_does_not_wait_for_a_dropped_delivery_past_max_in_flight_ms() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0, 1])]);
    let mut config = config("m1");
    config.max_in_flight_ms = LEASE_MS;
    let recorder = Arc::new(Recorder::default());
    let listener = Arc::clone(&recorder) as Arc<dyn RebalanceListener>;
    let (consumer, leaked) = leak_two_of_three(config, &coordinator, &store, &sink, listener).await;
    coordinator.with(|s| s.assigned.insert("m1".into(), vec![1]));
    let revoked =
        || coordinator.with(|s| s.heartbeats.iter().any(|h| h.revoking.iter().any(|r| r.shard == 0 && r.revoked)));
    wait_until("shard 0 reported REVOKED", revoked).await;
    assert_eq!(consumer.status().readable, vec![1], "shard 1 kept, member not fenced");
    assert_eq!(recorder.calls(), vec![("assigned", vec![0, 1]), ("revoked", vec![0]), ("lost", vec![0])]);
    let given_up: Vec<_> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            ClientEvent::EntryAbandoned { entry, reason: StopReason::DrainTimeout, .. } => Some(entry),
            _ => None,
        })
        .collect();
    assert_eq!(given_up, ids(&leaked));
}

/// An application that lost track of its deliveries gives them all up at once: `close` then
/// leaves at once instead of waiting for them until it times out without a leave (review F2).
#[tokio::test]
async fn abandon_in_flight_gives_up_lost_deliveries_and_close_leaves_at_once() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0, 1])]);
    let (consumer, leaked) = leak_two_of_three(config("m1"), &coordinator, &store, &sink, Arc::new(NoopListener)).await;
    publish(&store, 1, 1).await;
    let other = poll_n(&consumer, 1).await;
    assert_eq!(consumer.status().in_flight_by_shard, BTreeMap::from([(0, 2), (1, 1)]));
    assert_eq!(consumer.abandon_in_flight_of(1), 1);
    assert_eq!(consumer.ack(&other[0]).await, Err(AckError::NotInFlight { shard: 1, entry: other[0].entry.id }));
    assert_eq!(consumer.abandon_in_flight(), 2);
    assert_eq!(consumer.status().in_flight, 0);
    let abandoned = sink
        .events()
        .iter()
        .filter(|e| matches!(e, ClientEvent::EntryAbandoned { reason: StopReason::Application, .. }))
        .count();
    assert_eq!(abandoned, 3);
    let started = tokio::time::Instant::now();
    consumer.close().await.expect("clean close");
    assert!(started.elapsed() < Duration::from_secs(1), "close waited: {:?}", started.elapsed());
    assert!(coordinator.with(|s| s.heartbeats.last().is_some_and(|h| h.leave)));
    assert_eq!(store.peek_pending("orders:0", "billing").len(), leaked.len(), "still pending at Redis");
}

/// With the library's defaults (`max_in_flight_ms` 25 s, in simulated time): deliveries dropped
/// unsettled were never delivered again while the consumer kept their shard: the own-pending
/// re-read and the pending sweep skip entries in flight (review F2).
#[cfg(madsim)]
#[tokio::test]
async fn with_the_defaults_dropped_deliveries_come_again() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0])]);
    let (consumer, leaked) =
        leak_two_of_three(ConsumerConfig::new(group(), "m1"), &coordinator, &store, &sink, Arc::new(NoopListener))
            .await;
    // Past the pending sweep (30 s), which did not help.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    let mut again = Vec::new();
    while again.len() < leaked.len() && tokio::time::Instant::now() < deadline {
        again.extend(consumer.poll_wait(10, Duration::from_secs(1)).await.expect("poll"));
    }
    assert_eq!(ids(&again), ids(&leaked), "the dropped deliveries come again");
}

/// With the library's defaults (simulated time): a revoke of a shard with deliveries dropped
/// unsettled waited for them past the group's default `rebalanceTimeoutMs` (30 s), when the
/// coordinator fences the whole member and every shard it holds is lost (review F2).
#[cfg(madsim)]
#[tokio::test]
async fn with_the_defaults_a_shard_with_dropped_deliveries_is_revoked_within_the_rebalance_timeout() {
    const REBALANCE_TIMEOUT_MS: u64 = 30_000;
    let (store, coordinator, sink) = setup(&[("m1", vec![0, 1])]);
    let (_consumer, _leaked) =
        leak_two_of_three(ConsumerConfig::new(group(), "m1"), &coordinator, &store, &sink, Arc::new(NoopListener))
            .await;
    coordinator.with(|s| s.assigned.insert("m1".into(), vec![1]));
    let revoked =
        || coordinator.with(|s| s.heartbeats.iter().any(|h| h.revoking.iter().any(|r| r.shard == 0 && r.revoked)));
    // Less a second: the coordinator counts from the revoke, heard at the next heartbeat.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(REBALANCE_TIMEOUT_MS - 1_000);
    while !revoked() {
        assert!(tokio::time::Instant::now() < deadline, "shard 0 not REVOKED within the rebalance timeout");
        crate::time::sleep(Duration::from_millis(10)).await;
    }
}

/// With the library's defaults (simulated time): a `close` with deliveries dropped unsettled
/// waited for them until `close_timeout_ms` and gave up without a leave, leaving every shard to
/// wait out the member's TTL (review F2). It now leaves once they reach `max_in_flight_ms`.
#[cfg(madsim)]
#[tokio::test]
async fn with_the_defaults_close_leaves_despite_dropped_deliveries() {
    let (store, coordinator, sink) = setup(&[("m1", vec![0, 1])]);
    let (consumer, _leaked) =
        leak_two_of_three(ConsumerConfig::new(group(), "m1"), &coordinator, &store, &sink, Arc::new(NoopListener))
            .await;
    assert_eq!(consumer.close().await, Ok(()));
    let last = coordinator.with(|s| s.heartbeats.last().cloned()).expect("heartbeats");
    assert!(last.leave && last.revoking.iter().all(|r| r.revoked), "{last:?}");
}

/// "Read everything": `poll(usize::MAX)` asked Redis for a COUNT above i64::MAX, which Redis (and
/// the fake, since it mirrors that) refuses, so every read failed and the shard was never read;
/// with an entry in flight, the own-pending count `in_flight + max` overflowed (a panic in debug
/// builds). `poll_wait(n, Duration::MAX)` overflowed the clock and panicked in the application.
/// Now `max` is capped at `POLL_MAX` and the wait at a century (a numbers review).
#[tokio::test]
async fn polls_for_everything_and_waits_for_ever_read_and_wait() {
    let (store, _coordinator, _sink, consumer) = reading_shard_0().await;
    publish(&store, 0, 3).await;
    let held = consumer.poll(1).await.expect("one entry, held in flight");
    assert_eq!(held.len(), 1);
    let rest = consumer.poll(usize::MAX).await.expect("everything readable");
    assert_eq!(rest.len(), 2, "{rest:?}");
    publish(&store, 0, 1).await;
    let waited = crate::time::timeout(Duration::from_secs(5), consumer.poll_wait(usize::MAX, Duration::MAX))
        .await
        .expect("an entry is waiting")
        .expect("poll_wait");
    assert_eq!(waited.len(), 1);
}
