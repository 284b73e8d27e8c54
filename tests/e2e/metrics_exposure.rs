//! What `/metrics` exposes (issue 9 part 4): by default no member id — `/metrics` is not
//! authenticated, and member ids are what a forged heartbeat needs — while the per-group
//! aggregates still cover member heartbeat age and revoking shards. With
//! `--metrics-member-labels` the per-member series come back (which also shows the default check
//! looks for the right thing).

use std::time::Duration;

use tokio::time::Instant;

use crate::e2e_support::process::{http, CoordinatorProcess, Listener};
use crate::e2e_support::{fast_config, group, join_json};
use crate::support::RedisServer;
use rsc::http::routes::{group_path, RouteId};

/// A member id no metric name, label or help text could contain by accident.
const MEMBER: &str = "member-7f3a9c";

/// Polls `/metrics` until it contains `needle`; returns that text. Panics after 10 s.
async fn metrics_once_they_contain(coordinator: &CoordinatorProcess, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = coordinator.metrics().await;
        if text.contains(needle) {
            return text;
        }
        assert!(Instant::now() < deadline, "/metrics never showed {needle}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_metrics_name_no_member_and_member_labels_are_opt_in() {
    let redis = RedisServer::start();
    let quiet = CoordinatorProcess::start(&redis.url(), "e2e-metrics-default").await;
    let group = group("metrics");
    quiet.create_group(&group, 4, &fast_config()).await;
    let path = group_path(RouteId::Heartbeat, &group);
    let json = [("Content-Type", "application/json")];
    let joined = http(quiet.addr(), "POST", &path, &json, join_json(&group, MEMBER).into_bytes()).await;
    assert_eq!(joined.expect("join answered").status, 200);

    // The tick exported the group's gauges after it saw the member (the age series is labelled by
    // group only), and heartbeats were counted: the text is not empty of what could leak.
    let series = format!("rsc_group_member_heartbeat_age_max_seconds{{group=\"{}\"}}", group);
    let text = metrics_once_they_contain(&quiet, &series).await;
    assert!(text.contains("rsc_group_revoking_shards{"), "{text}");
    assert!(text.contains("rsc_heartbeats_total{status=\"OK\"}"), "{text}");
    assert!(!text.contains(MEMBER), "the default /metrics names a member:\n{text}");
    assert!(!text.contains("member=\""), "the default /metrics has a member label:\n{text}");
    assert!(!text.contains("rsc_member_"), "{text}");

    quiet.assert_no_error_logged();
    let listener = Listener { args: vec!["--metrics-member-labels".into()], tls: None };
    let labelled = CoordinatorProcess::start_with_listener(&redis.url(), "e2e-metrics-members", "", listener).await;
    // Only the instance that ticks a quiet group exports its gauges (instances share ticks through
    // the tick roster): with the first instance gone, the second owns the group within
    // `ticker_silence_ms` (3 s).
    drop(quiet);
    let series = format!("rsc_member_heartbeat_age_seconds{{group=\"{group}\",member=\"{MEMBER}\"}}");
    let text = metrics_once_they_contain(&labelled, &series).await;
    assert!(text.contains(&format!("rsc_member_revoking_shards{{group=\"{group}\",member=\"{MEMBER}\"}}")), "{text}");
    labelled.assert_no_error_logged();
}
