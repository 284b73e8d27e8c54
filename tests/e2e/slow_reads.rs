//! A read still on its way to Redis when its shard is revoked. One consumer's path to Redis is
//! slow for two shards (each XREADGROUP there reaches Redis a second after it was issued); a
//! second consumer joins and takes those two shards over.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::e2e_support::checks::{pending_count, shares_all};
use crate::e2e_support::faults::SlowPath;
use crate::e2e_support::fleet::{abandoned_entries, check_delivery, AppSettings, Fleet};
use crate::e2e_support::ground_truth::assert_no_split;
use crate::e2e_support::process::CoordinatorProcess;
use crate::e2e_support::{fast_config, group, wait_until};
use crate::support::RedisServer;
use rsc::client::events::{ClientEvent, StopReason};

/// The bug this guards against (it failed before the consumer waited for its reads): a consumer
/// that reports a revoked shard REVOKED as soon as it holds no delivered-but-unacked entry, even
/// while an XREADGROUP it issued on that shard is still on its way. The coordinator then grants
/// the shard to the next owner, which claims and reads it; the old owner's read executes
/// afterwards (two readers on one shard), and whatever it takes lands in the old owner's pending
/// list after the new owner's claim, where nobody looks again.
///
/// The run must show the race happened: alpha was told to stop reading shard 2 or 3 while one
/// of its slow reads there was still on its way; a run where the timing missed it fails as
/// inconclusive instead of passing without testing anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_in_flight_when_its_shard_is_revoked_is_not_overtaken_by_the_next_owner() {
    const SHARDS: u32 = 4;
    const MESSAGES: usize = 2_000;
    let started = Instant::now();
    let redis = RedisServer::start();
    let coordinator = CoordinatorProcess::start(&redis.url(), "e2e-slow").await;
    let group = group("slow");
    coordinator.create_group(&group, SHARDS, &fast_config()).await;
    let fleet = Fleet::new(group.clone(), vec![coordinator.addr()], redis.url());
    // The events' clock (ms) against the read log's (Instant), to place a revoke among reads.
    let clock_origin = (Instant::now(), fleet.clock.now_ms());

    // Alpha alone owns every shard; its reads of shards 2 and 3 take a second to reach Redis.
    // The sticky assignor gives a newcomer the last two shards, so those are the ones revoked.
    let slow: BTreeSet<String> = [2, 3].iter().map(|s| group.stream_key(*s)).collect();
    let path = SlowPath::new(fleet.store().await, slow.clone(), Duration::from_millis(1_000));
    let slow_started = path.slow_started();
    let a = fleet.consumer_on("alpha", AppSettings::default(), path).await;
    wait_until("alpha reads every shard", Duration::from_secs(10), || shares_all(&[&a], SHARDS)).await;
    let producer = fleet.producer("producer").await;
    let production = tokio::spawn(async move {
        producer.publish_paced(0..MESSAGES, 500).await;
        producer
    });
    let ledger = fleet.ledger.clone();
    wait_until("500 messages published", Duration::from_secs(20), || ledger.lock().produced.len() >= 500).await;

    // Bravo joins right after one of alpha's slow reads was issued.
    let before = slow_started.load(Ordering::SeqCst);
    wait_until("a new slow read", Duration::from_secs(5), || slow_started.load(Ordering::SeqCst) > before).await;
    let b = fleet.consumer("bravo", AppSettings::default()).await;
    wait_until("two consumers share the shards", Duration::from_secs(15), || shares_all(&[&a, &b], SHARDS)).await;
    let _producer = production.await.expect("producer task");
    assert_eq!(ledger.lock().publish_failures, Vec::<String>::new(), "no publish failed");
    assert_eq!(ledger.lock().produced.len(), MESSAGES, "every message was published");
    fleet.wait_all_acked(MESSAGES, Duration::from_secs(10)).await;
    let stranded: Vec<(u32, i64)> =
        (0..SHARDS).map(|s| (s, pending_count(&redis, &group, s))).filter(|(_, n)| *n > 0).collect();

    // Ground truth: no read of alpha's on shard 2 or 3 may still be under way once bravo reads
    // there, and nothing may be left pending (a late read moves entries into alpha's pending
    // list after bravo claimed it, where nobody ever looks again).
    assert_no_split(&fleet.reads);
    assert_eq!(stranded, Vec::<(u32, i64)>::new(), "entries left pending in Redis (shard, count)");
    let events = fleet.events();
    let summary = check_delivery(&ledger, &abandoned_entries(&events));

    // The race happened: alpha stopped a slow shard (the revoke reached it) while one of its reads
    // there was on its way, by a margin well above the two clocks' 1 ms of disagreement.
    let margin = Duration::from_millis(20);
    let reads = fleet.reads.calls();
    let raced: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::ShardStopped { member, shard, reason: StopReason::Revoked, at_ms } if member == "alpha" => {
                Some((
                    group.stream_key(*shard),
                    clock_origin.0 + Duration::from_millis(at_ms.saturating_sub(clock_origin.1)),
                ))
            }
            _ => None,
        })
        .filter(|(stream, _)| slow.contains(stream))
        .filter_map(|(stream, stopped)| {
            let open = reads.iter().find(|r| {
                r.member == "alpha" && r.stream == stream && r.start + margin < stopped && stopped + margin < r.end
            })?;
            Some(format!(
                "{stream} stopped at {:.0} ms inside alpha's read [{:.0}..{:.0} ms]",
                fleet.reads.ms(stopped),
                fleet.reads.ms(open.start),
                fleet.reads.ms(open.end)
            ))
        })
        .collect();
    assert!(
        !raced.is_empty(),
        "inconclusive: no revoke of shard 2 or 3 reached alpha while a slow read there was on its way:\n{}",
        fleet.reads.describe_tenures()
    );
    coordinator.assert_no_error_logged();
    eprintln!("slow reads at revoke: {raced:?}; {summary}; {:.1} s", started.elapsed().as_secs_f64());
}
