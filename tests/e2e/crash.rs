//! Story 1: the coordinator binary, three consumers and a producer; 10,000 messages over 8
//! shards; one consumer crashes mid-run (dropped without `close`, holding un-acked entries).

use std::time::{Duration, Instant};

use crate::e2e_support::checks::{pending_count, shares_all};
use crate::e2e_support::fleet::{check_delivery, AppSettings, Fleet};
use crate::e2e_support::ground_truth::assert_no_split;
use crate::e2e_support::process::CoordinatorProcess;
use crate::e2e_support::{fast_config, group, wait_until};
use crate::support::RedisServer;
use rsc::client::events::{ClientEvent, StopReason};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_crash_mid_run_loses_nothing_redelivers_only_its_unacked_entries_and_never_splits() {
    const SHARDS: u32 = 8;
    const MESSAGES: usize = 10_000;
    let started = Instant::now();
    let redis = RedisServer::start();
    let coordinator = CoordinatorProcess::start(&redis.url(), "e2e-crash").await;
    let group = group("crash");
    coordinator.create_group(&group, SHARDS, &fast_config()).await;
    let fleet = Fleet::new(group.clone(), vec![coordinator.addr()], redis.url());

    let a = fleet.consumer("alpha", AppSettings::default()).await;
    let b = fleet.consumer("bravo", AppSettings::default()).await;
    let victim = fleet.consumer("victim", AppSettings { batch: 50, process_ms: 100 }).await;
    wait_until("three consumers share the 8 shards", Duration::from_secs(15), || {
        shares_all(&[&a, &b, &victim], SHARDS)
    })
    .await;

    let producer = fleet.producer("producer").await;
    let production = tokio::spawn(async move {
        producer.publish_paced(0..MESSAGES, 2_500).await;
        producer
    });
    let ledger = fleet.ledger.clone();
    wait_until("3,000 messages published", Duration::from_secs(20), || ledger.lock().produced.len() >= 3_000).await;
    let victim_shards = victim.status().readable;
    let held = victim.crash_holding_entries(Duration::from_secs(5)).await;
    let crashed = Instant::now();
    let crashed_at_ms = fleet.clock.now_ms();
    assert!(!held.is_empty(), "the victim crashed holding un-acked entries");

    let _producer = production.await.expect("producer task");
    assert_eq!(ledger.lock().publish_failures, Vec::<String>::new(), "no publish failed");
    assert_eq!(ledger.lock().produced.len(), MESSAGES);
    fleet.wait_all_acked(MESSAGES, Duration::from_secs(30)).await;
    wait_until("the survivors share the 8 shards", Duration::from_secs(10), || shares_all(&[&a, &b], SHARDS)).await;

    // Ground truth: no shard was read by two consumers at once, and each of the victim's shards
    // was taken over by a survivor after the crash (after its lease and member TTL ran out).
    assert_no_split(&fleet.reads);
    let tenures = fleet.reads.tenures();
    for shard in &victim_shards {
        let stream = &tenures[&group.stream_key(*shard)];
        let took_over = stream.iter().any(|t| t.member != "victim" && t.first_start >= crashed);
        assert!(took_over, "shard {shard} was taken over after the crash:\n{}", fleet.reads.describe_tenures());
    }
    // The survivors only ever gave shards up when the coordinator revoked them (no lease ran out,
    // nobody was fenced), so they abandoned nothing: only the entries the victim held may come
    // twice — each of those to a survivor. (The victim's own events, those its dropped consumer
    // emits included, are not the survivors' concern.)
    let events = fleet.events();
    for event in &events {
        match event {
            ClientEvent::ShardStopped { member, .. } | ClientEvent::EntryAbandoned { member, .. }
                if member == "victim" => {}
            ClientEvent::ShardStopped { reason, shard, member, .. } => {
                assert_eq!(*reason, StopReason::Revoked, "{member} lost shard {shard}");
            }
            ClientEvent::EntryAbandoned { member, shard, entry, reason, .. } => {
                panic!("{member} abandoned entry {entry:?} of shard {shard} ({reason:?})")
            }
            _ => {}
        }
    }
    // Delivery: everything produced arrived with its payload and was acked.
    let may_redeliver = held.clone();
    let summary = check_delivery(&ledger, &may_redeliver);
    {
        let inner = ledger.lock();
        for entry in &held {
            let again = inner.delivered.iter().any(|d| (d.shard, d.entry) == *entry && d.member != "victim");
            assert!(again, "entry {entry:?} held by the crashed consumer was redelivered to a survivor");
        }
        assert_eq!(inner.ack_failures, Vec::<String>::new(), "no ack was refused");
    }
    for shard in 0..SHARDS {
        assert_eq!(pending_count(&redis, &group, shard), 0, "shard {shard} has un-acked entries in Redis");
    }
    let late_heartbeats = events.iter().any(|e| {
        matches!(e, ClientEvent::HeartbeatSent { member, at_ms, .. } if member == "victim" && *at_ms > crashed_at_ms)
    });
    assert!(!late_heartbeats, "a crashed consumer sends nothing");
    let described = coordinator.describe(&group).await;
    let members: Vec<&String> = described["metadata"]["members"].as_object().expect("members").keys().collect();
    assert_eq!(members, ["alpha", "bravo"], "the crashed member expired");

    // Clean leave of the survivors: the group ends empty.
    a.close(Duration::from_secs(10)).await;
    b.close(Duration::from_secs(10)).await;
    let described = coordinator.describe(&group).await;
    assert_eq!(described["metadata"]["members"], serde_json::json!({}), "{described}");
    coordinator.assert_no_error_logged();
    eprintln!(
        "crash story: {summary}; victim held {} entries on shards {victim_shards:?}; {:.1} s",
        held.len(),
        started.elapsed().as_secs_f64()
    );
}
