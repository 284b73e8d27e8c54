//! Story 3: real write loss. A join and its rebalance are recorded on a primary whose replication
//! link is paused; the replica is promoted without them.

use std::time::{Duration, Instant};

use crate::e2e_support::checks::{settled, shares_all, stored_versions, try_stored_versions};
use crate::e2e_support::fleet::{AppSettings, Fleet};
use crate::e2e_support::ground_truth::assert_no_split;
use crate::e2e_support::process::CoordinatorProcess;
use crate::e2e_support::{fast_config, group, metric_total, wait_until};
use crate::support::{RedisServer, TcpProxy};
use rsc::client::events::ClientEvent;
use rsc::core::protocol::{ErrorCode, HeartbeatStatus};

/// How the coordinator follows the failover in [`lost_writes_story`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Follow {
    /// It dials the same address, which is re-pointed at the promoted replica (its connections
    /// break, and it sees the server identity change).
    Proxy,
    /// It is killed and a new process starts on the promoted replica: it never saw the old
    /// identity, so the clients' versions are the only evidence of the loss.
    Restart,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metadata_writes_lost_in_a_failover_drive_a_correction_round_and_consumers_converge_without_a_split() {
    lost_writes_story(Follow::Proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_coordinator_restarted_on_the_promoted_replica_learns_the_loss_from_client_versions_alone() {
    lost_writes_story(Follow::Restart).await;
}

/// A join and its rebalance are written while replication is paused; the replica is promoted
/// without them. The consumers must be told SYNC_METADATA, get no OK for a full assignment lease,
/// end on a version past every one they saw, and never read a shard two at a time.
async fn lost_writes_story(follow: Follow) {
    const SHARDS: u32 = 8;
    let started = Instant::now();
    let primary = RedisServer::start();
    let (replica, link) = primary.start_replica_via_proxy();
    // The clients' stream connections (and, with `Follow::Proxy`, the coordinator) dial one
    // address that the failover re-points at the promoted replica.
    let front = TcpProxy::start(primary.port());
    let coordinator_url = if follow == Follow::Proxy { front.url() } else { primary.url() };
    let mut coordinator = CoordinatorProcess::start(&coordinator_url, "e2e-failover").await;
    let group = group(&format!("failover-{follow:?}").to_lowercase());
    let lease_ms = fast_config().assignment_lease_ms;
    coordinator.create_group(&group, SHARDS, &fast_config()).await;
    for shard in 0..SHARDS {
        for i in 0..20 {
            primary.cmd(&["XADD", &group.stream_key(shard), "*", "payload", &format!("seed-{shard}-{i}")]);
        }
    }
    let fleet = Fleet::new(group.clone(), vec![coordinator.addr()], front.url());
    let a = fleet.consumer("alpha", AppSettings::default()).await;
    let b = fleet.consumer("bravo", AppSettings::default()).await;
    wait_until("two consumers share the 8 shards", Duration::from_secs(15), || shares_all(&[&a, &b], SHARDS)).await;
    // The replica has everything recorded so far (`WAIT` cannot tell: it only covers the writes
    // of its own connection, and the harness opens a fresh one per command).
    wait_until("the replica caught up", Duration::from_secs(10), || {
        try_stored_versions(&replica, &group) == try_stored_versions(&primary, &group)
    })
    .await;
    // From here on the replica gets nothing. Bytes already forwarded may still be applied for a
    // moment, so its state is read after a pause of our own.
    link.pause();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (replicated_revision, replicated_version) = stored_versions(&replica, &group);

    // A join and its rebalance, recorded on the primary only.
    let c = fleet.consumer("charlie", AppSettings::default()).await;
    wait_until("three consumers share the 8 shards", Duration::from_secs(15), || shares_all(&[&a, &b, &c], SHARDS))
        .await;
    let reads = fleet.reads.clone();
    wait_until("charlie reads", Duration::from_secs(5), || reads.calls().iter().any(|r| r.member == "charlie")).await;
    let (primary_revision, primary_version) = stored_versions(&primary, &group);
    assert_eq!(stored_versions(&replica, &group), (replicated_revision, replicated_version), "replication paused");
    assert!(
        primary_revision > replicated_revision && primary_version > replicated_version,
        "the primary recorded more: revision {primary_revision} vs {replicated_revision}, version {primary_version} \
         vs {replicated_version}"
    );
    let seen_version = fleet.highest_version_seen();
    assert!(seen_version > replicated_version, "clients saw versions the replica never got");

    // Failover: the replica becomes the primary without those writes.
    replica.promote();
    front.set_target(replica.port());
    front.cut();
    let cut_ms = fleet.clock.now_ms();
    if follow == Follow::Restart {
        coordinator.restart(&replica.url()).await;
    }

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = coordinator.try_describe(&group).await;
        let described = if answer.status == 200 { answer.json() } else { serde_json::Value::Null };
        if settled(&described, &["alpha", "bravo", "charlie"], SHARDS) && shares_all(&[&a, &b, &c], SHARDS) {
            break;
        }
        let body = String::from_utf8_lossy(&answer.body);
        assert!(Instant::now() < deadline, "no convergence after the failover: {body}\n{}", fleet.explain());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The coordinator saw the evidence: a new server identity and clients ahead of the store.
    let metrics = coordinator.metrics().await;
    let identity_changes = metric_total(&metrics, "rsc_store_identity_changes_total");
    match follow {
        Follow::Proxy => assert!(identity_changes >= 1.0, "{metrics}"),
        Follow::Restart => assert_eq!(identity_changes, 0.0, "a fresh process has no identity to compare"),
    }
    assert!(metric_total(&metrics, "rsc_client_metadata_version_ahead_total") >= 1.0, "{metrics}");
    let events = fleet.events();
    let after_cut = |e: &&ClientEvent| e.at_ms() > cut_ms;
    for member in ["alpha", "bravo"] {
        let synced = events.iter().filter(after_cut).any(|e| {
            matches!(e, ClientEvent::HeartbeatAnswered { member: m, status: HeartbeatStatus::SyncMetadata, .. } if m == member)
        });
        assert!(synced, "{member} received SYNC_METADATA");
    }
    let charlie_unknown = events.iter().filter(after_cut).any(|e| {
        matches!(e, ClientEvent::HeartbeatFailed { member, error, .. }
            if member == "charlie" && error.code() == Some(ErrorCode::UnknownMember))
    });
    assert!(charlie_unknown, "the member that joined in the lost history is unknown to the store and rejoins");
    // No OK until one full assignment lease after the evidence (which came after the cut).
    for event in &events {
        if let ClientEvent::HeartbeatAnswered { status: HeartbeatStatus::Ok, sent_at_ms, at_ms, member, .. } = event {
            if *sent_at_ms > cut_ms {
                assert!(*at_ms >= cut_ms + lease_ms, "{member} got OK {} ms after the failover", at_ms - cut_ms);
            }
        }
    }
    let first_ok_ms = events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::HeartbeatAnswered { status: HeartbeatStatus::Ok, sent_at_ms, at_ms, .. }
                if *sent_at_ms > cut_ms =>
            {
                Some(at_ms - cut_ms)
            }
            _ => None,
        })
        .min()
        .unwrap_or(0);
    let described = coordinator.describe(&group).await;
    let final_version = described["metadata"]["metadataVersion"].as_u64().expect("version");
    assert!(final_version > seen_version, "version {final_version} reuses a lost one (clients saw {seen_version})");
    assert_no_split(&fleet.reads);
    coordinator.assert_no_error_logged();
    eprintln!(
        "failover ({follow:?}): replica had revision {replicated_revision} / version {replicated_version}, primary lost \
         {} revisions up to version {primary_version}; first OK {first_ok_ms} ms after the failover; converged \
         at version {final_version}; {:.1} s",
        primary_revision - replicated_revision,
        started.elapsed().as_secs_f64()
    );
    drop((a, b, c));
}
