//! Resharding under traffic: shards added through the admin CLI while the producer publishes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::e2e_support::checks::{pending_count, shares_all};
use crate::e2e_support::fleet::{abandoned_entries, check_delivery, AppSettings, Fleet};
use crate::e2e_support::ground_truth::assert_no_split;
use crate::e2e_support::process::CoordinatorProcess;
use crate::e2e_support::{fast_config, group, wait_until};
use crate::support::RedisServer;
use rsc::client::events::ClientEvent;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shards_added_under_traffic_reach_the_producer_within_a_routing_ttl_and_nothing_is_lost() {
    const MESSAGES: usize = 4_000;
    let started = Instant::now();
    let redis = RedisServer::start();
    let coordinator = CoordinatorProcess::start(&redis.url(), "e2e-reshard").await;
    let group = group("reshard");
    let config = fast_config();
    coordinator.create_group(&group, 4, &config).await;
    let fleet = Fleet::new(group.clone(), vec![coordinator.addr()], redis.url());
    let a = fleet.consumer("alpha", AppSettings::default()).await;
    let b = fleet.consumer("bravo", AppSettings::default()).await;
    wait_until("two consumers share 4 shards", Duration::from_secs(15), || shares_all(&[&a, &b], 4)).await;
    let producer = fleet.producer("producer").await;
    let production = tokio::spawn(async move {
        producer.publish_paced(0..MESSAGES, 1_000).await;
        producer
    });
    let ledger = fleet.ledger.clone();
    wait_until("1,000 messages published", Duration::from_secs(20), || ledger.lock().produced.len() >= 1_000).await;

    // The operator's path: describe for the revision, then add shards against it (a heartbeat
    // may write in between: then the CLI reports REVISION_CONFLICT and the operator retries).
    let (prefix, name) = (group.stream_prefix.as_str(), group.consumer_group.as_str());
    let mut resharded = None;
    for _ in 0..5 {
        let (status, described, stderr) = coordinator.admin(&["describe", "--prefix", prefix, "--group", name]).await;
        assert!(status.success(), "describe: {stderr}");
        let revision = serde_json::from_str::<serde_json::Value>(&described).expect("JSON")["storeRevision"]
            .as_u64()
            .expect("storeRevision")
            .to_string();
        let args =
            ["add-shards", "--prefix", prefix, "--group", name, "--expected-revision", &revision, "--shards", "8"];
        let asked_ms = fleet.clock.now_ms();
        let (status, stdout, stderr) = coordinator.admin(&args).await;
        if status.success() {
            let answer: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
            let version = answer["metadataVersion"].as_u64().expect("version");
            resharded = Some((asked_ms, fleet.clock.now_ms(), version));
            break;
        }
        assert!(stderr.contains("REVISION_CONFLICT"), "add-shards failed: {stderr}");
    }
    // The change was written between `asked_ms` and `resharded_ms`.
    let (asked_ms, resharded_ms, version) = resharded.expect("add-shards went through within 5 attempts");

    let _producer = production.await.expect("producer task");
    assert_eq!(ledger.lock().publish_failures, Vec::<String>::new(), "no publish failed");
    fleet.wait_all_acked(MESSAGES, Duration::from_secs(30)).await;
    wait_until("two consumers share 8 shards", Duration::from_secs(10), || shares_all(&[&a, &b], 8)).await;

    // The producer used the old shard count for at most one routing cache TTL after the change.
    let events = fleet.events();
    let publishes: Vec<(u64, u32, u64)> = events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::PublishOk { at_ms, shard, routing_version, .. } => Some((*at_ms, *shard, *routing_version)),
            _ => None,
        })
        .collect();
    let stale_until_ms = resharded_ms + config.routing_cache_ttl_ms;
    for (at_ms, shard, routing_version) in &publishes {
        if *at_ms > stale_until_ms {
            assert!(
                *routing_version >= version,
                "a publish at {at_ms} ms still used routing version {routing_version}"
            );
        }
        assert!(*at_ms >= asked_ms || *shard < 4, "shard {shard} used before it existed");
    }
    let first_new = publishes.iter().find(|(_, shard, _)| *shard >= 4).map(|(at_ms, _, _)| at_ms - asked_ms);
    let first_new = first_new.expect("messages went to the added shards");
    assert!(first_new <= config.routing_cache_ttl_ms, "first publish to an added shard {first_new} ms after it");
    let new_shards: BTreeSet<u32> = ledger.lock().produced.iter().map(|p| p.shard).filter(|s| *s >= 4).collect();
    assert_eq!(new_shards, (4..8).collect(), "every added shard got messages");

    assert_no_split(&fleet.reads);
    let summary = check_delivery(&ledger, &abandoned_entries(&events));
    for shard in 0..8 {
        assert_eq!(pending_count(&redis, &group, shard), 0, "shard {shard} has un-acked entries in Redis");
    }
    coordinator.assert_no_error_logged();
    eprintln!(
        "reshard 4 -> 8 under traffic: {summary}; first publish to an added shard {first_new} ms after the change; \
         {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
