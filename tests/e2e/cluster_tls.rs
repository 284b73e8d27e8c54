//! The coordinator and its clients on a mutual-TLS Redis Cluster (`RedisCluster::start_tls`: TLS
//! ports only, client certificates required, TLS on the cluster bus): `REDIS_CLUSTER_NODES` of
//! `rediss://` seeds with the Redis TLS files runs a group end to end, and without the client
//! certificate `coordinator serve` stops at startup with exit 3, as it does on one TLS server
//! (`tests/e2e_tls.rs`).

use std::time::{Duration, Instant};

use crate::e2e_support::checks::{pending_count, shares_all};
use crate::e2e_support::fleet::{abandoned_entries, check_delivery, AppSettings, Fleet};
use crate::e2e_support::ground_truth::assert_no_split;
use crate::e2e_support::process::{cluster_target, serve_expecting_exit_with, CoordinatorProcess};
use crate::e2e_support::{fast_config, group, wait_until};
use crate::support::redis_cluster::RedisCluster;
use crate::support::redis_server::TlsClientAuth;
use rsc::store::redis::RedisTlsOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_runs_on_a_mutual_tls_cluster_and_a_coordinator_without_a_client_certificate_exits_3() {
    const SHARDS: u32 = 6;
    const MESSAGES: usize = 300;
    let started = Instant::now();
    let cluster = RedisCluster::start_tls(3, 0, TlsClientAuth::Yes);
    let files = cluster.tls_files().expect("TLS files").clone();
    let target = cluster_target(&cluster.nodes());
    assert!(cluster.nodes().iter().all(|n| n.starts_with("rediss://")), "{target}");
    let group = group("cluster-tls");
    let streams: Vec<String> = (0..SHARDS).map(|s| group.stream_key(s)).collect();
    let primaries: std::collections::BTreeSet<u16> = streams.iter().map(|k| cluster.node_for_key(k).port()).collect();
    assert!(primaries.len() >= 2, "the shards span primaries");

    // The CA but no client certificate: every node refuses the handshake, and the binary stops at
    // startup (store unreachable), naming the cause.
    let ca_only = ["--redis-tls-ca-file".to_string(), files.ca_cert.display().to_string()];
    let failed = serve_expecting_exit_with(&target, &ca_only, Duration::from_secs(20)).await;
    assert_eq!(failed.status.code(), Some(3), "exit 3 (store unreachable):\n{}", failed.stderr);
    let error_line = failed.stderr.lines().find(|l| l.starts_with("error:")).unwrap_or_default();
    assert!(error_line.contains("cannot connect to Redis"), "the error says why:\n{}", failed.stderr);
    eprintln!("without a client certificate: exit 3 after {:?}: {error_line}", failed.elapsed);

    let config = format!(
        "redis_tls_ca_file = {:?}\nredis_tls_client_cert_file = {:?}\nredis_tls_client_key_file = {:?}\n",
        files.ca_cert.display().to_string(),
        files.client_cert.display().to_string(),
        files.client_key.display().to_string(),
    );
    let coordinator = CoordinatorProcess::start_with_config(&target, "e2e-cluster-tls", &config).await;
    coordinator.create_group(&group, SHARDS, &fast_config()).await;
    let mut fleet = Fleet::new(group.clone(), vec![coordinator.addr()], target.clone());
    // The library's default per-address timeout: the one coordinator's TLS connections to the
    // cluster are slow to open on a loaded machine, and a publish whose inline routing refresh
    // times out fails closed (the 500 ms of the fleet's default made the first publish fail).
    fleet.request_timeout = Duration::from_secs(2);
    fleet.redis_tls = RedisTlsOptions {
        ca_file: Some(files.ca_cert.clone()),
        client_cert_file: Some(files.client_cert.clone()),
        client_key_file: Some(files.client_key.clone()),
    };
    let consumer = fleet.consumer("alpha", AppSettings::default()).await;
    wait_until("the consumer owns every shard", Duration::from_secs(15), || shares_all(&[&consumer], SHARDS)).await;
    let producer = fleet.producer("producer").await;
    producer.publish_paced(0..MESSAGES, 1_000).await;
    let ledger = fleet.ledger.clone();
    fleet.wait_all_acked(MESSAGES, Duration::from_secs(15)).await;
    assert_eq!(ledger.lock().publish_failures, Vec::<String>::new(), "no publish failed");
    assert_no_split(&fleet.reads);
    let summary = check_delivery(&ledger, &abandoned_entries(&fleet.events()));
    consumer.close(Duration::from_secs(10)).await;
    for shard in 0..SHARDS {
        let node = cluster.node_for_key(&group.stream_key(shard));
        assert_eq!(pending_count(node, &group, shard), 0, "shard {shard} has un-acked entries in Redis");
    }
    coordinator.assert_no_error_logged();
    eprintln!("mutual TLS cluster, {} primaries: {summary}; {:?} in all", primaries.len(), started.elapsed());
}

/// A master serving no slot (a node just added to scale out) is not in the cluster client's slot
/// map, so the store identity asks it on a connection of its own: on a mutual-TLS cluster that
/// connection presents the client certificate too, and the identity names the node, idle.
#[tokio::test]
async fn the_identity_reads_an_idle_master_over_mutual_tls() {
    use rsc::store::redis::{RedisStore, RedisStoreOptions};
    use rsc::store::MetadataStore;
    let mut cluster = RedisCluster::start_tls(3, 0, TlsClientAuth::Yes);
    let seeds = cluster.nodes();
    let port = cluster.add_empty_primary().port();
    let files = cluster.tls_files().expect("TLS files").clone();
    let tls = RedisTlsOptions {
        ca_file: Some(files.ca_cert.clone()),
        client_cert_file: Some(files.client_cert.clone()),
        client_key_file: Some(files.client_key.clone()),
    };
    let store = RedisStore::connect_cluster(&seeds, RedisStoreOptions { tls, ..RedisStoreOptions::default() })
        .await
        .expect("connect");
    let identity = store.identity().await.expect("identity");
    let idle = identity.primaries.iter().find(|p| p.idle).map(|p| p.node.clone()).unwrap_or_default();
    assert!(idle.contains(&format!(":{port}/")), "the new node is named, idle: {identity:?}");
    assert_eq!(identity.disputed_slots(), vec![], "{identity:?}");
}
