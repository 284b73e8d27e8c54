//! Issue #14 on real Redis: a replica promotion loses an `add-shards` the producer already
//! publishes with. After the failover the producer's cached view still routes to the lost shards,
//! and Redis acknowledges those XADDs on the promoted replica. With healing on, the producer's
//! routing refresh reports the shard count it published with, the coordinator adds the shards
//! again, and the consumers receive every entry acknowledged after the failover. With healing off
//! (the behaviour before the fix), the entries on the lost shards are never delivered: the test
//! shows the damage it guards against.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::e2e_support::checks::{shares_all, try_stored_versions};
use crate::e2e_support::fleet::{AppSettings, Fleet};
use crate::e2e_support::ground_truth::assert_no_split;
use crate::e2e_support::process::CoordinatorProcess;
use crate::e2e_support::{fast_config, group, metric_total, wait_until, wait_until_explained};
use crate::support::{RedisServer, TcpProxy};
use rsc::core::model::GroupConfig;

const SHARDS: u32 = 2;
const ADDED: u32 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_add_shards_heals_from_the_producers_report_and_every_acknowledged_entry_is_consumed() {
    let stranded = lost_add_shards_story(true).await;
    assert_eq!(stranded, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_healing_off_the_entries_on_the_lost_shards_are_stranded() {
    let stranded = lost_add_shards_story(false).await;
    assert!(stranded > 0, "entries on the lost shards stay unread without the heal");
}

/// Returns how many entries acknowledged after the failover were never delivered.
async fn lost_add_shards_story(heal: bool) -> usize {
    let started = Instant::now();
    let primary = RedisServer::start();
    let (replica, link) = primary.start_replica_via_proxy();
    let front = TcpProxy::start(primary.port());
    let coordinator = CoordinatorProcess::start(&front.url(), "e2e-lost-add-shards").await;
    let group = group(if heal { "lost-add-shards" } else { "lost-add-shards-off" });
    let config = GroupConfig { heal_lost_add_shards: heal, ..fast_config() };
    coordinator.create_group(&group, SHARDS, &config).await;
    let fleet = Fleet::new(group.clone(), vec![coordinator.addr()], front.url());
    let a = fleet.consumer("alpha", AppSettings::default()).await;
    let b = fleet.consumer("bravo", AppSettings::default()).await;
    wait_until("two consumers share the shards", Duration::from_secs(15), || shares_all(&[&a, &b], SHARDS)).await;
    wait_until("the replica caught up", Duration::from_secs(10), || {
        try_stored_versions(&replica, &group) == try_stored_versions(&primary, &group)
    })
    .await;
    link.pause();
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The add-shards is recorded on the primary only; the producer learns it and publishes with it.
    let (prefix, name) = (group.stream_prefix.as_str(), group.consumer_group.as_str());
    let described = coordinator.describe(&group).await;
    let revision = described["storeRevision"].as_u64().expect("storeRevision").to_string();
    let shards = ADDED.to_string();
    let args =
        ["add-shards", "--prefix", prefix, "--group", name, "--expected-revision", &revision, "--shards", &shards];
    let (status, _, stderr) = coordinator.admin(&args).await;
    assert!(status.success(), "add-shards: {stderr}");
    let producer = fleet.producer("producer").await;
    wait_until("the producer routes with the added shards", Duration::from_secs(10), || {
        producer.routing().is_some_and(|r| r.shard_count == ADDED)
    })
    .await;
    let mut i = 0;
    while !fleet.ledger.lock().produced.iter().any(|p| p.shard >= SHARDS) {
        assert!(producer.publish(i).await, "publish before the failover");
        i += 1;
    }

    // Failover: the replica becomes the primary without the add-shards (and without the entries
    // just published: asynchronous replication loses them, which no coordinator can undo).
    replica.promote();
    front.set_target(replica.port());
    front.cut();
    tokio::time::sleep(Duration::from_millis(300)).await;
    {
        let mut ledger = fleet.ledger.lock();
        ledger.produced.clear();
        ledger.delivered.clear();
        ledger.acked.clear();
    }
    let cut = fleet.clock.now_ms();
    // Publish on: the cached view may still route to the lost shards until the next refresh.
    for n in 0..1_500 {
        producer.publish(i + n).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let published_ms = fleet.clock.now_ms() - cut;
    let produced: BTreeSet<(u32, rsc::store::EntryId)> =
        fleet.ledger.lock().produced.iter().map(|p| (p.shard, p.entry)).collect();
    let on_lost_shards = produced.iter().filter(|(shard, _)| *shard >= SHARDS).count();
    assert!(on_lost_shards > 0, "entries were acknowledged on the added shards after the failover");

    let undelivered = || {
        let delivered: BTreeSet<(u32, rsc::store::EntryId)> =
            fleet.ledger.lock().delivered.iter().map(|d| (d.shard, d.entry)).collect();
        produced.difference(&delivered).count()
    };
    let metrics = if heal {
        wait_until_explained(
            "every acknowledged entry delivered",
            Duration::from_secs(30),
            || undelivered() == 0,
            || fleet.explain(),
        )
        .await;
        let described = coordinator.describe(&group).await;
        assert_eq!(described["metadata"]["shardCount"].as_u64(), Some(u64::from(ADDED)), "{described}");
        let reason = described["metadata"]["resharding"].as_array().and_then(|r| r.last()).map(|r| r["reason"].clone());
        assert_eq!(reason, Some(serde_json::json!("recovered-lost-add-shards")), "{described}");
        let metrics = coordinator.metrics().await;
        assert!(metric_total(&metrics, "rsc_lost_add_shards_healed_total") >= 1.0, "{metrics}");
        metrics
    } else {
        // Everything on the recorded shards arrives; what is on the lost ones never does.
        wait_until("the recorded shards are drained", Duration::from_secs(30), || {
            let delivered: BTreeSet<(u32, rsc::store::EntryId)> =
                fleet.ledger.lock().delivered.iter().map(|d| (d.shard, d.entry)).collect();
            produced.iter().filter(|(shard, _)| *shard < SHARDS).all(|e| delivered.contains(e))
        })
        .await;
        tokio::time::sleep(Duration::from_millis(u64::from(SHARDS) * config.routing_cache_ttl_ms)).await;
        let described = coordinator.describe(&group).await;
        assert_eq!(described["metadata"]["shardCount"].as_u64(), Some(u64::from(SHARDS)), "{described}");
        coordinator.metrics().await
    };
    let stranded = undelivered();
    assert_no_split(&fleet.reads);
    coordinator.assert_no_error_logged();
    eprintln!(
        "lost add-shards (heal {heal}): {} entries acknowledged in {} ms after the failover ({on_lost_shards} on the \
         lost shards), {stranded} never delivered; healed {} times; {:.1} s",
        produced.len(),
        published_ms,
        metric_total(&metrics, "rsc_lost_add_shards_healed_total") as u64,
        started.elapsed().as_secs_f64()
    );
    drop((a, b, producer));
    stranded
}
