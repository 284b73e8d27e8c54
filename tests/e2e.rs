//! End-to-end production tests: the real `coordinator` binary (a child process on a free port),
//! real `redis-server` processes (tests/support), and the real client libraries talking HTTP to
//! it. Each test is one story of the "Production deployment" issue:
//!
//! 1. a consumer crashes mid-run among three while 10,000 messages flow: nothing is lost, acked
//!    entries never come back, no shard is read by two consumers at once;
//! 2. a rolling update: two coordinators behind the clients' address list, SIGTERM to the first;
//! 3. real write loss: a failover to a replica that missed the latest metadata writes;
//! 4. least privilege: an ACL user without FLUSHDB/FLUSHALL works end to end, and a server with a
//!    command renamed away makes `coordinator serve` fail fast naming it;
//! 5. bad input over real HTTP writes nothing.
//!
//! Safety is checked against ground truth (`e2e_support::ground_truth`): every XREADGROUP and
//! XAUTOCLAIM each consumer issued, with its time span. Leases are short (assignment lease 1.5 s,
//! member TTL 2 s, heartbeat 200 ms), every wait is bounded, and every process is killed on drop.
//!
//! Run: `cargo nextest run --test e2e` (needs `redis-server` >= 6.2 on PATH). Real tokio; not
//! built under `--cfg madsim`.

#![cfg(not(madsim))]

mod e2e_support;
mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use e2e_support::fleet::{abandoned_entries, check_delivery, AppSettings, ConsumerApp, Fleet};
use e2e_support::ground_truth::assert_no_split;
use e2e_support::process::CoordinatorProcess;
use e2e_support::{fast_config, group, wait_until, wait_until_explained};
use rsc::client::events::ClientEvent;
use rsc::core::model::GroupId;
use support::RedisServer;

/// The consumers' readable shards are disjoint, cover `0..shards`, and each has at least one.
fn shares_all(apps: &[&ConsumerApp], shards: u32) -> bool {
    let mut seen = BTreeSet::new();
    for app in apps {
        let readable = app.status().readable;
        if readable.is_empty() || readable.iter().any(|s| !seen.insert(*s)) {
            return false;
        }
    }
    seen == (0..shards).collect()
}

/// `XPENDING <stream> <group>`'s count: entries delivered and never acked.
fn pending_count(redis: &RedisServer, group: &GroupId, shard: u32) -> i64 {
    let reply = redis.cmd(&["XPENDING", &group.stream_key(shard), &group.consumer_group]);
    match reply {
        redis::Value::Array(parts) => redis::from_redis_value(parts[0].clone()).expect("XPENDING count"),
        other => panic!("XPENDING: {other:?}"),
    }
}

#[test]
fn the_harness_checkers_can_fail() {
    e2e_support::ground_truth::self_check();
    e2e_support::http_tap::self_check();
}

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
    let crashed_at_ms = fleet.clock.now_ms();
    assert!(!held.is_empty(), "the victim crashed holding un-acked entries");

    let _producer = production.await.expect("producer task");
    assert_eq!(ledger.lock().publish_failures, Vec::<String>::new(), "no publish failed");
    assert_eq!(ledger.lock().produced.len(), MESSAGES);
    wait_until_explained(
        "every message acked",
        Duration::from_secs(30),
        || ledger.acked_distinct() >= MESSAGES,
        || fleet.explain(),
    )
    .await;
    wait_until("the survivors share the 8 shards", Duration::from_secs(10), || shares_all(&[&a, &b], SHARDS)).await;

    // Ground truth: no shard was read by two consumers at once, and each of the victim's shards
    // was taken over by a survivor (after its lease and member TTL ran out).
    assert_no_split(&fleet.reads);
    let tenures = fleet.reads.tenures();
    for shard in &victim_shards {
        let readers: Vec<&str> = tenures[&group.stream_key(*shard)].iter().map(|t| t.member.as_str()).collect();
        let after = readers.iter().skip_while(|m| **m != "victim").nth(1);
        assert!(after.is_some_and(|m| *m != "victim"), "shard {shard} was taken over after the crash: {readers:?}");
    }
    // Delivery: everything produced arrived with its payload, was acked, and only the entries the
    // victim held (or that a lease loss abandoned) came twice — each of those to a survivor.
    let events = fleet.events();
    let mut may_redeliver = held.clone();
    may_redeliver.extend(abandoned_entries(&events));
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
    eprintln!(
        "crash story: {summary}; victim held {} entries on shards {victim_shards:?}; {:.1} s",
        held.len(),
        started.elapsed().as_secs_f64()
    );
}
