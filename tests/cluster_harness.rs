//! Proves the Redis Cluster harness (`support::redis_cluster`) does what tests will rely on: the
//! cluster forms and routes keys of different slots to different primaries, a slot moves under a
//! concurrent writer without losing a write, and a replica cut off from its primary takes over
//! without the writes the primary acknowledged meanwhile.
//!
//! Run: `cargo test --test cluster_harness -- --nocapture` (prints start-up times; needs
//! `redis-server` >= 7.0 on PATH or `REDIS_SERVER_BIN`).

#![cfg(not(madsim))]

#[allow(unused_imports)] // The harness re-exports helpers this binary does not use.
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use support::redis_cluster::RedisCluster;
use support::RedisServer;

/// How long a test waits for the writer to make progress before calling it stuck.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(10);

fn start_timed(primaries: usize, replicas_per_primary: usize) -> RedisCluster {
    let started = Instant::now();
    let cluster = RedisCluster::start(primaries, replicas_per_primary);
    println!("cluster of {primaries} primaries x {replicas_per_primary} replicas started in {:?}", started.elapsed());
    cluster
}

async fn cluster_connection(cluster: &RedisCluster) -> redis::cluster_async::ClusterConnection {
    let client = redis::cluster::ClusterClient::new(cluster.nodes()).expect("cluster client");
    client.get_async_connection().await.expect("connect to the cluster")
}

fn text(value: Value) -> String {
    redis::from_redis_value(value).expect("a text reply")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_primaries_serve_keys_of_different_slots_on_different_nodes() {
    let cluster = start_timed(3, 0);
    assert_eq!(cluster.nodes().len(), 3);
    assert_eq!(cluster.primaries().len(), 3);
    assert!(cluster.replicas().is_empty());
    let map = cluster.slot_map();
    let owners: BTreeSet<u16> = map.iter().map(|r| r.primary_port).collect();
    assert_eq!((map.len(), owners.len()), (3, 3), "one range per primary: {map:?}");
    // The published CRC16 test vector, and hash tags.
    assert_eq!(cluster.slot_of("123456789"), 0x31C3);
    assert_eq!(cluster.slot_of("{user1000}.following"), cluster.slot_of("{user1000}.followers"));

    let mut key_by_owner: BTreeMap<u16, String> = BTreeMap::new();
    for i in 0..1_000 {
        let key = format!("key-{i}");
        let slot = cluster.slot_of(&key);
        let owner = map.iter().find(|r| (r.start..=r.end).contains(&slot)).expect("slot served").primary_port;
        key_by_owner.entry(owner).or_insert(key);
        if key_by_owner.len() == 3 {
            break;
        }
    }
    assert_eq!(key_by_owner.len(), 3, "1000 keys all hashed to fewer than 3 primaries");

    let mut conn = cluster_connection(&cluster).await;
    for (port, key) in &key_by_owner {
        redis::cmd("SET").arg(key).arg(port).query_async::<()>(&mut conn).await.expect("SET through the cluster");
    }
    for (port, key) in &key_by_owner {
        assert_eq!(cluster.node_for_key(key).port(), *port);
        let value: String = redis::cmd("GET").arg(key).query_async(&mut conn).await.expect("GET through the cluster");
        assert_eq!(value, port.to_string());
        for node in cluster.servers() {
            match node.try_cmd(&["GET", key]) {
                Ok(value) if node.port() == *port => assert_eq!(text(value), port.to_string()),
                Err(e) if node.port() != *port => assert!(e.to_string().to_lowercase().contains("moved"), "{e}"),
                other => panic!("GET {key} on port {} answered {other:?}; owner is {port}", node.port()),
            }
        }
    }
}

/// Waits until the writer acknowledged `more` writes after the current count.
fn wait_writer_progress(acked: &AtomicU64, more: u64) {
    let goal = acked.load(Ordering::SeqCst) + more;
    let deadline = Instant::now() + PROGRESS_TIMEOUT;
    while acked.load(Ordering::SeqCst) < goal {
        assert!(Instant::now() < deadline, "the writer made no progress for {PROGRESS_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moves_under_a_concurrent_writer_without_losing_a_write() {
    let cluster = start_timed(3, 0);
    let slot = cluster.slot_of("{moving}");
    let source_port = cluster.owner_of_slot(slot).port();
    let target = *cluster.primaries().iter().find(|p| p.port() != source_port).expect("another primary");
    let preloaded_count = 350; // Four MIGRATE batches of 100.
    let mut conn = cluster_connection(&cluster).await;
    let mut preload = redis::pipe();
    for i in 0..preloaded_count {
        preload.cmd("SET").arg(format!("{{moving}}:pre:{i}")).arg(i).ignore();
    }
    preload.query_async::<()>(&mut conn).await.expect("preload");

    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (acked, stop) = (acked.clone(), stop.clone());
        async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let set = redis::cmd("SET").arg(format!("{{moving}}:w:{n}")).arg(n).query_async::<()>(&mut conn).await;
                set.unwrap_or_else(|e| panic!("SET number {n} failed during the move: {e}"));
                let mut xadd = redis::cmd("XADD");
                xadd.arg("{moving}:stream").arg("*").arg("n").arg(n);
                let id = xadd.query_async::<String>(&mut conn).await;
                id.unwrap_or_else(|e| panic!("XADD number {n} failed during the move: {e}"));
                acked.store(n, Ordering::SeqCst);
            }
            n
        }
    });

    wait_writer_progress(&acked, 20);
    let slot_move = cluster.begin_slot_move(slot, target).expect("the target does not own the slot yet");
    wait_writer_progress(&acked, 20); // New keys go to the target (ASK), old ones stay.
    let mut migrated = cluster.migrate_slot_keys(&slot_move, 100);
    wait_writer_progress(&acked, 20); // Keys on both sides.
    loop {
        let batch = cluster.migrate_slot_keys(&slot_move, 100);
        if batch == 0 {
            break;
        }
        migrated += batch;
    }
    wait_writer_progress(&acked, 20); // Everything on the target; the slot still MIGRATING.
    cluster.finish_slot_move(slot_move);
    wait_writer_progress(&acked, 20); // MOVED, then straight to the target.
    stop.store(true, Ordering::SeqCst);
    let written = writer.await.expect("writer task");
    println!("moved slot {slot}: {migrated} keys migrated while {written} writes were acknowledged");

    assert_eq!(cluster.owner_of_slot(slot).port(), target.port());
    let mut expected: BTreeSet<String> = (0..preloaded_count).map(|i| format!("{{moving}}:pre:{i}")).collect();
    expected.extend((1..=written).map(|n| format!("{{moving}}:w:{n}")));
    expected.insert("{moving}:stream".to_string());
    let on_target: Vec<String> =
        redis::from_redis_value(target.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100000"])).expect("keys");
    assert_eq!(on_target.into_iter().collect::<BTreeSet<_>>(), expected, "keys of the slot on the target");
    let source = cluster.server(source_port);
    assert_eq!(source.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]), Value::Int(0));
    assert_eq!(target.cmd(&["XLEN", "{moving}:stream"]), Value::Int(written as i64));
    assert_eq!(text(target.cmd(&["GET", &format!("{{moving}}:w:{written}")])), written.to_string());
}

/// `SET key value` then `WAIT replicas timeout_ms` on the same connection: how many replicas
/// acknowledged the write.
fn set_and_wait(primary: &RedisServer, key: &str, value: &str, replicas: u64, timeout_ms: u64) -> i64 {
    let client = redis::Client::open(primary.url()).expect("url");
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2)).expect("connect");
    redis::cmd("SET").arg(key).arg(value).query::<()>(&mut conn).expect("SET on the primary");
    redis::cmd("WAIT").arg(replicas).arg(timeout_ms).query(&mut conn).expect("WAIT")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_its_primary_takes_over_without_the_writes_it_missed() {
    let cluster = start_timed(3, 1);
    assert_eq!((cluster.primaries().len(), cluster.replicas().len()), (3, 3));
    let (kept, lost) = ("{lost}:kept", "{lost}:acknowledged-after-the-cut");
    let primary = cluster.node_for_key(kept);
    let replicas = cluster.replicas_of(primary);
    assert_eq!(replicas.len(), 1);
    let replica = replicas[0];
    assert_eq!(set_and_wait(primary, kept, "before", 1, 5_000), 1, "the replica acknowledged the first write");
    assert_eq!(text(cluster.read_on(replica, &["GET", kept])), "before");

    cluster.cut_replication(primary);
    // Acknowledged by the primary, by no replica.
    assert_eq!(set_and_wait(primary, kept, "after", 1, 300), 0);
    assert_eq!(set_and_wait(primary, lost, "x", 1, 300), 0);
    assert_eq!(text(primary.cmd(&["GET", kept])), "after");
    assert_eq!(text(cluster.read_on(replica, &["GET", kept])), "before");
    assert_eq!(cluster.read_on(replica, &["EXISTS", lost]), Value::Int(0));

    let started = Instant::now();
    cluster.failover_takeover(replica);
    println!("takeover converged in {:?}", started.elapsed());
    assert_eq!(cluster.node_for_key(kept).port(), replica.port());
    assert_eq!(text(replica.cmd(&["GET", kept])), "before");
    assert_eq!(replica.cmd(&["EXISTS", lost]), Value::Int(0));
    let mut conn = cluster_connection(&cluster).await;
    let through_cluster: Option<String> = redis::cmd("GET").arg(lost).query_async(&mut conn).await.expect("GET");
    assert_eq!(through_cluster, None, "the cluster lost the acknowledged write");
    let kept_now: String = redis::cmd("GET").arg(kept).query_async(&mut conn).await.expect("GET");
    assert_eq!(kept_now, "before");

    // The old primary follows the new one and resynchronises: the writes are gone everywhere.
    let deadline = Instant::now() + Duration::from_secs(15);
    while cluster.replicas_of(replica).iter().all(|r| r.port() != primary.port())
        || primary.info_field("replication", "master_link_status").as_deref() != Some("up")
    {
        assert!(Instant::now() < deadline, "the old primary never followed the new one:\n{}", cluster.log_tails());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(text(cluster.read_on(primary, &["GET", kept])), "before");
    assert_eq!(cluster.read_on(primary, &["EXISTS", lost]), Value::Int(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_speaks_only_tls_and_replicates_and_moves_slots_over_tls() {
    let started = Instant::now();
    let cluster = RedisCluster::start_tls(2, 1, support::redis_server::TlsClientAuth::Yes);
    println!("TLS cluster of 2 primaries x 1 replica started in {:?}", started.elapsed());
    assert!(cluster.nodes().iter().all(|n| n.starts_with("rediss://")), "{:?}", cluster.nodes());
    // No plain port: a plain PING on a node's port gets no PONG.
    for node in cluster.servers() {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", node.port())).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        std::io::Write::write_all(&mut stream, b"PING\r\n").expect("write");
        let mut reply = [0u8; 16];
        let n = std::io::Read::read(&mut stream, &mut reply).unwrap_or(0);
        assert!(!reply[..n].starts_with(b"+PONG"), "port {} answered plain text", node.port());
    }

    // A replica follows its primary over the TLS replication link.
    let key = "{tls-moving}:k";
    let source = cluster.node_for_key(key);
    source.cmd(&["SET", key, "v1"]);
    let replica = cluster.replicas_of(source)[0];
    let deadline = Instant::now() + PROGRESS_TIMEOUT;
    while cluster.read_on(replica, &["GET", key]) != Value::BulkString(b"v1".to_vec()) {
        assert!(Instant::now() < deadline, "the write never reached the replica:\n{}", cluster.log_tails());
        std::thread::sleep(Duration::from_millis(10));
    }

    // MIGRATE runs between nodes over TLS (`tls-cluster yes`).
    let target = *cluster.primaries().iter().find(|p| p.port() != source.port()).expect("another primary");
    cluster.move_slot(cluster.slot_of(key), target);
    assert_eq!(cluster.node_for_key(key).port(), target.port());
    assert_eq!(text(target.cmd(&["GET", key])), "v1");
}

/// A port can be taken by another test process's server between `free_port` and our bind. The
/// other server then answers our PING while ours exits with "Address already in use"; CI once
/// formed a cluster with a foreign node that way ("Node config epoch is already non-zero").
#[test]
fn a_port_another_server_answers_is_not_taken_for_ours() {
    let other = RedisServer::start();
    let result = RedisServer::try_start_on(support::ServerConfig::default(), other.port());
    let err = result.err().expect("a server whose port another process answers must not count as started");
    assert!(err.contains("Address already in use"), "the retry loop keys on this text: {err}");
    assert!(other.try_cmd(&["PING"]).is_ok(), "the other server is left alone");
}
