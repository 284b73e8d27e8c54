//! Story 2: a rolling update. Two coordinator processes on one Redis behind the clients' address
//! list; SIGTERM to the first while traffic flows.

use std::time::{Duration, Instant};

use crate::e2e_support::checks::shares_all;
use crate::e2e_support::fleet::{abandoned_entries, check_delivery, AppSettings, ConsumerApp, Fleet};
use crate::e2e_support::ground_truth::assert_no_split;
use crate::e2e_support::http_tap::{HttpTap, TapAnswer};
use crate::e2e_support::process::CoordinatorProcess;
use crate::e2e_support::{fast_config, group, wait_until};
use crate::support::RedisServer;
use rsc::client::events::{ClientEvent, StopReason};
use rsc::core::protocol::ErrorCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_update_drains_the_sigtermed_coordinator_and_clients_move_on_without_loss_or_split() {
    const SHARDS: u32 = 8;
    const MESSAGES: usize = 5_000;
    let started = Instant::now();
    let redis = RedisServer::start();
    let mut first = CoordinatorProcess::start(&redis.url(), "e2e-first").await;
    let second = CoordinatorProcess::start(&redis.url(), "e2e-second").await;
    // The taps are the clients' address list: they record every answer on the wire, including
    // the ones the clients' failover hides.
    let (tap_first, tap_second) = (HttpTap::start(first.addr()), HttpTap::start(second.addr()));
    let group = group("rolling");
    first.create_group(&group, SHARDS, &fast_config()).await;
    let fleet = Fleet::new(group.clone(), vec![tap_first.addr(), tap_second.addr()], redis.url());
    let apps = [
        fleet.consumer("c1", AppSettings::default()).await,
        fleet.consumer("c2", AppSettings::default()).await,
        fleet.consumer("c3", AppSettings::default()).await,
    ];
    let all: Vec<&ConsumerApp> = apps.iter().collect();
    wait_until("three consumers share the 8 shards", Duration::from_secs(15), || shares_all(&all, SHARDS)).await;

    let producer = fleet.producer("producer").await;
    let production = tokio::spawn(async move {
        producer.publish_paced(0..MESSAGES, 1_000).await;
        producer
    });
    let ledger = fleet.ledger.clone();
    wait_until("1,500 messages published", Duration::from_secs(20), || ledger.lock().produced.len() >= 1_500).await;
    let sigterm_at = std::time::Instant::now();
    first.sigterm();
    let status = first.wait_exit(Duration::from_secs(15)).await;
    let exited_at = std::time::Instant::now();
    let status = status.unwrap_or_else(|| panic!("the first coordinator did not exit:\n{}", first.log()));
    assert_eq!(status.code(), Some(0), "graceful shutdown exits 0:\n{}", first.log());
    let log = first.log();
    assert!(log.contains("shutting down") && log.contains("coordinator stopped"), "{log}");

    let _producer = production.await.expect("producer task");
    assert_eq!(ledger.lock().publish_failures, Vec::<String>::new(), "no publish failed");
    fleet.wait_all_acked(MESSAGES, Duration::from_secs(30)).await;
    wait_until("the consumers still share the 8 shards", Duration::from_secs(10), || shares_all(&all, SHARDS)).await;

    // On the wire: the only 5xx either coordinator ever answered is 503 COORDINATOR_TERMINATING.
    let (before_first, after_first) = (tap_first.answers(), tap_second.answers());
    assert_eq!(tap_first.parse_errors(), Vec::<String>::new());
    assert_eq!(tap_second.parse_errors(), Vec::<String>::new());
    for answer in before_first.iter().chain(&after_first) {
        if answer.status >= 500 {
            assert_eq!(
                (answer.status, answer.error_code().as_deref()),
                (503, Some("COORDINATOR_TERMINATING")),
                "{} answered {}",
                answer.request,
                String::from_utf8_lossy(&answer.body)
            );
        }
    }
    let heartbeats_ok =
        |answers: &[TapAnswer]| answers.iter().filter(|a| a.request.ends_with("/heartbeat") && a.status == 200).count();
    assert!(heartbeats_ok(&before_first) > 0, "the clients used the first coordinator before its shutdown");
    let moved: Vec<TapAnswer> = after_first.iter().filter(|a| a.at > exited_at).cloned().collect();
    assert!(heartbeats_ok(&moved) > 0, "the second coordinator took over the heartbeats");
    assert!(before_first.iter().all(|a| a.at <= exited_at), "nothing answered by an exited process");
    let refused = before_first.iter().filter(|a| a.status == 503).count();

    // What the clients saw: no error reached the libraries but COORDINATOR_TERMINATING, and no
    // consumer lost a shard (no lease ran out, nobody was fenced).
    let events = fleet.events();
    for event in &events {
        match event {
            ClientEvent::HeartbeatFailed { error, .. } | ClientEvent::RoutingRefreshFailed { error, .. } => {
                assert_eq!(error.code(), Some(ErrorCode::CoordinatorTerminating), "clients saw {error}");
            }
            ClientEvent::ShardStopped { reason, shard, member, .. } => {
                assert_eq!(*reason, StopReason::Revoked, "{member} lost shard {shard} during the update");
            }
            _ => {}
        }
    }
    assert_no_split(&fleet.reads);
    let summary = check_delivery(&ledger, &abandoned_entries(&events));
    for app in apps {
        app.close(Duration::from_secs(10)).await;
    }
    assert_eq!(second.describe(&group).await["metadata"]["members"], serde_json::json!({}));
    first.assert_no_error_logged();
    second.assert_no_error_logged();
    eprintln!(
        "rolling update: {summary}; first exited {:.0} ms after SIGTERM, answered {refused} x 503 meanwhile; \
         {} answers via the first, {} via the second; {:.1} s",
        exited_at.duration_since(sigterm_at).as_secs_f64() * 1000.0,
        before_first.len(),
        after_first.len(),
        started.elapsed().as_secs_f64()
    );
}
