//! Publishes keyed messages to a group's shard streams.
//!
//! The producer fetches the group's routing (shard count, stream keys, cache lease) from the
//! coordinator, picks each message's shard with the jump consistent hash of its key
//! (`rsc::client::hash::shard_for_key`), and XADDs to `<prefix>:<shard>`. It refreshes routing in
//! the background; if the coordinator stays unreachable past the routing cache lease, publishes
//! fail closed instead of using a stale shard count.
//!
//! ```sh
//! cargo run --example producer -- [messages] [interval_ms]     # defaults: 20 messages, 200 ms apart
//! ```
//!
//! Environment: `COORDINATOR_ADDR` (default `127.0.0.1:7420`), `COORDINATOR_CLIENT_TOKEN` (the
//! client token, when the coordinator requires one), `REDIS_URL` (default `redis://127.0.0.1:6379`)
//! or `REDIS_CLUSTER_NODES` (a Redis Cluster's seed URLs, comma-separated; `rediss://` URLs and
//! seeds use TLS trusting the platform's roots, which `SSL_CERT_FILE` can point at a private CA),
//! `STREAM_PREFIX` (default `orders`), `CONSUMER_GROUP` (default `billing`). The group must exist:
//! `coordinator admin create-group --prefix orders --group billing --shards 8`.

#[cfg(madsim)]
fn main() {
    eprintln!("this example needs real sockets and Redis; build it without --cfg madsim");
}

#[cfg(not(madsim))]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    use std::time::Duration;

    use std::sync::Arc;

    use rsc::client::events::MetricsSink;
    use rsc::client::hash::shard_for_key;
    use rsc::client::{ClientEnv, Clock, Producer, ProducerConfig};
    use rsc::core::model::GroupId;
    use rsc::http::client::{HttpClientConfig, HttpTransport};
    use rsc::metrics::Metrics;
    use rsc::store::redis::{RedisStore, RedisStoreOptions};

    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
    let mut args = std::env::args().skip(1);
    let messages: u64 = args.next().map_or(Ok(20), |a| a.parse())?;
    let interval = Duration::from_millis(args.next().map_or(Ok(200), |a| a.parse())?);

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
    // Client-side metrics (publish outcomes, routing refresh failures).
    let metrics = Arc::new(Metrics::new());
    let clock = Clock::new();
    let client_env = ClientEnv::new(clock.clone(), Arc::new(MetricsSink::new(Arc::clone(&metrics), clock)));
    let config = ProducerConfig::new(group, format!("producer-{}", std::process::id()));
    let producer = Producer::new_with(config, transport, store, client_env);

    for i in 0..messages {
        let key = format!("customer-{}", i % 7);
        match producer.publish(key.as_bytes(), format!("order {i}").into_bytes()).await {
            Ok(id) => {
                // The same rule the producer just applied, shown for the reader.
                let shards = producer.routing().map_or(0, |r| r.shard_count);
                println!("published {key} -> shard {} (entry {id})", shard_for_key(key.as_bytes(), shards));
            }
            // Fail closed: no routing, an expired routing cache, or a failed XADD. A real
            // application would retry or buffer here.
            Err(error) => eprintln!("publish {key} failed: {error}"),
        }
        tokio::time::sleep(interval).await;
    }
    print!("client metrics:\n{}", metrics.render());
    Ok(())
}
