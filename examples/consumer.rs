//! A consumer group member: joins, reads only the shards the coordinator assigned to it, acks
//! what it processed, and on Ctrl-C leaves cleanly (drains, reports its shards REVOKED, then sends
//! the leave heartbeat) so its shards move to the other members at once.
//!
//! ```sh
//! cargo run --example consumer -- [member-id]     # default member id: consumer-<host>-<pid>
//! ```
//!
//! Start two or three in separate terminals and watch the shards move between them.
//! Environment: `COORDINATOR_ADDR` (default `127.0.0.1:7420`), `COORDINATOR_CLIENT_TOKEN` (the
//! client token, when the coordinator requires one), `REDIS_URL` (default `redis://127.0.0.1:6379`)
//! or `REDIS_CLUSTER_NODES` (a Redis Cluster's seed URLs, comma-separated; `rediss://` URLs and
//! seeds use TLS trusting the platform's roots, which `SSL_CERT_FILE` can point at a private CA),
//! `STREAM_PREFIX` (default `orders`), `CONSUMER_GROUP` (default `billing`). The group must exist:
//! `coordinator admin create-group --prefix orders --group billing --shards 8`.

#[cfg(not(madsim))]
use rsc::client::{AckError, RebalanceListener};
#[cfg(not(madsim))]
use rsc::core::model::ShardId;

/// Prints assignment changes. Called outside the consumer's lock; must return quickly.
#[cfg(not(madsim))]
struct PrintAssignments;

#[cfg(not(madsim))]
impl RebalanceListener for PrintAssignments {
    fn on_assigned(&self, shards: &[ShardId]) {
        println!("assigned shards {shards:?}");
    }

    fn on_revoked(&self, shards: &[ShardId]) {
        println!("revoked shards {shards:?} (finishing in-flight work, then reporting REVOKED)");
    }

    fn on_lost(&self, shards: &[ShardId]) {
        println!("lost shards {shards:?} (lease ended or fenced: in-flight entries were abandoned)");
    }
}

#[cfg(madsim)]
fn main() {
    eprintln!("this example needs real sockets and Redis; build it without --cfg madsim");
}

#[cfg(not(madsim))]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use rsc::client::events::MetricsSink;
    use rsc::client::{ClientEnv, Clock, Consumer, ConsumerConfig};
    use rsc::core::model::GroupId;
    use rsc::http::client::{HttpClientConfig, HttpTransport};
    use rsc::metrics::Metrics;
    use rsc::store::redis::{RedisStore, RedisStoreOptions};

    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
    // The host name too: in containers every replica's process id is often 1, and two live
    // processes with one member id would be refused MEMBER_ID_IN_USE.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let member = std::env::args().nth(1).unwrap_or_else(|| format!("consumer-{host}-{}", std::process::id()));

    let group = GroupId::new(env("STREAM_PREFIX", "orders"), env("CONSUMER_GROUP", "billing"));
    // A coordinator started with `--client-token` needs one (`COORDINATOR_CLIENT_TOKEN`).
    let mut http = HttpClientConfig::new(vec![env("COORDINATOR_ADDR", "127.0.0.1:7420").parse()?]);
    http.client_token = std::env::var("COORDINATOR_CLIENT_TOKEN").ok().filter(|t| !t.is_empty());
    let transport = HttpTransport::new(http);
    // REDIS_CLUSTER_NODES (seed URLs, comma-separated) for a Redis Cluster, else REDIS_URL.
    let store = match std::env::var("REDIS_CLUSTER_NODES").ok().filter(|nodes| !nodes.trim().is_empty()) {
        Some(nodes) => {
            let nodes: Vec<String> = nodes.split(',').map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
            RedisStore::connect_cluster(&nodes, RedisStoreOptions::default()).await?
        }
        None => RedisStore::connect(&env("REDIS_URL", "redis://127.0.0.1:6379"), RedisStoreOptions::default()).await?,
    };
    // Client-side metrics (heartbeat outcomes, lease end, shard stops); a real application serves
    // `metrics.render()` on its own /metrics endpoint.
    let metrics = Arc::new(Metrics::new());
    let clock = Clock::new();
    let client_env = ClientEnv::new(clock.clone(), Arc::new(MetricsSink::new(Arc::clone(&metrics), clock)));
    let config = ConsumerConfig::new(group, member.clone());
    let consumer = Consumer::join_with(config, transport, store, client_env, Arc::new(PrintAssignments));
    println!("{member} joined; Ctrl-C to leave");

    // Ctrl-C only sets a flag: the loop finishes (and acks) the batch in hand before closing.
    let stop = Arc::new(AtomicBool::new(false));
    tokio::spawn({
        let stop = Arc::clone(&stop);
        async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.store(true, Ordering::SeqCst);
            }
        }
    });

    while !stop.load(Ordering::SeqCst) {
        // Empty while nothing is assigned yet, or while the lease is not held (fail closed).
        let batch = match consumer.poll_wait(100, Duration::from_millis(500)).await {
            Ok(batch) => batch,
            Err(error) => {
                eprintln!("poll failed: {error}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        for delivery in batch {
            let field = |name: &str| {
                let value = delivery.entry.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice());
                String::from_utf8_lossy(value.unwrap_or_default()).into_owned()
            };
            println!("shard {} entry {}: {} = {}", delivery.shard, delivery.entry.id, field("key"), field("payload"));
            match consumer.ack(&delivery).await {
                Ok(()) => {}
                // The XACK itself failed (Redis unreachable): the entry is still in flight here.
                // Give it up, so it stays pending in Redis for whoever reads the shard next and
                // does not hold up a drain (an entry left in flight makes `close` wait for it).
                Err(AckError::Store(error)) => {
                    eprintln!("ack {} failed: {error}; abandoned, it will be redelivered", delivery.entry.id);
                    let _ = consumer.abandon(&delivery);
                }
                // The lease ended or the shard was lost: the entry is no longer ours; it stays
                // pending in Redis and its next owner redelivers it.
                Err(error) => eprintln!("ack {} refused: {error}", delivery.entry.id),
            }
        }
    }

    println!("leaving: draining, reporting REVOKED, sending the leave heartbeat");
    let closed = consumer.close().await;
    println!("{member} left; client metrics:\n{}", metrics.render());
    closed?;
    Ok(())
}
